"""``retention_normed``: ``fn(q, k, v, eps) -> o``: `retention` followed by the per-head RMS group norm."""

from __future__ import annotations

import torch

from harness.families.base import limit_scale
from harness.families.retention import Retention
from harness.kernels.contract import DTYPE_NAMES, Family


#: How many times nearer the family's output with eps outside the root a kernel's output must lie than the
#: family's own for `RetentionNormed.eps_placement` to say the kernel puts it there.
EPS_PLACEMENT_MARGIN = 10.0


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

    def eps_placement(self, p, x, actual, convention):
        """``o / (sqrt(mean(o^2)) + eps)`` (eps outside the root, a common slip) where the kernel's output lies
        nearer it than the family's ``o / sqrt(mean(o^2) + eps)`` by `EPS_PLACEMENT_MARGIN`, ``o`` the float64
        retention on the case's inputs; both distances in the clause. An eps effect is otherwise an eps the
        kernel scales (torchscale normalises a rescaled o), and the why says only that eps=0 agrees."""
        o = Retention.trace(self, p, x, convention).out
        mean_square = (o * o).mean(-1, keepdim=True)
        inside = o / (mean_square + p.eps).sqrt()
        outside = o / (mean_square.sqrt() + p.eps)
        got = actual.detach().to(device="cpu", dtype=torch.float64)
        both = torch.isfinite(got) & torch.isfinite(inside) & torch.isfinite(outside)
        if not bool(both.any()):
            return None
        far, near = (float((got - y)[both].abs().max()) for y in (inside, outside))
        if not far > EPS_PLACEMENT_MARGIN * near:
            return None
        return (f"the output is o / (sqrt(mean(o^2)) + eps), eps outside the root (max distance {near:.3g}; "
                f"{far:.3g} from the family's o / sqrt(mean(o^2) + eps)): put eps inside the square root")

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
        """Through the norm the gradients are retentions again (`Retention.gradient_traces`), of the raw
        retention's cotangent: the norm's Jacobian applied to g (`_raw_cotangent`),

            g~ = (g - y mean(g y)) / r,    y = o / r,  r = sqrt(mean(o^2) + eps)   (means over dv),

        so each gradient's values and state peaks are the adjoint retention's of g~. Its bound is that
        retention's rounding with g~ bounded term by term (``|g| / r + |y| mean|g y| / r``, the magnitude too),
        plus what a backward's g~ may be off by, carried through the retention with absolute values:

        - its own rounding: the dot product over dv and the few operations around it, and the norm's divisor
          r formed from a sum of dv squares, at most ``(1.5 dv + 6)`` roundings of its terms;
        - the forward's rounding of o (``u W``, W the raw retention's growth), through the Jacobian's
          derivative (first order; e = W / r): ``(|s| e_i + |y_i| mean(|g| e) + (|g_i| + 3 |s| |y_i|) mean(|y| e)) / r``
          with |s| <= mean|g y|, from ``dg~_i/do_k = (-s delta_ik - (y_i g_k + g_i y_k) / dv + 3 s y_i y_k / dv) / r^2``.

        Until session 20 the normwise bound applied, which left no digit in float16 or bfloat16: every half-
        precision gradient of a correct normed kernel was out_of_domain, whatever its backward did."""
        from harness.families.retention import ADJOINT_PLACES, adjoint_trace
        from reference_impls.retention import retention_trace
        from reference_impls.trace import Trace

        gamma, scale = self._convention(p, convention)
        inner = retention_trace(x["q"], x["k"], x["v"], gamma=gamma, scale=scale)
        raw, terms, r, y = _raw_cotangent(cot, inner.out, p.eps)
        mean = lambda t: t.mean(-1, keepdim=True)  # noqa: E731 - over dv
        dv = y.shape[-1]
        g_abs, y_abs = cot.abs(), y.abs()
        s_abs = mean((cot * y).abs())

        def carried(e: torch.Tensor) -> torch.Tensor:  # how far an error of e r in o moves g~ (first order)
            ye = mean(y_abs * e)
            return (s_abs * e + y_abs * mean(g_abs * e) + (g_abs + 3 * s_abs * y_abs) * ye) / r

        error = (1.5 * dv + 6) * terms + carried(inner.growth / r)
        through = carried(inner.magnitude / r)  # the terms of o, each moved by its own rounding
        traces = {}
        for name in (n for n in names if n in ADJOINT_PLACES):
            exact, bound = adjoint_trace(name, x, raw, gamma, scale), adjoint_trace(name, x, terms, gamma, scale)
            off, spread = (adjoint_trace(name, x, t, gamma, scale).magnitude for t in (error, through))
            traces[name] = Trace(out=exact.out, magnitude=bound.magnitude + spread, growth=bound.growth + off,
                                 state_peak=exact.state_peak, decay_peak=exact.decay_peak)
        return traces

    def draw_fields(self, draw, caps, lim, regime, common):
        from hypothesis import strategies as st

        from harness.strategies import epsilons

        fields = super().draw_fields(draw, caps, lim, regime, common)
        fields["eps"] = draw(st.sampled_from(caps.eps_values) if caps.eps_values else epsilons())
        return fields


def _raw_cotangent(cot: torch.Tensor, o: torch.Tensor, eps: float):
    """The RMS norm's pullback at the raw retention output ``o``: ``(g~, its terms bounded, r, y)`` with
    ``g~ = (g - y mean(g y)) / r`` and the bound ``|g| / r + |y| mean|g y| / r`` (means over dv)."""
    r = torch.sqrt((o * o).mean(-1, keepdim=True) + eps)
    y = o / r
    raw = (cot - y * (cot * y).mean(-1, keepdim=True)) / r
    terms = (cot.abs() + y.abs() * (cot * y).abs().mean(-1, keepdim=True)) / r
    return raw, terms, r, y


FAMILY = RetentionNormed()
