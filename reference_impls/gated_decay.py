"""Oracles for the gated-decay families: ``simple_gla`` and ``gla`` (fla's layout) and ``ssd`` (Mamba-2,
mamba-ssm's layout), all three one recurrence with a data-dependent decay.

`simple_gla`, `gla` and `ssd` are the float64 CPU ground truth and, with another ``compute_dtype`` /
``device``, the same-dtype sequential baselines (the same loop with every operation rounded in that
dtype). `simple_gla_trace`, `gla_trace` and `ssd_trace` run the same loop in float64 and also return the
absolute-value companions of `reference_impls.trace`, for the output and for the final state, plus the
chunk forms' extra rounding term (`GatedTrace`).

Definition (fla's layout), per batch row b and head h, with S a K x V state::

    S_t = diag(exp(g_t)) S_{t-1} + k_t^T v_t        S_{-1} = initial_state (zeros if None)
    o_t = scale * (q_t S_t)                         scale = K**-0.5 unless given

on q, k (batch, T, heads, K), v (batch, T, heads, V); ``gla``'s g is (batch, T, heads, K), one log-decay
per key channel; ``simple_gla``'s g is (batch, T, heads), one per head, i.e. ``gla`` with g broadcast
over K. g is the log-decay: the harness's regimes keep it <= 0, but the oracle computes the definition
for any g. Variable-length batches (``cu_seqlens``, fla's convention): batch must be 1 and cu_seqlens is
a 1-D integer tensor ``[0, t_1, ..., T]`` of sequence boundaries; sequence i is rows
``cu_seqlens[i]:cu_seqlens[i+1]``, starts from ``initial_state[i]`` (or zeros) and contributes row i of
the final state, shape (sequences, heads, K, V). Without cu_seqlens the final state is (batch, heads,
K, V), the state after the last step.

``ssd`` maps onto the same loop (one definition, `_gated`): with ``dt' = dt + dt_bias``, then
``softplus(dt')`` when ``dt_softplus`` (mamba-ssm's: ``x if x > 20 else log1p(exp(x))``), then clamped
to ``dt_limit`` (mamba-ssm's default (0, inf), so a negative step size is 0), Mamba-2's state
h (heads, P, N) follows ``h_t = exp(dt'_t A) h_{t-1} + (dt'_t x_t)^T B_t`` and ``y_t = h_t C_t``. That is
``simple_gla`` with ``g = dt' A``, ``k = B``, ``v = dt' x``, ``q = C``, ``scale = 1`` and ``S = h^T``
(N x P); head h reads group ``h // (heads // groups)`` of B and C. Then ``y += D x`` (D (heads,) or
(heads, P)) and, with z, ``y *= silu(z)``, in that order (mamba-ssm's ``chunk_scan_ref``). ``seq_idx``
(batch, T), non-decreasing along T, packs several sequences in a row: the state restarts from zeros
wherever seq_idx changes; ``initial_states`` (batch, heads, P, N) is the state before each row's first
step (mamba-ssm gives it to sequence index 0, so with both, each row's seq_idx must start at 0), and
the final states are each row's last state. ``chunk_size`` only sets a chunked kernel's
blocking; the oracle accepts it and, in `ssd_trace`, uses it for the chunk term below.

Arithmetic, in this order: ``a = exp(g)`` rounded in the dtype; ``k_t^T v_t`` the elementwise products
``k[i] * v[j]``; the state update one multiply then one add (`reference_impls._loop`); ``q_t S_t`` sums
``q[i] * S[i, j]`` for i = 0, 1, ..., K-1 left to right; then the product with scale (a Python float).
For ssd, ``dt' * x`` is formed first (then times B, as mamba-ssm's selective scan does), ``dt' * A``
before its exp, and ``D * x`` is added after the sum.

Trace of the output (float64; H_S, W_S are K x V like the state):

- magnitude ``= |scale| |q| H_S`` with ``H_t = |a_t| H_{t-1} + |k_t|^T |v_t|``, ``H_{-1} = |initial_state|``;
- growth ``= |scale| |q| W_S + K |scale| |q| H_S`` with ``W_t = |a_t| W_{t-1} + H_t`` (``W_{-1} = 0``), the
  rounding of the sequential loop (as for retention; the rounding of ``exp(g)`` is taken to be about
  u relative, as the selective-scan oracle does);
- state_peak: running max over t' <= t and i of ``|S_t'[i, j]|``; decay_peak: running max over t' <= t
  and i of ``P_t = |a_t[i]| max(P_{t-1}, 1)`` (at most 1 when g <= 0). Both restart at a sequence
  boundary, where the state restarts.

For ssd, whose decay and input are computed from dt, growth's state recurrence has two more inputs
(`ssd_input_rounding`): ``W_t = |a_t| W_{t-1} + H_t + e_a |a_t| H_{t-1} + e_kv |k_t| |v_t|``, where
``e_kv = rel(dt') + 1`` counts the roundings in ``dt' x`` and ``e_a = |dt' A| (rel(dt') + 1)`` turns the
relative error of the exponent ``dt' A`` into the decay's (``|x| e^x <= 1/e`` keeps it bounded). The
output map adds ``|D x|`` to magnitude and growth and, with z, maps both through the gate as
the selective scan does (``(...) |silu z| + |y|``); state_peak also holds the ungated magnitude.

Trace of the final state: out = the final state; magnitude = H, growth = W at the last step (the
state's own rounding; no output map); state_peak = running max of |S| entry by entry (the initial state
included); decay_peak = running max of P per key channel.

The chunk term (``chunk_growth``, computed when a trace is asked for with ``chunk_size``). A chunked
kernel evaluates decay products inside a chunk as ``exp(G_t - G_s)``, ``exp(G_t)`` and
``exp(G_last - G_s)``, where ``G_t = g_c + ... + g_t`` is a cumulative sum from the chunk's first
step c. In a dtype with unit roundoff u each such cumulative sum carries an absolute error of about
``u * Lambda_t`` with ``Lambda_t = |g_c| + ... + |g_t|`` (the within-chunk log-decay mass, per key channel
for gla), so each exponent of a difference of two of them is off by up to ``2 u Lambda_t``, and
``exp`` turns an absolute error e in its argument into a relative error e of its value. Under strong
decay (g = -20 per step) Lambda reaches 1280 in a 64-step chunk: every decay factor is then only good to
``2560 u``, while the recurrent form multiplies factors each good to u. This is an error of the
algorithm, not a slip, and it is what the chunk term bounds (in units of u, like growth)::

    D_t = |a_t| (D_{t-1} + r_t),   r_t = 2 Lambda_{t-1} H_{t-1} at a chunk's first step, else 0
    Y_t = D_t + 2 Lambda_t H_t                             (D = 0 at a sequence's first step)
    chunk_growth = |scale| |q| Y_S

The within-chunk part ``2 Lambda_t H_t`` bounds every term whose decay factor was formed in the current
chunk (each at most 2 u Lambda_t relative, and H_t their absolute sum); D carries the error of the state
passed in from earlier chunks (formed with their own Lambda), decayed exactly like the state. For the
final state Y at the last step is the chunk term.

How tight, and what it assumes: Lambda is not ``|G_t|`` but the typical size of the cumulative sum's
own error. Each addition of a running sum rounds relative to the partial sum, so the error of
``G_t - G_s`` is a sum of roundings ``u |G_i|`` over the steps between: when they share a sign (the
worst case) ``u (|G_c| + ... + |G_t|)``, up to (t - c + 1) times ``u |G_t|``; for roundings of no common
sign (the sums of data-dependent gates) a random walk, ``u sqrt(G_c^2 + ... + G_t^2)``. The term uses
the random walk, ``Lambda_t = sqrt(sum_{i=c..t} M_i^2)`` with ``M_i = |g_c| + ... + |g_i|``, at least
``M_t`` (a tree-shaped scan such as Triton's ``tl.cumsum`` errs about log2 of the chunk length times
``u M_t``, below it). For a short chunk it is a few ``M_t`` (64 steps of even decay: 4.6); first it was
``M_t`` itself, which held for 64-step chunks (float32 chunk forms, in-tree and fla's
``naive_chunk_simple_gla``, log-decays in [-20, 0] and [-1, 0], T = 70: the error within 0.30 of
``u (growth + chunk_growth + magnitude)``, ``scripts/gated_chunk_error.py``) and not for long ones: a
200-example ci search drew the in-tree float16 chunk form at chunk 861 (L=2048, strong decay) whose
error reached 2.1 of that bound, 33 times the float16 loop's, on a head of mild decay where hundreds of
steps of roundings add up. It is a first-order bound: ``exp`` of an exponent off by e is off by
``e^e - 1``, which is e only while e is small. In bfloat16 under strong decay ``u Lambda`` exceeds 1, the
decay factors have no correct bits left, and ``u (growth + chunk_growth)`` exceeds the magnitude itself,
which a harness treats as the dtype's precision limit, not as a verdict on the kernel.

A packed sequence (cu_seqlens, seq_idx) may be blocked in chunks from
its first step (fla's varlen chunks are per sequence) or at multiples of chunk_size along the whole row
(mamba-ssm's cumulative sums run over seq_idx boundaries, so Lambda does too); both are correct, and
the term bounds either (`_chunk_mass`: the larger mass, a chunk's first step in either blocking). With
only one blocking the other false-alarmed: the in-tree ssd chunk form restarts its chunks at each
sequence, and at cu_seqlens [0, 2, 196] with chunk 98 its float64 error reached 1.76 of a bound made
for row chunks. A harness bounds a chunked kernel's error by ``u (growth + chunk_growth)``
(`GatedTrace.with_chunk_growth`).

Memory: per block of steps the states are (steps, batch, heads, K, V); no (T, K, V) tensor is formed.
On the CPU in float32/float64 the block loop runs compiled (`reference_impls._compiled.gated_block` and
``gated_trace_block``: the same operations in the same order, the same bits, 7-11x faster) and holds only
the states.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, replace
from typing import Sequence

import torch
import torch.nn.functional as F

from reference_impls import _loop, _validate
from reference_impls.trace import Trace

__all__ = [
    "GatedTrace",
    "SOFTPLUS_THRESHOLD",
    "gla",
    "gla_trace",
    "simple_gla",
    "simple_gla_trace",
    "ssd",
    "ssd_trace",
]

#: Above this, softplus(x) is taken to be x (mamba-ssm's and torch's default), as in the selective scan.
SOFTPLUS_THRESHOLD: float = 20.0


@dataclass
class GatedTrace:
    """What a gated oracle saw: the output's `Trace`, the final state's (None unless asked for), and the
    chunk forms' extra rounding term for each (None unless a ``chunk_size`` was given), all float64 CPU.

    ``chunk_growth`` has the output's shape and ``final_state_chunk_growth`` the final state's; both are
    in units of u like ``growth`` (module docstring). `with_chunk_growth` folds them into ``growth``.
    """

    out: Trace
    final_state: Trace | None = None
    chunk_growth: torch.Tensor | None = None
    final_state_chunk_growth: torch.Tensor | None = None

    def with_chunk_growth(self) -> "GatedTrace":
        """The same trace with the chunk term added to each growth: the bound for a chunked kernel."""
        if self.chunk_growth is None:
            raise ValueError("chunk_growth=None: this trace was computed without chunk_size; pass chunk_size= "
                             "to the *_trace function to get the chunk forms' term")
        out = replace(self.out, growth=self.out.growth + self.chunk_growth, chunk_growth=self.chunk_growth)
        final = self.final_state
        if final is not None and self.final_state_chunk_growth is not None:
            final = replace(final, growth=final.growth + self.final_state_chunk_growth,
                            chunk_growth=self.final_state_chunk_growth)
        return GatedTrace(out=out, final_state=final, chunk_growth=self.chunk_growth,
                          final_state_chunk_growth=self.final_state_chunk_growth)


# ----------------------------------------------------------------------------------------------------
# Argument checks


def _flag(name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name}={value!r} is a {type(value).__name__}; expected True or False")
    return value


def _chunk_size(value: object) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"chunk_size={value!r} is not a positive integer; expected e.g. chunk_size=64, or None")
    return int(value)


def _int_tensor(name: str, x: object) -> torch.Tensor:
    if isinstance(x, torch.Tensor):
        if x.is_floating_point() or x.is_complex() or x.dtype == torch.bool:
            raise TypeError(f"{name}.dtype={x.dtype} is not an integer dtype; expected torch.int32 or torch.int64")
        return x.detach().to(device="cpu", dtype=torch.int64)
    raise TypeError(f"{name} is a {type(x).__name__}; expected an integer torch.Tensor")


def _cu_seqlens(value: object, batch: int, length: int) -> list[tuple[int, int]] | None:
    """fla's cu_seqlens as a list of (start, stop) per sequence; None when not given."""
    if value is None:
        return None
    cu = _int_tensor("cu_seqlens", value)
    if cu.ndim != 1 or cu.shape[0] < 2:
        raise ValueError(f"cu_seqlens.shape={tuple(cu.shape)}; expected a 1-D tensor [0, ..., T] of at least 2 "
                         f"boundaries (one sequence: [0, {length}])")
    if batch != 1:
        raise ValueError(f"batch={batch} with cu_seqlens: variable-length sequences are packed in one row; "
                         f"expected batch=1 (q.shape[0]), as fla requires")
    bounds = [int(c) for c in cu]
    if bounds[0] != 0 or bounds[-1] != length:
        raise ValueError(f"cu_seqlens={bounds} must start at 0 and end at T={length}; expected [0, ..., {length}]")
    if any(b > a for a, b in zip(bounds[1:], bounds[:-1])):
        raise ValueError(f"cu_seqlens={bounds} decreases; expected non-decreasing sequence boundaries")
    return list(zip(bounds[:-1], bounds[1:]))


