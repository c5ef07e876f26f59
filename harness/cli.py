"""The `harness` command line (also `python -m harness`). Thin: each subcommand calls one library function.

Exit status: 0 when every case is equivalent (or out of domain: the inputs' finding, not the kernel's),
1 when any case diverges or a kernel breaks its contract (or the gate fails), 2 for a usage or adapter
error (unknown family, target not found, not callable, unavailable kernel, a malformed file or
argument, an output path that cannot be written), 130 when the run was interrupted (SIGINT or SIGTERM):
the records taken so far are kept and the report is written, marked partial; 141 (128 + SIGPIPE, as a shell
reports a command SIGPIPE ended) when the reader of stdout went away (``harness gate RUN | head``): the
output is cut there, quietly, and the command's own status is unknown (it may have stopped mid-way).

Defaults come from the caller's project (`harness.project`: the ``[tool.harness]`` table of the nearest
pyproject.toml, else ``./.harness/``): where runs, counterexamples and the baseline go, the sweeps, the
profile, the policy, the timeout and the kernels `harness check` checks; a flag overrides the table.

Kernels run in a worker process each (see `harness.kernels.isolation`): a kernel that crashes or hangs
costs one ``kernel_error`` record. ``--in-process`` runs them in the harness's own process instead, to
step through a kernel with pdb (``breakpoint()`` in the kernel works there and only there).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import signal
import sys
from pathlib import Path
from typing import Sequence

from harness.errors import HarnessError, InvalidArgument
from harness.records import FAILING_VERDICTS

EXIT_OK, EXIT_FAIL, EXIT_USAGE, EXIT_INTERRUPTED, EXIT_BROKEN_PIPE = 0, 1, 2, 130, 141


def _on_signal(signum, frame):  # noqa: ARG001 - signal handler signature
    """SIGINT/SIGTERM: ask the run to stop (`harness.kernels.isolation.request_stop`); raise nothing here."""
    from harness.kernels.isolation import request_stop

    request_stop("interrupted (SIGINT)" if signum == signal.SIGINT else "terminated (SIGTERM)")


class _Interruptible:
    """A store that raises `Interrupted` after the record it appends once a stop has been requested."""

    def __init__(self, store):
        self.store = store

    def append(self, record) -> None:
        from harness.kernels.isolation import raise_if_stopped

        self.store.append(record)
        raise_if_stopped()


def _positive_int(name: str):
    """An argparse ``type`` for a whole number >= 1 that names the option in its error."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name}={text!r} is not a whole number; expected an integer >= 1") from None
        if value < 1:
            raise argparse.ArgumentTypeError(f"{name}={value} must be >= 1; leave it out for the profile's default")
        return value
    return parse


def _shrink_deadline(text: str) -> float:
    """``--shrink-deadline``'s type: seconds >= 0 (0: report the first failing case as found)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--shrink-deadline={text!r} is not a number; expected seconds >= 0") from None
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"--shrink-deadline={value:g} must be >= 0 seconds (0: do not shrink)")
    return value


def _dtype_list(text: str) -> tuple[str, ...]:
    from harness.kernels.names import ALL_DTYPES

    names = tuple(d.strip() for d in text.split(","))
    if not text.strip() or any(not d for d in names):
        raise argparse.ArgumentTypeError(f"--dtypes={text!r} names no dtype (or an empty one); expected a "
                                         f"comma-separated subset of {','.join(ALL_DTYPES)}")
    bad = [d for d in names if d not in ALL_DTYPES]
    if bad:
        raise argparse.ArgumentTypeError(f"--dtypes={text!r}: {bad} unknown; expected a subset of {','.join(ALL_DTYPES)}")
    return tuple(dict.fromkeys(names))  # a dtype named twice is one search


def _project(args):
    """The caller's project (`harness.project.current`), loaded once per command."""
    if getattr(args, "_project", None) is None:
        from harness.project import current

        args._project = current()
    return args._project


def _directory(flag: str, path: Path) -> Path:
    """``path``, refused with `InvalidArgument` naming ``flag`` when it or a folder above it is a file."""
    blocked = next((p for p in (path, *path.parents) if p.exists() and not p.is_dir()), None)
    if blocked is not None:
        raise InvalidArgument(f"{flag}={str(path)!r}: {str(blocked)!r} is a file, not a directory; expected a "
                              "directory")
    return path


def _run_dir(args, name: str) -> Path:
    """The run directory: ``--report-dir`` or a fresh stamped one; one that holds a run needs ``--append``, and
    one that holds someone else's index.md or CSVs is refused (`harness.report.foreign_report_files`)."""
    from harness.report import refuse_foreign_files
    from harness.store import has_records

    run_dir = _directory("--report-dir", Path(args.report_dir) if args.report_dir
                         else _default_run_dir(name, _project(args)))
    refuse_foreign_files("--report-dir", run_dir)
    if has_records(run_dir) and not getattr(args, "append", False):
        raise InvalidArgument(f"--report-dir={str(run_dir)!r} already holds the records of a run; pass --append to "
                              "add this run's records to it, or choose another directory")
    return run_dir


def _apply_isolation(args) -> None:
    from harness.kernels.isolation import configure

    timeout = getattr(args, "timeout", None)
    if timeout is None and args.command in _RUNS_KERNELS:
        timeout = _project(args).timeout
    if timeout is not None:
        configure(timeout_s=timeout)
    if getattr(args, "in_process", False):
        configure(isolation="in-process")


def _finish_partial(run_dir: Path, reason: str) -> int:
    """Mark the run partial, write its report from the records taken so far, exit 130."""
    from harness.report import build_report
    from harness.store import has_records, mark_partial

    mark_partial(run_dir, reason)
    if has_records(run_dir):
        build_report(run_dir)
        print(f"\nharness: {reason}; the records taken so far are kept and the report is marked partial: "
              f"{run_dir / 'index.md'}", file=sys.stderr)
    else:
        print(f"\nharness: {reason} before any record was taken", file=sys.stderr)
    return EXIT_INTERRUPTED


