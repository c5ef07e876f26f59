"""Kernels with known mistakes, for the tests that say "the harness finds this".

- `tests.planted.bugs`: WRONG kernels, each a small variation of a correct in-tree kernel with one
  realistic mistake (the kind kernel issue threads report), listed in ``bugs.PLANTED``.
- `tests.planted.broken`: kernels that break the call contract (raise, hang, wrong shape / dtype /
  device, not a tensor, write into their inputs, nondeterministic), listed in ``broken.BROKEN``.

These modules are test data: they import only torch and `harness.kernels.*` (for the parts that are
correct) and never the test framework, so `scripts/detection_table.py` and `scripts/calibrate.py` can
import them too.
"""

from __future__ import annotations

import contextlib
from typing import Iterator


def element_bounds_bug_present() -> bool:
    """True while `harness.strategies` asks hypothesis for float32-width floats between bounds that
    float32 cannot represent (``large``/``tiny`` regimes: e.g. +-2147483615.9999993 for float32 data,
    +-5.8e76 for float64), which makes hypothesis raise InvalidArgument / OverflowError whenever it
    draws explicit element values for those regimes.
    """
    import numpy as np

    from harness.kernels.contract import Family
    from harness.strategies import _element_bounds

    for dtype in ("float64", "float32", "bfloat16"):
        for regime in ("large", "tiny"):
            lo, hi = _element_bounds(Family.LINEAR_SCAN, regime, dtype, "b", False)
            with np.errstate(over="ignore"):
                if float(np.float32(lo)) != lo or float(np.float32(hi)) != hi:
                    return True
    return False


@contextlib.contextmanager
def representable_element_bounds() -> Iterator[bool]:
    """Work around the `harness.strategies._element_bounds` bug above while it is present.

    Narrows each bound to the nearest float32 inside it (and inside float32's range), which is what the
    strategy's ``width=32`` means. Yields whether the workaround was applied; does nothing once the
    harness is fixed. Scoped: the original function is restored on exit.
    """
    if not element_bounds_bug_present():
        yield False
        return
    import numpy as np

    import harness.strategies as strategies

    original = strategies._element_bounds
    f32 = np.finfo(np.float32)

    def inward(x: float, toward: float) -> float:
        with np.errstate(over="ignore"):
            y = np.float32(min(max(x, -float(f32.max)), float(f32.max)))
        if (float(y) > x and toward < x) or (float(y) < x and toward > x) or not np.isfinite(y):
            y = np.nextafter(y, np.float32(toward))
        return float(y)

    def bounds(*args, **kwargs):
        lo, hi = original(*args, **kwargs)
        return inward(lo, hi), inward(hi, lo)

    strategies._element_bounds = bounds
    try:
        yield True
    finally:
        strategies._element_bounds = original
