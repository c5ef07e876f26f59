"""Side-by-side benchmark: oracles vs peers (wall time, peak memory, equality) and suite throughput.

Run ``python -m harness.bench --out reports/bench [--lengths 1024,8192] [--long] [--quick]``. Writes
``bench.md`` and ``bench.csv`` under ``--out`` and prints the tables.

- Wall time: best of ``reps`` calls in this process (inputs built once, float64, no grad).
- Peak memory: each (function, length) runs once in a fresh ``python -c`` subprocess that reads
  ``resource.getrusage(RUSAGE_SELF).ru_maxrss`` before and after the call (inputs and imports already
  done); the growth is reported in MiB (tracemalloc does not see torch allocations).
- Speed-up: oracle time / function time, both measured in this run (> 1: the function is faster).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable

import torch

# ----------------------------------------------------------------------------------------- functions
SEL_SHAPE = dict(batch=2, dim=64, state=16)
RET_SHAPE = dict(batch=1, heads=4, dk=64, dv=64)


def sel_inputs(length: int, batch: int = SEL_SHAPE["batch"]) -> tuple:
    from harness.problems import Problem

    p = Problem(family="selective_scan", length=length, dtype="float64", batch=batch, dim=SEL_SHAPE["dim"],
                state=SEL_SHAPE["state"], has_D=True, seed=0)
    x = p.make_inputs()
    return tuple(x[n] for n in ("u", "delta", "A", "B", "C", "D"))


def ret_inputs(length: int) -> tuple:
    from harness.problems import Problem

    p = Problem(family="retention", length=length, dtype="float64", seed=0, **RET_SHAPE)
    x = p.make_inputs()
    return x["q"], x["k"], x["v"]


def _fla_naive() -> Callable:
    """fla's naive_retention takes (batch, heads, L, d) and computes in float32 internally."""
    from fla.ops.retention.naive import naive_retention

    def fla_naive(q, k, v):
        t = lambda x: x.transpose(1, 2).contiguous()  # noqa: E731  (b, L, h, d) <-> (b, h, L, d)
        return naive_retention(t(q), t(k), t(v)).transpose(1, 2).to(q.dtype)

    return fla_naive


def load_fn(name: str) -> Callable:
    """The callable benchmarked under ``name`` (raises if unavailable)."""
    if name == "oracle.selective_scan":
        from reference_impls.selective_scan import selective_scan
        return selective_scan
    if name == "oracle.retention":
        from reference_impls.retention import retention
        return retention
    if name == "fla.naive_retention":
        return _fla_naive()
    if name == "intree.retention_recurrent":
        from harness.kernels.retnet_forms import retention_recurrent
        return retention_recurrent
    from harness.kernels.registry import get

    spec = get(name)
    reason = spec.unavailable_reason()
    if reason:
        raise RuntimeError(reason)
    return spec.callable()


def inputs_for(name: str, length: int) -> tuple:
    return sel_inputs(length) if name in SEL_FNS else ret_inputs(length)


SEL_FNS = ("oracle.selective_scan", "mambapy.selective_scan_seq")
RET_FNS = ("oracle.retention", "fla.naive_retention", "intree.retention_recurrent")
NOTES = {
    "mambapy.selective_scan_seq": "float64 in; materialises exp(delta*A) and B*x as (B, L, ED, N)",
    "fla.naive_retention": "computes in float32 internally (q.float()); forms (heads, L, L) decay mask",
    "intree.retention_recurrent": "one Python step per t, float64",
}


# ------------------------------------------------------------------------------------------ memory
def _mem_child(name: str, length: int, threads: int = 1) -> None:
    """Body of the fresh subprocess: prints {"mib": growth of ru_maxrss across one call}."""
    import resource

    torch.set_num_threads(threads)
    with torch.no_grad():
        fn = load_fn(name)
        args = inputs_for(name, length)
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        fn(*args)
        after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"mib": (after - before) / 1024.0}))  # ru_maxrss is KiB on Linux


def peak_mib(name: str, length: int, timeout: float = 600) -> float | str:
    code = f"from harness.bench import _mem_child; _mem_child({name!r}, {length}, {torch.get_num_threads()})"
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    try:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout, env=env)
        return json.loads(out.stdout.strip().splitlines()[-1])["mib"]
    except Exception as exc:  # noqa: BLE001
        return f"n/a ({type(exc).__name__})"