def _check_gla(q, k, v, g, scale, initial_state, output_final_state, cu_seqlens, *, per_key: bool):
    q = _validate.floating_tensor("q", q)
    k = _validate.floating_tensor("k", k)
    v = _validate.floating_tensor("v", v)
    g = _validate.floating_tensor("g", g)
    h0 = _validate.optional_tensor("initial_state", initial_state)
    _validate.rank("q", q, "(batch, T, heads, K)")
    _validate.shape("k", k, "q.shape (batch, T, heads, K)", q.shape)
    _validate.rank("v", v, "(batch, T, heads, V)")
    batch, length, heads, dk = q.shape
    if tuple(v.shape[:3]) != (batch, length, heads):
        raise ValueError(f"v.shape={tuple(v.shape)} does not match: expected (batch, T, heads, V) = "
                         f"({batch}, {length}, {heads}, V) from q.shape={tuple(q.shape)}")
    _validate.positive_dim("q", q, "K", 3)
    _validate.positive_dim("v", v, "V", 3)
    if per_key:
        _validate.shape("g", g, "(batch, T, heads, K), one log-decay per key channel", q.shape)
        g4 = g
    else:
        _validate.shape("g", g, "(batch, T, heads), one log-decay per head and step", q.shape[:3],
                        hint="use gla for a log-decay per key channel")
        g4 = g[..., None]
    segments = _cu_seqlens(cu_seqlens, batch, length)
    rows = batch if segments is None else len(segments)
    if h0 is not None:
        what = ("(batch, heads, K, V)" if segments is None
                else "(sequences, heads, K, V), one row per cu_seqlens sequence")
        _validate.shape("initial_state", h0, what, (rows, heads, dk, v.shape[3]))
    scale_ = dk**-0.5 if scale is None else _validate.real_number("scale", scale)
    final = _flag("output_final_state", output_final_state)
    return q, k, v, g4, scale_, h0, final, segments


