"""The `harness` command line (also `python -m harness`). Thin: each subcommand calls one library function.

Exit status: 0 when every case is equivalent (or out of domain: the inputs' finding, not the kernel's),
1 when any case diverges or a kernel breaks its contract (or the gate fails), 2 for a usage or adapter
error (unknown family, target not found, not callable, unavailable kernel).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import sys
from pathlib import Path
from typing import Sequence

from harness.errors import HarnessError, InvalidArgument

EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2


def _default_run_dir(name: str) -> Path:
    from harness.cases import ROOT

    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    return ROOT / "reports" / f"{name}-{stamp}"


def _policy(args):
    from harness.verdict import Policy

    return Policy.parse(args.policy) if getattr(args, "policy", None) else Policy()


def _finish_run(run_dir: Path, records: list[dict], *, quiet: bool = False) -> int:
    from harness.report import append_step_summary, build_report, run_summary_markdown
    from harness.store import load_header

    build_report(run_dir)
    summary = run_summary_markdown(records, load_header(run_dir))
    append_step_summary(summary)  # no-op unless $GITHUB_STEP_SUMMARY is set
    if not quiet:
        print(summary)
        print(f"\nreport: {run_dir / 'index.md'}")
    failing = [r for r in records if r.get("verdict") in ("divergent", "kernel_error")]
    return EXIT_FAIL if failing else EXIT_OK


# ------------------------------------------------------------------------------------------ commands
def cmd_list(args) -> int:
    from harness.kernels.registry import all_kernels

    rows = []
    for spec in all_kernels(args.family):
        reason = spec.unavailable_reason()
        caps = spec.capabilities
        unsupported = "; ".join(f"{k}: {v}" for k, v in sorted(caps.unsupported.items()))
        rows.append({"kernel": spec.name, "family": spec.family.value,
                     "available": "yes" if reason is None else f"no: {reason}",
                     "dtypes": ",".join(caps.dtypes), "devices": ",".join(caps.devices),
                     "lengths": caps.lengths.value, "chunk": "-" if caps.chunk_sizes is None else
                     (",".join(map(str, caps.chunk_sizes)) or "any"),
                     "autograd": "yes" if caps.autograd else "no", "unsupported": unsupported or "-"})
    from harness.kernels.triton_interpreter import CORRECTIONS, describe

    layer = describe()
    if args.json:
        print(json.dumps(rows, indent=1))
    else:
        from tabulate import tabulate

        print(tabulate(rows, headers="keys", tablefmt="github"))
        if layer["interpreted"]:
            print(f"\nTriton kernels run interpreted here (triton {layer['triton']}), with the corrections:")
            for c in CORRECTIONS:
                state = "on" if c.name in layer["corrections"] else "off"
                print(f"  {c.name} [{state}]: {c.summary}")
            if layer["corrections_unavailable"]:
                print(f"  not applied: {layer['corrections_unavailable']}")
    return EXIT_OK


def cmd_check(args) -> int:
    from harness.api import check
    from harness.store import RunStore, environment

    run_dir = Path(args.report_dir) if args.report_dir else _default_run_dir("check")
    dtypes = tuple(args.dtypes.split(",")) if args.dtypes else None
    with RunStore(run_dir, header=environment(args.profile)) as store:
        result = check(args.kernel, family=args.family, profile=args.profile, dtypes=dtypes, device=args.device,
                       max_length=args.max_length, max_examples=args.max_examples, policy=_policy(args),
                       store=store, counterexample_dir=Path(args.cases_dir) if args.cases_dir else None,
                       grad=not args.no_grad)
    status = _finish_run(run_dir, result.records)
    if result.message:
        print("\n" + result.message)
        if result.counterexample:
            print(f"\ncounterexample saved: {result.counterexample}")
    return max(status, result.exit_code)


def cmd_sweep(args) -> int:
    from harness.cases import load_sweep
    from harness.runner import RunOptions, run_cases, run_pairs
    from harness.store import RunStore, environment

    sweep = load_sweep(args.name)
    run_dir = Path(args.report_dir) if args.report_dir else _default_run_dir(sweep.name)
    options = RunOptions(policy=_policy(args))
    header = environment(f"sweep:{sweep.name}")
    if sweep.answers:  # the sweep's question and its table, rendered by the report from the run alone
        header["answers"] = [table.to_dict() for table in sweep.answers]
    with RunStore(run_dir, header=header) as store:
        records = run_cases(sweep.cases(), options, store=store,
                            progress=None if args.quiet else _progress)
        if sweep.pairs:
            records += run_pairs(sweep, options, store=store)
    return _finish_run(run_dir, records)


def _progress(rec: dict) -> None:
    print(f"  {rec['kernel']:<40} {rec['dtype']:<9} L={rec['length']:<6} {rec['regime']:<11} "
          f"{rec['verdict']}", file=sys.stderr)


def cmd_replay(args) -> int:
    from harness.cases import load_case, resolve_kernel
    from harness.problems import Problem
    from harness.runner import RunOptions, run_case

    if args.file:
        case = load_case(args.file)
        spec = resolve_kernel(case.kernel, case.kernel_target, case.problem.family.value)
        problem, expect = case.problem, case.expect
    else:
        if not (args.kernel and args.problem):
            raise InvalidArgument("replay needs FILE, or --kernel NAME with --problem JSON")
        spec, problem, expect = resolve_kernel(args.kernel), Problem.from_dict(json.loads(args.problem)), None
    record = run_case(spec, problem, RunOptions(policy=_policy(args)))
    keys = ("kernel", "family", "dtype", "length", "regime", "verdict", "cause", "why", "cond_max", "max_abs",
            "max_rel", "ulp_max", "onset_t", "domain_onset_t", "nonfinite_class", "outcome", "error")
    for key in keys:
        if record.get(key) is not None:
            print(f"{key:>16}: {record[key]}")
    if expect is not None and record["verdict"] != expect:
        print(f"\nexpected verdict {expect!r}, got {record['verdict']!r}")
        return EXIT_FAIL
    return EXIT_FAIL if record["verdict"] in ("divergent", "kernel_error") and expect is None else EXIT_OK


def cmd_report(args) -> int:
    from harness.report import build_report, summary_markdown
    from harness.store import load_records

    records = load_records(args.run_dir)
    if not records:
        raise InvalidArgument(f"run_dir={args.run_dir!r} holds no records (records*.jsonl)")
    paths = build_report(args.run_dir, args.out)
    print(summary_markdown(records))
    print(f"\nreport: {getattr(paths, 'index', paths)}")
    return EXIT_OK


def cmd_diff(args) -> int:
    from harness.gate import diff_markdown, diff_runs
    from harness.store import load_records

    print(diff_markdown(diff_runs(load_records(args.base), load_records(args.new))))
    return EXIT_OK


def cmd_gate(args) -> int:
    from harness.gate import gate

    from harness.report import append_step_summary

    result = gate(args.baseline, args.run_dir, fail_on=args.fail_on, fail_on_missing=args.fail_on_missing)
    summary = result.summary_markdown()
    append_step_summary(summary)
    print(summary)
    return EXIT_OK if result.passed else EXIT_FAIL


def cmd_baseline(args) -> int:
    from harness.gate import update_baseline

    update_baseline(args.run_dir, args.baseline)
    print(f"baseline updated: {args.baseline} <- {args.run_dir}")
    return EXIT_OK


# --------------------------------------------------------------------------------------------- parser
def build_parser() -> argparse.ArgumentParser:
    from harness.options import add_report_options

    p = argparse.ArgumentParser(prog="harness", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("list", help="every kernel the harness knows, with capabilities and availability here")
    s.add_argument("--family", default=None)
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_list)

    s = sub.add_parser("check", help="drive one kernel (registered name or module:attr / file.py:attr)")
    s.add_argument("--family", default=None, help="linear_scan | selective_scan | retention | retention_normed")
    s.add_argument("--kernel", required=True, help="TARGET: package.module:attr, path/to/file.py:attr")
    s.add_argument("--profile", choices=("dev", "ci", "nightly"), default="ci")
    s.add_argument("--dtypes", default=None, help="comma-separated subset of float64,float32,float16,bfloat16")
    s.add_argument("--device", default="cpu")
    s.add_argument("--max-length", type=int, default=None)
    s.add_argument("--max-examples", type=int, default=None)
    s.add_argument("--cases-dir", default=None, help="where the shrunk counterexample is saved")
    s.add_argument("--no-grad", action="store_true",
                   help="skip the gradient check (by default every differentiable kernel's gradients are checked)")
    s.set_defaults(func=cmd_check)

    s = sub.add_parser("sweep", help="run a named sweep from cases/sweeps/ (or a .toml file)")
    s.add_argument("name")
    s.add_argument("--quiet", action="store_true")
    s.set_defaults(func=cmd_sweep)

    s = sub.add_parser("replay", help="re-run a saved case (cases/counterexamples/*.json) or a replay command")
    s.add_argument("file", nargs="?")
    s.add_argument("--kernel", default=None)
    s.add_argument("--problem", default=None, help="the problem as JSON (from a record's replay command)")
    s.set_defaults(func=cmd_replay)

    s = sub.add_parser("report", help="build tables and plots for a run directory")
    s.add_argument("run_dir")
    s.add_argument("--out", default=None)
    s.set_defaults(func=cmd_report)

    s = sub.add_parser("diff", help="compare two runs cell by cell, worst first")
    s.add_argument("base")
    s.add_argument("new")
    s.set_defaults(func=cmd_diff)

    s = sub.add_parser("gate", help="fail when a run is worse than the baseline")
    s.add_argument("run_dir")
    s.add_argument("--baseline", default="reports/baseline")
    s.add_argument("--fail-on-missing", action="store_true")
    s.set_defaults(func=cmd_gate)

    s = sub.add_parser("update-baseline", help="make a run the new baseline (reports/baseline)")
    s.add_argument("run_dir")
    s.add_argument("--baseline", default="reports/baseline")
    s.set_defaults(func=cmd_baseline)

    for name in ("check", "sweep", "replay", "gate"):
        add_report_options(sub.choices[name], cli=True, command=name)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    from harness.kernels.triton_interpreter import interpret_if_no_gpu

    interpret_if_no_gpu()  # Triton kernels on a CPU-only machine run interpreted; set before triton loads
    try:
        parser = build_parser()
        args = parser.parse_args(argv)
        return args.func(args)
    except InvalidArgument as exc:
        print(f"harness: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except HarnessError as exc:
        print(f"harness: error: {exc}", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
