"""Every kernel the harness knows: in-tree forms, third-party adapters, entry points, user kernels.

Each kernel module in this package exposes ``KERNELS: list[KernelSpec]`` built without importing its
third-party package. A kernel package of your own registers adapters through the entry-point group
``harness.kernels``: each entry point names a `KernelSpec`, a list of them, or a zero-argument
callable returning either.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import os
import sys
from typing import Callable, Iterable

from harness.errors import InvalidArgument
from harness.kernels.contract import Family, KernelSpec
from harness.kernels.target import check_target_file

#: The modules of this package that define kernels, in the order `harness list` shows them.
BUILTIN_MODULES: tuple[str, ...] = (
    "harness.kernels.sequential",
    "harness.kernels.blelloch",
    "harness.kernels.retnet_forms",
    "harness.kernels.gated_forms",
    "harness.kernels.mambapy_adapter",
    "harness.kernels.torchscale_adapter",
    "harness.kernels.fla_adapter",
    "harness.kernels.accelerated_scan_adapter",
    "harness.kernels.yet_another_retnet_adapter",
    "harness.kernels.mamba_ssm_adapter",
    "harness.kernels.torchmamba_adapter",
)

ENTRY_POINT_GROUP = "harness.kernels"

_REGISTRY: dict[str, KernelSpec] = {}
_LOADED = False


def register(spec: KernelSpec) -> KernelSpec:
    """Add ``spec``; a second spec under the same name is an error (names are record keys)."""
    old = _REGISTRY.get(spec.name)
    if old is not None and old is not spec:
        raise InvalidArgument(f"kernel name={spec.name!r} is registered twice; kernel names must be unique")
    _REGISTRY[spec.name] = spec
    return spec


def _flatten(obj) -> Iterable[KernelSpec]:
    if isinstance(obj, KernelSpec):
        yield obj
    elif callable(obj) and not isinstance(obj, type):
        yield from _flatten(obj())
    else:
        for item in obj:
            yield from _flatten(item)


def _load_builtin() -> None:
    global _LOADED
    if _LOADED:
        return
    _LOADED = True
    for module in BUILTIN_MODULES:
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name == module:  # a module not written yet is not an error of the user's
                continue
            raise
        for spec in getattr(mod, "KERNELS", ()):
            register(spec)
    from importlib.metadata import entry_points

    for ep in entry_points(group=ENTRY_POINT_GROUP):
        for spec in _flatten(ep.load()):
            register(spec)


def all_kernels(family: Family | str | None = None) -> list[KernelSpec]:
    """Every registered kernel (of ``family`` when given), in registration order."""
    _load_builtin()
    fam = Family.parse(family) if family is not None else None
    return [s for s in _REGISTRY.values() if fam is None or s.family is fam]


def get(name: str) -> KernelSpec:
    """The kernel registered as ``name``."""
    _load_builtin()
    try:
        return _REGISTRY[name]
    except KeyError:
        known = ", ".join(sorted(_REGISTRY))
        raise InvalidArgument(f"kernel={name!r} is not registered; known kernels: {known}") from None


def available_kernels(family: Family | str | None = None) -> list[KernelSpec]:
    return [s for s in all_kernels(family) if s.unavailable_reason() is None]


def _import_error(exc: BaseException) -> str:
    """One line for an exception raised while importing a user's module: type, message, file and line."""
    import traceback

    if isinstance(exc, SyntaxError):
        return f"SyntaxError: {exc.msg} ({exc.filename}, line {exc.lineno})"
    frames = traceback.extract_tb(exc.__traceback__)
    where = f" ({frames[-1].filename}, line {frames[-1].lineno})" if frames else ""
    return f"{type(exc).__name__}: {exc}{where}"


def _in_worker() -> bool:
    from harness.kernels import isolation

    return isolation._IN_WORKER


