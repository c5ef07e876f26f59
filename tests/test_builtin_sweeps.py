"""Every sweep the package ships can be read: each group's kernels of one family, every grid value valid.

The built-in `gated_decay` sweep put simple GLA and GLA kernels in one group; once the sweep reader required
one family per group (a project's own kernels take the group's family), `harness sweep gated_decay` was a
usage error, and `harness sweep --list` said "cannot be read" (found in session 27).
"""

from __future__ import annotations

import pytest

from harness.cases import load_sweep
from harness.project import BUILTIN_SWEEPS

NAMES = sorted(p.stem for p in BUILTIN_SWEEPS.glob("*.toml"))


def test_the_package_ships_its_sweeps():
    assert {"default", "gated_decay", "mamba_seed", "retnet_seed"} <= set(NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_every_built_in_sweep_reads(name):
    sweep = load_sweep(str(BUILTIN_SWEEPS / f"{name}.toml"))
    assert sweep.name == name
    for group in sweep.groups:
        assert group.kernels and len({group.spec(name).family for name in group.kernels}) == 1, group.kernels
