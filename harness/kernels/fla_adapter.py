"""Adapters for flash-linear-attention's retention kernels (``pip install fla-core``).

Source: https://github.com/fla-org/flash-linear-attention.

fla-core 0.6.0 takes q, k (B, T, H, K) and v (B, T, H, V), our layout exactly (``head_first`` is gone), and
returns ``(o, final_state_or_attn)``. Its retention decays are RetNet's, ``log(1 - 2**(-5 - h))`` built in
float32, and its default scale is ``K ** -0.5``: the RetNet convention. Kernels:

- ``fla.parallel_retention``: ``fla.ops.retention.parallel_retention`` (``parallel_simple_gla`` with the
  per-token log-decay ``g``; blocks of 128 queries x 32 keys, ``tl.dot``);
- ``fla.fused_recurrent_retention``: ``fused_recurrent_retention`` (a loop over t, state in float32);
- ``fla.chunk_retention``: ``chunk_retention`` (chunked, ``chunk_size`` a power of two, default 64);
- ``fla.fused_chunk_retention``: ``fused_chunk_retention``;
- ``fla.chunk_simple_gla``: ``fla.ops.simple_gla.chunk_simple_gla`` given the per-token, per-head log-decay
  ``g = log(gamma_h)`` of shape (B, T, H) (the gated path: chunk-local cumulative sums of g), where
  ``chunk_retention`` passes the data-independent ``g_gamma`` (H,) instead. The adapter builds g from the
  declared (RetNet) convention in float64 and rounds it once to float32.

The adapter hands fla fresh contiguous copies of q, k, v and returns o in the input dtype.

On a machine without CUDA the kernels run under the Triton interpreter (see
`harness.kernels.triton_interpreter`): ``load`` turns it on before importing fla, pins every fla autotuner
to one config, and then runs the kernel once on a tiny case (1 x 16 x 1 x 16, float32), so that a kernel
the interpreter cannot execute is reported unavailable with the error it raised. What was found with
fla-core 0.6.0 and triton 3.9.0 (tests/test_adapters.py checks each claim against a float64 reference):

- ``chunk_retention``, ``fused_chunk_retention``, ``chunk_simple_gla``: unavailable under the interpreter:
  ``chunk_fwd_kernel_h`` (fla/ops/common/chunk_h.py) calls ``i_t.to(tl.int64)`` on a loop variable, which
  the interpreter leaves a plain Python int (``AttributeError: 'int' object has no attribute 'to'``).
- ``parallel_retention``: bfloat16 output is garbage under the interpreter (``tl.dot`` in bfloat16; errors
  around 1e10) and float64 output is NaN.
- ``fused_recurrent_retention``: works in float32, float16 and bfloat16 under the interpreter.
- float64: fla's kernels accumulate in float32 by design (``tl.zeros(..., dtype=tl.float32)`` states,
  inputs cast ``.to(tl.float32)``); ``fused_recurrent_retention`` returns float64 tensors with float32
  accuracy (max error ~1e-5 on a 32-step case). float64 is therefore declared unsupported for every fla
  kernel, on every device, as a property of the package rather than a bug.
"""

from __future__ import annotations

import warnings

import math
import traceback
from typing import Callable

import torch

from harness.errors import KernelUnavailable
from harness.kernels import triton_interpreter
from harness.kernels.contract import Capabilities, Family, KernelSpec, require_module, retnet_gammas

__all__ = ["KERNELS"]

PACKAGE = "fla-core"

#: modules whose import decorates the kernels: they must come after TRITON_INTERPRET=1 on the CPU
_KERNEL_MODULES = ("fla.ops", "fla.ops.retention", "fla.ops.simple_gla", "fla.ops.common", "fla.ops.utils")

_FLOAT64 = ("fla's kernels compute in float32 by design (float32 states and accumulators, inputs cast "
            ".to(tl.float32)), so float64 is not a precision they offer")
