"""The harness's pytest plugin: records taken during a session, a report and a gate at its end.

Registered under the ``pytest11`` entry point ``seqkernel_harness``, so it is active wherever the package
is installed. It adds the options of `harness.options` (``--harness-report-dir``, ``--harness-baseline``,
``--harness-fail-on``, ``--harness-allow-missing``, ``--harness-policy``, ``--harness-no-summary``,
``--harness-timeout``, ``--harness-in-process``) and
two session-scoped fixtures and a check:

- ``harness_check``: ``harness_check(kernel, family=..., **options)`` runs `harness.api.check` (the same
  engine as `harness check`: property search, shrinking, gradients) on a kernel of the user's own test
  suite, records every case into the session's run, saves the shrunk counterexample in the project's
  counterexamples folder (`harness.project`), and fails the test with the shrunk case's message
  (`harness.errors.DivergenceError`); it returns the `harness.api.CheckResult` when the kernel passes;
- ``harness_recorder``: ``.record(rec)`` (alias ``.append``, so it can be passed as a runner's
  ``store=``) appends one record to the run (`harness.store.RunStore`);
- ``harness_policy``: the verdict `harness.verdict.Policy` (``Policy.parse(--harness-policy)``, else the
  default).

Where records go. The controller (the process without ``config.workerinput``) picks the run directory in
``pytest_configure``: ``--harness-report-dir`` (the records of an earlier session there are removed), or
a temporary directory, removed at the end, when no report was asked for. It writes ``records.jsonl``;
under pytest-xdist each worker writes ``records-<workerid>.jsonl`` into the same directory, which the
controller hands to the workers through ``node.workerinput`` in ``pytest_configure_node`` (registered
only when xdist is present, as pytest-cov does). `harness.store.load_records` merges the files.

At the end, on the controller only (as junitxml and pytest-cov do): when records were taken, the header
(run.json) is written, the report (`harness.report.build_report`, with plots) is built in the report
directory, the gate (`harness.gate.gate`) runs against ``--harness-baseline``, and a failing gate makes
the session fail (exit status 1). ``pytest_terminal_summary`` prints the summary table, the report's path
and the gate's failures; the summary (and the gate's outcome) is appended to ``$GITHUB_STEP_SUMMARY``
when that variable is set. When no record was taken, nothing is written.

State lives in ``config.stash``; heavy modules (pandas, matplotlib, torch) are imported inside hooks.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from harness.options import PYTEST_PREFIX, ReportOptions, add_report_options

#: The key under which the run directory travels to xdist workers (``node.workerinput``).
WORKERINPUT_RUN_DIR = "seqkernel_harness_run_dir"


class Recorder:
    """Appends records to this process's file of the run (opened on the first record)."""

    def __init__(self, run_dir: Path | None, worker: str | None = None):
        self.run_dir = run_dir
        self.worker = worker
        self.count = 0
        self._store: Any = None
        self._lock = threading.Lock()

    def record(self, rec: dict[str, Any]) -> None:
        """Append one record (a flat dict, as `harness.runner.run_case` returns) to the run."""
        if self.run_dir is None:
            raise RuntimeError("harness_recorder has no run directory (the plugin was not configured)")
        with self._lock:
            if self._store is None:
                from harness.store import RunStore

                self._store = RunStore(self.run_dir, worker=self.worker)
            self._store.append(rec)
            self.count += 1

    append = record  # so that the recorder can stand in for a RunStore (``store=harness_recorder``)

    def close(self) -> None:
        with self._lock:
            if self._store is not None:
                self._store.close()
                self._store = None


@dataclass
class _State:
    options: ReportOptions
    run_dir: Path | None = None
    report_dir: Path | None = None
    worker: str | None = None
    temporary: bool = False
    started: str | None = None
    recorder: Recorder | None = None
    records: list[dict[str, Any]] = field(default_factory=list)
    report_index: Path | None = None
    report_error: str | None = None
    gate_result: Any = None
    gate_error: str | None = None
    policy: Any = None

    @property
    def is_worker(self) -> bool:
        return self.worker is not None


STATE_KEY = pytest.StashKey[_State]()


def _is_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


def _split_cores_between_workers() -> None:
    """Each xdist worker computes on its share of the cores (`harness.threads`), its kernel workers too: with
    torch's default (every core) in each, ``-n 2`` on 2 cores ran 4 threads whose parallel regions waited on
    descheduled siblings; `make test` took 74 s idle and 143 s with one core busy."""
    from harness.threads import fit_threads

    fit_threads(runs=int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))


# ------------------------------------------------------------------------------------------- options
def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("seqkernel-harness", "numerical-equivalence harness: records, report and gate")
    add_report_options(group.addoption, prefix=PYTEST_PREFIX)


# -------------------------------------------------------------------------------------------- set-up
class _XdistHooks:
    """Registered on the controller only when pytest-xdist is loaded."""

    def __init__(self, run_dir: Path):
        self.run_dir = run_dir

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node: Any) -> None:
        node.workerinput[WORKERINPUT_RUN_DIR] = str(self.run_dir)