def _default_run_dir(name: str, project=None) -> Path:
    """A fresh stamped run directory in the project's ``runs`` folder (`harness.project.run_dir`)."""
    from harness.project import run_dir

    return run_dir(name, project)


def _policy(args):
    from harness.verdict import Policy

    spec = getattr(args, "policy", None) or _project(args).policy
    return Policy.parse(spec) if spec else Policy()


def _finish_run(run_dir: Path, records: list[dict], *, quiet: bool = False) -> int:
    from harness.report import append_step_summary, build_report, run_summary_markdown, terminal_text
    from harness.store import load_header, load_records

    build_report(run_dir)
    in_report = load_records(run_dir)  # what the report shows (with --append, earlier runs' records too)
    summary = run_summary_markdown(in_report, load_header(run_dir))
    if len(in_report) != len(records):
        summary += f"\n\n(this run added {len(records)} of the report's {len(in_report)} records: --append)"
    append_step_summary(summary)  # no-op unless $GITHUB_STEP_SUMMARY is set
    if not quiet:
        print(terminal_text(summary))
        print(f"\nreport: {run_dir / 'index.md'}")
    failing = [r for r in records if r.get("verdict") in FAILING_VERDICTS]
    return EXIT_FAIL if failing else EXIT_OK


# ------------------------------------------------------------------------------------------ commands
def cmd_list(args) -> int:
    from harness.kernels.registry import all_kernels

    rows = []
    for spec in all_kernels(args.family):
        reason = spec.unavailable_reason()
        caps = spec.capabilities
        unsupported = "; ".join([f"{k}: {v}" for k, v in sorted(caps.unsupported.items())]
                                + [f"regime {k}: {v}" for k, v in sorted(caps.skip_regimes.items())])
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


def _kernel_families(kernels: list[str], families: list[str]) -> list[str | None]:
    """The family of each ``--kernel``: ``--family`` given once per ``--kernel`` (in the same order), once for
    all of them, or not at all (None: each kernel's own declaration). `check` and `init` take both options
    repeated; a ``check`` that kept the last ``--kernel`` alone ran one of two kernels without a word."""
    if len(families) == len(kernels):
        return list(families)
    if len(families) <= 1:
        return [families[0] if families else None] * len(kernels)
    raise InvalidArgument(f"--family is given {len(families)} times for {len(kernels)} --kernel; give one --family "
                          "per --kernel, in the same order (or one for all of them)")


def _check_targets(args) -> list[tuple[str, str | None]]:
    """(target, family) of each kernel to check: every ``--kernel`` (with its ``--family``), else the table's
    (``--family`` given once overrides theirs)."""
    from harness.project import kernel_target

    if args.kernel:
        return list(zip(args.kernel, _kernel_families(args.kernel, args.family)))
    if len(args.family) > 1:
        raise InvalidArgument(f"--family is given {len(args.family)} times without --kernel; give it once (for every "
                              "kernel of the table) or once per --kernel")
    project = _project(args)
    if not project.kernels:
        where = project.pyproject or project.root / "pyproject.toml"
        raise InvalidArgument(f"--kernel is not given and {where} lists no [[tool.harness.kernels]]; pass --kernel "
                              "TARGET --family FAMILY, or add the kernels to the table (`harness init --kernel "
                              "TARGET --family FAMILY` writes it)")
    override = args.family[0] if args.family else None
    return [(kernel_target(k, project), override or k.family) for k in project.kernels]


def _checked_spec(args, target: str, family: str | None):
    """The spec of one kernel `check` runs (`harness.api.user_kernel_spec`); the error of a kernel that came
    from the ``[[tool.harness.kernels]]`` table names the pyproject.toml it came from: "a plain callable
    needs --family" read as a missing option where there was no --family to give."""
    from harness.api import user_kernel_spec

    try:
        return user_kernel_spec(target, family=family)
    except InvalidArgument as exc:
        if args.kernel or args.family:  # the command line's, not the table's
            raise
        project = _project(args)
        raise InvalidArgument(f"{project.pyproject}: [[tool.harness.kernels]] target={target!r}: {exc} (fix the "
                              "entry: its target, or its family = \"...\")") from None


def _check_units(targets: list[tuple[str, str | None]], dtypes: tuple[str, ...] | None, device: str,
                 shard) -> list[tuple[str, str | None, tuple[str, ...] | None]]:
    """(target, family, dtypes) of each search to run: one per (kernel, dtype), every dtype the kernel
    runs on ``device`` (of ``dtypes`` if given), in the order of the table and the kernel's declared
    dtypes, each with the profile's examples (`harness.api.dtype_searches`).
    With ``--shard K/N`` this job takes every N-th unit from the K-th (`harness.shard.Shard.take`): the
    split depends on the arguments and the kernels' declarations only, so every job computes it alike,
    and the unsharded run (``--shard 1/1``) runs the same searches, one job, as the union of the N jobs'
    runs (`harness merge`)."""
    from harness.api import dtype_searches
    from harness.shard import Shard

    shard = shard or Shard(1, 1)
    units = [(target, family, each) for target, family in targets
             for each in dtype_searches(target, family=family, dtypes=dtypes, device=device)]
    return list(shard.take(units))


