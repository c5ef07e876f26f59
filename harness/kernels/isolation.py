"""Running a kernel in a worker process, so that a crash or a hang costs one record, never the run.

A kernel under test is untrusted: it may segfault, call ``os._exit``, abort in a CUDA assertion, loop
forever or leave a thread running. By default (`DEFAULT_ISOLATION` ``"process"``) every call goes to a
long-lived worker process of its own kernel (`Worker`), which the harness replaces when it dies:

- the worker is forked from a ``forkserver`` that has imported torch and the harness once, so a
  (re)start costs a fork, not a fresh interpreter; nothing the parent process did (threads, OpenMP
  pools, a CUDA context) is inherited by it;
- the worker loads the kernel itself, by reference (`KernelRef`): a registered name, a user target
  (``path.py:fn`` / ``module:attr``) or a picklable module-level callable. ``TRITON_INTERPRET`` is set in
  the worker (`harness.kernels.triton_interpreter.interpret_if_no_gpu`) before it loads anything, and its
  torch threads to its share of the cores (`harness.threads`: torch's default, every core in the harness
  and in its worker both, spin-waited for descheduled siblings on a busy machine);
- tensors go both ways through one shared-memory arena per worker (`Arena`: a byte buffer both
  processes map, handed to the worker once through torch's multiprocessing reductions): the harness
  copies the inputs in (strides kept) and sends only their offsets, shapes and dtypes down the pipe;
  the worker writes the output after them. Inputs the kernel wrote to are copied back, so the
  harness's mutation check sees them. Nothing large is pickled, and no file descriptor is passed per
  call (torch's per-tensor sharing cost ~25 ms a tensor here, the arena ~0.1 ms);
- a worker that exits or is killed by a signal gives the ``crashed`` outcome, with the exit code or the
  signal's name and the last lines the worker wrote to its stdout/stderr (kept in a log file); a call
  that takes longer than the timeout kills the worker (``timeout``); a kernel that leaves a non-daemon
  thread alive gets its worker replaced after the call (the thread would keep a process alive). Each
  worker leads a process group of its own, and closing it kills the group: a process the kernel started
  and never waited for (a helper, a compile server) does not outlive the worker.
  Workers ignore SIGINT: a Ctrl-C stops the harness, which then writes its partial report.

``"in-process"`` (``harness check --in-process``) runs the kernel in the harness's own process, on a
worker thread with the same timeout (a hang is abandoned, a crash ends the harness): the mode for
stepping through a kernel with pdb or a debugger. A callable that cannot be loaded by reference (a
closure, a lambda) always runs in-process; the record's ``isolation`` field says which mode ran it and why.

Gradients (`harness.gradients`) run their backward in the same worker as the forward (`Worker.vjp`):
the autograd graph never leaves the worker, only the input gradients come back.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import multiprocessing
import os
import pickle
import signal
import sys
import tempfile
import threading
import time
import types
from dataclasses import dataclass
from typing import Any, Callable

#: "process" (a worker process per kernel) or "in-process" (a thread of the harness, for debugging).
ISOLATION_MODES = ("process", "in-process")
DEFAULT_ISOLATION = "process"
#: Default per-call timeout in seconds.
DEFAULT_TIMEOUT_S = 120.0
#: How many workers stay alive at once by default (a sweep over many kernels closes the least recently used;
#: a run that cycles through more kernels than this, case by case, raises it with `configure`, or every case
#: restarts its kernel's worker and re-imports its package: seconds each for fla).
MAX_WORKERS = 4
#: How long a worker may take to start and load its kernel (imports of a third-party package included).
START_TIMEOUT_S = 120.0
#: Lines of the worker's output kept in a ``crashed`` record.
TAIL_LINES = 12
#: How long idle workers are given to exit on their own when the harness lets them go (at exit, or the least
#: recently used beyond ``max_workers``) before they are killed. A worker that exits runs its finalizers: a
#: library's named semaphore is unlinked (numba's thread-pool lock: killed, it was left to the resource tracker,
#: which warned "There appear to be 1 leaked semaphore objects to clean up at shutdown" after every run with a
#: compiled retention or gated kernel). A worker that does not exit in time (a leaked thread, a child it waits
#: for) is killed as before.
RETIRE_S = 2.0
#: The private memory a worker may keep beyond what it held once its kernel was loaded (bytes; None: a quarter
#: of the machine's memory, read when first needed). A kernel that keeps what it allocates (a cache that only
#: grows, tensors appended to a global) would grow its worker call after call until the out-of-memory killer
#: chose a process, perhaps not the worker; past this the worker is replaced after the call and the record's
#: ``isolation_note`` says how much it kept. Temporaries freed after a call do not count.
RETAINED_LIMIT_BYTES: int | None = None
#: The largest shared-memory arena a worker keeps between calls (bytes). An arena grows to the largest call
#: it served (inputs and room for as large an output); one kept at that size by each of a run's workers
#: (one per kernel) held 7 GB of shared memory in a nightly gated calibration, which the out-of-memory killer
#: then ended. A larger one is let go after its call and made again, as large as needed, by the next.
ARENA_KEEP_BYTES = 256 << 20


@dataclass
class _Defaults:
    isolation: str = DEFAULT_ISOLATION
    timeout_s: float | None = DEFAULT_TIMEOUT_S
    timeout_configured: bool = False  # set by `configure`: then it wins over a profile's own default
    max_workers: int = MAX_WORKERS


_DEFAULTS = _Defaults()


def configure(*, isolation: str | None = None, timeout_s: float | None | type(...) = ...,
              max_workers: int | None = None) -> None:
    """Set the session's defaults (the CLI's ``--in-process`` / ``--timeout``, the pytest plugin's options,
    the calibration's worker count: one per kernel it cycles through)."""
    if isolation is not None:
        _DEFAULTS.isolation = validate_isolation(isolation)
    if timeout_s is not ...:
        _DEFAULTS.timeout_s = validate_timeout(timeout_s)
        _DEFAULTS.timeout_configured = True
    if max_workers is not None:
        if isinstance(max_workers, bool) or not isinstance(max_workers, int) or max_workers < 1:
            from harness.errors import InvalidArgument

            raise InvalidArgument(f"max_workers={max_workers!r}; expected a whole number >= 1 (workers kept alive)")
        _DEFAULTS.max_workers = max_workers
        with _LOCK:
            _trim(max_workers)


