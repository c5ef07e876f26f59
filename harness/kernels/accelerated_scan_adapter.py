"""Adapters for accelerated-scan (``pip install accelerated-scan``, https://github.com/proger/accelerated-scan).

All three solve ``x_t = a_t x_{t-1} + b_t`` (``x_{-1} = 0``) on ``gates, tokens`` of shape (B, C, T),
contiguous: exactly our linear_scan in our layout, so the only conversion is a fresh contiguous copy of
each input (the package asserts contiguity, and the copy keeps any in-place work away from our tensors).

- ``accelerated_scan.ref``: ``accelerated_scan.ref.scan``, a recursive tree scan in PyTorch. Lengths are
  padded to a power of two with gates 1 / tokens 0. A length of 1 raises inside the package
  (``padded_T = 1`` gives ``level = 0`` and ``split`` cannot halve one element), so ``min_length=2``.
- ``accelerated_scan.scalar``: ``accelerated_scan.scalar.scan``, a Triton kernel (``tl.associative_scan``
  over blocks of 2048 with a float32 carry between blocks), any length. On a machine without CUDA it runs
  under the Triton interpreter with its corrections (`harness.kernels.triton_interpreter`); without
  ``bfloat16_via_float32`` its bfloat16 ``tl.associative_scan`` returned garbage (errors of 1e33..1e38, or
  NaN), with it bfloat16 runs like float32 and float16.
- ``accelerated_scan.warp``: ``accelerated_scan.warp.scan``, a CUDA C++ extension compiled with
  ``torch.utils.cpp_extension.load_inline`` *when the module is imported*; it needs CUDA, nvcc, and a
  power-of-two length from 32 to 65536. Its module is imported only after CUDA is confirmed.
"""

from __future__ import annotations

from typing import Callable

import torch

from harness.kernels import triton_interpreter
from harness.kernels.contract import Capabilities, Family, KernelSpec, Lengths, require_cuda, require_module

__all__ = ["KERNELS"]

PACKAGE = "accelerated-scan"


def _copy(t: torch.Tensor) -> torch.Tensor:
    """A fresh contiguous copy: what the package gets instead of the harness's tensor."""
    return t.clone(memory_format=torch.contiguous_format)


def _wrap(scan: Callable, name: str) -> Callable:
    def accelerated_scan(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return scan(_copy(a), _copy(b)).to(a.dtype)

    accelerated_scan.__name__ = name
    return accelerated_scan


def _load_ref() -> Callable:
    return _wrap(require_module("accelerated_scan.ref", package=PACKAGE).scan, "ref")


def _load_scalar() -> Callable:
    triton_interpreter.enable_interpreter(["accelerated_scan.scalar"])
    require_module("triton")
    triton_interpreter.require_corrections()
    module = require_module("accelerated_scan.scalar", package=PACKAGE)
    triton_interpreter.require_interpreted("accelerated_scan")
    return _wrap(module.scan, "scalar")


def _load_warp() -> Callable:
    require_cuda()  # import compiles a CUDA extension: never try it without a GPU
    return _wrap(require_module("accelerated_scan.warp", package=PACKAGE).scan, "warp")


def _scalar_unsupported() -> dict[str, str]:
    cpu = triton_interpreter.cpu_unavailable_reason()
    return {"cpu": cpu} if cpu else {}


KERNELS: list[KernelSpec] = [
    KernelSpec(
        name="accelerated_scan.ref",
        family=Family.LINEAR_SCAN,
        load=_load_ref,
        capabilities=Capabilities(
            autograd=True, min_length=2,
            notes="recursive tree scan in PyTorch, padded to a power of two; a length of 1 raises "
                  "RuntimeError in accelerated_scan.ref.split (padded_T = 1 gives level 0)",
        ),
        description="accelerated_scan.ref.scan: reference tree scan in PyTorch",
        source=PACKAGE,
    ),
    KernelSpec(
        name="accelerated_scan.scalar",
        family=Family.LINEAR_SCAN,
        load=_load_scalar,
        capabilities=Capabilities(
            autograd=True,
            unsupported=_scalar_unsupported(),
            slow=triton_interpreter.runs_interpreted(),
            notes="Triton: tl.associative_scan over blocks of 2048, float32 carry between blocks; on the CPU "
                  "through the Triton interpreter",
        ),
        description="accelerated_scan.scalar.scan: Triton associative scan",
        source=PACKAGE,
    ),
    KernelSpec(
        name="accelerated_scan.warp",
        family=Family.LINEAR_SCAN,
        load=_load_warp,
        capabilities=Capabilities(
            dtypes=("float32", "float16", "bfloat16"),
            devices=("cuda",),
            lengths=Lengths.POW2, min_length=32, max_length=65536,
            autograd=True,
            unsupported={"float64": "the CUDA extension is built for float32, float16 and bfloat16 only"},
            notes="CUDA warp-level scan compiled by load_inline at import; power-of-two lengths 32..65536",
        ),
        description="accelerated_scan.warp.scan: CUDA warp scan",
        source=PACKAGE,
    ),
]
