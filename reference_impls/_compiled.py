"""Compiled versions of the oracles' sequential loops: the same arithmetic, without per-step dispatch.

The torch loops of `reference_impls._loop` spend their time dispatching two tiny torch ops per step and
making passes over block-sized intermediates (``k^T v``, ``C * h``, the sums over N or dk). This module
holds the same loops as numba-compiled functions (``@njit(cache=True)``, no
fastmath), fed by numpy views of the CPU tensors (``tensor.numpy()`` shares memory, nothing is
copied), plus the wrappers `_loop` and the oracles call. Why numba, and what it was measured against,
is in ``docs/performance.md``.

Same arithmetic. Every kernel performs, element by element, the operations of the torch loop it
replaces, in the same order, each rounded in the tensors' dtype:

- `recur`: ``out[t] = decay[t] * prev`` then ``+ inp[t]`` (two roundings, as ``torch.mul`` then
  ``add_``);
- `recur_peak`: ``out[t] = max(prev, 1) * decay[t]`` (``torch.clamp_min`` then ``mul_``, NaN
  propagating like ``clamp_min``);
- `selective_scan_block`: ``h = decay * h + (d' * u) * B`` and ``y = ((C_0 h_0 + C_1 h_1) + ...) + D u``
  (the sum over n left to right, as `_loop.seq_sum`);
- `retention_block`: ``S = gamma * S + k_i * v_j`` and ``o_j = (q_0 S_0j + q_1 S_1j) + ...`` (the sum
  over i left to right; the ``* scale`` stays in torch).

Only the order of *independent* elements differs (e.g. a channel's whole block of steps before the
next channel's), which changes no rounded value. IEEE-754 multiplication and addition are correctly
rounded, so scalar, SSE, AVX2 and AVX-512 code give the same bits; the one thing that could change
them is contraction of ``a * b + c`` into a fused multiply-add. numba emits LLVM ``fmul``/``fadd``
without the ``contract`` flag unless ``fastmath`` is set (it is not here), so LLVM never fuses them;
``tests/test_oracle_compiled.py`` checks the assembly for FMA instructions and runs inputs on which a
fused and an unfused step differ. Float32 stays float32: no float literal (a float64 in numba) enters
the arithmetic; the ``1`` of `recur_peak` is passed in the array's dtype.

Where it applies (`usable`): numba importable, every tensor on the CPU, float32 or float64, and no
gradient being recorded (autograd cannot see through the compiled loops; the oracles run under
``torch.no_grad``, but a caller that differentiates through `_loop` gets the torch loop).
numba has no float16/bfloat16 arithmetic, and the same-dtype baseline in those dtypes must round every
operation in that dtype, so they keep the torch loop (as do CUDA tensors). Setting the environment
variable ``SEQKERNEL_ORACLE_JIT=0`` before import turns the compiled path off (`AVAILABLE` is False).

First use compiles each kernel for the dtype it meets (0.3-0.6 s per kernel and dtype; every array is
passed C-contiguous, so there is one version per dtype); ``cache=True`` stores the machine code under
``NUMBA_CACHE_DIR`` (default: the ``__pycache__`` folder next to this file), so later processes load
all of it in about 0.35 s.
"""

from __future__ import annotations

import os

import numpy as np
import torch

try:  # an optional dependency: without it every loop runs in torch
    import numba
except ImportError:  # pragma: no cover - exercised by monkeypatching AVAILABLE in the tests
    numba = None

__all__ = [
    "AVAILABLE",
    "FUSED",
    "UNAVAILABLE_REASON",
    "usable",
    "recur",
    "recur_peak",
    "selective_scan_block",
    "retention_block",
]

_DISABLED = os.environ.get("SEQKERNEL_ORACLE_JIT", "1").strip().lower() in ("0", "off", "false", "no")

#: True when the compiled loops can run in this process (numba imported, not turned off).
AVAILABLE: bool = numba is not None and not _DISABLED
#: Why `AVAILABLE` is False ("" when it is True).
UNAVAILABLE_REASON: str = (
    "" if AVAILABLE else "SEQKERNEL_ORACLE_JIT=0 is set" if _DISABLED else "numba is not installed"
)
#: Use the fused block kernels (`selective_scan_block`, `retention_block`) where an oracle has one.
#: With False only `recur` and `recur_peak` are compiled: kept so that ``harness.bench`` can measure
#: the two choices side by side.
FUSED: bool = True

#: The dtypes the compiled loops handle (numba has no half-precision arithmetic).
DTYPES: tuple[torch.dtype, ...] = (torch.float32, torch.float64)