def pytest_configure(config: pytest.Config) -> None:
    options = ReportOptions.from_pytest(config)
    state = _State(options=options)
    config.stash[STATE_KEY] = state
    if options.timeout is not None or options.in_process:  # on xdist workers too: they run the kernels
        from harness.kernels.isolation import configure

        configure(timeout_s=options.timeout if options.timeout is not None else ...,
                  isolation="in-process" if options.in_process else None)

    if _is_worker(config):
        _split_cores_between_workers()
        workerinput = config.workerinput  # type: ignore[attr-defined]
        run_dir = workerinput.get(WORKERINPUT_RUN_DIR)
        state.worker = str(workerinput.get("workerid", "gw"))
        state.run_dir = Path(run_dir) if run_dir else None
        state.recorder = Recorder(state.run_dir, state.worker)
        return

    # Specs are parsed at the boundary: a typo is a usage error now, not a traceback after the run.
    from harness.errors import InvalidArgument

    if options.fail_on:
        from harness.gate import parse_fail_on

        try:
            parse_fail_on(options.fail_on)
        except InvalidArgument as exc:
            raise pytest.UsageError(f"--harness-fail-on: {exc}") from None
    if options.policy:
        from harness.verdict import Policy

        try:
            state.policy = Policy.parse(options.policy)
        except InvalidArgument as exc:
            raise pytest.UsageError(f"--harness-policy: {exc}") from None

    import datetime as _dt

    state.started = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    if options.report_dir:
        report_dir = Path(options.report_dir)
        if not report_dir.is_absolute():
            report_dir = Path(config.invocation_params.dir) / report_dir
        from harness.report import refuse_foreign_files

        try:
            refuse_foreign_files("--harness-report-dir", report_dir)
        except InvalidArgument as exc:
            raise pytest.UsageError(str(exc)) from None
        state.report_dir = state.run_dir = report_dir
        _clear_previous_run(report_dir)
    else:
        state.run_dir = Path(tempfile.mkdtemp(prefix="harness-run-"))
        state.temporary = True
    state.recorder = Recorder(state.run_dir)
    if config.pluginmanager.hasplugin("xdist"):
        config.pluginmanager.register(_XdistHooks(state.run_dir), "seqkernel-harness-xdist")


def _clear_previous_run(run_dir: Path) -> None:
    """Remove an earlier session's records and report from ``run_dir`` (only the files the harness writes)."""
    if not run_dir.is_dir():
        return
    from harness.store import HEADER_FILE, RECORDS_GLOB

    for p in run_dir.glob(RECORDS_GLOB):
        p.unlink(missing_ok=True)
    (run_dir / HEADER_FILE).unlink(missing_ok=True)
    from harness.report import clear_report

    clear_report(run_dir)


def pytest_report_header(config: pytest.Config) -> list[str]:
    from harness import __version__

    state = config.stash.get(STATE_KEY, None)
    if state is None or state.is_worker:
        return []
    where = str(state.report_dir) if state.report_dir else "none (--harness-report-dir DIR writes one)"
    line = f"seqkernel-harness {__version__}: report dir {where}"
    if state.options.baseline:
        line += f", baseline {state.options.baseline} (fail on {state.options.fail_on or 'default'})"
    from harness.settings import active_profile, limits

    profile = active_profile()
    lim = limits(profile)
    return [line, f"seqkernel-harness hypothesis profile {profile!r}: up to {lim.max_examples} examples per "
                  f"kernel, lengths up to {lim.max_length} ({lim.slow_max_examples} and {lim.slow_max_length} "
                  "for interpreted kernels)"]


# ------------------------------------------------------------------------------------------ fixtures
@pytest.fixture(scope="session")
def harness_recorder(pytestconfig: pytest.Config) -> Recorder:
    """Appends records to this session's run (merged across xdist workers in the report)."""
    state = pytestconfig.stash[STATE_KEY]
    assert state.recorder is not None
    return state.recorder


@pytest.fixture(scope="session")
def harness_policy(pytestconfig: pytest.Config) -> Any:
    """The verdict policy: ``Policy.parse(--harness-policy)`` when given, else ``Policy()``."""
    state = pytestconfig.stash[STATE_KEY]
    if state.policy is None:
        from harness.verdict import Policy

        spec = state.options.policy
        state.policy = Policy.parse(spec) if spec else Policy()
    return state.policy


@pytest.fixture
def harness_check(harness_recorder: Recorder, harness_policy: Any) -> Any:
    """Check a kernel inside a test: ``harness_check("my_pkg.scan:fn", family="linear_scan")``.

    Keyword options are those of `harness.api.check` (``profile``, ``dtypes``, ``max_length``,
    ``max_examples``, ``grad``...); ``policy`` defaults to the session's (``--harness-policy``) and
    ``counterexample_dir`` to the project's. One search per dtype, as `harness check` runs them
    (`harness.api.check_each_dtype`): the same cases, so either one's run gates against the other's baseline
    (one search over four dtypes gave float16 one case of 25, and 9 of 127 cells in common with the check's,
    a blind hunt, session 24). A failing kernel fails the test with the shrunk case of each failing dtype.
    """

    def run(kernel: Any, *, family: Any = None, **options: Any) -> Any:
        __tracebackhide__ = True
        from harness.api import check_each_dtype
        from harness.errors import DivergenceError
        from harness.project import current

        options.setdefault("policy", harness_policy)
        options.setdefault("counterexample_dir", current().counterexamples_dir)
        result = check_each_dtype(kernel, family=family, store=harness_recorder, **options)
        if not result.passed:
            saved = f"\n\ncounterexample saved: {result.counterexample}" if result.counterexample else ""
            raise DivergenceError(f"{result.message}{saved}")
        return result

    return run


