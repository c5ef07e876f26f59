"""``retention_normed``: ``fn(q, k, v, eps) -> o``: `retention` followed by the per-head RMS group norm."""

from __future__ import annotations

import torch

from harness.families.base import limit_scale
from harness.families.retention import Retention
from harness.kernels.contract import Family


#: dk * L up to which the ``large`` divisor 64 leaves the norm's squares in range (2 * 32768**(1/3) = 64).
LARGE_SPREAD = 32768


class RetentionNormed(Retention):
    family = Family.RETENTION_NORMED
    takes_eps = True

    def data_scale(self, p):
        """The norm squares its output, so the factors are scaled to max**(1/6), with room for the sums
        over time and dk: the rounding bound's magnitude companion of one output is up to about
        ``0.5 * s**3 * dk * L``, and the norm squares it, so ``large`` divides max**(1/6) by
        ``2 * (dk * L)**(1/3)`` (64 up to dk * L = 32768, which covers every ci problem, whose draws are
        unchanged). A fixed divisor of 64 made the nightly problems (dk 64, L in the thousands) out of
        domain in float64 (``input_overflow`` on every large case): a case the generator makes out of
        range is a case the search cannot judge."""
        spread = p.dk * p.length
        large_div = 64.0 if spread <= LARGE_SPREAD else 64.0 * (spread / LARGE_SPREAD) ** (1 / 3)
        return limit_scale(p.regime, p.dtype, power=1 / 6, large_div=large_div, tiny_mul=4.0)

    def function_room(self, p):
        """The decay powers 1, the root and the divide 2."""
        return 3.0

    def call_args(self, p, inputs, kwargs):
        return tuple(inputs[n] for n in self.arg_order) + (p.eps,), kwargs

    def trace(self, p, x, convention):
        from reference_impls.retention import retention_normed_trace

        gamma, scale = self._convention(p, convention)
        return retention_normed_trace(x["q"], x["k"], x["v"], p.eps, gamma=gamma, scale=scale)

    def differentiable(self, p, x, convention):
        from reference_impls import autograd as ad

        gamma, scale = self._convention(p, convention)
        return ad.retention_normed(x["q"], x["k"], x["v"], p.eps, gamma, scale)

    def _term_cotangent(self, p, x, cot, convention) -> torch.Tensor:
        """The norm's Jacobian ``d(o_j/r)/do_i = delta_ij / r - o_i o_j / (dv r^3)`` bounded term by term:
        the cotangent ``|g_j| / r + |o_j| sum_i |g_i o_i| / (dv r^3)`` for the raw retention."""
        from reference_impls import autograd as ad

        c = cot.abs()
        o = ad.retention(x["q"], x["k"], x["v"], list(convention.gammas(p.heads)), convention.scale(p.dk))
        dv = o.shape[-1]
        r = torch.sqrt((o * o).sum(-1, keepdim=True) / dv + p.eps)
        return c / r + o.abs() * (c * o.abs()).sum(-1, keepdim=True) / (dv * r ** 3)

    def draw_fields(self, draw, caps, lim, regime, common):
        from hypothesis import strategies as st

        from harness.strategies import epsilons

        fields = super().draw_fields(draw, caps, lim, regime, common)
        fields["eps"] = draw(st.sampled_from(caps.eps_values) if caps.eps_values else epsilons())
        return fields


FAMILY = RetentionNormed()
