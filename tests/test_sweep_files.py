"""Sweep files (`harness.cases.load_sweep`): what a malformed one is told."""

from __future__ import annotations

import pytest

from tests.user_sources import LOOP_SCAN


def test_a_sweep_grid_that_lists_a_value_twice_is_refused(tmp_path):
    """``length = [17, 17]`` ran every case of 17 twice, as two cases (blind hunt, session 23)."""
    from harness.cases import load_sweep
    from harness.errors import InvalidArgument

    sweep = tmp_path / "dupe.toml"
    sweep.write_text('kernels = ["intree.sequential_scan"]\n[grid]\nlength = [17, 17]\ndtype = ["float64"]\n')
    with pytest.raises(InvalidArgument, match=r"grid length=\[17, 17\] lists 17 more than once"):
        load_sweep(str(sweep))
    sweep.write_text('kernels = ["intree.sequential_scan"]\n[grid]\nlength = [17, 18]\ndtype = ["float64"]\n')
    assert len(list(load_sweep(str(sweep)).cases())) == 2


@pytest.mark.parametrize("text, shown", [
    ('kernels = ["intree.sequential_scan", "intree.blelloch_scan", "intree.sequential_scan"]\n[grid]\nlength = [3]\n'
     'dtype = ["float64"]\n', r"kernels=\[.*\] lists 'intree.sequential_scan' more than once"),
    ('pairs = [["intree.retention_parallel", "intree.retention_chunkwise"], ["intree.retention_parallel", '
     '"intree.retention_chunkwise"]]\n[[group]]\nkernels = ["intree.retention_parallel", '
     '"intree.retention_chunkwise"]\n[group.fixed]\nheads = 1\ndk = 2\ndv = 2\nchunk_size = 2\n[group.grid]\n'
     'length = [4]\ndtype = ["float64"]\n', r"pairs=\[.*\] lists \['intree.retention_parallel', "
     r"'intree.retention_chunkwise'\] more than once"),
])
def test_a_sweep_that_lists_a_kernel_or_a_pair_twice_is_refused(tmp_path, text, shown):
    """A kernel (or a pair) listed twice ran every case twice with no word, and the report counted each case
    twice (a blind hunt, session 27)."""
    from harness.cases import load_sweep
    from harness.errors import InvalidArgument

    sweep = tmp_path / "dupe.toml"
    sweep.write_text(text)
    with pytest.raises(InvalidArgument, match=shown):
        load_sweep(str(sweep))


KERNELS_PY = LOOP_SCAN + """

def forgets_a(a, b):  # planted: the decay is never applied
    return torch.cumsum(b, -1)
"""


def test_a_project_sweep_runs_its_own_file_kernels_from_the_root(tmp_path, monkeypatch, capsys):
    """A project's sweep could not name its own kernels (``kernels = ["mykern/scan.py:scan"]`` was refused:
    "a sweep runs registered kernels"), so a kernel author could not sweep eps or chunk sizes over their own
    kernel. Targets are named from the project's root, as ``[[tool.harness.kernels]]`` names them, with the
    group's ``family``; records carry the name ``check`` gives them."""
    import json

    from harness.cases import load_sweep
    from harness.cli import EXIT_FAIL, main
    from harness.errors import InvalidArgument

    (tmp_path / "pyproject.toml").write_text('[project]\nname = "k"\n[tool.harness]\nsweeps = ["numerics/sweeps"]\n')
    (tmp_path / "mykern").mkdir()
    (tmp_path / "mykern" / "scan.py").write_text(KERNELS_PY)
    (tmp_path / "numerics" / "sweeps").mkdir(parents=True)
    mine = tmp_path / "numerics" / "sweeps" / "mine.toml"
    grid = '[grid]\nlength = [5, 17]\ndtype = ["float64"]\n'
    mine.write_text('kernels = ["mykern/scan.py:scan"]\n' + grid)
    with pytest.raises(InvalidArgument, match=r"kernels=\['mykern/scan.py:scan'\] are targets and the group has no "
                                              r"family; expected family = \"...\""):
        load_sweep(str(mine))
    mine.write_text('family = "retention"\nkernels = ["mykern/scan.py:scan", "intree.sequential_scan"]\n' + grid)
    with pytest.raises(InvalidArgument, match="are of families .*linear_scan.*retention.*expected one family"):
        load_sweep(str(mine))
    mine.write_text('family = "linear_scan"\nkernels = ["mykern/scan.py:scan", "mykern/scan.py:forgets_a"]\n'
                    'pairs = [["mykern/scan.py:scan", "mykern/scan.py:forgets_a"]]\n' + grid)
    monkeypatch.chdir(tmp_path / "mykern")  # from a subfolder: the file is still the root's mykern/scan.py
    sweep = load_sweep("mine")
    assert sweep.orders()["kernel"][:2] == ["user.mykern/scan.py:scan", "user.mykern/scan.py:forgets_a"]
    assert main(["sweep", "--list"]) == 0
    assert any(line.startswith("mine ") and "4 cases + 2 pair cases" in line for line in capsys.readouterr().out.splitlines())
    run = tmp_path / "run"
    assert main(["sweep", "mine", "--report-dir", str(run), "--quiet"]) == EXIT_FAIL
    records = [json.loads(line) for line in (run / "records.jsonl").read_text().splitlines()]
    verdicts = {(r["kernel"], r["length"]): r["verdict"] for r in records}
    assert verdicts == {("user.mykern/scan.py:scan", 5): "equivalent", ("user.mykern/scan.py:scan", 17): "equivalent",
                        ("user.mykern/scan.py:forgets_a", 5): "divergent",
                        ("user.mykern/scan.py:forgets_a", 17): "divergent",
                        ("user.mykern/scan.py:scan vs user.mykern/scan.py:forgets_a", 5): "divergent",
                        ("user.mykern/scan.py:scan vs user.mykern/scan.py:forgets_a", 17): "divergent"}, verdicts


