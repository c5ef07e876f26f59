"""Oracle for the ``selective_scan`` family (Mamba's selective scan, mamba-ssm ``selective_scan_fn`` layout).

`selective_scan` is the float64 CPU ground truth and, with another ``compute_dtype``/``device``, the
same-dtype sequential baseline. `selective_scan_trace` runs the same loop in float64 and also returns
the absolute-value companions of `reference_impls.trace`.

Definition (u, delta, z: (batch, dim, L); A: (dim, N); B, C: (batch, N, L) or (batch, G, N, L), channel
d using group ``d // (dim // G)``; D, delta_bias: (dim,))::

    d'[b,d,t]  = softplus(delta + delta_bias) if delta_softplus else delta + delta_bias
    h[b,d,n,t] = exp(d'[b,d,t] * A[d,n]) * h[b,d,n,t-1] + (d'[b,d,t] * u[b,d,t]) * B[b,n,t]
    y[b,d,t]   = sum_n C[b,n,t] * h[b,d,n,t] + D[d] * u[b,d,t]
    y         *= silu(z)                       (when z is given)

with ``h[..., -1] = 0``. Arithmetic, exactly as written and in this order: ``d' * u`` is formed first and
then multiplied by B (mamba-ssm's CUDA kernel does the same); the state update is one multiply then one
add (see `reference_impls._loop`); the sum over n runs n = 0, 1, ..., N-1 left to right; ``D * u`` is
added after that sum; the gate multiplies last. ``silu(z) = z * sigmoid(z)`` (``torch.nn.functional.silu``).

Softplus: mamba-ssm's definition, ``softplus(x) = x if x > 20 else log1p(exp(x))``, which is
``torch.nn.functional.softplus(x, beta=1, threshold=20)``. It is what the kernels under test compute;
for x > 20 it differs from the mathematical softplus by ``log1p(exp(-x)) < 2.1e-9`` (absolute), which
the exact tests model the same way. Below the threshold ``log1p(exp(x))`` is accurate to an ulp or two
(and underflows to 0 only where the true value is below float64's range).

Trace (float64, per channel and state entry n, then mapped through the output map):

- ``H_n`` and ``W_n`` are the recurrences of `reference_impls.linear_recurrence` with
  ``a = exp(d' A)`` and ``b = d' u B``; ``P_n`` likewise.
- magnitude ``= sum_n |C_n| H_n + |D u|``;
- growth ``= sum_n |C_n| W_n + N * sum_n |C_n| H_n + |D u|``. The middle term is the rounding of the
  products C h and of the sequential sum over n (at most N roundings of terms bounded by |C_n| H_n), the
  same term as the ``dk * scale * |q| H_S`` of retention's dot product;
- with z, both become ``(...) * |silu(z)| + |y|`` (the gate's own rounding is a few ulps of |y|);
- state_peak: running max over t' <= t of ``|h[b,d,n,t']|`` (every n) and of the ungated magnitude
  ``sum_n |C_n| H_n + |D u|`` (the terms of the sum must be representable too); decay_peak: running max
  over t' <= t and n of P.

Caveat on growth: it assumes ``exp(d' A)`` is rounded with relative error about u. The rounding of its
argument ``d' * A`` adds a relative error ``|d' A| u``; the error that causes in h is at most
``u * H / e`` per step (``|x| e^x <= 1/e``), so it matters only when |d' A| is large and A > 0.

Memory: per block of steps, ``exp(d' A)``, ``d' u B`` and the states are (steps, batch, dim, N); no
(batch, dim, N, L) tensor is ever formed (see `reference_impls._loop`). The fused kernels
(`reference_impls._compiled`, CPU float32/float64) keep one state (and, for the trace, one H, W and P)
and form only ``exp(d' A)`` per block.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from reference_impls import _loop, _validate
from reference_impls.trace import Trace

__all__ = ["selective_scan", "selective_scan_trace", "SOFTPLUS_THRESHOLD"]

#: Above this, softplus(x) is taken to be x (mamba-ssm and torch's default).
SOFTPLUS_THRESHOLD: float = 20.0


def _check(u, delta, A, B, C, D, z, delta_bias):
    u = _validate.floating_tensor("u", u)
    delta = _validate.floating_tensor("delta", delta)
    A = _validate.floating_tensor("A", A)
    B = _validate.floating_tensor("B", B)
    C = _validate.floating_tensor("C", C)
    D = _validate.optional_tensor("D", D)
    z = _validate.optional_tensor("z", z)
    delta_bias = _validate.optional_tensor("delta_bias", delta_bias)
    _validate.rank("u", u, "(batch, dim, L)")
    batch, dim, length = u.shape
    _validate.shape("delta", delta, "u.shape (batch, dim, L)", u.shape)
    _validate.rank("A", A, "(dim, N)")
    if A.shape[0] != dim:
        raise ValueError(f"A.shape={tuple(A.shape)} does not match: expected (dim, N) with dim={dim} (u.shape[1])")
    _validate.positive_dim("A", A, "N", 1)
    n_state = A.shape[1]
    grouped = []
    for name, x in (("B", B), ("C", C)):
        if x.ndim == 4:
            groups = x.shape[1]
            _validate.shape(name, x, "grouped (batch, G, N, L)", (batch, groups, n_state, length))
            if groups < 1 or dim % groups:
                raise ValueError(
                    f"{name}.shape={tuple(x.shape)} has G={groups} groups, which does not divide dim={dim}; "
                    f"expected G >= 1 with dim % G == 0 (channel d uses group d // (dim // G))"
                )
            grouped.append(x)
        else:
            _validate.shape(name, x, "(batch, N, L)", (batch, n_state, length), "grouped (batch, G, N, L)")
            grouped.append(x.unsqueeze(1))
    if D is not None:
        _validate.shape("D", D, "(dim,)", (dim,))
    if z is not None:
        _validate.shape("z", z, "u.shape (batch, dim, L)", u.shape)
    if delta_bias is not None:
        _validate.shape("delta_bias", delta_bias, "(dim,)", (dim,))
    return u, delta, A, grouped[0], grouped[1], D, z, delta_bias


def delta_prime(delta: torch.Tensor, delta_bias: torch.Tensor | None, delta_softplus: bool) -> torch.Tensor:
    """``d' = softplus(delta + delta_bias)`` (or without softplus / bias), in delta's dtype (module docstring)."""
    dprime = delta if delta_bias is None else delta + delta_bias[:, None]
    return F.softplus(dprime, beta=1.0, threshold=SOFTPLUS_THRESHOLD) if delta_softplus else dprime


def _per_channel(x: torch.Tensor, start: int, stop: int, dim: int) -> torch.Tensor:
    """Steps [start, stop) of grouped (batch, G, N, L) as (steps, batch, dim or 1, N) for broadcasting."""
    blk = x[..., start:stop].permute(3, 0, 1, 2)  # (steps, batch, G, N)
    groups = x.shape[1]
    return blk if groups == 1 else blk.repeat_interleave(dim // groups, dim=2)


@_loop.single_threaded()
@torch.no_grad()
def _run(u, delta, A, B, C, D, z, delta_bias, delta_softplus, *, dtype, device, with_trace):
    """The one loop: returns (y, last_state, trace or None); B, C are grouped (batch, G, N, L)."""
    cvt = lambda x: None if x is None else x.to(device=device, dtype=dtype)  # noqa: E731
    u, delta, A, B, C, D, z, delta_bias = map(cvt, (u, delta, A, B, C, D, z, delta_bias))
    batch, dim, length = u.shape
    n_state = A.shape[1]
    dprime = delta_prime(delta, delta_bias, delta_softplus)
    # The fused kernels: one compiled pass per block does the state update and C.h + D u (plain), and
    # also the trace's recurrences, output maps and running maxima (trace). Otherwise the torch loop
    # below, with `_loop.recur` compiled where it can be. The gate is applied after either.
    jit = _loop.fused(u, dprime, A, B, C, D)
    if jit is not None:  # the kernel reads these in place; exp(d' A) below still comes from dprime as is
        u_c, dprime_c, B_c, C_c = (x.contiguous() for x in (u, dprime, B, C))
    y = torch.empty_like(u, memory_format=torch.contiguous_format)
    state = torch.zeros((batch, dim, n_state), dtype=dtype, device=device)
    steps = _loop.block_length(length, batch * dim * n_state)
    h_buf = None if jit is not None else torch.empty((steps, batch, dim, n_state), dtype=dtype, device=device)
    if with_trace:
        mag, growth, state_peak, decay_peak = (torch.empty_like(y) for _ in range(4))
        mag_state, growth_state, decay_state = (torch.zeros_like(state) for _ in range(3))
        if jit is None:
            mag_buf, growth_buf, decay_buf = (torch.empty_like(h_buf) for _ in range(3))
            peak_carry = torch.zeros((batch, dim), dtype=dtype, device=device)
            decay_carry = torch.zeros_like(peak_carry)
    for start, stop in _loop.blocks(length, steps):
        n = stop - start
        d_blk = dprime[..., start:stop].permute(2, 0, 1)  # (n, batch, dim)
        decay = torch.mul(d_blk[..., None], A).exp_()  # (n, batch, dim, N)
        if jit is not None:  # the same arithmetic as the lines below, and the D u terms after the loop
            if with_trace:
                jit.selective_scan_trace_block(decay, dprime_c, u_c, B_c, C_c, D, start,
                                               (state, mag_state, growth_state, decay_state),
                                               (y, mag, growth, state_peak, decay_peak))
            else:
                jit.selective_scan_block(decay, dprime_c, u_c, B_c, C_c, D, start, state, y)
            continue
        du = dprime[..., start:stop] * u[..., start:stop]  # d' u, then multiplied by B
        inp = du.permute(2, 0, 1)[..., None] * _per_channel(B, start, stop, dim)
        h_blk = h_buf[:n]
        state = _loop.recur(decay, inp, state, h_blk)
        C_blk = _per_channel(C, start, stop, dim)
        y_blk = _loop.seq_sum(C_blk * h_blk, -1).permute(1, 2, 0)
        if D is not None and not with_trace:  # + D u per block: no (batch, dim, L) temporary
            y_blk = y_blk + D[:, None] * u[..., start:stop]
        y[..., start:stop] = y_blk
        if with_trace:
            C_abs = C_blk.abs()
            mag_state = _loop.recur(decay, inp.abs(), mag_state, mag_buf[:n])  # decay = exp(.) >= 0
            growth_state = _loop.recur(decay, mag_buf[:n], growth_state, growth_buf[:n])
            decay_state = _loop.recur_peak(decay, decay_state, decay_buf[:n])
            mag_y = _loop.seq_sum(C_abs * mag_buf[:n], -1)
            mag[..., start:stop] = mag_y.permute(1, 2, 0)
            growth_y = _loop.seq_sum(C_abs * growth_buf[:n], -1) + n_state * mag_y
            growth[..., start:stop] = growth_y.permute(1, 2, 0)
            peak, peak_carry = _loop.running_max(h_blk.abs().amax(-1), peak_carry)
            state_peak[..., start:stop] = peak.permute(1, 2, 0)
            dpeak, decay_carry = _loop.running_max(decay_buf[:n].amax(-1), decay_carry)
            decay_peak[..., start:stop] = dpeak.permute(1, 2, 0)
    # The D u terms, and the magnitude's share of the state peak: the terms of C.h + D u are intermediates
    # too, and when their sum of magnitudes passes a dtype's range a correct kernel can overflow before the
    # gate scales y back into range. (The fused trace kernel does this per step.)
    if with_trace and jit is None:
        if D is not None:
            du_skip = D[:, None] * u
            y.add_(du_skip)
            mag.add_(du_skip.abs())
            growth.add_(du_skip.abs())
        state_peak = torch.maximum(state_peak, torch.cummax(mag, dim=-1).values)
    if z is not None:
        gate = F.silu(z)
        y.mul_(gate)
    if not with_trace:
        return y, state, None
    if z is not None:
        gate_abs, y_abs = gate.abs(), y.abs()
        mag.mul_(gate_abs).add_(y_abs)
        growth.mul_(gate_abs).add_(y_abs)
    return y, state, Trace(out=y, magnitude=mag, growth=growth, state_peak=state_peak, decay_peak=decay_peak)


def selective_scan(
    u: torch.Tensor,
    delta: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor | None = None,
    z: torch.Tensor | None = None,
    delta_bias: torch.Tensor | None = None,
    delta_softplus: bool = False,
    return_last_state: bool = False,
    *,
    compute_dtype: torch.dtype = torch.float64,
    device: str | torch.device = "cpu",
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Mamba's selective scan as a sequential loop (definition and arithmetic in the module docstring).

    Inputs are converted with ``.to(device=device, dtype=compute_dtype)`` first; every operation is
    rounded in ``compute_dtype``. Returns y (batch, dim, L), or ``(y, last_state)`` with last_state
    (batch, dim, N) = h at t = L-1 (zeros when L == 0) when ``return_last_state``.
    """
    args = _check(u, delta, A, B, C, D, z, delta_bias)
    dtype = _validate.floating_dtype("compute_dtype", compute_dtype)
    y, last_state, _ = _run(*args, bool(delta_softplus), dtype=dtype, device=device, with_trace=False)
    return (y, last_state) if return_last_state else y


