"""Running third-party Triton kernels on a CPU-only machine, through Triton's interpreter.

Triton compiles kernels for a GPU. With ``TRITON_INTERPRET=1`` it instead runs each ``@triton.jit``
function as Python on numpy arrays, which is slow (about a thousand times) but lets the adapters of
Triton packages (``fla``, ``accelerated_scan.scalar``) run where there is no GPU. Two facts decide how:

1. The choice is made when a kernel is *decorated*, not when it runs: ``triton.jit`` reads
   ``triton.knobs.runtime.interpret`` (which reads the environment variable on each access) and returns
   an ``InterpretedFunction`` or a compiled ``JITFunction``. So the variable must be set before the kernel
   package is imported, and before ``triton`` itself: ``triton.language`` defines its own helpers
   (``tl.cumsum``, ``tl.sigmoid``, ...) with ``@triton.jit`` at import, and a compiled one called from an
   interpreted kernel fails with "Cannot call @triton.jit'd outside of the scope of a kernel".
   `interpret_if_no_gpu` sets the variable at start-up (the CLI and the test session call it). `enable_interpreter` sets it
   (for the whole process: every kernel decorated later is interpreted too, which on a machine without a
   GPU is the only way a Triton kernel runs at all) and refuses, with the reason, when the package was
   already imported without it. `is_interpreted` checks one decorated kernel afterwards, and
   `require_interpreted` checks every plain ``@triton.jit`` kernel a package defines.
2. ``@triton.autotune`` benchmarks every config on the first call with a new key. Interpreted, that would
   be every config times dozens of timing runs, and on a machine without a GPU it does not even start:
   the benchmarker asks for the active driver and triton 3.9 raises ``RuntimeError: 0 active drivers ([]).
   There should only be one.``. `pin_autotuners` makes each autotuner of a package keep only the first
   config that survives the kernel's own pruning; Triton then skips benchmarking (triton 3.5 benchmarks even
   one config, after asking a disk cache keyed by the compiled kernel: both are skipped too). The numbers
   of an interpreted run can therefore come from a different block shape than the one a GPU would pick by
   timing.

3. The interpreter does not compute what a GPU computes. `CORRECTIONS` are small, named replacements of
   its arithmetic that make it do so; each is tested on its own against an independent torch computation
   (tests/test_triton_interpreter.py) and applied only while the interpreter is on, only on the triton
   versions they were tested on (`TESTED_TRITON_VERSIONS`; elsewhere `corrections_unavailable_reason` says
   why, and the adapters declare their kernels unavailable with it):

   - ``loop_induction_int32``: compiled Triton hands a ``for i in range(n)`` (or ``tl.range``) body an int32
     tensor (int64 when the bounds need it); the interpreter hands it a Python ``int``, so ``i.to(tl.int64)``
     raises ``'int' object has no attribute 'to'``. An AST ``visit_For`` beside the interpreter's own
     ``visit_Assign`` wraps the iterator so that it yields interpreter scalars. ``tl.static_range`` stays a
     Python int, as it is a compile-time constant when compiled. Bounds that are interpreter scalars are read
     with ``.item()``: triton 3.5's ``tensor.__index__`` is ``int()`` of a one-element array, which numpy >= 2.4
     refuses, so there ``range(n)`` of a kernel argument failed before the loop started.
   - ``bfloat16_via_float32``: the interpreter stores bfloat16 as its raw uint16 bits and then does integer
     arithmetic on them (``binary_op``, ``unary_op``, reductions, scans, fma, rsqrt, erf) and truncates
     instead of rounding in float32 -> bfloat16 casts. Every bfloat16 operation is computed in float32 (which
     holds bfloat16 exactly) and rounded back to bfloat16 to nearest even, which is what a GPU does; casts
     round to nearest even unless the kernel asks for ``rtz``, and so do bfloat16 constants (``x * 0.1``; triton
     3.5's interpreter has none, 3.9's truncates). Reductions and scans round once at the end
     (a GPU rounds each combine step in bfloat16, in an order it does not specify).
   - ``dot_low_precision_float32_acc``: ``tl.dot`` on bfloat16 or float16 is a float32 accumulation of the
     exact products (a product of two 8- or 11-bit significands fits float32's 24), as on tensor cores; the
     interpreter multiplied bfloat16 bit patterns as integers (errors around 1e10).
   - ``dot_float32_input_precision``: ``tl.dot`` on float32 honours ``input_precision``. ``"tf32"`` (Triton's
     default on NVIDIA GPUs when the kernel names none; ``TRITON_F32_DEFAULT`` overrides it) feeds the tensor
     core the operands' top 10 fraction bits: the low 13 bits are dropped (truncated, not rounded: Triton
     hands float32 registers to the TF32 ``mma`` as they are, and the hardware ignores those bits; that is
     why Triton's TF32 is less accurate than cuBLAS's, triton-lang/triton#4574). ``"ieee"`` and ``"tf32x3"``
     are plain float32 products. The interpreter ignored the setting and always computed ``ieee``.
   - ``autotuner_pinned``: every ``Autotuner`` keeps only the first config its own pruning leaves (2. above),
     whichever package defined it, a user's own included.
   - ``cuda_device_none_noop``: Triton launchers written for the GPU wrap their launch in
     ``with torch.cuda.device(x.device.index):`` (every mamba-ssm kernel). On a torch built with CUDA, ``None``
     there means "the current device" and nothing changes; on a torch built without CUDA the fallback
     ``torch.cuda._exchange_device(None)`` compares ``None < 0`` and raises ``TypeError``. A ``None`` (or
     negative) index is then "no device", the fallback's own answer for ``-1``. Applied only on a torch
     without CUDA (where the fallback is what runs); a real index still raises as before.
   - ``cuda_device_properties_h100``: launchers that size their grid from the GPU ask
     ``torch.cuda.get_device_properties(x.device).multi_processor_count`` (mamba-ssm's SSD backward splits
     the heads of a group over programs by it, and then sums the splits). On a torch built without CUDA that
     raises; for a CPU device it now returns `INTERPRETED_DEVICE`, the properties of the GPU the interpreted
     run stands in for (an H100 SXM, 132 multiprocessors), so the split, and the order of the sums, is the
     one that GPU makes. Other devices still raise.

   The layer is put in place wherever triton is imported under the harness: `install` (called by the CLI,
   the pytest session, `enable_interpreter` and the loading of a user's kernel) applies the corrections now
   if ``triton.runtime.interpreter`` is loaded, or from an import hook the moment it is. `active_corrections`
   names what is in effect (for `harness list` and the run header); `plain_interpreter` takes it away for a
   while (the tests that show each correction is needed). `dot_input_precision` sets the float32 ``tl.dot``
   default for the kernels run inside it (the adapters' ``.ieee`` variants).

Neither is done on a machine with CUDA, where the kernels run compiled. `cpu_unavailable_reason` and
`runs_interpreted` give the adapters what to declare: where CUDA is present and the interpreter is off,
the kernels take no CPU tensors; where it is absent, CPU runs are interpreted (``Capabilities.slow``).

What the interpreter gets wrong is an environment limitation, not a kernel bug; the adapters declare
what they found in ``Capabilities.unsupported`` under ``"<dtype>@cpu"`` (see docs/adapters.md).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import os
import sys
import types
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator

import torch

from harness.errors import KernelUnavailable

__all__ = [
    "ENV_VAR",
    "interpreter_enabled",
    "runs_interpreted",
    "cpu_unavailable_reason",
    "enable_interpreter",
    "is_interpreted",
    "compiled_kernels",
    "compiled_kernels_of",
    "require_interpreted",
    "pin_autotuner",
    "pin_autotuners",
    "Correction",
    "CORRECTIONS",
    "TESTED_TRITON_VERSIONS",
    "install",
    "apply_corrections",
    "remove_corrections",
    "active_corrections",
    "corrections_unavailable_reason",
    "require_corrections",
    "plain_interpreter",
    "dot_input_precision",
    "call_in_dot_precision",
    "INTERPRETED_DEVICE",
    "describe",
]

ENV_VAR = "TRITON_INTERPRET"


def interpreter_enabled() -> bool:
    """True when kernels decorated from now on will be interpreted (``TRITON_INTERPRET`` is on)."""
    if "triton" in sys.modules:
        try:
            from triton import knobs

            return bool(knobs.runtime.interpret)
        except ImportError:  # an older triton without knobs reads the variable directly
            pass
    return os.environ.get(ENV_VAR, "0").lower() in ("1", "true", "on", "yes")


def runs_interpreted() -> bool:
    """True when the Triton adapters run on the CPU through the interpreter here.

    That is the case without CUDA (the adapters turn the interpreter on) or with the variable already
    set. Decided without importing triton, so that the adapter modules stay cheap to import.
    """
    return interpreter_enabled() or not torch.cuda.is_available()


def cpu_unavailable_reason() -> str | None:
    """Why the Triton kernels take no CPU tensors here (None when they do, through the interpreter)."""
    if runs_interpreted():
        return None
    return (f"Triton kernels run compiled for the GPU on this machine (CUDA is present and {ENV_VAR} is "
            f"not set); set {ENV_VAR}=1 before starting Python to run them on the CPU through the interpreter")


def interpret_if_no_gpu() -> None:
    """Set ``TRITON_INTERPRET=1`` at start-up on a machine without CUDA, before anything imports triton.

    Leaves an explicit setting alone, and does nothing once triton is imported (too late to matter).
    """
    install()
    if "triton" in sys.modules or ENV_VAR in os.environ or torch.cuda.is_available():
        return
    os.environ[ENV_VAR] = "1"


def _triton_language_interpreted() -> bool:
    """Whether triton.language's own ``@triton.jit`` helpers were decorated for the interpreter."""
    try:
        from triton.language import standard
    except ImportError:
        return True
    helper = getattr(standard, "cdiv", None)
    return helper is None or is_interpreted(helper)


