"""`harness init` in a kernel repository: the workflow installs the harness from where it was installed, and the
runs folder is ignored by git while the counterexamples and the baseline are not.

The installed distribution's origin (PEP 610 ``direct_url.json``) is faked by a stand-in for
``importlib.metadata.distribution``: a VCS URL, a wheel or a checkout inside or outside the project, an index.
"""

from __future__ import annotations

import importlib.metadata
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from harness.project import load_project
from harness.scaffold import DISTRIBUTION, WORKFLOW_PATH, ignore_runs, installed_requirement, runs_ignore_lines


class FakeDistribution:
    """What `installed_requirement` reads of an installed distribution: its version and direct_url.json."""

    def __init__(self, direct_url: dict | None, version: str = "9.8.7"):
        self.version = version
        self._direct_url = direct_url

    def read_text(self, name: str) -> str | None:
        assert name == "direct_url.json"
        return None if self._direct_url is None else json.dumps(self._direct_url)


@pytest.fixture
def installed(monkeypatch):
    """``installed(direct_url, version=...)``: the harness's distribution as if installed from ``direct_url``."""
    real = importlib.metadata.distribution

    def install(direct_url: dict | None, version: str = "9.8.7") -> None:
        fake = FakeDistribution(direct_url, version)
        monkeypatch.setattr(importlib.metadata, "distribution",
                            lambda name: fake if name == DISTRIBUTION else real(name))

    return install


def _file_url(path: Path) -> str:
    return path.resolve().as_uri()


# ------------------------------------------------------------------------------------ the requirement
def test_a_git_install_is_pinned_to_its_commit(tmp_path, installed):
    installed({"url": "https://github.com/someone/seqkernel-harness", "subdirectory": "py",
               "vcs_info": {"vcs": "git", "commit_id": "0123abcd", "requested_revision": "main"}})
    req = installed_requirement(tmp_path)
    assert req.text == "seqkernel-harness @ git+https://github.com/someone/seqkernel-harness@0123abcd#subdirectory=py"
    assert req.warning is None


def test_an_index_install_is_pinned_to_the_installed_version(tmp_path, installed):
    installed(None, version="9.8.7")
    req = installed_requirement(tmp_path)
    assert req.text == "seqkernel-harness==9.8.7" and req.warning is None


def test_a_wheel_inside_the_project_is_named_by_its_path_from_the_root(tmp_path, installed):
    wheel = tmp_path / "my wheels" / "seqkernel_harness-0.1.0-py3-none-any.whl"  # a space: the URL quotes it
    wheel.parent.mkdir()
    wheel.write_bytes(b"")
    installed({"url": _file_url(wheel), "archive_info": {}})
    req = installed_requirement(tmp_path)
    assert req.text == "./my wheels/seqkernel_harness-0.1.0-py3-none-any.whl" and req.warning is None


def test_an_editable_checkout_inside_the_project_is_named_by_its_path_from_the_root(tmp_path, installed):
    (tmp_path / "vendor" / "harness").mkdir(parents=True)
    installed({"url": _file_url(tmp_path / "vendor" / "harness"), "dir_info": {"editable": True}})
    assert installed_requirement(tmp_path).text == "./vendor/harness"


@pytest.mark.parametrize("origin, kind", [
    ({"archive_info": {}}, "wheel"),
    ({"dir_info": {"editable": True}}, "checkout"),
    ({"vcs_info": {"vcs": "git", "commit_id": "0123abcd"}}, "repository"),
], ids=["wheel", "editable-checkout", "local-git"])
def test_a_file_outside_the_project_is_written_with_a_warning(tmp_path, installed, origin, kind):
    elsewhere = tmp_path / "elsewhere" / ("seqkernel_harness-0.1.0-py3-none-any.whl" if kind == "wheel" else "harness")
    project = tmp_path / "project"
    project.mkdir()
    installed(dict(origin, url=_file_url(elsewhere)))
    req = installed_requirement(project)
    assert req.text.startswith(f"{DISTRIBUTION} @ ") and _file_url(elsewhere) in req.text
    assert req.warning is not None
    for words in ("cannot reach", "--requirement", "Commit", str(WORKFLOW_PATH.as_posix())):
        assert words in req.warning, req.warning
    if kind != "wheel":  # a folder: how to make the wheel to commit
        assert f"pip wheel --no-deps {elsewhere}" in req.warning


