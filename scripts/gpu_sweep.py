#!/usr/bin/env python3
"""A bounded sweep of every kernel that declares CUDA, on the GPU, against the float64 oracle on the CPU.

    python scripts/gpu_sweep.py OUT_DIR [--budget-s 400] [--lengths 64,257,1024,4096] [--kernels intree,fla]
    python scripts/gpu_sweep.py OUT_DIR --plan              # list the cases (no GPU needed)
    python scripts/gpu_sweep.py OUT_DIR --device cpu ...    # rehearse the same sweep on the CPU
    python scripts/gpu_sweep.py OUT_DIR --device cpu --dry-run   # the rehearsal `make test-gpu-dry` runs
    python scripts/gpu_sweep.py OUT_DIR --finish [--cut-short WHY]  # report what OUT_DIR holds (no GPU used)

Run by `scripts/gpu_check.sh`, which sets ``PYTHONPATH`` to this checkout and the device bundle and
bounds the whole run from outside; see docs/gpu.md.

Phases, each bounded, in order:

1. **Load** (`select_kernels`): every kernel that declares the device (and, for the record, every kernel
   that declares CUDA) is loaded on a thread with ``--load-timeout-s``; whatever a load raises, or a load
   that does not finish (an nvcc build), leaves that kernel out with the reason. Where each third-party
   package was imported from is recorded (the bundle, or the machine's own).
2. **Plan** (`plan_cases`): lengths 64, 257, 1024, 4096; float32 with TF32 off, float32 with TF32 on (only
   where the GPU has TF32 *and* the kernel computes with matmuls, `KernelSpec.uses_matmuls`), float16,
   bfloat16; regimes ``trained`` and ``unstable`` for the scans (``trained`` for retention); selective
   scans also with Mamba's options (D, z, delta_bias, softplus) where the kernel takes them; chunk sizes
   16 and 64 for chunked kernels. Shortest first.
3. **Determinism** (`harness.gpu.determinism_check`): one float32 case of length <= 1024 per kernel,
   called 3 times, untimed, within ``--determinism-budget-s``.
4. **Grid**: every case through `harness.runner.run_case` (inputs rounded once and copied to the device,
   the oracle in float64 on the CPU, the kernel under its contract, the verdict). The first case of each
   compile key (kernel, dtype, TF32, chunk, options, length) is preceded by an untimed warm-up call
   (``--warmup-timeout-s``), so that Triton's compile and autotuning happen outside the timed call. No
   case starts once ``--budget-s`` has passed since the start.
5. **Finish** (`finish`): ``run.json`` completed, the report built, ``gpu_summary.md`` written, and the
   tables printed, the summary last. Also run on its own (``--finish``, in a fresh process that never
   touches the GPU) by gpu_check.sh when the outer time limit killed the sweep.

Stops early: on a kernel error or timeout on a GPU the device is probed (`harness.gpu.device_health`);
when it fails the probe or the error is a sticky CUDA error (`harness.gpu.is_sticky_error`: an illegal
address, a device-side assert), every later case would fail for the context's sake, so the sweep stops
there with that error in ``run.json`` (``stopped``) and in the report. A warm-up or case that times out
on a healthy device leaves its thread running in the kernel (an autotuner is not thread-safe), so the
remaining cases of that kernel's package (`skip_group`) are skipped, with the reason. SIGTERM (the outer limit) ends
the sweep where it is and still finishes.

Writes into OUT_DIR: ``records.jsonl`` (one record per case, `harness.store.RunStore`), ``run.json``
(the header: plan, packages, phases, what was not run and why), ``determinism.jsonl``, ``warmup.jsonl``,
``gpu_summary.md`` and the report (`harness.report.build_report`).

Exit status: 0 without a GPU (after one line saying why), and when every in-tree kernel case is
equivalent or out of domain; 1 when an in-tree kernel is divergent or a kernel error on the device
(third-party findings are what the sweep is for and do not fail it); 3 when the sweep stopped on a
sticky CUDA error or a hung device; 2 on a bad argument.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import math
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any, Iterator, Sequence

DEFAULT_BUDGET_S = 400.0
DEFAULT_LENGTHS = (64, 257, 1024, 4096)
DRY_RUN_LENGTHS = (16,)
#: What a dry run drives end to end unless --kernels says otherwise: the in-tree forms of each family and
#: one quick kernel of each bundled package (every kernel is still loaded, so an import error of any shows).
DRY_RUN_KERNELS = ("intree.blelloch", "intree.retention_chunkwise", "intree.retention_normed_parallel",
                   "mambapy.pscan", "torchscale.recurrent", "yar.chunkwise", "accelerated_scan.ref",
                   "fla.fused_recurrent_retention")
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
DEFAULT_TIMEOUT_S = 30.0  # a timed call, after its warm-up
DEFAULT_WARMUP_TIMEOUT_S = 120.0  # an untimed first call: Triton's compile and autotuning
DEFAULT_LOAD_TIMEOUT_S = 90.0  # one kernel's load (an import that builds a CUDA extension with nvcc)
DEFAULT_DETERMINISM_BUDGET_S = 90.0  # its first calls compile and autotune, which the grid then need not
PROGRESS_EVERY_S = 15.0
ORACLE_CACHE_ENTRIES = 8
#: The third-party packages the adapters import (import names), whose origin run.json records.
THIRD_PARTY_PACKAGES = ("mambapy", "torchscale", "yet_another_retnet", "accelerated_scan", "fla", "mamba_ssm")
SUMMARY_FILE = "gpu_summary.md"
EXIT_STOPPED = 3


def log(text: str = "") -> None:
    print(text, flush=True)


class CutShort(BaseException):
    """Raised in the main thread by SIGTERM (the outer time limit): stop where we are and finish.

    A BaseException, like KeyboardInterrupt, so that the ``except Exception`` that keeps one case's
    harness failure from ending the sweep does not swallow it.
    """


# ------------------------------------------------------------------------------------------------ load
def load_within(spec, timeout_s: float) -> str | None:
    """``spec.unavailable_reason()`` on a daemon thread: None when it loaded, else why not (in time).

    A load that has not finished after ``timeout_s`` (an nvcc build at import) is left running and the
    kernel is left out; any exception a load raises is already a reason (`KernelSpec.unavailable_reason`),
    and one that still escapes is turned into one here.
    """
    box: dict[str, Any] = {}

    def load() -> None:
        try:
            box["reason"] = spec.unavailable_reason()
        except BaseException as exc:  # noqa: BLE001 - a load's failure is a reason, never the sweep's end
            box["reason"] = f"loading raised {type(exc).__name__}: {exc}"

    thread = threading.Thread(target=load, name=f"load-{spec.name}", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        return f"loading did not finish within {timeout_s:g} s (left running; e.g. an nvcc build at import)"
    return box["reason"]


def select_kernels(device: str, patterns: Sequence[str], *, include_slow: bool = False, load_all: bool = False,
                   load_timeout_s: float = DEFAULT_LOAD_TIMEOUT_S,
                   deadline: float | None = None) -> tuple[list, list[tuple[str, str]]]:
    """(available kernels that declare ``device``, [(name, why not)] for those left out).

    ``load_all`` (a dry run): every kernel that declares CUDA is loaded too, whatever ``patterns`` say, and
    left out with the reason where it does not run here, so that an import or packaging error of the GPU
    run shows in the rehearsal.
    """
    from harness.kernels import registry

    chosen, left_out = [], []
    for spec in registry.all_kernels():
        declared = spec.capabilities.devices
        if device not in declared and "cuda" not in declared:
            continue
        selected = not patterns or any(p in spec.name for p in patterns)
        if not selected and not load_all:
            continue
        timeout = load_timeout_s if deadline is None else max(5.0, min(load_timeout_s, deadline - time.perf_counter()))
        reason = load_within(spec, timeout)
        if not selected:  # a dry run loads every kernel: a load problem shows even where it does not run
            if reason is not None:
                left_out.append((spec.name, reason))
            continue
        if reason is None and device not in declared:
            reason = f"declares {list(declared)}, not {device} (loaded here: its imports work)"
        if reason is None and device == "cpu" and spec.capabilities.slow and not include_slow:
            reason = "run by an interpreter on the CPU (capabilities.slow); left out of a CPU rehearsal"
        if reason is not None:
            left_out.append((spec.name, reason))
        else:
            chosen.append(spec)
    return chosen, left_out


def imported_modules() -> dict[str, str]:
    """Every top-level module imported so far that is not in the standard library, with its folder or file.

    Recorded in run.json so that a CPU rehearsal shows what the GPU machine must have (tests compare it
    with that machine's package list).
    """
    out = {}
    for name, module in list(sys.modules.items()):
        if "." in name or name in sys.stdlib_module_names or name.startswith("_") or module is None:
            continue
        where = getattr(module, "__file__", None)
        if where:
            out[name] = where
    return dict(sorted(out.items()))


def package_origins() -> dict[str, str | None]:
    """Where each third-party package would be imported from (its folder), without importing it."""
    import importlib.machinery

    origins: dict[str, str | None] = {}
    for name in THIRD_PARTY_PACKAGES:
        found = importlib.machinery.PathFinder.find_spec(name)
        locations = list(found.submodule_search_locations or []) if found is not None else []
        origins[name] = locations[0] if locations else (found.origin if found is not None else None)
    return origins


# ------------------------------------------------------------------------------------------------ plan
def _variants(spec, regimes: Sequence[str]) -> Iterator[dict[str, Any]]:
    fam = spec.family.value
    for regime in regimes:
        yield {"regime": regime}
        if fam == "selective_scan" and regime == "trained" and spec.capabilities.selective_options:
            yield {"regime": regime, **MAMBA_OPTIONS}


def plan_cases(specs: Sequence, *, device: str, lengths: Sequence[int], tf32: bool) -> list[tuple[Any, Any]]:
    """Every (kernel, problem) of the grid that the kernel's capabilities accept, shortest first.

    The TF32 setting is planned for a kernel only when ``tf32`` (the device has TF32) and the kernel
    computes with matmuls (`KernelSpec.uses_matmuls`): for an elementwise scan the flags change nothing
    and the case would only be held to a bound 8192 times looser. Within a length, cases that share
    the oracle's inputs (family, dtype, regime, options) are adjacent so that the memoized oracle
    serves them all.
    """
    from harness.cases import runnable
    from harness.problems import Problem

    cases = []
    for spec in specs:
        fam = spec.family.value
        caps = spec.capabilities
        settings = [s for s in DTYPE_SETTINGS if not s[1] or (tf32 and spec.uses_matmuls)]
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


def compile_key(spec, problem) -> tuple:
    """What decides which Triton specialization (and autotuner key) a call meets: everything but the values."""
    return (spec.name, problem.dtype, problem.tf32, problem.chunk_size, problem.length, problem.has_D,
            problem.has_z, problem.has_delta_bias, problem.delta_softplus)


# ---------------------------------------------------------------------------------------------- oracle
def oracle_cache(max_entries: int = ORACLE_CACHE_ENTRIES):
    """The run's `harness.oracle_cache.OracleCache`: the float64 oracle and the same-dtype baseline computed
    once per problem across kernels, TF32 on and off and chunk sizes (passed to the runner in RunOptions)."""
    from harness.oracle_cache import OracleCache

    return OracleCache(max_entries)


# ----------------------------------------------------------------------------------------------- tables
def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return "-" if math.isnan(value) else f"{value:.3g}"
    return "-" if value is None else str(value)


def _cell(text: Any, limit: int = 120) -> str:
    return " ".join(str(text or "").split()).replace("|", "/")[:limit]


def determinism_markdown(rows: Sequence[dict[str, Any]]) -> str:
    if not rows:
        return "_No determinism check ran._"
    lines = ["| kernel | device | dtype | length | deterministic | max_run_to_run_diff | n_differing | error |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['kernel']} | {r['device']} | {r['dtype']} | {r['length']} | {_fmt(r['deterministic'])} "
                     f"| {_fmt(r['max_run_to_run_diff'])} | {r['n_differing']} | {_cell(r.get('error'))} |")
    return "\n".join(lines)


def tf32_markdown(records: Sequence[dict[str, Any]]) -> str:
    """float32 cases with TF32 off and on side by side, per kernel, length, regime, options and chunk.

    ``max_rel`` is the same kind of number on both sides (relative error against the oracle), while
    ``cond_max`` is measured against float32's unit roundoff (off) and TF32's, 8192 times larger (on).
    """
    pairs: dict[tuple, dict[bool, dict[str, Any]]] = {}
    for r in records:
        if r.get("dtype") == "float32" and r.get("outcome") == "ok":
            key = (r["kernel"], r.get("length"), r.get("regime"), bool(r.get("delta_softplus")), r.get("chunk_size"))
            pairs.setdefault(key, {})[bool(r.get("tf32"))] = r
    rows = [(k, v) for k, v in sorted(pairs.items(), key=lambda kv: tuple(map(str, kv[0]))) if True in v]
    if not rows:
        return "_No TF32 pair ran (no TF32 on this device, or no kernel with matmuls)._"
    lines = ["| kernel | length | regime | chunk | off: verdict | off: max_rel | off: cond_max | on: verdict "
             "| on: max_rel | on: cond_max | on/off max_rel |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for (kernel, length, regime, options, chunk), sides in rows:
        off, on = sides.get(False, {}), sides[True]
        ratio = math.nan
        if off.get("max_rel") and on.get("max_rel") is not None and off["max_rel"] > 0:
            ratio = on["max_rel"] / off["max_rel"]
        lines.append(f"| {kernel} | {length} | {regime}{'+mamba' if options else ''} | {_fmt(chunk)} "
                     f"| {off.get('verdict', '-')} | {_fmt(off.get('max_rel'))} | {_fmt(off.get('cond_max'))} "
                     f"| {on.get('verdict', '-')} | {_fmt(on.get('max_rel'))} | {_fmt(on.get('cond_max'))} "
                     f"| {_fmt(ratio)} |")
    return "\n".join(lines)


def warmup_markdown(rows: Sequence[dict[str, Any]]) -> str:
    if not rows:
        return "_No warm-up call ran._"
    by_kernel: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        by_kernel.setdefault(r["kernel"], []).append(r)
    lines = ["| kernel | warm-ups | total s | slowest s | not ok |", "|---|---|---|---|---|"]
    for kernel, rs in by_kernel.items():
        bad = [f"{r['outcome']}: {_cell(r.get('error'), 80)}" for r in rs if r["outcome"] != "ok"]
        lines.append(f"| {kernel} | {len(rs)} | {sum(r['seconds'] for r in rs):.2f} "
                     f"| {max(r['seconds'] for r in rs):.2f} | {len(bad)}{': ' + bad[0] if bad else ''} |")
    return "\n".join(lines)


def kernels_markdown(header: dict[str, Any]) -> str:
    lines = ["| kernel | status |", "|---|---|"]
    for name in header.get("kernels", []):
        lines.append(f"| {name} | runs |")
    for name, why in sorted(header.get("kernels_left_out", {}).items()):
        lines.append(f"| {name} | left out: {_cell(why, 200)} |")
    return "\n".join(lines)


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    from harness.store import _decode

    rows = []
    if path.is_file():
        for line in path.read_text(encoding="utf-8").splitlines():
            with contextlib.suppress(json.JSONDecodeError):
                rows.append(_decode(json.loads(line)))
    return rows


# ---------------------------------------------------------------------------------------------- finish
def status_line(header: dict[str, Any]) -> str:
    if header.get("stopped"):
        st = header["stopped"]
        return (f"STOPPED after {st.get('kernel')} on {st.get('case')}: {st.get('reason')}: "
                f"{_cell(st.get('error'), 400)}")
    if header.get("cut_short"):
        return f"CUT SHORT: {header['cut_short']}"
    if header.get("budget_exhausted"):
        return f"budget of {header.get('budget_s')} s spent; {header.get('cases_not_run')} cases not run"
    if "cases_run" not in header:
        return "INCOMPLETE: the sweep ended before writing its totals"
    return f"complete: {header.get('cases_run')} of {header.get('cases_planned')} cases ran"


def finish(out: Path, *, report: bool = True, cut_short: str | None = None) -> int:
    """Write the report and ``gpu_summary.md`` from what ``out`` holds, print the tables; the exit status.

    Reads only files (never the GPU), so it also serves a sweep that was killed: gpu_check.sh then runs
    ``gpu_sweep.py OUT --finish --cut-short WHY`` in a fresh process.
    """
    from harness.store import HEADER_FILE, dumps, load_header, load_records

    header = load_header(out)
    if cut_short and not header.get("cut_short"):
        header["cut_short"] = cut_short
    records = load_records(out)
    det_rows = _read_jsonl(out / "determinism.jsonl")
    warm_rows = _read_jsonl(out / "warmup.jsonl")
    if "cases_run" not in header or cut_short:
        header["cases_recorded"] = len(records)
    (out / HEADER_FILE).write_text(json.dumps(json.loads(dumps(header)), indent=2, sort_keys=True) + "\n")
    if report:
        try:
            from harness.report import build_report

            t0 = time.perf_counter()
            paths = build_report(out)
            log(f"report: {paths.index} ({time.perf_counter() - t0:.1f} s)")
        except Exception as exc:  # noqa: BLE001 - the records are on disk; the report can be rebuilt
            log(f"report failed ({type(exc).__name__}: {exc}); the records are in {out / 'records.jsonl'}")
    try:
        from harness.report import summary_markdown

        # the report's tables key on dtype alone; label TF32 cases so that they are not merged with float32
        summary = summary_markdown([dict(r, dtype=f"{r['dtype']}+tf32") if r.get("tf32") else r for r in records])
    except Exception as exc:  # noqa: BLE001
        counts = collections.Counter(r.get("verdict") for r in records)
        summary = f"(summary_markdown failed: {type(exc).__name__}: {exc}) verdicts: {dict(counts)}"
    device = header.get("sweep_device", "?")
    sections = [
        ("Status", status_line(header)),
        ("Kernels", kernels_markdown(header)),
        ("Packages", "\n".join(f"- {k}: {v or 'not found'}" for k, v in header.get("packages", {}).items())
         or "_not recorded_"),
        ("Warm-up (untimed first calls)", warmup_markdown(warm_rows)),
        (f"Determinism (bit-for-bit, same inputs, {DETERMINISM_REPEATS} calls)", determinism_markdown(det_rows)
         + "".join(f"\n\nNot checked: {name}: {why}" for name, why in header.get("determinism_not_checked", {}).items())),
        ("TF32 (float32 cases, TF32 off vs on)", tf32_markdown(records)),
        (f"Summary ({device})", summary),
    ]
    text = "\n\n".join(f"## {title}\n\n{body}" for title, body in sections)
    (out / SUMMARY_FILE).write_text(f"# GPU sweep: {out}\n\n{text}\n", encoding="utf-8")
    log("")
    log(text)
    log("")
    log(f"status: {status_line(header)}")
    if header.get("stopped"):
        return EXIT_STOPPED
    from harness.records import FAILING_VERDICTS

    intree = set(header.get("intree_kernels", []))
    failing = [r for r in records if r.get("kernel") in intree and r.get("verdict") in FAILING_VERDICTS]
    return 1 if failing else 0


# ------------------------------------------------------------------------------------------------- run
def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="gpu_sweep.py", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out_dir", help="run directory for records.jsonl, run.json, determinism.jsonl and the report")
    ap.add_argument("--budget-s", type=float, default=DEFAULT_BUDGET_S,
                    help=f"start no case after this many seconds (default {DEFAULT_BUDGET_S:g})")
    ap.add_argument("--lengths", default=None,
                    help=f"comma-separated sequence lengths (default {','.join(map(str, DEFAULT_LENGTHS))}; "
                         f"{','.join(map(str, DRY_RUN_LENGTHS))} with --dry-run)")
    ap.add_argument("--kernels", default="", help="comma-separated substrings; only kernels whose name has one")
    ap.add_argument("--device", default="cuda", help="cuda (default), cuda:N, or cpu to rehearse on the CPU")
    ap.add_argument("--timeout-s", type=float, default=DEFAULT_TIMEOUT_S,
                    help=f"per timed kernel call, after its warm-up (default {DEFAULT_TIMEOUT_S:g})")
    ap.add_argument("--warmup-timeout-s", type=float, default=DEFAULT_WARMUP_TIMEOUT_S,
                    help=f"per untimed warm-up call: compile and autotuning (default {DEFAULT_WARMUP_TIMEOUT_S:g})")
    ap.add_argument("--load-timeout-s", type=float, default=DEFAULT_LOAD_TIMEOUT_S,
                    help=f"per kernel load (default {DEFAULT_LOAD_TIMEOUT_S:g})")
    ap.add_argument("--determinism-budget-s", type=float, default=DEFAULT_DETERMINISM_BUDGET_S,
                    help=f"the determinism phase (default {DEFAULT_DETERMINISM_BUDGET_S:g})")
    ap.add_argument("--include-slow", action="store_true",
                    help="on the CPU, also run kernels that run interpreted there (capabilities.slow)")
    ap.add_argument("--dry-run", action="store_true",
                    help=f"the CPU rehearsal: lengths {list(DRY_RUN_LENGTHS)} unless given, interpreted kernels "
                         "included; needs --device cpu")
    ap.add_argument("--plan", action="store_true", help="print the planned cases and exit (no GPU needed)")
    ap.add_argument("--no-report", action="store_true", help="skip build_report (records and tables only)")
    ap.add_argument("--finish", action="store_true", help="only report what OUT_DIR holds (no GPU used)")
    ap.add_argument("--cut-short", default=None, metavar="WHY", help="with --finish: why the sweep was killed")
    args = ap.parse_args(argv)
    if args.lengths is None:
        args.lengths = ",".join(map(str, DRY_RUN_LENGTHS if args.dry_run else DEFAULT_LENGTHS))
    try:
        args.lengths = tuple(int(x) for x in args.lengths.split(",") if x.strip())
    except ValueError:
        ap.error(f"--lengths={args.lengths!r} must be comma-separated integers, e.g. 64,257,1024")
    if not args.lengths or min(args.lengths) < 1:
        ap.error(f"--lengths={args.lengths!r} must list positive integers")
    for name in ("budget_s", "timeout_s", "warmup_timeout_s", "load_timeout_s", "determinism_budget_s"):
        if not getattr(args, name) > 0:
            ap.error(f"--{name.replace('_', '-')}={getattr(args, name)!r} must be positive")
    if not (args.device == "cpu" or args.device == "cuda" or args.device.startswith("cuda:")):
        ap.error(f"--device={args.device!r} must be cuda, cuda:N or cpu")
    if args.dry_run and args.device != "cpu":
        ap.error(f"--dry-run rehearses on the CPU; --device={args.device!r} must be cpu with it")
    args.include_slow = args.include_slow or args.dry_run
    args.kernels = tuple(k.strip() for k in args.kernels.split(",") if k.strip())
    if args.dry_run and not args.kernels:
        args.kernels = DRY_RUN_KERNELS
    return args


class Sweep:
    """The state of one sweep: its deadlines, files, and what it has run and skipped."""

    def __init__(self, args: argparse.Namespace, t_start: float):
        self.args = args
        self.t_start = t_start
        self.deadline = t_start + args.budget_s
        self.out = Path(args.out_dir)
        self.device = args.device
        self.on_gpu = args.device.startswith("cuda")
        self.skipped_sources: dict[str, str] = {}  # `skip_group` -> why its remaining cases are skipped
        self.not_run: collections.Counter = collections.Counter()
        self.not_run_why: dict[str, str] = {}
        self.stopped: dict[str, Any] | None = None
        self.records = 0
        self.warmed: set[tuple] = set()
        self.det_not_checked: dict[str, str] = {}  # kernel -> why its determinism check did not run
        self.oracle = oracle_cache()  # shared by the grid's cases and their warm-ups (RunOptions.oracle_cache)

    def remaining(self) -> float:
        return self.deadline - time.perf_counter()

    def timeout(self, wanted: float) -> float:
        """``wanted``, but ending at most 5 s past the budget (and never under min(wanted, 5 s))."""
        return max(min(wanted, 5.0), min(wanted, self.remaining() + 5.0))

    def check_device(self, spec, problem, outcome: str, error: str | None) -> None:
        """After a kernel failure: stop on a sticky error or a failed device probe, skip the package after a timeout.

        On the CPU the probe always passes, so only an error text naming a sticky CUDA error stops there.
        """
        if outcome not in ("raised", "timeout", "crashed", "harness_error"):
            return
        from harness import gpu

        probe = gpu.device_health(problem.device)
        if probe is not None or gpu.is_sticky_error(error):
            self.stopped = {"reason": "device hung" if probe and "hung" in probe else "sticky CUDA error",
                            "kernel": spec.name, "case": problem.key, "outcome": outcome,
                            "error": error, "probe": probe}
            log(f"  STOP: {spec.name} {problem.key}: {outcome}: {_cell(error, 300)}; probe: {probe or 'ok'}")
        elif outcome == "timeout":
            group = skip_group(spec)
            why = (f"{spec.name} timed out on {problem.key}; its thread may still be running in {group} (a "
                   f"Triton autotuner is not thread-safe), so the remaining cases of {group} are skipped")
            self.skipped_sources.setdefault(group, why)
            log(f"  skip {group}: {why}")


def skip_group(spec) -> str:
    """What a timed-out call's leftover thread may share state with: a third-party kernel's package (its
    Triton kernels and autotuners are shared between its forms), or the kernel itself (in-tree, user)."""
    return spec.name if spec.source in ("intree", "user") else spec.source


def _error_record(spec, problem, outcome: str, error: str, why: str) -> dict[str, Any]:
    return {"kernel": spec.name, "family": problem.family.value, "case": problem.key,
            **{k: v for k, v in problem.to_dict().items() if k != "values"},
            "verdict": "kernel_error", "cause": outcome, "outcome": outcome, "why": why, "error": error}


def run_determinism(sweep: Sweep, det_cases, deadline: float) -> None:
    from harness.gpu import determinism_check
    from harness.store import dumps

    rows = 0
    with open(sweep.out / "determinism.jsonl", "w", encoding="utf-8") as det_file:
        for spec, problem in det_cases:
            if time.perf_counter() >= deadline or sweep.stopped:
                sweep.det_not_checked.setdefault(spec.name, "stopped" if sweep.stopped else
                                                 "the determinism phase's budget was spent")
                continue
            if skip_group(spec) in sweep.skipped_sources:
                sweep.det_not_checked[spec.name] = sweep.skipped_sources[skip_group(spec)]
                continue
            try:  # untimed, so the warm-up timeout: the first call compiles and autotunes
                row = determinism_check(spec, problem, repeats=DETERMINISM_REPEATS,
                                        timeout_s=sweep.timeout(sweep.args.warmup_timeout_s))
            except Exception as exc:  # noqa: BLE001 - a harness failure on one kernel must not end the sweep
                row = {"kernel": spec.name, "device": problem.device, "dtype": problem.dtype,
                       "length": problem.length, "deterministic": None, "max_run_to_run_diff": math.nan,
                       "n_differing": 0, "outcome": "harness_error", "error": f"{type(exc).__name__}: {exc}"}
            rows += 1
            det_file.write(dumps(row) + "\n")
            det_file.flush()
            if row["deterministic"] is not True:
                log(f"  determinism {spec.name}: deterministic={row['deterministic']} "
                    f"max diff {_fmt(row['max_run_to_run_diff'])} {row.get('error') or ''}")
            if row.get("outcome") != "ok":
                sweep.check_device(spec, problem, row["outcome"], row.get("error"))
    log(f"determinism: {rows} of {len(det_cases)} kernels checked after {time.perf_counter() - sweep.t_start:.0f} s")


def run_grid(sweep: Sweep, cases, store) -> None:
    from harness.records import FAILING_VERDICTS
    from harness.runner import RunOptions, run_case
    from harness.store import dumps

    last_progress = time.perf_counter()
    with open(sweep.out / "warmup.jsonl", "w", encoding="utf-8") as warm_file:
        for i, (spec, problem) in enumerate(cases):
            if sweep.stopped:
                sweep.not_run.update(s.name for s, _ in cases[i:])
                break
            if time.perf_counter() >= sweep.deadline:
                sweep.not_run.update(s.name for s, _ in cases[i:])
                break
            if skip_group(spec) in sweep.skipped_sources:
                sweep.not_run[spec.name] += 1
                sweep.not_run_why.setdefault(spec.name, sweep.skipped_sources[skip_group(spec)])
                continue
            key = compile_key(spec, problem)
            if key not in sweep.warmed:
                sweep.warmed.add(key)
                timeout = sweep.timeout(sweep.args.warmup_timeout_s)
                try:
                    warm = run_case(spec, problem, RunOptions(timeout_s=timeout, oracle_cache=sweep.oracle))
                except Exception as exc:  # noqa: BLE001
                    warm = {"outcome": "harness_error", "error": f"{type(exc).__name__}: {exc}", "t_kernel": 0.0}
                row = {"kernel": spec.name, "case": problem.key, "outcome": warm["outcome"],
                       "error": warm.get("error"), "seconds": round(float(warm.get("t_kernel") or 0.0), 4)}
                warm_file.write(dumps(row) + "\n")
                warm_file.flush()
                if warm["outcome"] == "timeout":  # never time the case: its thread is still in the kernel
                    rec = _error_record(spec, problem, "timeout", warm.get("error") or "",
                                        f"timeout: the untimed warm-up call gave no result after {timeout:g} s")
                    store.append(rec)
                    sweep.records += 1
                    sweep.check_device(spec, problem, "timeout", warm.get("error"))
                    continue
                if warm["outcome"] != "ok":
                    sweep.check_device(spec, problem, warm["outcome"], warm.get("error"))
                    if sweep.stopped:
                        store.append(_error_record(spec, problem, warm["outcome"], warm.get("error") or "",
                                                   f"{warm['outcome']} in the warm-up call: {warm.get('error')}"))
                        sweep.records += 1
                        continue
            try:
                rec = run_case(spec, problem, RunOptions(timeout_s=sweep.timeout(sweep.args.timeout_s),
                                                         oracle_cache=sweep.oracle), store=store)
            except Exception as exc:  # noqa: BLE001 - e.g. the device fell over while copying inputs
                rec = _error_record(spec, problem, "harness_error", f"{type(exc).__name__}: {exc}",
                                    f"run_case raised {type(exc).__name__}: {exc}")
                store.append(rec)
            sweep.records += 1
            if rec["verdict"] in FAILING_VERDICTS:
                log(f"  {rec['verdict']}: {spec.name} {problem.dtype}{'+tf32' if problem.tf32 else ''} "
                    f"L={problem.length} {problem.regime}: {str(rec.get('why'))[:200]}")
            if rec["verdict"] == "kernel_error":
                sweep.check_device(spec, problem, rec["outcome"], rec.get("error"))
            if time.perf_counter() - last_progress >= PROGRESS_EVERY_S:
                last_progress = time.perf_counter()
                log(f"  [{i + 1}/{len(cases)} {last_progress - sweep.t_start:.0f} s] L={problem.length}")


def _max_memory_gib() -> float | None:
    import torch

    try:
        return round(torch.cuda.max_memory_allocated() / 2**30, 2)
    except Exception:  # noqa: BLE001 - a poisoned context must not cost the report
        return None


def _on_sigterm(signum, frame):  # noqa: ARG001
    raise CutShort(f"signal {signum} (the outer time limit) after "
                   f"{time.perf_counter() - _STARTED:.0f} s")


_STARTED = time.perf_counter()


def main(argv: Sequence[str] | None = None) -> int:
    global _STARTED
    t_start = _STARTED = time.perf_counter()
    args = parse_args(argv)
    out = Path(args.out_dir)
    if args.finish:
        if not (out / "run.json").is_file() and not (out / "records.jsonl").is_file():
            log(f"gpu_sweep: nothing to finish in {out} (no run.json, no records.jsonl)")
            return 0
        return finish(out, report=not args.no_report, cut_short=args.cut_short)
    in_main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _on_sigterm) if in_main_thread else None
    try:
        return _sweep(args, argv, t_start)
    except CutShort as exc:  # outside the cases (loading, or the report): gpu_check.sh's finish pass takes over
        log(f"gpu_sweep: cut short outside the cases: {exc}")
        return 128 + signal.SIGTERM
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _sweep(args: argparse.Namespace, argv: Sequence[str] | None, t_start: float) -> int:
    """Load, plan, determinism, grid and finish (`main` holds the SIGTERM handler around it)."""
    from harness.kernels import isolation

    out = Path(args.out_dir)

    from harness.kernels.triton_interpreter import interpret_if_no_gpu

    interpret_if_no_gpu()  # a CPU rehearsal runs Triton kernels interpreted: set before anything imports triton
    from harness.gpu import cuda_available, tf32_supported

    if args.device.startswith("cuda") and not args.plan:
        reason = cuda_available()
        if reason is not None:
            log(f"gpu_sweep: skipped: {reason}")
            return 0
    tf32_reason = tf32_supported() if args.device.startswith("cuda") else "the CPU has no TF32 axis"
    t0 = time.perf_counter()
    specs, left_out = select_kernels(args.device, args.kernels, include_slow=args.include_slow, load_all=args.dry_run,
                                     load_timeout_s=args.load_timeout_s, deadline=t_start + args.budget_s)
    t_load = time.perf_counter() - t0
    cases = plan_cases(specs, device=args.device, lengths=args.lengths, tf32=tf32_reason is None or args.plan)
    det_cases = determinism_problems(cases)

    per_kernel = collections.Counter(spec.name for spec, _ in cases)
    log(f"gpu_sweep: {len(cases)} cases on {args.device} over {len(specs)} kernels, lengths {list(args.lengths)}, "
        f"budget {args.budget_s:g} s (loading took {t_load:.1f} s)")
    if tf32_reason is not None and not args.plan:
        log(f"  TF32 axis left out: {tf32_reason}")
    for name, why in left_out:
        log(f"  left out {name}: {why}")
    import harness

    log(f"  harness: {Path(harness.__file__).resolve().parent}")
    origins = package_origins()
    for name, where in origins.items():
        log(f"  package {name}: {where or 'not found'}")
    if args.plan:
        for name, n in per_kernel.items():
            log(f"  {name}: {n} cases")
        for spec, p in cases:
            log(f"  {spec.name} {p.dtype}{'+tf32' if p.tf32 else ''} L={p.length} {p.regime}"
                f"{' mamba-options' if p.delta_softplus else ''}{f' chunk={p.chunk_size}' if p.chunk_size else ''}")
        return 0

    from harness.store import HEADER_FILE, RunStore, dumps, environment

    out.mkdir(parents=True, exist_ok=True)
    for stale in ("records.jsonl", "determinism.jsonl", "warmup.jsonl", SUMMARY_FILE):  # this script's own files
        (out / stale).unlink(missing_ok=True)
    header = environment(command=" ".join(["scripts/gpu_sweep.py", *(argv if argv is not None else sys.argv[1:])]))
    header.update({"sweep": "gpu_sweep", "sweep_device": args.device, "budget_s": args.budget_s,
                   "lengths": list(args.lengths), "tf32_axis": tf32_reason is None,
                   "tf32_kernels": sorted({s.name for s, p in cases if p.tf32}),
                   "kernels": [s.name for s in specs], "kernels_left_out": dict(left_out),
                   "intree_kernels": sorted(s.name for s in specs if s.source == "intree"),
                   "packages": origins, "harness_path": str(Path(harness.__file__).resolve().parent),
                   "pycache_prefix": sys.pycache_prefix, "writes_bytecode": not sys.dont_write_bytecode,
                   "cases_planned": len(cases), "t_load_s": round(t_load, 1)})
    store = RunStore(out, header=header)  # written now, so that a killed sweep leaves its plan
    sweep = Sweep(args, t_start)
    cut_short = None
    oracle_stats = {"hits": 0, "misses": 0}
    try:
        det_deadline = min(sweep.deadline, time.perf_counter() + args.determinism_budget_s)
        # the grid goes length by length through every kernel (one oracle per problem): one live worker
        # per kernel, or every case restarts its kernel's worker (a CUDA context and the package's imports)
        with isolation.workers_kept(len(specs)):
            run_determinism(sweep, det_cases, det_deadline)
            oracle_stats = sweep.oracle.stats
            run_grid(sweep, cases, store)
    except (CutShort, KeyboardInterrupt) as exc:
        cut_short = str(exc) or type(exc).__name__
        log(f"cut short: {cut_short}")
    finally:
        store.close()
    elapsed = time.perf_counter() - t_start
    if cut_short is None and sweep.records < len(cases) and not sweep.stopped:
        log(f"budget of {args.budget_s:g} s spent after {sweep.records} of {len(cases)} cases; "
            f"{sum(sweep.not_run.values())} cases not run: " + ", ".join(f"{k} {n}" for k, n in sweep.not_run.items()))
    elif cut_short is None:
        log(f"{sweep.records} of {len(cases)} cases ran in {elapsed:.0f} s (oracle and baseline: "
            f"{oracle_stats['misses']} computed, {oracle_stats['hits']} reused)")
    header.update({"cases_run": sweep.records, "cases_not_run": len(cases) - sweep.records,
                   "not_run_by_kernel": dict(sweep.not_run), "not_run_why": sweep.not_run_why,
                   "budget_exhausted": time.perf_counter() >= sweep.deadline and sweep.records < len(cases),
                   "stopped": sweep.stopped, "cut_short": cut_short, "skipped_packages": sweep.skipped_sources,
                   "warmups": len(sweep.warmed), "elapsed_s": round(elapsed, 1),
                   "imported_modules": imported_modules(), "determinism_not_checked": sweep.det_not_checked,
                   "cuda_max_memory_gib": _max_memory_gib() if sweep.on_gpu else None})
    (out / HEADER_FILE).write_text(json.dumps(json.loads(dumps(header)), indent=2, sort_keys=True) + "\n")
    return finish(out, report=not args.no_report)


if __name__ == "__main__":
    status = main()
    if status == EXIT_STOPPED:  # a hung kernel's thread or a poisoned context can hang the interpreter's exit
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)
    sys.exit(status)