def enable_interpreter(package_modules: Iterable[str]) -> None:
    """Turn the interpreter on for kernels decorated from now on, or say why it is too late.

    ``package_modules`` are the modules that define the kernels the caller is about to import. If one of
    them is already imported while the interpreter was off, its kernels are compiled ``JITFunction``s
    that cannot run on this machine, and `KernelUnavailable` says so. Does nothing when CUDA is present.
    """
    if torch.cuda.is_available():
        return
    if interpreter_enabled():
        install()
        return
    loaded = [name for name in package_modules if name in sys.modules]
    if loaded:
        raise KernelUnavailable(
            f"no CUDA device, so Triton kernels need the interpreter, but {loaded[0]!r} was imported before "
            f"{ENV_VAR}=1 was set and its kernels were compiled for a GPU; set {ENV_VAR}=1 in the "
            "environment before starting Python (or let the harness adapter import the package first)"
        )
    if "triton" in sys.modules and not _triton_language_interpreted():
        raise KernelUnavailable(
            f"no CUDA device, so Triton kernels need the interpreter, but triton was imported before "
            f"{ENV_VAR}=1 was set and triton.language's own helpers were compiled for a GPU; set {ENV_VAR}=1 "
            "in the environment before starting Python (the harness CLI and its pytest session do)")
    os.environ[ENV_VAR] = "1"
    if "triton" in sys.modules:  # a value set earlier through knobs would win over the environment
        try:
            from triton import knobs

            if not knobs.runtime.interpret:
                knobs.runtime.interpret = True
        except ImportError:
            pass
    install()


