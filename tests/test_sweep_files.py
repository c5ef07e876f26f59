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
