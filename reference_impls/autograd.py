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
from reference_impls.selective_scan import SOFTPLUS_THRESHOLD


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
    dprime = delta if delta_bias is None else delta + delta_bias[:, None]
    if delta_softplus:
        dprime = F.softplus(dprime, beta=1.0, threshold=SOFTPLUS_THRESHOLD)
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
