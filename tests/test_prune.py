"""Saved counterexamples whose kernel has since been fixed: a passing check names them, a replay says so, and
`harness prune` deletes them (what still fails, what is kept on purpose and what cannot be replayed stays).

A tiny project: a correct scan (``good.py``, its saved case left from before its fix), a wrong one (``bad.py``,
its case still fails), run in this process.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.cases import prune_counterexamples, save_counterexample, stale_counterexamples
from harness.problems import Problem

GOOD = "import torch\n\ndef scan(a, b):\n    h, out = torch.zeros_like(b[..., 0]), []\n" \
       "    for t in range(b.shape[-1]):\n        h = a[..., t] * h + b[..., t]\n        out.append(h)\n" \
       "    return torch.stack(out, -1)\n"
BAD = "import torch\n\ndef scan(a, b):  # forgets a\n    return torch.cumsum(b, -1)\n"


def _save(directory: Path, kernel: str, target: str | None, *, dtype: str = "float64", expect: str = "equivalent",
          grad_of: str | None = None) -> Path:
    """A counterexample as `harness check` saves it (`save_counterexample`): found divergent, waiting for a fix."""
    problem = Problem(family="linear_scan", length=6, dim=2, dtype=dtype, seed=5)
    record = {"kernel": kernel if grad_of is None else f"{kernel}:grad[{grad_of}]", "verdict": "divergent",
              "cause": "kernel_bug"}
    if grad_of is not None:
        record.update(mode="grad", grad_of=grad_of)
    return save_counterexample(record, problem, directory=directory, expect=expect, kernel_target=target)


@pytest.fixture
def project(tmp_path, monkeypatch):
    """A kernel repository (its counterexamples in ``cx/``) with the cases of `_save`, as the working directory."""
    (tmp_path / "pyproject.toml").write_text('[tool.harness]\ncounterexamples = "cx"\n')
    (tmp_path / "good.py").write_text(GOOD)
    (tmp_path / "bad.py").write_text(BAD)
    monkeypatch.chdir(tmp_path)
    cx = tmp_path / "cx"
    cases = {
        "fixed": _save(cx, "user.good.py:scan", "good.py:scan"),
        "fixed_grad": _save(cx, "user.good.py:scan", "good.py:scan", grad_of="b"),
        "fixed_float32": _save(cx, "user.good.py:scan", "good.py:scan", dtype="float32"),
        "failing": _save(cx, "user.bad.py:scan", "bad.py:scan"),
        "kept": _save(cx, "user.bad.py:scan", "bad.py:scan", dtype="float32", expect="divergent"),
        "registered": _save(cx, "intree.sequential_scan", None),
    }
    (cx / "broken.json").write_text("{not json")
    assert len(set(cases.values())) == len(cases)
    return tmp_path, cases


def _left(cases: dict[str, Path]) -> set[str]:
    return {name for name, path in cases.items() if path.exists()}


def test_prune_deletes_only_the_cases_that_no_longer_fail(project):
    _, cases = project
    report = prune_counterexamples(dry_run=True, trust=True)
    assert set(report.removed) == {cases[n] for n in ("fixed", "fixed_grad", "fixed_float32", "registered")}
    assert _left(cases) == set(cases)  # a dry run deletes nothing
    assert [p for p, _ in report.failing] == [cases["failing"]] and "divergent" in report.failing[0][1]
    assert [p for p, _ in report.kept] == [cases["kept"]]
    assert [p.name for p, _ in report.skipped] == ["broken.json"]

    report = prune_counterexamples(trust=True)
    assert _left(cases) == {"failing", "kept"} and len(report.removed) == 4


def test_a_user_kernel_s_cases_are_replayed_only_when_its_code_is_named_or_trusted(project):
    _, cases = project
    report = prune_counterexamples()  # neither --kernel nor --trust-case-file: no user code imported
    assert report.removed == [cases["registered"]] and not report.failing
    untrusted = {p: why for p, why in report.skipped if p.name != "broken.json"}
    assert set(untrusted) == {cases[n] for n in ("fixed", "fixed_grad", "fixed_float32", "failing")}
    assert all("--kernel" in why and "--trust-case-file" in why for why in untrusted.values())
    assert _left(cases) == set(cases) - {"registered"}

    report = prune_counterexamples(kernel="./good.py:scan")  # the kernel's cases only, however its path is typed
    assert set(report.removed) == {cases[n] for n in ("fixed", "fixed_grad", "fixed_float32")}
    assert not report.failing and not report.skipped and not report.kept
    assert _left(cases) == {"failing", "kept"}


def test_the_prune_command_says_what_it_removed_and_what_still_fails(project, capsys):
    from harness.cli import main

    _, cases = project
    assert main(["prune", "--kernel", "bad.py:scan", "--in-process"]) == 0
    out = capsys.readouterr().out
    assert str(cases["failing"]) in out and str(cases["kept"]) in out and _left(cases) == set(cases)
    assert main(["prune", "--kernel", "good.py:scan", "--dry-run", "--in-process"]) == 0
    out = capsys.readouterr().out
    assert all(str(cases[n]) in out for n in ("fixed", "fixed_grad", "fixed_float32")) and _left(cases) == set(cases)
    assert main(["prune", "--kernel", "good.py:scan", "--in-process"]) == 0
    assert _left(cases) == {"failing", "kept", "registered"}
    assert main(["prune", "--kernel", "good.py:scan", "--in-process"]) == 0
    assert "no saved counterexample of kernel good.py:scan" in capsys.readouterr().out


def test_a_passing_check_names_its_kernel_s_stale_counterexamples(project, capsys):
    from harness.api import check, check_each_dtype
    from harness.cli import main

    root, cases = project
    result = check("good.py:scan", family="linear_scan", dtypes=("float64",), max_examples=2, grad=False,
                   profile="dev")
    assert result.passed and set(result.stale_counterexamples) == {cases["fixed"], cases["fixed_grad"]}
    result = check_each_dtype("good.py:scan", family="linear_scan", dtypes=("float64", "float32"), max_examples=2,
                              grad=False, profile="dev")  # the pytest fixture's searches, joined
    assert set(result.stale_counterexamples) == {cases[n] for n in ("fixed", "fixed_grad", "fixed_float32")}
    assert not check("bad.py:scan", family="linear_scan", dtypes=("float64",), max_examples=2, grad=False,
                     profile="dev", shrink_deadline_s=0).stale_counterexamples
    assert _left(cases) == set(cases)  # a check only names them

    assert main(["check", "--kernel", "good.py:scan", "--family", "linear_scan", "--dtypes", "float64,float32",
                 "--max-examples", "2", "--no-grad", "--in-process", "--profile", "dev",
                 "--report-dir", str(root / "run")]) == 0
    out = capsys.readouterr().out
    (line,) = [line for line in out.splitlines() if cases["fixed"].name in line]
    assert "harness prune --kernel good.py:scan" in line
    assert all(cases[n].name in line for n in ("fixed_grad", "fixed_float32"))
    assert not any(cases[n].name in out for n in ("failing", "kept", "registered"))


def test_stale_counterexamples_replays_nothing_of_other_kernels(project, monkeypatch):
    """Only the checked kernel's cases are replayed: a case names code, and another kernel's is not the check's."""
    from harness import cases as cases_module
    from harness.api import user_kernel_spec

    replayed = []
    real = cases_module.replay
    monkeypatch.setattr(cases_module, "replay", lambda spec, problem, *a, **k: replayed.append(spec.name) or
                        real(spec, problem, *a, **k))
    spec = user_kernel_spec("good.py:scan", family="linear_scan")
    assert len(stale_counterexamples(spec, dtypes=("float64",))) == 2
    assert replayed == ["user.good.py:scan"] * 2


def test_a_replay_that_passes_says_the_case_can_go(project, capsys):
    from harness.cli import main

    root, cases = project
    assert main(["replay", str(cases["fixed"]), "--kernel", "good.py:scan", "--in-process"]) == 0
    out = capsys.readouterr().out
    assert "equivalent" in out and str(cases["fixed"]) in out.split("verdict", 1)[1]
    assert "harness prune --kernel good.py:scan" in out
    assert main(["replay", str(cases["failing"]), "--kernel", "bad.py:scan", "--in-process"]) == 1
    assert "harness prune" not in capsys.readouterr().out
    # kept on purpose (a bug that must stay caught): equivalent now is a surprise to look into, not a case to delete
    kept = _save(root / "cx", "user.good.py:scan", "good.py:scan", grad_of="a", expect="divergent")
    assert main(["replay", str(kept), "--kernel", "good.py:scan", "--in-process"]) == 1
    out = capsys.readouterr().out
    assert "equivalent" in out and "harness prune" not in out