def cmd_check(args) -> int:
    from harness.api import check
    from harness.kernels.target import canonical_target  # targets named as the records name them, as typed or not
    from harness.shard import Shard, shard_header
    from harness.store import RunStore, environment

    targets = _check_targets(args)
    # named now: an in-process kernel that changes the working directory renamed its file's searches line
    shown = {target: canonical_target(target) for target, _ in targets}
    checked = []  # the kernels by name, in the header: how a shard's --kernel was typed does not matter to merge
    typed: dict[str, str] = {}  # each checked kernel -> the --kernel that named it first
    for target, family in targets:  # a bad target is a usage error before any directory is made
        spec = _checked_spec(args, target, family)
        label = f"{spec.name} ({spec.family.value})"
        if label in typed:  # its searches ran twice, unannounced, and the report counted each case twice
            raise InvalidArgument(f"--kernel={target!r} names {label}, which --kernel={typed[label]!r} names too; "
                                  "expected each kernel once")
        typed[label] = target
        checked.append(label)
        if spec.source == "user" and spec.capabilities.notes:  # e.g. what its signature left out
            print(f"{spec.name}: {spec.capabilities.notes}")
    shard = Shard.parse(args.shard) if args.shard else None
    units = _check_units(targets, args.dtypes, args.device, shard)
    project = _project(args)
    profile = args.profile or project.profile or "ci"
    cases_dir = _directory("--cases-dir" if args.cases_dir else "counterexamples ([tool.harness])",
                           Path(args.cases_dir) if args.cases_dir else Path(project.counterexamples_dir))
    run_dir = _run_dir(args, "check")
    if shard is not None and not units:
        print(f"shard {shard.label}: no (kernel, dtype) search falls to this job (there are fewer than "
              f"{shard.count}); its run holds no records", file=sys.stderr)
    results = []
    shrink = {} if args.shrink_deadline is None else {"shrink_deadline_s": args.shrink_deadline}
    try:
        header = dict(environment(profile), kernels=checked, policy=dataclasses.asdict(_policy(args)),
                      **shard_header(shard))
        with RunStore(run_dir, header=header) as store:
            for target, family, dtypes in units:
                results.append(check(target, family=family, profile=profile, dtypes=dtypes,
                                     device=args.device, max_length=args.max_length,
                                     max_examples=args.max_examples, policy=_policy(args),
                                     store=_Interruptible(store), counterexample_dir=cases_dir,
                                     grad=not args.no_grad, **shrink))
    except KeyboardInterrupt as exc:  # SIGINT or SIGTERM (_on_signal)
        return _finish_partial(run_dir, getattr(exc, "reason", "interrupted (SIGINT)"))
    status = _finish_run(run_dir, [r for result in results for r in result.records])
    skipped = sum(result.gradients_skipped for result in results)
    if skipped:
        from harness.gradients import GRADIENT_MAX_LENGTH

        print(f"\ngradients: not taken on {skipped} equivalent case(s) longer than L={GRADIENT_MAX_LENGTH} (the float64 "
              "autograd oracle keeps every step's state; their forward outputs were checked)")
    for (target, _, dtypes), result in zip(units, results):
        if result.gradients_not_differentiable and not any(r.get("mode") == "grad" for r in result.records):
            print(f"\ngradients: not checked for {shown[target]} ({', '.join(dtypes or ())}): its output carried no gradient "
                  f"in {result.gradients_not_differentiable} case(s) (detached, computed under no_grad, or without "
                  "autograd); a kernel meant for training must return an output autograd can differentiate")
    beyond = sum(result.gradients_out_of_domain for result in results  # a kernel shown differentiable
                 if any(r.get("mode") == "grad" for r in result.records))
    if beyond:
        print(f"\ngradients: not judged on {beyond} case(s) whose forward is out_of_domain (no digit of some outputs "
              "guaranteed in the dtype, or the inputs leave its range; see the findings)")
    for result in results:
        if result.message:
            print("\n" + result.message)
            if result.counterexample:
                print(f"\ncounterexample saved: {result.counterexample}")
        status = max(status, result.exit_code)
    if results:  # the searches' outcomes in one place, after the messages they may have printed
        print("\nsearches:")
        for (target, _, dtypes), result in zip(units, results):
            print(f"  {shown[target]} {','.join(dtypes or ())}: {search_outcome(result)}")
        from harness.api import untested_options_line

        untested = {shown[target]: untested_options_line(shown[target], result)
                    for (target, _, _), result in zip(units, results)}
        for line in filter(None, untested.values()):  # one line per kernel
            print(f"  {line}")
        _print_stale_counterexamples(units, results, shown, cases_dir)
    return status


def _print_stale_counterexamples(units, results, shown: dict[str, str], cases_dir: Path) -> None:
    """Under a check's searches, one line per kernel whose saved counterexamples no longer fail (its passing searches
    replayed them, `harness.cases.stale_counterexamples`), with the `harness prune` command that removes them."""
    from harness.cases import stale_counterexamples_line

    stale: dict[str, list[Path]] = {}
    for (target, _, _), result in zip(units, results):
        stale.setdefault(shown[target], []).extend(result.stale_counterexamples)
    for kernel, paths in stale.items():
        if paths:
            print(f"  {stale_counterexamples_line(kernel, paths, cases_dir)}")