# ------------------------------------------------------------------------------------------- the end
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    config = session.config
    state = config.stash.get(STATE_KEY, None)
    if state is None:
        return
    if state.recorder is not None:
        state.recorder.close()
    if state.is_worker or state.run_dir is None:
        return

    from harness.store import load_records

    state.records = load_records(state.run_dir) if state.run_dir.is_dir() else []
    if not state.records:
        return
    _write_header(config, state)
    if state.report_dir is not None:
        try:
            from harness.report import build_report

            state.report_index = build_report(state.run_dir, state.report_dir).index
        except Exception as exc:  # noqa: BLE001 - a broken report must not hide the test results
            state.report_error = f"{type(exc).__name__}: {exc}"
    if state.options.baseline:
        try:
            from harness.gate import gate

            state.gate_result = gate(state.options.baseline, state.run_dir, fail_on=state.options.fail_on,
                                     allow_missing=state.options.allow_missing,
                                     fail_on_missing=state.options.fail_on_missing or None)
        except Exception as exc:  # noqa: BLE001 - e.g. a missing baseline: said plainly, and the session fails
            state.gate_error = f"{type(exc).__name__}: {exc}"
    gate_failed = state.gate_error is not None or (state.gate_result is not None and not state.gate_result.passed)
    if (gate_failed or state.report_error) and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    _append_step_summary(state)


def _write_header(config: pytest.Config, state: _State) -> None:
    import json

    from harness.settings import active_profile
    from harness.store import HEADER_FILE, environment

    # the profile the fixture's searches ran under (`harness.api.check`: hypothesis's "default" profile is
    # not one of ours, and the searches then run at ci; the header said "pytest:default", session 24)
    command = "pytest " + " ".join(str(a) for a in config.invocation_params.args)
    header = environment(profile=f"pytest:{active_profile()}", command=command)
    header["started"] = state.started
    run_dir = state.run_dir
    assert run_dir is not None
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / HEADER_FILE).write_text(json.dumps(header, indent=2, sort_keys=True, default=str) + "\n")


def _append_step_summary(state: _State) -> None:
    if not os.environ.get("GITHUB_STEP_SUMMARY"):
        return
    from harness.report import append_step_summary, summary_markdown

    parts = ["### seqkernel-harness (pytest)", "", summary_markdown(state.records)]
    if state.gate_result is not None:
        parts += ["", state.gate_result.summary_markdown()]
    if state.gate_error:
        parts += ["", f"**Gate could not run**: {state.gate_error}"]
    try:
        append_step_summary("\n".join(parts))
    except OSError:
        pass  # the summary is a courtesy; the terminal has the same text


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    state = config.stash.get(STATE_KEY, None)
    if state is None or state.is_worker or not state.records:
        return
    tr = terminalreporter
    tr.write_sep("=", "seqkernel-harness")
    if not state.options.no_summary:
        from harness.report import summary_markdown, terminal_text

        for line in terminal_text(summary_markdown(state.records)).splitlines():
            tr.write_line(line)
        tr.write_line("")
    if state.report_index is not None:
        tr.write_line(f"harness report: {state.report_index}")
    elif state.report_error:
        tr.write_line(f"harness report FAILED: {state.report_error}", red=True)
    else:
        tr.write_line(f"harness: {len(state.records)} records (no report written; pass --harness-report-dir DIR)")
    if state.gate_error:
        tr.write_line(f"harness gate could not run: {state.gate_error}", red=True)
    elif state.gate_result is not None:
        result = state.gate_result
        if result.passed:
            tr.write_line(f"harness gate: passed against {state.options.baseline} "
                          f"({len(result.missing)} missing, {len(result.added)} new cells)", green=True)
            for warning in result.warnings:  # e.g. what went unchecked, accepted by --harness-allow-missing
                tr.write_line(f"  warning: {warning}", yellow=True)
        else:
            tr.write_line(f"harness gate: FAILED against {state.options.baseline} "
                          f"({len(result.failures)} problems)", red=True, bold=True)
            for failure in result.failures:
                tr.write_line(f"  GATE FAIL: {failure}", red=True)


def pytest_unconfigure(config: pytest.Config) -> None:
    state = config.stash.get(STATE_KEY, None)
    if state is None:
        return
    if state.recorder is not None:
        state.recorder.close()
    if state.temporary and state.run_dir is not None and not state.is_worker:
        shutil.rmtree(state.run_dir, ignore_errors=True)