def is_interpreted(kernel: Any) -> bool:
    """True when ``kernel`` (a ``@triton.jit`` function, possibly under autotune/heuristics) is interpreted."""
    from triton.runtime.interpreter import InterpretedFunction

    for obj in _wrapped_chain(kernel):
        if isinstance(obj, InterpretedFunction):
            return True
    return False


def compiled_kernels(package: str) -> list[str]:
    """Module-level ``@triton.jit`` kernels of the loaded modules ``package(.*)`` compiled, not interpreted.

    Only plain ``JITFunction``s count: subclasses such as Gluon's ``GluonJITFunction`` (``fla.ops.attnres``)
    are never interpreted, whatever the variable says, and the adapters do not call them.
    """
    found = []
    prefix = package + "."
    for name, module in list(sys.modules.items()):
        if module is None or not (name == package or name.startswith(prefix)):
            continue
        found.extend(compiled_kernels_of(module))
    return found


def compiled_kernels_of(module: Any) -> list[str]:
    """`compiled_kernels` of one module object (also one imported outside ``sys.modules``), by qualified name."""
    from triton.runtime.jit import JITFunction

    found = []
    for attr, value in list(vars(module).items()):
        for obj in _wrapped_chain(value):
            if type(obj) is JITFunction:  # an interpreted kernel is an InterpretedFunction instead
                found.append(f"{module.__name__}.{attr}")
                break
    return found


def require_interpreted(package: str) -> None:
    """With the interpreter on, raise `KernelUnavailable` if ``package`` holds kernels compiled for a GPU.

    That happens when the package was imported before ``TRITON_INTERPRET=1`` was set (in the environment or
    by `enable_interpreter`): its kernels cannot run on this machine's CPU.
    """
    if not interpreter_enabled() or torch.cuda.is_available():
        return
    compiled = compiled_kernels(package)
    if compiled:
        raise KernelUnavailable(
            f"{package}'s kernels were compiled for a GPU ({compiled[0]} and {len(compiled) - 1} more): the package "
            f"was imported before {ENV_VAR}=1 was set; set it in the environment before starting Python"
        )


def _wrapped_chain(obj: Any, depth: int = 8) -> Iterable[Any]:
    """``obj`` and the kernels it wraps (``Autotuner.fn``, ``Heuristics.fn``), outermost first."""
    from triton.runtime.autotuner import Autotuner, Heuristics

    for _ in range(depth):
        yield obj
        if not isinstance(obj, (Autotuner, Heuristics)):
            return
        obj = obj.fn


def _first_config(original_prune, kwargs: dict) -> list:
    return list(original_prune(kwargs))[:1]


def _untimed(self, *args: Any, **kwargs: Any) -> list[float]:
    """``Autotuner._bench`` of a pinned autotuner: its one config is not run or timed (there is nothing to choose).

    triton 3.9 skips benchmarking when pruning leaves one config and never calls this; triton 3.5 times even one
    config, through the GPU driver (there is none here).
    """
    return [0.0, 0.0, 0.0]


def _uncached(self, tuning_key: Any, configs: list, bench_fn: Callable[[], None]) -> bool:
    """``Autotuner.check_disk_cache`` of a pinned autotuner: no disk cache, `_untimed` "benchmarks" the one config.

    triton 3.5 consults the cache when a kernel asks for ``cache_results`` (fla does), keyed by the compiled
    kernel (an interpreted one has none) and the GPU target; 3.9 turns ``cache_results`` off under the interpreter.
    """
    bench_fn()
    return False


#: what `pin_autotuner` and ``autotuner_pinned`` replace besides ``prune_configs``
_UNBENCHMARKED = {"_bench": _untimed, "check_disk_cache": _uncached}


def pin_autotuner(kernel: Any) -> int:
    """Make every autotuner in ``kernel``'s wrapper chain run one config without benchmarking.

    The autotuner keeps its own pruning (``prune_configs_by``) and then takes the first surviving config;
    Triton then skips benchmarking (3.9), or benchmarks it without running or timing it (3.5: `_untimed`).
    Idempotent; returns how many autotuners it pinned now (0 if none or already pinned).
    """
    from triton.runtime.autotuner import Autotuner

    pinned = 0
    for obj in _wrapped_chain(kernel):
        if isinstance(obj, Autotuner) and not getattr(obj, "_harness_pinned", False):
            obj.prune_configs = functools.partial(_first_config, obj.prune_configs)
            for attr, fn in _UNBENCHMARKED.items():
                setattr(obj, attr, types.MethodType(fn, obj))
            obj._harness_pinned = True
            pinned += 1
    return pinned


_SCANNED: dict[str, int] = {}


def pin_autotuners(package: str) -> int:
    """`pin_autotuner` on every module-level kernel of the loaded modules ``package`` and ``package.*``.

    Cheap to call before every kernel call: modules already scanned are skipped, so kernels of modules the
    package imports lazily are pinned the first time they appear. Returns how many were pinned now.
    """
    pinned = 0
    prefix = package + "."
    for name, module in list(sys.modules.items()):
        if module is None or not (name == package or name.startswith(prefix)):
            continue
        if _SCANNED.get(name) == id(module):
            continue
        _SCANNED[name] = id(module)
        for value in list(vars(module).values()):
            pinned += pin_autotuner(value)
    return pinned


# ------------------------------------------------------------------------------------------ corrections
#: triton versions whose interpreter the corrections were written against and tested on
TESTED_TRITON_VERSIONS: tuple[str, ...] = ("3.9.0", "3.5.1")

_INTERPRETER_MODULE = "triton.runtime.interpreter"
_LOOP_HELPER = "_harness_loop_indices"


@dataclass(frozen=True)
class Correction:
    """One named replacement of the interpreter's arithmetic (see the module doc for each)."""

    name: str
    summary: str
    torch_without_cuda: bool = False  # only for a torch built without CUDA (where the fallback it fixes runs)

    def applies(self) -> bool:
        """Whether this correction has anything to replace with the torch installed here."""
        return not self.torch_without_cuda or not hasattr(torch._C, "_cuda_exchangeDevice")


