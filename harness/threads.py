"""How many threads each process of a harness run computes on: the one policy (`thread_count`).

Why. torch runs an operation on many elements as an OpenMP parallel region over its intra-op threads (by
default one per core of the machine), and at the region's end each thread spin-waits for its siblings.
When a core is not free (another job on a shared CI runner, or the run's own second process: the harness
beside its kernel worker), a sibling is descheduled and the others spin through their time slices waiting
for it. On a 2-core machine a correct kernel's default `harness check` took 34 s idle and 299 s with one
core kept busy by another process, 39 s with ``OMP_NUM_THREADS=1``; a second thread bought nothing even
idle (the cases are small). With this policy, ``harness check --kernel intree.simple_gla_chunk --dtypes
float32 --max-examples 10`` took 15-20 s instead of 56 s, and 40 s instead of 175-181 s with one core busy
(shared machine, load 4-5 from other jobs). numba's pool for the oracles' compiled kernels sleeps instead of spinning
(`reference_impls._compiled`), but it too waits at each block for its slowest thread.

What. Each process gets the cores it may run on (``os.sched_getaffinity``) split among the processes that
compute at once: the harness process, and beside it the kernel worker process that runs the kernel when
kernels run isolated (`harness.kernels.isolation`; one call at a time, but a pool's threads keep spinning
after a region, so the two overlap), times the runs side by side (pytest-xdist workers). At least one.
A setting the user made wins: ``OMP_NUM_THREADS`` / ``MKL_NUM_THREADS`` (read as torch reads them) for
every process, ``SEQKERNEL_ORACLE_THREADS`` for the oracles' compiled kernels.

Who calls it. `fit_threads` applies the policy in the process of an entry point (the ``harness``
command, each pytest-xdist worker of the plugin) and remembers how many runs share the cores; a kernel
worker is started with `worker_thread_count` and applies it with `use_threads` before it loads the kernel.
A program that calls `harness.check` itself keeps its own torch setting (the policy does not change the
caller's process behind its back); its kernel workers still get their share.

Same bits. The oracles' results do not depend on the count: their loops run torch on one thread
(`reference_impls._loop.single_threaded`) and their compiled kernels split only independent rows
(``tests/test_threads.py``, ``tests/test_oracle_compiled.py``).
"""

from __future__ import annotations

import os
from typing import Mapping

from reference_impls._threads import available_cores, set_process_threads

#: The variables a user sets torch's thread count with, in the order torch reads them (the last one set wins).
USER_THREADS_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")

#: How many runs share this machine's cores (pytest-xdist workers), as the last `fit_threads` said.
_RUNS = 1


def share_of_cores(cores: int, processes: int) -> int:
    """Threads for each of ``processes`` processes computing at once on ``cores``: the cores split, at least
    one each."""
    return max(1, cores // max(1, processes))


def user_thread_count(environ: Mapping[str, str] | None = None) -> int | None:
    """The thread count the user set for torch in the environment, else None.

    torch reads ``OMP_NUM_THREADS`` and then ``MKL_NUM_THREADS`` (the latter wins when both are set). An
    OpenMP list (``4,2``: the outer level first) gives its first number. A value that is not a whole
    number >= 1 is an error naming the variable (torch would warn and ignore it)."""
    from harness.errors import InvalidArgument

    environ = os.environ if environ is None else environ
    chosen = None
    for name in USER_THREADS_ENV:
        text = environ.get(name, "").strip()
        if not text:
            continue
        first = text.split(",")[0].strip()
        if not first.isdigit() or int(first) < 1:
            raise InvalidArgument(f"{name}={text!r} is not a thread count; expected a whole number >= 1 "
                                  "(or unset: the harness then splits the cores among its processes)")
        chosen = int(first)
    return chosen


def thread_count(*, runs: int | None = None, isolated: bool | None = None, cores: int | None = None,
                 environ: Mapping[str, str] | None = None) -> int:
    """The policy: torch threads for one process of a harness run.

    The user's setting (`user_thread_count`) when there is one; else the ``cores`` this process may run on
    (default: its affinity, `available_cores`) split among ``runs`` runs side by side (default: as
    `fit_threads` last said, else 1), each of two processes when ``isolated`` (its kernels run in a worker
    process: the default mode, `harness.kernels.isolation.default_isolation`), else of one.

    Why not torch's default (every core): its OpenMP threads spin-wait at each parallel region for a
    sibling that another process has descheduled, and a run slows several times over on a busy machine
    (the module's docstring has the numbers)."""
    explicit = user_thread_count(environ)
    if explicit is not None:
        return explicit
    if isolated is None:
        from harness.kernels.isolation import default_isolation

        isolated = default_isolation() == "process"
    runs = _RUNS if runs is None else runs
    cores = available_cores() if cores is None else cores
    return share_of_cores(cores, runs * (2 if isolated else 1))


def worker_thread_count() -> int:
    """`thread_count` of a kernel worker process of this run (one runs only where kernels are isolated)."""
    return thread_count(isolated=True)


def use_threads(count: int) -> None:
    """Run this process on ``count`` threads: torch's intra-op threads, its inter-op threads where torch still
    allows setting them (once, before any inter-op work), and the oracles' compiled kernels unless the user
    set ``$SEQKERNEL_ORACLE_THREADS`` (`reference_impls._threads`)."""
    import torch

    if torch.get_num_threads() != count:
        torch.set_num_threads(count)
    try:
        torch.set_num_interop_threads(count)
    except RuntimeError:  # set before, or inter-op work has started: torch keeps the pool it has
        pass
    set_process_threads(count)


def fit_threads(*, runs: int = 1) -> int:
    """Apply `thread_count` to this process, the one of an entry point (the ``harness`` command, a
    pytest-xdist worker), with ``runs`` runs sharing the machine's cores; the kernel workers it starts
    later get their share by the same count (`worker_thread_count`). Returns the count."""
    global _RUNS
    if isinstance(runs, bool) or not isinstance(runs, int) or runs < 1:
        from harness.errors import InvalidArgument

        raise InvalidArgument(f"runs={runs!r} is not a count of runs; expected a whole number >= 1")
    _RUNS = runs
    count = thread_count()
    use_threads(count)
    return count
