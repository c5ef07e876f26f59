"""Oracles for the ``retention`` and ``retention_normed`` families (RetNet's recurrent form).

`retention` is the float64 CPU ground truth and, with another ``compute_dtype``/``device``, the
same-dtype sequential baseline; `group_norm` and `retention_normed` add the per-head group norm;
`retention_trace` and `retention_normed_trace` run the same code in float64 and also return the
absolute-value companions of `reference_impls.trace`.

Definition, per batch b and head h (q, k: (batch, L, heads, dk); v: (batch, L, heads, dv))::

    S_t = gamma_h * S_{t-1} + k_t^T v_t        (S is dk x dv, S_{-1} = 0)
    o_t = scale * (q_t S_t)

with ``gamma_h = 1 - 2**(-5 - h)`` and ``scale = dk**-0.5`` unless given. Arithmetic, exactly in this
order: ``k_t^T v_t`` is the elementwise product ``k[i] * v[j]``; the state update is one multiply then
one add (see `reference_impls._loop`); ``q_t S_t`` sums ``q[i] * S[i, j]`` for i = 0, 1, ..., dk-1 left to
right; the result is then multiplied by ``scale`` (a Python float). gamma is converted to
``compute_dtype`` like the inputs (in float16, gammas closer to 1 than 2**-12 round to 1).

Group norm (per (b, t, h), over dv, no affine), sums left to right over dv::

    rms:   y = o / r,        r = sqrt(sum(o^2) / dv + eps)
    layer: y = c / s,        c = o - sum(o) / dv,  s = sqrt(sum(c^2) / dv + eps)   (biased variance)

Trace of `retention`, with H_S, W_S the |.|-recurrences of the state (``H_S = |gamma| H_S + |k|^T|v|``,
``W_S = |gamma| W_S + H_S``, i.e. ``W_t = |gamma| (W_{t-1} + H_{t-1}) + |k|^T|v|``):
magnitude ``= |scale| |q| H_S``; growth ``= |scale| |q| W_S + dk |scale| |q| H_S`` (the second term is the
rounding of the dk products and the sequential sum over dk); state_peak[b,t,h,j] = running max over
t' <= t and i of ``|S[i, j]|``; decay_peak = running max of ``P_t = |gamma_h| max(P_{t-1}, 1)``, which is
``|gamma_h|`` for every t when ``|gamma_h| <= 1`` and ``|gamma_h|**(t+1)`` otherwise.

Trace of `retention_normed` (derivation). Let m, g be retention's magnitude and growth and y the normed
output. To first order, an error e in o changes y by ``J e`` with the Jacobian

    rms:   dy_j/do_k = (delta_jk - y_j y_k / dv) / r
    layer: dy_j/do_k = (delta_jk - 1/dv - y_j y_k / dv) / s

so ``|J| x <= (x + |y| mean(|y| x)) / r`` (rms) and ``(x + mean(x) + |y| mean(|y| x)) / s`` (layer) for any
nonnegative bound x on |e|. Then:

- magnitude ``= |J| m + |y|`` (the ``+ |y|``: the norm's own arithmetic is a few ulps of |y|);
- growth ``= |J| g + (dv/2 + 3) |y|``: the sequential sum of dv squares errs by at most dv ulps of the
  mean square, which the square root halves, plus the roundings of the division by dv, of ``+ eps``, of
  sqrt and of ``o / r``. For ``layer`` add ``dv mean(|o|) / s``: the rounding of the mean, which shifts
  every centred value at once.

The simpler ``m / r + |y|`` would drop the projection term ``|y| mean(|y| m) / r``, which is as large
as ``m / r`` when cancellation in o is uneven across dv; it is kept here. With eps = 0 and o = 0 the
normed output and its trace are NaN (0 / 0), as in the plain loop.

Memory: per block of steps the states are (steps, batch, heads, dk, dv); no (L, dk, dv) tensor is formed.
The fused kernels (`reference_impls._compiled`, CPU float32/float64) keep one state (and, for the trace,
one H and W) and form no per-step intermediates.
"""

from __future__ import annotations

from typing import Sequence

import torch

from reference_impls import _loop, _validate
from reference_impls.trace import Trace

