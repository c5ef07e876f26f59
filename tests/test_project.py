"""The caller's project: its root, ``.harness/`` defaults and the ``[tool.harness]`` table."""

from __future__ import annotations

import tomllib

import pytest

from harness.errors import InvalidArgument
from harness.project import BUILTIN_SWEEPS, KernelEntry, find_root, init_table, load_project


def test_without_a_table_state_goes_under_dot_harness(tmp_path):
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'k'\n")
    (tmp_path / "src" / "deep").mkdir(parents=True)
    project = load_project(tmp_path / "src" / "deep")
    assert project.root == tmp_path.resolve() and not project.configured
    assert project.runs_dir == tmp_path.resolve() / ".harness" / "runs"
    assert project.counterexamples_dir == tmp_path.resolve() / ".harness" / "counterexamples"
    assert project.baseline_dir == tmp_path.resolve() / ".harness" / "baseline"
    assert project.sweep_dirs == (BUILTIN_SWEEPS,)


def test_without_a_pyproject_the_working_directory_is_the_project(tmp_path, monkeypatch):
    if any((d / "pyproject.toml").exists() for d in tmp_path.resolve().parents):
        pytest.skip("the temporary folder lies inside a project here")
    monkeypatch.chdir(tmp_path)
    assert find_root() == tmp_path.resolve()
    assert load_project().runs_dir == tmp_path.resolve() / ".harness" / "runs"


def test_the_table_moves_paths_and_sets_defaults(tmp_path):
    (tmp_path / "pyproject.toml").write_text("""
[tool.harness]
runs = "reports"
counterexamples = "cases/counterexamples"
baseline = "reports/baseline"
sweeps = ["cases/sweeps"]
profile = "nightly"
policy = "cond=2"
timeout = 30
[[tool.harness.kernels]]
target = "kern/scan.py:scan"
family = "linear_scan"
""")
    p = load_project(tmp_path)
    root = tmp_path.resolve()
    assert p.configured and p.runs_dir == root / "reports" and p.baseline_dir == root / "reports" / "baseline"
    assert p.counterexamples_dir == root / "cases" / "counterexamples"
    assert p.sweep_dirs == (root / "cases" / "sweeps", BUILTIN_SWEEPS)
    assert (p.profile, p.policy, p.timeout) == ("nightly", "cond=2", 30)
    assert p.kernels == (KernelEntry("kern/scan.py:scan", "linear_scan"),)


@pytest.mark.parametrize("body, words", [
    ('runz = "x"', "unknown key 'runz'"),
    ("runs = 3", "runs=3 must be str"),
    ('profile = "weekly"', "profile='weekly'"),
    ("timeout = 0", "timeout=0 must be a finite number of seconds > 0"),
    ("timeout = true", "timeout=True must be"),
    ("sweeps = [1]", "sweeps=[1] must be a list of folders"),
    ('kernels = ["a"]', "entry 0 is 'a'"),
    ('kernels = [{target = "a", famly = "x"}]', "unknown keys ['famly']"),
])
def test_a_bad_table_names_the_key_and_the_value(tmp_path, body, words):
    (tmp_path / "pyproject.toml").write_text(f"[tool.harness]\n{body}\n")
    with pytest.raises(InvalidArgument, match=__import__("re").escape(words)):
        load_project(tmp_path)


def test_a_pyproject_that_is_not_toml_is_a_usage_error(tmp_path):
    (tmp_path / "pyproject.toml").write_text("[tool.harness\n")
    with pytest.raises(InvalidArgument, match="cannot be read as TOML"):
        load_project(tmp_path)


def test_init_table_is_valid_toml_that_loads_back(tmp_path):
    text = init_table([KernelEntry('my "kernels".py:fn', "retention")])
    (tmp_path / "pyproject.toml").write_text(text)
    assert tomllib.loads(text)["tool"]["harness"]["kernels"][0]["target"] == 'my "kernels".py:fn'
    assert load_project(tmp_path).kernels == (KernelEntry('my "kernels".py:fn', "retention"),)


# ---------------------------------------------------------------- the project wired into the front doors
def test_default_paths_follow_the_project_not_the_package(tmp_path, monkeypatch):
    from harness import cases
    from harness.cli import _default_run_dir

    (tmp_path / "pyproject.toml").write_text('[tool.harness]\nruns = "out/runs"\n')
    (tmp_path / "sub").mkdir()
    monkeypatch.chdir(tmp_path / "sub")
    root = tmp_path.resolve()
    assert _default_run_dir("check").parent == root / "out" / "runs"
    assert cases.counterexamples_dir() == root / ".harness" / "counterexamples"
    assert cases.counterexample_path("k", "linear_scan").parent == root / ".harness" / "counterexamples"


