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
  over i left to right; the ``* scale`` stays in torch);
- `gated_block` (simple GLA, GLA, SSD): the same with the decay ``a = exp(g)`` of the step, one per head
  or per key channel (the exp and the ``* scale`` stay in torch).

The traces (`reference_impls.trace`, float64) have kernels of their own, which do the plain kernel's
step and, in the same pass, every companion the torch trace loop computes for that step:

- `linear_recurrence_trace` (the whole sequence in one call): ``h = a * h + b``, ``H = |a| * H + |b|``,
  ``W = |a| * W + H``, ``P = max(P, 1) * |a|``, and the running maxima of ``|h|`` and of P;
- `selective_scan_trace_block`: per n ``h = decay * h + (d' u) B``, ``H = decay * H + |(d' u) B|``,
  ``W = decay * W + H``, ``P = max(P, 1) * decay``; then y as above, magnitude ``sum_n |C_n| H_n + |D u|``,
  growth ``(sum_n |C_n| W_n + N * sum_n |C_n| H_n) + |D u|`` (sums left to right), state_peak the
  running maximum of every ``|h_n|`` and of the magnitude, decay_peak that of every P_n (the gate
  stays in torch);
- `retention_trace_block`: per row i ``S_i = gamma * S_i + k_i v``, ``H_i = |gamma| * H_i + |k_i v|``,
  ``W_i = |gamma| * W_i + H_i``, with ``q_i S_i``, ``|q_i| H_i``, ``|q_i| W_i`` summed over i left to
  right; ``P = max(P, 1) * |gamma|`` per head; state_peak the running maximum over i and the steps of
  ``|S_ij|``, decay_peak that of P (``* scale``, ``* |scale|`` and ``+ dk * magnitude`` stay in torch);
