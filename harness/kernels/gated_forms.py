"""In-tree gated-decay kernels (simple GLA and GLA in fla's layout, Mamba-2's SSD in mamba-ssm's) in
three forms, pure torch.

All forms compute, per batch row and head, with ``a_t = exp(g_t)`` (one per head for simple_gla, one per
key channel for gla) and a K x V state S::

    S_t = diag(a_t) S_{t-1} + k_t^T v_t,     o_t = scale * q_t S_t,     S_{-1} = initial_state or 0

with fla's signature ``fn(q, k, v, g, scale=None, initial_state=None, output_final_state=False,
cu_seqlens=None, chunk_size=64) -> (o, final_state or None)``. They differ only in evaluation order,
and so in rounding and range, which is what the harness measures:

- `*_recurrent`: the loop above, one step per t;
- `*_chunk` (the stable chunk form): within a chunk of c steps, with ``G_t = g_1 + ... + g_t`` the
  cumulative log-decay from the chunk's start, ``o_t = sum_{s<=t} (q_t . (k_s exp(G_t - G_s))) v_s +
  (q_t exp(G_t)) S_prev`` and ``S = diag(exp(G_c)) S_prev + sum_s (k_s exp(G_c - G_s))^T v_s``. Every
  exponent is <= 0 when g <= 0 (a difference of cumulative sums, masked to s <= t before the exp), so
  nothing overflows; the exponents carry the rounding of two cumulative sums (``reference_impls.
  gated_decay``'s chunk term bounds it).
- `*_chunk_cumprod`: the same algebra factored through the cumulative product, ``q_t exp(G_t)`` times
  ``k_s exp(-G_s)``: one matmul instead of a masked exp per pair, and ``exp(-G_s)`` overflows once the
  chunk's cumulative log-decay passes the dtype's exp range (-88.7 in float32: five steps of -20). Then
  ``0 * inf = NaN`` in the kernel's own intermediates while the exact state and output are small: a
  kernel error of the form (``divergent``), not an input outside the dtype's range. It is in-tree to
  show exactly that (issue 14); it is correct under mild decay.

All arithmetic is in the input dtype (the cumulative sums too); the query is scaled first, as fla does.
``cu_seqlens`` (batch 1, fla's convention) runs each packed sequence from its own initial state (row i
of ``initial_state``) and returns one final-state row per sequence; chunks restart at each sequence.
Inputs are never modified; everything is plain torch, so autograd works.

`ssd_recurrent` and `ssd_chunk` are Mamba-2's SSD with mamba-ssm's ``mamba_chunk_scan_combined``
signature, run through the recurrent and stable chunk forms by the oracle's mapping (``g = dt' A``,
``k = B``, ``v = dt' x``, ``q = C``); dt's bias, softplus and clamp at 0, the grouping, D, z and the
resets at ``seq_idx`` changes happen inside them, as in the real kernels.
"""

from __future__ import annotations

import math
import operator

import torch

from harness.errors import InvalidArgument
from harness.kernels.contract import Capabilities, Family, KernelSpec

__all__ = [
    "ssd_chunk",
    "ssd_recurrent",
    "gla_chunk",
    "gla_chunk_cumprod",
    "gla_recurrent",
    "simple_gla_chunk",
    "simple_gla_chunk_cumprod",
    "simple_gla_recurrent",
    "KERNELS",
    "DIVERGENT_BY_DESIGN",
]

#: fla's default chunk size.
DEFAULT_CHUNK = 64


# ----------------------------------------------------------------------------------------------------
# Arguments and sequences


def _positive_int(name: str, value: object) -> int:
    try:
        if isinstance(value, bool):
            raise TypeError
        n = operator.index(value)
    except TypeError:
        n = 0
    if n < 1:
        raise InvalidArgument(f"{name}={value!r} must be a positive int; e.g. {name}=64")
    return n


def _check(q, k, v, g, *, per_key: bool) -> torch.Tensor:
    """Shapes as fla's layout asks; returns g as (batch, T, heads, Kg), Kg = K (gla) or 1 (simple_gla)."""
    if q.dim() != 4 or k.shape != q.shape or v.dim() != 4 or v.shape[:3] != q.shape[:3]:
        raise InvalidArgument(f"q.shape={tuple(q.shape)!r}, k.shape={tuple(k.shape)!r}, v.shape={tuple(v.shape)!r}; "
                              "expected q, k (batch, T, heads, K) and v (batch, T, heads, V)")
    want = tuple(q.shape) if per_key else tuple(q.shape[:3])
    if tuple(g.shape) != want:
        what = "(batch, T, heads, K)" if per_key else "(batch, T, heads)"
        raise InvalidArgument(f"g.shape={tuple(g.shape)!r}; expected {what} = {want}")
    return g if per_key else g[..., None]


