"""``linear_scan``: ``fn(a, b) -> h``; a, b (batch, channels, length); ``h_t = a_t h_{t-1} + b_t``."""

from __future__ import annotations

import torch

from harness.families.base import FamilyDef, randn, uniform
from harness.kernels.contract import Family


class LinearScan(FamilyDef):
    family = Family.LINEAR_SCAN
    arg_order = ("a", "b")
    linear_input = "b"
    swapped_layout = ("dim", "(batch, L, channels)")
    regimes = ("trained", "long_memory", "fast_decay", "large", "tiny", "unstable")
    grad_inputs = ("a", "b")
    length_axis = -1
    per_step_inputs = ("a", "b")

    def shapes(self, p):
        return {"a": (p.batch, p.dim, p.length), "b": (p.batch, p.dim, p.length)}

    def output_shape(self, p):
        return (p.batch, p.dim, p.length)

    def generate(self, p, shapes, gen):
        shape = shapes["a"]
        z = randn(shape, gen)
        if p.regime == "long_memory":
            a = 1.0 - 10.0 ** uniform(shape, gen, -4.0, -2.0)
        elif p.regime == "fast_decay":
            a = uniform(shape, gen, 0.0, 0.5)
        elif p.regime == "unstable":
            a = z
        else:
            a = torch.exp(-torch.nn.functional.softplus(z - 2.0))
        b = randn(shape, gen) * self.data_scale(p.regime, p.scale_dtype)
        return {"a": a, "b": b}

    def trace(self, p, x, convention):
        from reference_impls.linear_recurrence import linear_recurrence_trace

        return linear_recurrence_trace(x["a"], x["b"])

    def differentiable(self, p, x, convention):
        from reference_impls import autograd as ad

        return ad.linear_recurrence(x["a"], x["b"])

    def term_scale(self, p, x, cot, names, convention, vjp):
        from reference_impls import autograd as ad

        ax = {k: v.abs() for k, v in x.items()}
        return vjp(lambda v: ad.linear_recurrence(v["a"], v["b"]), ax, names, cot.abs())

    def element_bounds(self, p, name):
        if name == "a":
            return (-2.0, 2.0) if p.regime == "unstable" else (0.0, 1.0)
        return super().element_bounds(p, name)

    def draw_fields(self, draw, caps, lim, regime, common):
        from hypothesis import strategies as st

        return {"dim": draw(st.integers(1, lim.max_dim))}


FAMILY = LinearScan()