- `gated_trace_block`: per entry ``S = a S + k_i v_j``, ``H = |a| H + |k_i v_j|``, ``W = |a| W + H`` (plus
  ssd's input-rounding terms), the chunk term's ``D = |a| D + |a| r`` and ``Y = D + 2 Lambda H``, the four
  sums over i, and the running maxima of ``|S|`` (per column and per entry) and of ``P = max(P, 1) |a|``
  (`reference_impls.gated_decay._segment`; the exp and the scale factors stay in torch).

The trace kernels repeat the plain kernels' step instead of calling a shared one: written on the
shared helpers, the plain kernels (the ones the baselines and the benchmark run) were 15-30% slower.

A running maximum is exact, so only its NaN behaviour has to match: NaN once seen stays (as
``torch.amax``, ``cummax`` and ``maximum`` give), whatever the order of the elements.

Only the order of *independent* elements differs (e.g. a channel's whole block of steps before the
next channel's, or a trace kernel's recurrences of one step before its sums), which changes no
rounded value. IEEE-754 multiplication and addition are correctly
rounded, so scalar, SSE, AVX2 and AVX-512 code give the same bits; the one thing that could change
them is contraction of ``a * b + c`` into a fused multiply-add. numba emits LLVM ``fmul``/``fadd``
without the ``contract`` flag unless ``fastmath`` is set (it is not here), so LLVM never fuses them;
``tests/test_oracle_compiled.py`` checks the assembly for FMA instructions and runs inputs on which a
fused and an unfused step differ. Float32 stays float32: no float literal (a float64 in numba) enters
the arithmetic; the ``1`` of the decay peak and the N of growth are passed in the arrays' dtype.

Where it applies (`usable`): numba importable, every tensor on the CPU, float32 or float64, and no
gradient being recorded (autograd cannot see through the compiled loops; the oracles run under
``torch.no_grad``, but a caller that differentiates through `_loop` gets the torch loop).
numba has no float16/bfloat16 arithmetic, and the same-dtype baseline in those dtypes must round every
operation in that dtype, so they keep the torch loop (as do CUDA tensors). Setting the environment
variable ``SEQKERNEL_ORACLE_JIT=0`` before import turns the compiled path off (`AVAILABLE` is False).

Threads. The fused kernels (the oracles' block kernels and the three traces) run their independent
rows (batch x channels, batch x heads) with ``numba.prange`` on `thread_budget` threads: the cores this
process may use, or its share of them in a harness run (`harness.threads`), or ``$SEQKERNEL_ORACLE_THREADS``
when the user sets it. Every row's operations and their order are the serial kernel's, so every thread count
gives the same bits (``tests/test_oracle_compiled.py``). numba's workqueue layer is used (its workers sleep
instead of spinning at each block's barrier, which collapsed under load), and launches are serialized
across the process's threads, which that layer requires. `recur` and `recur_peak` stay serial: their
loop is over steps, with rows inside.

First use compiles each kernel for the dtype it meets (0.3-0.6 s per kernel and dtype; every array is
passed C-contiguous, so there is one version per dtype); ``cache=True`` stores the machine code under
``NUMBA_CACHE_DIR`` (default: the ``__pycache__`` folder next to this file), so later processes load
all of it in about 0.35 s.
"""

from __future__ import annotations

import os
import threading

import numpy as np
import torch

# what `thread_budget` is made of, kept where `harness.threads` sets it without importing numba
from reference_impls._threads import THREADS_ENV, available_cores, process_threads  # noqa: F401 - re-exported

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
    "linear_recurrence_trace",
    "selective_scan_trace_block",
    "retention_trace_block",
    "gated_block",
    "gated_trace_block",
]

_DISABLED = os.environ.get("SEQKERNEL_ORACLE_JIT", "1").strip().lower() in ("0", "off", "false", "no")

#: True when the compiled loops can run in this process (numba imported, not turned off).
AVAILABLE: bool = numba is not None and not _DISABLED
#: Why `AVAILABLE` is False ("" when it is True).
UNAVAILABLE_REASON: str = (
    "" if AVAILABLE else "SEQKERNEL_ORACLE_JIT=0 is set" if _DISABLED else "numba is not installed"
)
#: Use the fused kernels (`selective_scan_block`, `retention_block` and the three trace kernels) where
#: an oracle has one. With False only `recur` and `recur_peak` are compiled: kept so that
#: ``harness.bench`` can measure the two choices side by side.
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


def thread_budget() -> int:
    """Threads for the fused kernels: ``$SEQKERNEL_ORACLE_THREADS``, else the count this process was given
    (`reference_impls._threads.process_threads`: its share of the cores in a harness run, else
    `available_cores`), at most numba's pool. A value that is not a positive whole number is an error naming
    it."""
    text = os.environ.get(THREADS_ENV, "").strip()
    if text:
        if not text.isdigit() or int(text) < 1:
            raise ValueError(f"{THREADS_ENV}={text!r}: expected a whole number of threads >= 1")
        wanted = int(text)
    else:
        wanted = process_threads()
    return max(1, min(wanted, numba.config.NUMBA_NUM_THREADS))


#: One parallel launch at a time in this process: numba's workqueue layer (below) must not be entered
#: from two threads at once (the harness calls kernels, which may call the oracles, on another thread).
_LAUNCH = threading.Lock()


def _parallel(kernel, *args) -> None:
    """Run a prange kernel on `thread_budget` threads (numba's setting is per calling thread)."""
    with _LAUNCH:
        numba.set_num_threads(thread_budget())
        kernel(*args)


def _np(t: torch.Tensor) -> np.ndarray:
    """A numpy view sharing ``t``'s memory (strides kept; no copy)."""
    return t.detach().numpy()


# --------------------------------------------------------------------------------------- kernels
if numba is not None:
    _jit = numba.njit(cache=True, fastmath=False, nogil=True)
    # For the small helpers the kernels share: inlined by numba itself, so that LLVM optimizes (and
    # vectorizes) each kernel as one function (helpers left as calls made kernels up to 2x slower).
    _inline = numba.njit(cache=True, fastmath=False, nogil=True, inline="always")
    # For the fused block kernels: independent rows (batch x channels, batch x heads) spread over
    # threads with `numba.prange`; each row's arithmetic, and so every bit, is the serial kernel's.
    # numba's "workqueue" threading layer: its workers sleep on a condition variable. The default layer
    # here (OpenMP) spins at every block's barrier; on a 2-core machine with other processes running,
    # 2 threads made the selective-scan oracle 5x slower than 1 (658 vs 121 ms at L=8192), where the
    # workqueue gave 1.29x faster. A user who sets NUMBA_THREADING_LAYER keeps their choice.
    _par = numba.njit(cache=True, fastmath=False, nogil=True, parallel=True)
    if "NUMBA_THREADING_LAYER" not in os.environ:
        numba.config.THREADING_LAYER = "workqueue"

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

    @_inline
    def _peak_step(p, a, one):  # pragma: no cover - compiled
        # max(p, 1) * a, NaN propagating (torch.clamp_min, then mul_).
        if not (p >= one or p != p):  # p < 1 (NaN stays NaN, as in clamp_min)
            p = one
        return p * a

    @_inline
    def _running_max(m, x):  # pragma: no cover - compiled
        # max(m, x), NaN propagating and then kept (torch.amax, cummax and maximum all propagate NaN).
        return x if x > m or x != x else m

    @_inline
    def _sum_step(acc, term, first):  # pragma: no cover - compiled
        # The next partial sum of a left-to-right sum: the first term itself (not 0 + term, which would
        # turn -0 into +0, as `_loop.seq_sum` does not), then acc + term.
        return term if first else acc + term

    @_jit
    def _recur_peak_kernel(decay, prev, out, one):  # pragma: no cover - compiled
        # out[t] = max(out[t-1], 1) * decay[t], NaN propagating (torch.clamp_min, then mul_).
        n, size = out.shape
        per_step = decay.shape[0] != 1
        for t in range(n):
            d = decay[t] if per_step else decay[0]
            o = out[t]
            for s in range(size):
                o[s] = _peak_step(prev[s], d[s], one)
            prev = o

    @_par
    def _linear_recurrence_trace_kernel(a, b, h0, outs, one):  # pragma: no cover - compiled
        # Every step of the linear recurrence and its trace. a, b (batch, channels, L); h0 (batch,
        # channels); outs = (h, magnitude, growth, state_peak, decay_peak), each (batch, channels, L).
        h_out, mag, growth, state_peak, decay_peak = outs
        batch, channels, length = a.shape
        zero = one - one
        for r in numba.prange(batch * channels):
            i, c = r // channels, r % channels
            h = h0[i, c]
            h_mag = abs(h)
            h_growth = s_peak = d_peak = p = zero
            for t in range(length):
                a_t = a[i, c, t]
                a_abs = abs(a_t)
                h = a_t * h
                h = h + b[i, c, t]  # h = a h + b
                h_mag = a_abs * h_mag
                h_mag = h_mag + abs(b[i, c, t])  # H = |a| H + |b|
                h_growth = a_abs * h_growth
                h_growth = h_growth + h_mag  # W = |a| W + H
                p = _peak_step(p, a_abs, one)  # P = max(P, 1) |a|
                s_peak = _running_max(s_peak, abs(h))
                d_peak = _running_max(d_peak, p)
                h_out[i, c, t] = h
                mag[i, c, t] = h_mag
                growth[i, c, t] = h_growth
                state_peak[i, c, t] = s_peak
                decay_peak[i, c, t] = d_peak

    @_par
    def _selective_scan_kernel(decay, dprime, u, B, C, D, has_d, rep_b, rep_c, start, state, y):  # pragma: no cover
        # Steps start, start+1, ..., start+n-1 with n = decay.shape[2]. decay (batch, dim, n, N);
        # dprime, u, y (batch, dim, L); B, C (batch, G, n, N): the block's steps; D (dim,); state
        # (batch, dim, N), updated in place; channel d uses B's group d // rep_b and C's d // rep_c.
        # A channel's steps run in order; channels are independent, so running one channel's block
        # before the next changes no value.
        batch, dim, n, n_state = decay.shape
        for r in numba.prange(batch * dim):
            b, d = r // dim, r % dim
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

    @_par
    def _selective_scan_trace_kernel(decay, dprime, u, B, C, D, has_d, rep_b, rep_c, start, states, outs,
                                     n_terms, one):  # pragma: no cover - compiled
        # `_selective_scan_kernel` plus the trace. states = (h, H, W, P), each (batch, dim, N), updated
        # in place; outs = (y, magnitude, growth, state_peak, decay_peak), each (batch, dim, L), steps
        # start..start+n-1 written (ungated). The running maxima continue from step start-1 of their
        # output (0 before step 0). n_terms is N in the arrays' dtype.
        h, mag_h, growth_h, peak_h = states
        y, mag, growth, state_peak, decay_peak = outs
        batch, dim, n, n_state = decay.shape
        zero = one - one
        for r in numba.prange(batch * dim):
            b, d = r // dim, r % dim
            gb = d // rep_b
            gc = d // rep_c
            hs, hm, hw, hp = h[b, d], mag_h[b, d], growth_h[b, d], peak_h[b, d]
            s_peak = state_peak[b, d, start - 1] if start > 0 else zero
            d_peak = decay_peak[b, d, start - 1] if start > 0 else zero
            for s in range(n):
                t = start + s
                a = decay[b, d, s]
                bs = B[b, gb, s]
                cs = C[b, gc, s]
                du = dprime[b, d, t] * u[b, d, t]
                for i in range(n_state):  # the recurrences, independent across n
                    x = du * bs[i]
                    h_i = a[i] * hs[i]
                    hs[i] = h_i + x  # h = a h + (d' u) B
                    m_i = a[i] * hm[i]
                    m_i = m_i + abs(x)
                    hm[i] = m_i  # H = a H + |(d' u) B|  (a = exp(.) >= 0)
                    w_i = a[i] * hw[i]
                    hw[i] = w_i + m_i  # W = a W + H
                    hp[i] = _peak_step(hp[i], a[i], one)  # P = max(P, 1) a
                acc_y = acc_m = acc_g = zero
                for i in range(n_state):  # the output maps, summed over n left to right, and the maxima
                    first = i == 0
                    c_abs = abs(cs[i])
                    acc_y = _sum_step(acc_y, cs[i] * hs[i], first)
                    acc_m = _sum_step(acc_m, c_abs * hm[i], first)
                    acc_g = _sum_step(acc_g, c_abs * hw[i], first)
                    s_peak = _running_max(s_peak, abs(hs[i]))
                    d_peak = _running_max(d_peak, hp[i])
                acc_g = acc_g + n_terms * acc_m
                if has_d:
                    skip = D[d] * u[b, d, t]
                    acc_y = acc_y + skip
                    acc_m = acc_m + abs(skip)
                    acc_g = acc_g + abs(skip)
                y[b, d, t] = acc_y
                mag[b, d, t] = acc_m
                growth[b, d, t] = acc_g
                s_peak = _running_max(s_peak, acc_m)  # the terms of C.h + D u, too
                state_peak[b, d, t] = s_peak
                decay_peak[b, d, t] = d_peak

    @_inline
    def _row_step(g, row, inp, qi, acc, first):  # pragma: no cover - compiled
        # One row i of a retention state: row = g * row + inp (per j: one multiply, then one add), and
        # acc = qi * row (the first row, i = 0) or acc + qi * row (the later ones: the sum over i).
        for j in range(row.shape[0]):
            x = g * row[j]
            x = x + inp[j]
            row[j] = x
            acc[j] = _sum_step(acc[j], qi * x, first)

    @_par
    def _retention_kernel(gamma, q, k, v, start, stop, state, o):  # pragma: no cover - compiled
        # Steps start, ..., stop-1. gamma (heads,); q, k (batch, L, heads, dk); v, o (batch, L, heads, dv);
        # state (batch, heads, dk, dv), updated in place. o is q S, before the scale.
        batch, _, heads, dk = q.shape
        dv = v.shape[3]
        for r in numba.prange(batch * heads):
            b, hd = r // heads, r % heads
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

    @_par
    def _retention_trace_kernel(gamma, q, k, v, start, stop, states, decay_state, outs, one):  # pragma: no cover
        # `_retention_kernel` plus the trace. states = (S, H, W), each (batch, heads, dk, dv), and
        # decay_state (heads,) = P, updated in place; outs = (o, magnitude, growth, state_peak,
        # decay_peak), each (batch, L, heads, dv), steps start..stop-1 written; o, magnitude and growth
        # before their scale factors. The running maxima continue from step start-1 of their output.
        s_all, mag_all, growth_all = states
        o, mag, growth, state_peak, decay_peak = outs
        batch, _, heads, dk = q.shape
        dv = v.shape[3]
        zero = one - one
        p_all = np.empty((heads, stop - start), dtype=decay_state.dtype)  # each head's P per step
        for hd in range(heads):  # P is the same for every b: once per head, before the rows
            g_abs = abs(gamma[hd])
            p = decay_state[hd]
            for t in range(start, stop):
                p = _peak_step(p, g_abs, one)
                p_all[hd, t - start] = p
            decay_state[hd] = p
        for r in numba.prange(batch * heads):
            b, hd = r // heads, r % heads
            g = gamma[hd]
            g_abs = abs(g)
            kv = np.empty_like(v[0, 0, 0])  # k_i v of one step and row (scratch of this row's thread)
            kv_abs = np.empty_like(kv)  # |k_i v|
            d_peak = decay_peak[b, start - 1, hd, 0] if start > 0 else zero
            for t in range(start, stop):
                vt = v[b, t, hd]
                s_peak = state_peak[b, t, hd]
                for j in range(dv):
                    s_peak[j] = state_peak[b, t - 1, hd, j] if t > 0 else zero
                for i in range(dk):
                    ki, qi = k[b, t, hd, i], q[b, t, hd, i]
                    for j in range(dv):
                        x = ki * vt[j]
                        kv[j] = x
                        kv_abs[j] = abs(x)
                    first = i == 0
                    row, mag_row, growth_row = s_all[b, hd, i], mag_all[b, hd, i], growth_all[b, hd, i]
                    _row_step(g, row, kv, qi, o[b, t, hd], first)  # S = g S + k v
                    _row_step(g_abs, mag_row, kv_abs, abs(qi), mag[b, t, hd], first)  # H = |g| H + |k v|
                    _row_step(g_abs, growth_row, mag_row, abs(qi), growth[b, t, hd], first)  # W = |g| W + H
                    for j in range(dv):
                        s_peak[j] = _running_max(s_peak[j], abs(row[j]))
                d_peak = _running_max(d_peak, p_all[hd, t - start])
                decay_peak[b, t, hd] = d_peak

    @_par
    def _gated_kernel(decay, q, k, v, start, state, o):  # pragma: no cover - compiled
        # Steps start, ..., start+n-1 of the gated recurrence, n = decay.shape[0]. decay (n, batch, heads,
        # Kg) = exp(g) of those steps, Kg = 1 (one per head) or K (one per key channel); q, k (batch, T,
        # heads, K); v, o (batch, T, heads, V); state (batch, heads, K, V), updated in place. o is q S,
        # before the scale.
        n, batch, heads, n_g = decay.shape
        dk = q.shape[3]
        for r in numba.prange(batch * heads):
            b, hd = r // heads, r % heads
            kv = np.empty_like(v[0, 0, 0])  # k_i v of one step and row (scratch of this row's thread)
            for st in range(n):
                t = start + st
                vt = v[b, t, hd]
                for i in range(dk):
                    ki = k[b, t, hd, i]
                    for j in range(kv.shape[0]):
                        kv[j] = ki * vt[j]
                    a = decay[st, b, hd, i if n_g > 1 else 0]
                    _row_step(a, state[b, hd, i], kv, q[b, t, hd, i], o[b, t, hd], i == 0)  # S = a S + k v

    @_par
    def _gated_trace_kernel(decay, q, k, v, extra, has_extra, lam, chunk_first, has_chunk, start, states,
                            p_states, outs, one):  # pragma: no cover - compiled
        # `_gated_kernel` plus the trace of `reference_impls.gated_decay._segment`. extra = (e_a, e_kv),
        # each (batch, T, heads, 1): ssd's input rounding (read only with has_extra); lam (batch, T,
        # heads, Kg) and chunk_first (T,): the chunk term's mass and chunk starts (read only with
        # has_chunk). states = (S, H, W, D, Y, entry_peak), each (batch, heads, K, V), and p_states =
        # (P, P_peak), each (batch, heads, Kg), updated in place; outs = (o, magnitude, growth, chunk,
        # state_peak, decay_peak), each (batch, T, heads, V), the block's steps written: o, magnitude,
        # growth and chunk the sums over K (before * scale, * |scale|, + K magnitude), the running maxima
        # continuing from step start-1 (0 before step 0).
        e_a, e_kv = extra
        s_all, h_all, w_all, d_all, y_all, peak_all = states
        p_all, p_peak_all = p_states
        o, mag, growth, chunk, state_peak, decay_peak = outs
        n, batch, heads, n_g = decay.shape
        dk = q.shape[3]
        dv = v.shape[3]
        zero = one - one
        two = one + one
        for r in numba.prange(batch * heads):
            b, hd = r // heads, r % heads
            p, p_peak = p_all[b, hd], p_peak_all[b, hd]
            d_peak = decay_peak[b, start - 1, hd, 0] if start > 0 else zero
            # scratch of this row's thread: |k_i v| and H before the step. Each entry's companions are
            # computed in a few short loops over j (each vectorizes; one long loop did not).
            kv_abs = np.empty_like(v[0, 0, 0])
            h_prev = np.empty_like(kv_abs)
            for st in range(n):
                t = start + st
                vt = v[b, t, hd]
                ot, mt, gt, ct, sp = o[b, t, hd], mag[b, t, hd], growth[b, t, hd], chunk[b, t, hd], state_peak[b, t, hd]
                for j in range(dv):
                    sp[j] = state_peak[b, t - 1, hd, j] if t > 0 else zero
                for c in range(n_g):  # P = max(P, 1) |a| per decay channel, and its running maxima
                    pc = _peak_step(p[c], abs(decay[st, b, hd, c]), one)
                    p[c] = pc
                    p_peak[c] = _running_max(p_peak[c], pc)
                    d_peak = _running_max(d_peak, pc)
                dp = decay_peak[b, t, hd]
                for j in range(dv):
                    dp[j] = d_peak
                restart = has_chunk and t > 0 and chunk_first[t]  # a chunk's first step, not the segment's
                ea = e_a[b, t, hd, 0] if has_extra else zero
                ekv = e_kv[b, t, hd, 0] if has_extra else zero
                for i in range(dk):
                    c = i if n_g > 1 else 0
                    a = decay[st, b, hd, c]
                    a_abs = abs(a)
                    ki = k[b, t, hd, i]
                    qi = q[b, t, hd, i]
                    q_abs = abs(qi)
                    first = i == 0
                    s_row, h_row, w_row = s_all[b, hd, i], h_all[b, hd, i], w_all[b, hd, i]
                    d_row, y_row, peak_row = d_all[b, hd, i], y_all[b, hd, i], peak_all[b, hd, i]
                    for j in range(dv):  # S = a S + k v, o (+)= q S, the maxima of |S|
                        x = ki * vt[j]
                        kv_abs[j] = abs(x)
                        s = a * s_row[j]
                        s = s + x
                        s_row[j] = s
                        ot[j] = _sum_step(ot[j], qi * s, first)
                        s_abs = abs(s)
                        sp[j] = _running_max(sp[j], s_abs)
                        peak_row[j] = _running_max(peak_row[j], s_abs)
                    for j in range(dv):  # H = |a| H + |k v|, magnitude (+)= |q| H
                        hp = h_row[j]
                        h_prev[j] = hp
                        h = a_abs * hp
                        h = h + kv_abs[j]
                        h_row[j] = h
                        mt[j] = _sum_step(mt[j], q_abs * h, first)
                    if has_extra:  # W = |a| W + (H + (e_a |a|) H_prev + e_kv |k v|), growth (+)= |q| W
                        ea_a = ea * a_abs
                        for j in range(dv):
                            w_in = h_row[j] + ea_a * h_prev[j]
                            w_in = w_in + ekv * kv_abs[j]
                            w = a_abs * w_row[j]
                            w = w + w_in
                            w_row[j] = w
                            gt[j] = _sum_step(gt[j], q_abs * w, first)
                    else:  # W = |a| W + H
                        for j in range(dv):
                            w = a_abs * w_row[j]
                            w = w + h_row[j]
                            w_row[j] = w
                            gt[j] = _sum_step(gt[j], q_abs * w, first)
                    if has_chunk:  # D = |a| D + |a| r, Y = D + 2 Lambda H, chunk (+)= |q| Y
                        lam2 = two * lam[b, t, hd, c]
                        lam2_prev = two * lam[b, t - 1, hd, c] if restart else zero
                        for j in range(dv):
                            rr = lam2_prev * h_prev[j] if restart else zero
                            d = a_abs * d_row[j]
                            d = d + a_abs * rr
                            d_row[j] = d
                            y = d + lam2 * h_row[j]
                            y_row[j] = y
                            ct[j] = _sum_step(ct[j], q_abs * y, first)


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


def _scalar(like: torch.Tensor, value: float) -> np.generic:
    """``value`` as a numpy scalar of ``like``'s dtype (a Python float would be a float64 in numba)."""
    return _np(like.new_full((), value))[()]


def recur_peak(decay_abs: torch.Tensor, state: torch.Tensor, out: torch.Tensor,
               *, per_step_decay: bool = True) -> torch.Tensor:
    """`reference_impls._loop.recur_peak`, compiled (same arguments, same result, bit for bit)."""
    n = out.shape[0]
    if n == 0:
        return state.clone()
    _recur_peak_kernel(_np(_decay_rows(decay_abs, state, n, per_step_decay)), _np(state.reshape(-1).contiguous()),
                       _np(out.view(n, -1)), _scalar(state, 1))
    return out[-1].clone()


def linear_recurrence_trace(a: torch.Tensor, b: torch.Tensor, h0: torch.Tensor,
                            outs: tuple[torch.Tensor, ...]) -> None:
    """`reference_impls.linear_recurrence`'s whole loop and trace, fused: per step ``h = a h + b``,
    ``H = |a| H + |b|``, ``W = |a| W + H``, ``P = max(P, 1) |a|`` and the running maxima of ``|h|`` and P.

    a, b: (batch, channels, L), contiguous; h0: (batch, channels), the state before step 0 (H starts at
    ``|h0|``, W and P at 0); outs: (h, magnitude, growth, state_peak, decay_peak), each (batch, channels,
    L), contiguous, written.
    """
    _parallel(_linear_recurrence_trace_kernel, _np(a), _np(b), _np(h0.contiguous()), tuple(map(_np, outs)),
              _scalar(a, 1))


def _scan_args(decay: torch.Tensor, u: torch.Tensor, B: torch.Tensor, C: torch.Tensor, D: torch.Tensor | None,
               start: int) -> tuple:
    """The selective-scan kernels' arguments from decay to start, as numpy arrays and ints."""
    dim = u.shape[1]
    has_d = D is not None
    d_arr = _np(D.contiguous()) if has_d else _np(u.new_zeros((dim,)))
    # torch lays exp(d' A) out as (batch, dim, n, N) already; then this is a view.
    blk = decay.permute(1, 2, 0, 3).contiguous()
    # The block's B and C as (batch, G, n, N): a step's N values adjacent (in (.., N, L) they are L apart,
    # a power of two that maps them onto one cache set).
    stop = start + decay.shape[0]
    b_blk, c_blk = (x[..., start:stop].transpose(2, 3).contiguous() for x in (B, C))
    return _np(blk), _np(b_blk), _np(c_blk), d_arr, has_d, dim // B.shape[1], dim // C.shape[1], start


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
    blk, b_blk, c_blk, *rest = _scan_args(decay, u, B, C, D, start)
    _parallel(_selective_scan_kernel, blk, _np(dprime), _np(u), b_blk, c_blk, *rest, _np(state), _np(y))


def selective_scan_trace_block(decay: torch.Tensor, dprime: torch.Tensor, u: torch.Tensor, B: torch.Tensor,
                               C: torch.Tensor, D: torch.Tensor | None, start: int,
                               states: tuple[torch.Tensor, ...], outs: tuple[torch.Tensor, ...]) -> None:
    """`selective_scan_block` plus the trace of the same steps (see `reference_impls.selective_scan`),
    fused.

    states: (h, H, W, P), each (batch, dim, N), contiguous, updated in place: the state, its magnitude
    and growth recurrences and the decay peak. outs: (y, magnitude, growth, state_peak, decay_peak),
    each (batch, dim, L), contiguous; the block's steps are written, the running maxima continuing from
    step ``start - 1``. Per step, in this order: ``h = decay h + (d' u) B``, ``H = decay H + |(d' u) B|``,
    ``W = decay W + H``, ``P = max(P, 1) decay`` (per n); ``y = sum_n C_n h_n + D u``, magnitude ``=
    sum_n |C_n| H_n + |D u|``, growth ``= (sum_n |C_n| W_n + N * sum_n |C_n| H_n) + |D u|`` (sums left
    to right); state_peak, decay_peak: running maxima of ``|h_n|`` and magnitude, and of ``P_n``. The gate
    is left to the caller.
    """
    blk, b_blk, c_blk, *rest = _scan_args(decay, u, B, C, D, start)
    _parallel(_selective_scan_trace_kernel, blk, _np(dprime), _np(u), b_blk, c_blk, *rest, tuple(map(_np, states)),
                                 tuple(map(_np, outs)), _scalar(u, decay.shape[-1]), _scalar(u, 1))


def retention_block(gamma: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int,
                    stop: int, state: torch.Tensor, o: torch.Tensor) -> None:
    """Steps ``start, ..., stop - 1`` of retention, fused: ``S = gamma S + k^T v`` and ``o = q S`` (the sum
    over dk left to right), before ``* scale``.

    gamma: (heads,); q, k: (batch, L, heads, dk); v, o: (batch, L, heads, dv), all contiguous (o's steps
    are written); state: (batch, heads, dk, dv), contiguous, updated in place.
    """
    _parallel(_retention_kernel, _np(gamma.contiguous()), _np(q), _np(k), _np(v), start, stop, _np(state), _np(o))


def retention_trace_block(gamma: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int,
                          stop: int, states: tuple[torch.Tensor, ...], decay_state: torch.Tensor,
                          outs: tuple[torch.Tensor, ...]) -> None:
    """`retention_block` plus the trace of the same steps (see `reference_impls.retention`), fused.

    states: (S, H, W), each (batch, heads, dk, dv), contiguous, updated in place: the state and its
    magnitude and growth recurrences; decay_state: (heads,), P, updated in place. outs: (o, magnitude,
    growth, state_peak, decay_peak), each (batch, L, heads, dv), contiguous; the block's steps are
    written, the running maxima continuing from step ``start - 1``. Per step and row i, in this order:
    ``S_i = gamma S_i + k_i v``, ``o (+)= q_i S_i``; ``H_i = |gamma| H_i + |k_i v|``, magnitude ``(+)= |q_i|
    H_i``; ``W_i = |gamma| W_i + H_i``, growth ``(+)= |q_i| W_i``; then ``P = max(P, 1) |gamma|``;
    state_peak, decay_peak: running maxima of ``|S_ij|`` over i and the steps, and of P. o, magnitude and
    growth are left before their ``* scale``, ``* |scale|`` and ``+ dk * magnitude``.
    """
    _parallel(_retention_trace_kernel, _np(gamma.contiguous()), _np(q), _np(k), _np(v), start, stop, tuple(map(_np, states)),
                            _np(decay_state), tuple(map(_np, outs)), _scalar(q, 1))


def gated_block(decay: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int,
                state: torch.Tensor, o: torch.Tensor) -> None:
    """Steps ``start, ..., start + n - 1`` of the gated recurrence (`reference_impls.gated_decay`), fused:
    ``S = a S + k^T v`` (per entry one multiply, then one add) and ``o = q S`` (the sum over K left to
    right), before ``* scale``.

    decay: (n, batch, heads, Kg) = exp(g) of those steps (Kg = 1 or K); q, k: (batch, T, heads, K); v, o:
    (batch, T, heads, V), contiguous (o's steps are written); state: (batch, heads, K, V), contiguous,
    updated in place.
    """
    _parallel(_gated_kernel, _np(decay.contiguous()), _np(q), _np(k), _np(v), start, _np(state), _np(o))


def gated_trace_block(decay: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                      extra: tuple[torch.Tensor, torch.Tensor] | None, lam: torch.Tensor | None,
                      chunk_first: torch.Tensor | None, start: int, states: tuple[torch.Tensor, ...],
                      p_states: tuple[torch.Tensor, torch.Tensor], outs: tuple[torch.Tensor, ...]) -> None:
    """`gated_block` plus the trace of the same steps (`reference_impls.gated_decay._segment`), fused.

    extra: ssd's (e_a, e_kv), each (batch, T, heads, 1), or None; lam (batch, T, heads, Kg) and
    chunk_first (T,) bool: the chunk term's mass and chunk starts, or None. states: (S, H, W, D, Y,
    entry_peak), each (batch, heads, K, V); p_states: (P, P_peak), each (batch, heads, Kg); all
    contiguous, updated in place. outs: (o, magnitude, growth, chunk, state_peak, decay_peak), each
    (batch, T, heads, V), contiguous; the block's steps are written. Per step: ``P = max(P, 1) |a|`` per
    decay channel; per entry, in this order, ``S = a S + k v``, ``H = |a| H + |k v|``, ``W = |a| W + (H +
    e_a |a| H_prev + e_kv |k v|)`` (the last two with extra), with the chunk term ``D = |a| D + |a| r``,
    ``Y = D + 2 Lambda H`` (``r = 2 Lambda_prev H_prev`` at a chunk's first step after the segment's
    first, else 0); o, magnitude, growth and chunk the sums over K (left to right) of ``q S``, ``|q| H``,
    ``|q| W``, ``|q| Y``, left before ``* scale``, ``* |scale|`` and ``+ K magnitude``; state_peak the
    running maximum of ``|S|`` over K and the steps, entry_peak that of each entry, decay_peak that of P.
    """
    has_extra, has_chunk = extra is not None, lam is not None
    dummy = q.new_zeros((1, 1, 1, 1))
    e_a, e_kv = (e.contiguous() for e in extra) if has_extra else (dummy, dummy)
    lam = lam.contiguous() if has_chunk else dummy
    chunk_first = chunk_first.contiguous() if has_chunk else torch.zeros(1, dtype=torch.bool)
    _parallel(_gated_trace_kernel, _np(decay.contiguous()), _np(q), _np(k), _np(v), (_np(e_a), _np(e_kv)),
              has_extra, _np(lam), _np(chunk_first), has_chunk, start, tuple(map(_np, states)),
              tuple(map(_np, p_states)), tuple(map(_np, outs)), _scalar(q, 1))
