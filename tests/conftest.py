"""Shared test setup. The harness pytest plugin (markers, logical_devices) loads via its entry point."""