def _check_ssd(x, dt, A, B, C, chunk_size, D, z, dt_bias, dt_softplus, initial_states, seq_idx, dt_limit):
    x = _validate.floating_tensor("x", x)
    dt = _validate.floating_tensor("dt", dt)
    A = _validate.floating_tensor("A", A)
    B = _validate.floating_tensor("B", B)
    C = _validate.floating_tensor("C", C)
    D = _validate.optional_tensor("D", D)
    z = _validate.optional_tensor("z", z)
    dt_bias = _validate.optional_tensor("dt_bias", dt_bias)
    h0 = _validate.optional_tensor("initial_states", initial_states)
    _validate.rank("x", x, "(batch, T, heads, P)")
    batch, length, heads, headdim = x.shape
    _validate.positive_dim("x", x, "heads", 2)
    _validate.positive_dim("x", x, "P", 3)
    _validate.shape("dt", dt, "(batch, T, heads)", x.shape[:3])
    _validate.shape("A", A, "(heads,)", (heads,))
    _validate.rank("B", B, "(batch, T, groups, N)")
    groups, n_state = B.shape[2], B.shape[3]
    if tuple(B.shape[:2]) != (batch, length) or groups < 1 or heads % groups:
        raise ValueError(f"B.shape={tuple(B.shape)} does not match: expected (batch, T, groups, N) = "
                         f"({batch}, {length}, groups, N) with heads={heads} divisible by groups")
    _validate.positive_dim("B", B, "N", 3)
    _validate.shape("C", C, "B.shape (batch, T, groups, N)", B.shape)
    if D is not None and tuple(D.shape) not in ((heads,), (heads, headdim)):
        raise ValueError(f"D.shape={tuple(D.shape)} does not match: expected (heads,) = ({heads},) or "
                         f"(heads, P) = ({heads}, {headdim})")
    if z is not None:
        _validate.shape("z", z, "x.shape (batch, T, heads, P)", x.shape)
    if dt_bias is not None:
        _validate.shape("dt_bias", dt_bias, "(heads,)", (heads,))
    if h0 is not None:
        _validate.shape("initial_states", h0, "(batch, heads, P, N)", (batch, heads, headdim, n_state))
    softplus = _flag("dt_softplus", dt_softplus)
    _chunk_size(chunk_size)
    rows: list[list[tuple[int, int]]] | None = None
    if seq_idx is not None:
        idx = _int_tensor("seq_idx", seq_idx)
        if tuple(idx.shape) != (batch, length):
            raise ValueError(f"seq_idx.shape={tuple(idx.shape)} does not match: expected (batch, T) = "
                             f"({batch}, {length})")
        if length > 1 and bool((idx[:, 1:] < idx[:, :-1]).any()):
            raise ValueError("seq_idx decreases along T in some row; expected a non-decreasing sequence index per "
                             "row (packed sequences 0, 0, 1, 1, 1, 2, ...)")
        if h0 is not None and bool((idx[:, 0] != 0).any()):
            raise ValueError(f"seq_idx[:, 0]={idx[:, 0].tolist()} with initial_states: mamba-ssm gives initial_states "
                             "to sequence 0 only; expected every row's seq_idx to start at 0")
        rows = []
        for row in idx.tolist():
            cuts = [0] + [t for t in range(1, length) if row[t] != row[t - 1]] + [length]
            rows.append(list(zip(cuts[:-1], cuts[1:])))
    if not (isinstance(dt_limit, Sequence) and len(dt_limit) == 2):
        raise TypeError(f"dt_limit={dt_limit!r}; expected a pair (low, high), e.g. (0.0, float('inf'))")
    lo, hi = (_validate.real_number(f"dt_limit[{i}]", v) for i, v in enumerate(dt_limit))
    if not lo <= hi:
        raise ValueError(f"dt_limit={dt_limit!r} has low > high; expected low <= high")
    return x, dt, A, B, C, D, z, dt_bias, softplus, h0, rows, (lo, hi)