def max_workers() -> int:
    """How many workers stay alive at once (`configure`)."""
    return _DEFAULTS.max_workers


@contextlib.contextmanager
def workers_kept(count: int, limit: int | None = None):
    """Keep at least ``count`` workers alive inside the block (``limit``, when given, instead), then the
    previous limit again. For a run that goes problem by problem through more kernels than `MAX_WORKERS`
    (to share one oracle): with fewer live workers than kernels every case restarts its kernel's worker,
    and with it the package's imports (seconds for fla) or a CUDA context."""
    saved = _DEFAULTS.max_workers
    configure(max_workers=limit if limit is not None else max(saved, count))
    try:
        yield
    finally:
        configure(max_workers=saved)


def default_isolation() -> str:
    return _DEFAULTS.isolation


def default_timeout(profile_default: float | None | type(...) = ...) -> float | None:
    """The per-call timeout: the one `configure` set, else ``profile_default`` when given (a search
    profile's own, `harness.settings.Limits.timeout_s`), else `DEFAULT_TIMEOUT_S`."""
    if not _DEFAULTS.timeout_configured and profile_default is not ...:
        return profile_default
    return _DEFAULTS.timeout_s


def validate_isolation(value: str) -> str:
    from harness.errors import InvalidArgument

    if value not in ISOLATION_MODES:
        raise InvalidArgument(f"isolation={value!r} is not a mode; expected one of {list(ISOLATION_MODES)}")
    return value


def validate_timeout(value: Any) -> float | None:
    from harness.errors import InvalidArgument

    if value is None:
        return None
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        raise InvalidArgument(f"timeout={value!r} is not a number; expected seconds > 0") from None
    if not seconds > 0 or seconds == float("inf"):
        raise InvalidArgument(f"timeout={value!r} must be a finite number of seconds > 0")
    return seconds


# ------------------------------------------------------------------------------------ kernel references
@dataclass(frozen=True)
class KernelRef:
    """How a worker loads a kernel: ``kind`` is ``registered`` (a name), ``target`` or ``callable``."""

    kind: str
    value: Any
    family: str | None = None

    @property
    def key(self) -> tuple:
        return (self.kind, self.value if self.kind != "callable" else id(self.value), self.family)

    def load(self) -> Callable:
        if self.kind == "registered":
            from harness.kernels import registry

            return registry.get(self.value).callable()
        if self.kind == "target":
            from harness.kernels.contract import KernelSpec
            from harness.kernels.registry import resolve_target

            found = resolve_target(self.value)
            return found.callable() if isinstance(found, KernelSpec) else found
        return self.value


def user_target(spec) -> str | None:
    """The ``module:attr`` / ``file.py:attr`` target a user kernel spec was made from, else None."""
    name = getattr(spec, "name", "")
    if getattr(spec, "source", None) == "user" and name.startswith("user.") and ":" in name:
        return name.removeprefix("user.")
    return None


def kernel_ref(spec, fn: Callable | None = None) -> tuple[KernelRef | None, str]:
    """(the reference a worker loads ``spec`` by, "") or (None, why it cannot be loaded in a worker).

    ``fn``: a callable that stands in for the spec's (``run_case(kernel_fn=...)``).
    """
    from harness.kernels import registry

    if fn is None:
        try:
            if registry.get(spec.name) is spec:
                return KernelRef("registered", spec.name, spec.family.value), ""
        except Exception:  # noqa: BLE001 - not registered: try the other ways
            pass
        target = user_target(spec)
        if target is not None:
            return KernelRef("target", target, spec.family.value), ""
        fn = spec.callable()
    if getattr(fn, "__module__", None) == "__main__":  # a worker does not run the caller's __main__
        return None, ("a function of __main__ with no script file to load it from (python -c, stdin, a notebook) "
                      "cannot be loaded in a worker")
    try:
        pickle.dumps(fn)
    except Exception as exc:  # noqa: BLE001 - a closure or lambda: only this process has it
        return None, f"the callable cannot be loaded by reference in a worker ({type(exc).__name__})"
    return KernelRef("callable", fn, spec.family.value), ""


# ----------------------------------------------------------------------------------------- the worker
#: The files whose lines call a kernel (this one in a worker, guard.py in process, contract.py's device
#: wrapper): a TypeError whose last frame is one of them was raised by the call, not by the kernel's code.
_CALL_SITES = frozenset(os.path.join(os.path.dirname(os.path.abspath(__file__)), name)
                        for name in ("isolation.py", "guard.py", "contract.py"))