def test_two_runs_started_in_one_second_get_a_run_directory_each(tmp_path, monkeypatch):
    """Stamped to the second, two checks started together shared one directory and mixed their records
    (blind hunt 23b, P10): each default run directory is made here, atomically, the second with a suffix."""
    from harness.project import run_dir

    (tmp_path / "pyproject.toml").write_text('[tool.harness]\nruns = "out/runs"\n')
    monkeypatch.chdir(tmp_path)
    first, second = run_dir("check"), run_dir("check")
    if first.name[:21] == second.name[:21]:  # the same second (almost always): the second takes a suffix
        assert second.name == first.name + "-2"
    assert first != second and first.is_dir() and second.is_dir() and not any(first.iterdir())


def test_a_run_directory_another_live_run_writes_into_is_refused(tmp_path):
    """Two runs given one --report-dir were both accepted and their records mixed (blind hunt 23b, P10)."""
    from harness.store import RunStore

    with RunStore(tmp_path / "run", header={"profile": "ci"}):
        with pytest.raises(InvalidArgument, match="is being written by another run that is still going"):
            RunStore(tmp_path / "run", header={"profile": "ci"})
    with RunStore(tmp_path / "run", header={"profile": "ci"}):  # the first ended: its lock is gone
        pass


def test_sweeps_ship_in_the_package_and_a_project_sweep_comes_first(tmp_path, monkeypatch):
    from harness.cases import load_sweep, sweep_files

    assert {"default", "gpu", "mamba_seed", "retnet_seed"} <= {p.stem for p in BUILTIN_SWEEPS.glob("*.toml")}
    (tmp_path / "sw").mkdir()
    (tmp_path / "sw" / "default.toml").write_text('kernels = ["intree.sequential_scan"]\n[grid]\nlength = [4]\n')
    (tmp_path / "pyproject.toml").write_text('[tool.harness]\nsweeps = ["sw"]\n')
    monkeypatch.chdir(tmp_path)
    found = {s.name: s for s in sweep_files()}
    assert found["default"].origin == "project" and found["gpu"].origin == "built-in"
    assert [len(g.kernels) for g in load_sweep("default").groups] == [1]  # the project's, not the built-in one


def test_sweep_list_prints_one_line_per_sweep(tmp_path, monkeypatch, capsys):
    from harness.cli import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'k'\n")
    assert main(["sweep", "--list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    default = next(line for line in lines if line.startswith("default "))
    assert "built-in" in default and "runnable here, of 502 in its grids" in default
    assert len(lines) == len(list(BUILTIN_SWEEPS.glob("*.toml")))
    assert main(["sweep"]) == 2 and "--list" in capsys.readouterr().err


def test_check_without_kernel_needs_the_table(tmp_path, monkeypatch, capsys):
    from harness.cli import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'k'\n")
    assert main(["check"]) == 2
    assert "lists no [[tool.harness.kernels]]" in capsys.readouterr().err
    assert not (tmp_path / ".harness").exists()


@pytest.mark.parametrize("entry, says", [
    ('target = "k.py:scan"\n', "target='k.py:scan': family=None: a plain callable"),
    ('target = "k.py:scan"\nfamily = "nope"\n', "target='k.py:scan': family='nope' is not a kernel family"),
    ('target = "k.py:scan"\nfamily = "linear_scan"\n[tool.harness]\ntimeout = inf\n',
     "[tool.harness] timeout=inf must be a finite number"),
], ids=["no-family", "bad-family", "timeout-inf"])
def test_an_error_of_the_table_names_the_pyproject(tmp_path, monkeypatch, capsys, entry, says):
    """"family=None: a plain callable needs --family" where no --family was given (blind hunt 23b, P18)."""
    from harness.cli import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "k.py").write_text("def scan(a, b):\n    return b\n")
    (tmp_path / "pyproject.toml").write_text("[[tool.harness.kernels]]\n" + entry)
    assert main(["check", "--max-examples", "2"]) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path.resolve() / 'pyproject.toml'}: " in err and says in err, err


def test_table_targets_are_relative_to_the_root(tmp_path):
    from harness.project import kernel_target

    (tmp_path / "pyproject.toml").write_text('[[tool.harness.kernels]]\ntarget = "k/scan.py:f"\n')
    (tmp_path / "deep").mkdir()
    project = load_project(tmp_path)
    assert kernel_target(project.kernels[0], project, cwd=tmp_path / "deep") == "../k/scan.py:f"
    assert kernel_target(KernelEntry("pkg.mod:f"), project, cwd=tmp_path / "deep") == "pkg.mod:f"


