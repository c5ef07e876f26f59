"""``retention_normed``: ``fn(q, k, v, eps) -> o``: `retention` followed by the per-head RMS group norm."""

from __future__ import annotations

import torch

from harness.families.base import limit_scale
from harness.families.retention import Retention
from harness.kernels.contract import DTYPE_NAMES, Family


class RetentionNormed(Retention):
    family = Family.RETENTION_NORMED
    takes_eps = True

    def data_scale(self, regime, dtype):
        """The norm squares its output, so the factors are scaled to max**(1/6) with room for the sums
        over time and dv: a larger scale only makes every case out of domain.

        The norm also takes the reciprocal of its mean square, which must stay below max too: the
        factors of ``large`` are at least ``4 * max**(-1/6)`` (an output of about ``64 / sqrt(max)``).
        Only float16 is affected (its max**(1/6) / 64 is 0.099, so an output of 1e-3 whose reciprocal
        mean square is 1e6: every ``large`` case out of domain from its first step); for the other
        dtypes the floor is far below the scale.
        """
        scale = limit_scale(regime, dtype, power=1 / 6, large_div=64.0, tiny_mul=4.0)
        if regime == "large":
            scale = max(scale, 4.0 * float(torch.finfo(DTYPE_NAMES[dtype]).max) ** (-1 / 6))
        return scale

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

    def gradient_norm_peak(self, p, x, names, convention):
        """The norm's backward forms ``1 / r^3`` at each position (r = sqrt(mean(o^2) + eps)): the Jacobian's
        ``o_i o_j / (dv r^3)``, and autograd of the common ``o * rsqrt(mean(o^2) + eps)`` takes
        ``d rsqrt(m)/dm = -m^(-3/2) / 2``, which overflows float32 where m < 2e-26 (an output of RMS 1e-13) and
        float16 where m < 6e-4, though the gradient itself is moderate there (torchscale's RMSNorm in float32,
        eps = 0, `tiny` inputs: -inf where the exact gradient is -7e4), and falls below the smallest normal
        number where m is large, keeping a few bits (float32, m = 4.8e27: 3e-42, 11 bits; torchscale's exact-0
        gradient of a one-column norm came out 1.09 times its bound). With the forward's own intermediates
        (the sum of squares, 1/m: `reference_impls.retention.retention_normed_trace`), per position; an
        element of q_t reaches the outputs at t, one of k_s or v_s every t >= s (a running maximum backwards).
        Used only to excuse a divergent gradient (`harness.gradients.gradient_case`)."""
        from reference_impls import autograd as ad

        o = ad.retention(x["q"], x["k"], x["v"], list(convention.gammas(p.heads)), convention.scale(p.dk))
        dv = o.shape[-1]
        mean_square = (o * o).sum(-1, keepdim=True) / dv + p.eps  # (batch, t, head, 1)
        # 4 m^1.5 <= M is m^-1.5 >= 4 / M, the smallest normal number of every IEEE format (2^(emin) = 4 / 2^(emax+1))
        at_t = torch.maximum(torch.maximum(mean_square * dv, mean_square.reciprocal().pow(1.5)), 4 * mean_square.pow(1.5))
        from_s = at_t.flip(1).cummax(1).values.flip(1)  # the largest over t >= s
        return {name: (at_t if name == "q" else from_s).expand_as(x[name]) for name in names}

    def gradient_traces(self, p, x, cot, names, convention):
        """None: through the norm the gradients are no longer retentions (`Retention.gradient_traces`); the
        normwise bound applies (`harness.gradients`)."""
        return None

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