def usable(*tensors: torch.Tensor | None) -> bool:
    """True when the compiled loops apply: `AVAILABLE`, and every given tensor on the CPU, float32 or
    float64, all of one dtype, none needing a gradient (autograd cannot see through numba; None entries
    are skipped)."""
    if not AVAILABLE:
        return False
    given = [t for t in tensors if t is not None]
    dtypes = {t.dtype for t in given}
    return (
        len(dtypes) == 1
        and dtypes.pop() in DTYPES
        and all(t.device.type == "cpu" for t in given)
        and not (torch.is_grad_enabled() and any(t.requires_grad for t in given))
    )


def _np(t: torch.Tensor) -> np.ndarray:
    """A numpy view sharing ``t``'s memory (strides kept; no copy)."""
    return t.detach().numpy()


# --------------------------------------------------------------------------------------- kernels
if numba is not None:
    _jit = numba.njit(cache=True, fastmath=False, nogil=True)

    @_jit
    def _recur_kernel(decay, inp, prev, out):  # pragma: no cover - compiled
        # decay (1 or n, S); inp, out (n, S); prev (S,). out[t] = decay[t] * out[t-1] + inp[t].
        n, size = out.shape
        per_step = decay.shape[0] != 1
        for t in range(n):
            d = decay[t] if per_step else decay[0]
            x = inp[t]
            o = out[t]
            for s in range(size):
                m = d[s] * prev[s]
                o[s] = m + x[s]
            prev = o

    @_jit
    def _recur_peak_kernel(decay, prev, out, one):  # pragma: no cover - compiled
        # out[t] = max(out[t-1], 1) * decay[t], NaN propagating (torch.clamp_min, then mul_).
        n, size = out.shape
        per_step = decay.shape[0] != 1
        for t in range(n):
            d = decay[t] if per_step else decay[0]
            o = out[t]
            for s in range(size):
                p = prev[s]
                if not (p >= one or p != p):  # p < 1 (NaN stays NaN, as in clamp_min)
                    p = one
                o[s] = p * d[s]
            prev = o

    @_jit
    def _selective_scan_kernel(decay, dprime, u, B, C, D, has_d, rep_b, rep_c, start, state, y):  # pragma: no cover
        # Steps start, start+1, ..., start+n-1 with n = decay.shape[2]. decay (batch, dim, n, N);
        # dprime, u, y (batch, dim, L); B, C (batch, G, n, N): the block's steps; D (dim,); state
        # (batch, dim, N), updated in place; channel d uses B's group d // rep_b and C's d // rep_c.
        # A channel's steps run in order; channels are independent, so running one channel's block
        # before the next changes no value.
        batch, dim, n, n_state = decay.shape
        for b in range(batch):
            for d in range(dim):
                gb = d // rep_b
                gc = d // rep_c
                h = state[b, d]
                for s in range(n):
                    t = start + s
                    a = decay[b, d, s]
                    bs = B[b, gb, s]
                    cs = C[b, gc, s]
                    du = dprime[b, d, t] * u[b, d, t]
                    x = a[0] * h[0]
                    x = x + du * bs[0]
                    h[0] = x
                    acc = cs[0] * x
                    for i in range(1, n_state):
                        x = a[i] * h[i]
                        x = x + du * bs[i]
                        h[i] = x
                        acc = acc + cs[i] * x
                    if has_d:
                        acc = acc + D[d] * u[b, d, t]
                    y[b, d, t] = acc

    @_jit
    def _retention_kernel(gamma, q, k, v, start, stop, state, o):  # pragma: no cover - compiled
        # Steps start, ..., stop-1. gamma (heads,); q, k (batch, L, heads, dk); v, o (batch, L, heads, dv);
        # state (batch, heads, dk, dv), updated in place. o is q S, before the scale.
        batch, _, heads, dk = q.shape
        dv = v.shape[3]
        for b in range(batch):
            for hd in range(heads):
                g = gamma[hd]
                s = state[b, hd]
                for t in range(start, stop):
                    vt = v[b, t, hd]
                    ot = o[b, t, hd]
                    ki = k[b, t, hd, 0]
                    qi = q[b, t, hd, 0]
                    row = s[0]
                    for j in range(dv):
                        x = g * row[j]
                        x = x + ki * vt[j]
                        row[j] = x
                        ot[j] = qi * x
                    for i in range(1, dk):
                        ki = k[b, t, hd, i]
                        qi = q[b, t, hd, i]
                        row = s[i]
                        for j in range(dv):
                            x = g * row[j]
                            x = x + ki * vt[j]
                            row[j] = x
                            ot[j] = ot[j] + qi * x


