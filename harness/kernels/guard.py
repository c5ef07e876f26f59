"""Calling a kernel under its contract: timeout, output checks, input-mutation and determinism checks.

`call_guarded` never raises for anything the kernel does. It returns a `CallResult` whose ``outcome``
names what happened, one of `Outcome`; everything except ``ok`` becomes the ``kernel_error`` verdict
with the outcome as its cause, and the run goes on with the next case.
"""

from __future__ import annotations

import enum
import os
import queue
import threading
import time
import traceback
from dataclasses import dataclass
from typing import Any, Callable

import torch


class Outcome(str, enum.Enum):
    OK = "ok"
    RAISED = "raised"
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

    @property
    def ok(self) -> bool:
        return self.outcome is Outcome.OK


#: Default per-call timeout in seconds; a kernel that takes longer is reported as ``timeout``.
DEFAULT_TIMEOUT_S = 120.0


def _same(x: torch.Tensor, y: torch.Tensor) -> bool:
    """Bit-for-bit equality that treats NaN as equal to NaN in the same place."""
    if x.shape != y.shape or x.dtype != y.dtype:
        return False
    return bool(torch.equal(x, y) or torch.equal(torch.nan_to_num(x, nan=0.0), torch.nan_to_num(y, nan=0.0))
                and torch.equal(torch.isnan(x), torch.isnan(y)))


def _describe(exc: BaseException) -> str:
    frames = traceback.extract_tb(exc.__traceback__)
    where = f" (at {frames[-1].filename}:{frames[-1].lineno})" if frames else ""
    return f"{type(exc).__name__}: {exc}{where}"


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
        if not done.wait(timeout_s):
            _worker = None
            return "timeout", None
    if "error" in box:
        return "raised", box["error"]
    return "ok", box.get("value")


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
) -> CallResult:
    """Call ``fn(*args, **kwargs)`` and check the family contract on what comes back."""
    snapshots = [a.clone() if isinstance(a, torch.Tensor) else None for a in args]
    expected_device = torch.device(expected_device)
    start = time.perf_counter()
    status, value = _run_with_timeout(lambda: fn(*args, **kwargs), timeout_s)
    seconds = time.perf_counter() - start
    if status == "timeout":
        return CallResult(Outcome.TIMEOUT, None, f"no result after {timeout_s:g} s", seconds)
    if status == "raised":
        return CallResult(Outcome.RAISED, None, value, seconds)
    for i, (arg, snap) in enumerate(zip(args, snapshots)):
        if snap is not None and not _same(arg, snap):
            n = int((arg != snap).sum()) if arg.shape == snap.shape else arg.numel()
            return CallResult(Outcome.MUTATED_INPUT, value if isinstance(value, torch.Tensor) else None,
                              f"input #{i} (shape {tuple(snap.shape)}) was written to: {n} elements changed", seconds)
    if not isinstance(value, torch.Tensor):
        return CallResult(Outcome.NOT_A_TENSOR, None,
                          f"returned {type(value).__name__}, expected a torch.Tensor of shape {expected_shape}", seconds)
    if tuple(value.shape) != tuple(expected_shape):
        return CallResult(Outcome.WRONG_SHAPE, None,
                          f"returned shape {tuple(value.shape)}, expected {tuple(expected_shape)}", seconds)
    if value.dtype != expected_dtype:
        return CallResult(Outcome.WRONG_DTYPE, value,
                          f"returned dtype {value.dtype}, expected {expected_dtype}", seconds)
    if value.device.type != expected_device.type:
        return CallResult(Outcome.WRONG_DEVICE, value,
                          f"returned device {value.device}, expected {expected_device}", seconds)
    if check_determinism:
        status2, value2 = _run_with_timeout(lambda: fn(*args, **kwargs), timeout_s)
        if status2 == "ok" and isinstance(value2, torch.Tensor) and not _same(value.detach(), value2.detach()):
            diff = (value.double() - value2.double()).abs().nan_to_num(nan=float("inf")).max().item()
            return CallResult(Outcome.NONDETERMINISTIC, value,
                              f"two calls on the same inputs differ (max |difference| {diff:.3g})", seconds)
    return CallResult(Outcome.OK, value, "", seconds)
