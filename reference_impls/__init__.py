"""Float64 CPU oracles: the sequential definitions every kernel is measured against.

Simple loops over the sequence, float64, checked against exact arithmetic in the tests. No dependency
on `harness`.
"""
