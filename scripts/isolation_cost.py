"""What running kernels in a worker process costs: per call, and per worker (re)start.

    python scripts/isolation_cost.py [--calls 200]

Prints the median and mean wall time of one guarded call (`harness.kernels.guard.execute`) of
``intree.blelloch_scan`` in-process and in its worker process, at two lengths, and the time to start
(or restart, after a crash) a worker. See docs/isolation.md for the numbers measured.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from harness.kernels import isolation, registry
from harness.kernels.guard import execute
from harness.problems import Problem
from harness.runner import call_args


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=200)
    args = ap.parse_args()
    spec = registry.get("intree.blelloch_scan")
    fn, ref = spec.callable(), isolation.KernelRef("registered", spec.name, spec.family.value)
    for length in (64, 2048):
        problem = Problem(family="linear_scan", length=length, dtype="float32", batch=2, dim=8, seed=1)
        cargs, kwargs = call_args(problem, problem.make_inputs(), spec)
        for mode, worker in (("in-process", None), ("process", ref)):
            execute(fn, cargs, kwargs, 60.0, worker=worker)  # warm: the worker starts here
            times = []
            with torch.no_grad():
                for _ in range(args.calls):
                    t0 = time.perf_counter()
                    execute(fn, cargs, kwargs, 60.0, worker=worker)
                    times.append(time.perf_counter() - t0)
            print(f"L={length:<5} {mode:<10} median {statistics.median(times) * 1e3:7.3f} ms  "
                  f"mean {statistics.mean(times) * 1e3:7.3f} ms")
    starts = []
    for _ in range(10):
        t0 = time.perf_counter()
        isolation.Worker(ref).close()
        starts.append(time.perf_counter() - t0)
    print(f"worker (re)start: median {statistics.median(starts) * 1e3:.0f} ms (the forkserver itself: once per run)")


if __name__ == "__main__":
    main()