_FLOAT64_SEEN = {
    "parallel": "; parallel_retention returns NaN for float64 under the Triton interpreter",
    "recurrent": "; fused_recurrent_retention returns float64 tensors with float32 accuracy (error ~1e-5 vs "
                 "float64 on a 32-step case)",
}
_DOT_BF16 = "Triton interpreter: tl.dot gives garbage in bfloat16 (errors around 1e10 on a 1x32x2x16 case)"

#: tl.dot needs every block dimension >= 16 when compiled for a GPU; the interpreter takes any size
_DOT_HEAD_DIMS = None if triton_interpreter.runs_interpreted() else (16, 32, 64, 128)
_CHUNK_SIZES = (16, 32, 64)  # powers of two (chunk_simple_gla checks), >= 16 for tl.dot


def import_fla(module: str):
    """Import an fla module the way every fla kernel here must be: the interpreter on first (no GPU)."""
    triton_interpreter.enable_interpreter(_KERNEL_MODULES)
    require_module("triton")
    with warnings.catch_warnings():
        # fla warns "Triton is not supported on current platform, roll back to CPU" on a CPU-only box:
        # expected here (the interpreter runs its kernels), and `harness list` says so already
        warnings.filterwarnings("ignore", message="Triton is not supported on current platform")
        mod = require_module(module, package=PACKAGE)
    triton_interpreter.require_interpreted("fla")
    return mod


def _interpreted() -> bool:
    return triton_interpreter.interpreter_enabled()


def _where(exc: BaseException) -> str:
    """The innermost frame of ``exc`` (or its cause) inside fla, as ``fla/...py:line in function``."""
    for err in (exc.__cause__, exc):
        if err is None:
            continue
        frames = [f for f in traceback.extract_tb(err.__traceback__) if "/fla/" in f.filename.replace("\\", "/")]
        if frames:
            f = frames[-1]
            path = f.filename.replace("\\", "/")
            return f" in {path[path.rindex('/fla/') + 1:]}:{f.lineno} {f.name}"
    return ""


def _probe(name: str, fn: Callable) -> None:
    """Run ``fn`` once on a tiny float32 case under the interpreter; unavailable with the error if it raises."""
    q = torch.linspace(-1, 1, 16).reshape(1, 16, 1, 1).expand(1, 16, 1, 16).contiguous()
    try:
        fn(q, q.flip(1), q)
    except Exception as exc:  # noqa: BLE001 - whatever the interpreter raises is the reason
        reason = f"Triton interpreter cannot run {name}: {type(exc).__name__}: {exc}{_where(exc)}"
        if "'int' object has no attribute" in str(exc):
            reason += (" (a kernel loop variable that Triton compiles to a tensor is a plain Python int when "
                       "interpreted)")
        raise KernelUnavailable(reason) from None


def _finish(name: str, call: Callable, *, chunked: bool = False) -> Callable:
    """Wrap ``call(q, k, v, **kw) -> o`` with the copies, the autotuner pinning and the probe."""
    interpreted = _interpreted()

    def fla_kernel(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **kwargs) -> torch.Tensor:
        if interpreted:
            triton_interpreter.pin_autotuners("fla")  # also kernels of modules fla imported lazily
        qc, kc, vc = (t.clone(memory_format=torch.contiguous_format) for t in (q, k, v))
        return call(qc, kc, vc, **kwargs).to(q.dtype)

    fla_kernel.__name__ = name.split(".")[-1]
    if interpreted:
        triton_interpreter.pin_autotuners("fla")
        _probe(name, (lambda q, k, v: fla_kernel(q, k, v, chunk_size=16)) if chunked else fla_kernel)
    return fla_kernel


def _load_parallel() -> Callable:
    fn = import_fla("fla.ops.retention").parallel_retention
    return _finish("fla.parallel_retention", lambda q, k, v: fn(q, k, v)[0])


def _load_fused_recurrent() -> Callable:
    fn = import_fla("fla.ops.retention").fused_recurrent_retention
    return _finish("fla.fused_recurrent_retention", lambda q, k, v: fn(q, k, v)[0])


def _load_chunk() -> Callable:
    fn = import_fla("fla.ops.retention").chunk_retention
    return _finish("fla.chunk_retention", lambda q, k, v, *, chunk_size: fn(q, k, v, chunk_size=chunk_size)[0],
                   chunked=True)


