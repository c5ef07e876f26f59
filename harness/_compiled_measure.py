"""`harness.metrics.measure`'s common case in one compiled pass, and exact quantiles by radix selection.

Most cases are entirely in the dtype's range: every element is in domain, the kernel's output is finite
and every sum of squares is safe. For those, `measure`'s chunked torch code makes some twenty
elementwise passes over the output, the trace and the baseline; `fast_pass` makes one, reading each
array once in its memory order, and `harness.metrics._Accumulator.fill_compiled` merges its sums through
the same methods the general code's chunks use, into the one accumulator both paths fill. When anything is out of the ordinary
(a non-finite value, an element out of the range or the precision domain, sums that need rescaling) it gives up and returns None,
and `measure` runs its general torch code, which handles every case. The two give the same numbers:
the counts, maxima, positions, quantiles and per-position maxima exactly (the same IEEE operations
on the same values, in float64, without fastmath, so without fused multiply-adds), and the norm-based
fields (``rms_ratio``, ``cosine``) to rounding, since a sum of a million squares is added in a
different order (``tests/test_measure_paths.py`` compares both paths field by field).

Quantiles stay exact. `select` finds nearest-rank quantiles of non-negative float64 values (the cond
errors) by radix selection on their bit patterns, whose integer order is the values' order: a
histogram of 16 bits at a time names the bin that holds the rank, until the bin's values are all equal
or few enough to sort. The ULP distances, small integers nearly always, are counted in a histogram
during the pass (`hist_quantiles`).

numba is a dependency of the oracles already (``reference_impls._compiled``). Setting the environment
variable ``SEQKERNEL_MEASURE_JIT=0`` before import turns this module off (`AVAILABLE` is False).
"""

from __future__ import annotations

import os
from typing import NamedTuple, Sequence

import numpy as np
import torch

from harness.dtypes import INT_VIEW

try:
    import numba
except ImportError:  # pragma: no cover - the torch code runs instead
    numba = None

__all__ = ["AVAILABLE", "FastSums", "fast_pass", "hist_quantiles", "select"]

_DISABLED = os.environ.get("SEQKERNEL_MEASURE_JIT", "1").strip().lower() in ("0", "off", "false", "no")

#: True when the compiled pass can run in this process (numba imported, not turned off).
AVAILABLE: bool = numba is not None and not _DISABLED

#: Plain sums of squares are safe when every |value| lies in (SAFE_LO, SAFE_HI) or is 0 (the same test
#: as `measure`'s torch code).
SAFE_LO, SAFE_HI = 1e-100, 1e140

#: `select` histograms 16 bits of the values' patterns at a time (`_BINS` bins), from the top (sign,
#: exponent and 4 mantissa bits: a shift of `_SHIFT`), and sorts a bin once it holds at most
#: `_SMALL_BIN` values.
_BINS = 1 << 16
_SHIFT = 48
_SMALL_BIN = 1 << 14
_INF_BITS = int(np.array(np.inf).view(np.int64))
#: The compiled pass counts ULP distances below this (nearly all of them) in a histogram instead of
#: storing them; `hist_quantiles` reads quantiles off it.
_ULP_BINS = 1 << 16


class FastSums(NamedTuple):
    """What one `fast_pass` accumulated over every element (all of them in domain and compared)."""

    n_over: int  # cond > threshold
    max_abs: float
    max_rel: float  # over |out| > smallest normal; -1 when there is none
    cond_max: float
    worst_row: int  # first element (row-major over (rows, L)) with cond == cond_max
    worst_t: int
    ulp_max: float
    sum_ref2: float  # sum of out^2
    sum_diff2: float
    sum_x2: float
    sum_xo: float
    n_underflow: int
    state_peak_max: float
    decay_peak_max: float
    baseline_max_abs: float  # -1 without a baseline
    baseline_cond_max: float
    baseline_over: int
    ulp_hist: np.ndarray  # counts of the ULP distances 0, 1, ... (below _ULP_BINS)
    n_ulp_big: int  # the others, at the front of the ulp_vals array given to `fast_pass`


