"""In-tree Blelloch (work-efficient parallel) scans: the form the Mamba parallel-scan bug thread is about.

A linear recurrence ``h_t = a_t h_{t-1} + b_t`` is a scan over the associative operator

    (a1, b1) o (a2, b2) = (a1 * a2, a2 * b1 + b2)        ("first 1, then 2")

whose identity is ``(1, 0)``. `blelloch_linear_scan` evaluates it with Blelloch's two sweeps:

- up-sweep: pairwise reductions, one vectorized level at a time, keeping each level's partial
  reductions (the values the classic in-place algorithm leaves in the array);
- down-sweep: starting from the identity at the root, every node hands its exclusive prefix to its left
  child and ``prefix o left-subtree-reduction`` to its right child.

The exclusive prefix of element t carries ``h_{t-1}`` in its b component, so ``h_t = a_t h_{t-1} + b_t``
closes the scan. Since ``h_{-1} = 0`` only the b component of the down-sweep prefixes is ever needed
(``(A, B) o (a, b)`` has b component ``a B + b``, independent of ``A``), so the down-sweep carries b alone.

Any length works: the sequence is padded at its end with identity elements ``(a=1, b=0)`` to the next
power of two, which changes no prefix of a real element, and the padding is cut off at the end. Both
sweeps take ``log2(P)`` levels of vectorized torch ops (no Python loop over t) and are written
functionally (no in-place writes), so autograd works through them. All arithmetic happens in the input
dtype: the rounding of that tree-shaped evaluation order is what the harness measures.

`blelloch_selective_scan` is Mamba's selective scan (mamba-ssm ``selective_scan_fn`` layout) with its
state recurrence evaluated by `blelloch_linear_scan`; it materialises the (batch, dim, N, L) decays.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from harness.errors import InvalidArgument
from harness.kernels.contract import Capabilities, Family, KernelSpec, next_pow2

__all__ = ["blelloch_linear_scan", "blelloch_selective_scan", "KERNELS"]


def blelloch_linear_scan(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``h_t = a_t h_{t-1} + b_t`` (``h_{-1} = 0``) along the last dim, by a Blelloch scan.

    ``a`` and ``b`` have the same shape, typically (batch, channels, L), dtype and device; ``h`` has that
    shape and dtype. Inputs are never modified.
    """
    if a.shape != b.shape:
        raise InvalidArgument(
            f"a.shape={tuple(a.shape)!r} differs from b.shape={tuple(b.shape)!r}; "
            "a linear scan needs one decay per input element"
        )
    if a.dtype != b.dtype:
        raise InvalidArgument(f"a.dtype={a.dtype} differs from b.dtype={b.dtype}; pass both in the same dtype")
    if a.dim() < 1:
        raise InvalidArgument("a.dim()=0; expected tensors with the sequence along the last dim")
    length = a.shape[-1]
    if length == 0:
        return b.clone()
    padded = next_pow2(length)
    if padded != length:  # identity elements (1, 0) at the end change no real prefix
        a = F.pad(a, (0, padded - length), value=1.0)
        b = F.pad(b, (0, padded - length), value=0.0)

    # Up-sweep: levels[l] holds the reductions of the aligned blocks of 2**l elements.
    levels: list[tuple[torch.Tensor, torch.Tensor]] = [(a, b)]
    while levels[-1][0].shape[-1] > 2:  # the root's reduction is never read by the down-sweep
        la, lb = levels[-1]
        a_left, a_right = la[..., 0::2], la[..., 1::2]
        b_left, b_right = lb[..., 0::2], lb[..., 1::2]
        levels.append((a_left * a_right, a_right * b_left + b_right))

    # Down-sweep: exclusive prefixes (b component only), starting from the identity at the root.
    prefix_b = torch.zeros_like(b[..., :1])
    for la, lb in reversed(levels):
        if la.shape[-1] == 1:  # length 1: level 0 is already the root's only child
            break
        a_left, b_left = la[..., 0::2], lb[..., 0::2]
        right_b = a_left * prefix_b + b_left  # prefix o (left sibling's reduction)
        prefix_b = torch.stack((prefix_b, right_b), dim=-1).flatten(-2)

    h = a * prefix_b + b  # inclusive: (exclusive prefix) o (element t)
    return h[..., :length]