def _sequences(q, initial_state, cu_seqlens):
    """[(t0, t1, initial state rows or None)]: the whole batch, or one entry per packed sequence."""
    batch, length = q.shape[:2]
    if cu_seqlens is None:
        return [(0, length, initial_state)]
    bounds = [int(c) for c in cu_seqlens]
    if batch != 1 or len(bounds) < 2 or bounds[0] != 0 or bounds[-1] != length or any(
            b < a for a, b in zip(bounds, bounds[1:])):
        raise InvalidArgument(f"cu_seqlens={bounds} with q.shape={tuple(q.shape)}; expected batch 1 and "
                              f"non-decreasing boundaries from 0 to T={length}")
    return [(t0, t1, None if initial_state is None else initial_state[i:i + 1])
            for i, (t0, t1) in enumerate(zip(bounds[:-1], bounds[1:]))]


def _run(form, q, k, v, g, scale, initial_state, output_final_state, cu_seqlens, chunk_size, *, per_key):
    """Check, split into sequences, run ``form(q, k, v, g4, scale, h0, chunk_size) -> (o, S)`` on each."""
    g4 = _check(q, k, v, g, per_key=per_key)
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    chunk_size = _positive_int("chunk_size", chunk_size)
    if initial_state is not None:
        initial_state = initial_state.to(q.dtype)
    outs, finals = [], []
    for t0, t1, h0 in _sequences(q, initial_state, cu_seqlens):
        o, state = form(q[:, t0:t1], k[:, t0:t1], v[:, t0:t1], g4[:, t0:t1], scale, h0, chunk_size)
        outs.append(o)
        finals.append(state)
    o = outs[0] if len(outs) == 1 else torch.cat(outs, dim=1)
    final = finals[0] if len(finals) == 1 else torch.cat(finals)
    return o, (final if output_final_state else None)


def _zero_state(q, v, h0):
    batch, _, heads, dk = q.shape
    if h0 is not None:
        return h0
    return torch.zeros(batch, heads, dk, v.shape[-1], dtype=q.dtype, device=q.device)


# ----------------------------------------------------------------------------------------------------
# The forms: (q, k, v, g (batch, T, heads, Kg), scale, h0 or None, chunk_size) -> (o, final state)


def recurrent_form(q, k, v, g, scale, h0, chunk_size=None):
    """One step per t: ``S = exp(g_t) S + k_t^T v_t``, ``o_t = (scale q_t) S``."""
    state = _zero_state(q, v, h0)
    qs = q * scale
    decay = torch.exp(g)[..., None]  # (batch, T, heads, Kg, 1)
    outs = []
    for t in range(q.shape[1]):
        state = decay[:, t] * state + k[:, t, :, :, None] * v[:, t, :, None, :]
        outs.append((qs[:, t, :, None, :] @ state).squeeze(-2))
    if not outs:
        return v.new_zeros(q.shape[0], 0, q.shape[2], v.shape[-1]), state
    return torch.stack(outs, dim=1), state


def chunk_decays(g_chunk: torch.Tensor) -> torch.Tensor:
    """The cumulative log-decay from the chunk's start, ``G_t = g_1 + ... + g_t`` (inclusive), (batch,
    heads, n, Kg) in the input dtype."""
    return g_chunk.cumsum(dim=2)


#: Elements of the largest (query rows x keys x decay channels) block `chunk_output` forms at once: a
#: chunk as long as the sequence (a legal chunk size) would otherwise form an (n, n, K) tensor, 116 GB at
#: n = 13,809 with K = 64, and the kernel would fail for memory where the algorithm is fine.
INTRA_BLOCK_ELEMENTS = 2**24


#: The side of the tiles of a chunk too long for one block: the work within tiles grows with their
#: side (n x side x K exps), the Python loop with n / side; 64 is fla's own chunk size.
TILE_ROWS = 64


