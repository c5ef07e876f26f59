"""Calling a kernel under its contract: timeout, output checks, input-mutation and determinism checks.

`call_guarded` never raises for anything the kernel does. It returns a `CallResult` whose ``outcome``
names what happened, one of `Outcome`; everything except ``ok`` becomes the ``kernel_error`` verdict
with the outcome as its cause, and the run goes on with the next case.

Where the kernel runs: given a ``worker`` (`harness.kernels.isolation.KernelRef`), in that kernel's
worker process, where a crash (``crashed``) or a hang (``timeout``) costs the worker, not the harness;
without one, on a thread of this process (``--in-process``: for pdb; a hang is abandoned, a crash is
the harness's). The contract checks below are the same either way and run here, in the harness.
"""

from __future__ import annotations

import enum
import math
import os
import queue
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

import torch

from harness.kernels import isolation


class Outcome(str, enum.Enum):
    OK = "ok"
    RAISED = "raised"
    CRASHED = "crashed"  # the worker process died: a signal (segfault, abort) or an exit code
    TIMEOUT = "timeout"
    NOT_A_TENSOR = "not_a_tensor"
    WRONG_SHAPE = "wrong_shape"
    WRONG_DTYPE = "wrong_dtype"
    WRONG_DEVICE = "wrong_device"
    MUTATED_INPUT = "mutated_input"
    NONDETERMINISTIC = "nondeterministic"


@dataclass
class CallResult:
    outcome: Outcome
    output: torch.Tensor | None = None
    message: str = ""
    seconds: float = 0.0
    note: str = ""  # about where it ran, e.g. a worker replaced after the kernel leaked a thread
    #: what the kernel returned after its output, when it returned a tuple (a final state, ...)
    extras: tuple = ()

    @property
    def ok(self) -> bool:
        return self.outcome is Outcome.OK


#: Default per-call timeout in seconds; a kernel that takes longer is reported as ``timeout``.
DEFAULT_TIMEOUT_S = isolation.DEFAULT_TIMEOUT_S


_same = isolation.same_bits
_describe = isolation._describe


class _Worker:
    """A long-lived daemon thread that runs guarded calls one at a time.

    A fresh thread per call cost ~4 ms on a 3 ms kernel (its allocator arena and pages start cold), time
    that was charged to the kernel. A call that times out leaves the worker stuck in the kernel (Python
    cannot kill a thread); the next call gets a new worker. A worker belongs to the process that made it
    (a forked child has none of its threads).
    """

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.jobs: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=self._loop, name="harness-kernel-call", daemon=True).start()

    def _loop(self) -> None:
        while True:
            fn, grad, box, done = self.jobs.get()
            try:
                with torch.set_grad_enabled(grad):  # grad mode is per thread: the caller's applies
                    box["value"] = fn()
            except BaseException as exc:  # noqa: BLE001 - any kernel failure is a finding
                box["error"] = _describe(exc)
            finally:
                done.set()
                del fn, box


_worker: _Worker | None = None
_worker_lock = threading.Lock()


def _run_with_timeout(fn: Callable[[], Any], timeout_s: float | None) -> tuple[str, Any]:
    """("ok", value) | ("raised", formatted exception) | ("timeout", None).

    With a timeout the kernel runs on `_Worker`'s thread; a kernel that hangs is abandoned with its
    thread, reported as ``timeout``, and the run continues.
    """
    global _worker
    if timeout_s is None:
        try:
            return "ok", fn()
        except BaseException as exc:  # noqa: BLE001 - any kernel failure is a finding
            return "raised", _describe(exc)
    box: dict[str, Any] = {}
    done = threading.Event()
    with _worker_lock:  # one guarded call at a time per process
        if _worker is None or _worker.pid != os.getpid():
            _worker = _Worker()
        _worker.jobs.put((fn, torch.is_grad_enabled(), box, done))
        deadline = time.monotonic() + timeout_s
        while not done.wait(min(isolation.POLL_S, max(0.0, deadline - time.monotonic()))):
            if isolation.stop_requested():  # Ctrl-C: the stuck thread is left behind, as on a timeout
                _worker = None
                isolation.raise_if_stopped()
            if time.monotonic() >= deadline:
                _worker = None
                return "timeout", None
    if "error" in box:
        return "raised", box["error"]
    return "ok", box.get("value")


def execute(fn: Callable, args: tuple, kwargs: dict[str, Any], timeout_s: float | None, *,
            worker: "isolation.KernelRef | None" = None, float32_dots: str | None = None) -> tuple[str, Any, str]:
    """One call of the kernel: ``(status, value, note)``, in ``worker``'s process or on a thread here.

    status: ``ok`` (value: the output), ``value`` (not a tensor; value: its type name), ``raised``
    (value: the exception), ``timeout``, ``crashed`` (value: how the worker died). ``float32_dots``: the
    Triton float32 dot precision the call runs under (`isolation.float32_dots`).
    """
    if worker is not None:
        return isolation.run(worker, "call", args, kwargs, grad=torch.is_grad_enabled(), extra=float32_dots,
                             timeout_s=timeout_s)

    def call():
        with isolation.float32_dots(float32_dots):
            return fn(*args, **kwargs)

    status, value = _run_with_timeout(call, timeout_s)
    if status == "ok":
        out = isolation.kernel_outputs(value)  # (output, final state, ...): kept whole
        if out is None:  # no tensor, or one the harness cannot read (sparse, nested, quantized)
            return "value", isolation.value_kind(value), ""
        value = value if isinstance(value, torch.Tensor) else tuple(value)
    return status, value, ""


