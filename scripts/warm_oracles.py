"""Compile the oracles' numba kernels into their on-disk cache once, at `make install`.

The oracles' loops are ``@njit(cache=True)`` (`reference_impls/_compiled.py`): a fresh checkout compiles each of
them on first use, in every process that uses it first. Under `make test` that is each pytest-xdist worker, about
half a minute of CPU each on two cores; a clean CI clone pays it on every run. One small case per family and dtype,
judged by the sequential in-tree kernel, takes the paths the suite takes (trace, same-dtype loop, measurement), so
the suite then loads the machine code instead. Prints the time it took; compiles nothing where numba is absent.
"""

from __future__ import annotations

import time


def main() -> None:
    t0 = time.perf_counter()
    from harness.kernels.registry import all_kernels
    from harness.problems import Problem
    from harness.runner import RunOptions, run_case

    # the fields a family needs beyond its defaults for a valid problem
    extra = {"retention_normed": {"eps": 1e-5}, "ssd": {"groups": 1}}
    n = 0
    for spec in all_kernels():
        if spec.source != "intree" or not spec.name.startswith("intree.sequential_"):
            continue
        for dtype in ("float64", "float32", "float16", "bfloat16"):
            problem = Problem(spec.family.value, 9, dtype=dtype, seed=0, **extra.get(spec.family.value, {}))
            run_case(spec, problem, RunOptions(timeout_s=None))
            n += 1
    print(f"warm_oracles: {n} cases, the oracles' compiled kernels cached ({time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()