# ------------------------------------------------------------------------------------------ timing
def best_time(fn: Callable, args: tuple, reps: int) -> tuple[float, Any]:
    best, out = float("inf"), None
    with torch.no_grad():
        for _ in range(reps):
            t0 = time.perf_counter()
            out = fn(*args)
            best = min(best, time.perf_counter() - t0)
    return best, out


def _compare(out: torch.Tensor, ref: torch.Tensor) -> str:
    if torch.equal(out, ref):
        return "bit-identical"
    return f"max|diff|={(out.double() - ref).abs().max().item():.3g}"


def compare_group(group: str, names: tuple[str, ...], lengths: list[int], reps: int, mem: bool) -> list[dict]:
    """One row per (function, length): time, speed-up vs the group's oracle (names[0]), memory, equality."""
    fns: dict[str, Callable | str] = {}
    for n in names:
        try:
            fns[n] = load_fn(n)
        except Exception as exc:  # noqa: BLE001 - a missing peer is reported, not fatal
            fns[n] = f"skipped: {type(exc).__name__}: {exc}"
    jobs = [(n, L) for L in lengths for n in names if callable(fns[n])]
    mems: dict[tuple[str, int], Any] = {}
    if mem:  # fresh processes, two at a time (ru_maxrss is per process; timings below run alone)
        with ThreadPoolExecutor(2) as pool:
            mems = dict(zip(jobs, pool.map(lambda j: peak_mib(*j), jobs)))
    rows = []
    for L in lengths:
        args = inputs_for(names[0], L)
        t_ref, ref = best_time(fns[names[0]], args, reps)
        for n in names:
            row = {"group": group, "function": n, "L": L}
            if not callable(fns[n]):
                row.update(time_s=None, speedup_vs_oracle=None, peak_mib=None, vs_oracle=fns[n], note="")
                rows.append(row)
                continue
            t, out = (t_ref, ref) if n == names[0] else best_time(fns[n], args, reps)
            m = mems.get((n, L), "not measured")
            row.update(time_s=round(t, 4), speedup_vs_oracle=round(t_ref / t, 3),
                       peak_mib=round(m, 1) if isinstance(m, float) else m,
                       vs_oracle="(reference)" if n == names[0] else _compare(out, ref), note=NOTES.get(n, ""))
            rows.append(row)
    return rows


# ------------------------------------------------------------------------------------------ suite
def suite_throughput(lengths: list[int], seeds: int = 2) -> list[dict]:
    from harness.kernels.registry import get
    from harness.problems import Problem
    from harness.runner import run_case

    kernels = [
        ("intree.blelloch_scan", dict(family="linear_scan")),
        ("intree.blelloch_selective_scan", dict(family="selective_scan")),
        ("intree.retention_chunkwise", dict(family="retention", chunk_size=64)),
        ("intree.retention_normed_parallel", dict(family="retention_normed", eps=1e-6)),
    ]
    rows = []
    for name, kw in kernels:
        spec = get(name)
        for L in lengths:
            tot = {k: 0.0 for k in ("t_inputs", "t_oracle", "t_kernel", "t_baseline", "t_measure")}
            verdicts = []
            t0 = time.perf_counter()
            for seed in range(seeds):
                rec = run_case(spec, Problem(length=L, seed=seed, **kw))
                for k in tot:
                    tot[k] += rec.get(k) or 0.0
                verdicts.append(rec["verdict"])
            wall = time.perf_counter() - t0
            summed = sum(tot.values()) or 1e-12
            rows.append({
                "group": "suite", "function": name, "L": L, "cases": seeds,
                "cases_per_s": round(seeds / wall, 2),
                "harness_share": round((tot["t_measure"] + tot["t_inputs"]) / summed, 3),
                "oracle_share": round(tot["t_oracle"] / summed, 3),
                "kernel_share": round(tot["t_kernel"] / summed, 3),
                "baseline_share": round(tot["t_baseline"] / summed, 3),
                "verdicts": ",".join(sorted(set(verdicts))),
            })
    return rows