if numba is not None:
    _jit = numba.njit(cache=True, fastmath=False, nogil=True)

    @_jit
    def _pass_kernel(O, X, XB, RB, ref_f32, MAG, GRO, SP, DP, BL, has_b, depth_room, room, u, u_oracle,
                     precision_limit, tiny, thr, limit, max_finite, sub_half, top, cond_vals, ulp_hist, ulp_big,
                     per_t_cond, per_t_abs, mismatch_t, stats):  # pragma: no cover
        # Every array is (P, L, Q): the output with the axes before the length merged into P and those
        # after it into Q, walked in that (memory) order; element (p, t, q) is row r = p Q + q of
        # `measure`'s (rows, L) view. Returns False as soon as an element needs the general code.
        # The oracle on the grid: RB's patterns, or (ref_f32) the oracle rounded to float32 here.
        # ULP distances below _ULP_BINS are counted in ulp_hist; larger ones are kept in ulp_big.
        n_p, length, n_q = O.shape
        f32 = np.empty(1, dtype=np.float32)
        f32_bits = f32.view(np.int32)
        n_big = 0
        n_over = 0
        n_under = 0
        b_over = 0
        k = 0
        max_abs = -1.0
        max_rel = -1.0
        cond_max = -1.0
        best = -1
        ulp_max = -1.0
        s_oo = 0.0
        s_dd = 0.0
        s_xx = 0.0
        s_xo = 0.0
        sp_max = -np.inf
        dp_max = -np.inf
        o_hi = 0.0
        b_hi = 0.0
        b_max_abs = -1.0
        b_cond_max = -1.0
        for p in range(n_p):
            for t in range(length):
                for q in range(n_q):
                    sp = SP[p, t, q]
                    dp = DP[p, t, q]
                    m = MAG[p, t, q]
                    if not (sp <= limit and dp <= limit and m <= limit):
                        return False
                    o = O[p, t, q]
                    x = np.float64(X[p, t, q])  # (a float32 x * x would round in float32)
                    # harness.metrics.rounding_bound, the same operations in the same order
                    g = GRO[p, t, q]
                    first = (m * depth_room + g) * u
                    r = first / m if m > 0 else 0.0
                    if not (r < precision_limit):  # out of the precision domain: the general code
                        return False
                    bound = first / (1.0 - r) + (m * room + g) * u_oracle + tiny
                    d = abs(x - o)
                    ao = abs(o)
                    if not (bound < np.inf and d < np.inf):
                        return False
                    o_hi = max(o_hi, ao)
                    b_hi = max(b_hi, bound)
                    sp_max = max(sp_max, sp)
                    dp_max = max(dp_max, dp)
                    c = d / bound
                    if c > thr:
                        n_over += 1
                        mismatch_t[t] = True
                    per_t_cond[t] = max(per_t_cond[t], c)
                    per_t_abs[t] = max(per_t_abs[t], d)
                    idx = (p * n_q + q) * length + t  # row-major over (rows, L): ties go to the first
                    if c > cond_max or (c == cond_max and idx < best):
                        cond_max = c
                        best = idx
                    max_abs = max(max_abs, d)
                    if ao > tiny:
                        max_rel = max(max_rel, d / ao)
                    s_oo += o * o
                    s_dd += d * d
                    s_xx += x * x
                    s_xo += x * o
                    # the ULP distance on the dtype's grid, as harness.dtypes.grid_distance
                    bx = np.int64(XB[p, t, q])
                    if ref_f32:
                        f32[0] = np.float32(o)
                        by = np.int64(f32_bits[0])
                    else:
                        by = np.int64(RB[p, t, q])
                    if (bx ^ by) < 0:
                        ulp = float(bx & top) + float(by & top)
                    else:
                        ulp = float(abs(bx - by))
                    ulp_max = max(ulp_max, ulp)
                    cond_vals[k] = c
                    k += 1
                    if ulp < _ULP_BINS:
                        ulp_hist[np.int64(ulp)] += 1
                    else:
                        ulp_big[n_big] = ulp
                        n_big += 1
                    if x == 0 and o != 0 and ao <= sub_half:
                        n_under += 1
                    if has_b:
                        bd = abs(np.float64(BL[p, t, q]) - o)
                        if not (bd < np.inf):
                            return False
                        bc = bd / bound
                        b_max_abs = max(b_max_abs, bd)
                        b_cond_max = max(b_cond_max, bc)
                        if bc > thr:
                            b_over += 1
        # the torch code's own test for its fast path, on the maxima
        if not (o_hi + b_hi <= max_finite):
            return False
        stats[0] = n_over
        stats[1] = max_abs
        stats[2] = max_rel
        stats[3] = cond_max
        stats[4] = best
        stats[5] = ulp_max
        stats[6] = s_oo
        stats[7] = s_dd
        stats[8] = s_xx
        stats[9] = s_xo
        stats[10] = n_under
        stats[11] = sp_max
        stats[12] = dp_max
        stats[13] = b_max_abs
        stats[14] = b_cond_max
        stats[15] = b_over
        stats[16] = o_hi
        stats[17] = n_big
        return True

    @_jit
    def _histogram(bits, shift, prefix, hist, lo, hi):  # pragma: no cover - compiled
        # Count the patterns whose bits above ``shift + 16`` equal ``prefix`` (all of them at the top
        # level) by their next 16 bits, with each bin's least and greatest pattern.
        hist[:] = 0
        top = shift == _SHIFT  # (a shift by 64 bits is undefined)
        for v in bits:
            if top and not 0 <= v <= _INF_BITS:  # a negative number, -0.0 or NaN: not ordered by pattern
                return False
            if top or (v >> (shift + 16)) == prefix:
                b = (v >> shift) & 0xFFFF
                if hist[b] == 0 or v < lo[b]:
                    lo[b] = v
                if hist[b] == 0 or v > hi[b]:
                    hi[b] = v
                hist[b] += 1
        return True

    @_jit
    def _select_kernel(bits, ranks, out):  # pragma: no cover - compiled
        # bits: the int64 patterns of non-negative float64 values without NaN (their order is the
        # values' order; False for any other pattern); out[q] = the ranks[q]-th smallest pattern. Radix selection, 16 bits a level
        # from the top: keep the bin that holds the rank until its values are all equal (ties: ULP
        # distances, zeros) or few enough to sort.
        nbins = _BINS
        hist0 = np.zeros(nbins, dtype=np.int64)
        lo0 = np.zeros(nbins, dtype=np.int64)
        hi0 = np.zeros(nbins, dtype=np.int64)
        if not _histogram(bits, _SHIFT, 0, hist0, lo0, hi0):
            return False
        hist = np.zeros(nbins, dtype=np.int64)
        lo = np.zeros(nbins, dtype=np.int64)
        hi = np.zeros(nbins, dtype=np.int64)
        for q in range(ranks.size):
            r = ranks[q]
            prefix = 0
            shift = _SHIFT
            h, bl, bh = hist0, lo0, hi0
            while True:
                b = 0
                while r >= h[b]:
                    r -= h[b]
                    b += 1
                prefix = (prefix << 16) | b
                if bl[b] == bh[b]:  # every value in the bin is the same (at the last level always)
                    out[q] = bl[b]
                    break
                if h[b] <= _SMALL_BIN:
                    inbin = np.empty(h[b], dtype=np.int64)
                    n = 0
                    for v in bits:
                        if (v >> shift) == prefix:
                            inbin[n] = v
                            n += 1
                    out[q] = np.sort(inbin)[r]
                    break
                shift -= 16
                _histogram(bits, shift, prefix, hist, lo, hi)
                h, bl, bh = hist, lo, hi
        return True


