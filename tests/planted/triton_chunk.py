"""A small chunkwise retention kernel in Triton, written here, right and with a planted bug.

``chunk_retention`` computes RetNet's retention (``gamma_h = 1 - 2**(-5 - h)``, scale ``dk**-0.5``) chunk
by chunk, the way fla's chunk kernels do: inside a chunk a masked, decayed ``q k^T`` times ``v``; across
chunks a float32 state ``S`` (dk x dv) carried from one chunk to the next and read as ``gamma^(i+1) q_i S``
at the i-th position of a chunk. One program per (batch, head) loops over the chunks with
``for c in range(n_chunks)`` and ``c.to(tl.int64)``, so it runs under the interpreter only with the
``loop_induction_int32`` correction; its dots take the input dtype, so bfloat16 needs the others.

``chunk_retention_boundary_bug`` reads the carried state with ``gamma^-(i+1)`` instead of ``gamma^(i+1)``
(i the position in the chunk): a wrong decay exponent at the chunk boundary, invisible on the first chunk,
a factor ``gamma^-2(i+1)`` (up to 7 for head 0 and a chunk of 32) on everything carried across a boundary.
Subtler exponents (``gamma^i``, or the global position ``t`` for ``i``: factors 0.97 and 0.6) escape
bfloat16's bound in the ci profile's five cases of length <= 48, which is bfloat16's resolution, not
the layer's.

Float32 dots say ``input_precision="ieee"``: with Triton's default (TF32 on a GPU, and in the corrected
interpreter) the kernel would be held to TF32's rounding, which ``chunk_retention_tf32`` shows.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _chunk_retention_kernel(q_ptr, k_ptr, v_ptr, o_ptr, L, n_chunks, scale, H: tl.constexpr, DK: tl.constexpr,
                            DV: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, C: tl.constexpr,
                            BUG: tl.constexpr, PREC: tl.constexpr):
    b = tl.program_id(0)
    h = tl.program_id(1)
    log2_gamma = tl.log2(1.0 - tl.exp2(-5.0 - h.to(tl.float32)))
    rk = tl.arange(0, BK)
    rv = tl.arange(0, BV)
    rc = tl.arange(0, C)
    state = tl.zeros([BK, BV], dtype=tl.float32)
    causal = rc[:, None] >= rc[None, :]
    intra = tl.where(causal, tl.exp2((rc[:, None] - rc[None, :]).to(tl.float32) * log2_gamma), 0.0)
    for c in range(n_chunks):
        t0 = c.to(tl.int64) * C
        pos = t0 + rc
        rows = pos < L
        qk_off = ((b * L + pos[:, None]) * H + h) * DK + rk[None, :]
        qk_mask = rows[:, None] & (rk[None, :] < DK)
        v_off = ((b * L + pos[:, None]) * H + h) * DV + rv[None, :]
        v_mask = rows[:, None] & (rv[None, :] < DV)
        q = tl.load(q_ptr + qk_off, mask=qk_mask, other=0.0)
        k = tl.load(k_ptr + qk_off, mask=qk_mask, other=0.0)
        v = tl.load(v_ptr + v_off, mask=v_mask, other=0.0)
        scores = tl.dot(q, tl.trans(k), input_precision=PREC) * intra * scale
        o = tl.dot(scores.to(v.dtype), v, input_precision=PREC)
        if BUG:
            carry = tl.exp2(-(rc + 1).to(tl.float32) * log2_gamma)  # planted: the exponent's sign flipped
        else:
            carry = tl.exp2((rc + 1).to(tl.float32) * log2_gamma)
        o += tl.dot(q, state.to(q.dtype), input_precision=PREC) * (carry * scale)[:, None]
        tl.store(o_ptr + v_off, o.to(o_ptr.dtype.element_ty), mask=v_mask)
        n = tl.minimum(L - t0, C)
        k_decay = tl.exp2((n - 1 - rc).to(tl.float32) * log2_gamma)
        k_decayed = (k.to(tl.float32) * k_decay[:, None]).to(k.dtype)
        state = state * tl.exp2(n.to(tl.float32) * log2_gamma) + tl.dot(tl.trans(k_decayed), v,
                                                                         input_precision=PREC)


def _launch(q, k, v, chunk_size: int, bug: bool, precision: str) -> torch.Tensor:
    batch, length, heads, dk = q.shape
    dv = v.shape[-1]
    q, k, v = (t.contiguous() for t in (q, k, v))
    o = torch.empty_like(v)
    bk = triton.next_power_of_2(max(dk, 16))
    bv = triton.next_power_of_2(max(dv, 16))
    _chunk_retention_kernel[(batch, heads)](q, k, v, o, length, triton.cdiv(length, chunk_size), dk ** -0.5,
                                            H=heads, DK=dk, DV=dv, BK=bk, BV=bv, C=chunk_size, BUG=bug,
                                            PREC=precision)
    return o


def chunk_retention(q, k, v, chunk_size: int = 16) -> torch.Tensor:
    return _launch(q, k, v, chunk_size, False, "ieee")


def chunk_retention_boundary_bug(q, k, v, chunk_size: int = 16) -> torch.Tensor:
    return _launch(q, k, v, chunk_size, True, "ieee")


def chunk_retention_tf32(q, k, v, chunk_size: int = 16) -> torch.Tensor:
    return _launch(q, k, v, chunk_size, False, "tf32")


def chunk_retention_default_dots(q, k, v, chunk_size: int = 16) -> torch.Tensor:
    """Correct, its dots left at Triton's default precision (TF32 on a GPU, and in the corrected
    interpreter), as most float32 Triton kernels are written."""
    return _launch(q, k, v, chunk_size, False, None)


def chunk_retention_default_dots_boundary_bug(q, k, v, chunk_size: int = 16) -> torch.Tensor:
    """The boundary bug with default-precision dots: TF32 is not its only error."""
    return _launch(q, k, v, chunk_size, True, None)
