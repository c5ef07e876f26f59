"""Kernels with known mistakes, for the tests that say "the harness finds this".

- `tests.planted.bugs`: WRONG kernels, each a small variation of a correct in-tree kernel with one
  realistic mistake (the kind kernel issue threads report), listed in ``bugs.PLANTED``.
- `tests.planted.broken`: kernels that break the call contract (raise, hang, wrong shape / dtype /
  device, not a tensor, write into their inputs, nondeterministic), listed in ``broken.BROKEN``.

These modules are test data: they import only torch and `harness.kernels.*` (for the parts that are
correct) and never the test framework, so `scripts/detection_table.py` and `scripts/calibrate.py` can
import them too.
"""
