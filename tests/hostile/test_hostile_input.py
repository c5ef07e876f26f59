"""Hostile input: bad arguments, malformed files, a case file that names code, names that are markup.

Each usage error must exit 2 with ``harness: error:`` (or argparse's ``error:``) naming the argument,
its value and what was expected, and never a traceback; where a run directory is involved, the records
already in it must be untouched. The CLI runs in this process (`harness.cli.main`), so these are fast.
"""

from __future__ import annotations

import json
import re
import shlex
import textwrap
from pathlib import Path

import pytest

from harness.api import database_key, user_kernel_spec
from harness.cases import load_case, save_counterexample
from harness.cli import main
from harness.problems import Problem
from harness.runner import replay_command, run_case
from harness.store import load_records

pytestmark = pytest.mark.e2e  # end to end: `make test-all`

KERNELS = Path(__file__).resolve().parent / "kernels.py"


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    try:
        code = main(list(argv))
    except SystemExit as exc:  # argparse's usage errors
        code = exc.code
    out, err = capsys.readouterr()
    assert "Traceback" not in err, err
    return code, out, err


def check_args(tmp_path: Path, *extra: str, kernel: str = f"{KERNELS}:correct") -> list[str]:
    return ["check", "--kernel", kernel, "--family", "linear_scan", "--profile", "ci", "--dtypes", "float32",
            "--max-length", "16", "--max-examples", "2", "--report-dir", str(tmp_path / "run"),
            "--cases-dir", str(tmp_path / "cases"), "--no-grad", *extra]  # forward records only: counted below


@pytest.mark.parametrize("source, says", [
    ("import no_such_package_for_harness_tests\ndef k(a, b): return b\n", "ModuleNotFoundError"),
    ("def k(a, b) return b\n", "SyntaxError"),
    ("raise RuntimeError('needs a GPU at import')\ndef k(a, b): return b\n", "RuntimeError: needs a GPU at import"),
    ("import sys\nsys.exit(4)\n", "SystemExit"),
], ids=["ImportError", "SyntaxError", "raises", "sys.exit"])
def test_a_kernel_file_that_fails_to_import_is_a_usage_error(tmp_path, capsys, source, says):
    path = tmp_path / "user_kernel.py"
    path.write_text(source)
    code, _, err = run_cli(capsys, *check_args(tmp_path, kernel=f"{path}:k"))
    assert code == 2, err
    assert f"kernel='{path}:k'" in err and says in err, err
    assert not (tmp_path / "run").exists()  # nothing was started


@pytest.mark.parametrize("argv, says", [
    (["--max-examples", "-3"], "--max-examples=-3 must be >= 1"),
    (["--max-examples", "0"], "--max-examples=0 must be >= 1"),
    (["--max-length", "0"], "--max-length=0 must be >= 1"),
    (["--dtypes", ""], "--dtypes='' names no dtype"),
    (["--dtypes", "float32,"], "names no dtype"),
    (["--dtypes", "float33"], "float33"),
    (["--timeout", "0"], "timeout='0' must be a finite number of seconds > 0"),
    (["--timeout", "soon"], "timeout='soon' is not a number"),
    (["--shard", "-1/2"], "--shard='-1/2': expected K/N"),  # was argparse's "expected one argument"
], ids=["max-examples-negative", "max-examples-0", "max-length-0", "dtypes-empty", "dtypes-trailing-comma",
        "dtypes-unknown", "timeout-0", "timeout-text", "shard-negative"])
def test_a_limit_that_would_silently_mean_the_default_is_a_usage_error(tmp_path, capsys, argv, says):
    args = check_args(tmp_path)
    for flag, value in zip(argv[::2], argv[1::2]):  # replace the default value of the flag under test
        if flag in args:
            args[args.index(flag) + 1] = value
        else:
            args += [flag, value]
    code, _, err = run_cli(capsys, *args)
    assert code == 2 and says in err, err


@pytest.mark.parametrize("where", ["k.py", "k.py/run"])
def test_a_report_dir_that_is_a_file_is_a_usage_error(tmp_path, capsys, monkeypatch, where):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "k.py").write_text("x = 1\n")
    args = check_args(tmp_path)
    args[args.index("--report-dir") + 1] = where
    code, _, err = run_cli(capsys, *args)  # was a FileExistsError traceback, exit 1
    assert code == 2 and "'k.py' is a file, not a directory" in err, err
    code, _, err = run_cli(capsys, "merge", "a", "b", "--out", where)  # was NotADirectoryError
    assert code == 2 and f"--out={where!r}: 'k.py' is a file, not a directory" in err, err
    assert (tmp_path / "k.py").read_text() == "x = 1\n"


def test_check_validates_its_limits_from_python_too():
    from harness.api import check
    from harness.errors import InvalidArgument

    for kwargs in ({"max_examples": 0}, {"max_length": -1}, {"dtypes": ()}, {"timeout_s": -1.0}):
        with pytest.raises(InvalidArgument):
            check("intree.blelloch_scan", **kwargs)