def _load_fused_chunk() -> Callable:
    fn = import_fla("fla.ops.retention").fused_chunk_retention
    return _finish("fla.fused_chunk_retention", lambda q, k, v: fn(q, k, v)[0])


def _load_chunk_simple_gla() -> Callable:
    fn = import_fla("fla.ops.simple_gla").chunk_simple_gla

    def call(q, k, v, *, chunk_size):
        batch, length, heads, _ = q.shape
        log_gamma = torch.tensor([math.log(g) for g in retnet_gammas(heads)], dtype=torch.float64)
        g = log_gamma.to(device=q.device, dtype=torch.float32).expand(batch, length, heads).contiguous()
        return fn(q, k, v, g=g, chunk_size=chunk_size)[0]

    return _finish("fla.chunk_simple_gla", call, chunked=True)


def _caps(*, dtypes=("float32", "float16", "bfloat16"), unsupported=None, chunked=False, dot=True,
          float64_seen: str = "", float64_in_float32: bool = False, notes: str = "") -> Capabilities:
    """``float64_in_float32``: the kernel runs float64 inputs but computes in float32 (declared, judged so)."""
    unsup = {} if float64_in_float32 else {"float64": _FLOAT64 + float64_seen}
    unsup.update(unsupported or {})
    if float64_in_float32:
        dtypes = ("float64",) + tuple(dtypes)
        notes = f"float64: {_FLOAT64 + float64_seen}; {notes}"
    cpu = triton_interpreter.cpu_unavailable_reason()
    if cpu:
        unsup["cpu"] = cpu
    return Capabilities(
        dtypes=dtypes,
        chunk_sizes=_CHUNK_SIZES if chunked else None,
        head_dims=_DOT_HEAD_DIMS if dot else None,
        autograd=False,  # fla has backward kernels; not checked under the interpreter here
        unsupported=unsup,
        slow=triton_interpreter.runs_interpreted(),
        computes_in={"float64": "float32"} if float64_in_float32 else {},
        notes=notes,
    )


KERNELS: list[KernelSpec] = [
    KernelSpec(
        name="fla.parallel_retention",
        family=Family.RETENTION,
        load=_load_parallel,
        capabilities=_caps(unsupported={"bfloat16@cpu": _DOT_BF16}, float64_seen=_FLOAT64_SEEN["parallel"],
                           notes="parallel_simple_gla with per-token log-decay; 128x32 tl.dot blocks"),
        description="fla.ops.retention.parallel_retention (Triton)",
        source=PACKAGE,
    ),
    KernelSpec(
        name="fla.fused_recurrent_retention",
        family=Family.RETENTION,
        load=_load_fused_recurrent,
        capabilities=_caps(dot=False, float64_seen=_FLOAT64_SEEN["recurrent"], float64_in_float32=True,
                           notes="one program per (batch, head, K/V block), loop over t, float32 state"),
        description="fla.ops.retention.fused_recurrent_retention (Triton)",
        source=PACKAGE,
    ),
    KernelSpec(
        name="fla.chunk_retention",
        family=Family.RETENTION,
        load=_load_chunk,
        capabilities=_caps(chunked=True, notes="chunk_simple_gla with data-independent g_gamma"),
        description="fla.ops.retention.chunk_retention (Triton)",
        source=PACKAGE,
    ),
    KernelSpec(
        name="fla.fused_chunk_retention",
        family=Family.RETENTION,
        load=_load_fused_chunk,
        capabilities=_caps(notes="fused_chunk_simple_gla with data-independent g_gamma"),
        description="fla.ops.retention.fused_chunk_retention (Triton)",
        source=PACKAGE,
    ),
    KernelSpec(
        name="fla.chunk_simple_gla",
        family=Family.RETENTION,
        load=_load_chunk_simple_gla,
        capabilities=_caps(chunked=True, notes="chunk_simple_gla given g = log(gamma_h) per token and head"),
        description="fla.ops.simple_gla.chunk_simple_gla with RetNet's decay as per-token log-decay g (Triton)",
        source=PACKAGE,
    ),
]
