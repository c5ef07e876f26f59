"""docs/ci-workflow.md's recipes: every harness command they run exists, and the matrix's steps reach the gate.

A blind hunt found the nightly matrix calling a sweep that is not shipped (``harness sweep nightly``), its merge
step stopping the job on exit status 1 (the run has findings) before the gate could run, and the FAMILY
comment leaving out three families.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e  # end to end: `make test-all`

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "ci-workflow.md"
MATRIX_SECTION = "## A nightly sweep as a CI matrix"

#: ``harness SUBCOMMAND REST`` in a recipe (not ``seqkernel-harness`` nor ``harness.report``).
_COMMAND = re.compile(r"(?<![\w.-])harness ([a-z][a-z-]*)([^\n]*)")


def _yaml(text: str) -> list[str]:
    return re.findall(r"```yaml\n(.*?)```", text, re.S)


def _commands(text: str) -> list[tuple[str, str]]:
    return [(m.group(1), m.group(2)) for block in _yaml(text) for m in _COMMAND.finditer(block)]


def _matrix_text() -> str:
    text = DOC.read_text()
    return text[text.index(MATRIX_SECTION):]


def test_every_command_of_the_recipes_exists():
    from harness.cli import build_parser

    (subparsers,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    shipped = {p.stem for p in (ROOT / "harness" / "sweeps").glob("*.toml")}
    commands = _commands(DOC.read_text())
    assert {"check", "gate", "merge", "update-baseline"} <= {name for name, _ in commands}
    for name, rest in commands:
        assert name in subparsers.choices, f"harness {name}{rest}"
        words = rest.split()
        if name == "sweep" and words and not words[0].startswith("-"):
            assert words[0] in shipped, f"harness sweep {words[0]}: not a shipped sweep ({sorted(shipped)})"


def test_no_step_writes_again_what_check_and_gate_write_to_the_step_summary():
    """`harness check` and `harness gate` append their summary and outcome to ``$GITHUB_STEP_SUMMARY``
    (`harness.report.append_step_summary`); a "Job summary" step that appended ``summary_markdown(...)`` and the
    gate's output again showed the gate's outcome twice on the job page, and the doc said only the pytest plugin
    writes it (a blind hunt, session 24)."""
    text = DOC.read_text()
    steps = [step for block in _yaml(text) for step in re.split(r"\n\s*- name: ", block)]
    writers = [step for step in steps if "GITHUB_STEP_SUMMARY" in step]
    assert writers, "the workflow says nothing on the job page when no baseline is committed"
    for step in writers:
        assert not re.search(r"summary_markdown|harness (check|gate)|gate\.txt", step), step
    says = "`harness check` and `harness gate` append them to `$GITHUB_STEP_SUMMARY` themselves"
    assert says in " ".join(text.split())


def test_the_family_comment_names_every_family():
    from harness.kernels.names import Family

    (line,) = [line for line in DOC.read_text().splitlines() if line.strip().startswith("FAMILY:")]
    named = {name.strip() for name in line.split("# <- yours:", 1)[1].split("|")}
    assert named == {f.value for f in Family}


def test_the_matrix_steps_that_can_find_something_accept_exit_status_1():
    """check, sweep and merge exit 1 when the run has findings; a step that does not accept it ends the job
    before the gate, which is what decides."""
    steps = [line.strip() for block in _yaml(_matrix_text()) for line in block.splitlines()
             if re.match(r"\s*- run: harness (check|sweep|merge)\b", line)]
    assert len(steps) >= 3, steps
    for step in steps:
        assert step.endswith("|| test $? -le 1"), step


def _shards(root: Path, count: int, jobs: range, extra: str = "") -> None:
    """``run-K`` for K in ``jobs``: job K of ``count`` of one check (``extra``: more of its options), each with
    one divergent record."""
    from harness.store import RunStore, environment

    for k in jobs:
        command = f"harness check --profile nightly{extra} --shard {k}/{count} --report-dir run-{k}"
        header = dict(environment("nightly", command=command), shard=f"{k}/{count}")
        with RunStore(root / f"run-{k}", header=header) as store:
            store.append({"kernel": "blelloch", "family": "linear_scan", "dtype": "float32", "length": 8 * k,
                          "regime": "trained", "case": f"c{k}", "verdict": "divergent", "cond_max": 5.0,
                          "cond_threshold": 1.0})


def _run_step(step: str, cwd: Path) -> subprocess.CompletedProcess:
    """A recipe's shell line with ``harness`` run as ``python -m harness`` from this tree."""
    line = re.sub(r"^- run: ", "", step.strip())
    line = re.sub(r"(?<![\w.-])harness ", f"{sys.executable} -m harness ", line)
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("GITHUB_STEP_SUMMARY", None)
    return subprocess.run(["bash", "-c", line], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def test_the_matrix_merge_step_passes_a_run_with_findings_on_to_the_gate(tmp_path):
    """The merge step, run as written: the merged run has findings (``harness merge`` alone exits 1) and the
    step succeeds; a merge that refuses (a shard of another check) still fails it."""
    (merge,) = [line for block in _yaml(_matrix_text()) for line in block.splitlines()
                if re.match(r"\s*- run: harness merge\b", line)]
    count = len(re.findall(r"\brun-\d+\b", merge))
    _shards(tmp_path, count, range(1, count + 1))
    bare = _run_step(merge.split("||")[0], tmp_path)
    assert bare.returncode == 1, bare.stderr  # findings: why the step needs `|| test $? -le 1`
    import shutil

    shutil.rmtree(tmp_path / "merged")
    step = _run_step(merge, tmp_path)
    assert step.returncode == 0, step.stderr
    assert (tmp_path / "merged" / "records.jsonl").is_file()
    shutil.rmtree(tmp_path / "merged")
    shutil.rmtree(tmp_path / f"run-{count}")
    _shards(tmp_path, count, range(count, count + 1), extra=" --max-examples 5")
    refused = _run_step(merge, tmp_path)
    assert refused.returncode != 0 and "differ in --max-examples (None vs 5)" in refused.stderr
