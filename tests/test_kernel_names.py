"""A user kernel named by a file has one name however its path is typed and wherever the command runs.

Its name seeds its search, keys its gate cells and names its counterexample. A blind hunt (session 23) ran
`harness check` from a subfolder of the project, with ``./`` and with an absolute path: three names, and
against a baseline made from the root every cell of the user's kernels was "missing", so the gate passed
while the kernel was divergent; a saved case's replay worked only from the folder it was found in.
"""

from __future__ import annotations

import pytest

from harness.kernels.target import canonical_target, target_file
from tests.user_sources import LOOP_SCAN

KERNEL = LOOP_SCAN


@pytest.fixture
def project(tmp_path):
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "p"\n')
    (tmp_path / "kern").mkdir()
    (tmp_path / "kern" / "scan.py").write_text(KERNEL)
    return tmp_path


def test_every_spelling_of_a_project_file_is_one_target(project, monkeypatch):
    monkeypatch.chdir(project)
    spelled = ["kern/scan.py:scan", "./kern/scan.py:scan", f"{project}/kern/scan.py:scan"]
    monkeypatch.chdir(project / "kern")
    spelled += ["scan.py:scan", "../kern/scan.py:scan", "kern/scan.py:scan"]  # the last: from the root, as printed
    assert {canonical_target(t) for t in spelled} == {"kern/scan.py:scan"}
    assert target_file("kern/scan.py:scan") == project / "kern" / "scan.py"  # found from the subfolder
    outside = project.parent / "elsewhere.py:f"
    assert canonical_target(str(outside)) == str(outside)  # not the project's: as written
    assert canonical_target("pkg.mod:fn") == "pkg.mod:fn" and canonical_target("intree.blelloch_scan") == "intree.blelloch_scan"


def test_a_kernel_checked_from_a_subfolder_has_the_root_s_name_and_its_case_replays_anywhere(project, monkeypatch):
    from harness.api import check, user_kernel_spec
    from harness.cases import load_case

    monkeypatch.chdir(project)
    at_root = user_kernel_spec("./kern/scan.py:scan", family="linear_scan").name
    monkeypatch.chdir(project / "kern")
    assert user_kernel_spec("scan.py:scan", family="linear_scan").name == at_root == "user.kern/scan.py:scan"
    (project / "kern" / "bad.py").write_text(KERNEL + "\n\ndef bad(a, b):\n    return scan(a, b) * 1.01\n")
    result = check("bad.py:bad", family="linear_scan", dtypes=("float64",), max_examples=4, max_length=8,
                   grad=False, shrink_deadline_s=0, counterexample_dir=project / "cases", isolation="in-process")
    assert not result.passed and result.counterexample is not None
    case = load_case(result.counterexample)
    assert case.kernel_target == "kern/bad.py:bad" and "--kernel kern/bad.py:bad" in result.message
    monkeypatch.chdir(project)
    assert target_file(case.kernel_target).resolve() == (project / "kern" / "bad.py").resolve()


def test_a_file_of_a_package_imports_its_package_by_name(project, monkeypatch, tmp_path_factory):
    """``kern/uses_pkg.py`` doing ``from kern_s23.scan import scan`` failed every case as a file target
    (ModuleNotFoundError) and ran as a module target (blind hunt, session 23): its project's root is on the path."""
    import sys

    from harness.kernels.registry import resolve_target

    package = project / "kern_s23"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "scan.py").write_text(KERNEL)
    (package / "uses_pkg.py").write_text("from kern_s23.scan import scan\n\n\ndef wrapped(a, b):\n    return scan(a, b)\n")
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.chdir(tmp_path_factory.mktemp("elsewhere"))
    assert callable(resolve_target(f"{package}/uses_pkg.py:wrapped"))
    sys.modules.pop("kern_s23", None)
    sys.modules.pop("kern_s23.scan", None)



def test_the_searches_line_names_the_kernel_as_its_records_do(project, monkeypatch, capsys):
    """``searches:`` printed the target as typed (``scan.py:scan`` from the subfolder), while the records, the
    report and the Replay line named it from the root (verification 23)."""
    from harness.cli import main

    monkeypatch.chdir(project / "kern")
    code = main(["check", "--kernel", "scan.py:scan", "--family", "linear_scan", "--dtypes", "float64",
                 "--max-examples", "2", "--max-length", "8", "--no-grad", "--in-process",
                 "--report-dir", str(project / "run"), "--cases-dir", str(project / "cases")])
    searches = capsys.readouterr().out.split("\nsearches:\n")[1].splitlines()
    assert code == 0 and searches[0].startswith("  kern/scan.py:scan float64: passed"), searches


def test_a_case_replayed_from_outside_its_project_says_its_path_is_the_project_s(project, monkeypatch, capsys,
                                                                                    tmp_path_factory):
    """From outside the project, replay said only "file 'kern/scan.py' does not exist" (blind hunt 23b, P14)."""
    import json

    from harness.cli import main
    from harness.problems import Problem

    case = project / "case.json"
    case.write_text(json.dumps({"kernel": "user.kern/scan.py:scan", "kernel_target": "kern/scan.py:scan",
                                "family": "linear_scan", "expect": "equivalent",
                                "problem": Problem("linear_scan", 4, dtype="float64").to_dict()}))
    elsewhere = tmp_path_factory.mktemp("elsewhere")
    monkeypatch.chdir(elsewhere)
    assert main(["replay", str(case), "--trust-case-file", "--in-process"]) == 2
    err = capsys.readouterr().err
    assert ("file 'kern/scan.py' is not found; a case names its kernel's file relative to the root of the project it "
            f"was saved in (the folder holding its pyproject.toml), and the project root here is {str(elsewhere)!r}: "
            "run the replay from inside that project, or pass --kernel PATH.py:scan") in err, err
    assert main(["replay", str(case), "--kernel", f"{project}/kern/scan.py:scan", "--in-process"]) == 0


@pytest.mark.e2e
def test_a_function_of_an_importable_module_is_named_by_its_module(tmp_path, monkeypatch):
    """``harness.check(scan)`` for two functions named ``scan`` of two modules gave both the name ``user.scan``
    (one counterexample file, one report row), and its replay command ``--kernel user.scan`` found neither
    (a blind hunt, session 27). Named ``module:qualname`` now, the target that replays them."""
    import importlib
    import subprocess
    import sys

    from harness.api import check, user_kernel_spec

    (tmp_path / "right_scans.py").write_text(KERNEL)
    (tmp_path / "wrong_scans.py").write_text(KERNEL.replace("return", "return 2 *", 1))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    right, wrong = (importlib.import_module(m).scan for m in ("right_scans", "wrong_scans"))
    assert right.__qualname__ == wrong.__qualname__ == "scan"
    names = {user_kernel_spec(f, family="linear_scan").name for f in (right, wrong)}
    assert names == {"user.right_scans:scan", "user.wrong_scans:scan"}
    assert ":" not in user_kernel_spec(lambda a, b: a, family="linear_scan").name  # a lambda has no module target
    result = check(wrong, family="linear_scan", profile="ci", dtypes=("float32",), max_examples=3, grad=False,
                   counterexample_dir=tmp_path / "cases", shrink_deadline_s=0)
    assert not result.passed and result.failure["kernel"] == "user.wrong_scans:scan"
    saved = next((tmp_path / "cases").glob("*.json"))
    done = subprocess.run([sys.executable, "-m", "harness", "replay", str(saved), "--kernel", "wrong_scans:scan"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert "got 'divergent'" in done.stdout + done.stderr, done.stdout + done.stderr