# -------------------------------------------------------------------------------- oracle per-step
def oracle_step_cost(length: int, batches: list[int]) -> list[dict]:
    """Selective-scan oracle: microseconds per step vs batch; the floor is two tiny torch ops per step."""
    from reference_impls.selective_scan import selective_scan

    x, o = torch.zeros(1, dtype=torch.float64), torch.zeros(1, dtype=torch.float64)
    t0 = time.perf_counter()
    for _ in range(length):
        torch.mul(x, o, out=o)
        o.add_(x)
    floor_us = (time.perf_counter() - t0) / length * 1e6
    rows = []
    for b in batches:
        t, _ = best_time(selective_scan, sel_inputs(length, batch=b), 2)
        elems = b * SEL_SHAPE["dim"] * SEL_SHAPE["state"]
        rows.append({"group": "oracle_step", "function": "oracle.selective_scan", "L": length, "batch": b,
                     "state_elems_per_step": elems, "us_per_step": round(t / length * 1e6, 2),
                     "ns_per_state_elem": round(t / length / elems * 1e9, 3),
                     "dispatch_floor_us_per_step": round(floor_us, 2)})
    return rows


# ------------------------------------------------------------------------------------------ output
def _md(rows: list[dict]) -> str:
    from tabulate import tabulate

    cols = [k for k in rows[0] if k != "group"]
    return tabulate([[r.get(c) for c in cols] for r in rows], headers=cols, tablefmt="github")


def run(out: Path, lengths: list[int], suite_lengths: list[int], reps: int, mem: bool = True,
        step_length: int = 2048, step_batches: tuple[int, ...] = (1, 2, 8, 32),
        threads: int = 1) -> dict[str, list[dict]]:
    t0 = time.perf_counter()
    # One intra-op thread by default: on this 2-core box torch's default (2 threads) made the per-step
    # loops ~80x slower (thread hand-off per tiny op), which would measure the scheduler, not the code.
    torch.set_num_threads(threads)
    groups = {
        "selective_scan": compare_group("selective_scan", SEL_FNS, lengths, reps, mem),
        "retention": compare_group("retention", RET_FNS, lengths, reps, mem),
        "suite": suite_throughput(suite_lengths),
        "oracle_step": oracle_step_cost(step_length, list(step_batches)),
    }
    total = time.perf_counter() - t0
    titles = {
        "selective_scan": f"Selective scan, float64, batch {SEL_SHAPE['batch']}, ED={SEL_SHAPE['dim']}, "
                          f"N={SEL_SHAPE['state']} (time: best of {reps}; speed-up = oracle time / time)",
        "retention": f"Retention, float64 in, batch {RET_SHAPE['batch']}, heads {RET_SHAPE['heads']}, "
                     f"d {RET_SHAPE['dk']} (time: best of {reps})",
        "suite": "Suite throughput (run_case, float32 cases, default shapes; shares of summed record timings; "
                 "harness = t_inputs + t_measure)",
        "oracle_step": "Selective-scan oracle cost per step vs batch (what limits it)",
    }
    md = [f"# Benchmark\n\nOne run, `python -m harness.bench`, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads, {total:.0f} s in all. Peak memory = growth of ru_maxrss "
          "across one call in a fresh subprocess (MiB).\n"]
    for g, rows in groups.items():
        md.append(f"## {titles[g]}\n\n{_md(rows)}\n")
    text = "\n".join(md)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench.md").write_text(text)
    allrows = [r for rows in groups.values() for r in rows]
    keys = list(dict.fromkeys(k for r in allrows for k in r))
    with open(out / "bench.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        w.writerows(allrows)
    print(text)
    return groups


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m harness.bench", description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="reports/bench")
    ap.add_argument("--lengths", default=None, help="comma-separated, default 1024,8192 (plus 65536 with --long)")
    ap.add_argument("--long", action="store_true", help="add L=65536 to the oracle comparisons")
    ap.add_argument("--quick", action="store_true", help="tiny lengths, one repetition (for tests)")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1)")
    a = ap.parse_args(argv)
    if a.quick:
        lengths, suite_lengths, reps = [64, 128], [64], 1
        extra = dict(step_length=128, step_batches=(1, 4))
    else:
        lengths, suite_lengths, reps, extra = [1024, 8192], [1024, 4096], 3, {}
    if a.lengths:
        lengths = [int(x) for x in a.lengths.split(",")]
    if a.long:
        lengths.append(65536)
    run(Path(a.out), lengths, suite_lengths, reps, threads=a.threads, **extra)
    return 0


if __name__ == "__main__":
    sys.exit(main())
