"""Benchmarks (agent issue §7): ratios against a floor measured in the same run."""
