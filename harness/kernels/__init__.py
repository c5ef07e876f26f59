"""Kernels the harness drives: the contract (`contract`), the registry (`registry`), the in-tree forms
(`sequential`, `blelloch`, `retnet_forms`) and one adapter module per third-party package."""
