"""Contract-breaking kernels: each breaks the call contract in one way `harness.kernels.guard` names.

Every kernel here is a `linear_scan` kernel (``fn(a, b) -> h``) built on the correct Blelloch scan, so
that the one thing wrong with it is the contract violation. `BROKEN` maps each to the
`harness.kernels.guard.Outcome` the guard must report (the verdict is then ``kernel_error``).

The hanging kernel waits on `RELEASE` (at most `HANG_S` seconds) instead of sleeping, so a test can let
the abandoned thread finish as soon as the timeout has been observed.
"""

from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass
from typing import Callable

import torch

from harness.kernels.blelloch import blelloch_linear_scan
from harness.kernels.contract import Family, KernelSpec
from harness.kernels.guard import Outcome

__all__ = ["BrokenKernel", "BROKEN", "RELEASE", "HANG_S", "correct_scan"]

#: Set to let a hanging kernel return; cleared again by `hangs` before it waits.
RELEASE = threading.Event()
#: Longest a hanging kernel waits when nobody sets `RELEASE`.
HANG_S = 30.0


def correct_scan(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The correct in-tree Blelloch scan (the control: outcome ``ok``)."""
    return blelloch_linear_scan(a, b)


def raises(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Raises, as a kernel launch that fails on a shape it does not support."""
    raise RuntimeError(f"planted failure: no kernel for length {a.shape[-1]}")


def crashes(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Ends its process, as a kernel whose out-of-bounds access segfaults or whose device assert aborts.

    Only ever run in a worker process (`harness.kernels.isolation`): in-process it would end the tests.
    """
    import ctypes

    print(f"planted crash at length {a.shape[-1]}", flush=True)
    ctypes.string_at(0)  # reads address 0: SIGSEGV
    raise AssertionError("unreachable")


def hangs(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Never returns within any reasonable timeout (a deadlocked synchronisation)."""
    RELEASE.wait(HANG_S)
    return blelloch_linear_scan(a, b)


def wrong_shape(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Returns the output padded to the next power of two (the padding is not cut off)."""
    length = a.shape[-1]
    padded = 1 << length.bit_length()
    a = torch.nn.functional.pad(a, (0, padded - length), value=1.0)
    b = torch.nn.functional.pad(b, (0, padded - length), value=0.0)
    return blelloch_linear_scan(a, b)


def wrong_dtype(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Returns its accumulator dtype: float64 for lower precisions, float32 for float64 inputs."""
    acc = torch.float32 if a.dtype == torch.float64 else torch.float64
    return blelloch_linear_scan(a.to(acc), b.to(acc))


def wrong_device(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Returns a tensor on the 'meta' device (shape and dtype right, no data)."""
    return torch.empty(a.shape, dtype=a.dtype, device="meta")


def not_a_tensor(a: torch.Tensor, b: torch.Tensor) -> list:
    """Returns a nested Python list instead of a tensor."""
    return blelloch_linear_scan(a, b).tolist()


def mutates_input(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Computes the right output, then zeroes ``b`` to reuse it as scratch space (writes into its input)."""
    h = blelloch_linear_scan(a, b)
    b.zero_()
    return h


_CALLS = itertools.count()


def nondeterministic(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Right up to rounding, but the rounding changes from call to call (atomics-style accumulation).

    Each call adds the scan's result to ``b * 0.5`` in an order that depends on the call count, which
    is what a reduction by atomic adds does: ``(h - b/2) + b/2`` on one call, ``h`` on the next. The
    last bits differ between two calls on the same inputs.
    """
    h = blelloch_linear_scan(a, b)
    if next(_CALLS) % 2:
        half = b * 0.5
        h = (h - half) + half
        h = h + torch.finfo(h.dtype).eps * h.abs()  # the reordered accumulation rounds the other way
    return h


@dataclass(frozen=True)
class BrokenKernel:
    name: str
    fn: Callable
    outcome: Outcome
    description: str

    @property
    def spec(self) -> KernelSpec:
        return _spec(self)


_SPECS: dict[str, KernelSpec] = {}


def _spec(kernel: BrokenKernel) -> KernelSpec:
    if kernel.name not in _SPECS:
        fn = kernel.fn
        _SPECS[kernel.name] = KernelSpec(name=f"broken.{kernel.name}", family=Family.LINEAR_SCAN, load=lambda: fn,
                                         description=kernel.description, source="broken")
    return _SPECS[kernel.name]


BROKEN: list[BrokenKernel] = [
    BrokenKernel("raises", raises, Outcome.RAISED, "raises RuntimeError"),
    BrokenKernel("crashes", crashes, Outcome.CRASHED, "segfaults (its worker process dies)"),
    BrokenKernel("hangs", hangs, Outcome.TIMEOUT, "does not return before the per-call timeout"),
    BrokenKernel("wrong_shape", wrong_shape, Outcome.WRONG_SHAPE, "returns the padded length"),
    BrokenKernel("wrong_dtype", wrong_dtype, Outcome.WRONG_DTYPE, "returns its accumulator dtype"),
    BrokenKernel("wrong_device", wrong_device, Outcome.WRONG_DEVICE, "returns a 'meta' tensor"),
    BrokenKernel("not_a_tensor", not_a_tensor, Outcome.NOT_A_TENSOR, "returns a list"),
    BrokenKernel("mutates_input", mutates_input, Outcome.MUTATED_INPUT, "zeroes its input b"),
    BrokenKernel("nondeterministic", nondeterministic, Outcome.NONDETERMINISTIC,
                 "the last bits change from call to call"),
]