# --------------------------------------------------------------------------------------- harness init
def test_init_writes_the_table_and_the_workflow_and_never_clobbers(tmp_path, monkeypatch, capsys):
    from harness.cli import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'k'\n\n[tool.other]\nx = 1\n")
    assert main(["init", "--kernel", "kern/scan.py:scan", "--family", "linear_scan"]) == 0
    data = tomllib.loads((tmp_path / "pyproject.toml").read_text())
    assert data["project"]["name"] == "k" and data["tool"]["other"] == {"x": 1}
    assert data["tool"]["harness"]["kernels"] == [{"target": "kern/scan.py:scan", "family": "linear_scan"}]
    workflow = (tmp_path / ".github" / "workflows" / "harness.yml").read_text()
    assert "harness check --report-dir \"$RUN_DIR\"" in workflow and "harness gate \"$RUN_DIR\"" in workflow
    assert "hashFiles('numerics/baseline/records*.jsonl')" in workflow  # the table's baseline
    before = (tmp_path / "pyproject.toml").read_text()
    assert main(["init", "--kernel", "other.py:f", "--family", "retention", "--no-workflow"]) == 2
    assert "already has a [tool.harness] table" in capsys.readouterr().err
    assert (tmp_path / "pyproject.toml").read_text() == before
    assert main(["init", "--kernel", "other.py:f", "--family", "retention", "--force"]) == 0
    data = tomllib.loads((tmp_path / "pyproject.toml").read_text())
    assert data["tool"]["harness"]["kernels"] == [{"target": "other.py:f", "family": "retention"}]
    assert data["tool"]["other"] == {"x": 1}


def test_init_creates_a_missing_pyproject(tmp_path, monkeypatch):
    from harness.scaffold import init_project

    written = init_project(tmp_path, [KernelEntry("k.py:f", "linear_scan")], workflow=False).written
    assert written == [tmp_path.resolve() / "pyproject.toml", tmp_path.resolve() / ".gitignore"]
    assert load_project(tmp_path).kernels == (KernelEntry("k.py:f", "linear_scan"),)
    with pytest.raises(InvalidArgument, match="kernels=\\[\\]"):
        init_project(tmp_path / "empty", [], workflow=True)


def test_check_writes_its_run_and_counterexample_into_the_callers_project(tmp_path, monkeypatch, capsys):
    """`harness check` from a project's subfolder, kernels from the table: the run goes under the table's
    runs folder and the shrunk counterexample under .harness/counterexamples, nothing elsewhere."""
    from harness.cli import main

    (tmp_path / "kern").mkdir()
    (tmp_path / "kern" / "scan.py").write_text(
        "import torch\n\ndef scan(a, b):  # planted: forgets a\n    return torch.cumsum(b, -1)\n")
    (tmp_path / "pyproject.toml").write_text('[tool.harness]\nruns = "out"\n[[tool.harness.kernels]]\n'
                                             'target = "kern/scan.py:scan"\nfamily = "linear_scan"\n')
    (tmp_path / "docs").mkdir()
    monkeypatch.chdir(tmp_path / "docs")
    code = main(["check", "--max-examples", "5", "--dtypes", "float64", "--no-grad", "--in-process", "--profile", "dev"])
    out = capsys.readouterr().out
    assert code == 1 and "counterexample saved:" in out
    root = tmp_path.resolve()
    (run,) = (root / "out").iterdir()
    assert run.name.startswith("check-") and (run / "records.jsonl").is_file()
    (saved,) = (root / ".harness" / "counterexamples").glob("*.json")
    assert "kern_scan.py_scan" in saved.name
    assert {p.name for p in root.iterdir()} - {".hypothesis"} == {".harness", "docs", "kern", "out", "pyproject.toml"}
    assert [p.name for p in (root / "docs").iterdir()] in ([], [".hypothesis"])


def test_a_tool_key_that_is_no_table_is_a_usage_error(tmp_path):
    (tmp_path / "pyproject.toml").write_text('tool = "x"\n')  # was an AttributeError traceback (a blind hunt)
    with pytest.raises(InvalidArgument, match=r"\[tool\] must be a table, got str"):
        load_project(tmp_path)


@pytest.mark.parametrize("table", ['[tool]\nharness = { runs = "custom/runs" }\n',
                                   'tool.harness.runs = "custom/runs"\n'])
def test_init_force_never_writes_a_pyproject_toml_that_declares_the_table_twice(tmp_path, table):
    """A [tool.harness] table written inline or as dotted keys is valid TOML that init cannot cut out:
    ``init --force`` added a second table, wrote the file, and only then said it could not read it, leaving a
    pyproject.toml that pip refuses (a blind hunt, session 27). Refused now before anything is written."""
    from harness.scaffold import init_project

    original = (table + '\n[project]\nname = "p"\n') if table.startswith("tool.") else ('[project]\nname = "p"\n\n' + table)
    (tmp_path / "pyproject.toml").write_text(original)
    with pytest.raises(InvalidArgument, match="nothing was written. Remove that table by hand"):
        init_project(tmp_path, [KernelEntry("k.py:f", "linear_scan")], force=True, workflow=False)
    assert (tmp_path / "pyproject.toml").read_text() == original


def test_init_keeps_the_file_s_line_endings(tmp_path):
    from harness.scaffold import init_project

    (tmp_path / "pyproject.toml").write_bytes(b'[project]\r\nname = "p"\r\n')
    init_project(tmp_path, [KernelEntry("k.py:f", "linear_scan")], workflow=False)
    data = (tmp_path / "pyproject.toml").read_bytes()
    assert b"[tool.harness]" in data and b"\n" not in data.replace(b"\r\n", b"")
    assert tomllib.loads(data.decode())["project"]["name"] == "p"
