"""Reproductions and benchmarks: the bench harness, its scores, plots and performance runs."""