CORRECTIONS: tuple[Correction, ...] = (
    Correction("loop_induction_int32", "for-loop variables of range/tl.range are int32 tensors, as compiled"),
    Correction("bfloat16_via_float32", "bfloat16 arithmetic, casts, reductions computed in float32, rounded to "
                                       "nearest even"),
    Correction("dot_low_precision_float32_acc", "tl.dot on bfloat16/float16: float32 sum of exact products"),
    Correction("dot_float32_input_precision", "tl.dot on float32 honours input_precision: tf32 (the GPU default) "
                                              "drops the low 13 fraction bits of the operands, ieee does not"),
    Correction("autotuner_pinned", "every autotuner runs its first surviving config, without benchmarking"),
    Correction("cuda_device_none_noop", "on a torch built without CUDA, torch.cuda.device(None) (a CPU tensor's "
                                        "device index) is a no-op, as it is on a CUDA build", torch_without_cuda=True),
    Correction("cuda_device_properties_h100", "on a torch built without CUDA, torch.cuda.get_device_properties of a "
                                              "CPU device describes the GPU the run stands in for (an H100 SXM: 132 "
                                              "multiprocessors)", torch_without_cuda=True),
)

#: Replacements that change how fast the interpreter runs, never what it computes; applied and removed with
#: the corrections, but not among them (`active_corrections`, run headers): a run is the same without them.
#: ``launch_builtins_listed_once``: every launch of an interpreted kernel swaps triton.language's builtins for
#: interpreted ones and back, and found them each time by ``inspect.getmembers`` of the module (``dir``, a
#: sort and ~300 ``getattr``): a quarter of an interpreted fla call at test sizes. The names are listed once per
#: module or class; each launch patches those whose member is a builtin now, as triton's own loop does.
SPEED_UPS: tuple[str, ...] = ("launch_builtins_listed_once",)


def _by_name(name: str) -> Correction:
    return next(c for c in CORRECTIONS if c.name == name)


#: (correction, owner, attribute, original value) of every replacement in effect, in the order made
_PATCHES: list[tuple[str, Any, str, Any]] = []
_APPLYING: list[str] = []  # the correction being installed (names the patches `_set` records)
_HOOK: "_ApplyOnImport | None" = None


def _triton_version() -> str | None:
    """The installed triton's version, read without importing it (None when it is not installed)."""
    if "triton" in sys.modules:
        return getattr(sys.modules["triton"], "__version__", None)
    try:
        from importlib.metadata import PackageNotFoundError, version
    except ImportError:  # pragma: no cover - python >= 3.8 has it
        return None
    try:
        return version("triton")
    except PackageNotFoundError:
        return None


def corrections_unavailable_reason() -> str | None:
    """None when the corrections can be applied to this triton's interpreter, else why not."""
    found = _triton_version()
    if found is None:
        return "triton is not installed"
    if found not in TESTED_TRITON_VERSIONS:
        return (f"the Triton interpreter corrections were tested on triton {', '.join(TESTED_TRITON_VERSIONS)} "
                f"only, and triton {found} is installed: without them the interpreter does not compute what a GPU "
                "does (bfloat16 as integers, loop variables as Python ints, no TF32); install a tested version")
    return None


def require_corrections() -> None:
    """Raise `KernelUnavailable` when an interpreted kernel would run without the corrections."""
    if not interpreter_enabled() or torch.cuda.is_available():
        return
    reason = corrections_unavailable_reason()
    if reason:
        raise KernelUnavailable(reason)
    install()
    if not active_corrections():
        raise KernelUnavailable("the Triton interpreter corrections are not in effect (plain_interpreter() is "
                                "active); interpreted kernels would not compute what a GPU computes")


def active_corrections() -> list[str]:
    """Names of the corrections in effect now (empty when none is: no interpreter, untested triton, off)."""
    applied = {name for name, *_ in _PATCHES}
    return [c.name for c in CORRECTIONS if c.name in applied]


def describe() -> dict[str, Any]:
    """What a run header records about the layer, without importing triton."""
    interpreted = runs_interpreted() and _triton_version() is not None
    reason = corrections_unavailable_reason() if interpreted else None
    return {"interpreted": interpreted, "triton": _triton_version(),
            "corrections": [] if not interpreted or reason else [c.name for c in CORRECTIONS if c.applies()],
            "corrections_unavailable": reason}


def install() -> None:
    """Put the layer in place: now if the interpreter module is loaded, else the moment it is imported.

    Does nothing on a machine with CUDA and the interpreter off, or on an untested triton. Idempotent.
    """
    global _HOOK
    if torch.cuda.is_available() and not interpreter_enabled():
        return
    if _INTERPRETER_MODULE in sys.modules and _triton_ready():
        if interpreter_enabled():
            apply_corrections()
        return
    if _HOOK is None:
        _HOOK = _ApplyOnImport()
        sys.meta_path.insert(0, _HOOK)


def _triton_ready() -> bool:
    """True once ``import triton`` has finished (the interpreter module is imported half-way through it)."""
    mod = sys.modules.get("triton")
    spec = getattr(mod, "__spec__", None)
    return mod is not None and not getattr(spec, "_initializing", False)


def _apply_if_ready() -> None:
    if interpreter_enabled() and _INTERPRETER_MODULE in sys.modules and _triton_ready():
        apply_corrections()


