"""Adapters for flash-linear-attention's retention and linear-attention kernels (``pip install fla-core``).

Source: https://github.com/fla-org/flash-linear-attention.

fla-core 0.6.0 takes q, k (B, T, H, K) and v (B, T, H, V), our layout exactly (``head_first`` is gone), and
returns ``(o, final_state_or_attn)``. Its retention decays are RetNet's, ``log(1 - 2**(-5 - h))`` built in
float32, and its default scale is ``K ** -0.5``: the RetNet convention. Kernels (each a Triton forward and
backward):

- ``fla.parallel_retention``, ``fla.fused_recurrent_retention``, ``fla.chunk_retention`` (``chunk_size`` a
  power of two, default 64), ``fla.fused_chunk_retention``: ``fla.ops.retention``;
- ``fla.chunk_simple_gla``, ``fla.fused_recurrent_simple_gla``, ``fla.parallel_simple_gla``
  (``fla.ops.simple_gla``): given the per-token, per-head log-decay ``g = log(gamma_h)`` of shape (B, T, H),
  the gated path (chunk-local cumulative sums of g), where the retention entry points pass the
  data-independent ``g_gamma`` (H,);
- ``fla.chunk_gla``, ``fla.fused_chunk_gla``, ``fla.fused_recurrent_gla`` (``fla.ops.gla``): given a
  per-key-channel log-decay ``g`` of shape (B, T, H, K), here the constant ``log(gamma_h)`` on every channel.
  With a constant decay they are retention; the gated families register them again with the caller's g.

The same entry points, and fla's pure-PyTorch references, are also registered in the gated families of
issue 14 (`Family.SIMPLE_GLA`, `Family.GLA`), in fla's own layout ``fn(q, k, v, g, scale=None,
initial_state=None, output_final_state=False) -> (o, final_state)`` with ``chunk_size=`` (chunked forms) and
``cu_seqlens=`` (variable-length forms): ``fla.simple_gla.{naive_recurrent, naive_chunk, chunk, fused_chunk,
fused_recurrent, parallel}`` and ``fla.gla.{naive_recurrent, chunk, fused_chunk, fused_recurrent}``. There the
log-decay g is the caller's (the harness draws it); each declares what it takes (``initial_state``,
``final_state``, ``varlen``) and refuses the rest with a clear error; the initial state is handed over in
float32, fla's state dtype. ``parallel_simple_gla`` takes no initial state and returns no final state;
``naive_recurrent_gla`` always scales by K**-0.5 and takes no cu_seqlens; the references compute in float32.

For the retention registrations the adapter builds every ``g`` from the declared (RetNet) convention in
float64 and rounds it once to float32, hands fla fresh contiguous copies of q, k, v (differentiable: the
gradient check drives fla's backward kernels through them) and returns o in the input dtype.

TF32. fla's float32 ``tl.dot`` calls name no ``input_precision``, so on an sm_80+ GPU they run in TF32
whatever torch's TF32 flags say (Triton's default). Every kernel with a ``tl.dot`` therefore declares
``computes_in={"float32": "tf32_rz"}``: its float32 runs are held to the rounding of TF32 reached by
truncation (`harness.dtypes`: Triton feeds float32 registers to the TF32 ``mma``, which ignores their low 13
fraction bits), on CUDA and on the CPU, where the interpreter reproduces the GPU's TF32 products
(`harness.kernels.triton_interpreter`, ``dot_float32_input_precision``). Each such kernel has a
``<name>.ieee`` twin, float32 only, run with ``TRITON_F32_DEFAULT=ieee``
(`triton_interpreter.dot_input_precision`) and held to float32: the pair tells how much of a kernel's
float32 error on an H100 comes from TF32. The twins' gradients are checked too: fla's backward runs when the
caller asks for gradients, after the call returned, so `triton_interpreter.call_in_dot_precision` makes the
call one autograd node whose backward re-enters ``ieee`` for fla's backward kernels.

On a machine without CUDA the kernels run under the Triton interpreter with its corrections: ``load`` turns
it on before importing fla, and then runs the kernel once on a tiny case (1 x 16 x 1 x 16, float32), so that
a kernel that cannot run is reported unavailable with the error it raised. What was found with fla-core
0.6.0 and triton 3.9.0 (tests/test_adapters.py checks each claim):

- ``fused_chunk_gla`` raises ``NotImplementedError: `fused_chunk_gla` is deprecated`` in fla 0.6.0.
- float64: fla's kernels accumulate in float32 by design (``tl.zeros(..., dtype=tl.float32)`` states,
  inputs cast ``.to(tl.float32)``); ``fused_recurrent_retention`` returns float64 tensors with float32
  accuracy (max error ~1e-5 on a 32-step case). float64 is therefore declared unsupported for the others,
  on every device, as a property of the package rather than a bug.
- Without the interpreter corrections, ``chunk_*`` and ``fused_chunk_retention`` stop with ``'int' object
  has no attribute 'to'`` and every bfloat16 ``tl.dot`` is garbage (errors around 1e10).
"""

