"""Benchmarks (DESIGN.md §9): each `bench/*_bench.py` is a script writing bench/results/*.json."""