__all__ = [
    "default_gammas",
    "retention",
    "group_norm",
    "retention_normed",
    "retention_trace",
    "retention_normed_trace",
]

Gamma = Sequence[float] | torch.Tensor | None


def default_gammas(heads: int) -> tuple[float, ...]:
    """RetNet's per-head decay ``1 - 2**(-5 - h)`` (the same as harness.kernels.contract.retnet_gammas)."""
    return tuple(1.0 - 2.0 ** (-5 - h) for h in range(heads))


def _check(q: object, k: object, v: object, gamma: object, scale: object):
    q = _validate.floating_tensor("q", q)
    k = _validate.floating_tensor("k", k)
    v = _validate.floating_tensor("v", v)
    _validate.rank("q", q, "(batch, L, heads, dk)")
    _validate.shape("k", k, "q.shape (batch, L, heads, dk)", q.shape)
    _validate.rank("v", v, "(batch, L, heads, dv)")
    batch, length, heads, dk = q.shape
    if tuple(v.shape[:3]) != (batch, length, heads):
        raise ValueError(
            f"v.shape={tuple(v.shape)} does not match: expected (batch, L, heads, dv) = "
            f"({batch}, {length}, {heads}, dv) from q.shape={tuple(q.shape)}"
        )
    _validate.positive_dim("q", q, "dk", 3)
    _validate.positive_dim("v", v, "dv", 3)
    gammas = _validate.per_head("gamma", default_gammas(heads) if gamma is None else gamma, heads)
    scale_ = dk**-0.5 if scale is None else _validate.real_number("scale", scale)
    return q, k, v, gammas, scale_


@_loop.single_threaded()
@torch.no_grad()
def _run(q, k, v, gammas, scale, *, dtype, device, with_trace):
    """The one loop: returns (o, trace or None)."""
    q, k, v = (x.to(device=device, dtype=dtype) for x in (q, k, v))
    batch, length, heads, dk = q.shape
    dv = v.shape[-1]
    gamma = gammas.to(device=device, dtype=dtype).view(heads, 1, 1)
    o = torch.empty((batch, length, heads, dv), dtype=dtype, device=device)
    state = torch.zeros((batch, heads, dk, dv), dtype=dtype, device=device)
    trace = None
    if with_trace:  # filled in place by either loop below
        mag, growth, state_peak, decay_peak = (torch.empty_like(o) for _ in range(4))
        trace = Trace(out=o, magnitude=mag, growth=growth, state_peak=state_peak, decay_peak=decay_peak)
        mag_state, growth_state = torch.zeros_like(state), torch.zeros_like(state)
        p_state = torch.zeros((heads,), dtype=dtype, device=device)
    # The fused kernels: one compiled pass per block does k^T v, the state update and q S (plain), plus
    # the trace's recurrences, sums and running maxima (trace). They keep one state, so their blocks are
    # sized by the steps' inputs and outputs. Otherwise the torch loop below, which needs every state of
    # a block (with `_loop.recur` compiled where it can be).
    jit = _loop.fused(q, k, v, gamma)
    if jit is not None:
        q, k, v = (x.contiguous() for x in (q, k, v))
        for start, stop in _loop.blocks(length, _loop.block_length(length, batch * heads * 2 * (dk + dv))):
            if with_trace:  # q S, |q| H, |q| W and the running maxima, as below
                jit.retention_trace_block(gamma.view(heads), q, k, v, start, stop, (state, mag_state, growth_state),
                                          p_state, (o, mag, growth, state_peak, decay_peak))
                mag_o = mag[:, start:stop].mul_(abs(scale))
                growth[:, start:stop].mul_(abs(scale)).add_(dk * mag_o)
            else:
                jit.retention_block(gamma.view(heads), q, k, v, start, stop, state, o)  # q S, as below
            o[:, start:stop].mul_(scale)
        return o, trace
    steps = _loop.block_length(length, batch * heads * dk * dv)
    s_buf = torch.empty((steps, batch, heads, dk, dv), dtype=dtype, device=device)
    if with_trace:
        mag_buf, growth_buf = torch.empty_like(s_buf), torch.empty_like(s_buf)
        gamma_abs = gamma.abs()
        p_buf = torch.empty((steps, heads), dtype=dtype, device=device)
        peak_carry = torch.zeros((batch, heads, dv), dtype=dtype, device=device)
        decay_carry = torch.zeros_like(peak_carry)
    for start, stop in _loop.blocks(length, steps):
        n = stop - start
        q_blk, k_blk, v_blk = (x[:, start:stop].transpose(0, 1) for x in (q, k, v))  # (n, batch, heads, .)
        kv = k_blk[..., :, None] * v_blk[..., None, :]  # (n, batch, heads, dk, dv)
        s_blk = s_buf[:n]
        state = _loop.recur(gamma, kv, state, s_blk, per_step_decay=False)
        o_blk = _loop.seq_sum(q_blk[..., :, None] * s_blk, -2).mul_(scale)  # (n, batch, heads, dv)
        o[:, start:stop] = o_blk.transpose(0, 1)
        if with_trace:
            q_abs = q_blk.abs()[..., :, None]
            mag_state = _loop.recur(gamma_abs, kv.abs(), mag_state, mag_buf[:n], per_step_decay=False)
            growth_state = _loop.recur(gamma_abs, mag_buf[:n], growth_state, growth_buf[:n], per_step_decay=False)
            mag_o = _loop.seq_sum(q_abs * mag_buf[:n], -2).mul_(abs(scale))
            growth_o = _loop.seq_sum(q_abs * growth_buf[:n], -2).mul_(abs(scale)) + dk * mag_o
            mag[:, start:stop] = mag_o.transpose(0, 1)
            growth[:, start:stop] = growth_o.transpose(0, 1)
            peak, peak_carry = _loop.running_max(s_blk.abs().amax(-2), peak_carry)
            state_peak[:, start:stop] = peak.transpose(0, 1)
            p_state = _loop.recur_peak(gamma_abs.view(heads), p_state, p_buf[:n], per_step_decay=False)
            p_blk = p_buf[:n].view(n, 1, heads, 1).expand(n, batch, heads, dv)
            dpeak, decay_carry = _loop.running_max(p_blk, decay_carry)
            decay_peak[:, start:stop] = dpeak.transpose(0, 1)
    return o, trace


