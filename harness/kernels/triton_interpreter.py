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
   config that survives the kernel's own pruning; Triton then skips benchmarking. The numbers of an
   interpreted run can therefore come from a different block shape than the one a GPU would pick by
   timing.

Neither is done on a machine with CUDA, where the kernels run compiled. `cpu_unavailable_reason` and
`runs_interpreted` give the adapters what to declare: where CUDA is present and the interpreter is off,
the kernels take no CPU tensors; where it is absent, CPU runs are interpreted (``Capabilities.slow``).

What the interpreter gets wrong is an environment limitation, not a kernel bug; the adapters declare
what they found in ``Capabilities.unsupported`` under ``"<dtype>@cpu"`` (see docs/adapters.md).
"""

from __future__ import annotations

import functools
import os
import sys
from typing import Any, Iterable

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
    "require_interpreted",
    "pin_autotuner",
    "pin_autotuners",
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
    if torch.cuda.is_available() or interpreter_enabled():
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
    from triton.runtime.jit import JITFunction

    found = []
    prefix = package + "."
    for name, module in list(sys.modules.items()):
        if module is None or not (name == package or name.startswith(prefix)):
            continue
        for attr, value in list(vars(module).items()):
            for obj in _wrapped_chain(value):
                if type(obj) is JITFunction:  # an interpreted kernel is an InterpretedFunction instead
                    found.append(f"{name}.{attr}")
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


def pin_autotuner(kernel: Any) -> int:
    """Make every autotuner in ``kernel``'s wrapper chain run one config without benchmarking.

    The autotuner keeps its own pruning (``prune_configs_by``) and then takes the first surviving config;
    Triton skips benchmarking when one config is left. Idempotent; returns how many autotuners it pinned
    now (0 if none or already pinned).
    """
    from triton.runtime.autotuner import Autotuner

    pinned = 0
    for obj in _wrapped_chain(kernel):
        if isinstance(obj, Autotuner) and not getattr(obj, "_harness_pinned", False):
            obj.prune_configs = functools.partial(_first_config, obj.prune_configs)
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