def _describe(exc: BaseException) -> str:
    """``Type: message (at file:line)`` of an exception a kernel raised. A TypeError whose last frame is the
    harness's own call is the call failing to bind (a signature that does not take the family's arguments):
    said so, where "(at harness/kernels/isolation.py:495)" sent its reader into the harness's code."""
    import traceback

    frames = traceback.extract_tb(exc.__traceback__)
    where = f" (at {frames[-1].filename}:{frames[-1].lineno})" if frames else ""
    if isinstance(exc, TypeError) and frames and os.path.abspath(frames[-1].filename) in _CALL_SITES:
        where = (" (raised by the call itself, before any line of the kernel ran: its signature does not take "
                 "the arguments of the family's call)")
    try:
        text = str(exc)
    except BaseException as inner:  # noqa: BLE001 - an exception whose str() raises is still the kernel's
        text = f"<its str() raised {type(inner).__name__}>"
    if len(text) > MAX_MESSAGE_CHARS:  # a 30 MB message made a 1.26 GB report
        text = f"{text[:MAX_MESSAGE_CHARS]}... ({len(text):,} characters, cut)"
    return f"{type(exc).__name__}: {text}{where}"


def differentiable(args: tuple, kwargs: dict, wanted) -> tuple[list, list]:
    """``args`` (made a list; ``kwargs`` updated in place) with fresh leaves that require grad at
    ``wanted`` (positions or keyword names), and those leaves in order."""
    args, leaves = list(args), []
    for key in wanted:
        holder = args if isinstance(key, int) else kwargs
        holder[key] = holder[key].detach().clone().requires_grad_(True)
        leaves.append(holder[key])
    return args, leaves


#: The longest exception message a record keeps (`_describe`): a kernel that raised with 30 MB of text wrote it
#: into every record and report file (1.26 GB) and to the terminal.
MAX_MESSAGE_CHARS = 4000

_IN_WORKER = False  # set in a worker before it loads its kernel
#: How a call's error begins when its worker could not load the kernel (every call would fail alike).
LOAD_FAILED = "the worker could not load the kernel"


def refuse_in_worker(what: str) -> None:
    """Raise when called in a worker: the kernel's module started a harness run while being loaded (a script
    whose top level calls ``harness.check``, loaded by its file because the function came from it), which
    would start workers of its own, each loading the script again."""
    if _IN_WORKER:
        raise RuntimeError(f"{what} was called while a worker loaded its kernel: the kernel's file runs it at its "
                           f"top level; put that call under `if __name__ == \"__main__\":` (the worker loads "
                           f"the file as a module of another name, as multiprocessing does)")