@contextlib.contextmanager
def _process_state_kept():
    """Import a user's module without letting it take over the process: the handlers of SIGINT and SIGTERM
    (a library that ignores them left a run that Ctrl-C and SIGTERM could not stop), and ``sys.stdout`` /
    ``sys.stderr`` (a module that replaced or closed them silenced every message after it), are put back as
    they were. What a module does to the process itself (exits, hangs) is met by `isolation.probe_target`
    first, in a worker."""
    import signal
    import threading

    main = threading.current_thread() is threading.main_thread()
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)} if main else {}
    streams = (sys.stdout, sys.stderr)
    try:
        yield
    finally:
        for sig, handler in handlers.items():
            if handler is not None and signal.getsignal(sig) is not handler:
                signal.signal(sig, handler)
        for name, stream, fd in (("stdout", streams[0], 1), ("stderr", streams[1], 2)):
            if stream is None:
                continue
            if getattr(stream, "closed", False):  # closed: a new stream on the same descriptor, if it is open
                try:
                    stream = open(os.dup(fd), "w", buffering=1, errors="replace")
                except OSError:
                    continue
            if getattr(sys, name) is not stream:
                setattr(sys, name, stream)


def resolve_target(target: str) -> Callable:
    """``package.module:attr`` or ``path/to/file.py:attr`` -> the object it names.

    Raises `InvalidArgument` naming the target when it cannot be found or is not callable. A file's folder
    goes first on ``sys.path`` while and after it loads, as ``python path/to/file.py`` puts it, so the file
    can import its siblings, and its project's root (`harness.project.find_root`) last, so it can import its
    own package by name; a module is looked for in the working directory too (last), as ``python -m``
    and pytest do, so ``my_kernels:fn`` works from a kernel repository's root without an install.
    """
    if ":" not in target:
        raise InvalidArgument(
            f"kernel={target!r} is neither a registered kernel (`harness list` names them) nor a target; expected "
            f"a registered name or 'package.module:attr' or 'path/to/file.py:attr'"
        )
    where, _, attr = target.rpartition(":")
    from harness.kernels.triton_interpreter import interpret_if_no_gpu

    interpret_if_no_gpu()  # a user's Triton kernels run interpreted and corrected here, like the adapters'
    path = check_target_file(target)
    if path is not None:
        mod_name = f"_harness_user_{abs(hash(str(path.resolve())))}"
        spec = importlib.util.spec_from_file_location(mod_name, path)
        if spec is None or spec.loader is None:
            raise InvalidArgument(f"kernel={target!r}: {str(path)!r} cannot be imported as a Python file")
        module = importlib.util.module_from_spec(spec)
        sys.modules[mod_name] = module
        folder = str(path.resolve().parent)
        if folder not in sys.path:
            sys.path.insert(0, folder)
        from harness.project import find_root

        root = str(find_root(path.resolve().parent))  # last: a file of a package imports it by name, as in its
        if root not in sys.path:                       # tests (`from mykern.scan import scan`; blind hunt, session 23)
            sys.path.append(root)
        try:
            with _process_state_kept():
                spec.loader.exec_module(module)
        except BaseException as exc:  # noqa: BLE001 - the user's file, not the harness, failed
            sys.modules.pop(mod_name, None)
            if isinstance(exc, KeyboardInterrupt) and not _in_worker():  # a Ctrl-C while it loaded
                raise
            raise InvalidArgument(f"kernel={target!r}: importing {str(path)!r} failed: {_import_error(exc)}; "
                                  "expected a Python file that imports cleanly") from None
    else:
        if os.getcwd() not in sys.path and "" not in sys.path:
            sys.path.append(os.getcwd())
        try:
            with _process_state_kept():
                module = importlib.import_module(where)
        except BaseException as exc:  # noqa: BLE001 - ImportError, SyntaxError, or raised at import
            if isinstance(exc, KeyboardInterrupt) and not _in_worker():
                raise
            raise InvalidArgument(f"kernel={target!r}: module {where!r} cannot be imported: "
                                  f"{_import_error(exc)}") from None
    obj = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise InvalidArgument(f"kernel={target!r}: {where!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if not callable(obj) and not isinstance(obj, KernelSpec):
        raise InvalidArgument(f"kernel={target!r} names a {type(obj).__name__}, which is not callable (nor a "
                              "KernelSpec declaring one)")
    return obj
