"""Observability: Prometheus metrics and logs."""