def private_bytes(pid: int) -> int | None:
    """The private resident memory of process ``pid`` in bytes (Linux's ``RssAnon``: not the shared-memory
    arena, not mapped files), or None where it cannot be read."""
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("RssAnon:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def retained_limit() -> int:
    """`RETAINED_LIMIT_BYTES`, or a quarter of the machine's memory (4 GiB where it cannot be read)."""
    if RETAINED_LIMIT_BYTES is not None:
        return RETAINED_LIMIT_BYTES
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 4
    except (OSError, ValueError, AttributeError):
        return 4 << 30


def _leaked_threads() -> list[str]:
    main = threading.main_thread()
    return [t.name for t in threading.enumerate() if t is not main and t.is_alive() and not t.daemon]


_ALIGN = 64


@dataclass(frozen=True)
class _Slot:
    """Where one tensor lies in the arena: byte offset, shape, strides (elements), dtype, device."""

    offset: int
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: str
    device: str

    @staticmethod
    def span(shape, stride) -> int:
        """Elements of storage a tensor of ``shape`` and ``stride`` reaches (0 when it is empty)."""
        if any(n == 0 for n in shape):
            return 0
        return 1 + sum((n - 1) * st for n, st in zip(shape, stride))


class Arena:
    """A shared byte buffer both processes map; tensors are copied in at 64-byte aligned offsets."""

    def __init__(self, nbytes: int, buffer=None):
        import torch

        self.buffer = buffer if buffer is not None else torch.empty(nbytes, dtype=torch.uint8).share_memory_()
        self.cursor = 0

    @property
    def nbytes(self) -> int:
        return self.buffer.numel()

    @staticmethod
    def needed(tensors) -> int:
        return sum(_Slot.span(t.shape, t.stride()) * t.element_size() + _ALIGN for t in tensors)

    def view(self, slot: _Slot):
        import torch

        dtype = getattr(torch, slot.dtype)
        size = _Slot.span(slot.shape, slot.stride) * torch.empty((), dtype=dtype).element_size()
        flat = self.buffer[slot.offset:slot.offset + size].view(dtype)
        return flat.as_strided(slot.shape, slot.stride)

    def put(self, tensor) -> _Slot | None:
        """Copy ``tensor`` in (its strides kept when it is dense, e.g. transposed); None when it does not fit."""
        stride = tuple(tensor.stride())
        if _Slot.span(tensor.shape, stride) != tensor.numel():  # gaps or overlaps (an expanded view)
            tensor = tensor.contiguous()
            stride = tuple(tensor.stride())
        size = _Slot.span(tensor.shape, stride) * tensor.element_size()
        offset = -(-self.cursor // _ALIGN) * _ALIGN
        if offset + size > self.nbytes:
            return None
        slot = _Slot(offset, tuple(tensor.shape), stride, str(tensor.dtype).removeprefix("torch."),
                     str(tensor.device))
        self.cursor = offset + size
        if size:
            self.view(slot).copy_(tensor.detach())
        return slot

    def get(self, slot: _Slot, *, copy: bool):
        """The tensor of ``slot`` on its device (a copy when ``copy``, else a view of the arena on the CPU)."""
        view = self.view(slot)
        if slot.device != "cpu":
            return view.to(slot.device)
        return view.clone() if copy else view


def _pack(value, arena: Arena):
    """``value`` with every CPU/CUDA tensor in it replaced by the `_Slot` it was copied to.

    A tensor that does not fit, or lies on another device (``meta``), travels as itself (pickled).
    """
    import torch

    if isinstance(value, torch.Tensor):
        if value.device.type in ("cpu", "cuda"):
            slot = arena.put(value)
            if slot is not None:
                return slot
        return value.detach()
    if isinstance(value, tuple):
        return tuple(_pack(v, arena) for v in value)
    if isinstance(value, list):
        return [_pack(v, arena) for v in value]
    if isinstance(value, dict):
        return {k: _pack(v, arena) for k, v in value.items()}
    return value


def _unpack(value, arena: Arena, *, copy: bool):
    if isinstance(value, _Slot):
        return arena.get(value, copy=copy)
    if isinstance(value, tuple):
        return tuple(_unpack(v, arena, copy=copy) for v in value)
    if isinstance(value, list):
        return [_unpack(v, arena, copy=copy) for v in value]
    if isinstance(value, dict):
        return {k: _unpack(v, arena, copy=copy) for k, v in value.items()}
    return value


@contextlib.contextmanager
def float32_dots(precision: str | None):
    """Run the block with Triton's float32 ``tl.dot`` default input precision set to ``precision`` (``"ieee"``:
    plain float32 products instead of TF32), where a kernel has loaded triton; else (None, or no triton in
    this process) it changes nothing. The runner's TF32 counterfactual calls a kernel under it."""
    if precision is None or "triton" not in sys.modules:
        yield
        return
    from harness.kernels.triton_interpreter import dot_input_precision

    with dot_input_precision(precision):
        yield


def _die_with_parent() -> None:
    """Have the kernel (Linux) SIGKILL this worker when its parent, the forkserver, exits: the forkserver
    exits when the harness does, however it ends (a CI runner's SIGKILL included), once no worker holds
    the pipe it watches for that; a worker hung in a kernel would otherwise outlive both in a session of
    its own. Elsewhere only the pipe is let go."""
    from multiprocessing import forkserver

    server = forkserver._forkserver  # the forkserver exits when no process holds its "alive" pipe; a child
    alive = getattr(server, "_forkserver_alive_fd", None)  # inherits it, and a worker holding it would keep
    if alive is not None:  # the server, and so itself, alive after the harness is gone (a private attribute
        try:  # of CPython's forkserver since 3.4: where it is missing, nothing is let go)
            os.close(alive)
        except OSError:
            pass
        server._forkserver_alive_fd = None
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    parent = os.getppid()
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
        libc.prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER: orphans of the kernel's helpers stay below it
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # the parent died before the request took effect
        os._exit(1)


def _worker_main(conn, ref: KernelRef, log_path: str, threads: int) -> None:  # runs in the worker process
    fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the harness's to handle
    try:  # a process group of its own: closing the worker takes down what the kernel started too. Not a
        # session of its own (setsid): under autogroup scheduling a new session is a new CPU group at full
        # weight, and every worker of a `nice`d run would escape the priority its caller gave the run
        os.setpgid(0, 0)
    except OSError:  # a session leader (not under a forkserver): close() then kills the worker alone
        pass
    global _IN_WORKER
    _IN_WORKER = True
    _die_with_parent()  # out of the harness's group, so a kill of that group no longer reaches it: this does
    from harness.kernels.triton_interpreter import interpret_if_no_gpu

    interpret_if_no_gpu()  # before the kernel's package can import triton
    import torch

    from harness.threads import use_threads

    use_threads(threads)  # its share of the cores (`harness.threads`), before the kernel's module sets its own
    try:
        fn = ref.load()
    except BaseException as exc:  # noqa: BLE001 - said to the parent, which records it
        conn.send(("load_error", _describe(exc)))
        return
    me = os.getpid()
    conn.send(("ready", me))
    arena = None
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            return
        if msg is None:
            return
        if msg[0] == "arena":  # a new buffer, or None: the last one let go (`ARENA_KEEP_BYTES`)
            arena = Arena(0, buffer=msg[1]) if msg[1] is not None else None
            continue
        op, grad, args, kwargs, extra, cursor = msg
        args, kwargs, extra = _unpack((args, kwargs, extra), arena, copy=False)
        try:
            if op == "call":  # extra: the float32 dot precision to run under (`float32_dots`), or None
                with torch.set_grad_enabled(grad), float32_dots(extra):
                    value = fn(*args, **kwargs)
                out = kernel_outputs(value)
                reply = ("ok", out) if out is not None else ("value", value_kind(value))
            else:  # "vjp": extra = (the differentiated args: positions or keyword names, cotangent)
                wanted, cot = extra
                args, leaves = differentiable(args, kwargs, wanted)
                handed = input_snapshots(args, kwargs)  # a write in training's call is one too
                with torch.enable_grad():
                    try:
                        out = fn(*args, **kwargs)
                    except BaseException as exc:  # noqa: BLE001 - the caller decides what it means
                        out, reply = None, ("forward_raised", _describe(exc))
                    if isinstance(out, (tuple, list)) and out:  # (output, final state, ...): the output's
                        out = out[0]
                    if out is None:
                        pass
                    elif not (isinstance(out, torch.Tensor) and out.requires_grad):
                        reply = ("not_differentiable", None)  # no autograd graph: nothing to check
                    else:
                        grads = torch.autograd.grad(out, leaves, cot.to(out.dtype), allow_unused=True)
                        # and the forward's output: a training path's forward is judged too (`gradient_case`)
                        reply = ("ok", (tuple(None if g is None else g.detach() for g in grads), out.detach()))
                written = written_input(handed, " in the forward and backward with inputs requiring grad")
                if written is not None:
                    reply = ("mutated_input", written)
        except BaseException as exc:  # noqa: BLE001 - any kernel failure is a finding
            reply = ("raised", _describe(exc))
        if os.getpid() != me:  # a process the kernel forked came back through this loop: it must not answer
            os._exit(0)  # (nor read the next request); its parent, the worker, answers for the call
        del args, kwargs
        arena.cursor = cursor  # the output goes after the inputs
        reply = (reply[0], _pack(reply[1], arena)) if reply[0] == "ok" else reply
        try:
            conn.send((reply, _leaked_threads()))
        except Exception as exc:  # noqa: BLE001 - e.g. an output torch cannot share
            conn.send((("raised", f"the output cannot be sent back to the harness: {_describe(exc)}"),
                       _leaked_threads()))


_CONTEXT = None


def _forkserver():
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "torch.multiprocessing", "harness.kernels.isolation"])
    return ctx