# -------------------------------------------------------------------------------------- wrappers
def _steps(x: torch.Tensor, n: int) -> torch.Tensor:
    """(n, *state) as contiguous (n, state elements): a view when the layout allows, else a block-sized
    copy (one array layout, so one compiled version per dtype)."""
    return x.reshape(n, -1).contiguous()


def _decay_rows(decay: torch.Tensor, state: torch.Tensor, n: int, per_step_decay: bool) -> torch.Tensor:
    """The decay as (n or 1, state elements): broadcast to the state's shape (the same values)."""
    if per_step_decay:
        return _steps(decay.expand((n, *state.shape)), n)
    return decay.expand(state.shape).reshape(1, -1).contiguous()


def recur(decay: torch.Tensor, inp: torch.Tensor, state: torch.Tensor, out: torch.Tensor,
          *, per_step_decay: bool = True) -> torch.Tensor:
    """`reference_impls._loop.recur`, compiled (same arguments, same result, bit for bit).

    ``out`` must be contiguous (the oracles' block buffers are).
    """
    n = out.shape[0]
    if n == 0:
        return state.clone()
    _recur_kernel(_np(_decay_rows(decay, state, n, per_step_decay)), _np(_steps(inp, n)),
                  _np(state.reshape(-1).contiguous()), _np(out.view(n, -1)))
    return out[-1].clone()


def recur_peak(decay_abs: torch.Tensor, state: torch.Tensor, out: torch.Tensor,
               *, per_step_decay: bool = True) -> torch.Tensor:
    """`reference_impls._loop.recur_peak`, compiled (same arguments, same result, bit for bit)."""
    n = out.shape[0]
    if n == 0:
        return state.clone()
    one = _np(state.new_ones(()))[()]  # a numpy scalar of the state's dtype
    _recur_peak_kernel(_np(_decay_rows(decay_abs, state, n, per_step_decay)), _np(state.reshape(-1).contiguous()),
                       _np(out.view(n, -1)), one)
    return out[-1].clone()


def selective_scan_block(decay: torch.Tensor, dprime: torch.Tensor, u: torch.Tensor, B: torch.Tensor,
                         C: torch.Tensor, D: torch.Tensor | None, start: int, state: torch.Tensor,
                         y: torch.Tensor) -> None:
    """Steps ``start, ..., start + n - 1`` of the selective scan, fused: state update and output map.

    decay: (n, batch, dim, N) = exp(d' A) for those steps; dprime, u, y: (batch, dim, L), contiguous
    (y's steps are written); B, C: (batch, G, N, L); D: (dim,) or None; state: (batch, dim,
    N), contiguous, updated in place to the last step's state. Computes, per step and in this order,
    ``h = decay * h + (d' u) B`` and ``y = sum_n C_n h_n`` (left to right) ``+ D u`` (see
    `reference_impls.selective_scan`); the gate is left to the caller.
    """
    dim = u.shape[1]
    has_d = D is not None
    d_arr = _np(D.contiguous()) if has_d else _np(u.new_zeros((dim,)))
    # (batch, dim, n, N): torch lays exp(d' A) out in this order already; then this is a view.
    blk = decay.permute(1, 2, 0, 3).contiguous()
    # The block's B and C as (batch, G, n, N): a step's N values adjacent (in (.., N, L) they are L apart,
    # a power of two that maps them onto one cache set).
    stop = start + decay.shape[0]
    b_blk, c_blk = (x[..., start:stop].transpose(2, 3).contiguous() for x in (B, C))
    _selective_scan_kernel(_np(blk), _np(dprime), _np(u), _np(b_blk), _np(c_blk), d_arr, has_d,
                           dim // B.shape[1], dim // C.shape[1], start, _np(state), _np(y))


def retention_block(gamma: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int,
                    stop: int, state: torch.Tensor, o: torch.Tensor) -> None:
    """Steps ``start, ..., stop - 1`` of retention, fused: ``S = gamma S + k^T v`` and ``o = q S`` (the sum
    over dk left to right), before ``* scale``.

    gamma: (heads,); q, k: (batch, L, heads, dk); v, o: (batch, L, heads, dv), all contiguous (o's steps
    are written); state: (batch, heads, dk, dv), contiguous, updated in place.
    """
    _retention_kernel(_np(gamma.contiguous()), _np(q), _np(k), _np(v), start, stop, _np(state), _np(o))