def test_check_reads_dtypes_and_profiles_as_a_user_writes_them():
    from harness.api import check, dtype_names
    from harness.errors import InvalidArgument

    import torch

    # a string is one dtype or a comma-separated list, never its letters; torch dtypes are taken too
    assert dtype_names("float32") == ("float32",) and dtype_names("float32, bfloat16") == ("float32", "bfloat16")
    assert dtype_names(torch.float16) == ("float16",) and dtype_names([torch.float64, "float32"]) == ("float64",
                                                                                                      "float32")
    got = check("intree.blelloch_scan", dtypes="bfloat16", max_examples=2, grad=False, max_length=16)
    assert {r["dtype"] for r in got.records} == {"bfloat16"}
    for kwargs, says in (({"dtypes": "float8"}, "dtypes=['float8'] contains ['float8']"),
                         ({"dtypes": [3]}, "dtypes contains 3, a int"),
                         ({"profile": "weekly"}, "profile='weekly' is not a profile; expected one of ['dev', 'ci', "
                                                 "'nightly']"),
                         ({"family": "retention"}, "kernel 'intree.blelloch_scan' is registered in family "
                                                   "'linear_scan'")):
        with pytest.raises(InvalidArgument, match=re.escape(says)):
            check("intree.blelloch_scan", **kwargs)
    with pytest.raises(InvalidArgument, match="neither a registered kernel .* nor a target"):
        check("intree.no_such_kernel")


def test_run_case_refuses_a_kernel_of_another_family_and_takes_a_registered_name():
    from harness.errors import InvalidArgument
    from harness.kernels.registry import get

    scan = Problem(family="linear_scan", length=5, seed=3)
    with pytest.raises(InvalidArgument, match="'intree.retention_parallel' is a retention kernel; "
                                              "problem.family='linear_scan'"):
        run_case(get("intree.retention_parallel"), scan)  # was a kernel_error: retention's call on a scan's inputs
    assert run_case("intree.blelloch_scan", scan)["verdict"] == "equivalent"
    with pytest.raises(InvalidArgument, match="expected a KernelSpec or a registered kernel's name"):
        run_case(len, scan)


def _script(tmp_path: Path, guarded: bool) -> Path:
    body = textwrap.dedent("""
        import harness
        from harness.kernels.blelloch import blelloch_linear_scan


        def my_scan(a, b):
            return blelloch_linear_scan(a, b)


        if __name__ == "__main__" or UNGUARDED:
            r = harness.check(my_scan, family="linear_scan", max_examples=3, grad=False, dtypes="float32",
                              max_length=16, save_counterexample=False)
            print("RESULT", [(x["verdict"], x["isolation"], x["kernel"]) for x in r.records])
            print("ERROR", r.records[0].get("error"))
    """).replace("UNGUARDED", str(not guarded))
    path = tmp_path / ("guarded.py" if guarded else "unguarded.py")
    path.write_text(body)
    return path


