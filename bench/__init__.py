"""Benchmarks from docs/design.md section 10; run them with `python -m bench.run` (or `make bench`)."""