def search_outcome(result) -> str:
    """One search's line under ``searches:``: its outcome, how many cases ran and how many of them (and of their
    gradients) were not judged. A half-precision chunk search that read "passed; 40 cases run" had 32 of them
    out_of_domain, and a wrong bfloat16 dg passed there unseen (blind hunt, session 23); a shrunk ``kernel_bug``
    says what its larger cases were named (the message's "Named on larger cases"); regimes no case drew are named."""
    import collections

    from harness.api import larger_cases_cause, larger_cases_slip, larger_cases_unnamed

    forward = [r for r in result.records if r.get("mode") != "grad"]
    grads = [r for r in result.records if r.get("mode") == "grad"]
    failure = result.failure
    outcome = "passed"
    if failure:
        grad = (" in the forward with inputs requiring grad" if failure.get("training_forward")
                else f" in the gradient of {failure.get('grad_of')}" if failure.get("mode") == "grad" else "")
        larger = larger_cases_cause(failure, result.records)
        slip = None if larger else larger_cases_slip(failure, result.records)
        named = (f" (named {larger} on larger cases)" if larger
                 else f" (larger cases: a kernel that {slip})" if slip
                 else " (larger cases: kernel_bug)" if larger_cases_unnamed(failure, result.records)
                 else f" (or a code path taken only for {failure.get('dtype')} inputs: see the why)"
                 if failure.get("half_path_suspect") else "")
        # a timeout is recorded once and not shrunk (its case is the one that hung): "at", not "shrunk to"
        found = "at" if failure.get("cause") == "timeout" else "shrunk to"
        outcome = f"{failure['verdict']}, {failure.get('cause')}{named}{grad}, {found} L={failure.get('length')}"
    line = f"{outcome}; {len(forward)} case{'' if len(forward) == 1 else 's'} run"
    unjudged = collections.Counter(r.get("cause") for r in forward if r.get("verdict") == "out_of_domain")
    if unjudged:
        causes = ", ".join(f"{cause} {n}" for cause, n in sorted(unjudged.items(), key=lambda kv: (-kv[1], str(kv[0]))))
        line += f", {sum(unjudged.values())} not judged (out_of_domain: {causes})"
    if grads:
        beyond = sum(1 for r in grads if r.get("verdict") == "out_of_domain")
        line += f"; {len(grads)} gradients" + (f", {beyond} not judged (out_of_domain)" if beyond else "")
    drawn = {r.get("regime") for r in forward}
    missed = [regime for regime in result.regimes if regime not in drawn]
    if forward and missed:
        line += f"; no case in regime {', '.join(missed)} (more --max-examples draws them)"
    from harness.api import assumed_chunk_note

    assumed = assumed_chunk_note(result.records)
    if assumed:
        line += f"; {assumed}"
    return line


def cmd_sweep(args) -> int:
    from harness.cases import load_sweep
    from harness.runner import RunOptions, run_cases, run_pair
    from harness.shard import Shard, shard_header
    from harness.store import RunStore, environment

    if args.list:
        return _list_sweeps(args)
    if not args.name:
        raise InvalidArgument("sweep needs a NAME (or a .toml file); `harness sweep --list` shows the sweeps")
    sweep = load_sweep(args.name, _project(args))
    run_dir = _run_dir(args, sweep.name)
    options = RunOptions(policy=_policy(args))
    shard = Shard.parse(args.shard) if args.shard else None
    header = dict(environment(f"sweep:{sweep.name}"), policy=dataclasses.asdict(options.policy),
                  sweep_digest=sweep.digest, **shard_header(shard))
    if sweep.answers:  # the sweep's question and its table, rendered by the report from the run alone
        header["answers"] = [table.to_dict() for table in sweep.answers]
    take = shard.take if shard is not None else iter
    try:
        with RunStore(run_dir, header=header) as store:
            records = run_cases(take(sweep.cases()), options, store=_Interruptible(store),
                                progress=None if args.quiet else _progress)
            if sweep.pairs:
                records += [run_pair(a, b, problem, options, store=_Interruptible(store))
                            for a, b, problem in take(sweep.pair_cases())]
    except KeyboardInterrupt as exc:  # SIGINT or SIGTERM (_on_signal)
        return _finish_partial(run_dir, getattr(exc, "reason", "interrupted (SIGINT)"))
    return _finish_run(run_dir, records)


def _list_sweeps(args) -> int:
    """One line per sweep: its name, where it comes from, its cases (runnable here / in its grids)."""
    from harness.cases import grid_size, load_sweep, sweep_files

    for found in sweep_files(_project(args)):
        try:
            sweep = load_sweep(str(found.path))
        except InvalidArgument as exc:  # one bad project sweep hid every sweep (blind hunt, session 23)
            print(f"{found.name:<14} {found.origin:<9} cannot be read: {exc}")
            continue
        here = sum(1 for _ in sweep.cases())
        pairs = f" + {sum(1 for _ in sweep.pair_cases())} pair cases ({len(sweep.pairs)} kernel pairs)" if sweep.pairs else ""
        print(f"{found.name:<14} {found.origin:<9} {here:>5} cases{pairs} runnable here, of {grid_size(sweep)} in "
              f"its grids  ({found.path})")
    return EXIT_OK


def _progress(rec: dict) -> None:
    print(f"  {rec['kernel']:<40} {rec['dtype']:<9} L={rec['length']:<6} {rec['regime']:<11} "
          f"{rec['verdict']}", file=sys.stderr)


