"""Benchmarks: every figure is printed next to a peer measured in the same run."""
