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
    draws_head_dims = True

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

    def gradient_traces(self, p, x, cot, names, convention):
        """Retention's gradients are retentions of the same decays and scale (the adjoint of a linear recurrence
        runs it backwards): with g the cotangent,

            dq_t = scale sum_{s <= t} gamma^(t-s) (g_t . v_s) k_s        retention(q=g, k=v, v=k)
            dk_s = scale sum_{t >= s} gamma^(t-s) (v_s . g_t) q_t        retention(q=v, k=g, v=q), time reversed
            dv_s = scale sum_{t >= s} gamma^(t-s) (k_s . q_t) g_t        retention(q=k, k=q, v=g), time reversed

        so each gradient has the oracle's own trace (`reference_impls.retention.retention_trace`): the bound a
        correct form of that retention may err by, its magnitude and the peaks of its state (the backward's
        dS, which a correct backward forms), per element, as an output's (`adjoint_trace`)."""
        gamma, scale = self._convention(p, convention)
        return {name: adjoint_trace(name, x, cot, gamma, scale) for name in names if name in ADJOINT_PLACES}

    def draw_fields(self, draw, caps, lim, regime, common):
        fields = draw_heads(draw, caps, lim)
        return fields


#: Where the cotangent and the inputs go in the retention that forms each input's gradient, and whether it runs
#: backwards in time (`Retention.gradient_traces`).
ADJOINT_PLACES = {"q": (("cot", "v", "k"), False), "k": (("v", "cot", "q"), True), "v": (("k", "q", "cot"), True)}


def adjoint_trace(name: str, x: dict[str, torch.Tensor], cot: torch.Tensor, gamma, scale: float):
    """The oracle's trace of the retention that forms input ``name``'s gradient along ``cot`` (`ADJOINT_PLACES`);
    a time-reversed one flipped back, so its peaks are running maxima over the later positions, which feed the
    gradient at s."""
    from reference_impls.retention import retention_trace

    places, backwards = ADJOINT_PLACES[name]
    args = [cot if place == "cot" else x[place] for place in places]
    if not backwards:
        return retention_trace(*args, gamma=gamma, scale=scale)
    return retention_trace(*(a.flip(1) for a in args), gamma=gamma, scale=scale).flipped(1)


FAMILY = Retention()
