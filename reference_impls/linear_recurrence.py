"""Oracle for the ``linear_scan`` family: ``h_t = a_t * h_{t-1} + b_t`` along the last axis.

`linear_recurrence` is the float64 CPU ground truth and, with another ``compute_dtype``/``device``, the
same-dtype sequential baseline (the same loop with every operation rounded in that dtype).
`linear_recurrence_trace` runs the same loop in float64 and also returns the absolute-value companions
described in `reference_impls.trace`.

Arithmetic, per step t = 0, 1, ... in order: ``h_t = fl(fl(a_t * h_{t-1}) + b_t)`` (one multiply, one
add, no fused multiply-add). ``h0=None`` means a zero state, so ``h_0 = a_0 * 0 + b_0`` exactly as the
plain loop computes it (NaN when a_0 is infinite).

Trace recurrences (all in float64, on absolute values):

- magnitude ``H_t = |a_t| H_{t-1} + |b_t|``, ``H_{-1} = |h0|``;
- growth ``W_t = |a_t| (W_{t-1} + H_{t-1}) + |b_t|``, ``W_{-1} = 0``, computed as the equal
  ``W_t = |a_t| W_{t-1} + H_t`` (the same loop with H as input);
- state_peak: running max over t' <= t of ``|h_t'|``;
- decay_peak: running max of ``P_t = |a_t| max(P_{t-1}, 1)``, ``P_{-1} = 0``.
"""

from __future__ import annotations

import torch

from reference_impls import _loop, _validate
from reference_impls.trace import Trace

__all__ = ["linear_recurrence", "linear_recurrence_trace"]


def _check(a: object, b: object, h0: object) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    a = _validate.floating_tensor("a", a)
    b = _validate.floating_tensor("b", b)
    h0 = _validate.optional_tensor("h0", h0)
    _validate.rank("a", a, "(batch, channels, length)")
    _validate.shape("b", b, "a.shape (batch, channels, length)", a.shape)
    if h0 is not None:
        _validate.shape("h0", h0, "(batch, channels)", a.shape[:2])
    return a, b, h0


@_loop.single_threaded()
@torch.no_grad()
def _run(
    a: torch.Tensor,
    b: torch.Tensor,
    h0: torch.Tensor | None,
    *,
    dtype: torch.dtype,
    device: str | torch.device,
    with_trace: bool,
) -> tuple[torch.Tensor, Trace | None]:
    """The one loop: returns h and, when ``with_trace``, the Trace (then dtype must be float64)."""
    a = a.to(device=device, dtype=dtype)
    b = b.to(device=device, dtype=dtype)
    batch, channels, length = a.shape
    state = torch.zeros((batch, channels), dtype=dtype, device=device) if h0 is None else h0.to(device=device, dtype=dtype).clone()
    h = torch.empty_like(a, memory_format=torch.contiguous_format)
    trace = None
    if with_trace:  # filled in place by either loop below
        mag, growth, state_peak, decay_peak = (torch.empty_like(h) for _ in range(4))
        trace = Trace(out=h, magnitude=mag, growth=growth, state_peak=state_peak, decay_peak=decay_peak)
    # The trace's fused kernel: every step and every trace field in one compiled pass (the same arithmetic
    # as the loop below). Otherwise the torch loop, with `_loop.recur` compiled where it can be.
    jit = _loop.fused(a, b, state) if with_trace else None
    if jit is not None:
        jit.linear_recurrence_trace(a.contiguous(), b.contiguous(), state, (h, mag, growth, state_peak, decay_peak))
        return h, trace
    steps = _loop.block_length(length, batch * channels)
    buf = torch.empty((steps, batch, channels), dtype=dtype, device=device)
    if with_trace:
        mag_buf, growth_buf, decay_buf = (torch.empty_like(buf) for _ in range(3))
        mag_state = state.abs()
        growth_state, decay_state, peak_carry, decay_carry = (torch.zeros_like(state) for _ in range(4))
    for start, stop in _loop.blocks(length, steps):
        n = stop - start
        a_blk = a[..., start:stop].permute(2, 0, 1).contiguous()  # (n, batch, channels)
        b_blk = b[..., start:stop].permute(2, 0, 1).contiguous()
        state = _loop.recur(a_blk, b_blk, state, buf[:n])
        h[..., start:stop] = buf[:n].permute(1, 2, 0)
        if with_trace:
            a_abs = a_blk.abs()
            mag_state = _loop.recur(a_abs, b_blk.abs(), mag_state, mag_buf[:n])
            growth_state = _loop.recur(a_abs, mag_buf[:n], growth_state, growth_buf[:n])
            decay_state = _loop.recur_peak(a_abs, decay_state, decay_buf[:n])
            mag[..., start:stop] = mag_buf[:n].permute(1, 2, 0)
            growth[..., start:stop] = growth_buf[:n].permute(1, 2, 0)
            peak, peak_carry = _loop.running_max(buf[:n].abs(), peak_carry)
            state_peak[..., start:stop] = peak.permute(1, 2, 0)
            dpeak, decay_carry = _loop.running_max(decay_buf[:n], decay_carry)
            decay_peak[..., start:stop] = dpeak.permute(1, 2, 0)
    return h, trace


def linear_recurrence(
    a: torch.Tensor,
    b: torch.Tensor,
    h0: torch.Tensor | None = None,
    *,
    compute_dtype: torch.dtype = torch.float64,
    device: str | torch.device = "cpu",
) -> torch.Tensor:
    """``h[..., t] = a[..., t] * h[..., t-1] + b[..., t]`` with ``h[..., -1] = h0`` (zeros if None).

    a, b: (batch, channels, length); h0: (batch, channels). Inputs are converted with
    ``.to(device=device, dtype=compute_dtype)`` first and every operation is rounded in
    ``compute_dtype``. Returns h with a's shape, in ``compute_dtype`` on ``device``.
    """
    a, b, h0 = _check(a, b, h0)
    dtype = _validate.floating_dtype("compute_dtype", compute_dtype)
    h, _ = _run(a, b, h0, dtype=dtype, device=device, with_trace=False)
    return h


def linear_recurrence_trace(a: torch.Tensor, b: torch.Tensor, h0: torch.Tensor | None = None) -> Trace:
    """The float64 CPU oracle's output and its absolute-value companions (see the module docstring)."""
    a, b, h0 = _check(a, b, h0)
    _, trace = _run(a, b, h0, dtype=torch.float64, device="cpu", with_trace=True)
    assert trace is not None
    return trace
