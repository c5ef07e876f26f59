"""The one sequential loop all oracles share, and the few helpers around it.

Every oracle is a first-order recurrence ``x_t = decay_t * x_{t-1} + input_t`` over the sequence,
vectorized over everything else (batch, channels, state, heads), followed by an output map. This module
holds that loop once (`recur`), its decay-product companion (`recur_peak`), the explicit left-to-right
reduction the output maps use (`seq_sum`), and the running maximum (`running_max`).

Order of arithmetic. `recur` evaluates, for t = 0, 1, 2, ... in that order, one multiplication
``decay_t * x_{t-1}`` followed by one addition ``+ input_t``, each rounded in the tensors' dtype. That
is exactly the plain Python loop ``x = decay[t] * x + inp[t]``; no fused multiply-add (torch's
``addcmul`` may fuse, or compute float16 in float32 and round once) and no reordering along t.
`seq_sum` adds the terms of a reduction one at a time from index 0 up, each addition rounded in the
dtype (``torch.sum`` would accumulate float16 in float32 and pick its own order).

Elementwise functions (exp, log1p, silu, sqrt) are torch's. On CPU, torch evaluates the bulk of a
tensor with vectorized code and a remainder with scalar code, which can differ by an ulp, so such a
value may depend on the shape of the tensor it was computed in (a block vs one step). That is the only
way the blocked loop and a per-step loop can differ: the operations and their order are the same.

Compiled loops. On the CPU in float32 and float64, `recur` and `recur_peak` run the same loop compiled
(`reference_impls._compiled`, numba), and `fused` hands the oracles kernels that also apply the output
map (and, for the traces, every absolute-value companion and running maximum) in the same pass; every
operation and its order stay as written here, so the results are the same bits
(``tests/test_oracle_compiled.py``). Without numba, in float16/bfloat16 or on another device the
torch loops below run. ``docs/performance.md`` has the measurements behind this.

Bounded memory. The oracles walk the sequence in blocks of `block_length` steps. Per block they build
the per-step inputs (e.g. ``exp(delta * A)`` for those steps only), run `recur` over the block into a
block-sized buffer, and map the block's states to outputs. Nothing whose size is (state size) x L is
ever allocated: the extra memory is a few block buffers of at most `BLOCK_ELEMENTS` elements each, plus
tensors of the size of the inputs and outputs. Blocking changes no arithmetic: the steps inside a block
run in order and the carried state is the exact last state of the previous block.
"""

from __future__ import annotations

import contextlib
import importlib
from itertools import repeat
from types import ModuleType
from typing import Iterator

import torch

#: Elements in one block buffer (2 MiB in float64). A block holds this many state elements in total,
#: so the block's length is ``BLOCK_ELEMENTS // (elements of one step's state)`` (at least one step).
BLOCK_ELEMENTS: int = 1 << 18


@contextlib.contextmanager
def single_threaded() -> Iterator[None]:
    """Run torch's CPU operations on one thread, restoring the caller's setting afterwards (also a
    decorator).

    The oracles' block loops call small torch operations (the block's ``exp(delta * A)``, the torch
    loop's per-step ops). With several threads each call is a parallel region whose OpenMP workers spin
    and then wait for a sibling that another process has descheduled: on a 2-core machine with one core
    kept busy, the selective-scan oracle at L=8192 took 1.2-1.8 s per call with torch's 2 threads and
    0.05 s with one. The operations are small and memory-bound, so one thread loses nothing idle.
    """
    before = torch.get_num_threads()
    if before == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def compiled(*tensors: torch.Tensor | None) -> ModuleType | None:
    """`reference_impls._compiled` when its loops apply to ``tensors`` (CPU, float32/float64, numba
    importable), else None. Imported on first use, so that importing the oracles does not import numba."""
    module = importlib.import_module("reference_impls._compiled")
    return module if module.usable(*tensors) else None


def fused(*tensors: torch.Tensor | None) -> ModuleType | None:
    """Like `compiled`, for the oracles' fused block kernels (None also when they are switched off)."""
    module = compiled(*tensors)
    return module if module is not None and module.FUSED else None


def block_length(length: int, step_elements: int) -> int:
    """Steps per block: as many as fit in `BLOCK_ELEMENTS`, at least 1, at most ``length``."""
    return max(1, min(length, BLOCK_ELEMENTS // max(step_elements, 1)))


def blocks(length: int, block: int) -> Iterator[tuple[int, int]]:
    """``(start, stop)`` of consecutive blocks covering ``range(length)``."""
    for start in range(0, length, block):
        yield start, min(start + block, length)


def recur(
    decay: torch.Tensor,
    inp: torch.Tensor,
    state: torch.Tensor,
    out: torch.Tensor,
    *,
    per_step_decay: bool = True,
) -> torch.Tensor:
    """``out[i] = decay[i] * prev + inp[i]`` for i = 0, 1, ... with ``prev = state``, then ``out[i]``.

    ``inp`` and ``out`` are (steps, *state.shape); ``decay`` is (steps, ...) broadcastable to the state
    when ``per_step_decay``, else one tensor broadcastable to the state, used at every step. Returns the
    last state (a copy, so that ``out`` may be reused for the next block).
    """
    jit = compiled(decay, inp, state, out)
    if jit is not None and out.is_contiguous():
        return jit.recur(decay, inp, state, out, per_step_decay=per_step_decay)
    decays = decay.unbind(0) if per_step_decay else repeat(decay)
    prev = state
    for d, x, o in zip(decays, inp.unbind(0), out.unbind(0)):
        torch.mul(d, prev, out=o)
        o.add_(x)
        prev = o
    return prev.clone()


def recur_peak(
    decay_abs: torch.Tensor,
    state: torch.Tensor,
    out: torch.Tensor,
    *,
    per_step_decay: bool = True,
) -> torch.Tensor:
    """``out[i] = decay_abs[i] * max(prev, 1)``: the largest product of |decay| over a window ending at i.

    Same layout and return value as `recur`. ``P_t = |a_t| * max(P_{t-1}, 1)`` is the maximum over
    s <= t of ``|a_s| * ... * |a_t|`` (a window may start anywhere; max(., 1) restarts it).
    """
    jit = compiled(decay_abs, state, out)
    if jit is not None and out.is_contiguous():
        return jit.recur_peak(decay_abs, state, out, per_step_decay=per_step_decay)
    decays = decay_abs.unbind(0) if per_step_decay else repeat(decay_abs)
    prev = state
    for d, o in zip(decays, out.unbind(0)):
        torch.clamp_min(prev, 1.0, out=o)
        o.mul_(d)
        prev = o
    return prev.clone()


def seq_sum(x: torch.Tensor, dim: int) -> torch.Tensor:
    """Sum over ``dim`` left to right, ``((x_0 + x_1) + x_2) + ...``, each addition in x's dtype."""
    parts = x.movedim(dim, 0)
    if parts.shape[0] == 0:
        return parts.new_zeros(parts.shape[1:])
    acc = parts[0].clone()
    for part in parts[1:]:
        acc.add_(part)
    return acc


def running_max(x: torch.Tensor, carry: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Running maximum along dim 0 of a block, continued from ``carry`` (the previous block's last).

    Returns ``(block_result, new_carry)``. Maximum is exact, so no order of evaluation matters here.
    """
    if x.shape[0] == 0:
        return x.clone(), carry
    result = torch.maximum(torch.cummax(x, dim=0).values, carry)
    return result, result[-1].clone()
