"""Sharded sweeps: K of N jobs partition the cases, and the merged run reports what the unsharded run does."""

from __future__ import annotations

import pytest
from hypothesis import given, strategies as st

from harness.cases import load_sweep
from harness.errors import InvalidArgument
from harness.report import build_report
from harness.runner import RunOptions, run_cases, run_pairs
from harness.shard import Shard, merge_runs, shard_header
from harness.store import RunStore, environment, load_records

pytestmark = pytest.mark.e2e  # end to end: `make test-all`

SWEEP = """
name = "shard_test"
pairs = [["intree.retention_parallel", "intree.retention_chunkwise"]]
[[group]]
kernels = ["intree.blelloch_scan", "intree.sequential_scan"]
[group.fixed]
dim = 2
[group.grid]
length = [3, 17, 64]
dtype = ["float32", "float64"]
[[group]]
kernels = ["intree.retention_parallel", "intree.retention_chunkwise"]
[group.fixed]
heads = 2
dk = 4
dv = 4
chunk_size = 4
[group.grid]
length = [5, 16]
dtype = ["float32", "float64"]
"""

TABLES = ("summary.csv", "cells.csv", "failures.csv")


@pytest.mark.parametrize("text", ["0/2", "3/2", "1/0", "1", "a/b", "1/2/3", "-1/2", ""])
def test_a_bad_shard_names_the_value(text):
    with pytest.raises(InvalidArgument, match="shard"):
        Shard.parse(text)


@given(count=st.integers(1, 7), n=st.integers(0, 60))
def test_shards_partition_the_cases(count, n):
    items = list(range(n))
    parts = [list(Shard(k, count).take(items)) for k in range(1, count + 1)]
    assert sorted(x for part in parts for x in part) == items  # every case once, in one shard
    assert max(map(len, parts)) - min(map(len, parts)) <= 1  # round robin: balanced counts


def _run(sweep, run_dir, shard=None):
    options = RunOptions()
    header = dict(environment(f"sweep:{sweep.name}"), **shard_header(shard))
    take = (lambda xs: xs) if shard is None else shard.take
    with RunStore(run_dir, header=header) as store:
        run_cases(take(sweep.cases()), options, store=store)
        for a, b, problem in take(sweep.pair_cases()):
            from harness.runner import run_pair

            run_pair(a, b, problem, options, store=store)
    build_report(run_dir)


def _without_timings(records):
    return [{k: v for k, v in r.items() if not k.startswith("t_")} for r in records]


@pytest.fixture(scope="module")
def sharded(tmp_path_factory):
    root = tmp_path_factory.mktemp("shard")
    (root / "shard_test.toml").write_text(SWEEP)
    sweep = load_sweep(str(root / "shard_test.toml"))
    _run(sweep, root / "whole")
    for k in (1, 2, 3):
        _run(sweep, root / f"part{k}", Shard(k, 3))
    return root


def test_the_merged_run_equals_the_unsharded_run(sharded):
    merged = merge_runs([sharded / f"part{k}" for k in (3, 1, 2)], sharded / "merged")
    build_report(sharded / "merged")
    whole = load_records(sharded / "whole")
    # 12 scan cases, 4 chunkwise retention cases (the parallel form takes no chunk size), 4 pair cases
    assert len(whole) == 12 + 4 + 4
    assert _without_timings(merged) == _without_timings(whole)
    for name in TABLES:
        assert (sharded / "merged" / name).read_text() == (sharded / "whole" / name).read_text(), name
    parts = [len(load_records(sharded / f"part{k}")) for k in (1, 2, 3)]
    assert sum(parts) == len(whole) and min(parts) > 0


