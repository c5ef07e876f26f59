"""Typed, versioned records: one severity order, one set of failing verdicts, schema versions read and
refused, the cell key with device and TF32, and re-judging in the measured precision."""

from __future__ import annotations

import json
import os

import pytest

from harness import records
from harness.gate import IncomparableRuns, gate
from harness.records import SCHEMA_VERSION, CaseRecord
from harness.store import RunStore, load_records

BASELINE = __import__("pathlib").Path(__file__).resolve().parent.parent / "reports" / "baseline"


def _one(**fields):
    rec = json.loads((BASELINE / "records.jsonl").read_text().splitlines()[0])
    rec.update(fields)
    return rec


def test_one_definition_of_severity_and_failing_verdicts():
    from harness import api, report

    assert report.SEVERITY is records.SEVERITY and api.FAILING_VERDICTS is records.FAILING_VERDICTS
    worst_first = sorted(records.VERDICTS, key=records.severity, reverse=True)
    assert worst_first[:2] == ["divergent", "kernel_error"]
    assert set(worst_first[:2]) == records.FAILING_VERDICTS


def test_a_pair_takes_the_worse_verdict_of_its_two_kernels():
    """run_pair once ranked kernel_error above divergent, against the report's order; now one order."""
    assert max(("kernel_error", "divergent"), key=records.severity) == "divergent"


def test_an_unversioned_record_is_read_and_split_into_its_parts():
    rec = _one()
    rec.pop("schema_version", None)  # as written before records had versions (schema 1)
    rec.pop("rule", None)
    typed = CaseRecord.from_dict(rec)
    assert typed.schema_version == 1
    assert typed.problem["dtype"] == rec["dtype"] and typed.problem["device"] == "cpu"
    assert typed.measurement["cond_max"] == rec["cond_max"] and typed.precision == rec["precision"]
    assert typed.judgement["verdict"] == rec["verdict"] and "t_case" in typed.timings
    assert typed.to_dict() == dict(rec, schema_version=1)


def test_the_store_stamps_the_schema_version(tmp_path):
    with RunStore(tmp_path, header={"device": "cpu (x86_64)"}) as store:
        store.append({"kernel": "k", "verdict": "equivalent", "dtype": "float32"})
        store.append({"kernel": "old", "verdict": "equivalent", "dtype": "float32", "schema_version": 1})
    versions = {r["kernel"]: r["schema_version"] for r in load_records(tmp_path)}
    assert versions == {"k": SCHEMA_VERSION, "old": 1}


def test_rejudging_uses_the_measured_precision_not_the_problem_dtype():
    """A float64 case of a kernel that computes in float32: measured against float32 rounding, and
    re-judged so; taking the problem's dtype holds it to float64 and calls a float32 error divergent."""
    from harness.verdict import judge

    rec = _one(dtype="float64", precision="float32", cond_max=0.5, baseline_ratio=0.9, has_baseline=True,
               n_mismatch=0)
    assert judge(rec).verdict.value == "equivalent"
    over = dict(rec, cond_max=1.5, baseline_ratio=1.2)  # explained by the float32 loop, not by float64's
    assert judge(over).verdict.value == "equivalent"
    assert judge(over, dtype="float64").verdict.value == "divergent"


def test_the_cell_key_holds_device_and_tf32():
    from harness.report import CELL_KEYS, cell_key, cell_table

    base = _one()
    cuda, tf32 = dict(base, device="cuda"), dict(base, device="cuda", tf32=True)
    assert {"device", "tf32"} <= set(CELL_KEYS)
    assert len({cell_key(r) for r in (base, cuda, tf32)}) == 3
    assert len(cell_table([base, cuda, tf32])) == 3


def _run(path, header, recs):
    with RunStore(path, header=header) as store:
        for r in recs:
            store.append(r)
    return path


def test_the_gate_refuses_runs_of_different_device_families(tmp_path):
    rec = _one()
    base = _run(tmp_path / "base", {"device": "cpu (x86_64)", "cuda": None, "schema_version": 2}, [rec])
    new = _run(tmp_path / "new", {"device": "NVIDIA H200", "cuda": "12.8", "schema_version": 2}, [rec])
    with pytest.raises(IncomparableRuns, match="baseline ran on cpu .* this run on cuda .*--allow-mismatch"):
        gate(base, new)
    result = gate(base, new, allow_mismatch=True)
    assert result.passed and any("compared although" in n for n in result.notes)


