"""Records on disk: one run directory, a header and JSON-lines files appended and flushed per record.

Layout of a run directory::

    run.json                  header: torch/python/device/git commit/harness version and commit, profile, command
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
    """The short commit of the git checkout at ``cwd``, with ``+dirty`` where its tracked files differ from it
    (a run of edited, uncommitted kernel code said only the commit it was edited from; a blind hunt, session
    24); None outside a checkout."""
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=cwd, capture_output=True, text=True,
                             timeout=5)
        commit = out.stdout.strip()
        if not commit:
            return None
        changed = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=cwd,
                                 capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    return f"{commit}+dirty" if changed.returncode == 0 and changed.stdout.strip() else commit


def harness_commit(package_dir: str | os.PathLike | None = None) -> str | None:
    """The harness's own commit (`git_commit` of the checkout its package is tracked in, ``+dirty`` where its
    tracked files are edited), None where the package is tracked by no checkout (installed from a wheel, into a
    virtual environment inside the caller's project too). ``harness_version`` is static: two runs of different
    harness code from an editable install had identical headers (a blind hunt, session 24).

    ``package_dir`` defaults to the directory of this package."""
    package = Path(package_dir) if package_dir is not None else Path(__file__).resolve().parent
    try:
        tracked = subprocess.run(["git", "ls-files", "--", "__init__.py"], cwd=package, capture_output=True,
                                 text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    if tracked.returncode != 0 or not tracked.stdout.strip():
        return None
    return git_commit(package)


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
        "harness_commit": harness_commit(),  # the harness's own code, where it runs from a checkout
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


def _drop_cut_line(path: Path) -> None:
    """Cut a records file back to its last complete line before appending to it (``--append`` after a run that
    was killed mid-write): the next record would otherwise be glued to the cut line, and the two read as one
    damaged line in the middle of the file (`load_records` refuses that; the cut record was lost anyway)."""
    if not path.is_file() or path.stat().st_size == 0:
        return
    with open(path, "rb+") as fh:
        fh.seek(-1, os.SEEK_END)
        if fh.read(1) == b"\n":
            return
        fh.seek(0)
        fh.truncate(fh.read().rfind(b"\n") + 1)


def _lock_run_dir(run_dir: Path) -> int | None:
    """An exclusive lock on ``run_dir`` for as long as the returned descriptor is open, or `InvalidArgument`
    when another live run holds it: two runs started into one directory (the same ``--report-dir``) would
    mix their records and leave the header of one. The lock is the kernel's (``flock``), so a run that is
    killed lets it go; where ``flock`` is missing, nothing is locked (None)."""
    try:
        import fcntl
    except ImportError:  # not POSIX
        return None
    from harness.errors import InvalidArgument

    fd = os.open(run_dir, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise InvalidArgument(f"run_dir={str(run_dir)!r} is being written by another run that is still going; "
                              "expected a directory no live run writes into (choose another --report-dir, or "
                              "wait for that run to end)") from None
    return fd


#: A run's header status from its start until its end is recorded (`RunStore.finish`).
NO_END_STATUS = ("PARTIAL: the run recorded no end (killed where nothing could mark it, e.g. by SIGKILL or the "
                 "out-of-memory killer, or still running)")


class RunStore:
    """Appends records of one run to ``<run_dir>/records[-worker].jsonl``, flushing each line."""

    def __init__(self, run_dir: str | os.PathLike, *, worker: str | None = None, header: dict | None = None):
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        name = f"records-{worker}.jsonl" if worker else "records.jsonl"
        self.path = self.run_dir / name
        self._lock = None
        self._header = None
        if header is not None and worker is None:  # a run's own writer: one at a time per directory
            self._lock = _lock_run_dir(self.run_dir)
            self._header = header
            # partial until its end is recorded (`finish`): a run killed where no handler runs (SIGKILL, the
            # out-of-memory killer) read as complete, and a gate passed it with its untaken cases "missing"
            self._write_header(dict(header, partial=True, status=NO_END_STATUS))
        _drop_cut_line(self.path)
        self._fh = open(self.path, "a", encoding="utf-8")

    def append(self, record: dict[str, Any]) -> None:
        self._fh.write(dumps(stamped(record)) + "\n")
        self._fh.flush()

    def _write_header(self, header: dict[str, Any]) -> None:
        (self.run_dir / HEADER_FILE).write_text(json.dumps(_encode(header), indent=2, sort_keys=True) + "\n")

    def finish(self) -> None:
        """Record the run's end: its header as given (complete unless it says otherwise)."""
        if self._header is not None:
            self._write_header(self._header)

    def close(self) -> None:
        self._fh.close()
        if self._lock is not None:
            os.close(self._lock)  # lets the directory's lock go
            self._lock = None

    def __enter__(self) -> "RunStore":
        return self

    def __exit__(self, exc_type, *exc) -> None:
        if exc_type is None:
            self.finish()
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
    """The run's header (``run.json``), ``{}`` when it has none; a header that is not a JSON object (a file
    cut short, or edited) is `InvalidArgument` naming it: a gate or a merge must not read a damaged run."""
    from harness.errors import InvalidArgument

    path = Path(run_dir) / HEADER_FILE
    if not path.is_file():
        return {}
    try:
        header = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise InvalidArgument(f"run header {str(path)!r} is not readable JSON ({exc}); expected the JSON object "
                              "a run writes (a damaged or hand-edited run.json?)") from None
    if not isinstance(header, dict):
        raise InvalidArgument(f"run header {str(path)!r} holds a JSON {type(header).__name__}; expected the JSON "
                              "object a run writes")
    return _decode(header)


#: Fields every record carries, each a string: what a report, a gate and a merge key their cells on.
REQUIRED_FIELDS = ("kernel", "verdict", "dtype")


def _text(value: Any) -> bool:
    return isinstance(value, str)


def _text_or_none(value: Any) -> bool:
    return value is None or isinstance(value, str)


def _positive_whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _positive_whole_or_none(value: Any) -> bool:
    return value is None or _positive_whole(value)


def _number_or_none(value: Any) -> bool:
    return value is None or (isinstance(value, (int, float)) and not isinstance(value, bool))


def _flag(value: Any) -> bool:
    return isinstance(value, bool)


#: The other fields a report, a gate and a merge key their cells and records on (`harness.report.cell_key`,
#: `harness.shard`), checked when present, with what each must be. A record whose only damage was
#: ``"length": "long"`` was read: it became a cell of its own ("length=?"), the baseline's divergent cell
#: turned "missing" and the gate passed (blind hunt 23b, P4). The harness writes every one of them with these
#: types (None only where it means "not set": no eps, no chunk size, the default device).
KEY_FIELDS: dict[str, tuple[Any, str]] = {
    "family": (_text, "a string"),
    "case": (_text, "a string"),
    "regime": (_text, "a string"),
    "mode": (_text, "a string"),
    "grad_of": (_text, "a string"),
    "device": (_text_or_none, "a string or null"),
    "tf32": (_flag, "true or false"),
    "length": (_positive_whole, "a positive integer"),
    "chunk_size": (_positive_whole_or_none, "a positive integer or null"),
    "eps": (_number_or_none, "a number or null"),
}


def _check_key_fields(where: str, record: dict[str, Any]) -> None:
    """`InvalidArgument` naming every `KEY_FIELDS` field of ``record`` whose value is not what it must be."""
    from harness.errors import InvalidArgument

    bad = [name for name, (fits, _) in KEY_FIELDS.items() if name in record and not fits(record[name])]
    if bad:
        shown = "; ".join(f"{name}={record[name]!r} must be {KEY_FIELDS[name][1]}" for name in bad)
        raise InvalidArgument(f"{where}: {shown}; a report and a gate key their cells on it (a damaged or "
                              "hand-edited record?)")


#: Record files whose cut last line was already reported (`load_records` is read several times a command).
_CUT_REPORTED: set[str] = set()


def _record_of(path: Path, number: int, line: str) -> dict[str, Any]:
    """Line ``number`` of records file ``path`` as a record, or `InvalidArgument` naming the file, the line and
    what is wrong with it (not JSON, not an object, a required field missing or not a string, a verdict not
    one of `harness.records.VERDICTS`, a `KEY_FIELDS` field of the wrong type)."""
    from harness.errors import InvalidArgument
    from harness.records import VERDICTS

    where = f"records file {str(path)!r} line {number}"
    try:
        value = json.loads(line)
    except (json.JSONDecodeError, RecursionError) as exc:
        raise InvalidArgument(f"{where} is not JSON ({exc}: {line[:60]!r}); expected one JSON object per line "
                              "(a damaged or hand-edited records file?)") from None
    if not isinstance(value, dict):
        raise InvalidArgument(f"{where} is a JSON {type(value).__name__} ({line[:60]!r}); expected one JSON "
                              "object per line")
    bad = [key for key in REQUIRED_FIELDS if not isinstance(value.get(key), str)]
    if bad:
        shown = ", ".join(f"{key}={value.get(key)!r}" for key in bad)
        raise InvalidArgument(f"{where}: {shown}; expected every record to carry {list(REQUIRED_FIELDS)} as "
                              "strings (a damaged or hand-edited record?)")
    if value["verdict"] not in VERDICTS:
        raise InvalidArgument(f"{where}: verdict={value['verdict']!r}; expected one of {list(VERDICTS)} (a report "
                              "and a gate rank verdicts by it: an unknown one read as better or worse than any; a "
                              "damaged or hand-edited record?)")
    record = _decode(value)
    _check_key_fields(where, record)
    return record


def _is_cut_last_line(text: str, lines: list[str], number: int) -> bool:
    """Whether line ``number`` is the file's last and was cut short: a run killed while writing it leaves it
    without its newline (`RunStore.append` writes a record and its newline in one write)."""
    return number == len(lines) and not text.endswith("\n")


def load_records(run_dir: str | os.PathLike) -> list[dict[str, Any]]:
    """Every record of a run (all workers' files merged), in a stable order (kernel, case).

    A last line cut short (a run killed while writing it: no newline after it) is skipped with a note on
    stderr; every complete line before it is kept. Any other line that is not a JSON object carrying
    `REQUIRED_FIELDS`, or a file that is not UTF-8, is not a record file: `InvalidArgument` names the file
    and the line, as the README promises for a malformed records file.
    """
    from harness.errors import InvalidArgument

    records = []
    for path in sorted(Path(run_dir).glob(RECORDS_GLOB)):
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError as exc:
            raise InvalidArgument(f"records file {str(path)!r} is not UTF-8 text ({exc.reason} at byte {exc.start}); "
                                  "expected JSON lines") from None
        lines = text.splitlines()
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                records.append(_record_of(path, number, line))
            except InvalidArgument:
                if not _is_cut_last_line(text, lines, number):
                    raise
                _report_cut_line(path, number)
    records.sort(key=lambda r: (str(r.get("kernel")), str(r.get("case")), str(r.get("eps"))))
    return records


def _report_cut_line(path: Path, number: int) -> None:
    """Say once per file on stderr that its last line, cut short, was left out (a report or gate that counts
    one case fewer says why)."""
    if str(path) not in _CUT_REPORTED:
        _CUT_REPORTED.add(str(path))
        print(f"harness: note: records file {str(path)!r} line {number} is cut short (a run killed while writing "
              "it?); it is left out, every complete line before it is kept", file=sys.stderr)


def write_records(path: str | os.PathLike, records: Iterable[dict[str, Any]]) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        for rec in records:
            fh.write(dumps(rec) + "\n")