@torch.no_grad()
def _norm(o: torch.Tensor, eps: float, kind: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(y, denominator r or s with a trailing axis of 1), in o's dtype (definition in the module docstring)."""
    dv = o.shape[-1]
    if kind == "layer":
        o = o - (_loop.seq_sum(o, -1) / dv)[..., None]
    denom = (_loop.seq_sum(o * o, -1) / dv).add_(eps).sqrt_()[..., None]
    return o / denom, denom


@_loop.single_threaded()  # the norm's whole-tensor ops too (see `_loop.single_threaded`)
def group_norm(
    o: torch.Tensor,
    eps: float,
    kind: str = "rms",
    *,
    compute_dtype: torch.dtype = torch.float64,
    device: str | torch.device = "cpu",
) -> torch.Tensor:
    """Normalize over the last axis (dv), per every other index (e.g. per (batch, t, head)); no affine.

    ``kind="rms"``: ``o / sqrt(mean(o^2) + eps)``; ``kind="layer"``: ``(o - mean) / sqrt(var + eps)``
    with the biased variance. Means are left-to-right sums divided by dv, in ``compute_dtype``.
    """
    o = _validate.floating_tensor("o", o)
    if o.ndim < 1:
        raise ValueError(f"o.shape={tuple(o.shape)} has no axis to normalize; expected (..., dv)")
    _validate.positive_dim("o", o, "dv", -1)
    eps_ = _validate.eps(eps)
    kind = _validate.norm_kind(kind)
    dtype = _validate.floating_dtype("compute_dtype", compute_dtype)
    y, _ = _norm(o.to(device=device, dtype=dtype), eps_, kind)
    return y


def retention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    gamma: Gamma = None,
    scale: float | None = None,
    *,
    compute_dtype: torch.dtype = torch.float64,
    device: str | torch.device = "cpu",
) -> torch.Tensor:
    """RetNet's recurrent retention (definition and arithmetic in the module docstring).

    gamma: one decay per head (sequence of floats or tensor of shape (heads,)); default
    ``1 - 2**(-5 - h)``. scale: default ``dk**-0.5``. Inputs are converted with
    ``.to(device=device, dtype=compute_dtype)``; every operation is rounded in ``compute_dtype``.
    Returns o (batch, L, heads, dv).
    """
    args = _check(q, k, v, gamma, scale)
    dtype = _validate.floating_dtype("compute_dtype", compute_dtype)
    o, _ = _run(*args, dtype=dtype, device=device, with_trace=False)
    return o