def cmd_replay(args) -> int:
    from harness.cases import (case_kernel, chunk_mismatch, load_case, no_longer_fails, prune_command, replay,
                               resolve_kernel)
    from harness.runner import RunOptions

    grad_of = args.grad_of
    if args.file and args.problem:  # the file's problem ran and --problem was ignored (a blind hunt, session 27)
        raise InvalidArgument(f"replay got FILE {args.file!r} and --problem: give one (the file holds its problem)")
    if args.file:
        case = load_case(args.file)
        problem, expect = case.problem, case.expect
        grad_of = grad_of or case.grad_of
        if args.kernel and args.kernel != case.kernel_target:  # the user names the kernel: run that one
            spec = _replay_kernel(args.kernel, problem.family.value)
        else:
            spec = resolve_kernel(case.kernel, case.kernel_target, problem.family.value,
                                  trust=args.trust_case_file, kernel=args.kernel)
    else:
        if not (args.kernel and args.problem):
            raise InvalidArgument("replay needs FILE, or --kernel NAME with --problem JSON")
        try:
            data = json.loads(args.problem)
        except (json.JSONDecodeError, RecursionError) as exc:
            raise InvalidArgument(f"--problem={args.problem[:80]!r} is not JSON ({exc}); expected the problem "
                                  "object of a record's replay command") from None
        from harness.cases import problem_from_json

        problem, expect = problem_from_json(data, "--problem"), None
        spec = _replay_kernel(args.kernel, problem.family.value)
    note = chunk_mismatch(spec, problem)
    if note:
        print(note, file=sys.stderr)
    if args.against:
        if grad_of:
            raise InvalidArgument(f"--against={args.against!r} with --grad-of={grad_of!r}: a pair is compared on "
                                  "its forward outputs; expected one of them")
        return _replay_pair(spec, _replay_kernel(args.against, problem.family.value), problem, args)
    record = replay(spec, problem, grad_of, RunOptions(policy=_policy(args)))
    _print_fields(record, ("kernel", "grad_of", "family", "dtype", "length", "regime", "verdict", "cause", "why",
                           "cond_max", "max_abs", "max_rel", "ulp_max", "onset_t", "domain_onset_t", "nonfinite_class",
                           "outcome", "error", "note"))
    if record["verdict"] in FAILING_VERDICTS:  # what `check` printed of this case, not only its fields
        from harness.api import call_context, failure_message

        print("\n" + failure_message(record, _policy(args), replay=record.get("replay"),
                                     context=call_context(record, problem)))
    if args.file and spec.name == case.kernel and grad_of == case.grad_of and no_longer_fails(case, record):
        print(f"\nThis counterexample no longer fails: delete {args.file}, or run "
              f"`{prune_command(case_kernel(case), Path(args.file).parent)}` to remove every saved case of "
              "the kernel that passes now")
    if expect is not None and record["verdict"] != expect:
        print(f"\nexpected verdict {expect!r}, got {record['verdict']!r}")
        return EXIT_FAIL
    return EXIT_FAIL if record["verdict"] in FAILING_VERDICTS and expect is None else EXIT_OK


#: The fields `harness replay --against` prints of a pair's record (`harness.runner.run_pair`).
PAIR_FIELDS: tuple[str, ...] = ("kernel", "family", "dtype", "length", "regime", "eps", "chunk_size", "verdict",
                                "a_verdict", "a_cause", "a_cond_max", "a_max_abs", "b_verdict", "b_cause", "b_cond_max",
                                "b_max_abs", "ab_max_abs", "ab_max_rel")


def _replay_pair(spec_a, spec_b, problem, args) -> int:
    """A differential sweep's pair row replayed: both kernels on the case's inputs, each against the oracle, and
    their difference (what the row's ``ab_max_abs`` says); the exit status is the worse of the two verdicts."""
    from harness.runner import RunOptions, run_pair

    record = run_pair(spec_a, spec_b, problem, RunOptions(policy=_policy(args)))
    _print_fields(record, (*PAIR_FIELDS, "why"))
    return EXIT_FAIL if record["verdict"] in FAILING_VERDICTS else EXIT_OK


def _print_fields(record: dict, keys: tuple[str, ...]) -> None:
    """A replayed record's ``keys`` it holds, one ``name: value`` line each."""
    for key in keys:
        if record.get(key) is not None:
            print(f"{key:>16}: {record[key]}")


def _replay_kernel(kernel: str, family: str):
    """``--kernel``: a registered name, or a ``module:attr`` / ``file.py:attr`` target the user gave."""
    from harness.cases import resolve_kernel

    if ":" in kernel:
        return resolve_kernel(kernel, kernel, family, kernel=kernel)
    return resolve_kernel(kernel)


def cmd_report(args) -> int:
    from harness.report import build_report, refuse_foreign_files, summary_markdown, terminal_text
    from harness.store import load_header, load_records

    records = load_records(args.run_dir)
    if not records:
        raise InvalidArgument(f"run_dir={args.run_dir!r} holds no records (records*.jsonl)")
    if args.out is not None:
        refuse_foreign_files("--out", args.out)
    paths = build_report(args.run_dir, args.out)
    print(terminal_text(summary_markdown(records, load_header(args.run_dir))))
    print(f"\nreport: {getattr(paths, 'index', paths)}")
    return EXIT_OK


def cmd_merge(args) -> int:
    from harness.shard import merge_runs

    out = _directory("--out", Path(args.out))
    if out.exists() and any(out.iterdir()):
        raise InvalidArgument(f"--out={str(out)!r} exists and is not empty; expected a new run directory")
    records = merge_runs(args.run_dirs, out, allow_missing=args.allow_missing)
    return _finish_run(out, records)


def cmd_diff(args) -> int:
    from harness.gate import diff_markdown, diff_runs, partial_warnings
    from harness.report import terminal_text
    from harness.store import load_header, load_records

    for name in ("base", "new"):
        path = Path(getattr(args, name))
        if not path.is_dir():
            raise InvalidArgument(f"{name}={str(path)!r} is not a directory; expected a run directory "
                                  "(with records.jsonl)")
        if not load_records(path):
            raise InvalidArgument(f"{name}={str(path)!r} holds no records (records*.jsonl); expected a run directory")
    warnings = partial_warnings(load_header(args.base), load_header(args.new)).values()
    print(terminal_text(diff_markdown(diff_runs(load_records(args.base), load_records(args.new)),
                                      warnings=list(warnings))))
    return EXIT_OK


def cmd_gate(args) -> int:
    from harness.gate import gate
    from harness.report import append_step_summary, terminal_text

    baseline = args.baseline or _project(args).baseline_dir
    # failing on a run that checked less than the baseline is the default: --fail-on-missing only says so (and
    # given with --allow-missing, is refused as a usage error by `gate`)
    result = gate(baseline, args.run_dir, fail_on=args.fail_on, allow_missing=args.allow_missing,
                  fail_on_missing=args.fail_on_missing or None, allow_mismatch=args.allow_mismatch)
    summary = result.summary_markdown()
    append_step_summary(summary)
    print(terminal_text(summary))
    return EXIT_OK if result.passed else EXIT_FAIL


