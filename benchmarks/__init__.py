"""asv suites of harness (see benchmarks/README.md). Importing them imports no TensorFlow."""
