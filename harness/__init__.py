"""Numerical-equivalence test harness for sequence-model kernels.

Public entry points (imported lazily so that `import harness` stays cheap):

- `harness.check(fn, family=...)`: drive a kernel over the property-based cases; returns the records.
- `harness.assert_equivalent(...)`: raise `DivergenceError` with an actionable message.
- `harness.Problem`, `harness.Family`, `harness.KernelSpec`, `harness.Capabilities`: the data model.
"""

from __future__ import annotations

__version__ = "0.1.0"

_LAZY = {
    "check": ("harness.api", "check"),
    "run_case": ("harness.runner", "run_case"),
    "assert_equivalent": ("harness.verdict", "assert_equivalent"),
    "Problem": ("harness.problems", "Problem"),
    "Family": ("harness.kernels.contract", "Family"),
    "KernelSpec": ("harness.kernels.contract", "KernelSpec"),
    "Capabilities": ("harness.kernels.contract", "Capabilities"),
    "Policy": ("harness.verdict", "Policy"),
}

__all__ = ["__version__", *_LAZY]


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        return getattr(importlib.import_module(module), attr)
    raise AttributeError(f"module 'harness' has no attribute {name!r}")
