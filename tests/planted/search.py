"""Helpers shared by the planted-bug tests and `scripts/detection_table.py`: timing a search and sizing a case."""

from __future__ import annotations

import dataclasses
import time

from harness.problems import Problem


class Timeline:
    """A store for `harness.check` that notes when each record was taken (the time to the first failure)."""

    def __init__(self) -> None:
        self.start = time.perf_counter()
        self.stamps: list[tuple[float, dict]] = []

    def append(self, record: dict) -> None:
        self.stamps.append((time.perf_counter() - self.start, record))


def n_inputs(record: dict) -> int:
    """The number of input elements of a record's problem (the record holds the problem's fields)."""
    names = {f.name for f in dataclasses.fields(Problem)} - {"values"}
    return Problem(**{k: record[k] for k in names if k in record}).n_elements()  # later fields: at their defaults


def check_per_dtype(spec, dtypes: tuple[str, ...] | None, **kwargs):
    """`harness.api.check` one dtype at a time, as `harness check` runs a kernel (each dtype's search seeded
    apart, `harness.api.derandomized_seed`), until one finds a failure: the result of that search, or of the
    last. A search over several dtypes at once draws 25 cases in all at the ci profile, and a bug that one
    input regime of nine exposes then hangs on the luck of those draws (session 19: a change of the SSD draws
    left `ssd_negative_step_not_clamped` without one such case)."""
    from harness.api import check

    dtypes = dtypes or tuple(d for d in spec.capabilities.dtypes if spec.capabilities.runs(d, "cpu") is None)
    result = None
    for dtype in dtypes:
        result = check(spec, dtypes=(dtype,), **kwargs)
        if not result.passed:
            break
    return result