def test_the_gate_refuses_a_newer_schema_and_reads_an_older_one(tmp_path):
    rec = _one()
    header = {"device": "cpu (x86_64)", "cuda": None}
    old = _run(tmp_path / "old", header, [dict(rec, schema_version=1)])
    new = _run(tmp_path / "new", dict(header, schema_version=SCHEMA_VERSION), [rec])
    assert gate(old, new).passed
    future = _run(tmp_path / "future", dict(header, schema_version=SCHEMA_VERSION + 1),
                  [dict(rec, schema_version=SCHEMA_VERSION + 1)])
    with pytest.raises(IncomparableRuns, match=f"record schema {SCHEMA_VERSION + 1}, newer than this harness"):
        gate(old, future)


def test_the_cli_gate_says_why_and_force_compares(tmp_path, capsys):
    from harness.cli import main

    rec = _one()
    base = _run(tmp_path / "base", {"device": "cpu (x86_64)"}, [rec])
    new = _run(tmp_path / "new", {"device": "NVIDIA H200", "cuda": "12.8"}, [rec])
    assert main(["gate", str(new), "--baseline", str(base)]) == 2
    assert "different device families" in capsys.readouterr().err
    assert main(["gate", str(new), "--baseline", str(base), "--force"]) == 0


def test_a_run_of_edited_uncommitted_code_says_so_in_its_commit(tmp_path):
    """A header named only the commit the kernel code was edited from (a blind hunt, session 24)."""
    import shutil
    import subprocess

    from harness.store import git_commit

    if shutil.which("git") is None:
        pytest.skip("no git here")
    env = dict(GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t", GIT_COMMITTER_EMAIL="t@t")

    def git(*args):
        subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True, env={**os.environ, **env})

    (tmp_path / "scan.py").write_text("def scan(a, b):\n    return b\n")
    git("init", "-q")
    git("add", "scan.py")
    git("commit", "-q", "-m", "a kernel")
    clean = git_commit(tmp_path)
    assert clean and "+" not in clean
    (tmp_path / "untracked.txt").write_text("notes")  # not the code that ran
    assert git_commit(tmp_path) == clean
    (tmp_path / "scan.py").write_text("def scan(a, b):\n    return a * b\n")
    assert git_commit(tmp_path) == f"{clean}+dirty"


def test_the_header_names_the_harness_commit_where_the_harness_is_a_checkout(tmp_path):
    """Two runs of different harness code (an editable install, edited between them) had identical headers:
    ``harness_version`` is static (a blind hunt, session 24). A package no checkout tracks (a wheel installed
    into an ignored virtual environment inside a project) has no harness commit, not the project's."""
    import shutil
    import subprocess

    import harness
    from harness.store import environment, git_commit, harness_commit

    if shutil.which("git") is None:
        pytest.skip("no git here")
    env = dict(GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t", GIT_COMMITTER_EMAIL="t@t")

    def git(*args):
        subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True, env={**os.environ, **env})

    package, wheel = tmp_path / "harness", tmp_path / ".venv" / "site-packages" / "harness"
    for folder in (package, wheel):
        folder.mkdir(parents=True)
        (folder / "__init__.py").write_text("__version__ = '0.1.0'\n")
    (tmp_path / ".gitignore").write_text(".venv/\n")
    git("init", "-q")
    git("add", ".gitignore", "harness/__init__.py")
    git("commit", "-q", "-m", "the harness")
    clean = harness_commit(package)
    assert clean and clean == git_commit(tmp_path) and "+" not in clean
    assert harness_commit(wheel) is None and harness_commit(tmp_path / ".venv") is None
    (package / "__init__.py").write_text("__version__ = '0.1.0'  # edited\n")
    assert harness_commit(package) == f"{clean}+dirty"
    assert environment()["harness_commit"] == harness_commit()
    if harness_commit() is not None:  # this harness runs from a checkout: its own commit, not the cwd's
        assert harness_commit() == git_commit(os.path.dirname(harness.__file__))
