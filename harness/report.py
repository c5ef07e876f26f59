"""Tables of a run: what a person reads after a sweep, a `harness check` or a pytest session.

`build_report(run_dir)` reads the run's records (`harness.store.load_records`) and header and writes,
into ``out_dir`` (default: the run directory):

- ``index.md``: GitHub-flavoured Markdown that a reviewer can act on from its first screen: the count
  of each verdict and the run header in one line, the findings (`harness.findings`: one line per
  conclusion, worst first, with its cause and supporting number), the sweep's declared question and
  its table (`harness.answers`, from the header), the summary with its cause column (all-equivalent
  rows folded when there are many); then, folded in ``<details>``, the failing cases (each linked to
  its figure, with replay commands), the cells, the growth fits, the figures and the full header;
- ``summary.csv``: per kernel and dtype, the verdict counts and the worst case, worst first;
- ``cells.csv``: per kernel x dtype x length bucket x eps x chunk_size x regime (a *cell*; the gate
  matches runs on the same key): max abs, max rel, RMS ratio, ULP p99, condition-normalized error
  (cond_max), baseline ratio, non-finite classes, onset;
- ``growth.csv``: per kernel, dtype and regime, the exponent ``b`` of ``error ~ length**b`` fitted by
  least squares on log-log axes across records (max_abs and cond_max), where a kernel has records at
  three or more distinct lengths;
- ``failures.csv``: every case whose verdict is not ``equivalent``, with its replay command;
- ``report.json``: the header and every table;
- ``plot_*.png``: the figures of `harness.plots` (``plots=True``);
- ``case_<kernel>_<case>.png``: the first failing cases along the sequence (`harness.plots.plot_case`).

Everything is derived from the records, and the same records give byte-identical files: rows are
sorted, floats are written with a fixed format ("{:.3g}" in Markdown, "{:.6g}" in CSV and JSON), and
the only timestamp is the header's own. Timings (``t_*``) are left out on purpose.

`summary_markdown(records)` is the short table that the CLI and the pytest plugin print, and that
`append_step_summary` adds to ``$GITHUB_STEP_SUMMARY`` on GitHub Actions.

Any field of a record may be missing or None (a ``kernel_error`` record has no metrics): every table
tolerates that and shows ``-``.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np
import pandas as pd

from harness.findings import findings

from harness.records import SEVERITY, VERDICTS, severity  # noqa: F401 - one definition, re-exported

#: The key of a cell, in the order tables show it (the gate matches runs on the same key). The device
#: and TF32 are part of it: CUDA, TF32 and CPU records of one kernel and dtype are different cells.
CELL_KEYS: tuple[str, ...] = ("kernel", "family", "dtype", "device", "tf32", "length_bucket", "eps", "chunk_size",
                              "regime")

#: The metrics aggregated per cell (the maximum over the cell's records).
CELL_METRICS: tuple[str, ...] = ("max_abs", "max_rel", "rms_ratio", "ulp_p99", "cond_max", "baseline_ratio")

#: Metrics fitted against length in the growth table.
GROWTH_METRICS: tuple[str, ...] = ("max_abs", "cond_max")

#: The fewest distinct lengths a growth fit needs.
MIN_GROWTH_LENGTHS = 3

#: Failing cases listed in index.md (all of them are in failures.csv and report.json).
MAX_MARKDOWN_FAILURES = 50

#: Files the report writes (plots are ``plot_*.png``, see `harness.plots`).
REPORT_FILES: tuple[str, ...] = ("index.md", "summary.csv", "cells.csv", "growth.csv", "failures.csv",
                                 "report.json")

#: The figures the report writes (`harness.plots`): the summary plots and the failing cases along the sequence.
FIGURE_GLOBS: tuple[str, ...] = ("plot_*.png", "case_*.png")

#: Header fields shown in index.md, in order.
HEADER_FIELDS: tuple[str, ...] = ("harness_version", "harness_commit", "torch", "python", "device", "cuda",
                                  "git_commit", "profile", "platform", "command", "started")

_MD_FLOAT = "{:.3g}"
_DATA_FLOAT = "{:.6g}"


@dataclass(frozen=True)
class ReportPaths:
    """The files `build_report` wrote."""

    out_dir: Path
    index: Path
    summary_csv: Path
    cells_csv: Path
    growth_csv: Path
    failures_csv: Path
    report_json: Path
    plots: tuple[Path, ...] = field(default_factory=tuple)
    case_figures: tuple[Path, ...] = field(default_factory=tuple)

    def files(self) -> list[Path]:
        return [self.index, self.summary_csv, self.cells_csv, self.growth_csv, self.failures_csv,
                self.report_json, *self.plots, *self.case_figures]


# ------------------------------------------------------------------------------------ record fields
def number(value: Any) -> float:
    """A record's field as a float (NaN when missing, None, a bool or not a number)."""
    if isinstance(value, bool) or value is None:
        return math.nan
    if isinstance(value, (int, float, np.integer, np.floating)):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return math.nan
    return math.nan