def _python(tmp_path: Path, *argv: str) -> str:
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ, PYTHONPATH=str(root) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("HARNESS_ISOLATION", None)
    proc = subprocess.run([sys.executable, *argv], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def test_a_function_of_the_script_being_run_is_checked_in_a_worker(tmp_path):
    """``python my_check.py`` with ``harness.check(my_scan, ...)``: a worker cannot find ``__main__.my_scan``
    (it does not run the caller's script; this was a PicklingError out of check), so it loads the script by
    its file, where the ``__main__`` block does not run."""
    out = _python(tmp_path, str(_script(tmp_path, guarded=True)))
    assert "RESULT [('equivalent', 'process', 'user.guarded.py:my_scan')" in out and out.count("equivalent") == 3


def test_a_script_that_checks_at_its_top_level_is_told_to_guard_it(tmp_path):
    """Unguarded, the worker's import of the script would start a check of its own (and workers, each
    importing the script again): it is refused with the advice, and the search ends at its first case."""
    out = _python(tmp_path, str(_script(tmp_path, guarded=False)))
    assert "RESULT [('kernel_error', 'process', 'user.unguarded.py:my_scan')]" in out, out
    assert 'put that call under `if __name__ == "__main__":`' in out and "could not load the kernel" in out


def test_a_function_of_python_c_runs_in_process_and_says_why(tmp_path):
    source = _script(tmp_path, guarded=True).read_text()
    out = _python(tmp_path, "-c", source)
    assert "'in-process: a function of __main__ with no script file to load it from" in out
    assert out.count("'equivalent'") == 3


def _record(tmp_path: Path) -> dict:
    from harness.kernels.registry import get

    return run_case(get("intree.blelloch_scan"), Problem(family="linear_scan", length=5, seed=3))


def _edited_case(edit) -> bytes:
    """A saved case's JSON (`save_counterexample`'s fields) with ``edit`` applied to its problem, as a hand edit."""
    problem = Problem(family="linear_scan", length=2, dtype="float64", seed=1).to_dict()
    edit(problem)
    return json.dumps({"kernel": "intree.blelloch_scan", "kernel_target": None, "family": "linear_scan",
                       "expect": "equivalent", "problem": problem}).encode()


@pytest.mark.parametrize("content, says", [
    (b'{"kernel": "intree.blelloch_scan", "problem": {"family": "linear_scan", "length": 5}}\xff\xfe', "not UTF-8"),
    (json.dumps({"kernel": "intree.blelloch_scan", "problem": {"family": "selective_scan", "length": 5,
                                                               "groups": "x"}}).encode(), "problem is not valid"),
    (json.dumps({"kernel": "intree.blelloch_scan", "problem": "x"}).encode(), "expected a JSON object"),
    (json.dumps([1, 2]).encode(), "holds a JSON list"),
    (b"{not json", "cannot be read as JSON"),
    (json.dumps({"kernel": 3, "problem": {"family": "linear_scan", "length": 5}}).encode(), "kernel=3 is not a string"),
    (json.dumps({"kernel": "intree.blelloch_scan", "problem": {"family": "linear_scan", "length": 10**9}}).encode(),
     "the problem is too large: its inputs (a (1, 4, 1000000000), b (1, 4, 1000000000)) hold 8,000,000,000"),
    (json.dumps({"kernel": "intree.blelloch_scan", "problem": {"family": "linear_scan", "length": 16,
                                                              "batch": 10**8, "dim": 10**4}}).encode(),
     "more than MAX_PROBLEM_ELEMENTS"),
    (json.dumps({"kernel": "intree.blelloch_scan", "problem": {"family": "linear_scan", "length": 5,
                                                              "seed": 2**80}}).encode(),
     "seed=1208925819614629174706176 must be an integer from 0 to 2**63 - 1"),
    (json.dumps({"kernel": "intree.blelloch_scan", "problem": {"family": "linear_scan", "length": True}}).encode(),
     "length=True must be a positive integer"),
    (json.dumps({"kernel": "intree.blelloch_scan", "problem": {"family": "linear_scan", "length": 1, "batch": 1,
                                                              "dim": 1, "values": {"a": ["x"], "b": [1.0]}}}).encode(),
     "values['a'] holds 'x'; expected real numbers only"),
    (json.dumps({"kernel": "intree.gla_chunk", "problem": {"family": "gla", "length": 16, "chunk_size": 4,
                                                          "cu_seqlens": [0, "8", 16]}}).encode(),
     "cu_seqlens=[0, '8', 16] must be a list of integers"),
    (json.dumps({"kernel": "intree.blelloch_scan", "family": "ssd",
                 "problem": {"family": "linear_scan", "length": 5}}).encode(),
     "family='ssd' but its problem's family is 'linear_scan'"),
    (_edited_case(lambda p: p.pop("dtype")), "its problem has no ['dtype']"),  # was replayed as float32
    (_edited_case(lambda p: p.update(tf32="yes")), "tf32='yes' is a str; expected true or false"),
    (_edited_case(lambda p: p.update(delta_softplus="no")), "delta_softplus='no' is a str; expected true or false"),
    (_edited_case(lambda p: p.update(tf32=2)), "tf32=2 is a int; expected true or false"),
    (_edited_case(lambda p: None).replace(b'"expect": "equivalent"', b'"expect": "great"'),
     "expect='great'; expected one of ['equivalent', 'divergent', 'out_of_domain', 'kernel_error']"),
    (_edited_case(lambda p: None).replace(b'"expect"', b'"grad_of": "zzz", "expect"'),
     "grad_of='zzz' is not an input whose gradient the family 'linear_scan' takes; expected one of ['a', 'b']"),
], ids=["not-utf8", "groups-x", "problem-string", "list", "not-json", "kernel-not-string", "length-1e9",
        "batch-1e8", "seed-2-80", "length-true", "values-string", "cu_seqlens-string", "family-disagrees",
        "no-dtype", "tf32-string", "softplus-string", "tf32-number", "expect-not-a-verdict", "grad_of-unknown"])
def test_a_malformed_case_file_is_a_usage_error(tmp_path, capsys, content, says):
    path = tmp_path / "case.json"
    path.write_bytes(content)
    code, _, err = run_cli(capsys, "replay", str(path))
    assert code == 2 and says in err and str(path) in err, err


def test_a_gradient_case_whose_forward_diverges_says_its_gradient_was_not_taken(tmp_path, capsys):
    """A gradient's case replayed against a kernel whose forward diverges showed the forward's record as if it
    were the gradient's, its grad_of unmentioned ("zzz" there was not even refused; verification 23, P11)."""
    path = tmp_path / "case.json"
    path.write_bytes(_edited_case(lambda p: None).replace(b'"expect"', b'"grad_of": "a", "expect"'))
    code, out, err = run_cli(capsys, "replay", str(path), "--kernel", f"{KERNELS}:returns_b")
    assert code == 1 and "verdict: divergent" in out, out + err
    assert ("the gradient of a was not taken: the forward is divergent on this case, and a gradient is checked "
            "only where the forward is equivalent") in out, out


def test_a_case_file_whose_values_name_an_input_the_problem_does_not_take_is_a_usage_error(tmp_path, capsys):
    """An extra input in ``values`` was ignored: the case replayed "equivalent" (blind hunt 23b, P11)."""
    path = tmp_path / "case.json"
    path.write_bytes(_edited_case(lambda p: p.update(batch=1, dim=1, values={"a": [0.5, 0.5], "b": [1.0, 1.0],
                                                                              "c": [2.0, 2.0]})))
    code, _, err = run_cli(capsys, "replay", str(path))
    assert code == 2 and "values has inputs ['c'] the problem does not take; expected exactly ['a', 'b']" in err, err


def test_a_malformed_problem_option_is_a_usage_error(capsys):
    code, _, err = run_cli(capsys, "replay", "--kernel", "intree.blelloch_scan", "--problem", "{oops")
    assert code == 2 and "--problem" in err, err
    code, _, err = run_cli(capsys, "replay", "--kernel", "intree.blelloch_scan", "--problem", "[1]")
    assert code == 2 and "expected a JSON object" in err, err


def test_a_records_line_that_is_json_but_not_an_object_is_named(tmp_path, capsys):
    from harness.store import dumps

    run = tmp_path / "run"
    run.mkdir()
    (run / "records.jsonl").write_text(dumps(_record(tmp_path)) + "\n[1, 2, 3]\n")
    code, _, err = run_cli(capsys, "report", str(run))
    assert code == 2 and "line 2" in err and "expected one JSON object per line" in err, err
    (run / "records.jsonl").write_text(dumps(_record(tmp_path)) + '\n{"kernel": "cut sho')  # a crash's cut line
    assert len(load_records(run)) == 1  # is still skipped, the complete line kept
    assert "line 2 is cut short" in capsys.readouterr().err  # and said
    from harness.store import RunStore

    with RunStore(run) as store:  # --append after the killed run: the cut line goes, the next record is whole
        store.append(_record(tmp_path))
    assert len(load_records(run)) == 2


@pytest.mark.parametrize("damage, says", [
    (lambda line: '{not json\n' + line, "line 1 is not JSON"),  # anywhere but a cut last line: was skipped
    (lambda line: line + "{not json\n", "line 2 is not JSON"),  # a last line with its newline was written whole
    (lambda line: json.dumps({k: v for k, v in json.loads(line).items() if k not in ("kernel", "verdict")}) + "\n",
     "line 1: kernel=None, verdict=None; expected every record to carry ['kernel', 'verdict', 'dtype']"),
    (lambda line: json.dumps(dict(json.loads(line), dtype=5)) + "\n", "line 1: dtype=5; expected"),
    (lambda line: json.dumps(dict(json.loads(line), length="long")) + "\n",
     "line 1: length='long' must be a positive integer; a report and a gate key their cells on it"),
], ids=["garbage-first", "garbage-last-whole", "missing-kernel-verdict", "dtype-number", "length-text"])
def test_a_damaged_records_file_is_a_usage_error_naming_the_line(tmp_path, capsys, damage, says):
    """Such lines were skipped or read as records without a word: the report and the gate passed, a divergent
    baseline cell turned "missing" (blind hunt 23b, P4)."""
    from harness.store import dumps

    run = tmp_path / "run"
    run.mkdir()
    (run / "records.jsonl").write_text(damage(dumps(_record(tmp_path)) + "\n"))
    code, _, err = run_cli(capsys, "report", str(run), "--out", str(tmp_path / "out"))
    assert code == 2 and says in err and str(run / "records.jsonl") in err, err


@pytest.mark.parametrize("header, says", [('{"device": ', "is not readable JSON"), ("[1, 2]", "holds a JSON list")],
                         ids=["cut", "list"])
def test_a_damaged_run_header_is_a_usage_error(tmp_path, capsys, header, says):
    """A JSONDecodeError or AttributeError traceback in report, merge and gate, exit 1 (blind hunt 23b, P7)."""
    from harness.store import dumps

    run = tmp_path / "run"
    run.mkdir()
    (run / "records.jsonl").write_text(dumps(_record(tmp_path)) + "\n")
    (run / "run.json").write_text(header)
    for argv in (["report", str(run), "--out", str(tmp_path / "out")], ["merge", str(run), "--out", str(tmp_path / "m")]):
        code, _, err = run_cli(capsys, *argv)
        assert code == 2 and f"run header {str(run / 'run.json')!r} {says}" in err, (argv, err)


def test_an_output_that_cannot_be_written_is_a_usage_error_naming_it(tmp_path, capsys, monkeypatch):
    """A read-only or blocked output path was a traceback, exit 1: "divergent" to a CI step (blind hunt 23b, P6).
    Root writes through chmod, so a file in the way and a store that raises EROFS stand in for a read-only mount."""
    import errno

    from harness import store as store_module
    from harness.store import RunStore, dumps

    run = tmp_path / "run"
    run.mkdir()
    (run / "records.jsonl").write_text(dumps(_record(tmp_path)) + "\n")
    afile = tmp_path / "afile"
    afile.write_text("")
    code, _, err = run_cli(capsys, "report", str(run), "--out", str(afile))
    assert code == 2 and f"--out={str(afile)!r}: cannot write" in err, err
    code, _, err = run_cli(capsys, "update-baseline", str(run), "--baseline", str(afile / "sub"))
    assert code == 2 and f"--baseline={str(afile / 'sub')!r}: cannot write" in err, err

    def read_only(self, run_dir, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system", str(Path(run_dir) / "run.json"))
    monkeypatch.setattr(RunStore, "__init__", read_only)
    assert store_module.RunStore is RunStore
    code, _, err = run_cli(capsys, *check_args(tmp_path / "ro"))
    assert code == 2 and f"--report-dir={str(tmp_path / 'ro' / 'run')!r}: cannot write" in err, err
    assert "Read-only file system" in err


def test_a_counterexample_that_cannot_be_saved_leaves_the_failure_whole(tmp_path, capsys, monkeypatch):
    """A read-only --cases-dir was a traceback that lost the failure's message, the searches lines and the
    report (blind hunt 23b, P6): the failure is the finding, the file only a copy of it."""
    import errno

    import harness.cases

    def read_only(record, problem, *, directory=None, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system", str(directory))
    monkeypatch.setattr(harness.cases, "save_counterexample", read_only)
    buggy = tmp_path / "buggy.py"
    buggy.write_text("def k(a, b):\n    return b.clone()  # forgets the decay: wrong from the second step\n")
    code, out, err = run_cli(capsys, *check_args(tmp_path, kernel=f"{buggy}:k"))
    assert code == 1, err
    assert "The counterexample could not be saved" in out and "Read-only file system" in out, out
    assert "harness replay --kernel" in out.split("could not be saved")[1]  # the way to replay it without the file
    assert "searches:" in out and "divergent" in out.split("searches:")[1], out
    assert (tmp_path / "run" / "index.md").is_file()


def test_check_checks_every_kernel_given(tmp_path, capsys):
    """`check --kernel A --family F --kernel B --family F` checked B alone, without a word (blind hunt 23b, P9)."""
    buggy = tmp_path / "buggy.py"
    buggy.write_text("def k(a, b):\n    return b.clone()\n")
    argv = check_args(tmp_path) + ["--kernel", f"{buggy}:k", "--family", "linear_scan"]
    code, out, err = run_cli(capsys, *argv)
    assert code == 1, err
    searches = out.split("searches:")[1]
    from harness.kernels.target import canonical_target  # as the records name them (root-relative in the project)

    assert f"{canonical_target(f'{KERNELS}:correct')} float32: passed" in searches, out
    assert f"{canonical_target(f'{buggy}:k')} float32: divergent" in searches, out
    code, _, err = run_cli(capsys, *argv, "--family", "linear_scan")
    assert code == 2 and "--family is given 3 times for 2 --kernel" in err, err


@pytest.mark.parametrize("text, says", [
    ('kernels = ["intree.blelloch_scan"\n[grid]\nlength = [4]\n', "is not valid TOML"),
    ('kernels = ["intree.blelloch_scan"]\nkernals = ["x"]\n[grid]\nlength = [4]\n', "unknown key(s) ['kernals']"),
    ('kernels = ["intree.blelloch_scan"]\n[grid]\nlenght = [4]\n', "unknown key(s) ['lenght']"),
    ('kernels = ["intree.blelloch_scan"]\n[grid]\nlength = ["long"]\n', "length='long'"),
    ('kernels = ["intree.blelloch_scan"]\n[grid]\nlength = []\n', "empty"),
    ('[[group]]\nkernels = ["intree.no_such"]\n[group.grid]\nlength = [4]\n', "intree.no_such"),
    ('kernels = ["intree.blelloch_scan"]\n[grid]\nlength = [4, 8, "long"]\n', "length='long'"),
    ('kernels = ["intree.blelloch_scan"]\n[grid]\nlength = [16, 1000000000]\n', "the problem is too large"),
], ids=["syntax", "unknown-top-key", "unknown-grid-key", "wrong-type", "empty-axis", "unknown-kernel",
        "wrong-type-last", "too-large-last"])
def test_a_malformed_sweep_file_is_a_usage_error(tmp_path, capsys, text, says):
    path = tmp_path / "mine.toml"
    path.write_text(text)
    code, _, err = run_cli(capsys, "sweep", str(path), "--report-dir", str(tmp_path / "run"))
    assert code == 2 and says in err and str(path) in err, err
    assert not (tmp_path / "run").exists()


def test_diff_of_missing_or_empty_directories_is_a_usage_error(tmp_path, capsys):
    code, _, err = run_cli(capsys, "diff", str(tmp_path / "nope-a"), str(tmp_path / "nope-b"))
    assert code == 2 and "base=" in err and "is not a directory" in err, err
    (tmp_path / "empty").mkdir()
    code, _, err = run_cli(capsys, "diff", str(tmp_path / "empty"), str(tmp_path / "empty"))
    assert code == 2 and "holds no records" in err, err


def test_a_reused_report_dir_is_refused_unless_append(tmp_path, capsys):
    code, _, err = run_cli(capsys, *check_args(tmp_path))
    assert code == 0, err
    first = (tmp_path / "run" / "records.jsonl").read_text()
    assert len(first.splitlines()) == 2
    code, _, err = run_cli(capsys, *check_args(tmp_path))
    assert code == 2 and "--report-dir=" in err and "--append" in err, err
    assert (tmp_path / "run" / "records.jsonl").read_text() == first  # the earlier run is untouched
    code, out, err = run_cli(capsys, *check_args(tmp_path, "--append"))
    assert code == 0, err
    assert len(load_records(tmp_path / "run")) == 4 and "**4 cases**" in out


def test_counterexample_names_cannot_collide(tmp_path):
    problem = Problem(family="linear_scan", length=3, seed=1)
    stem = "user." + "k" * 90
    paths = []
    for suffix in ("_a", "_b", "/a", ":a"):  # same first 80 characters, or the same once slugged
        record = {"kernel": stem + suffix, "verdict": "divergent"}
        paths.append(save_counterexample(record, problem, directory=tmp_path))
    assert len(set(paths)) == 4 and all(p.is_file() for p in paths)
    assert [load_case(p).kernel for p in paths] == [stem + s for s in ("_a", "_b", "/a", ":a")]
    again = save_counterexample({"kernel": stem + "_a"}, problem.replace(length=2), directory=tmp_path)
    assert again == paths[0]  # one kernel keeps one file: a smaller case replaces the earlier one


def test_replay_never_imports_what_a_case_file_names_unless_told(tmp_path, capsys):
    marker = tmp_path / "imported.txt"
    evil = tmp_path / "evil.py"
    evil.write_text(textwrap.dedent(f'''
        from pathlib import Path
        Path({str(marker)!r}).write_text("this ran")
        from harness.kernels.blelloch import blelloch_linear_scan as k
    '''))
    target = f"{evil}:k"
    case = save_counterexample({"kernel": f"user.{target}"}, Problem(family="linear_scan", length=4, seed=1),
                               directory=tmp_path / "cases", kernel_target=target)
    code, _, err = run_cli(capsys, "replay", str(case))
    assert code == 2 and "--trust-case-file" in err and f"--kernel {target}" in err, err
    assert not marker.exists(), "replay imported the file a case file names"
    code, out, err = run_cli(capsys, "replay", str(case), "--kernel", target)
    assert code == 0 and "equivalent" in out and marker.exists(), err


def test_a_user_kernels_replay_line_names_its_target_quoted(tmp_path, capsys):
    folder = tmp_path / "my kernels; rm -rf ~"
    folder.mkdir()
    (folder / "k.py").write_text("from harness.kernels.blelloch import blelloch_linear_scan as scan\n")
    spec = user_kernel_spec(f"{folder / 'k.py'}:scan", family="linear_scan")
    line = replay_command(spec, Problem(family="linear_scan", length=4, seed=2))
    argv = shlex.split(line)
    assert argv[:4] == ["harness", "replay", "--kernel", f"{folder / 'k.py'}:scan"], line
    code, out, err = run_cli(capsys, *argv[1:])
    assert code == 0 and "equivalent" in out, err


def test_names_are_escaped_in_the_markdown_report(tmp_path):
    from harness.report import write_report

    record = dict(_record(tmp_path), kernel="<img src=x onerror=alert(1)>|`x`[y](z)")
    write_report([record], {}, tmp_path / "report", plots=False)
    index = (tmp_path / "report" / "index.md").read_text()
    assert "<img" not in index and "&lt;img src=x onerror=alert(1)&gt;\\|\\`x\\`\\[y\\](z)" in index


def test_each_kernel_has_its_own_example_database_key():
    from harness.kernels.registry import get

    a, b = get("intree.blelloch_scan"), get("intree.sequential_scan")
    assert database_key(a, None) != database_key(b, None)
    assert database_key(a, None) == database_key(a, None)
    assert database_key(a, None) != database_key(a, "x.py:fn")


def test_a_file_kernel_draws_the_same_cases_wherever_its_checkout_lies(tmp_path):
    """The derandomized (ci) seed of a kernel from a file depends on the file's name, not its directory:
    a wrong kernel found in one clone is found in the next (CI's clean clone drew different cases from
    a pytest tmp_path and missed nothing only by luck)."""
    from harness.api import derandomized_seed

    specs = []
    for where in ("one", "two/deeper"):
        path = tmp_path / where / "my_scans.py"
        path.parent.mkdir(parents=True)
        path.write_text("def scan(a, b):\n    return b\n")
        target = f"{path}:scan"
        specs.append((user_kernel_spec(target, family="linear_scan"), target))
    (a, ta), (b, tb) = specs
    assert a.name != b.name and derandomized_seed(a, ta) == derandomized_seed(b, tb)
    assert database_key(a, ta) == database_key(b, tb)
    other = tmp_path / "one" / "other.py"
    other.write_text("def scan(a, b):\n    return b\n")
    assert database_key(a, ta) != database_key(user_kernel_spec(f"{other}:scan", family="linear_scan"),
                                               f"{other}:scan")


def test_a_search_skips_draws_too_large_to_hold(monkeypatch):
    """Under a max_length far beyond the profiles' (`harness check --max-length 1000000000`), a draw whose
    inputs exceed `MAX_PROBLEM_ELEMENTS` is skipped, not an error in the middle of the search."""
    from hypothesis import HealthCheck, given, settings

    import harness.problems
    from harness.kernels.registry import get
    from harness.strategies import problems

    monkeypatch.setattr(harness.problems, "MAX_PROBLEM_ELEMENTS", 2000)
    sizes = []

    @settings(max_examples=100, derandomize=True, database=None, deadline=None,
              suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow])
    @given(problems(get("intree.blelloch_scan"), max_length=4096, profile="ci", explicit=False))
    def search(problem):
        sizes.append(problem.n_elements())

    search()
    assert len(sizes) == 100 and max(sizes) <= 2000
    with pytest.raises(harness.problems.ProblemTooLarge, match="MAX_PROBLEM_ELEMENTS = 2,000"):
        Problem(family="linear_scan", length=4096, batch=1, dim=4)


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="a CUDA device is present")
def test_a_cuda_case_on_a_machine_without_cuda_is_a_usage_error(tmp_path, capsys):
    path = tmp_path / "case.json"
    path.write_text(json.dumps({"kernel": "intree.blelloch_scan",
                                "problem": Problem(family="linear_scan", length=16, device="cuda").to_dict()}))
    code, _, err = run_cli(capsys, "replay", str(path))
    assert code == 2 and "device='cuda' but this machine has no CUDA device" in err, err


@pytest.mark.parametrize("device, says", [("tpu", "must be 'cpu' or 'cuda[:n]'"), ("cuda:x", "must be 'cpu' or 'cuda[:n]'"),
                                          ("cuda:7", "")])
def test_a_device_is_validated_before_the_search(device, says):
    """An unknown device, and a CUDA one this machine lacks, are named as such (was: 'runs none of dtypes')."""
    import torch

    from harness.api import check
    from harness.errors import InvalidArgument

    if device == "cuda:7":
        says = ("has no CUDA device" if not torch.cuda.is_available()
                else f"has {torch.cuda.device_count()} CUDA device(s)")
    with pytest.raises(InvalidArgument, match=re.escape(says)):
        check("intree.blelloch_scan", device=device, max_examples=1)


def test_a_kernel_file_imports_its_siblings_and_a_module_is_found_in_the_working_directory(tmp_path, monkeypatch):
    """As `python file.py` and `python -m` would: a helper module beside the kernel file, and a module
    target named from the kernel repository's root without installing it."""
    import sys

    from harness.kernels.registry import resolve_target

    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    monkeypatch.chdir(tmp_path)
    (tmp_path / "kern").mkdir()
    (tmp_path / "kern" / "helpers_7f3a.py").write_text("def scale(x):\n    return x\n")
    (tmp_path / "kern" / "main_7f3a.py").write_text("from helpers_7f3a import scale\n\ndef fn(a, b):\n    return scale(b)\n")
    (tmp_path / "rootmod_7f3a.py").write_text("def fn(a, b):\n    return b\n")
    assert resolve_target(str(tmp_path / "kern" / "main_7f3a.py") + ":fn").__name__ == "fn"
    assert resolve_target("rootmod_7f3a:fn").__name__ == "fn"
    for name in ("helpers_7f3a", "rootmod_7f3a"):
        sys.modules.pop(name, None)


@pytest.mark.parametrize("source, says", [
    ("import os\nos._exit(7)\n", "worker process exited with code 7"),
    ("raise KeyboardInterrupt\n", "KeyboardInterrupt"),
], ids=["os._exit", "KeyboardInterrupt"])
def test_a_kernel_file_that_ends_its_process_at_import_is_a_usage_error_not_the_end_of_the_run(
        tmp_path, capsys, monkeypatch, source, says):
    """The harness imports a kernel's file to read its signature; it is loaded in a worker first
    (`isolation.probe_target`), so a file that exits there ends the worker, not the run (a blind hunt's
    ``os._exit(7)`` at import: the harness exited 7 with no output and no report; a ``raise KeyboardInterrupt``
    read as a Ctrl-C, exit 130)."""
    from harness.kernels import isolation

    monkeypatch.setattr(isolation._DEFAULTS, "isolation", "process")  # the CLI's default (the suite's: in-process)
    path = tmp_path / "user_kernel.py"
    path.write_text(source + "def k(a, b):\n    return b\n")
    code, _, err = run_cli(capsys, *check_args(tmp_path, kernel=f"{path}:k"))
    assert code == 2, err
    assert f"kernel='{path}:k': loading it in a worker process failed" in err and says in err, err


def test_a_kernel_file_that_hangs_at_import_is_a_usage_error(tmp_path, monkeypatch):
    from harness.errors import InvalidArgument
    from harness.kernels import isolation

    path = tmp_path / "hangs.py"
    path.write_text("import time\nwhile True:\n    time.sleep(0.1)\ndef k(a, b):\n    return b\n")
    monkeypatch.setattr(isolation, "START_TIMEOUT_S", 3.0)
    monkeypatch.setattr(isolation._DEFAULTS, "isolation", "process")
    with pytest.raises(InvalidArgument, match="did not start within 3 s"):
        user_kernel_spec(f"{path}:k", family="linear_scan")


def test_importing_a_kernel_file_leaves_the_signal_handlers_and_streams_as_they_were(tmp_path):
    """A module that ignores SIGINT and SIGTERM (some libraries do) left a run Ctrl-C and SIGTERM could not stop;
    one that replaced or closed sys.stdout and sys.stderr silenced every message after it."""
    import os
    import signal
    import sys

    path = tmp_path / "rude.py"
    path.write_text("import io, signal, sys\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\n"
                    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\nsys.stdout = io.StringIO()\nsys.stderr.close()\n"
                    "def k(a, b):\n    return b\n")
    saved = sys.stdout, sys.stderr
    ours = open(os.dup(1), "w"), open(os.dup(2), "w")  # streams of this test's own, for the module to take
    sys.stdout, sys.stderr = ours
    try:
        handlers = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
        user_kernel_spec(f"{path}:k", family="linear_scan")
        assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == handlers
        assert sys.stdout is ours[0]  # put back
        assert ours[1].closed and sys.stderr is not ours[1] and not sys.stderr.closed  # a new one on fd 2
        assert os.fstat(sys.stderr.fileno()).st_ino == os.fstat(2).st_ino
    finally:
        replaced = sys.stderr
        sys.stdout, sys.stderr = saved
        for stream in (*ours, replaced):
            if not stream.closed:
                stream.close()


def test_the_command_s_status_is_its_own_whatever_hooks_and_threads_a_kernel_s_module_left(tmp_path):
    """An exit hook ``os._exit(0)`` registered at import turned a failing check's status 1 into 0 (a green CI for a
    kernel that returns zeros), and a non-daemon thread started at import kept the finished process alive:
    `harness.cli.entry` ends the process with the run's status (``os._exit``, after the workers are let go)."""
    import subprocess
    import sys

    path = tmp_path / "hooks.py"
    path.write_text("import atexit, os, threading, time, torch\natexit.register(lambda: os._exit(0))\n"
                    "threading.Thread(target=lambda: time.sleep(10 ** 6)).start()\n"
                    "def zeros(a, b):\n    return torch.zeros_like(b)\n")
    argv = check_args(tmp_path, "--shrink-deadline", "0", kernel=f"{path}:zeros")
    proc = subprocess.run([sys.executable, "-m", "harness", *argv], capture_output=True, text=True, timeout=240)
    assert proc.returncode == 1, (proc.returncode, proc.stdout[-2000:], proc.stderr[-2000:])
    assert "divergent" in proc.stdout


def test_a_cases_dir_that_is_a_file_is_a_usage_error_before_the_search(tmp_path, capsys):
    """It was a FileExistsError traceback at the first failure, and the other dtypes' searches never ran."""
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    argv = check_args(tmp_path, kernel=f"{KERNELS}:correct")
    argv[argv.index("--cases-dir") + 1] = str(blocker / "cases")
    code, _, err = run_cli(capsys, *argv)
    assert code == 2 and "--cases-dir=" in err and "is a file, not a directory" in err, err
    assert not (tmp_path / "run").exists()


def test_a_case_file_nested_past_python_s_limit_is_a_usage_error(tmp_path, capsys):
    path = tmp_path / "deep.json"
    path.write_text("[" * 100_000 + "]" * 100_000)  # a RecursionError traceback before
    code, _, err = run_cli(capsys, "replay", str(path))
    assert code == 2 and "cannot be read as JSON" in err, err
    code, _, err = run_cli(capsys, "replay", "--kernel", "intree.blelloch_scan", "--problem", "[" * 50_000 + "]" * 50_000)
    assert code == 2 and "--problem" in err, err


def test_check_names_a_wrong_argument_type_from_python():
    """Each was a raw AttributeError or TypeError from deep inside (a blind hunt); a policy may be the CLI's spec
    string or a mapping of its keys, and a dtype named twice is one search."""
    from harness.api import check, dtype_names
    from harness.errors import InvalidArgument

    for kwargs, says in [({"policy": 5}, "policy=5 is a int"), ({"policy": "garbage"}, "garbage"),
                         ({"dtypes": 5}, "dtypes=5 is a int"), ({"shrink_deadline_s": "x"}, "shrink_deadline_s='x'"),
                         ({"store": "x"}, "store='x' is a str")]:
        with pytest.raises(InvalidArgument, match=re.escape(says)):
            check("intree.blelloch_scan", family="linear_scan", max_examples=1, **kwargs)
    assert dtype_names("float32,float32") == ("float32",) and dtype_names(["bfloat16", "float32", "bfloat16"]) == (
        "bfloat16", "float32")
    result = check("intree.blelloch_scan", family="linear_scan", max_examples=2, dtypes=("float32",), grad=False,
                   policy={"cond": 4}, save_counterexample=False)
    assert result.passed and {r["cond_threshold"] for r in result.records} == {4.0}


def _terminate(proc, within: float) -> str:
    """SIGTERM to ``proc`` and its stderr once it ended, or an AssertionError when it did not within ``within`` s."""
    import signal
    import subprocess

    proc.send_signal(signal.SIGTERM)
    try:
        return proc.communicate(timeout=within)[1]
    except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError(f"the harness did not end within {within:g} s of SIGTERM") from None


def test_a_stop_during_start_up_exits_130(tmp_path):
    """A SIGTERM before the handler was installed (torch's import, the workers' server: the first seconds of
    `harness check`) ended the process with 143 and no word, not the documented 130 (verification 23). Start-up
    is held at its Triton step until the signal has been sent, so the signal lands there."""
    import subprocess
    import sys
    import time

    ready = tmp_path / "in-start-up"
    code = textwrap.dedent(f"""
        import pathlib, sys, time
        from harness.kernels import triton_interpreter
        def held():
            pathlib.Path({str(ready)!r}).write_text("")
            time.sleep(5)
        triton_interpreter.interpret_if_no_gpu = held
        from harness.cli import main
        sys.exit(main(sys.argv[1:]))
    """)
    proc = subprocess.Popen([sys.executable, "-c", code, *check_args(tmp_path), "--in-process"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not ready.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    err = _terminate(proc, within=60)
    assert ready.exists() and proc.returncode == 130 and "terminated (SIGTERM)" in err, (proc.returncode, err[-2000:])
    assert not (tmp_path / "run").exists()  # stopped before its run directory was made


def test_a_stop_while_a_kernel_s_module_hangs_in_its_import_ends_the_command(tmp_path):
    """SIGTERM while the worker was still importing a module that hangs: the stop was said, and then the exit
    waited on that worker for ever (it was no worker of the pool yet, so nothing let it go; a verification run,
    session 22). The worker is closed when its start is interrupted."""
    import subprocess
    import sys
    import time

    path = tmp_path / "hangs.py"
    path.write_text("import time\nwhile True:\n    time.sleep(0.1)\ndef k(a, b):\n    return b\n")
    proc = subprocess.Popen([sys.executable, "-m", "harness", *check_args(tmp_path, kernel=f"{path}:k")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(8)
    err = _terminate(proc, within=30)
    assert proc.returncode == 130 and "terminated (SIGTERM)" in err, (proc.returncode, err[-2000:])
