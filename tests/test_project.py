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
    ("timeout = 0", "timeout=0 must be > 0"),
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