def cmd_init(args) -> int:
    from harness.project import KernelEntry, find_root
    from harness.scaffold import init_project, installed_requirement

    kernels = [KernelEntry(t, f) for t, f in zip(args.kernel, _kernel_families(args.kernel, args.family))]
    root = find_root()
    requirement = installed_requirement(root, args.requirement) if not args.no_workflow else None
    result = init_project(root, kernels, force=args.force, workflow=not args.no_workflow,
                          harness_requirement=requirement.text if requirement else None)
    for path in result.written:
        print(f"wrote {path}")
    for note in result.notes:
        print(note)
    if requirement is not None:
        print(f"the workflow installs the harness as HARNESS={requirement.text!r} ({requirement.source})")
        if requirement.warning:
            print(f"harness: warning: {requirement.warning}", file=sys.stderr)
    return EXIT_OK


def cmd_prune(args) -> int:
    """Replay the saved counterexamples (of ``--kernel``) and delete those that no longer fail; say what stays."""
    from harness.cases import prune_counterexamples
    from harness.runner import RunOptions

    project = _project(args)
    directory = _directory("--cases-dir" if args.cases_dir else "counterexamples ([tool.harness])",
                           Path(args.cases_dir) if args.cases_dir else Path(project.counterexamples_dir))
    report = prune_counterexamples(directory, kernel=args.kernel, trust=args.trust_case_file, dry_run=args.dry_run,
                                   options=RunOptions(policy=_policy(args)))
    whose = f" of kernel {args.kernel}" if args.kernel else ""
    if not report.looked_at:
        print(f"no saved counterexample{whose} in {directory}")
        return EXIT_OK
    removed = "to remove (--dry-run: none deleted)" if args.dry_run else "removed"
    sections = ((f"{removed}: no longer fail (equivalent on replay)", [(p, "") for p in report.removed]),
                ("still failing (kept)", report.failing),
                ("kept on purpose", report.kept),
                ("not replayed (kept)", report.skipped))
    for title, entries in sections:
        if entries:
            print(f"{title}:")
            for path, why in entries:
                print(f"  {path}{f': {why}' if why else ''}")
    print(f"{len(report.removed)} {removed}, {len(report.failing)} still failing, {len(report.kept)} kept on purpose, "
          f"{len(report.skipped)} not replayed, of {report.looked_at} saved counterexample"
          f"{'' if report.looked_at == 1 else 's'}{whose} in {directory}")
    return EXIT_OK


def cmd_baseline(args) -> int:
    from harness.gate import update_baseline

    baseline = args.baseline or _project(args).baseline_dir
    update_baseline(args.run_dir, baseline, allow_partial=args.allow_partial)
    print(f"baseline updated: {baseline} <- {args.run_dir}")
    return EXIT_OK


# --------------------------------------------------------------------------------------------- parser
#: `replay` and `prune` alike: a case file is data, and names code to import only when the user says so.
_TRUST_CASE_FILE_HELP = ("import the module or file a case file's kernel_target names (never done otherwise: a case file "
                         "is data); --kernel TARGET runs a user kernel's cases without it")