class _ApplyOnImport:
    """A meta-path finder: applies the corrections once ``triton`` and its interpreter module are imported.

    The interpreter module is imported while ``triton.language`` is still initializing (its helpers are
    decorated then), so the corrections wait for ``import triton`` to finish.
    """

    WATCHED = ("triton", _INTERPRETER_MODULE)

    def find_spec(self, name: str, path=None, target=None):
        if name not in self.WATCHED:
            return None
        import importlib.machinery

        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        original = spec.loader.exec_module

        def exec_module(module):
            original(module)
            if name == "triton":
                spec._initializing = False  # importlib clears it only after this returns
            _apply_if_ready()

        spec.loader.exec_module = exec_module
        return spec


def _set(owner: Any, attr: str, value: Any) -> None:
    _PATCHES.append((_APPLYING[-1], owner, attr, owner.__dict__.get(attr, _MISSING) if isinstance(owner, type)
                     else getattr(owner, attr, _MISSING)))
    setattr(owner, attr, value)


_MISSING = object()


def apply_corrections(module: Any = None) -> list[str]:
    """Apply every correction to the interpreter (idempotent); returns the names in effect.

    Applies nothing (and returns []) on an untested triton; `corrections_unavailable_reason` says why.
    """
    if corrections_unavailable_reason():
        return []
    if module is None:
        import importlib

        module = importlib.import_module(_INTERPRETER_MODULE)
    installers = {"loop_induction_int32": _install_loop_induction, "bfloat16_via_float32": _install_bfloat16,
                  "dot_low_precision_float32_acc": _install_low_precision_dot,
                  "dot_float32_input_precision": _install_float32_dot,
                  "autotuner_pinned": lambda _module: _install_autotuner_pin(),
                  "cuda_device_none_noop": lambda _module: _install_cuda_device_none_noop(),
                  "cuda_device_properties_h100": lambda _module: _install_cuda_device_properties(),
                  "launch_builtins_listed_once": _install_builtin_listing}  # a speed-up (`SPEED_UPS`)
    applied = {name for name, *_ in _PATCHES}
    for name in (*(c.name for c in CORRECTIONS), *SPEED_UPS):
        if name in applied:
            continue
        _APPLYING.append(name)
        try:
            installers[name](module)
        finally:
            _APPLYING.pop()
    module.InterpretedFunction.rewritten_fn.clear()  # kernels rewritten before must be rewritten again
    return active_corrections()


def remove_corrections(names: Iterable[str] | None = None) -> None:
    """Undo the named corrections (default: all of them, the interpreter as triton ships it)."""
    names = None if names is None else set(names)
    keep = []
    while _PATCHES:
        entry = _PATCHES.pop()
        name, owner, attr, original = entry
        if names is not None and name not in names:
            keep.append(entry)
            continue
        if original is _MISSING:
            delattr(owner, attr)
        else:
            setattr(owner, attr, original)
    _PATCHES.extend(reversed(keep))
    module = sys.modules.get(_INTERPRETER_MODULE)
    if module is not None:
        module.InterpretedFunction.rewritten_fn.clear()


@contextlib.contextmanager
def plain_interpreter(*, keep: Iterable[str] = ("autotuner_pinned",)) -> Iterator[None]:
    """Run the block with the interpreter's arithmetic as triton ships it (to show what a correction changes).

    ``keep``: corrections left in place; by default the autotuner pinning, without which an autotuned
    kernel does not run at all on a machine without a GPU.
    """
    was = bool(_PATCHES)
    remove_corrections([c.name for c in CORRECTIONS if c.name not in set(keep)])  # the speed-ups stay
    try:
        yield
    finally:
        if was:
            apply_corrections()


@contextlib.contextmanager
def dot_input_precision(precision: str | None) -> Iterator[None]:
    """The default ``input_precision`` of float32 ``tl.dot`` for kernels run (or compiled) in the block.

    ``"ieee"``, ``"tf32"``, ``"tf32x3"``, or None for Triton's own default (tf32 where the target has it).
    A kernel that names its ``input_precision`` keeps it. Sets ``triton.knobs.language.fp32_default`` (the
    ``TRITON_F32_DEFAULT`` variable) and restores both afterwards.
    """
    if precision not in (None, "ieee", "tf32", "tf32x3"):
        from harness.errors import InvalidArgument

        raise InvalidArgument(f"precision={precision!r} is not a tl.dot input precision; expected 'ieee', 'tf32', "
                              "'tf32x3' or None")
    from triton import knobs

    lang = knobs.language
    saved_override = lang.__dict__.get("fp32_default", _MISSING)
    saved_env = os.environ.get("TRITON_F32_DEFAULT")
    lang.__dict__.pop("fp32_default", None)
    if precision is None:
        os.environ.pop("TRITON_F32_DEFAULT", None)
    else:
        os.environ["TRITON_F32_DEFAULT"] = precision
    try:
        yield
    finally:
        if saved_env is None:
            os.environ.pop("TRITON_F32_DEFAULT", None)
        else:
            os.environ["TRITON_F32_DEFAULT"] = saved_env
        if saved_override is not _MISSING:
            lang.__dict__["fp32_default"] = saved_override


def call_in_dot_precision(precision: str | None, fn: Callable, *tensors: Any) -> Any:
    """``fn(*tensors)`` with float32 ``tl.dot`` at ``precision`` (`dot_input_precision`), backward included.

    A Triton package's backward kernels run when the caller asks for gradients, after the call returned and
    outside any ``with dot_input_precision(...)`` around it; a kernel run in ``"ieee"`` would then be
    differentiated in TF32. Here, when a gradient can flow (grad mode on and a tensor that requires it), the
    call becomes one autograd node whose backward re-enters the same precision for the package's own backward
    graph. ``fn`` returns a tensor or a tuple of tensors and Nones; ``tensors`` are tensors or None. With
    ``precision`` None (Triton's default) it is a plain call.
    """
    if precision is None:
        return fn(*tensors)
    grads_wanted = torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad for t in tensors)
    if not grads_wanted:
        with dot_input_precision(precision):
            return fn(*tensors)
    single: list[bool] = []
    out = _InDotPrecision.apply(precision, fn, single, *tensors)
    return out[0] if single[0] else out


