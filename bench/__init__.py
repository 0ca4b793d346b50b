"""Benchmarks from DESIGN.md section 10; run them with `python -m bench.run` (or `make bench`)."""
