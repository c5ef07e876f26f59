"""In-tree RetNet retention in its three forms (parallel, recurrent, chunkwise) and their RMS-normed variants.

All forms compute, per head h with decay ``gamma_h`` and query scale ``scale``,

    S_t = gamma_h S_{t-1} + k_t^T v_t,        o_t = scale * q_t S_t        (S_{-1} = 0)

on q, k (batch, L, heads, dk) and v (batch, L, heads, dv), returning o (batch, L, heads, dv). They differ
only in evaluation order, and so in rounding, which is what the harness measures:

- `retention_parallel`: ``o = ((scale q k^T) * Dmask) v`` with ``Dmask[n, m] = gamma^(n-m)`` for n >= m;
- `retention_recurrent`: the loop above, one step per t;
- `retention_chunkwise`: exact inner-chunk parallel retention plus a cross-chunk state carried with the
  decay, for any chunk size (the last chunk may be partial; a chunk larger than L is one chunk).

The defaults are RetNet's: ``gamma_h = 1 - 2**(-5 - h)`` and ``scale = dk**-0.5``; ``gamma=`` (a float,
or one per head) and ``scale=`` select another convention. The query is scaled first (as RetNet does),
which keeps the scores small in half precision. Decay powers are formed in float64 from non-negative
exponents only (never ``gamma^n / gamma^m``) and rounded once to the input dtype; the recurrent form
multiplies by gamma rounded to the input dtype, as a recurrent kernel does. All other arithmetic is in
the input dtype. Inputs are never modified; everything is plain torch, so autograd works.

`rms_group_norm` is RetNet's group norm without affine weights, per head over dv; the ``*_normed``
functions apply it to each form.
"""

from __future__ import annotations

import operator
from typing import Sequence

import torch

from harness.errors import InvalidArgument
from harness.kernels.contract import Capabilities, Family, KernelSpec, inverse_sqrt_scale, retnet_gammas

__all__ = [
    "retention_parallel",
    "retention_recurrent",
    "retention_chunkwise",
    "rms_group_norm",
    "retention_parallel_normed",
    "retention_recurrent_normed",
    "retention_chunkwise_normed",
    "KERNELS",
]

GammaArg = float | Sequence[float] | torch.Tensor | None

#: Elements of (chunk x chunk) scores and (dk x dv) states `retention_chunkwise` forms at once, over batch
#: rows, heads and chunks (128 MiB in float64). Forming every chunk's scores at once holds L x chunk per
#: row and head: at L = 25,457 with a chunk of 4,729 (legal: one chunk's scores fit the strategies' square
#: budget) that is 6.4 GB per tensor in float64; every chunk's state at once holds L / chunk x dk x dv,
#: three times (measured 3.1): at L = 27,255 with a chunk of 1, batch 3 x heads 3, some 20 GB. The nightly
#: calibration saw this correct kernel killed for memory in both. A chunk larger than the budget is still
#: formed whole: its memory is the chunk's own square.
INNER_BLOCK_ELEMENTS = 2**24


def _check_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[int, int, int, int, int]:
    if q.dim() != 4 or k.shape != q.shape or v.dim() != 4 or v.shape[:3] != q.shape[:3]:
        raise InvalidArgument(
            f"q.shape={tuple(q.shape)!r}, k.shape={tuple(k.shape)!r}, v.shape={tuple(v.shape)!r}; expected "
            "q, k (batch, L, heads, dk) and v (batch, L, heads, dv)"
        )
    if not (q.dtype == k.dtype == v.dtype):
        raise InvalidArgument(f"q, k, v dtypes ({q.dtype}, {k.dtype}, {v.dtype}) differ; pass one dtype")
    batch, length, heads, dk = q.shape
    return batch, length, heads, dk, v.shape[3]


def _gammas(gamma: GammaArg, heads: int) -> torch.Tensor:
    """Per-head decays as a float64 CPU tensor of shape (heads,)."""
    if gamma is None:
        return torch.tensor(retnet_gammas(heads), dtype=torch.float64)
    g = torch.as_tensor(gamma, dtype=torch.float64).detach().cpu().reshape(-1)
    if g.numel() == 1:
        return g.expand(heads).clone()
    if g.numel() != heads:
        raise InvalidArgument(f"gamma has {g.numel()} values; expected one float or one per head (heads={heads})")
    return g


def _scale(scale: float | None, dk: int) -> float:
    return inverse_sqrt_scale(dk) if scale is None else float(scale)


def _powers(gammas: torch.Tensor, exponents: torch.Tensor) -> torch.Tensor:
    """``gamma_h ** e`` for non-negative integer exponents, float64, shape (heads, *exponents.shape)."""
    g = gammas.reshape(-1, *([1] * exponents.dim()))
    return torch.pow(g, exponents.to(torch.float64))


