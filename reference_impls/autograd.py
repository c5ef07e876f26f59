"""The oracles' definitions written out of place, so that float64 autograd can run through them.

The oracles (`linear_recurrence`, `selective_scan`, `retention`, `retention_normed`) write into
preallocated block buffers and may run a compiled loop: fast and memory-bounded, but not
differentiable. The harness's gradient checks need the vector-Jacobian product of the same
definitions, so here each one is the plain per-step loop in the same order of operations
(``decay * h`` then ``+ input``; the sum over the state left to right; ``+ D u``; the gate last),
out of place. ``tests/test_oracle_autograd.py`` checks that each forward equals its oracle in float64.

Memory grows with L (autograd keeps every step): meant for the short cases of gradient checks.
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F

from reference_impls import _validate
from reference_impls.selective_scan import SOFTPLUS_THRESHOLD, delta_prime


def _left_to_right_sum(x: torch.Tensor, dim: int) -> torch.Tensor:
    parts = x.unbind(dim)
    acc = parts[0]
    for part in parts[1:]:
        acc = acc + part
    return acc


def linear_recurrence(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``h_t = a_t h_{t-1} + b_t``, ``h_{-1} = 0``; a, b (batch, channels, L)."""
    h = torch.zeros_like(b[..., 0])
    out = []
    for t in range(b.shape[-1]):
        h = a[..., t] * h + b[..., t]
        out.append(h)
    return torch.stack(out, -1)


def selective_scan(u, delta, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False) -> torch.Tensor:
    """mamba-ssm's selective scan (layout of `reference_impls.selective_scan.selective_scan`)."""
    batch, dim, length = u.shape
    if B.dim() == 3:
        B, C = B[:, None], C[:, None]
    per_group = dim // B.shape[1]
    Bc = B.repeat_interleave(per_group, dim=1)  # (batch, dim, N, L): channel d uses group d // per_group
    Cc = C.repeat_interleave(per_group, dim=1)
    dprime = delta_prime(delta, delta_bias, delta_softplus)
    h = torch.zeros((batch, dim, A.shape[1]), dtype=u.dtype)
    ys = []
    for t in range(length):
        decay = torch.exp(dprime[..., t, None] * A)
        h = decay * h + (dprime[..., t] * u[..., t])[..., None] * Bc[..., t]
        ys.append(_left_to_right_sum(Cc[..., t] * h, -1))
    y = torch.stack(ys, -1)
    if D is not None:
        y = y + D[:, None] * u
    if z is not None:
        y = y * F.silu(z)
    return y


def retention(q, k, v, gamma: Sequence[float] | torch.Tensor, scale: float) -> torch.Tensor:
    """``S_t = gamma S_{t-1} + k_t^T v_t``, ``o_t = scale (q_t S_t)``; (batch, L, heads, d)."""
    batch, length, heads, dk = q.shape
    g = torch.as_tensor(gamma, dtype=q.dtype).view(heads, 1, 1)
    S = torch.zeros((batch, heads, dk, v.shape[-1]), dtype=q.dtype)
    outs = []
    for t in range(length):
        S = g * S + k[:, t, :, :, None] * v[:, t, :, None, :]
        outs.append(_left_to_right_sum(q[:, t, :, :, None] * S, -2) * scale)
    return torch.stack(outs, 1)


def retention_normed(q, k, v, eps: float, gamma, scale: float) -> torch.Tensor:
    """`retention` followed by the per-head RMS norm over dv with ``eps``."""
    eps = _validate.eps(eps)
    o = retention(q, k, v, gamma, scale)
    denom = torch.sqrt(_left_to_right_sum(o * o, -1) / o.shape[-1] + eps)[..., None]
    return o / denom


def gla(q, k, v, g, initial_state=None, cu_seqlens: Sequence[int] | None = None, scale: float | None = None):
    """GLA (fla's layout; `reference_impls.gated_decay.gla`): ``S_t = diag(exp(g_t)) S_{t-1} + k_t^T v_t``,
    ``o_t = scale q_t S_t``; g (batch, T, heads, K) or, for simple GLA, (batch, T, heads). Returns
    ``(o, final_state)``; with ``cu_seqlens`` (batch 1) the state restarts at each boundary from that
    sequence's initial state."""
    batch, length, heads, dk = q.shape
    scale = dk**-0.5 if scale is None else scale
    g4 = g if g.dim() == 4 else g[..., None]
    bounds = [0, length] if cu_seqlens is None else list(cu_seqlens)
    outs, finals = [], []
    for i, (t0, t1) in enumerate(zip(bounds[:-1], bounds[1:])):
        if initial_state is not None:
            S = initial_state if cu_seqlens is None else initial_state[i:i + 1]
        else:
            S = torch.zeros((batch, heads, dk, v.shape[-1]), dtype=q.dtype)
        for t in range(t0, t1):
            S = torch.exp(g4[:, t])[..., None] * S + k[:, t, :, :, None] * v[:, t, :, None, :]
            outs.append(_left_to_right_sum(q[:, t, :, :, None] * S, -2) * scale)
        finals.append(S)
    return torch.stack(outs, 1), torch.cat(finals)


def simple_gla(q, k, v, g, initial_state=None, cu_seqlens: Sequence[int] | None = None, scale: float | None = None):
    """Simple GLA: `gla` with one log-decay per head, g (batch, T, heads)."""
    return gla(q, k, v, g, initial_state, cu_seqlens, scale)


def ssd_steps(dt, dt_bias=None, dt_softplus=False):
    """SSD's steps as the recurrence takes them: the bias added, the softplus where asked, clamped at 0."""
    if dt_bias is not None:
        dt = dt + dt_bias
    if dt_softplus:
        dt = F.softplus(dt, beta=1.0, threshold=SOFTPLUS_THRESHOLD)
    return dt.clamp(min=0.0)


def ssd(x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False, initial_states=None,
        cu_seqlens: Sequence[int] | None = None):
    """Mamba-2's SSD (mamba-ssm's layout; `reference_impls.gated_decay.ssd`) on the same loop as `gla`:
    ``g = dt' A``, ``k = B``, ``v = dt' x``, ``q = C`` (head h reads group h // (heads // groups)), scale 1,
    the state h (P, N) = S^T; every row restarts from zeros at the ``cu_seqlens`` boundaries (seq_idx)."""
    batch, length, heads, _ = x.shape
    groups = B.shape[2]
    dt = ssd_steps(dt, dt_bias, dt_softplus)
    g = (dt * A)[..., None]
    k = B.repeat_interleave(heads // groups, dim=2)
    q = C.repeat_interleave(heads // groups, dim=2)
    v = dt[..., None] * x
    S = (torch.zeros((batch, heads, B.shape[-1], x.shape[-1]), dtype=x.dtype) if initial_states is None
         else initial_states.transpose(-1, -2))
    starts = set(cu_seqlens[1:-1]) if cu_seqlens is not None else set()
    outs = []
    for t in range(length):
        if t in starts:
            S = torch.zeros_like(S)
        S = torch.exp(g[:, t])[..., None] * S + k[:, t, :, :, None] * v[:, t, :, None, :]
        outs.append(_left_to_right_sum(q[:, t, :, :, None] * S, -2))
    y = torch.stack(outs, 1)
    if D is not None:
        y = y + x * (D[:, None] if D.dim() == 1 else D)
    if z is not None:
        y = y * F.silu(z)
    return y
