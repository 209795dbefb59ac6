"""Models and data the harness trains."""
