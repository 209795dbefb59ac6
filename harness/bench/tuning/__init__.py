"""Auto-balancing: memory ceilings, throughput curves, the best split, online rebalancing."""