class _InDotPrecision(torch.autograd.Function):
    """`call_in_dot_precision`'s node: forward and backward both under one ``tl.dot`` input precision."""

    @staticmethod
    def forward(ctx, precision, fn, single, *tensors):
        inputs = [t.detach().requires_grad_(t.requires_grad) if isinstance(t, torch.Tensor) else t for t in tensors]
        with torch.enable_grad(), dot_input_precision(precision):
            out = fn(*inputs)
        single.append(isinstance(out, torch.Tensor))
        outs = (out,) if single[0] else tuple(out)
        ctx.precision, ctx.inputs, ctx.outs = precision, inputs, outs
        return tuple(o.detach() if isinstance(o, torch.Tensor) else o for o in outs)

    @staticmethod
    def backward(ctx, *grads):
        pairs = [(o, g) for o, g in zip(ctx.outs, grads)
                 if isinstance(o, torch.Tensor) and o.requires_grad and g is not None]
        wanted = [t for t in ctx.inputs if isinstance(t, torch.Tensor) and t.requires_grad]
        got = iter(())
        if pairs and wanted:
            with dot_input_precision(ctx.precision):
                got = iter(torch.autograd.grad([o for o, _ in pairs], wanted, [g for _, g in pairs],
                                               allow_unused=True))
        else:
            got = iter([None] * len(wanted))
        return (None, None, None) + tuple(next(got) if isinstance(t, torch.Tensor) and t.requires_grad else None
                                          for t in ctx.inputs)


# -- loop_induction_int32
def _is_dynamic_range(node) -> bool:
    import ast

    if not isinstance(node, ast.Call):
        return False
    func = node.func
    return (isinstance(func, ast.Name) and func.id == "range") or (
        isinstance(func, ast.Attribute) and func.attr == "range")


def _install_loop_induction(module: Any) -> None:
    import ast

    import numpy as np
    import triton.language as tl

    def loop_indices(make_range, *args, **kwargs):
        """Yield ``make_range(*args, **kwargs)``'s values as interpreter scalars of the type compiled Triton gives.

        Bounds that are interpreter scalars (one-element arrays) are read with ``.item()`` first: triton 3.5's
        ``tensor.__index__`` is ``int()`` of the array, which numpy >= 2.4 refuses for a 1-d array.
        """
        args = [a.handle.data.item() if isinstance(a, tl.tensor) else a for a in args]
        kwargs = {k: v.handle.data.item() if isinstance(v, tl.tensor) else v for k, v in kwargs.items()}
        iterable = make_range(*args, **kwargs)
        if not isinstance(iterable, range):
            yield from iterable
            return
        ends = (iterable.start, iterable.stop, iterable.step)
        wide = any(not -2**31 <= int(e) < 2**31 for e in ends)
        np_dtype, tl_dtype = (np.int64, tl.int64) if wide else (np.int32, tl.int32)
        for i in iterable:
            yield tl.tensor(module.TensorHandle(np.array([i], dtype=np_dtype), tl_dtype), tl_dtype)

    base = module.ASTTransformer

    class LoopInductionTransformer(base):
        """The interpreter's AST rewrite plus: ``for i in range(...)`` iterates interpreter scalars."""

        def visit_For(self, node):
            node = self.generic_visit(node)
            if _is_dynamic_range(node.iter):  # range(a, b) -> _harness_loop_indices(range, a, b)
                call = node.iter
                node.iter = ast.copy_location(
                    ast.Call(func=ast.Name(id=_LOOP_HELPER, ctx=ast.Load()), args=[call.func, *call.args],
                             keywords=call.keywords), call)
            return node

    _set(module, _LOOP_HELPER, loop_indices)  # the rewriter copies the module's globals into the kernel's
    _set(module.FunctionRewriter, "ast_transformer", LoopInductionTransformer())


# -- bfloat16_via_float32
def bf16_bits_to_float32(bits):
    """bfloat16 bit patterns (uint16) -> their exact float32 values."""
    import numpy as np

    return (np.asarray(bits).astype(np.uint32) << np.uint32(16)).view(np.float32)


def float32_to_bf16_bits(values, *, toward_zero: bool = False):
    """float32 values -> bfloat16 bit patterns (uint16), rounded to nearest even (or toward zero).

    NaN stays NaN (quieted); overflow past bfloat16's largest value rounds to infinity, as IEEE rounding does.
    """
    import numpy as np

    f = np.asarray(values, dtype=np.float32)
    shape = f.shape
    f = f.reshape(-1)
    bits = f.view(np.uint32)
    if toward_zero:
        out = bits >> np.uint32(16)
    else:
        out = (bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)
    out = np.where(np.isnan(f), (bits >> np.uint32(16)) | np.uint32(0x0040), out)
    return out.astype(np.uint16).reshape(shape)


