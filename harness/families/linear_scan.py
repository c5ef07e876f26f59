"""``linear_scan``: ``fn(a, b) -> h``; a, b (batch, channels, length); ``h_t = a_t h_{t-1} + b_t``."""

from __future__ import annotations

import torch

from harness.families.base import FamilyDef, randn, uniform
from harness.kernels.contract import Family
from reference_impls.trace import Trace


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

    def gradient_traces(self, p, x, cot, names, convention):
        """The adjoint of ``h_t = a_t h_{t-1} + b_t`` along g is the same recurrence run backwards,
        ``lam_t = a_{t+1} lam_{t+1} + g_t`` (``lam`` past the end 0): ``db = lam`` has the oracle's trace of that
        reversed recurrence (`reference_impls.linear_recurrence.linear_recurrence_trace`), and ``da_t = lam_t h_{t-1}``
        (0 at t = 0) is a product of two computed values: its magnitude ``|lam| |h|`` is the product of theirs,
        its growth each one's growth times the other's magnitude plus the product's own rounding and the terms a
        correct backward may cancel (below), and its peaks the larger of the two recurrences' (the running maxima
        of h up to t - 1 and of lam from t on)."""
        from reference_impls.linear_recurrence import linear_recurrence_trace

        a, b = x["a"], x["b"]
        a_next = torch.cat([a[..., 1:], torch.zeros_like(a[..., :1])], dim=-1)
        lam = linear_recurrence_trace(a_next.flip(-1), cot.flip(-1)).flipped(-1)
        made = {"b": lambda: lam}
        if "a" in names:
            fwd = linear_recurrence_trace(a, b)

            def before(t: torch.Tensor) -> torch.Tensor:  # h_{t-1}, 0 at t = 0
                return torch.cat([torch.zeros_like(t[..., :1]), t[..., :-1]], dim=-1)

            h, hm, hw = before(fwd.out), before(fwd.magnitude), before(fwd.growth)
            # A correct backward may reach da_t through terms that cancel: a log-space scan differentiates
            # log a_t inside every cumulative sum from t on, so its da_t is the difference of two sums of the
            # terms of every output from t on (the exact value keeps only those that started before t). Their
            # size, sum_{r >= t} |g_r| H_r / |a_t|, is charged as rounding; where the exact gradient is 0 by
            # structure (da_0, h_{-1} = 0) it is also the element's magnitude, so that such a residue of
            # rounding (7e-16 in float64) is judged against it and not against a bound of 0.
            reach = (cot.abs() * fwd.magnitude).flip(-1).cumsum(-1).flip(-1)
            cancel = torch.where(a == 0, torch.zeros_like(reach), reach / a.abs())
            magnitude = lam.magnitude * hm
            made["a"] = lambda: Trace(out=lam.out * h, magnitude=torch.where(magnitude == 0, cancel, magnitude),
                                      growth=lam.growth * hm + lam.magnitude * hw + magnitude + cancel,
                                      state_peak=torch.maximum(lam.state_peak, before(fwd.state_peak)),
                                      decay_peak=torch.maximum(lam.decay_peak, before(fwd.decay_peak)))
        return {name: made[name]() for name in names if name in made}

    def element_bounds(self, p, name):
        if name == "a":
            return (-2.0, 2.0) if p.regime == "unstable" else (0.0, 1.0)
        return super().element_bounds(p, name)

    def draw_fields(self, draw, caps, lim, regime, common):
        from hypothesis import strategies as st

        return {"dim": draw(st.integers(1, lim.max_dim))}


FAMILY = LinearScan()
