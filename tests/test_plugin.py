"""The pytest plugin, driven through inner pytest sessions (pytester).

The inner test module records synthetic records through the ``harness_recorder`` fixture; the checks
are on what the plugin leaves behind: the report files, the terminal summary, the exit status under a
gate, and the same merged tables when the session runs on two xdist workers.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

# Imported here so that pytester's inline runs find them in sys.modules (an inline run drops the modules
# it imported itself, and torch, pandas and matplotlib must not be imported twice in one process).
import matplotlib  # noqa: F401
import pandas  # noqa: F401
import torch  # noqa: F401

import harness.gate  # noqa: F401
import harness.plots  # noqa: F401
import harness.report  # noqa: F401
from harness.store import RunStore, load_records

pytest_plugins = ["pytester"]

N_CASES = 12

INNER_TESTS = '''
import math
import pytest

def make_record(i):
    kernel = ("blelloch", "sequential")[i % 2]
    length = (8, 16, 64, 256)[(i // 2) % 4]
    dtype = ("float32", "float16")[(i // 8) % 2]
    verdict = "divergent" if i == 11 else "equivalent"
    cond = 7.0 if verdict == "divergent" else 1e-3 * length ** 0.5
    return {"kernel": kernel, "family": "linear_scan", "dtype": dtype, "length": length, "regime": "trained",
            "seed": i, "eps": None, "chunk_size": None, "case": f"case{i:02d}", "verdict": verdict,
            "why": "synthetic", "cause": "rounding", "replay": f"harness replay --kernel {kernel} --problem {i}",
            "cond_max": cond, "max_abs": cond * 1e-6, "max_rel": cond * 1e-5, "ulp_p99": cond * 10,
            "rms_ratio": cond * 1e-7, "baseline_ratio": cond * 16, "onset_t": 3 if verdict == "divergent" else None,
            "nonfinite_class": "none"}

@pytest.mark.parametrize("i", range(N_CASES))
def test_case(harness_recorder, i):
    harness_recorder.record(make_record(i))
'''.replace("N_CASES", str(N_CASES))

TABLE_FILES = ("summary.csv", "cells.csv", "growth.csv", "failures.csv")


@pytest.fixture(scope="module", autouse=True)
def _warm_imports(tmp_path_factory):
    # Build one report (plots included) in this process first: the modules that matplotlib, pandas and
    # the harness import lazily are then already loaded when an inline session would import them.
    from harness.report import write_report

    rec = {"kernel": "k", "family": "linear_scan", "dtype": "float32", "length": 8, "verdict": "divergent",
           "cond_max": 2.0, "onset_t": 1}
    write_report([rec, dict(rec, length=16)], {}, tmp_path_factory.mktemp("warm"))
    harness.gate.gate_records([rec], [rec])


@pytest.fixture(autouse=True)
def _no_step_summary(monkeypatch):
    # The inner sessions must not write into a real GitHub Actions step summary.
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    monkeypatch.delenv("PYTEST_ADDOPTS", raising=False)


def run_inner(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    pytester.makepyfile(test_inner=INNER_TESTS)
    # pytest-benchmark (when installed) warns that xdist disables it; the inner sessions have no benchmarks
    return pytester.runpytest("-p", "no:cacheprovider", "-p", "no:benchmark", *args)


def tables_of(report_dir: Path) -> dict[str, object]:
    doc = json.loads((report_dir / "report.json").read_text())
    doc.pop("header")
    tables: dict[str, object] = {name: (report_dir / name).read_bytes() for name in TABLE_FILES}
    tables["report.json"] = doc
    # the run header (its command and start time differ) is the folded section at the end
    tables["index.md"] = (report_dir / "index.md").read_text().split("## Summary", 1)[1].split(
        "<summary>Run header</summary>")[0]
    return tables


def test_recorded_records_make_a_report_and_a_summary(pytester):
    report_dir = pytester.path / "reports" / "test-run"
    result = run_inner(pytester, "--harness-report-dir", "reports/test-run")
    result.assert_outcomes(passed=N_CASES)
    assert result.ret == 0
    result.stdout.fnmatch_lines([
        f"seqkernel-harness {harness_version()}: report dir *test-run",
        "*= seqkernel-harness =*",
        f"**{N_CASES} cases**: 11 equivalent · 1 divergent · 0 out_of_domain · 0 kernel_error",
        "| kernel *",
        "| sequential * float16 * divergent *",
        f"harness report: {report_dir / 'index.md'}",
    ])
    for name in ("index.md", "run.json", "records.jsonl", *TABLE_FILES, "report.json", "plot_onset.png"):
        assert (report_dir / name).is_file(), name
    assert len(load_records(report_dir)) == N_CASES
    header = json.loads((report_dir / "run.json").read_text())
    assert header["harness_version"] == harness_version() and header["command"].startswith("pytest ")
    # a second session replaces the first one's records instead of adding to them
    run_inner(pytester, "--harness-report-dir", "reports/test-run").assert_outcomes(passed=N_CASES)
    assert len(load_records(report_dir)) == N_CASES


@pytest.mark.e2e
def test_xdist_workers_merge_into_the_same_tables(pytester):
    pytest.importorskip("xdist")
    serial = run_inner(pytester, "--harness-report-dir", "serial")
    serial.assert_outcomes(passed=N_CASES)
    parallel = run_inner(pytester, "-p", "xdist", "-n", "2", "--harness-report-dir", "parallel")
    parallel.assert_outcomes(passed=N_CASES)
    parallel.stdout.fnmatch_lines(["*= seqkernel-harness =*", f"**{N_CASES} cases**: *"])
    run_dir = pytester.path / "parallel"
    worker_files = sorted(p.name for p in run_dir.glob("records*.jsonl"))
    assert worker_files == ["records-gw0.jsonl", "records-gw1.jsonl"]
    assert tables_of(pytester.path / "serial") == tables_of(run_dir)


def test_no_records_write_nothing(pytester):
    pytester.makepyfile(test_plain="def test_nothing_recorded():\n    assert True\n")
    result = pytester.runpytest("-p", "no:cacheprovider", "--harness-report-dir", "out")
    result.assert_outcomes(passed=1)
    assert not (pytester.path / "out").exists() or not any((pytester.path / "out").iterdir())
    assert "seqkernel-harness =" not in result.stdout.str()


def test_no_summary_keeps_the_report_path_only(pytester):
    result = run_inner(pytester, "--harness-report-dir", "out", "--harness-no-summary")
    result.assert_outcomes(passed=N_CASES)
    text = result.stdout.str()
    assert "| kernel" not in text
    result.stdout.fnmatch_lines(["harness report: *index.md"])


def write_baseline(path: Path, cond_scale: float) -> Path:
    """A baseline with the inner run's cells, its errors scaled by ``cond_scale``, all equivalent."""
    with RunStore(path, header={"git_commit": "base"}) as store:
        for i in range(N_CASES):
            kernel, length = ("blelloch", "sequential")[i % 2], (8, 16, 64, 256)[(i // 2) % 4]
            dtype = ("float32", "float16")[(i // 8) % 2]
            cond = 1e-3 * length**0.5 * cond_scale
            store.append({"kernel": kernel, "family": "linear_scan", "dtype": dtype, "length": length,
                          "regime": "trained", "seed": i, "eps": None, "chunk_size": None, "case": f"case{i:02d}",
                          "verdict": "equivalent", "cond_max": cond, "max_abs": cond * 1e-6,
                          "max_rel": cond * 1e-5, "ulp_p99": cond * 10, "rms_ratio": cond * 1e-7,
                          "baseline_ratio": cond * 16})
    return path


def test_a_failing_gate_fails_the_session(pytester):
    baseline = write_baseline(pytester.path / "baseline", cond_scale=1.0)
    result = run_inner(pytester, "--harness-baseline", str(baseline), "--harness-fail-on", "cond:1.5x")
    result.assert_outcomes(passed=N_CASES)
    assert result.ret == 1
    result.stdout.fnmatch_lines([
        "harness gate: FAILED against *baseline (1 problems)",
        "  GATE FAIL: kernel=sequential family=linear_scan dtype=float16 length=16-31 regime=trained: "
        "verdict equivalent -> divergent (*); cond_max grew 0.004 -> 7 (x1750; allowed 1.5x by 'cond:1.5x')",
    ])
    # no report dir: the run went to a temporary directory, gone afterwards; nothing written here
    assert not (pytester.path / "index.md").exists()


def test_a_passing_gate_keeps_the_session_green(pytester):
    # The baseline is equally divergent in that cell, so nothing got worse.
    baseline = write_baseline(pytester.path / "baseline", cond_scale=1.0)
    recs = load_records(baseline)
    for rec in recs:
        if rec["case"] == "case11":
            rec.update(verdict="divergent", cond_max=7.0)
    (baseline / "records.jsonl").unlink()
    with RunStore(baseline) as store:
        for rec in recs:
            store.append(rec)
    result = run_inner(pytester, "--harness-baseline", str(baseline))
    assert result.ret == 0
    result.stdout.fnmatch_lines(["harness gate: passed against *baseline*"])


def test_a_session_that_checked_less_than_its_baseline_fails_unless_allowed(pytester):
    """A baseline with a kernel the session never ran: the session checked less, and fails the gate (a silent
    green otherwise); ``--harness-allow-missing`` accepts it and still names what went unchecked."""
    baseline = write_baseline(pytester.path / "baseline", cond_scale=1.0)
    recs = load_records(baseline)
    for rec in recs:  # the inner session's divergent cell, as in the baseline: nothing got worse
        if rec["case"] == "case11":
            rec.update(verdict="divergent", cond_max=7.0)
    (baseline / "records.jsonl").unlink()
    with RunStore(baseline) as store:
        for rec in recs + [dict(rec, kernel="retired_kernel") for rec in recs[:4]]:
            store.append(rec)
    result = run_inner(pytester, "--harness-baseline", str(baseline))
    assert result.ret == 1 and "retired_kernel" in result.stdout.str()
    allowed = run_inner(pytester, "--harness-baseline", str(baseline), "--harness-allow-missing")
    assert allowed.ret == 0
    assert any("retired_kernel" in line and "warning" in line for line in allowed.stdout.lines)


@pytest.mark.parametrize("option, value, message", [
    ("--harness-fail-on", "cond:fast", "*--harness-fail-on: fail_on term 'cond:fast'*metric:factor*"),
    ("--harness-policy", "cond", "*--harness-policy: *'cond'*key=value*"),
])
def test_a_bad_spec_is_a_usage_error(pytester, option, value, message):
    if option == "--harness-policy":
        pytest.importorskip("harness.verdict")
    result = run_inner(pytester, option, value)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([message])


def test_step_summary_is_appended(pytester, monkeypatch):
    target = pytester.path / "step_summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(target))
    run_inner(pytester).assert_outcomes(passed=N_CASES)
    text = target.read_text()
    assert "### seqkernel-harness (pytest)" in text and "| blelloch" in text


def test_policy_fixture_reads_the_policy_option(pytester, monkeypatch):
    pytest.importorskip("harness.verdict")
    pytester.makepyfile(test_policy=(
        "import os\n"
        "from harness.verdict import Policy\n"
        "def test_policy(harness_policy):\n"
        "    expected = Policy.parse(os.environ['EXPECTED_POLICY']) if os.environ['EXPECTED_POLICY'] else Policy()\n"
        "    assert harness_policy == expected\n"))
    monkeypatch.setenv("EXPECTED_POLICY", "")
    pytester.runpytest("-p", "no:cacheprovider").assert_outcomes(passed=1)
    monkeypatch.setenv("EXPECTED_POLICY", "cond=4")
    pytester.runpytest("-p", "no:cacheprovider", "--harness-policy", "cond=4").assert_outcomes(passed=1)
    # and the option does reach the fixture: a default Policy is not what was asked for
    monkeypatch.setenv("EXPECTED_POLICY", "")
    pytester.runpytest("-p", "no:cacheprovider", "--harness-policy", "cond=4").assert_outcomes(failed=1)


def harness_version() -> str:
    from harness import __version__

    return __version__


@pytest.mark.parametrize("profile", ["dev", "nightly"])
def test_the_header_shows_the_hypothesis_profile_and_its_limits(pytester, profile):
    pytester.makepyfile(test_plain="def test_nothing():\n    assert True\n")
    pytester.makeconftest("from harness.settings import register_profiles\nregister_profiles()\n")
    result = pytester.runpytest("-p", "no:cacheprovider", f"--hypothesis-profile={profile}")
    result.stdout.fnmatch_lines([f"seqkernel-harness hypothesis profile '{profile}': up to *"])


@pytest.mark.e2e
def test_xdist_workers_split_the_cores(pytester):
    """Each of -n 2 workers runs torch on its share of the cores (`harness.threads`), not on all of them."""
    from harness.threads import thread_count

    pytester.makepyfile(test_threads="""
import torch
from reference_impls._compiled import thread_budget
def test_a(): print("THREADS", torch.get_num_threads(), thread_budget())
def test_b(): print("THREADS", torch.get_num_threads(), thread_budget())
""")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-p", "xdist", "-n", "2", "-rA")
    result.assert_outcomes(passed=2)
    seen = {tuple(line.split("THREADS")[1].split()) for line in result.outlines if "THREADS " in line}
    share = str(thread_count(runs=2, isolated=True))  # the inner run's kernels would run in worker processes
    assert seen == {(share, share)}, result.outlines  # torch's threads and the oracles' compiled kernels'



def test_a_report_dir_of_someone_else_s_files_is_a_usage_error(pytester):
    """``--harness-report-dir docs`` deleted a hand-written docs/index.md (the plugin clears an earlier session's
    report first) and wrote its own there (a blind hunt, session 27): now it is a usage error, nothing touched."""
    docs = pytester.path / "docs"
    docs.mkdir()
    (docs / "index.md").write_text("# Our kernels\n")
    result = run_inner(pytester, "--harness-report-dir", "docs")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--harness-report-dir=*docs* holds index.md, which no harness run or report "
                                 "wrote*"])
    assert [p.name for p in docs.iterdir()] == ["index.md"] and (docs / "index.md").read_text() == "# Our kernels\n"