def _install_bfloat16(module: Any) -> None:
    import numpy as np
    import triton.language as tl

    B = module.InterpreterBuilder
    TensorHandle = module.TensorHandle
    bf16 = tl.bfloat16
    rtz = module._ir.ROUNDING_MODE.RTZ

    def is_bf16(handle) -> bool:  # bfloat16 bit patterns (a comparison's bool result keeps its lhs type)
        return handle.dtype.scalar == bf16 and handle.data.dtype == np.uint16

    def as_f32(handle):
        return bf16_bits_to_float32(handle.data) if is_bf16(handle) else handle.data

    def back(values, dtype):
        if isinstance(values, np.ndarray) and values.dtype == np.bool_:
            return TensorHandle(values, tl.int1)
        return TensorHandle(float32_to_bf16_bits(values), dtype)

    orig_binary, orig_unary, orig_ternary = B.binary_op, B.unary_op, B.ternary_op
    orig_fma, orig_rsqrt, orig_erf = B.create_fma, B.create_rsqrt, B.create_erf
    orig_cast, orig_fp_to_fp = B.cast_impl, B.create_fp_to_fp

    def binary_op(self, lhs, rhs, op):
        if not (is_bf16(lhs) or is_bf16(rhs)):
            return orig_binary(self, lhs, rhs, op)
        with np.errstate(all="ignore"):
            out = op(as_f32(lhs), as_f32(rhs))
        return back(np.asarray(out), lhs.dtype.scalar)

    def unary_op(self, arg, op):
        if not is_bf16(arg):
            return orig_unary(self, arg, op)
        with np.errstate(all="ignore"):
            return back(np.asarray(op(as_f32(arg))), arg.dtype.scalar)

    def ternary_op(self, lhs, rhs, other, op):
        if op is np.where or not (is_bf16(other) or is_bf16(rhs) or is_bf16(lhs)):
            return orig_ternary(self, lhs, rhs, other, op)
        return back(np.asarray(op(as_f32(lhs), as_f32(rhs), as_f32(other))), other.dtype.scalar)

    def create_fma(self, x, y, z):
        if not is_bf16(z):
            return orig_fma(self, x, y, z)
        product = np.multiply(as_f32(x), as_f32(y), dtype=np.float64)  # exact: 8-bit significands
        return back(np.add(product, as_f32(z), dtype=np.float64).astype(np.float32), z.dtype.scalar)

    def create_rsqrt(self, arg):
        if not is_bf16(arg):
            return orig_rsqrt(self, arg)
        with np.errstate(all="ignore"):
            return back(np.float32(1) / np.sqrt(as_f32(arg)), arg.dtype.scalar)

    def create_erf(self, arg):
        if not is_bf16(arg):
            return orig_erf(self, arg)
        as32 = orig_erf(self, TensorHandle(as_f32(arg), tl.float32))
        return back(as32.data, arg.dtype.scalar)

    def cast_impl(self, src, dst_type):
        src_ty, dst_ty = src.dtype.scalar, dst_type.scalar
        if src_ty == bf16 and not is_bf16(src):
            src_ty = tl.int1  # a comparison's result, labelled with its operands' type
        if src_ty != bf16 and dst_ty != bf16:
            return orig_cast(self, src, dst_type)
        if src_ty == dst_ty:
            return TensorHandle(src.data.copy(), dst_ty)
        values = as_f32(src)
        if dst_ty == bf16:
            return TensorHandle(float32_to_bf16_bits(np.asarray(values).astype(np.float32)), dst_ty)
        return TensorHandle(values.astype(module._get_np_dtype(dst_type)), dst_ty)

    def create_fp_to_fp(self, src, dst_type, rounding_mode):
        src_ty, dst_ty = src.dtype.scalar, dst_type.scalar
        plain = (tl.float16, tl.float32, tl.float64, bf16)
        if (src_ty != bf16 and dst_ty != bf16) or src_ty not in plain or dst_ty not in plain:
            return orig_fp_to_fp(self, src, dst_type, rounding_mode)
        values = as_f32(src)
        if dst_ty == bf16:
            return TensorHandle(float32_to_bf16_bits(np.asarray(values).astype(np.float32),
                                                     toward_zero=rounding_mode == rtz), dst_ty)
        return TensorHandle(values.astype(module._get_np_dtype(dst_type)), dst_ty)

    for name, fn in (("binary_op", binary_op), ("unary_op", unary_op), ("ternary_op", ternary_op),
                     ("create_fma", create_fma), ("create_rsqrt", create_rsqrt), ("create_erf", create_erf),
                     ("cast_impl", cast_impl), ("create_fp_to_fp", create_fp_to_fp)):
        _set(B, name, fn)
    if not hasattr(B, "get_bf16"):  # triton 3.5 has no bfloat16 constant (``x * 0.5``); 3.9's is this one
        _set(B, "get_bf16", lambda self, value: self.create_fp_trunc(self.get_fp32(value), bf16))

    R, S = module.ReduceOps, module.ScanOps
    orig_sum, orig_min_max = R.sum, R.min_max
    orig_cumsum, orig_cumprod = S.cumsum, S.cumprod

    def tensor_is_bf16(t) -> bool:
        return t.handle.dtype.scalar == bf16

    def reduce_sum(self, input):
        if not tensor_is_bf16(input):
            return orig_sum(self, input)
        total = np.sum(bf16_bits_to_float32(input.handle.data), axis=self.axis, keepdims=self.keep_dims)
        return self.to_tensor(float32_to_bf16_bits(total), input.dtype)

    def min_max(self, input, val_reduce_op, idx_reduce_op=None):
        first = input[0] if isinstance(input, tuple) else input
        if not tensor_is_bf16(first):
            return orig_min_max(self, input, val_reduce_op, idx_reduce_op)
        as32 = module.TensorHandle(bf16_bits_to_float32(first.handle.data), tl.float32)
        ty = tl.block_type(tl.float32, list(first.shape)) if first.shape else tl.float32
        result = orig_min_max(self, tl.tensor(as32, ty), val_reduce_op, idx_reduce_op)
        results = result if isinstance(result, tuple) else (result,)
        fixed = []
        for r, is_val in zip(results, [val_reduce_op is not None, False][:len(results)]):
            if is_val:
                r = self.to_tensor(float32_to_bf16_bits(r.handle.data), first.dtype)
            fixed.append(r)
        return tuple(fixed) if isinstance(result, tuple) else fixed[0]

    def scan(orig, np_scan):
        def method(self, input):
            if not tensor_is_bf16(input):
                return orig(self, input)
            values = np_scan(bf16_bits_to_float32(input.handle.data), axis=self.axis)
            return [self.to_tensor(float32_to_bf16_bits(values), input.dtype)]
        return method

    _set(R, "sum", reduce_sum)
    _set(R, "min_max", min_max)
    _set(S, "cumsum", scan(orig_cumsum, np.cumsum))
    _set(S, "cumprod", scan(orig_cumprod, np.cumprod))


