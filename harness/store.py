"""Records on disk: one run directory, a header and JSON-lines files appended and flushed per record.

Layout of a run directory::

    run.json                  header: torch/python/device/git commit/harness version, profile, command
    records.jsonl             one JSON object per line, one line per case (written as it is measured)
    records-<worker>.jsonl    the same, from a pytest-xdist worker (merged by `load_records`)

A crash or a timeout keeps every line written before it. Non-finite floats are written as the strings
"nan", "inf", "-inf" (strict JSON has no literal for them) and read back as floats.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterable

HEADER_FILE = "run.json"
RECORDS_GLOB = "records*.jsonl"

_NONFINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


def _encode(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, dict):
        return {k: _encode(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_encode(v) for v in value]
    return value


def _decode(value: Any) -> Any:
    if isinstance(value, str) and value in _NONFINITE:
        return _NONFINITE[value]
    if isinstance(value, dict):
        return {k: _decode(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_decode(v) for v in value]
    return value


def dumps(record: dict[str, Any]) -> str:
    """One record as one line of strict JSON (keys sorted, so the same run gives the same bytes)."""
    return json.dumps(_encode(record), sort_keys=True, allow_nan=False, default=str)


def loads(line: str) -> dict[str, Any]:
    """One line of `dumps` back as a record (non-finite numbers restored)."""
    return _decode(json.loads(line))


def stamped(record: dict[str, Any]) -> dict[str, Any]:
    """``record`` with this harness's `harness.records.SCHEMA_VERSION` when it carries none (a record
    read from an older run keeps the version it was written with)."""
    from harness.records import SCHEMA_VERSION

    return record if "schema_version" in record else {"schema_version": SCHEMA_VERSION, **record}


def git_commit(cwd: str | os.PathLike | None = None) -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=cwd, capture_output=True, text=True,
                             timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def environment(profile: str | None = None, command: str | None = None) -> dict[str, Any]:
    """What a run's header records about the machine and the code."""
    import torch

    from harness import __version__

    from harness.kernels.triton_interpreter import describe as triton_layer

    cuda = torch.cuda.is_available()
    from harness.records import SCHEMA_VERSION

    return {
        "schema_version": SCHEMA_VERSION,
        "harness_version": __version__,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "device": torch.cuda.get_device_name(0) if cuda else f"cpu ({platform.processor() or platform.machine()})",
        "cuda": torch.version.cuda if cuda else None,
        "git_commit": git_commit(Path.cwd()),  # the caller's project, not the installed package
        "profile": profile,
        "command": command or " ".join(sys.argv),
        "started": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        # whether Triton kernels run interpreted here, and the corrections that make it compute as a GPU
        "triton_interpreter": triton_layer(),
    }


class RunStore:
    """Appends records of one run to ``<run_dir>/records[-worker].jsonl``, flushing each line."""

    def __init__(self, run_dir: str | os.PathLike, *, worker: str | None = None, header: dict | None = None):
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        name = f"records-{worker}.jsonl" if worker else "records.jsonl"
        self.path = self.run_dir / name
        if header is not None and worker is None:
            (self.run_dir / HEADER_FILE).write_text(json.dumps(_encode(header), indent=2, sort_keys=True) + "\n")
        self._fh = open(self.path, "a", encoding="utf-8")

    def append(self, record: dict[str, Any]) -> None:
        self._fh.write(dumps(stamped(record)) + "\n")
        self._fh.flush()

    def close(self) -> None:
        self._fh.close()

    def __enter__(self) -> "RunStore":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def mark_partial(run_dir: str | os.PathLike, reason: str) -> None:
    """Mark the run in ``run_dir`` as partial (interrupted): ``partial`` and ``status`` in its header.

    Every record taken before the interruption is kept; the report shows the header's status, so a
    partial run is never read as a complete one.
    """
    header = load_header(run_dir)
    n = len(load_records(run_dir)) if Path(run_dir).is_dir() else 0
    header.update(partial=True, status=f"PARTIAL: {reason} after {n} records")
    path = Path(run_dir) / HEADER_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(_encode(header), indent=2, sort_keys=True, default=str) + "\n")


def has_records(run_dir: str | os.PathLike) -> bool:
    """Whether ``run_dir`` already holds records (a reused report directory)."""
    return any(p.stat().st_size > 0 for p in Path(run_dir).glob(RECORDS_GLOB)) if Path(run_dir).is_dir() else False


def load_header(run_dir: str | os.PathLike) -> dict[str, Any]:
    path = Path(run_dir) / HEADER_FILE
    return _decode(json.loads(path.read_text())) if path.is_file() else {}


def load_records(run_dir: str | os.PathLike) -> list[dict[str, Any]]:
    """Every record of a run (all workers' files merged), in a stable order (kernel, case).

    A line cut short by a crash is skipped; every complete line before it is kept. A line that is JSON
    but not an object, or a file that is not UTF-8, is not a record file: `InvalidArgument` names it.
    """
    from harness.errors import InvalidArgument

    records = []
    for path in sorted(Path(run_dir).glob(RECORDS_GLOB)):
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError as exc:
            raise InvalidArgument(f"records file {str(path)!r} is not UTF-8 text ({exc.reason} at byte {exc.start}); "
                                  "expected JSON lines") from None
        for number, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                value = json.loads(line)
            except json.JSONDecodeError:
                continue
            if not isinstance(value, dict):
                raise InvalidArgument(f"records file {str(path)!r} line {number} is a JSON {type(value).__name__} "
                                      f"({line[:60]!r}); expected one JSON object per line")
            records.append(_decode(value))
    records.sort(key=lambda r: (str(r.get("kernel")), str(r.get("case")), str(r.get("eps"))))
    return records


def write_records(path: str | os.PathLike, records: Iterable[dict[str, Any]]) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        for rec in records:
            fh.write(dumps(rec) + "\n")
