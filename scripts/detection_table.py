"""Run every planted bug under a profile and write the detection table into docs/detection.md.

For each planted bug (`tests.planted.every_planted_bug`), `harness.api.check` searches for a counterexample
(dtypes and longest length as the entry declares, else the profile's) and the table records: found or
not, the time to the first failing case and the total time with shrinking, the cases run and how many
of them expose the bug (`PlantedBug.exposes`), the first failing case's size and the shrunk case's size (length and input elements), the verdict, the cause and
the cond error. The table replaces whatever lies between the markers in docs/detection.md; the rest of
the file is hand-written and kept.

    python scripts/detection_table.py                    # ci profile, writes docs/detection.md
    python scripts/detection_table.py --profile dev --out /tmp/detection.md
    python scripts/detection_table.py --bugs ssm_gate_sigmoid,scan_batch_flattened --print
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

BEGIN = "<!-- BEGIN detection table (scripts/detection_table.py) -->"
END = "<!-- END detection table -->"
from harness.records import FAILING_VERDICTS as FAILING  # noqa: E402 - the one definition

from docblock import write_between_markers  # noqa: E402  (scripts/ is on sys.path when run as a script)
from tests.planted.search import Timeline, check_per_dtype, n_inputs  # noqa: E402


def run_bug(bug, profile: str, max_length: int | None) -> dict:
    timeline = Timeline()
    with tempfile.TemporaryDirectory() as tmp:
        result = check_per_dtype(bug.spec, bug.dtypes, profile=profile, max_length=bug.max_length or max_length,
                                 store=timeline, counterexample_dir=Path(tmp), check_determinism=False,
                                 grad=False)  # the forward search, as tests/test_planted_bugs.py's

    total = time.perf_counter() - timeline.start
    row = {"bug": bug.name, "family": bug.family.value, "exposed by": bug.exposed_by,
           "found": "yes" if not result.passed else "**NO**", "cases": len(timeline.stamps),
           "time to find (s)": None, "total (s)": round(total, 2),
           "exposing cases": sum(bool(bug.exposes(_problem(r))) for _, r in timeline.stamps)}
    first = next(((t, i, r) for i, (t, r) in enumerate(timeline.stamps) if r["verdict"] in FAILING), None)
    if first is not None:
        t, i, rec = first
        row["time to find (s)"] = round(t, 2)
        row["found at case"] = i + 1
        row["first L"] = rec["length"]
        row["first n_inputs"] = n_inputs(rec)
    fail = result.failure
    if fail is not None:
        row.update({"shrunk L": fail["length"], "shrunk n_inputs": n_inputs(fail), "dtype": fail["dtype"],
                    "verdict": fail["verdict"], "cause": fail["cause"],
                    "cond_max": fail.get("cond_max")})
    return row


def _problem(record: dict):
    from harness.problems import Problem

    names = {f.name for f in dataclasses.fields(Problem)} - {"values"}
    return Problem(**{k: record[k] for k in names if k in record})  # later fields: at their defaults


COLUMNS = ("bug", "family", "found", "time to find (s)", "found at case", "total (s)", "cases", "exposing cases",
           "first L",
           "first n_inputs", "shrunk L", "shrunk n_inputs", "dtype", "verdict", "cause", "cond_max", "exposed by")


def markdown(rows: list[dict], profile: str, max_length: int | None, seconds: float) -> str:
    from tabulate import tabulate

    import torch

    table = [[_fmt(r.get(c)) for c in COLUMNS] for r in rows]
    found = sum(r["found"] == "yes" for r in rows)
    lines = [
        BEGIN,
        "",
        f"Profile `{profile}`, lengths up to {max_length or 'the profile maximum'} unless the bug declares more; "
        f"torch {torch.__version__}, CPU. {found} of {len(rows)} planted bugs found; "
        f"{seconds:.0f} s in all.",
        "",
        tabulate(table, headers=COLUMNS, tablefmt="github", disable_numparse=True),
        "",
        END,
    ]
    return "\n".join(lines)


def _fmt(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "**no**"
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if abs(value) >= 1e4 or (value and abs(value) < 1e-2):
            return f"{value:.2e}"
        return f"{value:g}"
    return str(value)





def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="ci", choices=("dev", "ci", "nightly"))
    parser.add_argument("--max-length", type=int, default=None,
                        help="longest length for bugs that declare none (default: the profile's)")
    parser.add_argument("--bugs", default=None, help="comma-separated names (default: all)")
    parser.add_argument("--out", default=str(ROOT / "docs" / "detection.md"))
    parser.add_argument("--print", action="store_true", help="print the table instead of writing it")
    args = parser.parse_args(argv)

    from harness.settings import register_profiles
    from tests.planted import every_planted_bug

    register_profiles()
    wanted = set(args.bugs.split(",")) if args.bugs else None
    bugs = [b for b in every_planted_bug() if wanted is None or b.name in wanted]
    rows = []
    start = time.perf_counter()
    for bug in bugs:
        row = run_bug(bug, args.profile, args.max_length)
        rows.append(row)
        print(f"{bug.name:45s} found={row['found']:6s} t={row['time to find (s)']} total={row['total (s)']} "
              f"shrunk L={row.get('shrunk L')} n={row.get('shrunk n_inputs')} {row.get('verdict')} "
              f"{row.get('cause')}", file=sys.stderr, flush=True)
    block = markdown(rows, args.profile, args.max_length, time.perf_counter() - start)
    if args.print:
        print(block)
    else:
        write_between_markers(Path(args.out), block, begin=BEGIN, end=END, title="Detection of planted bugs")
        print(f"wrote {args.out}", file=sys.stderr)
    return 0 if all(r["found"] == "yes" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