# ----------------------------------------------------------------------------------------------------
# The one loop


def _chunk_mass(g_abs: torch.Tensor, chunk_size: int | None, t0: int = 0, t1: int | None = None, *,
                whole: bool = False) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(Lambda, chunk_start) of the steps ``t0 .. t1 - 1`` of the rows ``g_abs`` (batch, T, heads, Kg),
    where one sequence runs: the size of the within-chunk cumulative sums' error in units of u (float64;
    the random walk of the module docstring, at least the log-decay mass ``|g_c| + ... + |g_t|``) and
    whether step t is a chunk's first, for chunks of ``chunk_size`` steps.

    A chunked kernel may block a packed sequence either way: chunks from the sequence's first step
    (fla's varlen) or at multiples of ``chunk_size`` along the whole row (mamba-ssm's ``seq_idx``, whose
    cumulative sums run over the earlier sequence's steps in the same chunk). The term bounds both:
    Lambda is the larger of the two blockings' random walks, and a step is a chunk's first in either blocking. For a
    sequence at ``t0 = 0`` the two are the same. Lambda comes from float64 running sums: good to far
    better than the float32/16 roundings it scales. ``whole``: every step carries its chunk's Lambda at the
    chunk's last step (an adjoint's steps: `gla_adjoint_trace`)."""
    if chunk_size is None:
        return None
    t1 = g_abs.shape[1] if t1 is None else t1
    t = torch.arange(t0, t1)
    in_sequence = t - (t - t0) % chunk_size  # the first step of t's chunk, chunks from the sequence's start
    in_row = t - t % chunk_size  # ... chunks at multiples of chunk_size along the row
    g64 = g_abs.double()

    def random_walk(c0: int) -> torch.Tensor:
        """sqrt(sum_{i=c..t} M_i^2), M_i = |g_c| + ... + |g_i|, for chunks from step c0 over the steps
        c0 .. t1 - 1: sums inside each chunk (no differences of long running sums, which lose small ones)."""
        x = g64[:, c0:t1]
        n = x.shape[1]
        x = torch.cat([x, x.new_zeros(x.shape[0], -n % chunk_size, *x.shape[2:])], dim=1)
        x = x.reshape(x.shape[0], -1, chunk_size, *x.shape[2:])
        mass = x.cumsum(2)
        if whole:  # no mass at the padding, so a chunk's last entry is its last real step's
            mass = mass * (torch.arange(x.shape[1] * chunk_size) < n).view(1, -1, chunk_size, *(1,) * (x.dim() - 3))
        walk = (mass * mass).cumsum(2).sqrt()
        if whole:
            walk = walk[:, :, -1:].expand_as(walk)
        return walk.reshape(x.shape[0], -1, *x.shape[3:])[:, :n]

    lam = torch.maximum(random_walk(t0), random_walk(t0 - t0 % chunk_size)[:, t0 % chunk_size:])
    return lam, (t == in_sequence) | (t == in_row)


@_loop.single_threaded()
@torch.no_grad()
def _segment(q, k, v, g, h0, scale, chunk, *, with_trace, extra=None):
    """The recurrence over one segment (no resets inside), every row of the batch at once.

    q, k (batch, n, heads, K); v (batch, n, heads, V); g (batch, n, heads, Kg) with Kg in (1, K), all in
    the compute dtype on its device; h0 (batch, heads, K, V) or None; chunk: `_chunk_mass` of the segment
    or None; extra: None or (e_a, e_kv) (batch, n, heads, 1), the inputs' own rounding in units of u
    (ssd's growth term). Returns (o, last state, `GatedTrace` or None).
    """
    jit = _loop.fused(q, k, v, g, h0, *(extra or ()), *(chunk[:1] if chunk is not None else ()))
    if jit is not None:
        return _segment_fused(jit, q, k, v, g, h0, scale, chunk, with_trace=with_trace, extra=extra)
    dtype, device = q.dtype, q.device
    batch, n_steps, heads, dk = q.shape
    dv = v.shape[-1]
    o = torch.empty((batch, n_steps, heads, dv), dtype=dtype, device=device)
    state = torch.zeros((batch, heads, dk, dv), dtype=dtype, device=device) if h0 is None else h0.clone()
    steps = _loop.block_length(n_steps, batch * heads * dk * dv)
    s_buf = torch.empty((steps, batch, heads, dk, dv), dtype=dtype, device=device)
    if with_trace:
        mag, growth, state_peak, decay_peak = (torch.empty_like(o) for _ in range(4))
        mag_state = state.abs()
        growth_state = torch.zeros_like(state)
        p_state = torch.zeros((batch, heads, g.shape[-1]), dtype=dtype)
        peak_carry = torch.zeros((batch, heads, dv), dtype=dtype)
        decay_carry = torch.zeros_like(peak_carry)
        entry_peak = state.abs()  # the final state's running max, entry by entry
        p_peak = torch.zeros_like(p_state)
        mag_buf, growth_buf = torch.empty_like(s_buf), torch.empty_like(s_buf)
        p_buf = torch.empty((steps, *p_state.shape), dtype=dtype)
        if chunk is not None:
            lam_all, chunk_start = chunk
            chunk_o = torch.empty_like(o)
            d_state = torch.zeros_like(state)
            d_buf = torch.empty_like(s_buf)
            lam_prev = torch.zeros((batch, heads, g.shape[-1], 1), dtype=dtype)
            y_state = torch.zeros_like(state)
    for start, stop in _loop.blocks(n_steps, steps):
        n = stop - start
        q_blk, k_blk, v_blk, g_blk = (x[:, start:stop].transpose(0, 1) for x in (q, k, v, g))  # (n, batch, heads, .)
        decay = torch.exp(g_blk)[..., None]  # (n, batch, heads, Kg, 1)
        kv = k_blk[..., :, None] * v_blk[..., None, :]  # (n, batch, heads, K, V)
        s_blk = s_buf[:n]
        state = _loop.recur(decay, kv, state, s_blk)
        o[:, start:stop] = _loop.seq_sum(q_blk[..., :, None] * s_blk, -2).mul_(scale).transpose(0, 1)
        if not with_trace:
            continue
        decay_abs = decay.abs()
        q_abs = q_blk.abs()[..., :, None]
        kv_abs = kv.abs()
        mag_before = mag_state
        mag_state = _loop.recur(decay_abs, kv_abs, mag_state, mag_buf[:n])
        h_prev = torch.cat([mag_before[None], mag_buf[: n - 1]])  # H_{t-1} for the block's steps
        growth_in = mag_buf[:n]
        if extra is not None:  # the decay's and k^T v's own rounding, beyond the one u of each
            e_a, e_kv = (e[:, start:stop].transpose(0, 1)[..., None] for e in extra)
            growth_in = growth_in + e_a * decay_abs * h_prev + e_kv * kv_abs
        growth_state = _loop.recur(decay_abs, growth_in, growth_state, growth_buf[:n])
        mag_o = _loop.seq_sum(q_abs * mag_buf[:n], -2).mul_(abs(scale))
        growth_o = _loop.seq_sum(q_abs * growth_buf[:n], -2).mul_(abs(scale)) + dk * mag_o
        mag[:, start:stop] = mag_o.transpose(0, 1)
        growth[:, start:stop] = growth_o.transpose(0, 1)
        s_abs = s_blk.abs()
        peak, peak_carry = _loop.running_max(s_abs.amax(-2), peak_carry)
        state_peak[:, start:stop] = peak.transpose(0, 1)
        entry_peak = torch.maximum(entry_peak, s_abs.amax(0))
        p_state = _loop.recur_peak(decay_abs[..., 0], p_state, p_buf[:n])
        p_peak = torch.maximum(p_peak, p_buf[:n].amax(0))
        dpeak, decay_carry = _loop.running_max(p_buf[:n].amax(-1, keepdim=True).expand(n, batch, heads, dv),
                                               decay_carry)
        decay_peak[:, start:stop] = dpeak.transpose(0, 1)
        if chunk is not None:
            lam = lam_all[:, start:stop].transpose(0, 1)[..., None].to(dtype)  # (n, batch, heads, Kg, 1)
            l_prev = torch.cat([lam_prev[None], lam[:-1]])
            first = chunk_start[start:stop].view(n, 1, 1, 1, 1)
            if start == 0:  # a sequence's first step: the state before it is the exact initial state
                first = first.clone()
                first[0] = False
            r = torch.where(first, 2 * l_prev * h_prev, torch.zeros((), dtype=dtype))
            d_state = _loop.recur(decay_abs, decay_abs * r, d_state, d_buf[:n])
            y_blk = d_buf[:n] + 2 * lam * mag_buf[:n]
            chunk_o[:, start:stop] = _loop.seq_sum(q_abs * y_blk, -2).mul_(abs(scale)).transpose(0, 1)
            lam_prev = lam[-1]
            y_state = y_blk[-1]
    if not with_trace:
        return o, state, None
    final = Trace(out=state, magnitude=mag_state, growth=growth_state, state_peak=entry_peak,
                  decay_peak=p_peak[..., None].expand_as(state).clone())
    out = Trace(out=o, magnitude=mag, growth=growth, state_peak=state_peak, decay_peak=decay_peak)
    trace = GatedTrace(out=out, final_state=final, chunk_growth=chunk_o if chunk is not None else None,
                       final_state_chunk_growth=y_state if chunk is not None else None)
    return o, state, trace


def _segment_fused(jit, q, k, v, g, h0, scale, chunk, *, with_trace, extra):
    """`_segment` on the compiled kernels (`reference_impls._compiled.gated_block`, ``gated_trace_block``),
    one launch for the segment: the torch loop's operations in its order, per entry and step, so the same
    bits (``tests/test_oracle_compiled.py``), without its block-sized intermediates. The decays are
    torch's ``exp`` of the torch loop's block views, block by block (a vectorized exp may round a value
    differently in another layout), joined; the scale is applied at the end, as torch's elementwise
    products."""
    dtype = q.dtype
    batch, n_steps, heads, dk = q.shape
    dv = v.shape[-1]
    qc, kc, vc = (x.contiguous() for x in (q, k, v))
    o = torch.empty((batch, n_steps, heads, dv), dtype=dtype)
    state = torch.zeros((batch, heads, dk, dv), dtype=dtype) if h0 is None else h0.contiguous().clone()
    # exp(g) of each block of the torch loop, as there, then one launch for the whole segment
    steps = _loop.block_length(n_steps, batch * heads * dk * dv)
    parts = [torch.exp(g[:, start:stop].transpose(0, 1)) for start, stop in _loop.blocks(n_steps, steps)]
    decay = torch.cat(parts) if len(parts) > 1 else parts[0] if parts else g.new_empty((0, batch, heads, g.shape[-1]))
    del parts
    if not with_trace:
        jit.gated_block(decay, qc, kc, vc, 0, state, o)
        return o.mul_(scale), state, None
    states = (state, state.abs(), *(torch.zeros_like(state) for _ in range(3)), state.abs())  # S H W D Y peak
    p_states = tuple(torch.zeros((batch, heads, g.shape[-1]), dtype=dtype) for _ in range(2))
    outs = tuple(torch.empty_like(o) for _ in range(5))
    lam, chunk_first = chunk if chunk is not None else (None, None)
    jit.gated_trace_block(decay, qc, kc, vc, extra, lam, chunk_first, 0, states, p_states, (o, *outs))
    mag, growth, chunk_o, state_peak, decay_peak = outs
    o.mul_(scale)
    mag.mul_(abs(scale))
    growth.mul_(abs(scale)).add_(dk * mag)
    chunk_o.mul_(abs(scale))
    _, mag_state, growth_state, _, y_state, entry_peak = states
    final = Trace(out=state, magnitude=mag_state, growth=growth_state, state_peak=entry_peak,
                  decay_peak=p_states[1][..., None].expand_as(state).clone())
    out = Trace(out=o, magnitude=mag, growth=growth, state_peak=state_peak, decay_peak=decay_peak)
    trace = GatedTrace(out=out, final_state=final, chunk_growth=chunk_o if chunk is not None else None,
                       final_state_chunk_growth=y_state if chunk is not None else None)
    return o, state, trace


_FIELDS = ("out", "magnitude", "growth", "state_peak", "decay_peak")


def _join(parts: list[GatedTrace], out_dim: int, *, finals: str) -> GatedTrace:
    """The traces of pieces run one after another, as one: the outputs' fields joined along ``out_dim``
    (1: consecutive pieces of time, 0: batch rows), the final states' stacked (``finals="cat"``: one
    row per piece) or the last piece's (``"last"``: the pieces are one sequence's runs)."""
    def cat(items, dim):
        items = list(items)
        return None if items[0] is None else torch.cat(items, dim=dim)

    out = Trace(**{name: cat((getattr(p.out, name) for p in parts), out_dim) for name in _FIELDS})
    if finals == "last":
        final, final_chunk = parts[-1].final_state, parts[-1].final_state_chunk_growth
    else:
        final = Trace(**{name: cat((getattr(p.final_state, name) for p in parts), 0) for name in _FIELDS})
        final_chunk = cat((p.final_state_chunk_growth for p in parts), 0)
    return GatedTrace(out=out, final_state=final, chunk_growth=cat((p.chunk_growth for p in parts), out_dim),
                      final_state_chunk_growth=final_chunk)


def _gated(q, k, v, g, scale, h0, segments, *, dtype, device, with_trace, chunk_size=None, extra=None,
           chunk=None):
    """The gated recurrence on (batch, T, ...) inputs, split into independent segments.

    ``segments``: None (each batch row is one sequence from ``h0``), or a list with, per batch row, the
    (start, stop) runs that restart the state; the first run of a row starts from that row of ``h0``,
    every later one from zeros (ssd's seq_idx; fla's cu_seqlens goes through `_run_fla`, one call per
    sequence, since its initial states are per sequence). ``extra``: `_segment`'s, for the whole
    (batch, T). ``chunk``: the chunk term's `_chunk_mass` when the caller cut the rows out of longer ones
    (default: computed here, for chunks in either blocking). Returns (o, final states, GatedTrace or None).
    """
    q, k, v, g = (x.to(device=device, dtype=dtype) for x in (q, k, v, g))
    h0 = None if h0 is None else h0.to(device=device, dtype=dtype)
    g_abs = g.abs()
    if segments is None:
        if chunk is None and with_trace:
            chunk = _chunk_mass(g_abs, chunk_size)
        return _segment(q, k, v, g, h0, scale, chunk, with_trace=with_trace, extra=extra)
    outs, finals, rows = [], [], []
    for b, runs in enumerate(segments):
        pieces, parts, state = [], [], None
        for i, (t0, t1) in enumerate(runs):
            start = h0[b:b + 1] if (h0 is not None and i == 0) else None
            chunk = _chunk_mass(g_abs[b:b + 1], chunk_size, t0, t1) if with_trace else None
            sl = (slice(b, b + 1), slice(t0, t1))
            part_extra = None if extra is None else tuple(e[sl] for e in extra)
            o_seg, state, part = _segment(q[sl], k[sl], v[sl], g[sl], start, scale, chunk, with_trace=with_trace,
                                          extra=part_extra)
            pieces.append(o_seg)
            parts.append(part)
        outs.append(torch.cat(pieces, dim=1))
        finals.append(state)
        if with_trace:
            rows.append(_join(parts, 1, finals="last"))
    trace = _join(rows, 0, finals="cat") if with_trace else None
    return torch.cat(outs), torch.cat(finals), trace


def _run_fla(q, k, v, g, scale, h0, segments, *, dtype, device, with_trace, chunk_size=None, chunks=None,
             extra=None):
    """simple_gla/gla: cu_seqlens sequences are cut out of the single row and run as one row each
    (their own initial states, their own chunks, one final-state row each). ``chunks``: the chunk term's
    `_chunk_mass` per sequence when the caller forms it (`gla_adjoint_trace`); ``extra``: `_segment`'s."""
    if segments is None:
        return _gated(q, k, v, g, scale, h0, None, dtype=dtype, device=device, with_trace=with_trace,
                      chunk_size=chunk_size, chunk=None if chunks is None else chunks[0], extra=extra)
    outs, finals, traces = [], [], []
    for i, (t0, t1) in enumerate(segments):
        start = None if h0 is None else h0[i:i + 1]
        chunk = None if not with_trace else chunks[i] if chunks is not None else _chunk_mass(g.abs(), chunk_size, t0, t1)
        o, final, trace = _gated(q[:, t0:t1], k[:, t0:t1], v[:, t0:t1], g[:, t0:t1], scale, start, None,
                                 dtype=dtype, device=device, with_trace=with_trace, chunk_size=chunk_size,
                                 chunk=chunk, extra=None if extra is None else tuple(e[:, t0:t1] for e in extra))
        outs.append(o)
        finals.append(final)
        traces.append(trace)
    return torch.cat(outs, dim=1), torch.cat(finals), (_join(traces, 1, finals="cat") if with_trace else None)


