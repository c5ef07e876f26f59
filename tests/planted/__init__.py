"""Kernels with known mistakes, for the tests that say "the harness finds this".

- `tests.planted.bugs`: WRONG kernels, each a small variation of a correct in-tree kernel with one
  realistic mistake (the kind kernel issue threads report), listed in ``bugs.PLANTED``.
- `tests.planted.gated` and `tests.planted.tiling`: the same for the gated-decay families and for kernels
  that tile their head dims and state sizes; `every_planted_bug` lists all three.
- `tests.planted.broken`: kernels that break the call contract (raise, hang, wrong shape / dtype /
  device, not a tensor, write into their inputs, nondeterministic), listed in ``broken.BROKEN``.

These modules are test data: they import only torch and `harness.kernels.*` (for the parts that are
correct) and never the test framework, so `scripts/detection_table.py` and `scripts/calibrate.py` can
import them too.
"""


def every_planted_bug() -> list:
    """Every planted wrong kernel: the scans' and retention's (`bugs.PLANTED`), the gated families'
    (`gated.GATED_PLANTED`) and the tiled kernels' (`tiling.TILING_PLANTED`), in that order."""
    from tests.planted.bugs import PLANTED
    from tests.planted.gated import GATED_PLANTED
    from tests.planted.tiling import TILING_PLANTED

    return [*PLANTED, *GATED_PLANTED, *TILING_PLANTED]