def _context():
    """A forkserver context whose server has imported torch and this module once (cheap forks after)."""
    global _CONTEXT
    refuse_in_worker("a harness worker start")
    if _CONTEXT is None:
        import torch.multiprocessing  # noqa: F401 - registers the shared-memory reductions of tensors

        _CONTEXT = _forkserver()
    return _CONTEXT


def prestart() -> None:
    """Start the forkserver now, before the caller imports torch: its own imports of torch and the harness
    then run beside the caller's instead of after them (`harness check` starts it first thing: a small check
    took 8.1 s instead of 10.0 on two cores, medians of three). Nothing when kernels run in-process."""
    if _DEFAULTS.isolation != "process":
        return
    from multiprocessing import forkserver

    _forkserver()
    with _without_main():  # the server must not import the caller's __main__ either
        forkserver.ensure_running()


@contextlib.contextmanager
def _without_main():
    """Start a worker without re-running the harness's ``__main__`` in it.

    multiprocessing re-imports the parent's main script in a new process (for pickled references into
    it). A worker loads its kernel by reference and never needs it; a user's script without an
    ``if __name__ == "__main__":`` guard (or one read from stdin) would otherwise run again in every
    worker. The real module is back in place as soon as the process has started.
    """
    real = sys.modules["__main__"]
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        yield
    finally:
        sys.modules["__main__"] = real


class Interrupted(KeyboardInterrupt):
    """The run was asked to stop (SIGINT, SIGTERM); ``reason`` names the signal."""

    def __init__(self, reason: str = "interrupted (SIGINT)"):
        super().__init__(reason)
        self.reason = reason


_STOP: list[str] = []


def request_stop(reason: str) -> None:
    """Ask the run to stop: a wait for a kernel raises `Interrupted` within `POLL_S`, and the CLI's store
    raises it after the next record. Safe to call from a signal handler (it raises nothing there: an
    exception raised in a handler can land in a gc callback, which swallows it with a traceback)."""
    _STOP.append(reason)


def stop_requested() -> str | None:
    return _STOP[0] if _STOP else None


def clear_stop() -> None:
    _STOP.clear()


def raise_if_stopped() -> None:
    if _STOP:
        raise Interrupted(_STOP[0])


#: How often a wait for a kernel looks for a stop request, in seconds.
POLL_S = 0.2
#: A call gets back the time its worker waited for a CPU (runnable but not running: a busy machine, a
#: shared CI runner), up to this many times its timeout in all; a hung kernel (asleep, waiting on a lock,
#: in a loop that does get the CPU) waits for no CPU and times out at its timeout.
STARVED_TIMEOUT_FACTOR = 10.0
#: A wait for a kernel's reply that comes back this much later than it asked (seconds) means the harness
#: itself did not run meanwhile (its process group stopped by SIGSTOP or Ctrl-Z, the machine suspended):
#: that time is given back to the call, whatever its length (`Worker._receive`).
PAUSED_S = 1.0


def cpu_wait_s(pid: int) -> dict[int, float]:
    """Seconds each thread of process ``pid`` has spent runnable but waiting for a CPU (Linux's
    ``/proc/PID/task/TID/schedstat``, second field); empty where that is not available."""
    waits: dict[int, float] = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return waits
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as fh:
                waits[int(tid)] = int(fh.read().split()[1]) / 1e9
        except (OSError, ValueError, IndexError):
            continue
    return waits


def starved_s(pid: int, before: dict[int, float]) -> float:
    """The longest any thread of ``pid`` has waited for a CPU since ``before`` (`cpu_wait_s`)."""
    now = cpu_wait_s(pid)
    return max((wait - before.get(tid, 0.0) for tid, wait in now.items()), default=0.0)


class WorkerCrashed(Exception):
    """The worker died during a call; ``str()`` says how (exit code or signal, and its last lines)."""


class WorkerTimeout(Exception):
    """The call took longer than the timeout; the worker was killed."""