def shape_hint(got: tuple[int, ...], want: tuple[int, ...]) -> str:
    """What a wrong output shape suggests, when it is the expected one rearranged: two axes swapped
    (another layout, e.g. (batch, heads, T, d) for (batch, T, heads, d)), or the same elements in
    another shape; "" otherwise."""
    if len(got) == len(want) and sorted(got) == sorted(want):
        swapped = [i for i in range(len(want)) if got[i] != want[i]]
        if len(swapped) == 2:
            i, j = swapped
            return f" (the expected shape with axes {i} and {j} swapped: the output in another layout?)"
    if math.prod(got) == math.prod(want):
        return " (the same number of elements in another shape: the output reshaped or in another layout?)"
    return ""


def _contract(value: torch.Tensor, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device,
              ) -> tuple[Outcome, str] | None:
    """The first broken clause of the output contract (shape, dtype, device) and its message, or None."""
    if tuple(value.shape) != tuple(shape):
        return Outcome.WRONG_SHAPE, (f"returned shape {tuple(value.shape)}, expected {tuple(shape)}"
                                     + shape_hint(tuple(value.shape), tuple(shape)))
    if value.dtype != dtype:
        return Outcome.WRONG_DTYPE, f"returned dtype {value.dtype}, expected {dtype}"
    if value.device.type != device.type:
        return Outcome.WRONG_DEVICE, f"returned device {value.device}, expected {device}"
    return None


def call_guarded(
    fn: Callable,
    args: tuple[torch.Tensor | None, ...],
    kwargs: dict[str, Any],
    *,
    expected_shape: tuple[int, ...],
    expected_dtype: torch.dtype,
    expected_device: torch.device | str,
    timeout_s: float | None = DEFAULT_TIMEOUT_S,
    check_determinism: bool = False,
    worker: "isolation.KernelRef | None" = None,
    float32_dots: str | None = None,
) -> CallResult:
    """Call ``fn(*args, **kwargs)`` (in ``worker``'s process when given) and check the contract on the output."""
    # every tensor it is handed, positional and keyword (an initial state, D, z, a bias): a kernel that
    # writes into one is reported as such, not as the nondeterminism its second call would show
    snapshots = isolation.input_snapshots(args, kwargs)
    expected_device = torch.device(expected_device)
    if worker is not None:
        isolation.warm(worker)  # a worker's start is not the kernel's time
    start = time.perf_counter()
    status, value, note = execute(fn, args, kwargs, timeout_s, worker=worker, float32_dots=float32_dots)
    seconds = time.perf_counter() - start
    if status == "timeout":
        return CallResult(Outcome.TIMEOUT, None, value or f"no result after {timeout_s:g} s", seconds, note)
    if status == "crashed":
        return CallResult(Outcome.CRASHED, None, value, seconds, note)
    if status == "raised":
        return CallResult(Outcome.RAISED, None, value, seconds, note)
    written = isolation.written_input(snapshots)
    if written is not None:
        return CallResult(Outcome.MUTATED_INPUT, value if isinstance(value, torch.Tensor) else None, written,
                          seconds, note)
    if status == "value":
        return CallResult(Outcome.NOT_A_TENSOR, None,
                          f"returned {value}, expected a torch.Tensor of shape {expected_shape}", seconds, note)
    extras: tuple = ()
    if isinstance(value, tuple):  # (output, final state, ...): the contract checks are the output's
        value, extras = value[0], tuple(value[1:])
    broken = _contract(value, expected_shape, expected_dtype, expected_device)
    if broken is not None:
        outcome, text = broken
        return CallResult(outcome, None if outcome is Outcome.WRONG_SHAPE else value, text, seconds, note)
    if check_determinism:
        status2, value2, note2 = execute(fn, args, kwargs, timeout_s, worker=worker, float32_dots=float32_dots)
        note = note or note2
        second = "the second call (determinism check)"
        if status2 == "timeout":
            return CallResult(Outcome.TIMEOUT, None, f"{second}: " + (value2 or f"no result after {timeout_s:g} s"),
                              seconds, note)
        if status2 in ("crashed", "raised"):  # a kernel that fails on every other call is no equivalent kernel
            return CallResult(Outcome(status2), None, f"{second}: {value2}", seconds, note)
        written = isolation.written_input(snapshots, " on the second call (determinism check)")
        if written is not None:
            return CallResult(Outcome.MUTATED_INPUT, value, written, seconds, note)
        if status2 == "value":
            return CallResult(Outcome.NOT_A_TENSOR, None, f"{second} returned {value2}, expected a torch.Tensor of "
                              f"shape {expected_shape} as the first call did", seconds, note)
        if isinstance(value2, tuple):
            value2 = value2[0]
        broken = _contract(value2, expected_shape, expected_dtype, expected_device)
        if broken is not None:  # its own contract, not "the two calls differ by 0" (a blind hunt, session 27)
            return CallResult(broken[0], None, f"{second} {broken[1]}", seconds, note)
        if not _same(value.detach(), value2.detach()):
            diff = (value.double() - value2.double()).abs().nan_to_num(nan=float("inf")).max().item()
            return CallResult(Outcome.NONDETERMINISTIC, value,
                              f"two calls on the same inputs differ (max |difference| {diff:.3g})", seconds, note)
    return CallResult(Outcome.OK, value, "", seconds, note, extras)
