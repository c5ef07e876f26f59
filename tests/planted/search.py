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
