"""Sharding a sweep across CI jobs or machines, and merging the shards' runs back into one.

A nightly sweep is split the way CI systems split test suites: job K of N runs ``--shard K/N``, the
cases at positions ``K-1, K-1+N, K-1+2N, ...`` of the sweep's stable case order (round robin, so that
the long and short cases of each grid spread over the jobs), and ``harness merge RUN...`` joins the
runs into one whose records, and so whose report, equal the unsharded run's. The split depends only on
the sweep's definition and on which kernels are available (which the run header records), never on
timing, so every job computes the same partition independently.

`merge_runs` refuses what would give a wrong report: runs of different sweeps (or versions of one sweep
file), checks, machines or code
(`run_identity`: the header fields in `MUST_AGREE`, the options of the recorded command but those of
`PER_JOB_OPTIONS`, and the records' verdict threshold), a shard given twice, shards of different counts,
a case recorded by two shards, and (unless ``allow_missing``) a missing or partial (interrupted) shard; a
run merged without all of them is marked partial.
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
MUST_AGREE = ("harness_version", "harness_commit", "torch", "python", "device", "cuda", "git_commit", "profile",
              "sweep_digest")

#: Options of `harness check` and `harness sweep` (their argparse destinations) that say where a job writes
#: or what it prints, not what it runs: the shards of one run differ in them, and in nothing else they
#: were given.
PER_JOB_OPTIONS = frozenset({"shard", "report_dir", "cases_dir", "append", "quiet", "no_summary", "func"})

#: The commands whose runs are sharded (``--shard K/N``) and merged.
SHARDED_COMMANDS = ("check", "sweep")

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

    Raises `InvalidArgument` for runs that cannot be one run (see the module docstring). With
    ``allow_missing``, missing shards and partial shards are merged and the merged header says
    ``partial``, with what is missing in its ``status``.
    """
    from harness.store import HEADER_FILE, RunStore, load_header, load_records

    dirs = [Path(d) for d in run_dirs]
    if not dirs:
        raise InvalidArgument("merge needs at least one run directory")
    headers, records, seen_shards, counts = [], [], {}, set()
    owner: dict[tuple[str, str, str, str], Path] = {}
    agreed: dict[str, tuple[Path, Any]] = {}  # run_identity's entries: the run that gave each, its value
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
        run_records = load_records(run_dir)
        _same_run(agreed, run_dir, run_identity(header, run_records))
        headers.append(header)
        for record in run_records:
            key = _record_key(record)
            # a search may take one case twice (hypothesis replays a draw): one run's own repeat is no overlap
            # (a complete pair of check shards was refused, a verification found, session 23)
            if key in owner and owner[key] != run_dir:
                raise InvalidArgument(f"case {key[1]!r} of {key[0]!r} is in both {str(owner[key])!r} and "
                                      f"{str(run_dir)!r}: the shards overlap")
            owner[key] = run_dir
            records.append(record)
    if len(counts) > 1:
        raise InvalidArgument(f"shards of different counts cannot be merged: {sorted(seen_shards)}")
    missing = _missing_parts(dirs, headers, seen_shards, next(iter(counts), None))
    if missing and not allow_missing:
        raise InvalidArgument(f"the merged run would be partial: {'; '.join(missing)}; rerun what is missing, or "
                              "pass allow_missing (--allow-missing) to merge a partial run (marked partial)")
    header = {k: v for k, v in headers[0].items() if k not in ("shard", "partial", "status")}
    header["merged_from"] = [str(d) for d in dirs]
    if counts:
        header["shards"] = f"{len(seen_shards)} of {next(iter(counts))}"
    if missing:
        header.update(partial=True, status=f"PARTIAL: merged without all of the run: {'; '.join(missing)}")
    out = Path(out_dir)
    with RunStore(out, header=header) as store:
        for record in sorted(records, key=_record_key):
            store.append(record)
    return load_records(out)