class Worker:
    """One worker process running one kernel, reused call after call until it crashes or hangs."""

    def __init__(self, ref: KernelRef):
        from harness.threads import worker_thread_count

        self.ref = ref
        ctx = _context()
        fd, self.log_path = tempfile.mkstemp(prefix="harness-worker-", suffix=".log")
        os.close(fd)
        self.conn, child = ctx.Pipe(duplex=True)
        self.process = ctx.Process(target=_worker_main, args=(child, ref, self.log_path, worker_thread_count()),
                                   name=f"harness-kernel-{ref.kind}", daemon=False)
        with _without_main():
            self.process.start()
        child.close()
        self.leaked: list[str] = []
        self.retained = 0  # bytes kept beyond `loaded_bytes` when that passed the limit (the worker is replaced)
        self.calls = 0
        self.arena: Arena | None = None
        try:
            status, value = self._receive(START_TIMEOUT_S, starting=True)
        except BaseException:  # a stop requested while it loads (Ctrl-C, SIGTERM): no worker left to join at exit
            self.close()
            raise
        if status == "load_error":
            self.close()
            raise WorkerCrashed(f"{LOAD_FAILED}: {value}")
        self.loaded_bytes = private_bytes(self.process.pid)

    @property
    def alive(self) -> bool:
        return self.process.is_alive()

    def tail(self, lines: int = TAIL_LINES) -> list[str]:
        try:
            with open(self.log_path, "rb") as fh:
                fh.seek(0, os.SEEK_END)
                fh.seek(max(0, fh.tell() - 8192))
                text = fh.read().decode("utf-8", "replace")
        except OSError:
            return []
        return [ln for ln in text.splitlines() if ln.strip()][-lines:]

    def _death(self) -> str:
        self.process.join(5)
        code = self.process.exitcode
        if code is None:
            how = "stopped answering"
        elif code < 0:
            try:
                how = f"killed by signal {signal.Signals(-code).name}"
            except ValueError:
                how = f"killed by signal {-code}"
            if -code == signal.SIGKILL:  # the one a process cannot catch: its usual sender is the OOM killer
                how += (" (what the out-of-memory killer sends: the kernel may have asked for more memory than "
                        "the machine has)")
        else:
            how = f"exited with code {code}"
        tail = self.tail()
        return f"worker process {how}" + (": last output: " + " | ".join(tail) if tail else " (no output)")

    def _receive(self, timeout_s: float | None, *, starting: bool = False):
        began = time.monotonic()
        deadline = None if timeout_s is None else began + timeout_s
        waited_before = cpu_wait_s(self.process.pid) if timeout_s is not None else {}
        starved = 0.0
        while True:
            wait = None if deadline is None else max(0.0, deadline - time.monotonic())
            raise_if_stopped()
            asked = POLL_S if wait is None or wait > POLL_S else wait
            polled = time.monotonic()
            ready = self.conn.poll(asked)
            paused = time.monotonic() - polled - asked
            if paused > PAUSED_S and deadline is not None:  # the harness was stopped, not the kernel slow
                began, deadline = began + paused, deadline + paused
            if ready:
                try:
                    return self.conn.recv()
                except (EOFError, OSError):
                    message = self._death()
                    self.close()
                    raise WorkerCrashed(message) from None
            if not self.process.is_alive():  # died without closing the pipe first
                message = self._death()
                self.close()
                raise WorkerCrashed(message)
            if deadline is not None and time.monotonic() >= deadline:
                starved = starved_s(self.process.pid, waited_before)
                extended = began + min(timeout_s + starved, STARVED_TIMEOUT_FACTOR * timeout_s)
                if extended > time.monotonic():  # the time it waited for a CPU is given back
                    deadline = extended
                    continue
                self.close()
                busy = f" ({starved:.3g} s of it waiting for a CPU)" if starved >= 0.05 * timeout_s else ""
                if starting:
                    raise WorkerCrashed(f"the worker did not start within {timeout_s:g} s{busy}")
                raise WorkerTimeout(f"no result after {timeout_s:g} s{busy}")

    def request(self, op: str, args: tuple, kwargs: dict, grad: bool, extra: Any, timeout_s: float | None):
        """``(status, value)``: ``("ok", tensor or tuple)``, ``("value", type name)``, ``("raised", text)``.

        Raises `WorkerCrashed` or `WorkerTimeout` (the worker is then gone).
        """
        tensors = _tensors((args, kwargs, extra))
        need = 2 * Arena.needed(tensors) + (1 << 16)  # inputs, and room for an output as large
        try:
            if self.arena is None or self.arena.nbytes < need:
                self.arena = Arena(max(need, 1 << 22))
                self.conn.send(("arena", self.arena.buffer))
            self.arena.cursor = 0
            packed = _pack((args, kwargs, extra), self.arena)
            self.conn.send((op, grad, *packed, self.arena.cursor))
        except (BrokenPipeError, EOFError, OSError):
            message = self._death()
            self.close()
            raise WorkerCrashed(message) from None
        try:
            reply, leaked = self._receive(timeout_s)
        except (WorkerCrashed, WorkerTimeout):
            raise
        except BaseException:  # e.g. Ctrl-C while waiting: the reply would arrive out of turn; start afresh
            self.close()
            raise
        _copy_back(tensors, _tensors(packed), self.arena)
        reply = (reply[0], _unpack(reply[1], self.arena, copy=True))
        self.calls += 1
        if self.arena.nbytes > ARENA_KEEP_BYTES:
            self.release_arena()
        if leaked:
            self.leaked = leaked
            self.close()  # a non-daemon thread would keep the worker alive; the next call gets a fresh one
        else:
            now = private_bytes(self.process.pid)
            if now is not None and self.loaded_bytes is not None and now - self.loaded_bytes > retained_limit():
                self.retained = now - self.loaded_bytes
                self.close()  # before it takes the machine's memory: the next call gets a fresh one
        return reply

    def release_arena(self) -> None:
        """Let go of the shared-memory arena, here and in the worker (the next call makes one again)."""
        self.arena = None
        try:
            self.conn.send(("arena", None))
        except (OSError, ValueError):  # the worker is gone: the next call finds out
            pass

    def ask_to_exit(self) -> bool:
        """Tell an idle worker to leave its loop (it then exits as a process does, finalizers run); False when
        it cannot be told (dead, or its pipe gone). Never for a worker in a call: that one is killed."""
        if not self.process.is_alive():
            return False
        try:
            self.conn.send(None)
        except (OSError, ValueError):
            return False
        return True

    def descendants(self) -> list[tuple[int, str]]:
        """``(pid, start time)`` of every live process below the worker (Linux ``/proc``; [] elsewhere). A helper
        the kernel starts in a session of its own (``start_new_session=True``) is out of the worker's group, so
        killing the group misses it (a blind hunt left 15 such ``sleep 1000`` behind); the worker is their
        subreaper (`_die_with_parent`), so even a helper's orphans are found here."""
        found, stack = [], [self.process.pid] if self.process.pid is not None else []
        while stack:
            pid = stack.pop()
            try:
                tasks = os.listdir(f"/proc/{pid}/task")
            except OSError:
                continue
            for task in tasks:
                try:
                    with open(f"/proc/{pid}/task/{task}/children") as fh:
                        kids = [int(k) for k in fh.read().split()]
                except (OSError, ValueError):
                    continue
                for kid in kids:
                    started = _start_time(kid)
                    if started is not None:
                        found.append((kid, started))
                        stack.append(kid)
        return found

    def close(self, below: list[tuple[int, str]] | None = None) -> None:
        """Kill the worker and every process the kernel started in its group (a compile server, a helper
        it never waited for), and those below it in sessions of their own (``below``: taken before the worker
        was asked to exit, else now): none of them outlives the worker, whether it is closed alive or found
        dead."""
        below = (below or []) + self.descendants()
        if self.process.pid is not None:
            try:
                os.killpg(self.process.pid, signal.SIGKILL)
            except OSError:  # no such group (it never started, or everything in it is gone)
                pass
        if self.process.is_alive():
            try:
                self.process.kill()
            except OSError:
                pass
            self.process.join(5)
        for pid, started in below:  # the same process still (a pid the system has reused is left alone)
            if _start_time(pid) == started:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
        try:
            self.conn.close()
        except OSError:
            pass
        try:
            os.unlink(self.log_path)
        except OSError:
            pass