def intra_tile_rows(batch: int, heads: int, kg: int) -> int:
    """The largest square (query rows x keys) block `chunk_output` may form at once: its (rows x rows x
    decay channels) elements fit `INTRA_BLOCK_ELEMENTS` (a chunk of the usual sizes fits whole)."""
    return max(1, math.isqrt(INTRA_BLOCK_ELEMENTS // max(1, batch * heads * kg)))


def intra_scores(qc, kc, Gq, Gk, offset: int = 0):
    """``scores[t, s] = sum_i q_t[i] k_s[i] exp(G_t[i] - G_s[i])`` for s <= t, else 0 (stable form), for
    the query rows ``offset .. offset + len(qc)`` of the chunk against its keys ``0 .. len(kc)``: the
    difference is masked to s <= t before the exp, so every exponent is <= 0 for g <= 0."""
    n_q, n_k = qc.shape[2], kc.shape[2]
    t = torch.arange(offset, offset + n_q, device=qc.device)
    causal = t[:, None] >= torch.arange(n_k, device=qc.device)[None, :]
    diff = Gq[:, :, :, None, :] - Gk[:, :, None, :, :]  # (batch, heads, n_q, n_k, Kg)
    decay = torch.exp(torch.where(causal[..., None], diff, torch.full((), -torch.inf, dtype=Gq.dtype,
                                                                      device=Gq.device)))
    if Gq.shape[-1] == 1:
        return (qc @ kc.transpose(-1, -2)) * decay[..., 0]
    return torch.einsum("bhti,bhsi,bhtsi->bhts", qc, kc, decay)


def chunk_output(qc, kc, vc, G, state):
    """A chunk's outputs, stable form: the within-chunk scores times v plus the decayed carried state.

    A chunk too long for one block (`intra_tile_rows`) is the chunk form again, over tiles of
    `TILE_ROWS` within it: each tile's scores against its own keys (`intra_scores`, in the chunk's
    cumulative decays ``G``), plus the keys before it through their running state (`chunk_state` in the
    decays relative to ``G_r``, the step before the tile), read as ``(q_t exp(G_t - G_r)) S``. Every
    exponent is <= 0 for g <= 0, memory is one tile whatever the chunk size, and the work is linear in
    it. A chunk of the usual sizes is one block and computed as before, bit for bit.
    """
    batch, heads, n, kg = G.shape
    largest = intra_tile_rows(batch, heads, kg)
    inter = (qc * torch.exp(G)) @ state
    if largest >= n:
        return intra_scores(qc, kc, G, G) @ vc + inter
    tile = min(largest, TILE_ROWS)
    out = torch.empty_like(inter)
    before, ref = torch.zeros_like(state), torch.zeros_like(G[:, :, :1])  # nothing before the first tile
    for a in range(0, n, tile):
        q_t, k_t, v_t, G_t = (x[:, :, a:a + tile] for x in (qc, kc, vc, G))
        out[:, :, a:a + tile] = intra_scores(q_t, k_t, G_t, G_t) @ v_t + (q_t * torch.exp(G_t - ref)) @ before
        before, ref = chunk_state(k_t, v_t, G_t - ref, before), G_t[:, :, -1:]
    return out.add_(inter)


def chunk_state(kc, vc, G, state):
    """The state after the chunk: ``diag(exp(G_last)) S + sum_s (k_s exp(G_last - G_s))^T v_s``."""
    last = G[:, :, -1:]  # (batch, heads, 1, Kg)
    return torch.exp(last).transpose(-1, -2) * state + (kc * torch.exp(last - G)).transpose(-1, -2) @ vc


def chunks(q, k, v, g, scale, chunk_size):
    """Yield ``(t0, t1, qc, kc, vc, G)`` per chunk, heads first: qc (batch, heads, n, K) pre-scaled."""
    qs = q * scale
    for t0 in range(0, q.shape[1], chunk_size):
        t1 = min(t0 + chunk_size, q.shape[1])
        qc, kc, vc, gc = (x[:, t0:t1].transpose(1, 2) for x in (qs, k, v, g))
        yield t0, t1, qc, kc, vc, chunk_decays(gc)


def _output(q, v) -> torch.Tensor:
    """The chunk forms' output, heads first (batch, heads, T, V), filled chunk by chunk in place.

    Not a list of chunk outputs joined at the end: those small tensors, kept while each chunk's large
    temporaries come and go, split the allocator's free memory so that no later temporary fits in it, and
    the process grew by a chunk's temporaries per chunk (glibc on CPU: 11 GB for the nightly
    calibration's one chunk of L = 28,737 in 449 tiles, killed for memory; 0.8 GB filled in place)."""
    return v.new_empty(q.shape[0], q.shape[2], q.shape[1], v.shape[-1])


def formed_chunk(chunk_size: int, batch: int, heads: int, kg: int) -> int:
    """The chunk `chunk_form` runs: ``chunk_size`` when one chunk fits one block (`intra_tile_rows`: the
    usual sizes, computed as before bit for bit), else sub-chunks of `TILE_ROWS`. The algebra is the tiled
    chunk's (`chunk_output`), but the cumulative decays restart at each sub-chunk: a whole long chunk's
    ``cumsum(g)`` in the input dtype passes float16's max (65,504) under strong decay, and the differences
    of two of them are then ``inf - inf = NaN`` where the exact output is in range (the nightly
    calibration: chunk 4,811 of L = 9,200, ``strong_decay``, float16, NaN from the second chunk on).
    `chunk_output`'s own tiling stays for callers that hand it a whole long chunk (the planted chunk
    bugs of the tests, whose faults act per declared chunk): their memory stays one tile."""
    largest = intra_tile_rows(batch, heads, kg)
    return chunk_size if chunk_size <= largest else min(largest, TILE_ROWS)


def leaves_the_range(g_chunk: torch.Tensor, step: int) -> bool:
    """Whether a chunk formed in steps of ``step`` could take its cumulative log-decay ``cumsum(g)`` past its
    dtype's largest finite value: the chunk's mass ``sum |g|``, in float32, past half of it. Only float16
    (max 65,504) can: a chunk of 3,120 steps of strong decay (batch 1 x heads 1, formed whole: it fits one
    block) went to inf, and the next chunk's differences to ``inf - inf = NaN`` (the nightly calibration,
    seed 42, L = 6,241), where the exact output is in range."""
    if g_chunk.dtype != torch.float16 or step <= TILE_ROWS:
        return False
    return float(g_chunk.detach().float().abs().sum(dim=1).max()) > torch.finfo(torch.float16).max / 2


def chunk_form(q, k, v, g, scale, h0, chunk_size):
    """The stable chunk form (module docstring); a long chunk in sub-chunks from its own start
    (`formed_chunk`), and so is a float16 chunk whose cumulative log-decay could leave the range
    (`leaves_the_range`)."""
    state = _zero_state(q, v, h0)
    o = _output(q, v)
    step = formed_chunk(chunk_size, q.shape[0], q.shape[2], g.shape[-1])
    for c0 in range(0, q.shape[1], chunk_size):
        part = [x[:, c0:c0 + chunk_size] for x in (q, k, v, g)]
        # a chunk whose sums could overflow restarts them in sub-chunks, as a chunk too long for one block does
        sub = TILE_ROWS if leaves_the_range(part[3], step) else step
        for t0, t1, qc, kc, vc, G in chunks(*part, scale, sub):
            o[:, :, c0 + t0:c0 + t1] = chunk_output(qc, kc, vc, G, state)
            state = chunk_state(kc, vc, G, state)
    return o.transpose(1, 2), state


def chunk_cumprod_form(q, k, v, g, scale, h0, chunk_size):
    """The chunk form through the cumulative product: ``(q exp(G)) (k exp(-G))^T``, masked after the
    product; ``exp(-G)`` is unbounded (module docstring)."""
    state = _zero_state(q, v, h0)
    o = _output(q, v)
    for t0, t1, qc, kc, vc, G in chunks(q, k, v, g, scale, chunk_size):
        n = qc.shape[2]
        causal = torch.ones(n, n, dtype=torch.bool, device=qc.device).tril()
        q_dec, k_inv = qc * torch.exp(G), kc * torch.exp(-G)
        scores = (q_dec @ k_inv.transpose(-1, -2)).masked_fill(~causal, 0.0)
        o[:, :, t0:t1] = scores @ vc + q_dec @ state
        state = torch.exp(G[:, :, -1:]).transpose(-1, -2) * (state + k_inv.transpose(-1, -2) @ vc)
    return o.transpose(1, 2), state


# ----------------------------------------------------------------------------------------------------
# The kernels (fla's signatures)


def _kernel(form, per_key: bool, doc: str):
    def kernel(q, k, v, g, scale=None, initial_state=None, output_final_state=False, cu_seqlens=None,
               chunk_size=DEFAULT_CHUNK):
        return _run(form, q, k, v, g, scale, initial_state, output_final_state, cu_seqlens, chunk_size,
                    per_key=per_key)

    kernel.__doc__ = doc
    return kernel


simple_gla_recurrent = _kernel(recurrent_form, False, "simple GLA, one step per t (`recurrent_form`).")
simple_gla_chunk = _kernel(chunk_form, False, "simple GLA, stable chunk form (`chunk_form`).")
simple_gla_chunk_cumprod = _kernel(chunk_cumprod_form, False,
                                   "simple GLA, chunk form through exp(-cumsum) (`chunk_cumprod_form`).")
gla_recurrent = _kernel(recurrent_form, True, "GLA, one step per t (`recurrent_form`).")
gla_chunk = _kernel(chunk_form, True, "GLA, stable chunk form (`chunk_form`).")
gla_chunk_cumprod = _kernel(chunk_cumprod_form, True, "GLA, chunk form through exp(-cumsum) (`chunk_cumprod_form`).")
for _fn, _name in ((simple_gla_recurrent, "simple_gla_recurrent"), (simple_gla_chunk, "simple_gla_chunk"),
                   (simple_gla_chunk_cumprod, "simple_gla_chunk_cumprod"), (gla_recurrent, "gla_recurrent"),
                   (gla_chunk, "gla_chunk"), (gla_chunk_cumprod, "gla_chunk_cumprod")):
    _fn.__name__ = _fn.__qualname__ = _name  # picklable by name (worker processes get kernels by reference)

# ----------------------------------------------------------------------------------------------------
# ssd (Mamba-2, mamba-ssm's layout) through the same forms


def _ssd(form, x, dt, A, B, C, chunk_size=DEFAULT_CHUNK, D=None, z=None, dt_bias=None, dt_softplus=False,
         initial_states=None, seq_idx=None, return_final_states=False):
    """Mamba-2's SSD as the simple-GLA form ``form`` (the mapping of `reference_impls.gated_decay`), with
    dt's bias, softplus (threshold 20) and clamp at 0, the grouping of B and C, D, z and the resets at
    ``seq_idx`` changes computed here, in the input dtype."""
    if x.dim() != 4 or dt.shape != x.shape[:3] or A.shape != x.shape[2:3] or B.dim() != 4 or B.shape != C.shape \
            or B.shape[:2] != x.shape[:2] or x.shape[2] % B.shape[2]:
        raise InvalidArgument(f"x.shape={tuple(x.shape)}, dt.shape={tuple(dt.shape)}, A.shape={tuple(A.shape)}, "
                              f"B.shape={tuple(B.shape)}, C.shape={tuple(C.shape)}; expected x (batch, T, heads, P), "
                              "dt (batch, T, heads), A (heads,), B, C (batch, T, groups, N), heads divisible by groups")
    chunk_size = _positive_int("chunk_size", chunk_size)
    heads, groups = x.shape[2], B.shape[2]
    if dt_bias is not None:
        dt = dt + dt_bias
    if dt_softplus:
        dt = torch.nn.functional.softplus(dt, beta=1.0, threshold=20.0)
    dt = dt.clamp(min=0.0)
    g = (dt * A)[..., None]
    k, q = (t.repeat_interleave(heads // groups, dim=2) for t in (B, C))
    v = dt[..., None] * x
    h0 = None if initial_states is None else initial_states.to(x.dtype).transpose(-1, -2)
    if seq_idx is None:
        o, state = form(q, k, v, g, 1.0, h0, chunk_size)
    else:
        rows_o, rows_s = [], []
        for b in range(x.shape[0]):
            ids = [int(i) for i in seq_idx[b]]
            cuts = [0] + [t for t in range(1, len(ids)) if ids[t] != ids[t - 1]] + [len(ids)]
            state, pieces = None if h0 is None else h0[b:b + 1], []
            for i, (t0, t1) in enumerate(zip(cuts[:-1], cuts[1:])):
                sl = (slice(b, b + 1), slice(t0, t1))
                o_seg, state = form(q[sl], k[sl], v[sl], g[sl], 1.0, state if i == 0 else None, chunk_size)
                pieces.append(o_seg)
            rows_o.append(torch.cat(pieces, dim=1))
            rows_s.append(state)
        o, state = torch.cat(rows_o), torch.cat(rows_s)
    y = o
    if D is not None:
        y = y + x * (D[:, None] if D.dim() == 1 else D)
    if z is not None:
        y = y * torch.nn.functional.silu(z)
    return (y, state.transpose(-1, -2)) if return_final_states else y


def ssd_recurrent(x, dt, A, B, C, chunk_size=DEFAULT_CHUNK, D=None, z=None, dt_bias=None, dt_softplus=False,
                  initial_states=None, seq_idx=None, return_final_states=False):
    """Mamba-2 SSD, one step per t (`recurrent_form`); ``chunk_size`` is accepted and unused."""
    return _ssd(recurrent_form, x, dt, A, B, C, chunk_size, D, z, dt_bias, dt_softplus, initial_states, seq_idx,
                return_final_states)


def ssd_chunk(x, dt, A, B, C, chunk_size=DEFAULT_CHUNK, D=None, z=None, dt_bias=None, dt_softplus=False,
              initial_states=None, seq_idx=None, return_final_states=False):
    """Mamba-2 SSD, stable chunk form (`chunk_form`); chunks restart at each seq_idx sequence."""
    return _ssd(chunk_form, x, dt, A, B, C, chunk_size, D, z, dt_bias, dt_softplus, initial_states, seq_idx,
                return_final_states)


# scale: the simple_gla / gla forms take fla's ``scale`` (the ssd forms none; their family never passes one)
_STATEFUL = dict(autograd=True, matmuls=True, initial_state=True, final_state=True, varlen=True, scale=True)
RECURRENT_CAPS = Capabilities(**_STATEFUL)
_CARRIED = dict(chunk_states=0, chunk_pairs=0)  # the chunk forms carry one state from chunk to chunk
CHUNK_CAPS = Capabilities(chunk_sizes=(), **_STATEFUL, **_CARRIED)
CUMPROD_WHY = "exp(-cumsum) overflows under strong decay: 0 * inf = NaN where the exact output is small (issue 14)"
CUMPROD_CAPS = Capabilities(chunk_sizes=(), **_STATEFUL, **_CARRIED, square_scores=True,  # (chunk x chunk) scores
                            square_matrices=5,  # measured 3.9-4.0 per batch row and head: no room at four
                            notes=f"divergent by design: {CUMPROD_WHY}")
#: In-tree kernels that are divergent by design where a search goes, and why: the suite expects them found,
#: calibration does not count them among the correct kernels.
DIVERGENT_BY_DESIGN = {"intree.simple_gla_chunk_cumprod": CUMPROD_WHY, "intree.gla_chunk_cumprod": CUMPROD_WHY}


def _spec(name: str, family: Family, fn, caps: Capabilities, description: str) -> KernelSpec:
    return KernelSpec(name=name, family=family, load=lambda: fn, capabilities=caps, description=description)


#: Registered by `harness.kernels.registry` once the gated families are wired (module in BUILTIN_MODULES).
KERNELS: list[KernelSpec] = [
    _spec("intree.simple_gla_recurrent", Family.SIMPLE_GLA, simple_gla_recurrent, RECURRENT_CAPS,
          "simple GLA, a loop over t in the input dtype"),
    _spec("intree.simple_gla_chunk", Family.SIMPLE_GLA, simple_gla_chunk, CHUNK_CAPS,
          "simple GLA, chunk form with exponents of differences of cumulative sums (stable), any chunk size"),
    _spec("intree.simple_gla_chunk_cumprod", Family.SIMPLE_GLA, simple_gla_chunk_cumprod, CUMPROD_CAPS,
          "simple GLA, chunk form through the cumulative product exp(-cumsum): overflows under strong decay"),
    _spec("intree.gla_recurrent", Family.GLA, gla_recurrent, RECURRENT_CAPS,
          "GLA, a loop over t in the input dtype"),
    _spec("intree.gla_chunk", Family.GLA, gla_chunk, CHUNK_CAPS,
          "GLA, chunk form with exponents of differences of cumulative sums (stable), any chunk size"),
    _spec("intree.gla_chunk_cumprod", Family.GLA, gla_chunk_cumprod, CUMPROD_CAPS,
          "GLA, chunk form through the cumulative product exp(-cumsum): overflows under strong decay"),
    _spec("intree.ssd_recurrent", Family.SSD, ssd_recurrent, RECURRENT_CAPS,
          "Mamba-2 SSD (dt bias, softplus, groups, D, z, seq_idx inside), a loop over t in the input dtype"),
    _spec("intree.ssd_chunk", Family.SSD, ssd_chunk, CHUNK_CAPS,
          "Mamba-2 SSD (dt bias, softplus, groups, D, z, seq_idx inside), stable chunk form, any chunk size"),
]
