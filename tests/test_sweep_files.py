"""Sweep files (`harness.cases.load_sweep`): what a malformed one is told."""

from __future__ import annotations

import pytest


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


def test_a_sweep_naming_a_file_kernel_says_how_to_check_it_and_list_shows_the_rest(tmp_path, monkeypatch, capsys):
    """A project's sweep with ``kernels = ["mykern/scan.py:scan"]`` read "is not registered; known kernels: ..."
    (75 names), and made `harness sweep --list` fail for every sweep (blind hunt, session 23)."""
    from harness.cases import load_sweep
    from harness.cli import main
    from harness.errors import InvalidArgument

    monkeypatch.chdir(tmp_path)
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "k"\n[tool.harness]\nsweeps = ["numerics/sweeps"]\n')
    (tmp_path / "numerics" / "sweeps").mkdir(parents=True)
    mine = tmp_path / "numerics" / "sweeps" / "mine.toml"
    mine.write_text('kernels = ["mykern/scan.py:scan"]\n[grid]\nlength = [17]\ndtype = ["float64"]\n')
    with pytest.raises(InvalidArgument, match="are targets; a sweep runs registered kernels.*harness check --kernel"):
        load_sweep(str(mine))
    assert main(["sweep", "--list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert any(line.startswith("mine ") and "cannot be read" in line for line in lines), lines
    assert any(line.startswith("default ") and "runnable here" in line for line in lines), lines