def build_parser() -> argparse.ArgumentParser:
    from harness.options import add_report_options

    p = argparse.ArgumentParser(prog="harness", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("list", help="every kernel the harness knows, with capabilities and availability here")
    s.add_argument("--family", default=None)
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_list)

    s = sub.add_parser("check", help="drive one kernel (registered name or module:attr / file.py:attr)")
    from harness.kernels.names import Family

    s.add_argument("--family", action="append", default=[], help=" | ".join(f.value for f in Family)
                   + " (repeat it once per --kernel, or give it once for all)")
    s.add_argument("--kernel", action="append", default=[], metavar="TARGET",
                   help="package.module:attr, path/to/file.py:attr or a registered name; repeat for several "
                   "(default: every [[tool.harness.kernels]] of the project's pyproject.toml)")
    s.add_argument("--profile", choices=("dev", "ci", "nightly"), default=None,
                   help="default: the table's profile, else ci")
    s.add_argument("--dtypes", default=None, type=_dtype_list,
                   help="comma-separated subset of float64,float32,float16,bfloat16")
    s.add_argument("--device", default="cpu")
    s.add_argument("--max-length", type=_positive_int("--max-length"), default=None)
    s.add_argument("--max-examples", type=_positive_int("--max-examples"), default=None)
    s.add_argument("--cases-dir", default=None, help="where the shrunk counterexample is saved (default: the "
                   "project's counterexamples folder)")
    s.add_argument("--shrink-deadline", type=_shrink_deadline, default=None, metavar="SECONDS",
                   help="stop shrinking a failure this long after it was found and report the smallest case so far "
                        "(default 120; 0 reports the first failing case)")
    s.add_argument("--no-grad", action="store_true",
                   help="skip the gradient check (by default every differentiable kernel's gradients are checked)")
    s.add_argument("--shard", default=None, metavar="K/N",
                   help="run job K of N: one search per (kernel, dtype), every N-th from the K-th (merge the runs "
                        "with `merge`)")
    s.set_defaults(func=cmd_check)

    s = sub.add_parser("sweep", help="run a named sweep (the project's, else a built-in one) or a .toml file")
    s.add_argument("name", nargs="?")
    s.add_argument("--list", action="store_true", help="list the sweeps, one line each (where from, cases)")
    s.add_argument("--quiet", action="store_true")
    s.add_argument("--shard", default=None, metavar="K/N",
                   help="run job K of N: every N-th case of the sweep from the K-th (merge the runs with `merge`)")
    s.set_defaults(func=cmd_sweep)

    s = sub.add_parser("replay", help="re-run a saved case (cases/counterexamples/*.json) or a replay command")
    s.add_argument("file", nargs="?")
    s.add_argument("--kernel", default=None)
    s.add_argument("--problem", default=None, help="the problem as JSON (from a record's replay command)")
    s.add_argument("--grad-of", default=None, metavar="INPUT",
                   help="take the gradient of INPUT instead of the forward output (a gradient's case file says so itself)")
    s.add_argument("--against", default=None, metavar="KERNEL",
                   help="replay a differential sweep's pair: both kernels on the case, each against the oracle, "
                        "and their difference (ab_max_abs); a pair row's replay command says it")
    s.add_argument("--trust-case-file", action="store_true", help=_TRUST_CASE_FILE_HELP)
    s.set_defaults(func=cmd_replay)

    s = sub.add_parser("report", help="build tables and plots for a run directory")
    s.add_argument("run_dir")
    s.add_argument("--out", default=None)
    s.set_defaults(func=cmd_report)

    s = sub.add_parser("merge", help="join the runs of a sharded sweep or check (--shard K/N) into one run and report it")
    s.add_argument("run_dirs", nargs="+", metavar="RUN")
    s.add_argument("--out", required=True, help="the merged run directory (must not exist)")
    s.add_argument("--allow-missing", action="store_true",
                   help="merge although some shards are missing or partial (interrupted); the merged run is marked "
                        "partial")
    s.set_defaults(func=cmd_merge)

    s = sub.add_parser("diff", help="compare two runs cell by cell, worst first")
    s.add_argument("base")
    s.add_argument("new")
    s.set_defaults(func=cmd_diff)

    s = sub.add_parser("gate", help="fail when a run is worse than the baseline, or checked less than it")
    s.add_argument("run_dir")
    s.add_argument("--baseline", default=None, help="default: the project's baseline folder")
    s.add_argument("--allow-mismatch", "--force", action="store_true", dest="allow_mismatch",
                   help="compare although the two runs' headers say the comparison is meaningless (another "
                        "device family, a record schema this version cannot read)")
    s.set_defaults(func=cmd_gate)

    s = sub.add_parser("update-baseline", help="make a run the new baseline (the project's baseline folder)")
    s.add_argument("run_dir")
    s.add_argument("--baseline", default=None, help="default: the project's baseline folder")
    s.add_argument("--allow-partial", action="store_true",
                   help="make an interrupted (partial) run the baseline although its missing cases go ungated")
    s.set_defaults(func=cmd_baseline)

    s = sub.add_parser("init", help="write the [tool.harness] table into ./pyproject.toml and the CI workflow")
    s.add_argument("--kernel", action="append", default=[], metavar="TARGET",
                   help="a kernel to check (file.py:attr relative to the project, module:attr or a registered "
                        "name); repeat for several")
    s.add_argument("--family", action="append", default=[], help="the family of each --kernel, in order")
    s.add_argument("--force", action="store_true", help="replace an existing [tool.harness] table and workflow")
    s.add_argument("--no-workflow", action="store_true", help="write the table only")
    s.add_argument("--requirement", default=None,
                   help="how the workflow installs the harness (default: as it is installed here: a git URL at its "
                        "commit, a wheel or folder inside the project by its path, else this version from a package "
                        "index), e.g. "
                        "'seqkernel-harness @ git+https://github.com/OWNER/seqkernel-harness@v0.1.0'")
    s.set_defaults(func=cmd_init)

    s = sub.add_parser("prune", help="replay the saved counterexamples and delete those that no longer fail")
    s.add_argument("--kernel", default=None, metavar="TARGET",
                   help="only this kernel's cases (a registered name, module:attr or file.py:attr); a user kernel's "
                        "cases are run with it, as `replay --kernel` runs them")
    s.add_argument("--trust-case-file", action="store_true", help=_TRUST_CASE_FILE_HELP)
    s.add_argument("--cases-dir", default=None, help="the counterexamples folder (default: the project's)")
    s.add_argument("--dry-run", action="store_true", help="list what would be removed; delete nothing")
    add_report_options(s, cli=True, command="replay")  # prune replays: replay's --policy, --timeout, --in-process
    s.set_defaults(func=cmd_prune)

    for name in ("check", "sweep", "replay", "gate"):
        add_report_options(sub.choices[name], cli=True, command=name)
    for name in ("check", "sweep"):
        sub.choices[name].add_argument("--append", action="store_true",
                                       help="add this run's records to a --report-dir that already holds a run")
    return p


#: Commands that run kernels (in worker processes unless --in-process).
_RUNS_KERNELS = ("check", "sweep", "replay", "prune")


def _usage_errors_first(args) -> None:
    """The usage errors found without torch: a ``--family`` that is not a family, a ``--kernel`` file or a
    case file that is not there. Answered in a tenth of a second, before the 2-4 s of torch's import
    (in this process and in the workers' server that `main` starts beside it)."""
    from harness.kernels.names import Family
    from harness.kernels.target import check_target_file

    for dest, flag in _OUTPUT_OPTIONS.items():  # "" was read as "not given": a run wrote into ./.harness instead
        if getattr(args, dest, None) is not None and not str(getattr(args, dest)).strip():
            raise InvalidArgument(f"{flag}={getattr(args, dest)!r} is empty; expected a path (or leave {flag} out "
                                  "for the default)")
    family = getattr(args, "family", None)
    for name in family if isinstance(family, list) else [family] if family else []:  # check, init: one per kernel
        Family.parse(name)
    if args.command == "check":  # (init writes a table naming files that may come later)
        for target in args.kernel:
            check_target_file(target)
    if args.command == "replay" and args.file and not Path(args.file).exists() and not args.problem:
        raise InvalidArgument(f"case file {args.file!r} does not exist; expected a saved case (a .json file)")