# ----------------------------------------------------------------------------------------------------
# simple_gla and gla


def _fla(q, k, v, g, scale, initial_state, output_final_state, cu_seqlens, compute_dtype, device, *, per_key):
    q, k, v, g4, scale_, h0, final, segments = _check_gla(q, k, v, g, scale, initial_state, output_final_state,
                                                          cu_seqlens, per_key=per_key)
    dtype = _validate.floating_dtype("compute_dtype", compute_dtype)
    o, state, _ = _run_fla(q, k, v, g4, scale_, h0, segments, dtype=dtype, device=device, with_trace=False)
    return o, (state if final else None)


def simple_gla(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    cu_seqlens: torch.Tensor | None = None,
    *,
    compute_dtype: torch.dtype = torch.float64,
    device: str | torch.device = "cpu",
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Simple GLA (one log-decay per head and step), fla's layout; definition in the module docstring.

    q, k (batch, T, heads, K); v (batch, T, heads, V); g (batch, T, heads); initial_state (batch, heads,
    K, V), or (sequences, heads, K, V) with cu_seqlens. Every operation is rounded in ``compute_dtype`` on
    ``device``. Returns ``(o, final_state)``: o (batch, T, heads, V) and the final state when
    ``output_final_state`` else None.
    """
    return _fla(q, k, v, g, scale, initial_state, output_final_state, cu_seqlens, compute_dtype, device,
                per_key=False)


def gla(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    cu_seqlens: torch.Tensor | None = None,
    *,
    compute_dtype: torch.dtype = torch.float64,
    device: str | torch.device = "cpu",
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """GLA (one log-decay per key channel), fla's layout: `simple_gla` with g (batch, T, heads, K)."""
    return _fla(q, k, v, g, scale, initial_state, output_final_state, cu_seqlens, compute_dtype, device,
                per_key=True)


def _fla_trace(q, k, v, g, scale, initial_state, output_final_state, cu_seqlens, chunk_size, *, per_key,
               input_rounding=None):
    q, k, v, g4, scale_, h0, final, segments = _check_gla(q, k, v, g, scale, initial_state, output_final_state,
                                                          cu_seqlens, per_key=per_key)
    _, _, trace = _run_fla(q, k, v, g4, scale_, h0, segments, dtype=torch.float64, device="cpu", with_trace=True,
                           chunk_size=_chunk_size(chunk_size), extra=input_rounding)
    assert trace is not None
    if not final:
        trace = replace(trace, final_state=None, final_state_chunk_growth=None)
    return trace


def simple_gla_trace(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    cu_seqlens: torch.Tensor | None = None,
    *,
    chunk_size: int | None = None,
    input_rounding: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> GatedTrace:
    """`simple_gla`'s float64 output and companions (`GatedTrace`; final state's when
    ``output_final_state``; the chunk term for chunks of ``chunk_size`` when given). ``input_rounding``: (e_a,
    e_kv), each (batch, T, heads, 1), the rounding of each step's log-decay (its argument, relative to the decay)
    and of its ``k^T v`` beyond one u each, in units of u, where a caller formed them from other inputs (SSD's
    ``dt' A`` and ``dt' x``, `ssd_input_rounding`)."""
    return _fla_trace(q, k, v, g, scale, initial_state, output_final_state, cu_seqlens, chunk_size, per_key=False,
                      input_rounding=input_rounding)


def gla_trace(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    cu_seqlens: torch.Tensor | None = None,
    *,
    chunk_size: int | None = None,
) -> GatedTrace:
    """`gla`'s float64 output and companions, as `simple_gla_trace`."""
    return _fla_trace(q, k, v, g, scale, initial_state, output_final_state, cu_seqlens, chunk_size, per_key=True)


def gla_adjoint_trace(
    a: torch.Tensor,
    b: torch.Tensor,
    c: torch.Tensor,
    g: torch.Tensor,
    scale: float,
    cu_seqlens: torch.Tensor | None = None,
    *,
    chunk_size: int | None = None,
    per_key: bool = False,
    with_final: bool = False,
    decay_rounding: torch.Tensor | None = None,
) -> Trace | tuple[Trace, Trace]:
    """The trace, in forward time, of the gated recurrence an adjoint runs backwards (float64 CPU):

        Z_t = diag(exp(g_{t+1})) Z_{t+1} + b_t^T c_t   (Z = 0 after each sequence's last step),   out_t = scale a_t Z_t

    with g (batch, T, heads) or, ``per_key``, (batch, T, heads, K) gating the channels of b. Simple GLA's dk is
    this with (a, b, c) = (v, cotangent, q) and its dv with (k, q, cotangent), GLA's dv too (`harness.families.
    simple_gla`). It is `simple_gla_trace` / `gla_trace` of the time-reversed inputs with the decays one step
    later, flipped back, except for the chunk term (``chunk_size``): a chunked backward forms its decays
    ``exp(G_t - G_s)`` from the cumulative sums of its forward's chunks, which start at the chunks' first steps
    in forward time, so every step of an adjoint is charged the mass of its whole forward chunk (of both
    steps' decays, ``max(|g_t|, |g_{t+1}|)``), and the state passed back into a chunk the mass of the chunk
    after it. A reversed blocking would charge a step near a chunk's end the few steps after it: a correct
    chunked backward erred 5 times that at t = 156 of a 158-step chunk (strong decay, float64).

    ``decay_rounding``: e_a (batch, T, heads, 1), the rounding of each step's log-decay as `simple_gla_trace`'s
    ``input_rounding`` (it moves with the decays, one step later).

    ``with_final``: also the trace of ``Z_0`` of each sequence (its state after its first step, (sequences or
    batch, heads, width of b, width of c), the chunk term included), from which an initial state's gradient is
    formed."""
    a, b, c, g4, scale_, _, _, segments = _check_gla(a, b, c, g, scale, None, False, cu_seqlens, per_key=per_key)
    length = a.shape[1]
    bounds = [(0, length)] if segments is None else segments
    g_next = torch.zeros_like(g4)
    e_next = None if decay_rounding is None else torch.zeros_like(decay_rounding)
    for t0, t1 in bounds:
        g_next[:, t0:t1 - 1] = g4[:, t0 + 1:t1]
        if e_next is not None:
            e_next[:, t0:t1 - 1] = decay_rounding[:, t0 + 1:t1]
    extra = None if e_next is None else (e_next.flip(1), torch.zeros_like(e_next))
    chunks = None
    if chunk_size is not None:
        mass = torch.maximum(g4.abs(), g_next.abs())
        chunks = []
        for t0, t1 in reversed(bounds):
            lam, first = _chunk_mass(mass, _chunk_size(chunk_size), t0, t1, whole=True)
            last = torch.cat([first[1:], first.new_ones(1)])  # a forward chunk's last step starts a reversed one
            chunks.append((lam.flip(1), last.flip(0)))
    flipped = None if segments is None else [(length - t1, length - t0) for t0, t1 in reversed(bounds)]
    _, _, trace = _run_fla(a.flip(1), b.flip(1), c.flip(1), g_next.flip(1), scale_, None, flipped,
                           dtype=torch.float64, device="cpu", with_trace=True, chunk_size=chunk_size, chunks=chunks,
                           extra=extra)
    assert trace is not None
    out = trace.out if chunks is None else replace(trace.out, growth=trace.out.growth + trace.chunk_growth,
                                                    chunk_growth=trace.chunk_growth)
    if not with_final:
        return out.flipped(1)
    final = trace.final_state
    if chunks is not None and trace.final_state_chunk_growth is not None:
        final = replace(final, growth=final.growth + trace.final_state_chunk_growth,
                        chunk_growth=trace.final_state_chunk_growth)
    return out.flipped(1), final if segments is None else final.flipped(0)  # the sequences in forward order


# ----------------------------------------------------------------------------------------------------
# ssd (Mamba-2)


def ssd_input_rounding(pre, dt, log_decay, biased, softplus):
    """(e_a, e_kv), ssd's extra growth inputs in units of u (module docstring): the relative error of
    dt' from ``dt + dt_bias`` (1, times softplus's condition ``|x| sigmoid(x) / softplus(x)``) and from
    softplus itself (2), then one rounding more for ``dt' * A`` (scaled by |dt' A|: an absolute error in
    exp's argument is a relative one of its value) and for ``dt' * x``."""
    rel = torch.zeros_like(dt)
    if biased:
        if softplus:
            cond = pre.abs() * torch.sigmoid(pre) / dt
            rel = rel + torch.where(dt > 0, cond, torch.ones_like(cond))
        else:
            rel = rel + 1.0
    if softplus:
        rel = rel + 2.0
    e_kv = (rel + 1.0)[..., None]
    return log_decay.abs() * e_kv, e_kv


def _ssd_run(args, *, dtype, device, with_trace, chunk_size=None):
    """ssd through `_gated` (the mapping in the module docstring); returns (y, final states, GatedTrace)."""
    x, dt, A, B, C, D, z, dt_bias, softplus, h0, rows, (lo, hi) = args
    x, dt, A, B, C = (t.to(device=device, dtype=dtype) for t in (x, dt, A, B, C))
    heads, groups = x.shape[2], B.shape[2]
    if dt_bias is not None:
        dt = dt + dt_bias.to(device=device, dtype=dtype)
    pre = dt
    if softplus:
        dt = F.softplus(dt, beta=1.0, threshold=SOFTPLUS_THRESHOLD)
    dt = dt.clamp(min=lo, max=hi)
    log_decay = (dt * A)[..., None]  # (batch, T, heads, 1)
    k = B.repeat_interleave(heads // groups, dim=2)  # head h reads group h // (heads // groups)
    q = C.repeat_interleave(heads // groups, dim=2)
    v = dt[..., None] * x
    start = None if h0 is None else h0.transpose(-1, -2)  # h (P, N) is S^T
    extra = ssd_input_rounding(pre, dt, log_decay, dt_bias is not None, softplus) if with_trace else None
    o, state, trace = _gated(q, k, v, log_decay, 1.0, start, rows, dtype=dtype, device=device,
                             with_trace=with_trace, chunk_size=chunk_size, extra=extra)
    final = state.transpose(-1, -2)
    y = o
    if D is not None:
        Dv = D.to(device=device, dtype=dtype)
        dx = x * (Dv[:, None] if Dv.ndim == 1 else Dv)
        y = y + dx
    gate = F.silu(z.to(device=device, dtype=dtype)) if z is not None else None
    y_out = y if gate is None else y * gate
    if not with_trace:
        return y_out, final, None
    t = trace.out
    mag, growth = t.magnitude, t.growth
    if D is not None:
        mag, growth = mag + dx.abs(), growth + dx.abs()
    state_peak = t.state_peak
    chunk_o = trace.chunk_growth
    if gate is not None:
        state_peak = torch.maximum(state_peak, torch.cummax(mag, dim=1).values)  # the ungated terms too
        g_abs = gate.abs()
        mag, growth = mag * g_abs + y_out.abs(), growth * g_abs + y_out.abs()
        chunk_o = None if chunk_o is None else chunk_o * g_abs
    elif D is not None:
        state_peak = torch.maximum(state_peak, torch.cummax(mag, dim=1).values)
    out = Trace(out=y_out, magnitude=mag, growth=growth, state_peak=state_peak, decay_peak=t.decay_peak)
    fs = trace.final_state
    final_trace = Trace(**{name: getattr(fs, name).transpose(-1, -2) for name in
                           ("out", "magnitude", "growth", "state_peak", "decay_peak")})
    final_chunk = None if trace.final_state_chunk_growth is None else trace.final_state_chunk_growth.transpose(-1, -2)
    return y_out, final, GatedTrace(out=out, final_state=final_trace, chunk_growth=chunk_o,
                                    final_state_chunk_growth=final_chunk)


def ssd(
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    chunk_size: int | None = None,
    D: torch.Tensor | None = None,
    z: torch.Tensor | None = None,
    dt_bias: torch.Tensor | None = None,
    dt_softplus: bool = False,
    initial_states: torch.Tensor | None = None,
    seq_idx: torch.Tensor | None = None,
    return_final_states: bool = False,
    dt_limit: tuple[float, float] = (0.0, math.inf),
    *,
    compute_dtype: torch.dtype = torch.float64,
    device: str | torch.device = "cpu",
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Mamba-2's SSD in mamba-ssm's ``mamba_chunk_scan_combined`` layout (module docstring).

    x (batch, T, heads, P); dt (batch, T, heads); A (heads,); B, C (batch, T, groups, N); D (heads,) or
    (heads, P); z like x; dt_bias (heads,); initial_states (batch, heads, P, N); seq_idx (batch, T).
    ``chunk_size`` is accepted and ignored (it is a chunked kernel's blocking). Returns y (batch, T,
    heads, P), or ``(y, final_states)`` (batch, heads, P, N) when ``return_final_states``.
    """
    args = _check_ssd(x, dt, A, B, C, chunk_size, D, z, dt_bias, dt_softplus, initial_states, seq_idx, dt_limit)
    final = _flag("return_final_states", return_final_states)
    dtype = _validate.floating_dtype("compute_dtype", compute_dtype)
    y, states, _ = _ssd_run(args, dtype=dtype, device=device, with_trace=False)
    return (y, states) if final else y


def ssd_trace(
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    chunk_size: int | None = None,
    D: torch.Tensor | None = None,
    z: torch.Tensor | None = None,
    dt_bias: torch.Tensor | None = None,
    dt_softplus: bool = False,
    initial_states: torch.Tensor | None = None,
    seq_idx: torch.Tensor | None = None,
    return_final_states: bool = False,
    dt_limit: tuple[float, float] = (0.0, math.inf),
) -> GatedTrace:
    """`ssd`'s float64 output and companions (`GatedTrace`); the chunk term is for chunks of
    ``chunk_size`` along each row when it is given. The final state's trace when ``return_final_states``."""
    args = _check_ssd(x, dt, A, B, C, chunk_size, D, z, dt_bias, dt_softplus, initial_states, seq_idx, dt_limit)
    final = _flag("return_final_states", return_final_states)
    _, _, trace = _ssd_run(args, dtype=torch.float64, device="cpu", with_trace=True, chunk_size=_chunk_size(chunk_size))
    assert trace is not None
    if not final:
        trace = replace(trace, final_state=None, final_state_chunk_growth=None)
    return trace
