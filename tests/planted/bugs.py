"""Planted-bug kernels: each is a correct in-tree kernel with one realistic mistake.

Every function below has a family's signature (see `harness.kernels.contract`), returns the right
shape, dtype and device, and is WRONG: its docstring names the mistake and where real kernels made it.
`PLANTED` lists them with what exposes each one (the dtypes and lengths a search must reach); the
tests in ``tests/test_planted_bugs.py`` assert that `harness.api.check` finds every one under the
``ci`` profile, and ``scripts/detection_table.py`` writes the table in ``docs/detection.md``.

The correct parts are taken from the in-tree kernels (`harness.kernels.blelloch`,
`harness.kernels.retnet_forms`) so that each bug is exactly one change away from a kernel that passes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.nn.functional as F

from harness.kernels import gated_forms as gf
from harness.kernels import retnet_forms as rf
from harness.kernels.blelloch import _expand_bc, blelloch_linear_scan
from harness.kernels.contract import Capabilities, Family, KernelSpec
from harness.problems import Problem

__all__ = ["PlantedBug", "PLANTED", "by_name"]


# ============================================================================================ linear_scan


def scan_pow2_only_downsweep(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Blelloch scan whose sweeps assume a power-of-two length (mamba.py ``pscan``, issue #26).

    The in-place up-sweep / down-sweep of the seed thread: ``int(log2(L))`` levels, each pairing
    ``T = 2 * (size // 2)`` elements. For a power of two this is exact; otherwise the elements left
    over at the end of a level are never combined, so e.g. at L = 3 the last output is ``b_2`` instead
    of ``a_2 h_1 + b_2``. No padding to the next power of two (the in-tree kernel pads with identities).
    """
    A, X = a.clone(), b.clone()
    length = A.shape[-1]
    steps = int(math.log2(length)) if length > 1 else 0
    Aa, Xa = A, X
    for _ in range(steps):  # up-sweep
        T = 2 * (Xa.shape[-1] // 2)
        Aa = Aa[..., :T].unflatten(-1, (T // 2, 2))
        Xa = Xa[..., :T].unflatten(-1, (T // 2, 2))
        Xa[..., 1].add_(Aa[..., 1] * Xa[..., 0])
        Aa[..., 1].mul_(Aa[..., 0])
        Aa, Xa = Aa[..., 1], Xa[..., 1]
    for k in range(steps - 1, -1, -1):  # down-sweep
        Aa, Xa = A[..., 2**k - 1 : length : 2**k], X[..., 2**k - 1 : length : 2**k]
        T = 2 * (Xa.shape[-1] // 2)
        Aa = Aa[..., :T].unflatten(-1, (T // 2, 2))
        Xa = Xa[..., :T].unflatten(-1, (T // 2, 2))
        Xa[..., 1:, 0].add_(Aa[..., 1:, 0] * Xa[..., :-1, 1])
        Aa[..., 1:, 0].mul_(Aa[..., :-1, 1])
    return X


#: Block size and the number of block carries `scan_drops_carry_after_block_8` keeps.
CARRY_BLOCK = 64
CARRY_SLOTS = 8


def scan_drops_carry_after_block_8(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Blocked scan (blocks of 64) whose carry buffer has 8 slots: blocks 8, 9, ... start from zero.

    Each block is scanned locally (by the correct Blelloch scan) and fixed up with the carry of the
    blocks before it, ``h_t = local_t + (a_{start} ... a_t) * carry``; the carries live in a buffer
    sized for 8 blocks (512 steps), and a block past it reads a zero. Exact for L <= 512; from t = 512
    on the state forgets everything before it. Found only by a search that reaches L > 512.
    """
    length = a.shape[-1]
    out = []
    carry = torch.zeros_like(b[..., :1])
    for i, start in enumerate(range(0, length, CARRY_BLOCK)):
        ab, bb = a[..., start : start + CARRY_BLOCK], b[..., start : start + CARRY_BLOCK]
        local = blelloch_linear_scan(ab, bb)
        decay = torch.cumprod(ab, dim=-1)
        slot = carry if i < CARRY_SLOTS else torch.zeros_like(carry)  # the buffer ends at slot 7
        h = local + decay * slot
        out.append(h)
        carry = h[..., -1:]
    return torch.cat(out, dim=-1)


def scan_batch_flattened(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """A scan that is right only for batch 1: batch is flattened into the length.

    ``(batch, channels, L) -> (channels, batch * L)`` to call a 2-D scan, so the state of batch item i
    carries over into batch item i + 1. Every test at batch 1 passes.
    """
    batch, channels, length = a.shape
    flat_a = a.permute(1, 0, 2).reshape(channels, batch * length)
    flat_b = b.permute(1, 0, 2).reshape(channels, batch * length)
    h = blelloch_linear_scan(flat_a, flat_b)
    return h.reshape(channels, batch, length).permute(1, 0, 2).contiguous()


def scan_fp16_state(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Sequential scan whose state register is float16 inside a float32 (or float64) kernel.

    ``h`` is stored in half precision between steps (a shared-memory buffer declared ``half``), so
    every step rounds the state to 11 bits and large states overflow to Inf. Invisible in float16
    runs, where it is exactly the plain loop.
    """
    h = torch.zeros_like(b[..., 0]).to(torch.float16)
    out = []
    for t in range(a.shape[-1]):
        h = (a[..., t] * h.to(a.dtype) + b[..., t]).to(torch.float16)
        out.append(h.to(a.dtype))
    return torch.stack(out, dim=-1) if out else b.clone()


def scan_hillis_steele_stale_decay(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Hillis-Steele scan that updates the decay products before the values that need the old ones.

    At step ``s`` the pair update is ``B_t <- A_t B_{t-s} + B_t`` and ``A_t <- A_t A_{t-s}``; done in
    place in the wrong order, ``B`` reads the already doubled ``A_t A_{t-s}``, so ``b_{t-1}`` is
    weighted by ``a_t a_{t-1}`` instead of ``a_t``. Wrong from L = 2 on.
    """
    A, B = a.clone(), b.clone()
    length, shift = A.shape[-1], 1
    while shift < length:
        A_prev = F.pad(A[..., :-shift], (shift, 0), value=1.0)
        B_prev = F.pad(B[..., :-shift], (shift, 0), value=0.0)
        A = A * A_prev  # should come after the B update
        B = A * B_prev + B
        shift *= 2
    return B


# ========================================================================================= selective_scan


def _delta(delta, delta_bias, delta_softplus, dtype):
    d = delta.to(dtype)
    if delta_bias is not None:
        d = d + delta_bias.to(dtype)[:, None]
    if delta_softplus:
        d = F.softplus(d)
    return d


def _states(u, d, A, B, C):
    """The correct state recurrence: (h of shape (batch, dim, N, L), C expanded to (batch, dim, N, L))."""
    dtype = u.dtype
    batch, dim, length = u.shape
    state = A.shape[1]
    Bx = _expand_bc(B.to(dtype), "B", batch, dim, length)
    Cx = _expand_bc(C.to(dtype), "C", batch, dim, length)
    decay = torch.exp(d[:, :, None, :] * A.to(dtype)[None, :, :, None])
    drive = (d * u)[:, :, None, :] * Bx
    h = blelloch_linear_scan(decay.reshape(batch, dim * state, length), drive.reshape(batch, dim * state, length))
    return h.reshape(batch, dim, state, length), Cx.expand(batch, dim, state, length)


def _finish(y, u, D, z):
    if D is not None:
        y = y + D.to(u.dtype)[:, None] * u
    if z is not None:
        y = y * F.silu(z.to(u.dtype))
    return y


def ssm_D_inside_state_sum(u, delta, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False):
    """The D skip added to every state before the C contraction: ``sum_n C_n (h_n + D u)``.

    The skip term belongs outside the sum over the N states (``sum_n C_n h_n + D u``); fused into the
    per-state loop it is scaled by ``sum_n C_n`` instead. Needs a case with D.
    """
    d = _delta(delta, delta_bias, delta_softplus, u.dtype)
    h, Cx = _states(u, d, A, B, C)
    if D is not None:
        h = h + (D.to(u.dtype)[:, None] * u)[:, :, None, :]
    y = (Cx * h).sum(dim=2)
    return _finish(y, u, None, z)


def ssm_D_wrong_channel(u, delta, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False):
    """The D skip read for the wrong channel: ``D[d - 1] * u[d]`` (an off-by-one channel offset).

    A pointer into D advanced once too early; channel 0 reads the last channel's D. Needs a case with
    D and at least two channels with different D.
    """
    d = _delta(delta, delta_bias, delta_softplus, u.dtype)
    h, Cx = _states(u, d, A, B, C)
    y = (Cx * h).sum(dim=2)
    return _finish(y, u, None if D is None else torch.roll(D, 1), z)


def ssm_gate_sigmoid(u, delta, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False):
    """The z gate applied as ``sigmoid(z)`` instead of ``silu(z) = z * sigmoid(z)``. Needs z."""
    d = _delta(delta, delta_bias, delta_softplus, u.dtype)
    h, Cx = _states(u, d, A, B, C)
    y = _finish((Cx * h).sum(dim=2), u, D, None)
    if z is not None:
        y = y * torch.sigmoid(z.to(u.dtype))
    return y


def ssm_gate_before_D(u, delta, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False):
    """The z gate applied before the D skip: ``(sum_n C_n h_n) silu(z) + D u``.

    The gate multiplies the whole output, skip included: ``(sum_n C_n h_n + D u) silu(z)``. Needs both
    D and z.
    """
    d = _delta(delta, delta_bias, delta_softplus, u.dtype)
    h, Cx = _states(u, d, A, B, C)
    y = (Cx * h).sum(dim=2)
    if z is not None:
        y = y * F.silu(z.to(u.dtype))
    if D is not None:
        y = y + D.to(u.dtype)[:, None] * u
    return y


def ssm_softplus_before_bias(u, delta, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False):
    """softplus applied before the bias: ``softplus(delta) + bias`` instead of ``softplus(delta + bias)``.

    Needs delta_softplus and a delta_bias.
    """
    dtype = u.dtype
    d = delta.to(dtype)
    if delta_softplus:
        d = F.softplus(d)
    if delta_bias is not None:
        d = d + delta_bias.to(dtype)[:, None]
    h, Cx = _states(u, d, A, B, C)
    return _finish((Cx * h).sum(dim=2), u, D, z)


def ssm_delta_shifted(u, delta, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False):
    """delta read one step late: step t uses ``delta_{t-1}`` (step 0 uses ``delta_0``).

    An off-by-one in the time index of the delta load (the u, B, C loads are right). Wrong from L = 2 on.
    """
    d = _delta(delta, delta_bias, delta_softplus, u.dtype)
    d = torch.cat((d[..., :1], d[..., :-1]), dim=-1)
    h, Cx = _states(u, d, A, B, C)
    return _finish((Cx * h).sum(dim=2), u, D, z)


def ssm_groups_modulo(u, delta, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False):
    """Grouped B/C mapped with ``group = d % G`` instead of ``d // (dim / G)``.

    Channels are meant to read their group in contiguous runs (``repeat_interleave``); the modulo
    interleaves them (``repeat``). The same for G = 1 and G = dim; wrong for 1 < G < dim.
    """
    dim = u.shape[1]

    def regroup(x):
        if x.dim() != 4:
            return x
        per = dim // x.shape[1]
        # (batch, G, N, L) repeated so that channel d reads group d % G, then handed on as G = dim
        return x.repeat(1, per, 1, 1)

    d = _delta(delta, delta_bias, delta_softplus, u.dtype)
    h, Cx = _states(u, d, A, regroup(B), regroup(C))
    return _finish((Cx * h).sum(dim=2), u, D, z)


# ============================================================================================== retention


def retention_parallel_strict_mask(q, k, v):
    """Parallel retention with the causal mask ``n > m`` instead of ``n >= m``: the diagonal is dropped.

    Every output misses its own position's ``q_t k_t^T v_t``; at t = 0 the output is zero.
    """
    _, length, heads, dk, _ = rf._check_qkv(q, k, v)
    gammas = rf._gammas(None, heads)
    idx = torch.arange(length)
    diff = idx[:, None] - idx[None, :]
    mask = torch.where(diff > 0, rf._powers(gammas, diff.clamp(min=0)), torch.zeros((), dtype=torch.float64))
    mask = mask.to(device=q.device, dtype=q.dtype)
    qh = (q * rf._scale(None, dk)).transpose(1, 2)
    scores = (qh @ k.transpose(1, 2).transpose(-1, -2)) * mask
    return (scores @ v.transpose(1, 2)).transpose(1, 2)


def retention_recurrent_decay_after_add(q, k, v):
    """Recurrent retention that decays after adding: ``S_t = gamma (S_{t-1} + k_t^T v_t)``.

    The current position's contribution is decayed once before it is read. Wrong from t = 0 (by a
    factor gamma, 1 - 2**-5 for head 0).
    """
    batch, length, heads, dk, dv = rf._check_qkv(q, k, v)
    g = rf._gammas(None, heads).to(device=q.device, dtype=q.dtype)[:, None, None]
    qs = q * rf._scale(None, dk)
    state = torch.zeros(batch, heads, dk, dv, dtype=q.dtype, device=q.device)
    outs = []
    for t in range(length):
        state = g * (state + k[:, t, :, :, None] * v[:, t, :, None, :])
        outs.append((qs[:, t, :, None, :] @ state).squeeze(-2))
    return torch.stack(outs, dim=1)


def retention_decay_off_by_one_head(q, k, v):
    """The decay schedule shifted by one head: head h uses ``1 - 2**(-6 - h)`` (RetNet's head h + 1).

    An off-by-one in ``1 - 2**(-5 - arange(heads))`` (arange started at 1). Wrong for every head.
    """
    heads = q.shape[2]
    gammas = [1.0 - 2.0 ** (-6 - h) for h in range(heads)]
    return rf.retention_parallel(q, k, v, gamma=gammas)


def retention_scale_by_dv(q, k, v):
    """The query scaled by ``dv**-0.5`` instead of ``dk**-0.5`` (the wrong head dimension).

    Invisible whenever dk == dv, which is how most models are configured.
    """
    return rf.retention_parallel(q, k, v, scale=v.shape[-1] ** -0.5)


def retention_chunkwise_cross_decay_off_by_one(q, k, v, chunk_size):
    """Chunkwise retention whose cross-chunk term decays by ``gamma^j`` instead of ``gamma^(j+1)``.

    Position j of a chunk reads the state carried from the chunks before with one decay too few (the
    exponent counted from 0 instead of 1). Exact in the first chunk; wrong once L > chunk_size.
    """
    return _chunkwise(q, k, v, chunk_size, from_state_offset=0)


def retention_chunkwise_drops_partial_chunk(q, k, v, chunk_size):
    """Chunkwise retention that computes ``L // chunk_size`` chunks: a partial last chunk is dropped.

    The positions after the last full chunk are left at zero (the output buffer's initial value).
    Exact when chunk_size divides L; wrong otherwise (and everywhere when chunk_size > L).
    """
    batch, length, heads, dk, dv = rf._check_qkv(q, k, v)
    full = (length // chunk_size) * chunk_size
    out = torch.zeros(batch, length, heads, dv, dtype=q.dtype, device=q.device)
    if full:
        out[:, :full] = rf.retention_chunkwise(q[:, :full], k[:, :full], v[:, :full], chunk_size)
    return out


def _chunkwise(q, k, v, chunk_size, *, from_state_offset: int = 1, gammas=None):
    """`harness.kernels.retnet_forms.retention_chunkwise` with the cross-chunk exponent ``j + offset``."""
    batch, length, heads, dk, dv = rf._check_qkv(q, k, v)
    c = min(int(chunk_size), length)
    chunks = -(-length // c)
    pad = chunks * c - length
    gammas = rf._gammas(gammas, heads)
    dtype, device = q.dtype, q.device

    def split(x):
        if pad:
            x = F.pad(x, (0, 0, 0, 0, 0, pad))
        return x.reshape(batch, chunks, c, heads, x.shape[-1]).permute(0, 3, 1, 2, 4)

    qc, kc, vc = split(q * rf._scale(None, dk)), split(k), split(v)
    j = torch.arange(c)
    mask = rf._decay_mask(gammas, c, dtype, device)[None, :, None]
    into_state = rf._powers(gammas, c - 1 - j).to(device=device, dtype=dtype)[None, :, None, :, None]
    from_state = rf._powers(gammas, j + from_state_offset).to(device=device, dtype=dtype)[None, :, None, :, None]
    chunk_decay = rf._powers(gammas, torch.tensor(c)).to(device=device, dtype=dtype)[None, :, None, None]
    inner = ((qc @ kc.transpose(-1, -2)) * mask) @ vc
    contributions = (kc * into_state).transpose(-1, -2) @ vc
    state = torch.zeros(batch, heads, dk, dv, dtype=dtype, device=device)
    states = [state]
    for i in range(chunks - 1):
        state = chunk_decay * state + contributions[:, :, i]
        states.append(state)
    cross = (qc * from_state) @ torch.stack(states, dim=2)
    o = (inner + cross).permute(0, 2, 3, 1, 4).reshape(batch, chunks * c, heads, dv)
    return o[:, :length]


# ====================================================================================== retention_normed


def normed_eps_outside_sqrt(q, k, v, eps):
    """RMS group norm with eps outside the square root: ``o / (sqrt(mean(o^2)) + eps)``.

    The definition is ``o / sqrt(mean(o^2) + eps)``. Identical at eps = 0; at eps = 1e-5 the relative
    difference is about eps / rms(o), far above float32 rounding.
    """
    o = rf.retention_parallel(q, k, v)
    return o / (torch.sqrt(o.pow(2).mean(dim=-1, keepdim=True)) + eps)


def normed_across_heads(q, k, v, eps):
    """The group norm taken over all heads at once (a LayerNorm-shaped reshape) instead of per head.

    ``o.reshape(batch, L, heads * dv)`` normalized as one group; RetNet normalizes each head's dv
    values separately. Identical for one head.
    """
    o = rf.retention_parallel(q, k, v)
    batch, length, heads, dv = o.shape
    flat = o.reshape(batch, length, heads * dv)
    return rf.rms_group_norm(flat, eps).reshape(batch, length, heads, dv)


def normed_layernorm(q, k, v, eps):
    """LayerNorm (mean subtracted) where RetNet's RMS group norm is meant.

    The torchscale thread's "GroupNorm in the paper, RMSNorm in the code": subtracting the mean changes
    every output whose head has a non-zero mean over dv.
    """
    o = rf.retention_recurrent(q, k, v)
    c = o - o.mean(dim=-1, keepdim=True)
    return c / torch.sqrt(c.pow(2).mean(dim=-1, keepdim=True) + eps)


def normed_chunkwise_cross_decay_off_by_one(q, k, v, eps, chunk_size):
    """`retention_chunkwise_cross_decay_off_by_one` followed by the (correct) RMS group norm.

    The RetNet seed thread's symptom: chunkwise disagrees with parallel and recurrent from the second
    chunk on, and the norm's eps is the first suspect; here the eps is innocent.
    """
    return rf.rms_group_norm(_chunkwise(q, k, v, chunk_size, from_state_offset=0), eps)


# =================================================================================================== ssd
def ssd_negative_step_not_clamped(x, dt, A, B, C, chunk_size=gf.DEFAULT_CHUNK, D=None, z=None, dt_bias=None,
                                  dt_softplus=False, initial_states=None, return_final_states=False):
    """Mamba-2 SSD that takes ``dt + dt_bias`` as given, where mamba-ssm clamps it to ``dt_limit``, (0, inf)
    by default: a negative step grows the state by ``exp(-|dt'| A)`` and subtracts its input, where a
    clamped one leaves the state as it is. Right wherever every step is positive (the helpers' SSD kernel
    written from the paper; the ci draws had no negative step until the ``negative_steps`` regime)."""
    step = dt if dt_bias is None else dt + dt_bias
    if dt_softplus:
        step = F.softplus(step, beta=1.0, threshold=20.0)

    def unclamped(q, k, v, g, scale, h0, chunk):  # `gated_forms._ssd` hands the clamped step's g and v
        return gf.chunk_form(q, k, step[..., None] * x, (step * A)[..., None], scale, h0, chunk)

    return gf._ssd(unclamped, x, dt, A, B, C, chunk_size, D, z, dt_bias, dt_softplus, initial_states, None,
                   return_final_states)


# ============================================================================================ the registry


@dataclass(frozen=True)
class PlantedBug:
    """One planted bug: the kernel, its family, what it gets wrong, and what exposes it.

    ``dtypes``: the dtypes the search is restricted to (None: all the kernel declares); a bug that only
    shows in some dtypes (float16 state in a float32 kernel) lists those. ``max_length``: the longest
    length the search draws (None: the profile's), set for a bug that only shows past some length or to
    keep the search short. ``capabilities``: what the kernel accepts (chunked kernels declare
    ``chunk_sizes=()``). ``exposed_by``: in words, the cases that show the bug; ``exposes``: the same
    as a predicate on a `Problem`, which every counterexample the harness finds must satisfy (a
    counterexample outside it would mean the harness flagged something other than the bug).
    """

    name: str
    family: Family
    fn: Callable
    description: str
    exposed_by: str = "any case"
    dtypes: tuple[str, ...] | None = ("float64", "float32")
    max_length: int | None = None
    capabilities: Capabilities = field(default_factory=Capabilities)
    exposes: Callable[[Problem], bool] = lambda p: True
    #: A float64 problem that exposes the bug, where the family's usual witness does not (dims past a tile).
    witness: Problem | None = None

    @property
    def spec(self) -> KernelSpec:
        """A `KernelSpec` named ``planted.<name>`` (stable, so records and counterexample files are too)."""
        return _spec(self)


_SPECS: dict[str, KernelSpec] = {}


def _spec(bug: PlantedBug) -> KernelSpec:
    if bug.name not in _SPECS:
        fn = bug.fn
        _SPECS[bug.name] = KernelSpec(name=f"planted.{bug.name}", family=bug.family, load=lambda: fn,
                                      capabilities=bug.capabilities, description=bug.description,
                                      source="planted")
    return _SPECS[bug.name]


_CHUNKED = Capabilities(chunk_sizes=())

PLANTED: list[PlantedBug] = [
    # -- linear_scan
    PlantedBug("scan_pow2_only_downsweep", Family.LINEAR_SCAN, scan_pow2_only_downsweep,
               "Blelloch sweeps that assume a power-of-two length (mamba.py pscan)",
               exposed_by="L not a power of two (L = 3 is the smallest)",
               exposes=lambda p: p.length & (p.length - 1) != 0),
    PlantedBug("scan_drops_carry_after_block_8", Family.LINEAR_SCAN, scan_drops_carry_after_block_8,
               "blocked scan (64) whose carry buffer holds 8 blocks; block 8 on starts from zero",
               exposed_by="L > 512", max_length=1024, exposes=lambda p: p.length > CARRY_BLOCK * CARRY_SLOTS),
    PlantedBug("scan_batch_flattened", Family.LINEAR_SCAN, scan_batch_flattened,
               "batch flattened into the length: right only for batch 1",
               exposed_by="batch >= 2", exposes=lambda p: p.batch >= 2),
    PlantedBug("scan_fp16_state", Family.LINEAR_SCAN, scan_fp16_state,
               "state stored in float16 between steps inside a float32/float64 kernel",
               exposed_by="float32 or float64 (exact in float16)", max_length=512,
               exposes=lambda p: p.dtype in ("float32", "float64")),
    PlantedBug("scan_hillis_steele_stale_decay", Family.LINEAR_SCAN, scan_hillis_steele_stale_decay,
               "Hillis-Steele scan that doubles the decay products before the values read them",
               exposed_by="L >= 2", exposes=lambda p: p.length >= 2),
    # -- selective_scan
    PlantedBug("ssm_D_inside_state_sum", Family.SELECTIVE_SCAN, ssm_D_inside_state_sum,
               "D*u added to every state before the C contraction", exposed_by="D given",
               exposes=lambda p: p.has_D),
    PlantedBug("ssm_D_wrong_channel", Family.SELECTIVE_SCAN, ssm_D_wrong_channel,
               "D read for channel d-1", exposed_by="D given, dim >= 2",
               exposes=lambda p: p.has_D and p.dim >= 2),
    PlantedBug("ssm_gate_sigmoid", Family.SELECTIVE_SCAN, ssm_gate_sigmoid,
               "z gate as sigmoid(z) instead of silu(z)", exposed_by="z given", exposes=lambda p: p.has_z),
    PlantedBug("ssm_gate_before_D", Family.SELECTIVE_SCAN, ssm_gate_before_D,
               "z gate applied before the D skip is added", exposed_by="D and z given",
               exposes=lambda p: p.has_D and p.has_z),
    PlantedBug("ssm_softplus_before_bias", Family.SELECTIVE_SCAN, ssm_softplus_before_bias,
               "softplus(delta) + bias instead of softplus(delta + bias)",
               exposed_by="delta_softplus and delta_bias",
               exposes=lambda p: p.delta_softplus and p.has_delta_bias),
    PlantedBug("ssm_delta_shifted", Family.SELECTIVE_SCAN, ssm_delta_shifted,
               "delta read one step late", exposed_by="L >= 2", exposes=lambda p: p.length >= 2),
    PlantedBug("ssm_groups_modulo", Family.SELECTIVE_SCAN, ssm_groups_modulo,
               "grouped B/C: channel d reads group d % G instead of d // (dim/G)",
               exposed_by="grouped B/C with 1 < G < dim", exposes=lambda p: 1 < p.groups < p.dim),
    # -- retention
    PlantedBug("retention_parallel_strict_mask", Family.RETENTION, retention_parallel_strict_mask,
               "parallel causal mask n > m: the diagonal is dropped", exposed_by="any case"),
    PlantedBug("retention_recurrent_decay_after_add", Family.RETENTION, retention_recurrent_decay_after_add,
               "S_t = gamma (S_{t-1} + k^T v): decay applied after adding", exposed_by="any case"),
    PlantedBug("retention_decay_off_by_one_head", Family.RETENTION, retention_decay_off_by_one_head,
               "decay schedule shifted by one head", exposed_by="any case"),
    PlantedBug("retention_scale_by_dv", Family.RETENTION, retention_scale_by_dv,
               "query scaled by dv**-0.5 instead of dk**-0.5", exposed_by="dk != dv",
               exposes=lambda p: p.dk != p.dv),
    PlantedBug("retention_chunkwise_cross_decay_off_by_one", Family.RETENTION,
               retention_chunkwise_cross_decay_off_by_one,
               "chunkwise cross-chunk decay gamma^j instead of gamma^(j+1)",
               exposed_by="L > chunk_size", capabilities=_CHUNKED, exposes=lambda p: p.length > p.chunk_size),
    PlantedBug("retention_chunkwise_drops_partial_chunk", Family.RETENTION, retention_chunkwise_drops_partial_chunk,
               "chunkwise retention drops a partial last chunk",
               exposed_by="chunk_size does not divide L", capabilities=_CHUNKED,
               exposes=lambda p: p.length % p.chunk_size != 0),
    # -- retention_normed
    PlantedBug("normed_eps_outside_sqrt", Family.RETENTION_NORMED, normed_eps_outside_sqrt,
               "norm eps added outside the square root", exposed_by="eps > 0", exposes=lambda p: p.eps > 0),
    PlantedBug("normed_across_heads", Family.RETENTION_NORMED, normed_across_heads,
               "group norm over all heads together instead of per head", exposed_by="heads >= 2",
               exposes=lambda p: p.heads >= 2),
    PlantedBug("normed_layernorm", Family.RETENTION_NORMED, normed_layernorm,
               "LayerNorm (mean subtracted) instead of RMS norm", exposed_by="any case"),
    PlantedBug("normed_chunkwise_cross_decay_off_by_one", Family.RETENTION_NORMED,
               normed_chunkwise_cross_decay_off_by_one,
               "chunkwise cross-chunk decay off by one, then the norm",
               exposed_by="L > chunk_size", capabilities=_CHUNKED, exposes=lambda p: p.length > p.chunk_size),
    # -- ssd
    PlantedBug("ssd_negative_step_not_clamped", Family.SSD, ssd_negative_step_not_clamped,
               "dt + dt_bias taken as given where mamba-ssm clamps it at 0", exposed_by="a negative step",
               capabilities=Capabilities(chunk_sizes=(), initial_state=True, final_state=True, varlen=False,
                                         matmuls=True),
               exposes=lambda p: p.regime == "negative_steps",
               witness=Problem(family="ssd", regime="negative_steps", length=9, dtype="float64", batch=1, heads=1,
                               groups=1, dv=2, state=3, chunk_size=4, seed=1)),
]


def by_name(name: str) -> PlantedBug:
    for bug in PLANTED:
        if bug.name == name:
            return bug
    raise KeyError(f"no planted bug named {name!r}; known: {[b.name for b in PLANTED]}")