# -- dot_low_precision_float32_acc, dot_float32_input_precision
def truncate_to_tf32(values):
    """float32 values with the low 13 fraction bits cleared: what a TF32 ``mma`` reads of a float32 operand.

    Infinities and NaN keep their class (a NaN whose payload sits in the low bits is quieted, not turned
    into an infinity).
    """
    import numpy as np

    f = np.ascontiguousarray(values, dtype=np.float32)
    bits = f.view(np.uint32)
    out = bits & np.uint32(0xFFFFE000)
    out = np.where(np.isnan(f), out | np.uint32(0x00400000), out)
    return out.view(np.float32)


def _install_low_precision_dot(module: Any) -> None:
    _install_dot(module, low_precision=True)


def _install_float32_dot(module: Any) -> None:
    _install_dot(module, low_precision=False)


def _install_dot(module: Any, *, low_precision: bool) -> None:
    """One of the two dot corrections, layered over whatever ``create_dot`` is in place."""
    import numpy as np
    import triton.language as tl

    B = module.InterpreterBuilder
    TensorHandle = module.TensorHandle
    orig_dot = B.create_dot
    tf32 = module._ir.INPUT_PRECISION.TF32

    def to_f32(handle):
        ty = handle.dtype.scalar
        if ty == tl.bfloat16:
            return bf16_bits_to_float32(handle.data)
        return handle.data.astype(np.float32)

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        a_ty, b_ty, d_ty = a.dtype.scalar, b.dtype.scalar, d.dtype.scalar
        if low_precision and a_ty == b_ty and a_ty in (tl.bfloat16, tl.float16):
            out = np.matmul(to_f32(a), to_f32(b)) + to_f32(d)  # exact products, float32 sums
            if d_ty == tl.bfloat16:
                return TensorHandle(float32_to_bf16_bits(out), d_ty)
            return TensorHandle(out.astype(module._get_np_dtype(d_ty)), d_ty)
        if not low_precision and a_ty == b_ty == tl.float32 and input_precision == tf32:
            a = TensorHandle(truncate_to_tf32(a.data), a_ty)
            b = TensorHandle(truncate_to_tf32(b.data), b_ty)
        return orig_dot(self, a, b, d, input_precision, max_num_imprecise_acc)

    _set(B, "create_dot", create_dot)


# -- autotuner_pinned
def _install_autotuner_pin() -> None:
    from triton.runtime.autotuner import Autotuner

    original = Autotuner.prune_configs

    def prune_configs(self, kwargs):
        return list(original(self, kwargs))[:1]

    _set(Autotuner, "prune_configs", prune_configs)
    for attr, fn in _UNBENCHMARKED.items():
        _set(Autotuner, attr, fn)


# -- cuda_device_none_noop
def _install_cuda_device_none_noop() -> None:
    if not _by_name("cuda_device_none_noop").applies():  # a CUDA build: torch.cuda.device(None) already works
        return
    for attr in ("_exchange_device", "_maybe_exchange_device"):
        original = getattr(torch.cuda, attr)

        def no_device_is_noop(device, _original=original):
            """``None`` or a negative index: no CUDA device to switch to, so nothing to do (returns -1)."""
            if device is None or device < 0:
                return -1
            return _original(device)

        _set(torch.cuda, attr, no_device_is_noop)


# -- cuda_device_properties_h100
@dataclass(frozen=True)
class InterpretedDeviceProperties:
    """The ``torch.cuda.get_device_properties`` fields launchers read, for the GPU an interpreted run stands in
    for (``cuda_device_properties_h100``)."""

    name: str
    major: int
    minor: int
    multi_processor_count: int
    total_memory: int


#: an H100 SXM (sm_90): what the corrected interpreter reports for a CPU device
INTERPRETED_DEVICE = InterpretedDeviceProperties(name="NVIDIA H100 (Triton interpreter stand-in)", major=9, minor=0,
                                                 multi_processor_count=132, total_memory=80 * 2**30)


def _install_cuda_device_properties() -> None:
    if not _by_name("cuda_device_properties_h100").applies():  # a CUDA build: a CPU device is the caller's mistake
        return
    original = torch.cuda.get_device_properties

    def get_device_properties(device=None):
        """`INTERPRETED_DEVICE` for a CPU device (an interpreted launch); anything else as torch answers."""
        if isinstance(device, torch.device) and device.type == "cpu" or device == "cpu":
            return INTERPRETED_DEVICE
        return original(device)

    _set(torch.cuda, "get_device_properties", get_device_properties)


# -- launch_builtins_listed_once (a speed-up: `SPEED_UPS`)
def _install_builtin_listing(module: Any) -> None:
    """Make ``module._patch_builtin`` (called for each of a few modules and classes on every launch) list a
    module's builtins once; the members are patched by the interpreter's own ``_patch_attr`` as before."""
    original = getattr(module, "_patch_builtin", None)
    if original is None or not hasattr(module, "_patch_attr"):  # another interpreter layout: left as it is
        return
    is_builtin = module.tl.core.is_builtin
    listed: dict[Any, tuple[str, ...]] = {}

    def patch_builtin(pkg, *rest):
        names = listed.get(pkg)
        if names is None:
            names = listed[pkg] = tuple(name for name, member in inspect.getmembers(pkg) if is_builtin(member))
        for name in names:  # as triton: a member already swapped in this launch (tl.tensor is reached twice) is not
            member = getattr(pkg, name, None)
            if is_builtin(member):
                module._patch_attr(pkg, name, member, *rest)

    _set(module, "_patch_builtin", patch_builtin)