def test_a_remote_archive_is_named_by_its_url(tmp_path, installed):
    url = "https://example.org/dist/seqkernel_harness-0.1.0-py3-none-any.whl"
    installed({"url": url, "archive_info": {}})
    req = installed_requirement(tmp_path)
    assert req.text == f"{DISTRIBUTION} @ {url}" and req.warning is None


def test_an_explicit_requirement_wins_and_an_empty_one_is_refused(tmp_path, installed):
    from harness.errors import InvalidArgument

    installed({"url": _file_url(tmp_path / "elsewhere.whl"), "archive_info": {}})
    req = installed_requirement(tmp_path / "project", "seqkernel-harness @ git+https://x/y@v1")
    assert req.text == "seqkernel-harness @ git+https://x/y@v1" and req.warning is None
    with pytest.raises(InvalidArgument, match="--requirement=' ' is empty"):
        installed_requirement(tmp_path, " ")


def test_no_installed_distribution_falls_back_to_the_version_with_a_warning(tmp_path, monkeypatch):
    from harness import __version__

    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "distribution", missing)
    req = installed_requirement(tmp_path)
    assert req.text == f"{DISTRIBUTION}=={__version__}" and "--requirement" in (req.warning or "")


def _workflow_harness(root: Path) -> str:
    (line,) = [line for line in (root / WORKFLOW_PATH).read_text().splitlines() if line.strip().startswith("HARNESS:")]
    return json.loads(line.split(":", 1)[1])


def test_init_writes_the_requirement_into_the_workflow_and_warns_on_stderr(tmp_path, monkeypatch, capsys, installed):
    from harness.cli import main

    project = tmp_path / "project"
    project.mkdir()
    monkeypatch.chdir(project)
    wheel = tmp_path / "seqkernel_harness-0.1.0-py3-none-any.whl"
    installed({"url": _file_url(wheel), "archive_info": {}})
    assert main(["init", "--kernel", "k.py:f", "--family", "linear_scan"]) == 0
    out, err = capsys.readouterr()
    assert _workflow_harness(project) == f"{DISTRIBUTION} @ {_file_url(wheel)}"
    assert "warning" in err and "cannot reach" in err and "warning" not in out
    (project / "wheels").mkdir()
    inside = project / "wheels" / wheel.name
    installed({"url": _file_url(inside), "archive_info": {}})
    assert main(["init", "--force"]) == 0
    out, err = capsys.readouterr()
    assert _workflow_harness(project) == f"./wheels/{wheel.name}" and err == ""
    assert f"./wheels/{wheel.name}" in out
    assert main(["init", "--force", "--requirement", "seqkernel-harness==0.1.0"]) == 0
    assert _workflow_harness(project) == "seqkernel-harness==0.1.0" and capsys.readouterr().err == ""


# ------------------------------------------------------------------------------------------ .gitignore
def _git_ignores(root: Path, *paths: str) -> dict[str, bool]:
    """Which of ``paths`` (from ``root``) git itself ignores, by `git check-ignore` in a fresh repository."""
    if shutil.which("git") is None:
        pytest.skip("git is not installed here")
    if not (root / ".git").exists():
        subprocess.run(["git", "init", "-q", str(root)], check=True)
    out = subprocess.run(["git", "-C", str(root), "check-ignore", "--no-index", *paths],
                         capture_output=True, text=True).stdout.splitlines()
    return {path: path in out for path in paths}


def test_init_ignores_the_runs_folder_and_not_what_is_committed(tmp_path, monkeypatch, capsys, installed):
    from harness.cli import main

    installed(None)
    monkeypatch.chdir(tmp_path)
    assert main(["init", "--kernel", "k.py:f", "--family", "linear_scan"]) == 0
    out = capsys.readouterr().out
    assert ".gitignore" in out and ".harness/runs" in out
    project = load_project(tmp_path)
    runs = project.runs_dir.relative_to(tmp_path.resolve()).as_posix()
    committed = [d.relative_to(tmp_path.resolve()).as_posix()
                 for d in (project.counterexamples_dir, project.baseline_dir)]
    run_file = f"{runs}/check-1/records.jsonl"
    ignored = _git_ignores(tmp_path, run_file, *(f"{d}/x.json" for d in committed), "k.py")
    assert ignored == {run_file: True, **{f"{d}/x.json": False for d in committed}, "k.py": False}


