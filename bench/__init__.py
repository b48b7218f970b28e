"""Benchmarks for webhook-inbox; each runs with one command (see bench/README.md)."""
