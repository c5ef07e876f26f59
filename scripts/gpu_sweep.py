#!/usr/bin/env python3
"""A bounded sweep of every kernel that declares CUDA, on the GPU, against the float64 oracle on the CPU.

    python scripts/gpu_sweep.py OUT_DIR [--budget-s 420] [--lengths 64,257,1024,4096] [--kernels intree,fla]
    python scripts/gpu_sweep.py OUT_DIR --plan              # list the cases (no GPU needed)
    python scripts/gpu_sweep.py OUT_DIR --device cpu ...    # rehearse the same sweep on the CPU

What runs (`plan_cases`): each available kernel whose capabilities list the device, over lengths
64, 257, 1024, 4096; float32 with TF32 off and on (on only where the GPU has TF32), float16, bfloat16;
regimes ``trained`` and ``unstable`` for the scans (``trained`` for retention); selective scans also
with Mamba's options (D, z, delta_bias, softplus) where the kernel takes them; chunk sizes 16 and 64
for chunked kernels. Every case goes through `harness.runner.run_case`: inputs rounded once and copied
to the device, the oracle in float64 on the CPU, the kernel under its contract, the verdict. Before
the grid each kernel gets a run-to-run determinism check (`harness.gpu.determinism_check`, one float32
case of length <= 1024, called 3 times).

Bounded: cases run shortest first, and no case starts once ``--budget-s`` seconds have passed (the
default, 420 s, keeps the whole script under 8 minutes with the report); what was left out is printed
and written to ``run.json``. The float64 oracle is computed once per distinct input (kernels of a
family, TF32 on and off and chunk sizes share it).

Writes into OUT_DIR: ``records.jsonl`` (one record per case, `harness.store.RunStore`), ``run.json``
(the header, with the plan and what the budget left out), ``determinism.jsonl`` and the report
(`harness.report.build_report`). Prints the determinism table, then the summary table last.

Exit status: 0 without a GPU (after one line saying why), and when every in-tree kernel case is
equivalent or out of domain; 1 when an in-tree kernel is divergent or a kernel error on the device
(third-party findings are what the sweep is for and do not fail it); 2 on a bad argument.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import math
import sys
import time
from pathlib import Path
from typing import Any, Iterator, Sequence

DEFAULT_BUDGET_S = 420.0
DEFAULT_LENGTHS = (64, 257, 1024, 4096)
#: (dtype, tf32) in the order they run within a length.
DTYPE_SETTINGS = (("float32", False), ("float32", True), ("float16", False), ("bfloat16", False))
SCAN_REGIMES = ("trained", "unstable")
RETENTION_REGIMES = ("trained",)
CHUNK_SIZES = (16, 64)
#: Problem fields per family: small enough that the float64 oracle of a 4096-long case takes seconds on
#: the CPU, large enough to fill warps (retention head dims 32 suit every Triton kernel's block sizes).
SHAPES: dict[str, dict[str, Any]] = {
    "linear_scan": {"batch": 2, "dim": 16},
    "selective_scan": {"batch": 2, "dim": 8, "state": 16},
    "retention": {"batch": 1, "heads": 2, "dk": 32, "dv": 32},
    "retention_normed": {"batch": 1, "heads": 2, "dk": 32, "dv": 32, "eps": 1e-6},
}
#: Mamba's block calls the selective scan with these.
MAMBA_OPTIONS = {"has_D": True, "has_z": True, "has_delta_bias": True, "delta_softplus": True}
DETERMINISM_REPEATS = 3
DETERMINISM_MAX_LENGTH = 1024
DEFAULT_TIMEOUT_S = 60.0
PROGRESS_EVERY_S = 15.0
ORACLE_CACHE_ENTRIES = 8


def log(text: str = "") -> None:
    print(text, flush=True)


# ------------------------------------------------------------------------------------------------ plan
def select_kernels(device: str, patterns: Sequence[str]) -> tuple[list, list[tuple[str, str]]]:
    """(available kernels that declare ``device``, [(name, why not)] for those left out)."""
    from harness.kernels import registry

    chosen, left_out = [], []
    for spec in registry.all_kernels():
        if patterns and not any(p in spec.name for p in patterns):
            continue
        if device not in spec.capabilities.devices:
            continue
        reason = spec.unavailable_reason()
        if reason is None and device == "cpu" and spec.capabilities.slow:
            reason = "run by an interpreter on the CPU (capabilities.slow); left out of a CPU rehearsal"
        if reason is not None:
            left_out.append((spec.name, reason))
        else:
            chosen.append(spec)
    return chosen, left_out


def _variants(spec, regimes: Sequence[str]) -> Iterator[dict[str, Any]]:
    fam = spec.family.value
    for regime in regimes:
        yield {"regime": regime}
        if fam == "selective_scan" and regime == "trained" and spec.capabilities.selective_options:
            yield {"regime": regime, **MAMBA_OPTIONS}


def plan_cases(specs: Sequence, *, device: str, lengths: Sequence[int], tf32: bool) -> list[tuple[Any, Any]]:
    """Every (kernel, problem) of the grid that the kernel's capabilities accept, shortest first.

    Within a length, cases that share the oracle's inputs (family, dtype, regime, options) are adjacent
    so that the memoized oracle serves them all.
    """
    from harness.cases import runnable
    from harness.problems import Problem

    settings = [s for s in DTYPE_SETTINGS if tf32 or not s[1]]
    cases = []
    for spec in specs:
        fam = spec.family.value
        caps = spec.capabilities
        regimes = SCAN_REGIMES if fam in ("linear_scan", "selective_scan") else RETENTION_REGIMES
        if caps.takes_chunk:
            chunks: Sequence[int | None] = [c for c in CHUNK_SIZES if not caps.chunk_sizes or c in caps.chunk_sizes]
            chunks = chunks or [min(caps.chunk_sizes)]
        else:
            chunks = [None]
        for length in lengths:
            for dtype, use_tf32 in settings:
                for variant in _variants(spec, regimes):
                    for chunk in chunks:
                        problem = Problem(family=fam, length=length, dtype=dtype, tf32=use_tf32, device=device,
                                          chunk_size=chunk, seed=0, **SHAPES[fam], **variant)
                        if runnable(spec, problem):
                            cases.append((spec, problem))

    def order(case):
        spec, p = case
        setting = DTYPE_SETTINGS.index((p.dtype, p.tf32))
        return (p.length, p.family.value, p.dtype, p.regime, p.delta_softplus, setting, spec.name,
                p.chunk_size or 0)

    return sorted(cases, key=order)


def determinism_problems(cases: Sequence[tuple[Any, Any]]) -> list[tuple[Any, Any]]:
    """One case per kernel: float32, TF32 off, ``trained``, the longest planned length <= 1024 (else the shortest)."""
    by_kernel: dict[str, list[tuple[Any, Any]]] = {}
    for spec, p in cases:
        if p.dtype == "float32" and not p.tf32 and p.regime == "trained" and not p.delta_softplus:
            by_kernel.setdefault(spec.name, []).append((spec, p))
    chosen = []
    for options in by_kernel.values():
        short = [c for c in options if c[1].length <= DETERMINISM_MAX_LENGTH]
        chosen.append(max(short, key=lambda c: c[1].length) if short else min(options, key=lambda c: c[1].length))
    return chosen


# ---------------------------------------------------------------------------------------------- oracle
@contextlib.contextmanager
def memoized_oracle(max_entries: int = ORACLE_CACHE_ENTRIES) -> Iterator[dict[str, int]]:
    """Serve `harness.runner.reference_trace` and `baseline_output` from small caches inside the block.

    `run_case` recomputes the float64 oracle and the same-dtype sequential baseline for every (kernel,
    problem); kernels of one family, TF32 on and off and chunk sizes see the same rounded inputs, so
    both are keyed on the problem without those fields (and on the retention convention; the oracle
    also without the device). The baseline runs outside the TF32 block in `run_case`, so it does not
    depend on ``tf32``. Both functions are restored on exit.
    """
    from harness import runner

    originals = (runner.reference_trace, runner.baseline_output)
    stats = {"hits": 0, "misses": 0}

    def memo(fn, keep_device: bool):
        cache: collections.OrderedDict = collections.OrderedDict()

        def cached(problem, inputs, convention=runner.RETNET):
            fields = {"tf32": False, "chunk_size": None} | ({} if keep_device else {"device": "cpu"})
            key = (problem.replace(**fields).key, problem.device if keep_device else None, convention)
            if key in cache:
                cache.move_to_end(key)
                stats["hits"] += 1
                return cache[key]
            stats["misses"] += 1
            value = cache[key] = fn(problem, inputs, convention)
            if len(cache) > max_entries:
                cache.popitem(last=False)
            return value

        return cached

    runner.reference_trace = memo(originals[0], keep_device=False)
    runner.baseline_output = memo(originals[1], keep_device=True)
    try:
        yield stats
    finally:
        runner.reference_trace, runner.baseline_output = originals


# ------------------------------------------------------------------------------------------------- run
def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return "-" if math.isnan(value) else f"{value:.3g}"
    return "-" if value is None else str(value)


def determinism_markdown(rows: Sequence[dict[str, Any]]) -> str:
    if not rows:
        return "_No determinism check ran._"
    lines = ["| kernel | device | dtype | length | deterministic | max_run_to_run_diff | n_differing | error |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        error = (r.get("error") or "").replace("|", "/")[:120]
        lines.append(f"| {r['kernel']} | {r['device']} | {r['dtype']} | {r['length']} | {_fmt(r['deterministic'])} "
                     f"| {_fmt(r['max_run_to_run_diff'])} | {r['n_differing']} | {error} |")
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="gpu_sweep.py", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out_dir", help="run directory for records.jsonl, run.json, determinism.jsonl and the report")
    ap.add_argument("--budget-s", type=float, default=DEFAULT_BUDGET_S,
                    help=f"start no case after this many seconds (default {DEFAULT_BUDGET_S:g})")
    ap.add_argument("--lengths", default=",".join(map(str, DEFAULT_LENGTHS)),
                    help="comma-separated sequence lengths (default %(default)s)")
    ap.add_argument("--kernels", default="", help="comma-separated substrings; only kernels whose name has one")
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"),
                    help="cuda (default); cpu rehearses the same sweep on the CPU")
    ap.add_argument("--timeout-s", type=float, default=DEFAULT_TIMEOUT_S,
                    help=f"per kernel call (default {DEFAULT_TIMEOUT_S:g}; includes Triton's first compile)")
    ap.add_argument("--plan", action="store_true", help="print the planned cases and exit (no GPU needed)")
    ap.add_argument("--no-report", action="store_true", help="skip build_report (records and tables only)")
    args = ap.parse_args(argv)
    try:
        args.lengths = tuple(int(x) for x in args.lengths.split(",") if x.strip())
    except ValueError:
        ap.error(f"--lengths={args.lengths!r} must be comma-separated integers, e.g. 64,257,1024")
    if not args.lengths or min(args.lengths) < 1:
        ap.error(f"--lengths={args.lengths!r} must list positive integers")
    if not args.budget_s > 0:
        ap.error(f"--budget-s={args.budget_s!r} must be positive")
    args.kernels = tuple(k.strip() for k in args.kernels.split(",") if k.strip())
    return args


def main(argv: Sequence[str] | None = None) -> int:
    t_start = time.perf_counter()
    args = parse_args(argv)

    from harness.gpu import cuda_available, tf32_supported

    if args.device == "cuda" and not args.plan:
        reason = cuda_available()
        if reason is not None:
            log(f"gpu_sweep: skipped: {reason}")
            return 0
    tf32_reason = tf32_supported() if args.device == "cuda" else "the CPU has no TF32 axis"
    specs, left_out = select_kernels(args.device, args.kernels)
    cases = plan_cases(specs, device=args.device, lengths=args.lengths,
                       tf32=tf32_reason is None or args.plan)
    det_cases = determinism_problems(cases)

    per_kernel = collections.Counter(spec.name for spec, _ in cases)
    log(f"gpu_sweep: {len(cases)} cases on {args.device} over {len(specs)} kernels, lengths {list(args.lengths)}, "
        f"budget {args.budget_s:g} s")
    if tf32_reason is not None and not args.plan:
        log(f"  TF32 axis left out: {tf32_reason}")
    for name, why in left_out:
        log(f"  left out {name}: {why}")
    if args.plan:
        for name, n in per_kernel.items():
            log(f"  {name}: {n} cases")
        for spec, p in cases:
            log(f"  {spec.name} {p.dtype}{'+tf32' if p.tf32 else ''} L={p.length} {p.regime}"
                f"{' mamba-options' if p.delta_softplus else ''}{f' chunk={p.chunk_size}' if p.chunk_size else ''}")
        return 0

    import torch

    from harness.gpu import determinism_check
    from harness.runner import RunOptions, run_case
    from harness.store import HEADER_FILE, RunStore, dumps, environment

    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for stale in ("records.jsonl", "determinism.jsonl"):  # this script's own files from an earlier run
        (out / stale).unlink(missing_ok=True)
    header = environment(command=" ".join(["scripts/gpu_sweep.py", *(argv if argv is not None else sys.argv[1:])]))
    header.update({"sweep": "gpu_sweep", "sweep_device": args.device, "budget_s": args.budget_s,
                   "lengths": list(args.lengths), "tf32_axis": tf32_reason is None,
                   "kernels": [s.name for s in specs], "kernels_left_out": dict(left_out),
                   "cases_planned": len(cases)})
    store = RunStore(out, header=header)
    deadline = t_start + args.budget_s

    def timeout() -> float:
        return max(5.0, min(args.timeout_s, deadline - time.perf_counter() + 5.0))

    # -- determinism, one case per kernel -----------------------------------------------------------
    det_rows: list[dict[str, Any]] = []
    with open(out / "determinism.jsonl", "w", encoding="utf-8") as det_file:
        for spec, problem in det_cases:
            if time.perf_counter() >= deadline:
                break
            try:
                row = determinism_check(spec, problem, repeats=DETERMINISM_REPEATS, timeout_s=timeout())
            except Exception as exc:  # noqa: BLE001 - a harness failure on one kernel must not end the sweep
                row = {"kernel": spec.name, "device": problem.device, "dtype": problem.dtype,
                       "length": problem.length, "deterministic": None, "max_run_to_run_diff": math.nan,
                       "n_differing": 0, "outcome": "harness_error", "error": f"{type(exc).__name__}: {exc}"}
            det_rows.append(row)
            det_file.write(dumps(row) + "\n")
            det_file.flush()
            if row["deterministic"] is not True:
                log(f"  determinism {spec.name}: deterministic={row['deterministic']} "
                    f"max diff {_fmt(row['max_run_to_run_diff'])} {row.get('error') or ''}")
    log(f"determinism: {len(det_rows)} of {len(det_cases)} kernels checked "
        f"({sum(r['deterministic'] is True for r in det_rows)} deterministic) "
        f"after {time.perf_counter() - t_start:.0f} s")

    # -- the grid --------------------------------------------------------------------------------------
    records: list[dict[str, Any]] = []
    not_run: collections.Counter = collections.Counter()
    last_progress = time.perf_counter()
    with memoized_oracle() as oracle_stats:
        for i, (spec, problem) in enumerate(cases):
            now = time.perf_counter()
            if now >= deadline:
                not_run.update(s.name for s, _ in cases[i:])
                break
            try:
                rec = run_case(spec, problem, RunOptions(timeout_s=timeout()), store=store)
            except Exception as exc:  # noqa: BLE001 - e.g. the device fell over while copying inputs
                rec = {"kernel": spec.name, "family": problem.family.value, "case": problem.key,
                       **{k: v for k, v in problem.to_dict().items() if k != "values"},
                       "verdict": "kernel_error", "cause": "harness_error", "outcome": "harness_error",
                       "why": f"run_case raised {type(exc).__name__}: {exc}", "error": f"{type(exc).__name__}: {exc}"}
                store.append(rec)
            records.append(rec)
            if rec["verdict"] in ("divergent", "kernel_error"):
                log(f"  {rec['verdict']}: {spec.name} {problem.dtype}{'+tf32' if problem.tf32 else ''} "
                    f"L={problem.length} {problem.regime}: {str(rec.get('why'))[:200]}")
            if time.perf_counter() - last_progress >= PROGRESS_EVERY_S:
                last_progress = time.perf_counter()
                log(f"  [{i + 1}/{len(cases)} {last_progress - t_start:.0f} s] L={problem.length}")
    store.close()
    elapsed = time.perf_counter() - t_start
    if not_run:
        log(f"budget of {args.budget_s:g} s spent after {len(records)} of {len(cases)} cases; "
            f"{sum(not_run.values())} cases not run (the longest): "
            + ", ".join(f"{k} {n}" for k, n in not_run.items()))
    else:
        log(f"all {len(cases)} cases ran in {elapsed:.0f} s (oracle and baseline: {oracle_stats['misses']} "
            f"computed, {oracle_stats['hits']} reused)")
    header.update({"cases_run": len(records), "cases_not_run": sum(not_run.values()),
                   "not_run_by_kernel": dict(not_run), "budget_exhausted": bool(not_run),
                   "determinism_checked": len(det_rows), "elapsed_s": round(elapsed, 1),
                   "cuda_max_memory_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2)
                   if args.device == "cuda" else None})
    (out / HEADER_FILE).write_text(json.dumps(json.loads(dumps(header)), indent=2, sort_keys=True) + "\n")

    # -- report, determinism, summary last ------------------------------------------------------------------
    if not args.no_report:
        try:
            from harness.report import build_report

            paths = build_report(out)
            log(f"report: {paths.index}")
        except Exception as exc:  # noqa: BLE001 - the records are on disk; the report can be rebuilt
            log(f"report failed ({type(exc).__name__}: {exc}); the records are in {out / 'records.jsonl'}")
    log("")
    log("## Determinism (bit-for-bit, same inputs, "
        f"{DETERMINISM_REPEATS} calls)")
    log("")
    log(determinism_markdown(det_rows))
    log("")
    log(f"## Summary ({args.device})")
    log("")
    try:
        from harness.report import summary_markdown

        # the report's tables key on dtype alone; label TF32 cases so that they are not merged with float32
        log(summary_markdown([dict(r, dtype=f"{r['dtype']}+tf32") if r.get("tf32") else r for r in records]))
    except Exception as exc:  # noqa: BLE001
        counts = collections.Counter(r["verdict"] for r in records)
        log(f"(summary_markdown failed: {type(exc).__name__}: {exc}) verdicts: {dict(counts)}")
    intree = {s.name for s in specs if s.source == "intree"}
    failing = [r for r in records if r["kernel"] in intree and r["verdict"] in ("divergent", "kernel_error")]
    return 1 if failing else 0


if __name__ == "__main__":
    sys.exit(main())