def test_an_existing_gitignore_keeps_its_lines_and_gets_the_entry_once(tmp_path, installed):
    from harness.scaffold import init_project
    from harness.project import KernelEntry

    installed(None)
    original = b"__pycache__/\r\n*.egg-info/"  # CRLF, no newline at the end
    (tmp_path / ".gitignore").write_bytes(original)
    init_project(tmp_path, [KernelEntry("k.py:f", "linear_scan")])
    first = (tmp_path / ".gitignore").read_bytes()
    assert first.startswith(original + b"\r\n") and b"\n" not in first.replace(b"\r\n", b"")
    assert first.count(b"/.harness/runs/") == 1
    result = init_project(tmp_path, [KernelEntry("k.py:f", "linear_scan")], force=True)
    assert (tmp_path / ".gitignore").read_bytes() == first  # not added twice
    assert tmp_path.resolve() / ".gitignore" not in result.written and "already ignores" in " ".join(result.notes)


@pytest.mark.parametrize("line", [".harness/", "/.harness", ".harness/runs", "/.harness/runs/", "runs/"])
def test_a_line_that_already_ignores_the_runs_folder_is_enough(tmp_path, line):
    (tmp_path / "pyproject.toml").write_text('[tool.harness]\nruns = ".harness/runs"\n')
    (tmp_path / ".gitignore").write_text(f"{line}\n")
    written, note = ignore_runs(load_project(tmp_path))
    assert written is None and (tmp_path / ".gitignore").read_text() == f"{line}\n" and repr(line) in note


def test_a_similar_line_that_does_not_ignore_the_runs_folder_is_not_taken_for_it(tmp_path):
    (tmp_path / "pyproject.toml").write_text('[tool.harness]\nruns = ".harness/runs"\n')
    (tmp_path / ".gitignore").write_text("#.harness/\n!.harness/runs\nsub/.harness/\n")
    written, _ = ignore_runs(load_project(tmp_path))
    assert written is not None and (tmp_path / ".gitignore").read_text().endswith("/.harness/runs/\n")


@pytest.mark.parametrize("table, committed", [
    ('runs = "reports"\nbaseline = "reports/baseline"\ncounterexamples = "cases/cx"\n', ["reports/baseline"]),
    ('runs = "out"\nbaseline = "out/a/b"\ncounterexamples = "out/a/c"\n', ["out/a/b", "out/a/c"]),
], ids=["baseline-in-runs", "nested"])
def test_a_committed_folder_inside_the_runs_folder_stays_committed(tmp_path, table, committed):
    (tmp_path / "pyproject.toml").write_text(f"[tool.harness]\n{table}")
    project = load_project(tmp_path)
    written, _ = ignore_runs(project)
    assert written == tmp_path.resolve() / ".gitignore"
    runs = project.runs_dir.name
    paths = [f"{runs}/check-1/records.jsonl", *(f"{d}/records.jsonl" for d in committed)]
    if committed[0].count("/") > 1:
        paths.append("out/a/other/records.jsonl")  # beside a committed folder, inside the runs folder
    ignored = _git_ignores(tmp_path, *paths)
    assert ignored == {p: not any(p.startswith(d + "/") for d in committed) for p in paths}
    assert ignore_runs(load_project(tmp_path))[0] is None  # a second time: nothing added


def test_a_runs_folder_outside_the_project_is_not_ignored(tmp_path):
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "pyproject.toml").write_text('[tool.harness]\nruns = "../runs"\n')
    project = load_project(tmp_path / "p")
    assert runs_ignore_lines(project) == []
    written, note = ignore_runs(project)
    assert written is None and "outside the project" in note and not (tmp_path / "p" / ".gitignore").exists()


def test_a_runs_folder_with_glob_characters_is_ignored_literally(tmp_path):
    (tmp_path / "pyproject.toml").write_text('[tool.harness]\nruns = "runs[1]*"\n')
    ignore_runs(load_project(tmp_path))
    ignored = _git_ignores(tmp_path, "runs[1]*/x.json", "runs1x/x.json")
    assert ignored == {"runs[1]*/x.json": True, "runs1x/x.json": False}
    assert re.search(r"^/runs\\\[1\]\\\*/$", (tmp_path / ".gitignore").read_text(), re.M)
