"""Sharding a sweep across CI jobs or machines, and merging the shards' runs back into one.

A nightly sweep is split the way CI systems split test suites: job K of N runs ``--shard K/N``, the
cases at positions ``K-1, K-1+N, K-1+2N, ...`` of the sweep's stable case order (round robin, so that
the long and short cases of each grid spread over the jobs), and ``harness merge RUN...`` joins the
runs into one whose records, and so whose report, equal the unsharded run's. The split depends only on
the sweep's definition and on which kernels are available (which the run header records), never on
timing, so every job computes the same partition independently.

`merge_runs` refuses what would give a wrong report: runs of different sweeps, machines or code
(the header fields in `MUST_AGREE`), a shard given twice, shards of different counts, a case recorded
by two shards, and (unless ``allow_missing``) a missing shard.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator, TypeVar

from harness.errors import InvalidArgument

T = TypeVar("T")

#: Header fields that must be the same in every shard of one merged run.
MUST_AGREE = ("harness_version", "torch", "python", "device", "cuda", "git_commit", "profile")

_SHARD = re.compile(r"^\s*(\d+)\s*/\s*(\d+)\s*$")


@dataclass(frozen=True)
class Shard:
    """Job ``index`` (1-based) of ``count``."""

    index: int
    count: int

    def __post_init__(self) -> None:
        if self.count < 1 or not 1 <= self.index <= self.count:
            raise InvalidArgument(f"shard={self.index}/{self.count}: expected K/N with 1 <= K <= N "
                                  f"(for example 1/4 for the first of four jobs)")

    @classmethod
    def parse(cls, text: str) -> "Shard":
        """``"K/N"`` as a Shard; anything else is an `InvalidArgument` naming the value."""
        match = _SHARD.match(str(text))
        if not match:
            raise InvalidArgument(f"--shard={text!r}: expected K/N, two whole numbers with 1 <= K <= N "
                                  f"(for example 2/4 for the second of four jobs)")
        return cls(int(match.group(1)), int(match.group(2)))

    @property
    def label(self) -> str:
        return f"{self.index}/{self.count}"

    def take(self, items: Iterable[T]) -> Iterator[T]:
        """This shard's items: the ones at positions ``index - 1`` modulo ``count`` of ``items``."""
        for position, item in enumerate(items):
            if position % self.count == self.index - 1:
                yield item


def _record_key(record: dict[str, Any]) -> tuple[str, str, str, str]:
    return (str(record.get("kernel")), str(record.get("case")), str(record.get("eps")), str(record.get("mode")))


def merge_runs(run_dirs: Iterable[str | os.PathLike], out_dir: str | os.PathLike, *,
               allow_missing: bool = False) -> list[dict[str, Any]]:
    """Join the records of sharded runs into ``out_dir`` (a header and one records file) and return them.

    Raises `InvalidArgument` for runs that cannot be one run (see the module docstring).
    """
    from harness.store import HEADER_FILE, RunStore, load_header, load_records

    dirs = [Path(d) for d in run_dirs]
    if not dirs:
        raise InvalidArgument("merge needs at least one run directory")
    headers, records, seen_shards, counts = [], [], {}, set()
    owner: dict[tuple[str, str, str, str], Path] = {}
    for run_dir in dirs:
        if not (run_dir / HEADER_FILE).is_file():
            raise InvalidArgument(f"run_dir={str(run_dir)!r} is not a run directory (no {HEADER_FILE})")
        header = load_header(run_dir)
        shard = header.get("shard")
        if shard is not None:
            parsed = Shard.parse(shard)
            if parsed.label in seen_shards:
                raise InvalidArgument(f"shard {parsed.label} is given twice: {str(seen_shards[parsed.label])!r} "
                                      f"and {str(run_dir)!r}")
            seen_shards[parsed.label] = run_dir
            counts.add(parsed.count)
        for field in MUST_AGREE:
            if headers and header.get(field) != headers[0].get(field):
                raise InvalidArgument(f"runs {str(dirs[0])!r} and {str(run_dir)!r} differ in {field!r} "
                                      f"({headers[0].get(field)!r} vs {header.get(field)!r}): they are not "
                                      f"shards of one run")
        headers.append(header)
        for record in load_records(run_dir):
            key = _record_key(record)
            if key in owner:
                raise InvalidArgument(f"case {key[1]!r} of {key[0]!r} is in both {str(owner[key])!r} and "
                                      f"{str(run_dir)!r}: the shards overlap")
            owner[key] = run_dir
            records.append(record)
    if len(counts) > 1:
        raise InvalidArgument(f"shards of different counts cannot be merged: {sorted(seen_shards)}")
    if counts:
        (count,) = counts
        missing = [f"{k}/{count}" for k in range(1, count + 1) if f"{k}/{count}" not in seen_shards]
        if missing and not allow_missing:
            raise InvalidArgument(f"shards {missing} are missing (given: {sorted(seen_shards)}); pass "
                                  f"allow_missing (--allow-missing) to merge a partial run")
    header = {k: v for k, v in headers[0].items() if k != "shard"}
    header["merged_from"] = [str(d) for d in dirs]
    if counts:
        header["shards"] = f"{len(seen_shards)} of {next(iter(counts))}"
    out = Path(out_dir)
    with RunStore(out, header=header) as store:
        for record in sorted(records, key=_record_key):
            store.append(record)
    return load_records(out)


def shard_header(shard: Shard | None) -> dict[str, Any]:
    """The header fields that mark a run as one shard (empty for an unsharded run)."""
    return {} if shard is None else {"shard": shard.label}


__all__ = ["MUST_AGREE", "Shard", "merge_runs", "shard_header"]