@_loop.single_threaded()  # the norm's whole-tensor ops too (see `_loop.single_threaded`)
def retention_normed(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    eps: float,
    gamma: Gamma = None,
    scale: float | None = None,
    kind: str = "rms",
    *,
    compute_dtype: torch.dtype = torch.float64,
    device: str | torch.device = "cpu",
) -> torch.Tensor:
    """``group_norm(retention(q, k, v, gamma, scale), eps, kind)``, all in ``compute_dtype``."""
    args = _check(q, k, v, gamma, scale)
    eps_ = _validate.eps(eps)
    kind = _validate.norm_kind(kind)
    dtype = _validate.floating_dtype("compute_dtype", compute_dtype)
    o, _ = _run(*args, dtype=dtype, device=device, with_trace=False)
    y, _ = _norm(o, eps_, kind)
    return y


def retention_trace(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    gamma: Gamma = None,
    scale: float | None = None,
) -> Trace:
    """The float64 CPU oracle's output and its absolute-value companions (see the module docstring)."""
    args = _check(q, k, v, gamma, scale)
    _, trace = _run(*args, dtype=torch.float64, device="cpu", with_trace=True)
    assert trace is not None
    return trace


@_loop.single_threaded()  # the norm's whole-tensor ops too (see `_loop.single_threaded`)
def retention_normed_trace(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    eps: float,
    gamma: Gamma = None,
    scale: float | None = None,
    kind: str = "rms",
) -> Trace:
    """`retention_normed`'s float64 output and companions: retention's, mapped through the norm's
    first-order sensitivity (derivation in the module docstring); state_peak and decay_peak as for
    `retention`; norm_peak the larger of the norm's sum of squares and the reciprocal of its mean square
    (plus eps) at each position."""
    args = _check(q, k, v, gamma, scale)
    eps_ = _validate.eps(eps)
    kind = _validate.norm_kind(kind)
    _, inner = _run(*args, dtype=torch.float64, device="cpu", with_trace=True)
    assert inner is not None
    o = inner.out
    dv = o.shape[-1]
    y, denom = _norm(o, eps_, kind)
    y_abs = y.abs()

    def sensitivity(x: torch.Tensor) -> torch.Tensor:
        bound = x + y_abs * (y_abs * x).mean(-1, keepdim=True)
        if kind == "layer":
            bound = bound + x.mean(-1, keepdim=True)
        return bound / denom

    magnitude = sensitivity(inner.magnitude) + y_abs
    growth = sensitivity(inner.growth) + (dv / 2 + 3) * y_abs
    if kind == "layer":
        growth = growth + dv * o.abs().mean(-1, keepdim=True) / denom
    # The norm's own intermediates must be representable too: the sum of squares (o^2 overflows first) and
    # its reciprocal (a mean square + eps below about a quarter of the smallest normal number leaves too few
    # digits, and one that underflows makes 0/0 or x/0). A norm that cannot be evaluated in a dtype is an
    # input-domain finding, not a kernel bug; only at that position (norm_peak): the next position's norm
    # starts afresh, unlike the state, whose peak stays a running maximum.
    mean_square = denom.square()  # mean(o^2) + eps (for "layer", of the centred o)
    sum_of_squares = mean_square * dv  # the sum the norm forms before dividing by dv
    norm_peak = torch.maximum(sum_of_squares, mean_square.reciprocal()).expand_as(y)
    return Trace(out=y, magnitude=magnitude, growth=growth, state_peak=inner.state_peak,
                 decay_peak=inner.decay_peak, norm_peak=norm_peak)
