"""Benchmarks: the WAL harness (python -m benchmarks.wal_bench) and end-to-end benchmarks."""
