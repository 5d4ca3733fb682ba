"""Benchmarks of the service against the framework ceiling and MLflow (see bench/README.md)."""
