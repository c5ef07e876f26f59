"""``retention``: ``fn(q, k, v) -> o``; q, k (batch, L, heads, dk), v (batch, L, heads, dv); per-head
decay and scale from the kernel's `RetentionConvention` (RetNet's by default)."""

from __future__ import annotations

import math

import torch

from harness.families.base import FamilyDef, draw_heads, randn
from harness.kernels.contract import Family


class Retention(FamilyDef):
    family = Family.RETENTION
    arg_order = ("q", "k", "v")
    linear_input = "v"
    swapped_layout = ("heads", "(batch, heads, L, d)")
    regimes = ("trained", "large", "tiny", "ramp")
    grad_inputs = ("q", "k", "v")
    length_axis = 1
    per_step_inputs = ("q", "k", "v")
    uses_matmuls = True
    has_convention = True

    def shapes(self, p):
        b, L = p.batch, p.length
        return {"q": (b, L, p.heads, p.dk), "k": (b, L, p.heads, p.dk), "v": (b, L, p.heads, p.dv)}

    def output_shape(self, p):
        return (p.batch, p.length, p.heads, p.dv)

    def generate(self, p, shapes, gen):
        if p.regime == "ramp":
            out = {}
            for name, shape in shapes.items():
                x = torch.arange(1, math.prod(shape) + 1, dtype=torch.float64)
                out[name] = (x / float(x.max())).reshape(shape)
            return out
        s = self.data_scale(p.regime, p.scale_dtype)
        return {name: randn(shape, gen) * s for name, shape in shapes.items()}

    def function_room(self, p):
        """The decay powers: 1."""
        return 1.0

    def _convention(self, p, convention):
        return list(convention.gammas(p.heads)), convention.scale(p.dk)

    def trace(self, p, x, convention):
        from reference_impls.retention import retention_trace

        gamma, scale = self._convention(p, convention)
        return retention_trace(x["q"], x["k"], x["v"], gamma=gamma, scale=scale)

    def differentiable(self, p, x, convention):
        from reference_impls import autograd as ad

        gamma, scale = self._convention(p, convention)
        return ad.retention(x["q"], x["k"], x["v"], gamma, scale)

    def baseline_kwargs(self, p, convention):
        gamma, scale = self._convention(p, convention)
        return {"gamma": gamma, "scale": scale}

    def _term_cotangent(self, p, x, cot, convention) -> torch.Tensor:
        return cot.abs()

    def term_scale(self, p, x, cot, names, convention, vjp):
        """Retention is multilinear in q, k, v: the sum of |terms| is retention of |q|, |k|, |v| with |decays|,
        pulled back along |cotangent|."""
        from reference_impls import autograd as ad

        ax = {k: v.abs() for k, v in x.items()}
        gamma = [abs(gm) for gm in convention.gammas(p.heads)]
        scale = abs(convention.scale(p.dk))
        c = self._term_cotangent(p, x, cot, convention)
        return vjp(lambda v: ad.retention(v["q"], v["k"], v["v"], gamma, scale), ax, names, c)

    def gradient_traces(self, p, x, cot, names, convention):
        """Retention's gradients are retentions of the same decays and scale (the adjoint of a linear recurrence
        runs it backwards): with g the cotangent,

            dq_t = scale sum_{s <= t} gamma^(t-s) (g_t . v_s) k_s        retention(q=g, k=v, v=k)
            dk_s = scale sum_{t >= s} gamma^(t-s) (v_s . g_t) q_t        retention(q=v, k=g, v=q), time reversed
            dv_s = scale sum_{t >= s} gamma^(t-s) (k_s . q_t) g_t        retention(q=k, k=q, v=g), time reversed

        so each gradient has the oracle's own trace (`reference_impls.retention.retention_trace`): the bound a
        correct form of that retention may err by, its magnitude and the peaks of its state (the backward's
        dS, which a correct backward forms), per element, as an output's. A time-reversed trace is flipped
        back, so its peaks are running maxima over the later positions, which feed the gradient at s."""
        from reference_impls.retention import retention_trace

        gamma, scale = self._convention(p, convention)

        def reversed_(a, b, c):
            return retention_trace(a.flip(1), b.flip(1), c.flip(1), gamma=gamma, scale=scale).flipped(1)

        made = {"q": lambda: retention_trace(cot, x["v"], x["k"], gamma=gamma, scale=scale),
                "k": lambda: reversed_(x["v"], cot, x["q"]),
                "v": lambda: reversed_(x["k"], x["q"], cot)}
        return {name: made[name]() for name in names if name in made}

    def draw_fields(self, draw, caps, lim, regime, common):
        fields = draw_heads(draw, caps, lim)
        return fields


FAMILY = Retention()