@pytest.mark.parametrize("answer, says", [
    ('rows = ["nofield"]\ncolumns = "length"', r"answer 0: rows names \['nofield'\], no field of a sweep's records"),
    ('rows = ["kernel"]\ncolumns = "lenght"', r"answer 0: columns names \['lenght'\], no field of a sweep's records"),
], ids=["rows", "columns"])
def test_an_answer_table_naming_an_unknown_field_is_refused(tmp_path, answer, says):
    """``rows = ["nofield"]`` was accepted: its table had one row labelled "-" (blind hunt 23b, P16)."""
    from harness.cases import load_sweep
    from harness.errors import InvalidArgument

    sweep = tmp_path / "answer.toml"
    head = 'kernels = ["intree.sequential_scan"]\n[grid]\nlength = [17, 64]\ndtype = ["float64"]\n'
    sweep.write_text(f'{head}[[answer]]\nquestion = "q"\n{answer}\nvalue = "{{verdict}}"\n')
    with pytest.raises(InvalidArgument, match=f"sweep {sweep}: {says}; expected fields among .*'length', 'dtype'"):
        load_sweep(str(sweep))
    sweep.write_text(f'{head}[[answer]]\nquestion = "q"\nrows = ["kernel", "dtype"]\ncolumns = "length"\n'
                     'value = "{verdict}"\n')
    assert [t.rows for t in load_sweep(str(sweep)).answers] == [("kernel", "dtype")]


def test_a_sweep_without_a_length_names_it_not_a_constructor(tmp_path):
    """A grid without ``length`` read "(Problem.__init__() missing 1 required positional argument: 'length')"
    (blind hunt 23b, P16, ``baddtype.toml``)."""
    from harness.cases import load_sweep
    from harness.errors import InvalidArgument

    sweep = tmp_path / "nolength.toml"
    sweep.write_text('kernels = ["intree.sequential_scan"]\n[grid]\ndtype = ["float8"]\n')
    with pytest.raises(InvalidArgument, match=rf"sweep {sweep}: neither \[grid\] nor \[fixed\] gives \['length'\]"):
        load_sweep(str(sweep))
    sweep.write_text('kernels = ["intree.sequential_scan"]\n[grid]\nlength = [17]\ndtype = ["float8"]\n')
    with pytest.raises(InvalidArgument, match=f"sweep {sweep}: dtype='float8' is not supported"):
        load_sweep(str(sweep))


@pytest.mark.parametrize("pair, says", [
    ('["intree.sequential_scan", "intree.retention_parallel"]',
     "kernel 'intree.sequential_scan' is a linear_scan kernel and 'intree.retention_parallel' a retention one; "
     "expected two kernels of one family"),
    ('["intree.sequential_scan", "nope.k"]', "kernel='nope.k' is not registered"),
], ids=["two-families", "unknown"])
def test_a_pair_that_cannot_be_run_names_the_sweep_and_the_entry(tmp_path, pair, says):
    """A pair across families failed after the grid's cases had run, with "kernel 'intree.retention_parallel' is
    a retention kernel; problem.family='linear_scan' ...", naming neither the file nor the entry (P18)."""
    import re

    from harness.cases import load_sweep
    from harness.errors import InvalidArgument

    sweep = tmp_path / "pairs.toml"
    sweep.write_text(f'kernels = ["intree.sequential_scan"]\npairs = [{pair}]\n[grid]\nlength = [17]\n'
                     'dtype = ["float64"]\n')
    entry = repr([name.strip(' "') for name in pair.strip("[]").split(",")])
    with pytest.raises(InvalidArgument, match=re.escape(f"sweep {sweep}: pairs entry {entry}: {says}")):
        load_sweep(str(sweep))