def select(values: np.ndarray, ranks: Sequence[int]) -> list[float] | None:
    """The ``ranks[q]``-th smallest (0-based) of ``values``, a 1-D float64 array, exactly, in two or three
    passes; None unless every value is a non-negative number (+0.0 to +inf: `measure`'s cond and ULP
    errors), whose bit patterns are ordered like the values."""
    bits = np.ascontiguousarray(values, dtype=np.float64).view(np.int64)
    out = np.empty(len(ranks), dtype=np.int64)
    if not _select_kernel(bits, np.asarray(ranks, dtype=np.int64), out):
        return None
    return [float(v) for v in out.view(np.float64)]


def _grid_bits(t: torch.Tensor, grid: torch.dtype) -> np.ndarray:
    """The bit patterns of ``t`` rounded to ``grid``, as a numpy view (strides kept where no rounding is
    needed)."""
    if t.dtype != grid:
        t = t.to(grid)
    return t.view(INT_VIEW[grid]).numpy()


def fast_pass(O: torch.Tensor, X: torch.Tensor, MAG: torch.Tensor, GRO: torch.Tensor, SP: torch.Tensor,
              DP: torch.Tensor, BL: torch.Tensor | None, *, grid: torch.dtype, depth: int, room: float, u: float,
              u_oracle: float, precision_limit: float, tiny: float, thr: float, limit: float, max_finite: float,
              sub_half: float,
              cond_vals: np.ndarray, ulp_vals: np.ndarray, per_t_cond: torch.Tensor,
              per_t_abs: torch.Tensor, mismatch_t: torch.Tensor) -> FastSums | None:
    """`measure`'s accumulators in one pass, or None where its general code must run.

    Every tensor is a (P, L, Q) view of the output's layout (see `_pass_kernel`). The bound is
    `harness.metrics.rounding_bound`'s (``depth``, ``room``, ``u``, ``u_oracle``, ``tiny``); an element
    outside the precision domain (``r >= precision_limit``) sends the case to the general code. O, MAG, GRO, SP, DP:
    the float64 trace; X: the kernel output in the case's dtype ``grid``; BL: the baseline or None.
    Fills ``cond_vals`` (every element), ``ulp_vals`` (the ULP distances of `_ULP_BINS` or more; the
    others are counted in `FastSums.ulp_hist`) and the per-position tensors (also when it gives up).
    """
    if not AVAILABLE or X.dtype != grid or grid not in INT_VIEW:
        return None
    if any(t.dtype != torch.float64 for t in (O, MAG, GRO, SP, DP)):
        return None
    if any(t.device.type != "cpu" for t in (O, MAG, GRO, SP, DP, X, BL) if t is not None):
        return None
    # One compiled version per grid (float32, float64, half): every array C-contiguous (a copy only for
    # an unusual layout), the output and the baseline in float32 or float64 (half values upcast exactly).
    O, X, MAG, GRO, SP, DP = (t.contiguous() for t in (O, X, MAG, GRO, SP, DP))
    x_wide = X if X.dtype in (torch.float32, torch.float64) else X.to(torch.float64)
    has_b = BL is not None
    if not has_b:
        BL = torch.zeros((1, 1, 1), dtype=x_wide.dtype)
    elif BL.dtype != x_wide.dtype:
        if BL.dtype.itemsize > x_wide.dtype.itemsize:  # rounding it would change the numbers
            return None
        BL = BL.to(x_wide.dtype)
    stats = np.zeros(18, dtype=np.float64)
    ulp_hist = np.zeros(_ULP_BINS, dtype=np.int64)
    top = int(torch.iinfo(INT_VIEW[grid]).max)
    ref_f32 = grid == torch.float32  # rounded to float32 in the pass (no float32 copy of the oracle)
    ref_bits = _grid_bits(O[:1, :1, :1] if ref_f32 else O, grid)
    ok = _pass_kernel(O.numpy(), x_wide.numpy(), _grid_bits(X, grid), ref_bits, ref_f32,
                      *(t.numpy() for t in (MAG, GRO, SP, DP)), BL.contiguous().numpy(), has_b,
                      float(depth + room), float(room), u, u_oracle, precision_limit, tiny, thr, limit, max_finite,
                      sub_half, top, cond_vals, ulp_hist, ulp_vals,
                      per_t_cond.numpy(), per_t_abs.numpy(), mismatch_t.numpy(), stats)
    if not ok:
        return None
    o_hi, d_hi = stats[16], stats[1]
    if not all((v == 0 or v > SAFE_LO) and v < SAFE_HI for v in (o_hi, d_hi)):
        return None  # sums of squares need the torch code's rescaling
    length = O.shape[1]
    best = int(stats[4])
    return FastSums(
        n_over=int(stats[0]), max_abs=float(stats[1]), max_rel=float(stats[2]), cond_max=float(stats[3]),
        worst_row=best // length, worst_t=best % length, ulp_max=float(stats[5]), sum_ref2=float(stats[6]),
        sum_diff2=float(stats[7]), sum_x2=float(stats[8]), sum_xo=float(stats[9]), n_underflow=int(stats[10]),
        state_peak_max=float(stats[11]), decay_peak_max=float(stats[12]), baseline_max_abs=float(stats[13]),
        baseline_cond_max=float(stats[14]), baseline_over=int(stats[15]),
        ulp_hist=ulp_hist[: int(min(stats[5], _ULP_BINS - 1)) + 1],  # (up to the largest distance)
        n_ulp_big=int(stats[17]),
    )


def hist_quantiles(hist: np.ndarray, big: np.ndarray, ranks: Sequence[int]) -> list[float]:
    """The ``ranks[q]``-th smallest of the values counted in ``hist`` (``hist[v]`` values equal to v)
    together with ``big`` (values of at least ``hist.size``): `fast_pass`'s ULP distances."""
    cum = np.cumsum(hist)
    n_small = int(cum[-1]) if cum.size else 0
    out = []
    for r in ranks:
        if r < n_small:
            out.append(float(np.searchsorted(cum, r, side="right")))
        else:
            out.append(float(np.partition(big, r - n_small)[r - n_small]))
    return out