def length_bucket(length: Any) -> tuple[int, str]:
    """The power-of-two bucket of ``length``: (index, label) with labels 1, 2-3, 4-7, 8-15, ...

    A missing or non-positive length is bucket (-1, "?").
    """
    try:
        n = int(length)
    except (TypeError, ValueError):
        return -1, "?"
    if n < 1:
        return -1, "?"
    k = n.bit_length() - 1
    lo, hi = 1 << k, (1 << (k + 1)) - 1
    return k, (str(lo) if lo == hi else f"{lo}-{hi}")


#: A key or text field a record does not set (no eps, no chunk size, no error), as the tables hold it: shown so
#: in Markdown, written empty in CSV and null in JSON (`_write_csv`, `table_records`), as docs/reports.md says.
MISSING_KEY = "-"


def _key_text(value: Any) -> str:
    """A cell key's text: `MISSING_KEY` for None, the shortest exact repr for floats, str otherwise."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return MISSING_KEY
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, float):
        return repr(value)
    return str(value)


def _sortable(value: Any) -> tuple[int, float, str]:
    """Sort None first, then numbers numerically, then text."""
    if value is None:
        return (0, 0.0, "")
    v = number(value)
    if not math.isnan(v):
        return (1, v, "")
    return (2, 0.0, str(value))


def _cond_rank(value: Any) -> float:
    """How bad a cond_max is, for ordering: None ranks lowest, NaN (a broken measurement) highest."""
    if value is None:
        return -math.inf
    v = number(value)
    return math.inf if math.isnan(v) else v


def case_cond(record: Mapping[str, Any]) -> Any:
    """A case's cond_max over its measured targets: the output's, or the final state's where that is worse
    (a gated kernel with a right output and a wrong final state is divergent on the latter)."""
    out, state = record.get("cond_max"), record.get("final_state_cond_max")
    return state if state is not None and _cond_rank(state) > _cond_rank(out) else out


def canonical_order(records: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The records in one order that does not depend on which file or worker wrote them.

    Ordered by what names a case; records that share all of it (a case's gradient rows, a rerun) by their
    whole text, which is formed only for them: a report orders its records a dozen times, and forming every
    record's text each time took over a second per 200 records (seconds of a stopped run's grace period)."""
    from itertools import groupby

    from harness.store import dumps

    def key(r: Mapping[str, Any]) -> tuple:
        return (str(r.get("kernel")), str(r.get("family")), str(r.get("dtype")), _sortable(r.get("length")),
                str(r.get("regime")), _sortable(r.get("eps")), _sortable(r.get("chunk_size")), str(r.get("case")))

    def text(r: Mapping[str, Any]) -> str:
        return dumps({k: v for k, v in r.items() if not str(k).startswith("t_")})

    ordered: list[Mapping[str, Any]] = []
    for _, tied in groupby(sorted(records, key=key), key=key):
        group = list(tied)
        ordered.extend(sorted(group, key=text) if len(group) > 1 else group)
    return ordered


def cell_key(record: Mapping[str, Any]) -> tuple[str, ...]:
    """The cell a record belongs to, as text (the order of `CELL_KEYS`)."""
    return (_key_text(record.get("kernel")), _key_text(record.get("family")), _key_text(record.get("dtype")),
            _key_text(record.get("device") or "cpu"), "tf32" if record.get("tf32") else "-",
            length_bucket(record.get("length"))[1], _key_text(record.get("eps")),
            _key_text(record.get("chunk_size")), _key_text(record.get("regime")))


def _cell_sort_key(record: Mapping[str, Any]) -> tuple:
    return (str(record.get("kernel")), str(record.get("family")), str(record.get("dtype")),
            str(record.get("device") or "cpu"), bool(record.get("tf32")), length_bucket(record.get("length"))[0], _sortable(record.get("eps")),
            _sortable(record.get("chunk_size")), str(record.get("regime")))


def _nonfinite_classes(values: Iterable[Any]) -> str:
    found = {str(v) for v in values if v not in (None, "", "none")}
    return ",".join(sorted(found))


def _nanmax(values: Iterable[Any]) -> float:
    nums = [number(v) for v in values]
    nums = [v for v in nums if not math.isnan(v)]
    return max(nums) if nums else math.nan


def _nanmin(values: Iterable[Any]) -> float:
    nums = [number(v) for v in values]
    nums = [v for v in nums if not math.isnan(v)]
    return min(nums) if nums else math.nan