def selective_scan_trace(
    u: torch.Tensor,
    delta: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor | None = None,
    z: torch.Tensor | None = None,
    delta_bias: torch.Tensor | None = None,
    delta_softplus: bool = False,
) -> Trace:
    """The float64 CPU oracle's output and its absolute-value companions (see the module docstring)."""
    args = _check(u, delta, A, B, C, D, z, delta_bias)
    _, _, trace = _run(*args, bool(delta_softplus), dtype=torch.float64, device="cpu", with_trace=True)
    assert trace is not None
    return trace


def selective_scan_chunk_growth(
    u: torch.Tensor,
    delta: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor | None = None,
    z: torch.Tensor | None = None,
    delta_bias: torch.Tensor | None = None,
    delta_softplus: bool = False,
    *,
    chunk_size: int,
) -> torch.Tensor:
    """The chunk term of a kernel that forms its decays inside chunks of ``chunk_size`` (units of u,
    (batch, dim, L), float64), to be added to `selective_scan_trace`'s growth.

    Such a kernel (a selective scan written with segment sums, the way SSD code is) evaluates
    ``exp(G_t - G_s)``, ``exp(G_t)`` and ``exp(G_last - G_s)`` with ``G_t = g_c + ... + g_t`` a cumulative
    sum of the log-decays ``g = d' A`` from the chunk's first step c, per state entry n. This is the
    gated families' chunk term (`reference_impls.gated_decay`, whose docstring argues each piece) with
    that g: ``M_t`` the within-chunk mass ``|g_c| + ... + |g_t|``, ``Lambda_t = sqrt(M_c^2 + ... + M_t^2)``
    (the random walk of the cumulative sum's roundings, at least ``M_t``), ``H`` the state magnitude of
    the trace, and::

        Dc_t = |a_t| (Dc_{t-1} + r_t),  r_t = 2 Lambda_{t-1} H_{t-1} at a chunk's first step, else 0
        Y_t  = Dc_t + 2 Lambda_t H_t
        chunk_growth = sum_n |C_n| Y_n   (times |silu(z)| with a gate)

    A loop over t, vectorised over (batch, dim, N): it runs only for kernels that declare a chunk size.
    """
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"chunk_size={chunk_size!r} must be a positive integer")
    u, delta, A, B, C, D, z, delta_bias = (
        None if x is None else x.to(device="cpu", dtype=torch.float64)
        for x in _check(u, delta, A, B, C, D, z, delta_bias))
    batch, dim, length = u.shape
    dprime = delta_prime(delta, delta_bias, delta_softplus)
    drive = (dprime * u).abs()
    out = torch.empty((length, batch, dim), dtype=torch.float64)
    zeros = torch.zeros((batch, dim, A.shape[1]), dtype=torch.float64)
    h, mass, walk, carried, lam = zeros, zeros, zeros, zeros, zeros
    for t in range(length):  # memory of one step: nightly lengths hold no (L, batch, dim, N) tensor
        start = t % chunk_size == 0
        log_decay = dprime[..., t, None] * A
        decay, g = log_decay.exp(), log_decay.abs()
        r = 2.0 * lam * h if start and t > 0 else zeros
        carried = decay * (carried + r)
        Bt, Ct = (_per_channel(x, t, t + 1, dim)[0].abs() for x in (B, C))  # (batch, dim or 1, N)
        h = decay * h + drive[..., t, None] * Bt
        mass = g if start else mass + g
        walk = mass * mass if start else walk + mass * mass
        lam = walk.sqrt()
        out[t] = (Ct * (carried + 2.0 * lam * h)).sum(-1)
    out = out.permute(1, 2, 0)
    if z is not None:
        out = out * F.silu(z).abs()
    return out.contiguous()