from __future__ import annotations

import functools
import math
import traceback
import warnings
from dataclasses import dataclass
from typing import Callable

import torch

from harness.errors import InvalidArgument, KernelUnavailable
from harness.kernels import triton_interpreter
from harness.kernels.contract import (Capabilities, Family, KernelSpec, package_version, require_module,
                                     retnet_gammas)

__all__ = ["KERNELS"]

PACKAGE = "fla-core"

#: modules whose import decorates the kernels: they must come after TRITON_INTERPRET=1 on the CPU
_KERNEL_MODULES = ("fla.ops", "fla.ops.retention", "fla.ops.simple_gla", "fla.ops.gla", "fla.ops.common",
                   "fla.ops.utils")

_FLOAT64 = ("fla's kernels compute in float32 by design (float32 states and accumulators, inputs cast "
            ".to(tl.float32)), so float64 is not a precision they offer")
_FLOAT64_RECURRENT = ("; fused_recurrent_retention returns float64 tensors with float32 accuracy (error ~1e-5 vs "
                      "float64 on a 32-step case)")
_TF32 = ("fla's float32 tl.dot calls name no input_precision, so they run in TF32 on sm_80+ GPUs whatever "
         "torch's flags say (and in the interpreter, which reproduces it): held to truncated TF32's rounding")

#: tl.dot needs every block dimension >= 16 when compiled for a GPU; the interpreter takes any size
_DOT_HEAD_DIMS = None if triton_interpreter.runs_interpreted() else (16, 32, 64, 128)
_CHUNK_SIZES = (16, 32, 64)  # powers of two (chunk_simple_gla checks), >= 16 for tl.dot
#: The entry points whose backward is fla's ``chunk_bwd_dv``, which asserts even K and V for float16 and bfloat16
#: ("Triton miscompiles masked K-tail iterations ... for 16-bit odd K/V", fla-core 0.6.0 ops/common/chunk_o.py):
#: drawn with even head dims where the interpreter would take any (on a GPU they are tl.dot sizes), in every dtype
#: (one rule for the draws and for the cases run on them); odd ones are left to the other fla forms.
_EVEN_DIMS_BACKWARD = frozenset({"chunk_simple_gla", "chunk_retention"})


def _head_dim_multiple(attr: str) -> int:
    return 2 if _DOT_HEAD_DIMS is None and attr in _EVEN_DIMS_BACKWARD else 1


def import_fla(module: str):
    """Import an fla module the way every fla kernel here must be: the interpreter on first (no GPU)."""
    triton_interpreter.enable_interpreter(_KERNEL_MODULES)
    require_module("triton")
    triton_interpreter.require_corrections()
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
    """Run ``fn`` once on a tiny float32 case; unavailable with the error if it raises."""
    device = "cpu" if _interpreted() or not torch.cuda.is_available() else "cuda"
    q = torch.linspace(-1, 1, 16, device=device).reshape(1, 16, 1, 1).expand(1, 16, 1, 16).contiguous()
    try:
        fn(q, q.flip(1), q)
    except Exception as exc:  # noqa: BLE001 - whatever the package raises is the reason
        where = "Triton interpreter cannot run" if _interpreted() else "fla cannot run"
        version = package_version(PACKAGE)
        raise KernelUnavailable(f"{where} {name}{f' ({version})' if version else ''}: {type(exc).__name__}: {exc}"
                                f"{_where(exc)}") from None


