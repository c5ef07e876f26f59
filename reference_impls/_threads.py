"""How many threads the oracles' compiled kernels may use, read without importing numba.

`reference_impls._compiled.thread_budget` takes, in this order: the user's ``$SEQKERNEL_ORACLE_THREADS``; the
count this process was given (`set_process_threads`: `harness.threads` gives each process of a harness run
its share of the cores); the cores this process may run on. The given count is this process's alone (a
process it starts does not inherit it, as it would an environment variable), so a harness run started from
another one decides its own. Kept apart from `reference_impls._compiled` so that a harness kernel worker can
set it before anything imports numba.
"""

from __future__ import annotations

import os

#: Environment variable: how many threads the oracles' fused compiled kernels may use; the user's setting,
#: which wins over the count a process was given.
THREADS_ENV = "SEQKERNEL_ORACLE_THREADS"

_process_threads: int | None = None


def available_cores() -> int:
    """The cores this process may run on (its CPU affinity where the OS has one)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def set_process_threads(count: int | None) -> None:
    """The compiled kernels' thread count in this process where ``$SEQKERNEL_ORACLE_THREADS`` is not set
    (None: `available_cores`)."""
    global _process_threads
    if count is not None and (isinstance(count, bool) or not isinstance(count, int) or count < 1):
        raise ValueError(f"count={count!r} is not a thread count; expected a whole number >= 1 or None")
    _process_threads = count


def process_threads() -> int:
    """The count `set_process_threads` gave this process, else `available_cores`."""
    return _process_threads if _process_threads is not None else available_cores()