def verdict_counts(records: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    """How many records have each verdict (every verdict of `VERDICTS`, then any other, sorted)."""
    counts = {v: 0 for v in VERDICTS}
    extra: dict[str, int] = {}
    for r in records:
        v = str(r.get("verdict"))
        if v in counts:
            counts[v] += 1
        else:
            extra[v] = extra.get(v, 0) + 1
    counts.update(sorted(extra.items()))
    return counts


# ------------------------------------------------------------------------------------------- tables
SUMMARY_COLUMNS = ("kernel", "family", "dtype", "n", *VERDICTS, "worst_verdict", "worst_cause", "worst_cond_max",
                   "worst_max_abs", "worst_length", "worst_regime", "worst_eps", "worst_chunk_size", "worst_case")


def summary_table(records: Sequence[Mapping[str, Any]]) -> pd.DataFrame:
    """Per kernel and dtype: the verdict counts and the worst case, worst first.

    The worst case is the one with the worst verdict (`SEVERITY`), then the highest cond_max.
    Rows are ordered by that same worst case, then kernel and dtype.
    """
    groups: dict[tuple[str, str, str], list[Mapping[str, Any]]] = {}
    for r in canonical_order(records):
        groups.setdefault((_key_text(r.get("kernel")), _key_text(r.get("family")), _key_text(r.get("dtype"))),
                          []).append(r)
    rows = []
    for (kernel, family, dtype), recs in groups.items():
        worst = max(recs, key=lambda r: (severity(r.get("verdict")), _cond_rank(case_cond(r))))
        counts = verdict_counts(recs)
        row: dict[str, Any] = {"kernel": kernel, "family": family, "dtype": dtype, "n": len(recs)}
        row.update({v: counts.get(v, 0) for v in VERDICTS})
        row.update({
            "worst_verdict": str(worst.get("verdict")), "worst_cause": _key_text(worst.get("cause")),
            "worst_cond_max": number(case_cond(worst)),
            "worst_max_abs": number(worst.get("max_abs")), "worst_length": number(worst.get("length")),
            "worst_regime": _key_text(worst.get("regime")), "worst_eps": _key_text(worst.get("eps")),
            "worst_chunk_size": _key_text(worst.get("chunk_size")), "worst_case": _key_text(worst.get("case")),
            "_rank": (-severity(worst.get("verdict")), -_cond_rank(case_cond(worst)), kernel, family, dtype),
        })
        rows.append(row)
    rows.sort(key=lambda row: row["_rank"])
    for row in rows:
        del row["_rank"]
    return pd.DataFrame(rows, columns=list(SUMMARY_COLUMNS))


CELL_COLUMNS = (*CELL_KEYS, "n", "n_not_equivalent", "worst_verdict", *CELL_METRICS, "n_unmeasured", "nonfinite",
                "onset_t", "first_nonfinite_t", "length_min", "length_max")


def cell_table(records: Sequence[Mapping[str, Any]]) -> pd.DataFrame:
    """Per cell (`CELL_KEYS`): the number of cases, the worst verdict and the worst of each metric.

    Metrics are the maximum over the cell's records (missing values skipped); ``n_unmeasured`` counts the
    records those maxima skip, whose ``cond_max`` is missing or NaN (a kernel that raised, an output with no
    comparable element, a case out of domain): a cell of one NaN output and finite others read ``cond_max 0``
    with no word that a case was not in it (a blind hunt, session 24). ``nonfinite`` lists the
    non-finite classes met (``none`` left out); ``onset_t`` and ``first_nonfinite_t`` are the earliest.
    Rows are sorted by kernel, family, dtype, length bucket, eps, chunk_size and regime.
    """
    groups: dict[tuple[str, ...], list[Mapping[str, Any]]] = {}
    order: dict[tuple[str, ...], tuple] = {}
    for r in canonical_order(records):
        key = cell_key(r)
        groups.setdefault(key, []).append(r)
        order.setdefault(key, _cell_sort_key(r))
    rows = []
    for key in sorted(groups, key=lambda k: (order[k], k)):
        recs = groups[key]
        worst = max(recs, key=lambda r: severity(r.get("verdict")))
        row: dict[str, Any] = dict(zip(CELL_KEYS, key))
        row["n"] = len(recs)
        row["n_not_equivalent"] = sum(1 for r in recs if r.get("verdict") != "equivalent")
        row["worst_verdict"] = str(worst.get("verdict"))
        for m in CELL_METRICS:
            row[m] = _nanmax(r.get(m) for r in recs)
        row["n_unmeasured"] = sum(1 for r in recs if math.isnan(number(r.get("cond_max"))))
        row["nonfinite"] = _nonfinite_classes(r.get("nonfinite_class") for r in recs)
        row["onset_t"] = _nanmin(r.get("onset_t") for r in recs)
        row["first_nonfinite_t"] = _nanmin(r.get("first_nonfinite_t") for r in recs)
        row["length_min"] = _nanmin(r.get("length") for r in recs)
        row["length_max"] = _nanmax(r.get("length") for r in recs)
        rows.append(row)
    return pd.DataFrame(rows, columns=list(CELL_COLUMNS))


GROWTH_COLUMNS = ("kernel", "family", "dtype", "regime", "n_records", "n_lengths", "length_min", "length_max",
                  *(f"exponent_{m}" for m in GROWTH_METRICS), "record_growth_exponent_p50")


def fit_exponent(lengths: Sequence[float], errors: Sequence[float]) -> tuple[float, int, int]:
    """The least-squares slope of log(error) against log(length): (exponent, n_points, n_lengths).

    Points with a non-positive or non-finite error or length are left out; the exponent is NaN when
    fewer than `MIN_GROWTH_LENGTHS` distinct lengths remain.
    """
    pts = [(float(x), float(y)) for x, y in zip(lengths, errors)
           if math.isfinite(x) and math.isfinite(y) and x > 0 and y > 0]
    n_lengths = len({x for x, _ in pts})
    if n_lengths < MIN_GROWTH_LENGTHS:
        return math.nan, len(pts), n_lengths
    lx = np.log(np.array([x for x, _ in pts]))
    ly = np.log(np.array([y for _, y in pts]))
    lx_c = lx - lx.mean()
    slope = float(np.dot(lx_c, ly - ly.mean()) / np.dot(lx_c, lx_c))
    return slope, len(pts), n_lengths


def growth_table(records: Sequence[Mapping[str, Any]]) -> pd.DataFrame:
    """Per kernel, family, dtype and regime: the fitted exponent of error against length.

    ``exponent_max_abs`` and ``exponent_cond_max`` fit each record's max_abs / cond_max against its
    length (log-log least squares); a row is kept when at least one of them has `MIN_GROWTH_LENGTHS`
    distinct lengths. Out-of-domain and kernel-error records are left out. ``record_growth_exponent_p50`` is the median of the records' own within-sequence
    ``growth_exponent`` (from `harness.metrics`), for comparison. Regimes are kept apart because their
    error magnitudes differ by orders and would bend the fit.
    """
    groups: dict[tuple[str, str, str, str], list[Mapping[str, Any]]] = {}
    for r in canonical_order(records):
        if r.get("verdict") in ("out_of_domain", "kernel_error"):
            continue  # overflowing inputs and crashes say nothing about how rounding grows
        key = (_key_text(r.get("kernel")), _key_text(r.get("family")), _key_text(r.get("dtype")),
               _key_text(r.get("regime")))
        groups.setdefault(key, []).append(r)
    rows = []
    for key in sorted(groups):
        recs = groups[key]
        lengths = [number(r.get("length")) for r in recs]
        fits = {m: fit_exponent(lengths, [number(r.get(m)) for r in recs]) for m in GROWTH_METRICS}
        if all(math.isnan(f[0]) for f in fits.values()):
            continue
        used = [x for x in lengths if math.isfinite(x)]
        per_record = [number(r.get("growth_exponent")) for r in recs]
        per_record = [v for v in per_record if math.isfinite(v)]
        row: dict[str, Any] = dict(zip(("kernel", "family", "dtype", "regime"), key))
        row.update({"n_records": len(recs), "n_lengths": max(f[2] for f in fits.values()),
                    "length_min": min(used), "length_max": max(used)})
        row.update({f"exponent_{m}": fits[m][0] for m in GROWTH_METRICS})
        row["record_growth_exponent_p50"] = float(np.median(per_record)) if per_record else math.nan
        rows.append(row)
    return pd.DataFrame(rows, columns=list(GROWTH_COLUMNS))


FAILURE_COLUMNS = ("kernel", "family", "dtype", "length", "regime", "eps", "chunk_size", "seed", "verdict", "cause",
                   "cond_max", "max_abs", "ab_max_abs", "onset_t", "nonfinite_class", "why", "error", "case", "replay")


def failing_records(records: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The records whose verdict is not ``equivalent``, worst first (worst verdict, then cond_max)."""
    failing = [r for r in canonical_order(records) if r.get("verdict") != "equivalent"]
    failing.sort(key=lambda r: (-severity(r.get("verdict")), -_cond_rank(r.get("cond_max"))))
    return failing


def failure_table(records: Sequence[Mapping[str, Any]]) -> pd.DataFrame:
    """Every case whose verdict is not ``equivalent``, worst first, with its replay command (a differential
    pair's row: ``ab_max_abs``, the two kernels' difference, and a replay of the pair, ``--against``)."""
    rows = []
    for r in failing_records(records):
        rows.append({
            "kernel": _key_text(r.get("kernel")), "family": _key_text(r.get("family")),
            "dtype": _key_text(r.get("dtype")), "length": number(r.get("length")),
            "regime": _key_text(r.get("regime")), "eps": _key_text(r.get("eps")),
            "chunk_size": _key_text(r.get("chunk_size")), "seed": _whole(r.get("seed")),
            "verdict": str(r.get("verdict")), "cause": _key_text(r.get("cause")),
            "cond_max": number(r.get("cond_max")), "max_abs": number(r.get("max_abs")),
            "ab_max_abs": number(r.get("ab_max_abs")),  # a differential pair's own number: A against B
            "onset_t": number(r.get("onset_t")), "nonfinite_class": _key_text(r.get("nonfinite_class")),
            "why": _key_text(r.get("why")), "error": _key_text(r.get("error")), "case": _key_text(r.get("case")),
            "replay": _key_text(r.get("replay")),
        })
    return pd.DataFrame(rows, columns=list(FAILURE_COLUMNS), dtype=object)  # a seed stays an int (None beside it)


def _whole(value: Any) -> int | None:
    """An integer field as an int (a seed: up to 2**63, exact), None where it is not one."""
    return int(value) if isinstance(value, (int, np.integer)) and not isinstance(value, bool) else None


def report_tables(records: Sequence[Mapping[str, Any]]) -> dict[str, pd.DataFrame]:
    """Every table of the report, by name: summary, cells, growth, failures."""
    return {"summary": summary_table(records), "cells": cell_table(records), "growth": growth_table(records),
            "failures": failure_table(records)}


# ----------------------------------------------------------------------------------------- formatting
def format_value(value: Any, spec: str = _MD_FLOAT, missing: str = "-", whole_below: float = 1e6) -> str:
    """One table value as text: floats with ``spec`` (integral values below ``whole_below`` as integers),
    NaN/None as ``missing``."""
    if value is None:
        return missing
    if isinstance(value, (bool, np.bool_)):
        return str(bool(value))
    if isinstance(value, (int, np.integer)):
        return str(int(value))
    if isinstance(value, (float, np.floating)):
        v = float(value)
        if math.isnan(v):
            return missing
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        if v.is_integer() and abs(v) < whole_below:
            return str(int(v))
        return spec.format(v)
    text = str(value)
    return text if text else missing


def _json_value(value: Any) -> Any:
    if value is None:
        return None
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        v = float(value)
        if math.isnan(v):
            return None
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        if v.is_integer() and abs(v) < 2**53:
            return int(v)
        return float(_DATA_FLOAT.format(v))
    return str(value)


def table_records(df: pd.DataFrame) -> list[dict[str, Any]]:
    """A table as JSON-ready rows (floats to 6 significant digits, NaN -> null, inf -> "inf")."""
    cols = list(df.columns)
    return [{c: None if isinstance(v, str) and v == MISSING_KEY else _json_value(v) for c, v in zip(cols, row)}
            for row in df.itertuples(index=False, name=None)]


def markdown_escape(text: str) -> str:
    """``text`` as literal Markdown table-cell text: no raw HTML (``<``, ``>``, ``&`` become entities), no
    code span, link or cell break (`` ` ``, ``[``, ``]``, ``|`` are backslash-escaped). Kernel names come
    from users and entry points; a report must show them, never render them."""
    text = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    for ch in "`[]|":
        text = text.replace(ch, "\\" + ch)
    return text


def terminal_text(markdown: str) -> str:
    """Markdown the harness wrote, as a terminal shows it: `markdown_escape` undone (``grad\\[a\\]`` reads
    ``grad[a]``, ``&lt;lambda&gt;`` reads ``<lambda>``). The layout (tables, bold, lists) stays: it reads as
    text. The same summary goes escaped to ``$GITHUB_STEP_SUMMARY``, where it is rendered."""
    for ch in "`[]|":
        markdown = markdown.replace("\\" + ch, ch)
    return markdown.replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")


def _md_cell(text: str, max_chars: int | None = None) -> str:
    text = markdown_escape(" ".join(text.split()))
    if max_chars is not None and len(text) > max_chars:
        text = text[: max_chars - 1] + "…"
    return text


def table_markdown(df: pd.DataFrame, *, drop_constant: Sequence[str] = (), max_chars: dict[str, int] | None = None,
                   index: bool = False, markup: Sequence[str] = ()) -> str:
    """A table as GitHub Markdown (tabulate's "github" format), values formatted with "{:.3g}".

    Columns named in ``drop_constant`` are left out when they hold one value on every row. Every cell is
    escaped (`markdown_escape`) except in the ``markup`` columns, which hold Markdown the report made itself
    (links to its figures).
    """
    from tabulate import tabulate

    cols = [c for c in df.columns
            if not (c in drop_constant and len(df) and df[c].astype(str).nunique(dropna=False) <= 1)]
    max_chars = max_chars or {}
    body = [[str(v) if c in markup else _md_cell(format_value(v), max_chars.get(c)) for c, v in zip(cols, row)]
            for row in df[cols].itertuples(index=False, name=None)]
    headers = list(cols)
    if index:
        headers = ["#", *headers]
        body = [[str(i + 1), *row] for i, row in enumerate(body)]
    return tabulate(body, headers=headers, tablefmt="github", disable_numparse=True)


def _data_text(value: Any) -> str:
    """One CSV value: missing (None, NaN, `MISSING_KEY`) empty, whole numbers exact up to 2**53 (as in JSON: a
    10-digit seed was written as 1.58561e+09, session 24), other floats to 6 significant digits."""
    if isinstance(value, str) and value == MISSING_KEY:
        return ""
    return format_value(value, _DATA_FLOAT, "", whole_below=2**53)


def _write_csv(df: pd.DataFrame, path: Path) -> None:
    out = pd.DataFrame({c: [_data_text(v) for v in df[c]] for c in df.columns},
                       columns=list(df.columns), dtype=object)
    path.write_text(out.to_csv(index=False, lineterminator="\n"), encoding="utf-8")


def partial_line(header: Mapping[str, Any] | None) -> str:
    """What a partial run says before anything else: its header's ``status`` (interrupted, or merged without
    all its shards: `harness.store.mark_partial`, `harness.shard.merge_runs`); "" for a complete run.

    A partial run's counts and findings read as a complete run's when only a row of the folded run table said
    ``partial`` (a blind hunt, session 24)."""
    if not (header or {}).get("partial"):
        return ""
    status = header.get("status") or "PARTIAL: partial: true in run.json"
    return (f"**{markdown_escape(str(status))}**: the cases the run did not reach are in no table or count below "
            "(docs/reports.md, \"Partial runs\")")


def headline(records: Sequence[Mapping[str, Any]], header: Mapping[str, Any] | None = None) -> str:
    """``**12 cases**: 10 equivalent · 1 divergent · 1 out_of_domain · 0 kernel_error``, under `partial_line`
    when ``header`` is a partial run's."""
    counts = verdict_counts(records)
    parts = " · ".join(f"{n} {v}" for v, n in counts.items())
    partial = partial_line(header)
    return (f"{partial}\n\n" if partial else "") + f"**{len(records)} cases**: {parts}"


SHORT_SUMMARY_COLUMNS = ("kernel", "dtype", "n", *VERDICTS, "worst_verdict", "worst_cause", "worst_cond_max",
                         "worst_length", "worst_regime")

#: Summary rows shown in full in index.md; with more, the all-equivalent rows are folded.
MAX_OPEN_SUMMARY_ROWS = 12


def summary_markdown(records: Sequence[Mapping[str, Any]], header: Mapping[str, Any] | None = None) -> str:
    """The headline (verdict counts; a partial run's ``header`` says so first) and the per kernel x dtype
    summary table, worst first, as Markdown."""
    if not records:
        return "_No harness records._"
    table = summary_table(records)
    return (headline(records, header) + "\n\n" + table_markdown(table[list(SHORT_SUMMARY_COLUMNS)]) + "\n\n"
            + SUMMARY_CAPTION)


#: Under the summary table: what its ``n`` counts and which case its ``worst_*`` columns describe (new users
#: read the latter as the largest cond of the row, which the findings give, and an n above ``--max-examples``
#: as cases run twice).
SUMMARY_CAPTION = ("_n: the records of the row, the shrink phase's cases included (a search of `--max-examples` N "
                   "that fails records more than N); worst_*: each row's worst case, by verdict first and then "
                   "cond_max (the output's, or the final state's where that is larger); an `out_of_domain` case "
                   "outranks an equivalent one with a larger cond (the findings give each group's largest)._")


def run_summary_markdown(records: Sequence[Mapping[str, Any]], header: Mapping[str, Any] | None = None) -> str:
    """What `harness sweep` / `harness check` print: a partial run's `partial_line`, the findings, the sweep's
    declared tables (`harness.answers`, from the header) and the summary table."""
    from harness.answers import answers_markdown
    from harness.findings import findings_markdown

    if not records:
        return "_No harness records._"
    partial = partial_line(header)
    parts = [partial, ""] if partial else []
    parts += ["**Findings**", "", findings_markdown(records), ""]
    answers = answers_markdown(header or {}, records)
    if answers:
        parts += [answers, ""]
    parts.append(summary_markdown(records))
    return "\n".join(parts)


def header_line(header: Mapping[str, Any]) -> str:
    """The run header in one line: profile, commit, harness, torch, python, device."""
    keys = ("profile", "git_commit", "harness_version", "torch", "python", "device")
    labels = {"git_commit": "commit ", "harness_version": "harness ", "torch": "torch ", "python": "python "}
    return " · ".join(f"{labels.get(k, '')}{header[k]}" for k in keys if header.get(k) not in (None, ""))


def header_markdown(header: Mapping[str, Any]) -> str:
    """The run header as a two-column table (known fields first, in `HEADER_FIELDS` order).

    Structured entries (the sweep's declared tables) are left out; they are rendered on their own.
    """
    from tabulate import tabulate

    header = {k: v for k, v in header.items() if not isinstance(v, (dict, list))}
    keys = [k for k in HEADER_FIELDS if k in header] + sorted(k for k in header if k not in HEADER_FIELDS)
    rows = [[_md_cell(k), _md_cell(format_value(header[k]), 200)] for k in keys]
    if not rows:
        return "_No run header (run.json)._"
    return tabulate(rows, headers=["run", "value"], tablefmt="github", disable_numparse=True)


def append_step_summary(markdown: str, environ: Mapping[str, str] | None = None) -> Path | None:
    """Append ``markdown`` to the file named by ``$GITHUB_STEP_SUMMARY`` (GitHub Actions); None if unset."""
    env = os.environ if environ is None else environ
    target = env.get("GITHUB_STEP_SUMMARY")
    if not target:
        return None
    path = Path(target)
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(markdown.rstrip("\n") + "\n\n")
    return path


# --------------------------------------------------------------------------------------------- index.md
def _details(summary: str, body: Sequence[str]) -> list[str]:
    """A folded section (GitHub renders Markdown inside ``<details>`` after a blank line)."""
    return ["<details>", f"<summary>{summary}</summary>", "", *body, "", "</details>", ""]


def _index_markdown(records: Sequence[Mapping[str, Any]], header: Mapping[str, Any],
                    tables: dict[str, pd.DataFrame], plots: Sequence[Path],
                    case_figures: Mapping[str, Path] | None = None) -> str:
    from harness.answers import answers_markdown
    from harness.findings import findings_markdown

    case_figures = case_figures or {}
    line = header_line(header)
    parts = ["# Kernel equivalence report", "", headline(records, header) + (f" · {line}" if line else ""), ""]

    parts += ["## Findings", "", findings_markdown(records), ""]
    answers = answers_markdown(header, records)
    if answers:
        parts += ["## The sweep's question", "", answers, ""]

    summary = tables["summary"][list(SHORT_SUMMARY_COLUMNS)]
    parts += ["## Summary", "",
              "Per kernel and dtype, worst first: the verdict counts and the worst case (worst verdict and its "
              "cause, then highest condition-normalized error `cond_max`; `cond_max <= 1` is within the "
              "a-priori rounding bound).", ""]
    if len(summary) > MAX_OPEN_SUMMARY_ROWS:
        open_rows = summary[summary["worst_verdict"] != "equivalent"]
        folded = summary[summary["worst_verdict"] == "equivalent"]
        if len(open_rows):
            parts += [table_markdown(open_rows), ""]
        if len(folded):
            parts += _details(f"{len(folded)} kernel x dtype rows with every case equivalent",
                              [table_markdown(folded)])
    else:
        parts += [table_markdown(summary), ""]

    failures = tables["failures"]
    if len(failures):
        shown = failures.head(MAX_MARKDOWN_FAILURES).copy()
        cols = ["kernel", "dtype", "length", "regime", "eps", "chunk_size", "verdict", "cause", "cond_max", "why"]
        if case_figures:
            from harness.plots import case_figure_name

            names = [case_figure_name({"kernel": k, "case": c}) for k, c in zip(shown["kernel"], shown["case"])]
            shown["figure"] = [f"[figure]({n})" if n in case_figures else "-" for n in names]
            cols.insert(0, "figure")
        body = [table_markdown(shown[cols], drop_constant=("eps", "chunk_size"), max_chars={"why": 160}, index=True,
                               markup=("figure",)),
                ""]
        if len(failures) > len(shown):
            body += [f"_{len(failures) - len(shown)} more in failures.csv._", ""]
        if case_figures:
            body += [f"A figure (the worst case of each kernel, dtype, verdict and cause: {len(case_figures)}) shows "
                     "the case along the sequence: "
                     "its error in units of the rounding bound, and the float64 oracle's state against the "
                     "dtype's largest value, with the first mismatch, the first NaN/Inf and the first position "
                     "out of the dtype's range marked.", ""]
        body += ["Replay a case:", ""]
        for i, cmd in enumerate(shown["replay"], start=1):
            if cmd and cmd != "-":
                body += [f"{i}.", "", "   ```sh", f"   {cmd}", "   ```", ""]
        parts += _details(f"Failing cases ({len(failures)}), with figures and replay commands", body)
    else:
        parts += ["_No failing case: every case is equivalent._", ""]

    parts += _details(f"Cells ({len(tables['cells'])})", [
        "Per kernel x dtype x length bucket (x eps x chunk_size x regime where they vary): the worst "
        "value of each metric over the cell's cases. `onset_t` is the earliest position with a "
        "mismatch; `nonfinite` lists the non-finite classes met.", "",
        table_markdown(tables["cells"].drop(columns=["length_min", "length_max", "first_nonfinite_t"]),
                       drop_constant=("eps", "chunk_size", "regime", "family"))])

    if len(tables["growth"]):
        growth = ["The exponent b of `error ~ length^b`, fitted by least squares on log-log axes across "
                  f"records (at least {MIN_GROWTH_LENGTHS} distinct lengths; zero and non-finite errors "
                  "left out). A sequential sum of L roundings grows like L^0.5 to L^1.", "",
                  table_markdown(tables["growth"])]
    else:
        growth = [f"_No kernel has records at {MIN_GROWTH_LENGTHS} or more distinct lengths._"]
    parts += _details("Error growth with length", growth)

    if plots:
        parts += _details(f"Figures ({len(plots)})", [line for p in plots for line in (f"![{p.stem}]({p.name})", "")])
    parts += _details("Run header", [header_markdown(header)])
    return "\n".join(parts).rstrip("\n") + "\n"


# -------------------------------------------------------------------------------------------- building
def build_report(run_dir: str | os.PathLike, out_dir: str | os.PathLike | None = None, *,
                 plots: bool = True) -> ReportPaths:
    """Write index.md, the CSVs, report.json (and the plots) for the run in ``run_dir``.

    ``out_dir`` defaults to ``run_dir``. The same records and header give byte-identical files.
    """
    from harness.store import load_header, load_records

    run_dir = Path(run_dir)
    out = Path(out_dir) if out_dir is not None else run_dir
    records = load_records(run_dir)
    header = load_header(run_dir)
    return write_report(records, header, out, plots=plots)


def write_report(records: Sequence[Mapping[str, Any]], header: Mapping[str, Any], out_dir: str | os.PathLike, *,
                 plots: bool = True, case_figures: int | None = None) -> ReportPaths:
    """`build_report` for records already in memory.

    ``case_figures``: how many failing cases get a figure along the sequence (the worst of each kind; default
    `harness.plots.MAX_CASE_FIGURES`; 0 for none). Each replays its case's float64 oracle.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    records = canonical_order(records)
    tables = report_tables(records)

    plot_paths: list[Path] = []
    figures: dict[str, Path] = {}
    if plots:
        from harness.plots import MAX_CASE_FIGURES, write_case_figures, write_plots

        plot_paths = write_plots(records, out)
        limit = MAX_CASE_FIGURES if case_figures is None else case_figures
        for stale in out.glob("case_*.png"):  # an earlier report's cases: these records may not fail
            stale.unlink()
        if limit > 0:
            figures = write_case_figures(failing_records(records), out, limit=limit)

    paths = ReportPaths(out_dir=out, index=out / "index.md", summary_csv=out / "summary.csv",
                        cells_csv=out / "cells.csv", growth_csv=out / "growth.csv",
                        failures_csv=out / "failures.csv", report_json=out / "report.json",
                        plots=tuple(plot_paths), case_figures=tuple(figures.values()))
    for name, path in (("summary", paths.summary_csv), ("cells", paths.cells_csv), ("growth", paths.growth_csv),
                       ("failures", paths.failures_csv)):
        _write_csv(tables[name], path)

    doc = {"header": {k: _json_value(v) if not isinstance(v, (dict, list)) else v for k, v in header.items()},
           "verdict_counts": verdict_counts(records), "n_records": len(records),
           **{name: table_records(df) for name, df in tables.items()},
           "plots": [p.name for p in plot_paths], "case_figures": sorted(figures),
           "findings": [f.line(markdown=False) for f in findings(records)]}
    paths.report_json.write_text(json.dumps(doc, indent=1, sort_keys=True, allow_nan=False, default=str) + "\n",
                                 encoding="utf-8")
    paths.index.write_text(_index_markdown(records, header, tables, plot_paths, figures), encoding="utf-8")
    return paths


def foreign_report_files(out_dir: str | os.PathLike) -> list[str]:
    """The files in ``out_dir`` that a report would overwrite although no harness run or report wrote them.

    A folder with a run header, run records or an earlier report (``report.json``) is the harness's own; in any
    other folder an ``index.md`` or ``summary.csv`` is someone else's (a hand-written docs page), which a report
    written there would replace and which ``clear_report`` would delete.
    """
    from harness.store import HEADER_FILE, RECORDS_GLOB

    out = Path(out_dir)
    if not out.is_dir() or (out / "report.json").exists() or (out / HEADER_FILE).exists() \
            or any(out.glob(RECORDS_GLOB)):
        return []
    return [name for name in REPORT_FILES if (out / name).exists()] \
        + sorted(p.name for pattern in FIGURE_GLOBS for p in out.glob(pattern))


def refuse_foreign_files(flag: str, out_dir: str | os.PathLike) -> None:
    """Raise `InvalidArgument` naming ``flag`` where ``out_dir`` holds files of `foreign_report_files`."""
    names = foreign_report_files(out_dir)
    if names:
        from harness.errors import InvalidArgument

        shown = ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")
        raise InvalidArgument(f"{flag}={str(out_dir)!r} holds {shown}, which no harness run or report wrote (no "
                              "run.json, records or report.json beside them) and which a report there would "
                              "overwrite; expected a new or empty directory, or one of the harness's runs")


def clear_report(out_dir: str | os.PathLike) -> None:
    """Remove the files a previous report wrote into ``out_dir`` (and nothing else)."""
    out = Path(out_dir)
    for name in REPORT_FILES:
        (out / name).unlink(missing_ok=True)
    for pattern in FIGURE_GLOBS:
        for p in out.glob(pattern):
            p.unlink(missing_ok=True)