def _log_gamma(q: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    """RetNet's log-decay per head, float64 -> float32 once, broadcast to ``shape`` (heads on axis 2)."""
    heads = q.shape[2]
    log_gamma = torch.tensor([math.log(g) for g in retnet_gammas(heads)], dtype=torch.float64)
    log_gamma = log_gamma.to(device=q.device, dtype=torch.float32)
    view = (1, 1, heads) + (1,) * (len(shape) - 3)
    return log_gamma.reshape(view).expand(shape).contiguous()


def _wrap(name: str, call: Callable, *, chunked: bool, precision: str | None) -> Callable:
    """``call(q, k, v, **kw) -> o`` with fresh copies, the dot precision, and the probe on load."""

    def fla_kernel(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **kwargs) -> torch.Tensor:
        qc, kc, vc = (t.clone(memory_format=torch.contiguous_format) for t in (q, k, v))
        out = triton_interpreter.call_in_dot_precision(precision, functools.partial(call, **kwargs), qc, kc, vc)
        return out.to(q.dtype)

    fla_kernel.__name__ = name.split(".")[-1]
    _probe(name, (lambda q, k, v: fla_kernel(q, k, v, chunk_size=16)) if chunked else fla_kernel)
    return fla_kernel


@dataclass(frozen=True)
class _Entry:
    """One fla entry point: where it lives and how our (q, k, v) become its arguments."""

    name: str
    module: str
    attr: str
    decay: str  # "none" (retention's own), "token" g (B, T, H), "channel" g (B, T, H, K), "gk" likewise
    chunked: bool = False
    dots: bool = True
    notes: str = ""

    def load(self, precision: str | None = None) -> Callable:
        fn = getattr(import_fla(self.module), self.attr)
        decay, chunked = self.decay, self.chunked

        def call(q, k, v, **kwargs):
            if decay == "token":
                kwargs["g"] = _log_gamma(q, q.shape[:3])
            elif decay == "channel":
                kwargs["g"] = _log_gamma(q, q.shape)
            elif decay == "gk":
                kwargs["gk"] = _log_gamma(q, q.shape)
            if not chunked:
                kwargs.pop("chunk_size", None)
            return fn(q=q, k=k, v=v, **kwargs)[0]

        suffix = "" if precision is None else f".{precision}"
        return _wrap(f"fla.{self.name}{suffix}", call, chunked=chunked, precision=precision)


_ENTRIES: tuple[_Entry, ...] = (
    _Entry("parallel_retention", "fla.ops.retention", "parallel_retention", "none",
           notes="parallel_simple_gla with per-token log-decay; 128x32 tl.dot blocks"),
    _Entry("fused_recurrent_retention", "fla.ops.retention", "fused_recurrent_retention", "none", dots=False,
           notes="one program per (batch, head, K/V block), loop over t, float32 state"),
    _Entry("chunk_retention", "fla.ops.retention", "chunk_retention", "none", chunked=True,
           notes="chunk_simple_gla with data-independent g_gamma"),
    _Entry("fused_chunk_retention", "fla.ops.retention", "fused_chunk_retention", "none",
           notes="fused_chunk_simple_gla with data-independent g_gamma"),
    _Entry("chunk_simple_gla", "fla.ops.simple_gla", "chunk_simple_gla", "token", chunked=True,
           notes="given g = log(gamma_h) per token and head (the gated path)"),
    _Entry("fused_recurrent_simple_gla", "fla.ops.simple_gla", "fused_recurrent_simple_gla", "token", dots=False,
           notes="given g = log(gamma_h) per token and head; loop over t"),
    _Entry("parallel_simple_gla", "fla.ops.simple_gla", "parallel_simple_gla", "token",
           notes="given g = log(gamma_h) per token and head"),
    _Entry("chunk_gla", "fla.ops.gla", "chunk_gla", "channel",
           notes="gated linear attention given g = log(gamma_h) on every key channel (constant decay)"),
    _Entry("fused_chunk_gla", "fla.ops.gla", "fused_chunk_gla", "channel",
           notes="gated linear attention given g = log(gamma_h) on every key channel (constant decay)"),
    _Entry("fused_recurrent_gla", "fla.ops.gla", "fused_recurrent_gla", "gk", dots=False,
           notes="gated linear attention given gk = log(gamma_h) on every key channel; loop over t"),
)


def _caps(entry: _Entry, *, ieee: bool = False) -> Capabilities:
    recurrent_f64 = entry.name == "fused_recurrent_retention"
    unsupported = {} if recurrent_f64 or ieee else {"float64": _FLOAT64}
    cpu = triton_interpreter.cpu_unavailable_reason()
    if cpu:
        unsupported["cpu"] = cpu
    dtypes: tuple[str, ...] = ("float32", "float16", "bfloat16")
    computes_in: dict[str, str] = {}
    notes = entry.notes
    if recurrent_f64:
        dtypes = ("float64",) + dtypes
        computes_in["float64"] = "float32"
        notes = f"float64: {_FLOAT64 + _FLOAT64_RECURRENT}; {notes}"
    if entry.dots and not ieee:
        computes_in["float32"] = "tf32_rz"
        notes = f"{notes}; float32: {_TF32}"
    if ieee:
        dtypes = ("float32",)
        notes = f"{notes}; float32 tl.dot run with input_precision ieee (TRITON_F32_DEFAULT=ieee)"
    return Capabilities(
        dtypes=dtypes,
        chunk_sizes=_CHUNK_SIZES if entry.chunked else None,
        head_dims=_DOT_HEAD_DIMS if entry.dots else None,
        head_dim_multiple=_head_dim_multiple(entry.attr),
        # fla's Triton backward kernels, checked by harness.gradients; the .ieee twins' too, run in ieee like their
        # forward (triton_interpreter.call_in_dot_precision)
        autograd=True,
        unsupported=unsupported,
        slow=triton_interpreter.runs_interpreted(),
        computes_in=computes_in,
        notes=notes,
    )


def _spec(entry: _Entry, *, ieee: bool = False) -> KernelSpec:
    name = f"fla.{entry.name}" + (".ieee" if ieee else "")
    precision = "ieee" if ieee else None
    return KernelSpec(
        name=name,
        family=Family.RETENTION,
        load=functools.partial(entry.load, precision),
        capabilities=_caps(entry, ieee=ieee),
        description=f"{entry.module}.{entry.attr} (Triton)" + (" with float32 dots in ieee" if ieee else ""),
        source=PACKAGE,
    )


# ------------------------------------------------------------------------------------ gated families
_NAIVE_FLOAT32 = ("fla's naive reference computes in float32 (its inputs .float()), so float64 is not a precision "
                  "it offers")


@dataclass(frozen=True)
class _GatedEntry:
    """One fla entry point driven as a gated family (``simple_gla`` or ``gla``), in fla's own layout.

    ``gate``: the keyword fla names the log-decay (``g``; ``gk`` for the recurrent gla forms). The other
    flags say which parts of the contract the entry point takes: ``scale``, ``initial_state``,
    ``output_final_state`` (``final_state``), ``cu_seqlens`` (``varlen``), ``chunk_size`` (``chunked``).
    ``triton``: a Triton kernel (interpreted on the CPU) rather than fla's pure-PyTorch reference. The
    initial state is handed over in float32, fla's state dtype (``chunk_gla`` asserts it).

    ``fixed_chunk``: the chunk size of a form that takes none but forms its cumulative log-decay sums in
    chunks of its own (``chunk_gla`` 64, ``parallel_simple_gla`` 128, ``fused_chunk_simple_gla``
    min(64, max(16, next_pow2(T))), nested in chunks of 64). It is declared as the only chunk size, so that
    the harness holds the kernel to the chunk term of those chunks (the exponent of a difference of two
    within-chunk cumulative sums, `reference_impls.gated_decay`), and accepted (and not passed on) only at
    that value.

    ``float32_decays``: the chunk form forms its within-chunk cumulative log-decays in float32 whatever the
    input dtype (fla's ``chunk_local_cumsum`` returns float32; the naive chunk reference computes in float32),
    declared as ``Capabilities.chunk_computes_in`` so that the bound's chunk term is float32's.
    """

    name: str
    family: Family
    module: str
    attr: str
    gate: str = "g"
    triton: bool = True
    dots: bool = True
    chunked: bool = False
    fixed_chunk: int | None = None  # a chunk size the entry point fixes itself (declared, so the bound knows it)
    scale: bool = True
    initial_state: bool = True
    final_state: bool = True
    varlen: bool = True
    float32_decays: bool = False
    notes: str = ""

    def load(self, precision: str | None = None) -> Callable:
        module = import_fla(self.module)  # the references too: importing fla decorates all its kernels
        fn = getattr(module, self.attr)
        entry = self
        suffix = "" if precision is None else f".{precision}"
        name = f"fla.{self.name}{suffix}"

        def fla_gated(q, k, v, g, scale=None, initial_state=None, output_final_state=False, **kwargs):
            kw = entry.arguments(q, g, scale, initial_state, output_final_state, kwargs)
            q, k, v, g = (t.clone(memory_format=torch.contiguous_format) for t in (q, k, v, g))
            h0 = kw.pop("initial_state", None)

            def run(q, k, v, g, h0):
                return tuple(fn(q=q, k=k, v=v, **{entry.gate: g}, **({"initial_state": h0} if h0 is not None else {}),
                                **kw)[:2])

            o, final = triton_interpreter.call_in_dot_precision(precision, run, q, k, v, g, h0)
            return o.to(q.dtype), (final if output_final_state else None)

        fla_gated.__name__ = self.attr
        if self.triton:
            def probe(q, k, v):
                g = torch.full(q.shape[:3] if self.family is Family.SIMPLE_GLA else q.shape, -0.1, device=q.device)
                return fla_gated(q, k, v, g, **({"chunk_size": 16} if self.chunked else {}))[0]
            _probe(name, probe)
        return fla_gated

    def arguments(self, q, g, scale, initial_state, output_final_state, extra: dict) -> dict:
        """fla's keyword arguments for one call; a part of the contract the entry point lacks is refused."""
        unknown = sorted(set(extra) - {"chunk_size", "cu_seqlens"})
        if unknown:
            raise InvalidArgument(f"fla.{self.name} got unexpected keyword arguments {unknown}; expected chunk_size "
                                  "(chunked kernels) or cu_seqlens (variable-length kernels)")
        kw: dict = {}
        default_scale = q.shape[-1] ** -0.5
        if self.scale:
            kw["scale"] = scale
        elif scale is not None and scale != default_scale:
            raise InvalidArgument(f"scale={scale!r}: fla.{self.name} always scales by K**-0.5 = {default_scale!r}; "
                                  "pass scale=None")
        for flag, value, what in (("initial_state", initial_state is not None, "initial_state"),
                                  ("final_state", bool(output_final_state), "output_final_state=True"),
                                  ("varlen", extra.get("cu_seqlens") is not None, "cu_seqlens")):
            if value and not getattr(self, flag):
                raise InvalidArgument(f"{what} was given, but fla.{self.name} does not take it (declared "
                                      f"{flag}=False)")
        if initial_state is not None:
            # fla keeps its states in float32 (chunk_gla asserts it, naive_chunk's matmul needs it): exact from
            # float32, float16 and bfloat16
            kw["initial_state"] = initial_state.to(torch.float32).clone(memory_format=torch.contiguous_format)
        if self.final_state:
            kw["output_final_state"] = bool(output_final_state)
        if extra.get("cu_seqlens") is not None:
            kw["cu_seqlens"] = extra["cu_seqlens"].to(device=q.device, dtype=torch.long)
        chunk = extra.get("chunk_size")
        if chunk is not None and self.fixed_chunk is not None and int(chunk) != self.fixed_chunk:
            raise InvalidArgument(f"chunk_size={chunk!r}: fla.{self.name} forms its chunks of {self.fixed_chunk} "
                                  f"itself; pass chunk_size={self.fixed_chunk} or None")
        if chunk is not None and self.fixed_chunk is None and not self.chunked:
            raise InvalidArgument(f"chunk_size={chunk!r}: fla.{self.name} takes no chunk size; pass None")
        if self.chunked and chunk is not None:
            kw["chunk_size"] = int(chunk)
        return kw


_GATED: tuple[_GatedEntry, ...] = (
    _GatedEntry("simple_gla.naive_recurrent", Family.SIMPLE_GLA, "fla.ops.simple_gla.naive",
                "naive_recurrent_simple_gla", triton=False, dots=False, varlen=False,
                notes="fla's pure-PyTorch recurrent reference: a loop over t in float32"),
    _GatedEntry("simple_gla.naive_chunk", Family.SIMPLE_GLA, "fla.ops.simple_gla.naive", "naive_chunk_simple_gla",
                triton=False, chunked=True, varlen=False, float32_decays=True,
                notes="fla's pure-PyTorch chunk reference (exp of differences of within-chunk cumulative sums), "
                      "float32"),
    _GatedEntry("simple_gla.chunk", Family.SIMPLE_GLA, "fla.ops.simple_gla", "chunk_simple_gla", chunked=True,
                float32_decays=True, notes="Triton chunk form: chunk-local cumulative sums of g, exp2 of their differences"),
    _GatedEntry("simple_gla.fused_chunk", Family.SIMPLE_GLA, "fla.ops.simple_gla", "fused_chunk_simple_gla",
                fixed_chunk=64, notes="Triton fused chunk form (fla.ops.common.fused_chunk); its chunks are "
                                      "min(64, max(16, next_pow2(T))) steps, declared as 64"),
    _GatedEntry("simple_gla.fused_recurrent", Family.SIMPLE_GLA, "fla.ops.simple_gla", "fused_recurrent_simple_gla",
                dots=False, notes="Triton recurrent form: one program per (batch, head, K/V block), loop over t"),
    _GatedEntry("simple_gla.parallel", Family.SIMPLE_GLA, "fla.ops.simple_gla", "parallel_simple_gla",
                initial_state=False, final_state=False, fixed_chunk=128,
                notes="Triton parallel (attention-like) form, cumulative log-decays in chunks of 128; takes no "
                      "initial state and returns no final state"),
    _GatedEntry("gla.naive_recurrent", Family.GLA, "fla.ops.gla.naive", "naive_recurrent_gla", gate="gk",
                triton=False, dots=False, scale=False, varlen=False,
                notes="fla's pure-PyTorch recurrent reference in float32; always scales by K**-0.5"),
    _GatedEntry("gla.chunk", Family.GLA, "fla.ops.gla", "chunk_gla", fixed_chunk=64, float32_decays=True,
                notes="Triton chunk form (chunk size fixed at 64 by chunk_gla)"),
    _GatedEntry("gla.fused_chunk", Family.GLA, "fla.ops.gla", "fused_chunk_gla",
                notes="deprecated in fla 0.6.0 (raises NotImplementedError)"),
    _GatedEntry("gla.fused_recurrent", Family.GLA, "fla.ops.gla", "fused_recurrent_gla", gate="gk", dots=False,
                notes="Triton recurrent form, per-key-channel gate gk; loop over t"),
)


def _gated_caps(entry: _GatedEntry, *, ieee: bool = False) -> Capabilities:
    unsupported = {"float64": _FLOAT64 if entry.triton else _NAIVE_FLOAT32}
    cpu = triton_interpreter.cpu_unavailable_reason() if entry.triton else None
    if cpu:
        unsupported["cpu"] = cpu
    computes_in: dict[str, str] = {}
    notes = entry.notes
    if entry.triton and entry.dots and not ieee:
        computes_in["float32"] = "tf32_rz"
        notes = f"{notes}; float32: {_TF32}"
    if ieee:
        notes = f"{notes}; float32 tl.dot run with input_precision ieee (TRITON_F32_DEFAULT=ieee)"
    return Capabilities(
        dtypes=("float32",) if ieee else ("float32", "float16", "bfloat16"),
        chunk_sizes=_CHUNK_SIZES if entry.chunked else (entry.fixed_chunk,) if entry.fixed_chunk else None,
        head_dims=_DOT_HEAD_DIMS if entry.triton and entry.dots else None,
        head_dim_multiple=_head_dim_multiple(entry.attr) if entry.triton else 1,
        autograd=True,
        unsupported=unsupported,
        slow=entry.triton and triton_interpreter.runs_interpreted(),
        computes_in=computes_in,
        chunk_computes_in={"float16": "float32", "bfloat16": "float32"} if entry.float32_decays else {},
        matmuls=entry.dots,
        notes=notes,
        initial_state=entry.initial_state,
        final_state=entry.final_state,
        varlen=entry.varlen,
        scale=entry.scale,
    )


def _gated_spec(entry: _GatedEntry, *, ieee: bool = False) -> KernelSpec:
    precision = "ieee" if ieee else None
    kind = "Triton" if entry.triton else "PyTorch reference"
    return KernelSpec(
        name=f"fla.{entry.name}" + (".ieee" if ieee else ""),
        family=entry.family,
        load=functools.partial(entry.load, precision),
        capabilities=_gated_caps(entry, ieee=ieee),
        description=f"{entry.module}.{entry.attr} ({kind})" + (" with float32 dots in ieee" if ieee else ""),
        source=PACKAGE,
    )


KERNELS: list[KernelSpec] = (
    [_spec(e) for e in _ENTRIES] + [_spec(e, ieee=True) for e in _ENTRIES if e.dots]
    + [_gated_spec(e) for e in _GATED] + [_gated_spec(e, ieee=True) for e in _GATED if e.triton and e.dots]
)