def _start_time(pid: int) -> str | None:
    """A process's start time (field 22 of ``/proc/PID/stat``), which tells it from a later one with its pid; None
    when it is gone (or a zombie, nothing left to kill)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return None if fields[0] == "Z" else fields[19]


def kernel_outputs(value):
    """A kernel's return value as the harness takes it: a tensor, detached; or a tuple whose first element
    is the output tensor and whose others (a final state, ...) are tensors or None, detached; None for
    anything else (not a kernel output)."""
    if _readable(value):
        return value.detach()
    if (isinstance(value, (tuple, list)) and value and _readable(value[0])
            and all(v is None or _readable(v) for v in value)):
        return tuple(None if v is None else v.detach() for v in value)
    return None


def _readable(v) -> bool:
    """Whether ``v`` is a tensor the harness can read as an output: dense and strided (a sparse, nested or
    quantized tensor is not: the last two broke the harness's own copy into shared memory, reported as the
    kernel's crash, a blind hunt found in session 27)."""
    import torch

    return (isinstance(v, torch.Tensor) and v.layout == torch.strided and not v.is_nested
            and not v.is_quantized)


def value_kind(value) -> str:
    """What a return value that `kernel_outputs` does not take is, for the message: its type, a tensor's layout,
    or a tuple's first element that is neither a (dense) tensor nor None."""
    import torch

    if isinstance(value, torch.Tensor):
        kind = ("nested tensor" if value.is_nested else "quantized tensor" if value.is_quantized
                else f"tensor of layout {value.layout}")
        return f"a {kind} (expected a dense, strided one)"
    if isinstance(value, (tuple, list)) and value:
        for i, v in enumerate(value):
            if not (v is None and i > 0) and not _readable(v):
                return f"{type(value).__name__} whose element {i} is {value_kind(v) if v is not None else 'None'}"
    return type(value).__name__


def _tensors(value) -> list:
    """The tensors (or slots) in nested tuples, lists and dicts, in a stable order."""
    import torch

    if isinstance(value, (torch.Tensor, _Slot)):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in _tensors(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _tensors(v)]
    return []


def _copy_back(originals: list, slots: list, arena: Arena) -> None:
    """Write back into the harness's inputs what the kernel wrote into their arena copies."""
    for original, slot in zip(originals, slots):
        if not isinstance(slot, _Slot):
            continue
        now = arena.view(slot)
        if not same_bits(original, now):
            try:
                original.copy_(now.to(original.device))
            except RuntimeError:  # an expanded (stride 0) input cannot be written element by element
                pass


def same_bits(x, y) -> bool:
    """Bit-for-bit equality (shape and dtype included) that treats NaN as equal to NaN in the same place."""
    import torch

    if x.shape != y.shape or x.dtype != y.dtype:
        return False
    if x.device != y.device:
        y = y.to(x.device)
    return bool(torch.equal(x, y) or torch.equal(torch.nan_to_num(x, nan=0.0), torch.nan_to_num(y, nan=0.0))
                and torch.equal(torch.isnan(x), torch.isnan(y)))


def input_snapshots(args, kwargs) -> list:
    """``(name, tensor, copy)`` of every tensor a kernel is handed, positional and keyword (an initial state, D,
    z, a bias), for `written_input` after the call."""
    import torch

    handed = [(f"input #{i}", a) for i, a in enumerate(args)] + [(f"input {k!r}", v) for k, v in kwargs.items()]
    return [(name, a, a.detach().clone()) for name, a in handed if isinstance(a, torch.Tensor)]


def written_input(snapshots: list, when: str = "") -> str | None:
    """What a kernel wrote into the inputs `input_snapshots` copied (the first one changed), else None."""
    for name, arg, snap in snapshots:
        now = arg.detach()
        if not same_bits(now, snap):
            n = int((now != snap).sum()) if now.shape == snap.shape else now.numel()
            return f"{name} (shape {tuple(snap.shape)}) was written to{when}: {n} elements changed"
    return None


_WORKERS: "collections.OrderedDict[tuple, Worker]" = collections.OrderedDict()
_LOCK = threading.RLock()


def _retire(workers: list[Worker]) -> None:
    """Let idle ``workers`` go: each is asked to exit, all are given `RETIRE_S` together, then each is closed
    (what still runs in its group, the worker too if it did not exit, is killed)."""
    below = {id(w): w.descendants() for w in workers}  # before they exit: then their helpers go to init
    asked = [w for w in workers if w.ask_to_exit()]
    deadline = time.monotonic() + RETIRE_S
    for w in asked:
        w.process.join(max(0.0, deadline - time.monotonic()))
    for w in workers:
        w.close(below[id(w)])


def _trim(keep: int) -> None:
    """Let the least recently used workers beyond ``keep`` go (the caller holds ``_LOCK``)."""
    old = []
    while len(_WORKERS) > keep:
        old.append(_WORKERS.popitem(last=False)[1])
    _retire(old)


def worker_for(ref: KernelRef) -> Worker:
    """The live worker of ``ref``, started (or restarted) when needed; least recently used ones closed."""
    with _LOCK:
        worker = _WORKERS.get(ref.key)
        if worker is not None and worker.alive:
            _WORKERS.move_to_end(ref.key)
            return worker
        _WORKERS.pop(ref.key, None)
        _trim(_DEFAULTS.max_workers - 1)
        _close_at_exit()
        worker = Worker(ref)
        _WORKERS[ref.key] = worker
        return worker


def shutdown() -> None:
    """Let every worker go (at exit, and from tests): idle ones exit on their own within `RETIRE_S`."""
    with _LOCK:
        workers = list(_WORKERS.values())
        _WORKERS.clear()
        _retire(workers)


_ATEXIT = False


def _close_at_exit() -> None:
    """Register `shutdown` at exit, after multiprocessing's own exit handler (atexit runs handlers last
    in, first out): that handler joins every non-daemon child, and would wait forever on a live worker."""
    global _ATEXIT
    if not _ATEXIT:
        import multiprocessing.util  # noqa: F401 - registers its handler first, if it has not yet

        atexit.register(shutdown)
        _ATEXIT = True


def probe_target(target: str, family: str | None) -> None:
    """Load a user's ``module:attr`` / ``file.py:attr`` target in its worker before this process imports it (to
    read its signature, `harness.signatures`): a module that exits, is killed or hangs while it loads ends or
    stops that worker, not the harness, and is a usage error naming it (a blind hunt's ``os._exit(7)`` at
    import ended a whole project's run with no report). The worker stays, and runs the kernel's cases. A
    load that raises is left to this process's import, which names it (`registry.resolve_target`); one that
    raises ``KeyboardInterrupt`` is named here, as no Ctrl-C stopped the worker. Nothing is probed in a worker
    or with ``isolation="process"`` off (`configure`)."""
    from harness.errors import InvalidArgument

    if _IN_WORKER or default_isolation() != "process":
        return
    try:
        worker_for(KernelRef("target", target, family))
    except WorkerCrashed as exc:
        text = str(exc)
        if not text.startswith(LOAD_FAILED) or ": KeyboardInterrupt" in text:
            raise InvalidArgument(f"kernel={target!r}: loading it in a worker process failed: {text}; the harness "
                                  "does not import it in its own process; expected a module that imports "
                                  "cleanly") from None
    except WorkerTimeout as exc:
        raise InvalidArgument(f"kernel={target!r}: loading it in a worker process did not finish ({exc}; "
                              f"`START_TIMEOUT_S` = {START_TIMEOUT_S:g} s); expected a module that imports in "
                              "bounded time") from None


def warm(ref: KernelRef) -> None:
    """Start ``ref``'s worker now if it is not running, so that its start is not timed as the kernel's
    (a worker that fails to start is reported by the `run` that follows)."""
    with _LOCK:
        try:
            worker_for(ref)
        except WorkerCrashed:
            pass


def run(ref: KernelRef, op: str, args: tuple, kwargs: dict, *, grad: bool = False, extra: Any = None,
        timeout_s: float | None = None) -> tuple[str, Any, str]:
    """One call in ``ref``'s worker: ``(status, value, note)``, never raises for what the kernel does.

    status: ``ok`` | ``value`` (not a tensor: value is its type name) | ``raised`` | ``timeout`` |
    ``crashed``; ``note`` says when the worker was replaced after the call (a leaked thread).
    """
    with _LOCK:  # one call at a time per process, as in-process
        try:
            worker = worker_for(ref)
            status, value = worker.request(op, args, kwargs, grad, extra, timeout_s)
        except WorkerTimeout as exc:
            return "timeout", str(exc), ""
        except WorkerCrashed as exc:
            return "crashed", str(exc), ""
        note = ""
        if worker.leaked:
            note = f"the kernel left non-daemon threads running ({', '.join(worker.leaked)}); worker replaced"
            _WORKERS.pop(ref.key, None)
        elif worker.retained:
            note = (f"the worker kept {worker.retained / 2**20:.0f} MiB more private memory after {worker.calls} "
                    f"call(s) than once its kernel was loaded (over the {retained_limit() / 2**20:.0f} MiB "
                    f"allowed, `isolation.RETAINED_LIMIT_BYTES`: a leak?); worker replaced")
            _WORKERS.pop(ref.key, None)
        return status, value, note