def _expand_bc(x: torch.Tensor, name: str, batch: int, dim: int, length: int) -> torch.Tensor:
    """B or C as (batch, dim or 1, N, L).

    Grouped (batch, G, N, L) is repeated along dim so that channel d reads group ``d // (dim // G)``.
    """
    if x.dim() == 3:
        if x.shape[0] != batch or x.shape[2] != length:
            raise InvalidArgument(f"{name}.shape={tuple(x.shape)!r}; expected (batch={batch}, N, L={length})")
        return x.unsqueeze(1)
    if x.dim() == 4:
        groups = x.shape[1]
        if x.shape[0] != batch or x.shape[3] != length or groups == 0 or dim % groups != 0:
            raise InvalidArgument(
                f"{name}.shape={tuple(x.shape)!r}; expected (batch={batch}, G, N, L={length}) with G dividing dim={dim}"
            )
        return x.repeat_interleave(dim // groups, dim=1)
    raise InvalidArgument(f"{name}.dim()={x.dim()}; expected (batch, N, L) or grouped (batch, G, N, L)")


def blelloch_selective_scan(
    u: torch.Tensor,
    delta: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor | None = None,
    z: torch.Tensor | None = None,
    delta_bias: torch.Tensor | None = None,
    delta_softplus: bool = False,
) -> torch.Tensor:
    """Mamba's selective scan with mamba-ssm ``selective_scan_fn``'s layout, scanned by Blelloch.

    u, delta (batch, dim, L); A (dim, N); B, C (batch, N, L) or grouped (batch, G, N, L); D (dim,);
    z (batch, dim, L); delta_bias (dim,). With ``d = softplus(delta + delta_bias)`` (softplus only when
    ``delta_softplus``): ``h_t = exp(d_t A) h_{t-1} + d_t B_t u_t`` per (channel, state), ``y_t =
    sum_n C_t h_t + D u_t``, times ``silu(z_t)`` when z is given. Everything is computed in u's dtype and
    y (batch, dim, L) is returned in it.
    """
    dtype = u.dtype
    if u.dim() != 3:
        raise InvalidArgument(f"u.dim()={u.dim()}; expected u of shape (batch, dim, L)")
    batch, dim, length = u.shape
    if delta.shape != u.shape:
        raise InvalidArgument(f"delta.shape={tuple(delta.shape)!r}; expected u's shape {tuple(u.shape)!r}")
    if A.dim() != 2 or A.shape[0] != dim:
        raise InvalidArgument(f"A.shape={tuple(A.shape)!r}; expected (dim={dim}, N)")
    state = A.shape[1]
    Bx = _expand_bc(B.to(dtype), "B", batch, dim, length)
    Cx = _expand_bc(C.to(dtype), "C", batch, dim, length)
    if Bx.shape[2] != state or Cx.shape[2] != state:
        raise InvalidArgument(
            f"B.shape={tuple(B.shape)!r}, C.shape={tuple(C.shape)!r}; expected N={state} (A's second dim)"
        )

    d = delta.to(dtype)
    if delta_bias is not None:
        d = d + delta_bias.to(dtype)[:, None]
    if delta_softplus:
        d = F.softplus(d)
    decay = torch.exp(d[:, :, None, :] * A.to(dtype)[None, :, :, None])  # (batch, dim, N, L)
    drive = (d * u)[:, :, None, :] * Bx  # (batch, dim, N, L)
    h = blelloch_linear_scan(decay.reshape(batch, dim * state, length), drive.reshape(batch, dim * state, length))
    y = (Cx * h.reshape(batch, dim, state, length)).sum(dim=2)
    if D is not None:
        y = y + D.to(dtype)[:, None] * u
    if z is not None:
        y = y * F.silu(z.to(dtype))
    return y.to(dtype)


_CAPS = Capabilities(autograd=True, notes="plain torch; pads to the next power of two with identity elements")

KERNELS: list[KernelSpec] = [
    KernelSpec(
        name="intree.blelloch_scan",
        family=Family.LINEAR_SCAN,
        load=lambda: blelloch_linear_scan,
        capabilities=_CAPS,
        description="Blelloch up-sweep/down-sweep scan in the input dtype, any length",
    ),
    KernelSpec(
        name="intree.blelloch_selective_scan",
        family=Family.SELECTIVE_SCAN,
        load=lambda: blelloch_selective_scan,
        capabilities=_CAPS,
        description="Mamba selective scan, state recurrence by the Blelloch scan, in the input dtype",
    ),
]