def _missing_parts(dirs: list[Path], headers: list[dict[str, Any]], seen_shards: dict[str, Path],
                   count: int | None) -> list[str]:
    """What a merge of these runs would lack: shards not given, and shards that are partial (interrupted:
    their header's ``partial``, `harness.store.mark_partial`), whose cases after the interruption never ran."""
    parts = []
    if count is not None:
        absent = [f"{k}/{count}" for k in range(1, count + 1) if f"{k}/{count}" not in seen_shards]
        if absent:
            parts.append(f"shards {absent} are missing (given: {sorted(seen_shards)})")
    for run_dir, header in zip(dirs, headers):
        if header.get("partial"):
            parts.append(f"run {str(run_dir)!r} is partial ({header.get('status') or 'partial'})")
    return parts


def run_identity(header: dict[str, Any], records: list[dict[str, Any]]) -> dict[str, Any]:
    """What must be the same in every shard of one run, by the name a refusal gives it: the header fields of
    `MUST_AGREE`, the options of the run's command (`command_options`: ``--kernel``, ``--max-examples``,
    ``--max-length``, ``--dtypes``, ``--policy``, ...), and the verdict threshold its records were judged
    with (``cond_threshold``; the project's table may set the policy without a flag). A shard with no record
    that carries a threshold (an empty shard) has none to compare."""
    identity: dict[str, Any] = {repr(field): header.get(field) for field in MUST_AGREE}
    options = command_options(header.get("command"))
    options.pop("--profile", None)  # the header's profile is the one the run used ("ci" typed or by default)
    if header.get("kernels") is not None:  # the kernels as named (`canonical_target`), not as --kernel was typed:
        options.pop("--kernel", None)      # ./k.py, k.py from its folder, an absolute path are one kernel
        options.pop("--family", None)      # (a verification's shards of one kernel were refused, session 23)
        identity["the kernels checked"] = header["kernels"]
    identity.update(options)
    thresholds = sorted({r["cond_threshold"] for r in records if isinstance(r.get("cond_threshold"), (int, float))})
    if thresholds:
        identity["the records' cond_threshold (the verdict policy)"] = thresholds
    return identity


def command_options(command: Any) -> dict[str, Any]:
    """The options of a recorded ``harness check`` / ``harness sweep`` command line, read by the command's own
    parser (`harness.cli.build_parser`: order, ``--opt=value``, a repeated option and defaults as the run
    read them), less `PER_JOB_OPTIONS`, by option name (``--max-examples``). The header records the command
    as ``" ".join(sys.argv)``, so a value with a space in it is compared by its first word. Another command
    (a pytest session) gives ``{"command": None}``: not compared; a line the parser cannot read is compared
    as written."""
    import contextlib
    import io

    from harness.cli import build_parser

    words = str(command or "").split()
    start = next((i for i, w in enumerate(words) if w.startswith("-") or w in SHARDED_COMMANDS), len(words))
    if start == len(words) or words[start] not in SHARDED_COMMANDS:
        return {"command": None}
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            parsed, _ = build_parser().parse_known_args(words[start:])
    except SystemExit:
        return {"command": " ".join(words[start:])}
    options = {k: v for k, v in vars(parsed).items() if k not in PER_JOB_OPTIONS}
    return {(k if k == "command" else "--" + k.replace("_", "-")): v for k, v in sorted(options.items())}


def _same_run(agreed: dict[str, tuple[Path, Any]], run_dir: Path, identity: dict[str, Any]) -> None:
    """Raise `InvalidArgument` naming the first entry of ``run_dir``'s `run_identity` that differs from the
    runs before it (``agreed``: each entry's first run and value), else add its new entries to ``agreed`` (an
    entry only some runs have, the threshold of a shard with records, is compared among those)."""
    for name, value in identity.items():
        first_dir, agreed_value = agreed.setdefault(name, (run_dir, value))
        if agreed_value != value:
            raise InvalidArgument(f"runs {str(first_dir)!r} and {str(run_dir)!r} differ in {name} "
                                  f"({agreed_value!r} vs {value!r}): they are not shards of one run")


def shard_header(shard: Shard | None) -> dict[str, Any]:
    """The header fields that mark a run as one shard (empty for an unsharded run)."""
    return {} if shard is None else {"shard": shard.label}


__all__ = ["MUST_AGREE", "PER_JOB_OPTIONS", "Shard", "command_options", "merge_runs", "run_identity", "shard_header"]