def _decay_mask(gammas: torch.Tensor, size: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """(heads, size, size): ``gamma^(n-m)`` for n >= m, else 0; float64 then rounded once to ``dtype``."""
    idx = torch.arange(size)
    diff = idx[:, None] - idx[None, :]
    causal = diff >= 0
    mask = torch.where(causal, _powers(gammas, diff.clamp(min=0)), torch.zeros((), dtype=torch.float64))
    return mask.to(device=device, dtype=dtype)


def retention_parallel(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, gamma: GammaArg = None, scale: float | None = None
) -> torch.Tensor:
    """Parallel retention ``o = ((scale q k^T) * Dmask) v`` per head; (batch, L, heads, dv) in q's dtype."""
    _, length, heads, dk, _ = _check_qkv(q, k, v)
    mask = _decay_mask(_gammas(gamma, heads), length, q.dtype, q.device)
    qh = (q * _scale(scale, dk)).transpose(1, 2)  # (batch, heads, L, dk)
    kh, vh = k.transpose(1, 2), v.transpose(1, 2)
    scores = (qh @ kh.transpose(-1, -2)) * mask
    return (scores @ vh).transpose(1, 2)


def retention_recurrent(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, gamma: GammaArg = None, scale: float | None = None
) -> torch.Tensor:
    """Recurrent retention, one step per t: ``S_t = gamma S_{t-1} + k_t^T v_t``, ``o_t = scale q_t S_t``."""
    batch, length, heads, dk, dv = _check_qkv(q, k, v)
    g = _gammas(gamma, heads).to(device=q.device, dtype=q.dtype)[:, None, None]
    qs = q * _scale(scale, dk)
    state = torch.zeros(batch, heads, dk, dv, dtype=q.dtype, device=q.device)
    outs = []
    for t in range(length):
        state = g * state + k[:, t, :, :, None] * v[:, t, :, None, :]
        outs.append((qs[:, t, :, None, :] @ state).squeeze(-2))  # (batch, heads, dv)
    if not outs:
        return v.new_zeros(batch, 0, heads, dv)
    return torch.stack(outs, dim=1)


def retention_chunkwise(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    chunk_size: int,
    *,
    gamma: GammaArg = None,
    scale: float | None = None,
) -> torch.Tensor:
    """Chunkwise-recurrent retention for any ``chunk_size >= 1`` and any L.

    Within a chunk of c positions (j = 0..c-1): ``o = ((scale q k^T) * Dmask_c) v + (scale q * gamma^(j+1)) R``
    where R is the state after the previous chunks, carried as ``R <- gamma^c R + (k * gamma^(c-1-j))^T v``.
    A partial last chunk is zero-padded at its end: padded keys and values sit after every real query,
    so the causal mask hides them, and the state after the last chunk is never read. The chunks are
    formed in groups of as many as `INNER_BLOCK_ELEMENTS` allows, their scores and their states, the state
    carried from group to group: memory is one group's, not the sequence's, at any chunk size (every
    chunk at once at the usual sizes; one at a time for long chunks; hundreds a group at a chunk of 1).
    """
    chunk_size = _positive_int(chunk_size)
    batch, length, heads, dk, dv = _check_qkv(q, k, v)
    if length == 0:
        return v.new_zeros(batch, 0, heads, dv)
    c = min(chunk_size, length)
    chunks = -(-length // c)
    pad = chunks * c - length
    gammas = _gammas(gamma, heads)
    dtype, device = q.dtype, q.device

    def split(x: torch.Tensor) -> torch.Tensor:  # (batch, L, heads, d) -> (batch, heads, chunks, c, d)
        if pad:
            x = torch.nn.functional.pad(x, (0, 0, 0, 0, 0, pad))
        return x.reshape(batch, chunks, c, heads, x.shape[-1]).permute(0, 3, 1, 2, 4)

    qc, kc, vc = split(q * _scale(scale, dk)), split(k), split(v)
    j = torch.arange(c)
    mask = _decay_mask(gammas, c, dtype, device)[None, :, None]  # (1, heads, 1, c, c)
    into_state = _powers(gammas, c - 1 - j).to(device=device, dtype=dtype)[None, :, None, :, None]
    from_state = _powers(gammas, j + 1).to(device=device, dtype=dtype)[None, :, None, :, None]
    chunk_decay = _powers(gammas, torch.tensor(c)).to(device=device, dtype=dtype)[None, :, None, None]

    # chunks formed at once: their scores, and their states (the contributions, the states before each
    # chunk and their stack), so that memory is one group's whatever the number of chunks
    group = max(1, INNER_BLOCK_ELEMENTS // (batch * heads * (c * c + dk * dv)))
    out = vc.new_empty(batch, heads, chunks, c, dv)  # filled in place: see `gated_forms._output`
    state = torch.zeros(batch, heads, dk, dv, dtype=dtype, device=device)
    for a in range(0, chunks, group):
        qa, ka, va = qc[:, :, a:a + group], kc[:, :, a:a + group], vc[:, :, a:a + group]
        contributions = (ka * into_state).transpose(-1, -2) @ va  # (batch, heads, group, dk, dv)
        states = []  # the state before each chunk of the group
        for i in range(qa.shape[2]):
            states.append(state)
            if a + i < chunks - 1:  # the state after the last chunk is never read
                state = chunk_decay * state + contributions[:, :, i]
        out[:, :, a:a + group] = ((qa @ ka.transpose(-1, -2)) * mask) @ va + (qa * from_state) @ torch.stack(states, 2)
    o = out.permute(0, 2, 3, 1, 4).reshape(batch, chunks * c, heads, dv)
    return o[:, :length]


def _positive_int(chunk_size: object) -> int:
    try:
        if isinstance(chunk_size, bool):
            raise TypeError
        value = operator.index(chunk_size)  # accepts numpy integers too
    except TypeError:
        value = 0
    if value < 1:
        raise InvalidArgument(f"chunk_size={chunk_size!r} must be a positive int; e.g. chunk_size=64")
    return value


def rms_group_norm(o: torch.Tensor, eps: float) -> torch.Tensor:
    """``o / sqrt(mean(o**2 over the last dim) + eps)`` per head, no affine weights, in o's dtype."""
    return o / torch.sqrt(o.pow(2).mean(dim=-1, keepdim=True) + eps)


def retention_parallel_normed(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, eps: float, *, gamma: GammaArg = None, scale: float | None = None
) -> torch.Tensor:
    """`rms_group_norm` of `retention_parallel`."""
    return rms_group_norm(retention_parallel(q, k, v, gamma=gamma, scale=scale), eps)


def retention_recurrent_normed(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, eps: float, *, gamma: GammaArg = None, scale: float | None = None
) -> torch.Tensor:
    """`rms_group_norm` of `retention_recurrent`."""
    return rms_group_norm(retention_recurrent(q, k, v, gamma=gamma, scale=scale), eps)


def retention_chunkwise_normed(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    eps: float,
    chunk_size: int,
    *,
    gamma: GammaArg = None,
    scale: float | None = None,
) -> torch.Tensor:
    """`rms_group_norm` of `retention_chunkwise`."""
    return rms_group_norm(retention_chunkwise(q, k, v, chunk_size, gamma=gamma, scale=scale), eps)


_CAPS = Capabilities(autograd=True)
_PARALLEL = Capabilities(autograd=True, square_scores=True)  # (L x L) scores per batch row and head
#: (chunk x chunk) scores; the states formed group by group with them (`INNER_BLOCK_ELEMENTS`), not per chunk
_CHUNKED = Capabilities(autograd=True, chunk_sizes=(), square_scores=True, chunk_states=0, chunk_pairs=0)


def _spec(name: str, family: Family, fn, caps: Capabilities, description: str) -> KernelSpec:
    return KernelSpec(name=name, family=family, load=lambda: fn, capabilities=caps, description=description)


KERNELS: list[KernelSpec] = [
    _spec("intree.retention_parallel", Family.RETENTION, retention_parallel, _PARALLEL,
          "parallel retention ((q k^T) * decay mask) v in the input dtype"),
    _spec("intree.retention_recurrent", Family.RETENTION, retention_recurrent, _CAPS,
          "recurrent retention, a loop over t in the input dtype"),
    _spec("intree.retention_chunkwise", Family.RETENTION, retention_chunkwise, _CHUNKED,
          "chunkwise-recurrent retention, any chunk size, in the input dtype"),
    _spec("intree.retention_normed_parallel", Family.RETENTION_NORMED, retention_parallel_normed, _PARALLEL,
          "parallel retention + RMS group norm in the input dtype"),
    _spec("intree.retention_normed_recurrent", Family.RETENTION_NORMED, retention_recurrent_normed, _CAPS,
          "recurrent retention + RMS group norm in the input dtype"),
    _spec("intree.retention_normed_chunkwise", Family.RETENTION_NORMED, retention_chunkwise_normed, _CHUNKED,
          "chunkwise retention + RMS group norm in the input dtype, any chunk size"),
]
