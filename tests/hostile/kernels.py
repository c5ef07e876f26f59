"""Hostile `linear_scan` kernels: each misbehaves the way kernels under development do.

Each is correct when it returns (the in-tree Blelloch scan), so that the one thing a test sees is the
misbehaviour. They are run in worker processes (`harness.kernels.isolation`) by the tests in this
folder; `exits`, `segfaults` and `killed` would end any process that ran them in-process.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import torch

from harness.kernels.blelloch import blelloch_linear_scan


def correct(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return blelloch_linear_scan(a, b)


def exits(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Calls ``os._exit(3)``, as a native library that gives up on an unsupported shape."""
    print("exits: unsupported shape, giving up", flush=True)
    os._exit(3)


def segfaults(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Reads address 0 (SIGSEGV), as an out-of-bounds index in a compiled kernel."""
    print(f"segfaults: reading past the end at length {a.shape[-1]}", flush=True)
    ctypes.string_at(0)
    raise AssertionError("unreachable")


def killed(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Sends itself SIGKILL, as Linux's out-of-memory killer does to a process that asked for too much."""
    import signal

    print(f"killed: allocating for length {a.shape[-1]}", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
    raise AssertionError("unreachable")


def segfaults_from_length_5(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Correct below length 5, a segfault from there on (a shrinker can find the boundary)."""
    if a.shape[-1] >= 5:
        ctypes.string_at(0)
    return blelloch_linear_scan(a, b)


def hangs(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Never returns (a loop whose exit condition is never met)."""
    while True:
        time.sleep(0.05)


def one_ulp_flaky(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Moves a random tenth of its outputs by one ulp on each call (an atomics-order reduction)."""
    h = blelloch_linear_scan(a, b)
    moved = torch.rand(h.shape) < 0.1
    return torch.where(moved, torch.nextafter(h, torch.full_like(h, float("inf"))), h)


def leaks_thread(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Right, but leaves a non-daemon thread running (a prefetcher nobody joins)."""
    threading.Thread(target=time.sleep, args=(3600,), name="leaked-prefetcher", daemon=False).start()
    return blelloch_linear_scan(a, b)


def slow(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Right, and slow enough (0.2 s a call) that a run can be interrupted in its middle."""
    time.sleep(0.2)
    return blelloch_linear_scan(a, b)


def starts_helper(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Right, but starts a helper process it never waits for (a compile server); its pid is the name of a
    file in `HELPERS` (the worker's environment is its forkserver's, so no variable can say where)."""
    helper = subprocess.Popen(["sleep", "3600"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    HELPERS.mkdir(exist_ok=True)
    (HELPERS / str(helper.pid)).touch()
    return blelloch_linear_scan(a, b)


HELPERS = Path(tempfile.gettempdir()) / "harness-hostile-helpers"


KEPT: list[torch.Tensor] = []


def keeps_memory(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Right, but keeps 64 MiB more on each call (tensors appended to a global: a cache that only grows)."""
    KEPT.append(torch.ones(16 << 20, dtype=torch.float32))
    return blelloch_linear_scan(a, b)


def _sleep_forever() -> None:
    time.sleep(3600)


def keeps_a_child(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Right, but starts a non-daemon multiprocessing child that never ends (a data loader's worker), which a
    process that exits waits for: its worker cannot leave on its own. The child's pid is a file in `HELPERS`."""
    import multiprocessing

    child = multiprocessing.get_context("fork").Process(target=_sleep_forever, daemon=False)
    child.start()
    HELPERS.mkdir(exist_ok=True)
    (HELPERS / str(child.pid)).touch()
    return blelloch_linear_scan(a, b)


def needs_half_a_cpu_second_on_cpu0(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Right, after half a second of CPU time on the first CPU it may use, which the test keeps busy with
    other processes: a kernel on a crowded machine, not a hung one."""
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    start = time.thread_time()
    while time.thread_time() - start < 0.5:
        pass
    return blelloch_linear_scan(a, b)


_CALLS = {"n": 0}


def writes_on_its_second_call(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Right, and adds 1 to ``a`` on the worker's second call (the determinism check's)."""
    _CALLS["n"] += 1
    out = correct(a, b)
    if _CALLS["n"] == 2:
        with torch.no_grad():
            a.add_(1.0)
    return out


def zeroes_b_in_training(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Right, and wipes ``b`` whenever ``b`` requires grad (a training step's call)."""
    out = correct(a, b)
    if b.requires_grad:
        with torch.no_grad():
            b.zero_()
    return out


def forks_a_child_that_returns(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Forks a child that returns zeros at once (back into the worker's loop), and returns the right output
    itself a little later: the child must not answer for the call."""
    import os
    import time

    if os.fork() == 0:
        return torch.zeros_like(b)
    time.sleep(0.3)
    return correct(a, b)


def returns_sparse(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return correct(a, b).to_sparse()


class _Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("str explodes")

    __repr__ = __str__


def raises_unprintable(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    raise _Unprintable()


def raises_30_mb(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    raise ValueError("x" * 30_000_000)


def detaches(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return correct(a, b).detach()


def returns_b(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return b


def starts_a_helper_in_its_own_session(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Right, but starts a helper in a session of its own (out of the worker's process group); its pid is a file
    in `HELPERS` as `starts_helper`'s."""
    helper = subprocess.Popen(["sleep", "3600"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                              start_new_session=True)
    HELPERS.mkdir(exist_ok=True)
    (HELPERS / str(helper.pid)).touch()
    return blelloch_linear_scan(a, b)