#: The options that name where a command writes, by their argparse ``dest``.
_OUTPUT_OPTIONS = {"report_dir": "--report-dir", "out": "--out", "baseline": "--baseline", "cases_dir": "--cases-dir"}


def _os_error_message(args, exc: OSError) -> str:
    """An `OSError` as a usage error's message: the option that named the path (when one did), the path, and
    the system's reason. A traceback exits 1, the status of a divergent run, so a read-only ``--report-dir``
    read as "found divergences" to a CI step that tolerates exit 1."""
    path = exc.filename
    reason = exc.strerror or str(exc)
    if path is None:
        return f"{reason} ({type(exc).__name__}); expected room to write the command's outputs"
    given = os.path.abspath(path)
    for dest, flag in _OUTPUT_OPTIONS.items():
        value = getattr(args, dest, None)
        if isinstance(value, str) and value and (given == os.path.abspath(value)
                                                 or given.startswith(os.path.abspath(value).rstrip(os.sep) + os.sep)):
            return (f"{flag}={value!r}: cannot write {str(path)!r} ({reason}); expected a directory that can be "
                    "created and written")
    return (f"{str(path)!r}: {reason} ({type(exc).__name__}); expected a path that can be read, created and written "
            "(the project's default folders are set in [tool.harness], or by --report-dir, --out, --baseline, "
            "--cases-dir)")


def _joined_negative_values(argv: list[str]) -> list[str]:
    """``argv`` with ``--shard -1/2`` written ``--shard=-1/2``: argparse reads a value that starts with ``-`` as an
    option (and says "expected one argument"); joined, the value reaches its own check and its message."""
    out: list[str] = []
    for arg in argv:
        if out and out[-1] == "--shard" and arg.startswith("-") and arg[1:2].isdigit():
            out[-1] = f"--shard={arg}"
        else:
            out.append(arg)
    return out


def _catch_stops() -> dict:
    """Route SIGINT and SIGTERM to `_on_signal` (a stop request) and return the handlers they had.

    Called as soon as the command is known: installed after start-up (torch's import, the workers' server),
    a SIGTERM there ended the process with 143 and no word instead of the documented 130 (verification 23)."""
    from harness.kernels.isolation import clear_stop

    clear_stop()
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    for sig, handler in previous.items():
        if handler is not signal.SIG_IGN:  # a shell's background job ignores SIGINT: leave it so
            signal.signal(sig, _on_signal)
    return previous


def main(argv: Sequence[str] | None = None) -> int:
    from harness.kernels.isolation import prestart, raise_if_stopped

    previous: dict = {}
    args = None
    try:
        parser = build_parser()
        args = parser.parse_args(_joined_negative_values(sys.argv[1:] if argv is None else list(argv)))
        if args.command in ("check", "sweep"):  # a run: a signal stops it at the next record or kernel wait
            previous = _catch_stops()
        _usage_errors_first(args)
        if args.command in _RUNS_KERNELS and not (getattr(args, "in_process", False) or getattr(args, "list", False)):
            prestart()  # first of all: the workers' server imports torch beside this process, not after it
        from harness.kernels.triton_interpreter import interpret_if_no_gpu

        interpret_if_no_gpu()  # Triton kernels on a CPU-only machine run interpreted; set before triton loads
        _apply_isolation(args)
        if args.command in _RUNS_KERNELS:
            from harness.threads import fit_threads  # imports torch: after the usage errors and the workers' server

            fit_threads()  # this process's share of the cores, now that the isolation mode is known
        raise_if_stopped()  # stopped during start-up: exit 130 now, before any run directory is made
        return args.func(args)
    except InvalidArgument as exc:
        print(f"harness: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except HarnessError as exc:
        print(f"harness: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt as exc:  # outside a run (a run writes its partial report itself)
        print(f"\nharness: {getattr(exc, 'reason', 'interrupted (SIGINT)')}", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # stdout's reader went away: `entry` ends quietly
        raise
    except OSError as exc:  # an output that cannot be written (read-only, a file in the way, disk full)
        print(f"harness: error: {_os_error_message(args, exc)}", file=sys.stderr)
        return EXIT_USAGE
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _stdout_gone() -> int:
    """Stdout's reader went away (``harness list | head -1``): point stdout at /dev/null, so that nothing
    flushed after this raises again, and return `EXIT_BROKEN_PIPE`, the status a shell gives a command that
    SIGPIPE ended (Python ignores SIGPIPE, so a print raises instead; the Python docs' recipe, without the
    traceback the blind hunt saw)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return EXIT_BROKEN_PIPE


def entry() -> None:
    """The ``harness`` command: `main`, then an exit with its status that nothing a kernel's module left in this
    process can hold up or overrule. A module imported here (to read a kernel's signature) may register an
    exit hook (a blind hunt's ``atexit.register(lambda: os._exit(0))`` turned a failing check's status 1 into
    0: a green CI for a kernel that returns zeros) or start a non-daemon thread (the run ended and the process
    never exited). So the streams are flushed, the workers let go (`isolation.shutdown`) and multiprocessing's
    own exit handler run, as at a normal exit, and the process ends with ``os._exit``: no other exit hook, no
    thread joined."""
    import multiprocessing.util

    try:
        code = main()
        sys.stdout.flush()  # here, so that a reader gone since the last print is seen now, not at exit
    except BrokenPipeError:
        code = _stdout_gone()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001 - a stream a kernel's module closed: nothing left to flush
            pass
    from harness.kernels import isolation

    isolation.shutdown()
    multiprocessing.util._exit_function()  # its finalizers (shared memory, semaphores) and its children
    os._exit(code)


if __name__ == "__main__":
    entry()