def test_merge_refuses_what_would_be_a_wrong_report(sharded, tmp_path):
    with pytest.raises(InvalidArgument, match="missing"):
        merge_runs([sharded / "part1", sharded / "part2"], tmp_path / "a")
    assert len(merge_runs([sharded / "part1", sharded / "part2"], tmp_path / "b", allow_missing=True)) > 0
    with pytest.raises(InvalidArgument, match="given twice"):
        merge_runs([sharded / "part1", sharded / "part1", sharded / "part2"], tmp_path / "c")
    with pytest.raises(InvalidArgument, match="overlap"):
        merge_runs([sharded / "whole", sharded / "part1"], tmp_path / "d")
    with pytest.raises(InvalidArgument, match="not a run directory"):
        merge_runs([tmp_path / "nowhere"], tmp_path / "e")
    import json

    other = tmp_path / "other"
    other.mkdir()
    header = json.loads((sharded / "part3" / "run.json").read_text())
    (other / "run.json").write_text(json.dumps(dict(header, torch="0.0-other")))
    with pytest.raises(InvalidArgument, match="differ in 'torch'"):
        merge_runs([sharded / "part1", sharded / "part2", other], tmp_path / "f")


def test_the_command_line_shards_and_merges(sharded, tmp_path, capsys):
    """`harness sweep FILE --shard K/N` and `harness merge RUN... --out DIR`, as a CI matrix runs them."""
    from harness.cli import EXIT_OK, EXIT_USAGE, main

    sweep = str(sharded / "shard_test.toml")
    for k in (1, 2):
        assert main(["sweep", sweep, "--shard", f"{k}/2", "--report-dir", str(tmp_path / f"s{k}"), "--quiet"]) == EXIT_OK
    assert main(["merge", str(tmp_path / "s1"), str(tmp_path / "s2"), "--out", str(tmp_path / "m")]) == EXIT_OK
    assert _without_timings(load_records(tmp_path / "m")) == _without_timings(load_records(sharded / "whole"))
    assert main(["sweep", sweep, "--shard", "3/2", "--report-dir", str(tmp_path / "bad")]) == EXIT_USAGE
    assert main(["merge", str(tmp_path / "s1"), "--out", str(tmp_path / "m2")]) == EXIT_USAGE  # 2/2 missing
    assert main(["merge", str(tmp_path / "s1"), str(tmp_path / "s2"), "--out", str(tmp_path / "m")]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert "shard=3/2" in err and "missing" in err and "not empty" in err


def test_merge_refuses_shards_of_two_versions_of_one_sweep_file(tmp_path, capsys):
    """A grid edited between two jobs of one sweep (same name, same commit: a user's uncommitted file) merged
    into one run whose cases no version of the file has (a blind hunt, session 27). The header records a digest
    of the parsed file; comments and layout do not change it."""
    from harness.cli import EXIT_OK, EXIT_USAGE, main

    one = "name = 'edited'\n[[group]]\nkernels = ['intree.blelloch_scan']\n[group.fixed]\ndim = 2\n" \
          "[group.grid]\nlength = [3, 17]\ndtype = ['float64']\n"
    sweep = tmp_path / "edited.toml"
    sweep.write_text(one)
    run = ["sweep", str(sweep), "--quiet", "--in-process", "--report-dir"]
    assert main([*run, str(tmp_path / "s1"), "--shard", "1/2"]) == EXIT_OK
    sweep.write_text("# the same grid, laid out otherwise\n" + one.replace("[3, 17]", "[ 3,  17 ]"))
    assert main([*run, str(tmp_path / "s2"), "--shard", "2/2"]) == EXIT_OK
    sweep.write_text(one.replace("[3, 17]", "[3, 18]"))
    assert main([*run, str(tmp_path / "s2b"), "--shard", "2/2"]) == EXIT_OK
    capsys.readouterr()
    assert main(["merge", str(tmp_path / "s1"), str(tmp_path / "s2b"), "--out", str(tmp_path / "bad")]) == EXIT_USAGE
    assert "differ in 'sweep_digest'" in capsys.readouterr().err
    assert main(["merge", str(tmp_path / "s1"), str(tmp_path / "s2"), "--out", str(tmp_path / "m")]) == EXIT_OK
    assert sorted(r["length"] for r in load_records(tmp_path / "m")) == [3, 17]


# ------------------------------------------------------------------------------------------ checks
CHECKED = ("--kernel", "intree.blelloch_scan", "--family", "linear_scan", "--dtypes", "float64,float32,float16",
           "--profile", "ci", "--max-examples", "3", "--no-grad", "--in-process")


def _check(tmp_path, name: str, shard: str | None) -> "Path":
    from harness.cli import main

    run_dir = tmp_path / name
    extra = ["--shard", shard] if shard else []
    assert main(["check", *CHECKED, "--cases-dir", str(tmp_path / "cases"), "--report-dir", str(run_dir),
                 *extra]) == 0
    return run_dir


def _by_key(records):
    return sorted(_without_timings(records), key=lambda r: (r["kernel"], r["case"], str(r.get("eps")), str(r.get("mode"))))


def test_a_sharded_check_splits_its_searches_by_dtype_and_merges_to_the_one_job_run(tmp_path):
    """``check --shard K/N``: one search per (kernel, dtype), dealt round robin; the merged jobs' records
    and tables are those of ``--shard 1/1`` (the same searches in one job), and each job ran only its own
    dtypes. Without the split every job would run every dtype and the merge would refuse the overlap."""
    from harness.store import load_header

    whole = _check(tmp_path, "whole", "1/1")
    parts = [_check(tmp_path, f"part{k}", f"{k}/2") for k in (1, 2)]
    assert [sorted({r["dtype"] for r in load_records(p)}) for p in parts] == [["float16", "float64"], ["float32"]]
    assert load_header(parts[0])["shard"] == "1/2"
    merged = merge_runs(parts, tmp_path / "merged")
    build_report(tmp_path / "merged")
    assert len(merged) == len(load_records(whole)) >= 3 * 3
    assert _by_key(merged) == _by_key(load_records(whole))
    for name in TABLES:
        assert (tmp_path / "merged" / name).read_text() == (whole / name).read_text(), name


def test_a_check_shard_with_no_search_left_writes_an_empty_run(tmp_path, capsys):
    run_dir = _check(tmp_path, "empty", "4/4")  # three dtypes, four jobs: the fourth has nothing to do
    assert load_records(run_dir) == [] and "no (kernel, dtype) search falls to this job" in capsys.readouterr().err


def test_an_unsharded_check_is_the_one_job_run_each_dtype_its_own_search(tmp_path):
    """``harness check`` without ``--shard`` runs what ``--shard 1/1`` runs: one search per dtype, each with
    the profile's examples. Before, one search over every dtype spent its 25 ci cases as its cond_max
    target drew it (a selective scan: float32 14, float64 8, bfloat16 2, float16 1; yet-another-retnet's
    parallel form: bfloat16 27, float16 8, float64 6, float32 1): a bug of the dtype that got one case was
    seen by chance."""
    whole, unsharded = _check(tmp_path, "whole", "1/1"), _check(tmp_path, "unsharded", None)
    records = load_records(unsharded)
    assert _by_key(records) == _by_key(load_records(whole))
    counts = {d: sum(r["dtype"] == d for r in records) for d in ("float64", "float32", "float16")}
    assert counts == {"float64": 3, "float32": 3, "float16": 3}, counts  # --max-examples 3, per dtype


def test_a_check_that_fails_in_two_dtypes_keeps_a_counterexample_for_each(tmp_path, capsys):
    """Each dtype's shrunk failure has its own file (``--<dtype>--`` in the name) and its own replay line:
    one file per kernel and family had the second dtype's case overwrite the first's, while the first
    message still pointed at it."""
    import json

    from harness.cli import main

    target = f"{__file__.rsplit('/', 1)[0]}/planted/bugs.py:scan_drops_carry_after_block_8"
    code = main(["check", "--kernel", target, "--family", "linear_scan", "--dtypes", "float64,float32",
                 "--profile", "ci", "--max-examples", "12", "--no-grad", "--in-process", "--shrink-deadline", "10",
                 "--cases-dir", str(tmp_path / "cases"), "--report-dir", str(tmp_path / "run")])
    out = capsys.readouterr().out
    assert code == 1
    files = sorted((tmp_path / "cases").glob("*.json"))
    assert [f.name.split("--")[2] for f in files] == ["float32", "float64"], files
    for f in files:
        case = json.loads(f.read_text())
        assert case["problem"]["dtype"] == f.name.split("--")[2]
        assert f"counterexample saved: {f}" in out
    summary = out.split("\nsearches:\n")[1].splitlines()  # one line per search, after the messages
    assert [line.split(": ")[0].rsplit(" ", 1)[1] for line in summary] == ["float64", "float32"]
    assert all("divergent, kernel_bug, shrunk to L=" in line for line in summary), summary


# ------------------------------------------------------------------------------ what merge refuses
PROGRAM = "/venv/bin/harness"
SHARD_COMMAND = ("check --family linear_scan --kernel mykern/scan.py:scan_buggy --max-examples 15 --max-length 64 "
                 "--dtypes float64,float32")


def _shard_run(run_dir, shard: str, command: str = SHARD_COMMAND, *, program: str = PROGRAM,
               cond_threshold: float = 1.0, **header):
    """A run directory as ``harness check ... --shard K/N`` leaves it: a header and one record (no kernel run)."""
    import json

    record = {"kernel": "user.mykern/scan.py:scan_buggy", "case": f"case-{shard}", "family": "linear_scan",
              "dtype": "float64", "length": 8, "verdict": "divergent", "cond_max": 3.0,
              "cond_threshold": cond_threshold}
    head = dict(environment("ci", command=f"{program} {command} --shard {shard} --report-dir {run_dir}"),
                shard=shard, **header)
    with RunStore(run_dir, header=head) as store:
        store.append(record)
    assert json.loads((run_dir / "run.json").read_text())["shard"] == shard
    return run_dir


@pytest.mark.parametrize("other, option", [
    (SHARD_COMMAND.replace("scan_buggy", "scan"), "--kernel"),
    (SHARD_COMMAND.replace("--max-examples 15", "--max-examples 5"), "--max-examples"),
    (SHARD_COMMAND + " --max-length 32", "--max-length"),  # the last one counts, as in the run
    (SHARD_COMMAND + " --policy cond=4", "--policy"),
    (SHARD_COMMAND.replace("float64,float32", "float64,float16"), "--dtypes"),
    (SHARD_COMMAND + " --no-grad", "--no-grad"),
])
def test_merge_refuses_shards_of_different_commands_naming_the_option(tmp_path, other, option):
    """A blind hunt merged shard 1/2 of one check with shard 2/2 of another kernel, --max-examples, --max-length,
    --policy or --dtypes into one plausible report ("shards": "2 of 2"): the headers agreed on the machine and
    the profile, and only the recorded command told the runs apart."""
    first = _shard_run(tmp_path / "s1", "1/2")
    second = _shard_run(tmp_path / "s2", "2/2", other)
    with pytest.raises(InvalidArgument) as info:
        merge_runs([first, second], tmp_path / "merged")
    message = str(info.value)
    assert f"differ in {option} (" in message and "'" + str(first) + "'" in message and str(second) in message
    assert "not shards of one run" in message and not (tmp_path / "merged").exists()


def test_merge_takes_shards_that_differ_only_in_where_they_write(tmp_path):
    """Another --report-dir / --cases-dir / --quiet, options in another order or spelled ``--opt=value``, and
    another program path (``python -m harness``) are one run's jobs."""
    first = _shard_run(tmp_path / "s1", "1/2")
    reordered = ("check --dtypes=float64,float32 --max-length 64 --max-examples 15 --kernel mykern/scan.py:scan_buggy "
                 f"--family linear_scan --cases-dir {tmp_path}/cases2 --no-summary")
    second = _shard_run(tmp_path / "s2", "2/2", reordered, program="/usr/lib/python3/harness/__main__.py")
    merged = merge_runs([first, second], tmp_path / "merged")
    assert len(merged) == 2


def test_merge_refuses_shards_judged_with_another_verdict_threshold(tmp_path):
    """The policy may come from the project's table rather than --policy: the records' threshold tells, also
    past an empty shard (which has no threshold to compare)."""
    empty = _shard_run(tmp_path / "s1", "1/3")
    (empty / "records.jsonl").write_text("")
    second = _shard_run(tmp_path / "s2", "2/3")
    third = _shard_run(tmp_path / "s3", "3/3", cond_threshold=4.0)
    with pytest.raises(InvalidArgument, match=r"runs '.*s2' and '.*s3' differ in the records' cond_threshold "
                                              r".*\[1\.0\] vs \[4\.0\]"):
        merge_runs([empty, second, third], tmp_path / "merged")


def test_merge_refuses_a_partial_shard_unless_allowed_and_then_marks_the_run_partial(tmp_path):
    """A shard stopped by SIGTERM ("partial": true) merged into a run that read as complete ("2 of 2", no
    status): the cases it never ran were simply absent."""
    from harness.store import load_header, mark_partial

    first = _shard_run(tmp_path / "s1", "1/2")
    second = _shard_run(tmp_path / "s2", "2/2")
    mark_partial(second, "terminated (SIGTERM)")
    with pytest.raises(InvalidArgument) as info:
        merge_runs([first, second], tmp_path / "refused")
    assert f"run {str(second)!r} is partial (PARTIAL: terminated (SIGTERM) after 1 records)" in str(info.value)
    assert "--allow-missing" in str(info.value)
    merge_runs([first, second], tmp_path / "merged", allow_missing=True)
    header = load_header(tmp_path / "merged")
    assert header["partial"] is True and "terminated (SIGTERM)" in header["status"]
    assert header["status"].startswith("PARTIAL: ")
    merge_runs([first], tmp_path / "missing", allow_missing=True)  # a shard not given: partial too
    assert load_header(tmp_path / "missing")["partial"] is True
    assert "shards ['2/2'] are missing" in load_header(tmp_path / "missing")["status"]
    merge_runs([first, _shard_run(tmp_path / "s2b", "2/2")], tmp_path / "whole")
    assert "partial" not in load_header(tmp_path / "whole")


def test_merge_takes_one_run_s_shards_however_their_kernel_and_profile_were_typed(tmp_path):
    """The header names the kernels checked (`canonical_target`) and the profile run: shards whose --kernel was
    typed ``./mykern/scan.py`` or from ``mykern/``, or whose --profile ci was typed out or left to the default, are
    one run's (refused before, session 23's verification); another kernel or profile is still refused."""
    kernels = {"kernels": ["user.mykern/scan.py:scan_buggy (linear_scan)"]}
    first = _shard_run(tmp_path / "s1", "1/2", **kernels)
    typed = SHARD_COMMAND.replace("mykern/scan.py", "./mykern/scan.py").replace("check", "check --profile ci")
    assert len(merge_runs([first, _shard_run(tmp_path / "s2", "2/2", typed, **kernels)], tmp_path / "m")) == 2
    other = _shard_run(tmp_path / "s3", "2/2", kernels=["user.mykern/scan.py:scan (linear_scan)"])
    with pytest.raises(InvalidArgument, match="differ in the kernels checked"):
        merge_runs([first, other], tmp_path / "m2")
    nightly = _shard_run(tmp_path / "s4", "2/2", SHARD_COMMAND.replace("check", "check --profile nightly"),
                         profile="nightly", **kernels)
    with pytest.raises(InvalidArgument, match="differ in 'profile'"):
        merge_runs([first, nightly], tmp_path / "m3")


def test_a_case_one_shard_took_twice_is_no_overlap(tmp_path):
    """A search may take one case twice (hypothesis replays a draw): a complete pair of check shards, and a
    single --shard 1/1 run, were refused as overlapping with themselves (session 23's verification)."""
    first = _shard_run(tmp_path / "s1", "1/2")
    records = first / "records.jsonl"
    records.write_text(records.read_text() * 2)  # the same case, twice
    second = _shard_run(tmp_path / "s2", "2/2")
    assert len(merge_runs([first, second], tmp_path / "merged")) == 3
    third = _shard_run(tmp_path / "s3", "2/2")
    (third / "records.jsonl").write_text(records.read_text())  # shard 1's case in shard 2: an overlap
    with pytest.raises(InvalidArgument, match="overlap"):
        merge_runs([first, third], tmp_path / "m2")
