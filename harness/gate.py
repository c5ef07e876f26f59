"""Comparing a run against a stored baseline, and the language that says when that fails.

A kernel repository keeps a baseline run (``reports/baseline``: its records and header, committed) and
gates every change against it: ``harness gate reports/latest --baseline reports/baseline`` or
``pytest --harness-baseline reports/baseline``. Runs are compared *cell by cell*: a cell is the key of
`harness.report.CELL_KEYS` (kernel, family, dtype, device, TF32, power-of-two length bucket, eps, chunk_size,
regime),
and a cell's metric is the worst (max) value over its cases, as in the report's cells table. Cells are
used rather than single cases because a property-based run draws different cases every time.

The fail-on language (`parse_fail_on`), comma-separated ``metric:factor`` terms::

    cond:1.5x,rel:2x,ulp:4x,abs:10x

fails a cell whose metric grew by more than the factor (``new > factor * base``). Metric aliases
(`METRIC_ALIASES`): cond -> cond_max, rel -> max_rel, abs -> max_abs, ulp -> ulp_p99, rms -> rms_ratio,
baseline -> baseline_ratio; the full names are accepted too. A factor is written ``1.5x`` (or ``1.5``)
or as a percentage of growth, ``50%`` (= 1.5x); it must be at least 1. The default is
`harness.options.DEFAULT_FAIL_ON` (``cond:1.5x``).

Noise floors (`noise_floor`): growth is ignored when both the baseline's and the new value are at or
below the metric's floor, so that an error moving between two harmless values (cond 0.001 -> 0.004)
does not fail the gate:

- ``cond_max``: 0.05, i.e. 5% of the a-priori rounding bound (cond = 1, see `harness.metrics`);
- ``max_abs``, ``max_rel``, ``rms_ratio``: 4 unit roundoffs of the cell's dtype (2**-53 float64,
  2**-24 float32, 2**-11 float16, 2**-8 bfloat16, times 4): a few roundings of a value of order one;
- ``ulp_p99``: 4 ULPs;
- ``baseline_ratio``: 1.0: both no worse than the plain sequential loop in the same dtype.

Before any cell, the gate reads the two runs' headers (`comparability`, as pytest-benchmark compares
``machine_info`` first): runs on different families of device (CPU against CUDA), records of a
schema newer than this harness reads (`harness.records.SCHEMA_VERSION`), or runs judged under different
verdict policies (`judged_differently`: a looser threshold passes every cell), are refused with the reason
(`IncomparableRuns`, exit status 2) unless ``allow_mismatch`` (``--allow-mismatch`` / ``--force``).
Other differences (torch, harness version, GPU model) are listed as notes and compared anyway.

Besides metric growth, the gate fails when a cell's worst verdict gets worse (`verdict_change`: by
`harness.records.SEVERITY`, equivalent -> anything else, out_of_domain -> divergent or kernel_error; and
a change between the two failing verdicts, divergent <-> kernel_error, either way). A new value that is
NaN or Inf where the baseline's was finite counts as growth past any factor. A new cell (only in the run) is
listed, and fails only where it fails (divergent, kernel_error) in a kernel and dtype whose baseline cells all
pass (`new_failures`).

A run that checked less than the baseline fails (`coverage_shortfalls`, listed first), unless
``allow_missing`` (``--allow-missing``) accepts it, which still prints each as a warning: a smaller hypothesis
profile (dev < ci < nightly, the headers' ``profile``), a kernel, a kernel's dtype or its gradients (records
``mode: grad``, kernel ``NAME:grad[INPUT]``) the baseline checked and the run did not (``--no-grad``,
``--dtypes``), fewer cases in a (kernel, dtype) search (``--max-examples``), and baseline cells not in the run
(``--max-length``, a sweep that lost cases). Two exceptions, where a missing cell says nothing about what was
checked: cells of a (kernel, dtype) search that failed on either side (the search stopped at the failure and
shrank it, so its cells follow the failure; the failure itself is what the gate judges), and cells where either
run draws anew each time (a randomized profile: ``nightly``, ``dev``), which are listed with a note. A run that
checked more is fine: its new cells are listed. Two runs with no
cell in common fail (nothing was compared: most likely the wrong baseline), and so does a term whose
metric no measured record of the compared cells holds as a number on one side (`unmeasured_terms`: a
damaged or foreign baseline would otherwise turn the term off without a word). A partial run (header
``partial``: interrupted, or merged without all its shards; `partial_warnings`) fails the gate: it cannot
show that the kernel is no worse where it stopped. A partial baseline is compared, with a warning.
"""

from __future__ import annotations

import math
import os
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import pandas as pd

from harness.errors import InvalidArgument
from harness.options import DEFAULT_FAIL_ON
from harness.records import SCHEMA_VERSION, device_family, is_failing, kernel_of, newer_schema, schema_version
from harness.report import CELL_KEYS, cell_key, cell_table, format_value, severity

#: Short names of the fail-on language -> record fields.
METRIC_ALIASES: dict[str, str] = {
    "cond": "cond_max",
    "rel": "max_rel",
    "abs": "max_abs",
    "ulp": "ulp_p99",
    "rms": "rms_ratio",
    "baseline": "baseline_ratio",
}

#: Metrics the gate can watch (each alias's target).
GATE_METRICS: tuple[str, ...] = tuple(METRIC_ALIASES.values())

#: Absolute noise floors, per metric (the relative ones are `DTYPE_FLOOR_METRICS`).
ABSOLUTE_FLOORS: dict[str, float] = {"cond_max": 0.05, "ulp_p99": 4.0, "baseline_ratio": 1.0}

#: Metrics whose floor is `FLOOR_ROUNDOFFS` unit roundoffs of the cell's dtype.
DTYPE_FLOOR_METRICS: frozenset[str] = frozenset({"max_abs", "max_rel", "rms_ratio"})
FLOOR_ROUNDOFFS = 4.0
UNIT_ROUNDOFF: dict[str, float] = {"float64": 2.0**-53, "float32": 2.0**-24, "float16": 2.0**-11, "bfloat16": 2.0**-8}

_FACTOR = re.compile(r"^(?P<num>[0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)(?P<unit>x|%)?$")
_EXPECTED = "expected 'metric:factor' such as 'cond:1.5x' or 'rel:50%' with metric one of "


@dataclass(frozen=True)
class FailOn:
    """One term of the fail-on language: fail when ``metric`` grows past ``factor`` times the baseline."""

    metric: str
    factor: float
    term: str

    def __str__(self) -> str:
        return f"{self.metric}>{self.factor:g}x"


@dataclass
class GateResult:
    """What `gate` decided: ``passed``, one message per failure, and the cell-by-cell diff table.

    ``failures`` open with what the run checked less than the baseline (``shortfalls``, unless
    ``allowed_less``), then come in the diff's order (worse verdicts, then grown metrics, worst first), then
    ``run_failures``, those about the runs as a whole (no cell in common, a term no record can be checked on,
    a partial run); ``better`` lists cells whose verdict improved, ``unchanged`` counts the cells compared that
    did not change; ``warnings`` say what makes the comparison weaker without failing it (a partial baseline,
    shortfalls accepted by ``allow_missing``).
    """

    passed: bool
    failures: list[str]
    table: pd.DataFrame
    missing: list[str] = field(default_factory=list)
    added: list[str] = field(default_factory=list)
    terms: tuple[FailOn, ...] = ()
    better: list[str] = field(default_factory=list)
    unchanged: int = 0
    notes: list[str] = field(default_factory=list)  # header differences compared anyway (`comparability`)
    run_failures: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    shortfalls: list["Shortfall"] = field(default_factory=list)  # what the run checked less (`coverage_shortfalls`)
    allowed_less: bool = False  # the shortfalls were accepted (``allow_missing``): warnings, not failures

    def __bool__(self) -> bool:
        return self.passed

    def summary_markdown(self, max_lines: int = 50) -> str:
        """The gate's outcome as Markdown, what changed first (for the terminal and ``$GITHUB_STEP_SUMMARY``)."""
        terms = ", ".join(t.term for t in self.terms) or "verdicts only"
        head = f"**Gate {'passed' if self.passed else 'FAILED'}** (fail on: {terms}; {len(self.failures)} failures)"
        notes = "".join(f"\n- note: {n}" for n in self.notes)
        less = "" if self.allowed_less else _shortfall_section(self.shortfalls, max_lines)
        return (head + less + _warning_lines(self.warnings) + notes + "\n\n"
                + changes_markdown(self.table, self.terms, max_lines=max_lines, extra_failures=self.run_failures))


#: How a cell changed between two runs, in the order `diff_runs` lists them (what a reviewer acts on first).
CHANGES: tuple[str, ...] = ("worse", "grew", "better", "added", "missing", "unchanged")

#: Section titles of `changes_markdown`, one per change listed (unchanged cells are only counted).
CHANGE_TITLES: dict[str, str] = {
    "worse": "Verdicts that got worse",
    "grew": "Cells whose error grew past the threshold",
    "better": "Verdicts that got better",
    "added": "New cells (only in this run)",
    "missing": "Missing cells (only in the baseline)",
}


# --------------------------------------------------------------------------------------- the language
def parse_fail_on(spec: str | None) -> tuple[FailOn, ...]:
    """Parse ``"cond:1.5x,rel:2x"`` into terms; raise `InvalidArgument` naming a bad term.

    None or an empty string is no term (the gate then fails on verdicts only).
    """
    if spec is None:
        return ()
    if not isinstance(spec, str):
        raise InvalidArgument(f"fail_on={spec!r} must be a string; {_EXPECTED}{_metric_names()}")
    terms: list[FailOn] = []
    seen: set[str] = set()
    for raw in spec.split(","):
        term = raw.strip()
        if not term:
            continue
        name, sep, factor_text = term.partition(":")
        name, factor_text = name.strip().lower(), factor_text.strip().lower()
        if not sep or not name or not factor_text:
            raise InvalidArgument(f"fail_on term {term!r} is not of the form metric:factor; "
                                  f"{_EXPECTED}{_metric_names()}")
        metric = METRIC_ALIASES.get(name, name)
        if metric not in GATE_METRICS:
            raise InvalidArgument(f"fail_on term {term!r} names an unknown metric {name!r}; "
                                  f"{_EXPECTED}{_metric_names()}")
        m = _FACTOR.match(factor_text)
        if m is None:
            raise InvalidArgument(f"fail_on term {term!r} has a factor {factor_text!r} that is not a number; "
                                  f"{_EXPECTED}{_metric_names()}")
        value = float(m.group("num"))
        factor = 1.0 + value / 100.0 if m.group("unit") == "%" else value
        if not math.isfinite(factor) or factor < 1.0:
            raise InvalidArgument(f"fail_on term {term!r} has factor {factor:g}, which must be at least 1 "
                                  "(it is the growth allowed: 1.5x lets a metric grow by half)")
        if metric in seen:
            raise InvalidArgument(f"fail_on term {term!r} repeats metric {metric!r}; give each metric once")
        seen.add(metric)
        terms.append(FailOn(metric=metric, factor=factor, term=term))
    return tuple(terms)


def _metric_names() -> str:
    return ", ".join(f"{a} ({m})" for a, m in METRIC_ALIASES.items())


def noise_floor(metric: str, dtype: str | None) -> float:
    """The value at or below which growth of ``metric`` is noise (see the module docstring)."""
    if metric in DTYPE_FLOOR_METRICS:
        return FLOOR_ROUNDOFFS * UNIT_ROUNDOFF.get(str(dtype), UNIT_ROUNDOFF["float32"])
    return ABSOLUTE_FLOORS.get(metric, 0.0)


# ------------------------------------------------------------------------------------------ the diff
def _ratio(base: float, new: float) -> float:
    if math.isnan(base) or math.isnan(new):
        return math.nan
    if math.isinf(new) or math.isinf(base):
        return math.nan if math.isinf(new) and math.isinf(base) else (math.inf if math.isinf(new) else 0.0)
    if base == 0:
        return 1.0 if new == 0 else math.inf
    return new / base


def cell_label(row: Mapping[str, Any]) -> str:
    """``kernel=k family=f dtype=d length=64-127 regime=r`` (tf32, a device other than cpu, eps and chunk_size
    when set)."""
    parts = [f"kernel={row['kernel']}", f"family={row['family']}", f"dtype={row['dtype']}"]
    if row.get("tf32") not in (None, "-"):
        parts.append("tf32")
    if row.get("device") not in (None, "cpu"):
        parts.append(f"device={row['device']}")
    parts.append(f"length={row['length_bucket']}")
    if row.get("eps") not in (None, "-"):
        parts.append(f"eps={row['eps']}")
    if row.get("chunk_size") not in (None, "-"):
        parts.append(f"chunk_size={row['chunk_size']}")
    parts.append(f"regime={row['regime']}")
    return " ".join(parts)


def diff_runs(base_records: Sequence[Mapping[str, Any]], new_records: Sequence[Mapping[str, Any]],
              fail_on: str | Sequence[FailOn] | None = DEFAULT_FAIL_ON) -> pd.DataFrame:
    """Cell by cell, what changed between two runs, what changed first.

    Columns: the cell key (`CELL_KEYS`), ``status`` (``both``, ``missing``: only in the base,
    ``added``: only in the new run), ``change`` (`CHANGES`: ``worse`` / ``better`` verdict, ``grew``: a
    metric of ``fail_on`` grew past its factor, noise floors applied, ``added``, ``missing``,
    ``unchanged``), ``grown`` (one message per grown metric), ``base_n``/``new_n`` (cases),
    ``base_verdict``/``new_verdict`` (the cell's worst verdict), ``verdict_change`` (-1, 0, +1: better,
    same, worse: `verdict_change`), for each metric of `GATE_METRICS` ``base_<m>``, ``new_<m>``,
    ``ratio_<m>`` (new / base), ``worst_ratio`` (the largest of them) and ``grown_ratio`` (the largest growth
    among the grown terms' metrics). Rows are ordered by `CHANGES`, then a grown cell by ``grown_ratio`` and
    any other by ``worst_ratio``, largest first.
    """
    terms = _terms(fail_on)
    base = cell_table(base_records).set_index(list(CELL_KEYS))
    new = cell_table(new_records).set_index(list(CELL_KEYS))
    keys = sorted(set(base.index) | set(new.index))
    rows = []
    for key in keys:
        in_base, in_new = key in base.index, key in new.index
        b = base.loc[key] if in_base else None
        n = new.loc[key] if in_new else None
        row: dict[str, Any] = dict(zip(CELL_KEYS, key))
        row["status"] = "both" if in_base and in_new else ("missing" if in_base else "added")
        row["base_n"] = int(b["n"]) if b is not None else 0
        row["new_n"] = int(n["n"]) if n is not None else 0
        row["base_verdict"] = str(b["worst_verdict"]) if b is not None else "-"
        row["new_verdict"] = str(n["worst_verdict"]) if n is not None else "-"
        both = b is not None and n is not None
        row["verdict_change"] = verdict_change(row["base_verdict"], row["new_verdict"]) if both else 0
        ratios = []
        for m in GATE_METRICS:
            bv = float(b[m]) if b is not None else math.nan
            nv = float(n[m]) if n is not None else math.nan
            row[f"base_{m}"], row[f"new_{m}"] = bv, nv
            r = _ratio(bv, nv)
            row[f"ratio_{m}"] = r
            if not math.isnan(r):
                ratios.append(r)
        row["worst_ratio"] = max(ratios) if ratios else math.nan
        row["grown"] = _grown(row, terms) if row["status"] == "both" else []
        row["grown_ratio"] = _grown_ratio(row, terms) if row["grown"] else math.nan
        if row["status"] != "both":
            row["change"] = row["status"]
        elif row["verdict_change"] > 0:
            row["change"] = "worse"
        elif row["grown"]:
            row["change"] = "grew"
        elif row["verdict_change"] < 0:
            row["change"] = "better"
        else:
            row["change"] = "unchanged"
        rows.append(row)
    rows.sort(key=lambda r: (CHANGES.index(r["change"]), -r["verdict_change"], -_order_ratio(r),
                             tuple(str(r[k]) for k in CELL_KEYS)))
    columns = [*CELL_KEYS, "status", "change", "grown", "base_n", "new_n", "base_verdict", "new_verdict",
               "verdict_change", *(f"{p}_{m}" for m in GATE_METRICS for p in ("base", "new", "ratio")), "worst_ratio",
               "grown_ratio"]
    return pd.DataFrame(rows, columns=columns)


def _grown_ratio(row: Mapping[str, Any], terms: Sequence[FailOn]) -> float:
    """The largest growth among the metrics of ``terms`` that grew past their factor in ``row`` (a new
    non-finite value counts as infinite growth): the number a grown cell's message prints."""
    ratios = []
    for term in terms:
        bv, nv = row[f"base_{term.metric}"], row[f"new_{term.metric}"]
        if _grew(term, bv, nv, row["dtype"]):
            r = row[f"ratio_{term.metric}"]
            ratios.append(r if math.isfinite(r) else math.inf)
    return max(ratios) if ratios else math.nan


def _order_ratio(row: Mapping[str, Any]) -> float:
    """The ratio a row is ordered by within its kind of change: a grown cell by the growth its message prints
    (`_grown_ratio`; it was ordered by the largest ratio of any metric, so a cell whose printed cond_max grew
    x40 could be listed after one that grew x2 and whose unwatched max_abs grew x100), others by
    ``worst_ratio``; a missing ratio last."""
    value = row["grown_ratio"] if row["change"] == "grew" else row["worst_ratio"]
    return -math.inf if math.isnan(value) else value


def verdict_change(base: str, new: str) -> int:
    """+1 when a cell's worst verdict got worse from ``base`` to ``new``, -1 when better, 0 when the same.

    By `harness.records.SEVERITY` (divergent > kernel_error > out_of_domain > equivalent), except that a
    change between the two failing verdicts counts as worse either way: a kernel that went from wrong
    numbers to crashing (or from crashing to wrong numbers) fails in a new way, and is not better (a blind
    hunt's verdicts-only gate passed divergent -> kernel_error as "5 better verdicts").
    """
    if base != new and is_failing(base) and is_failing(new):
        return 1
    sb, sn = severity(base), severity(new)
    return (sn > sb) - (sn < sb)


def _terms(fail_on: str | Sequence[FailOn] | None) -> tuple[FailOn, ...]:
    if isinstance(fail_on, (tuple, list)):
        return tuple(fail_on)
    return parse_fail_on(DEFAULT_FAIL_ON if fail_on is None else fail_on)


def _grown(row: Mapping[str, Any], terms: Sequence[FailOn]) -> list[str]:
    """One message per term of ``terms`` whose metric grew past its factor in ``row``."""
    out = []
    for term in terms:
        bv, nv = row[f"base_{term.metric}"], row[f"new_{term.metric}"]
        if not _grew(term, bv, nv, row["dtype"]):
            continue
        if _unmeasured(nv, row["new_verdict"]):
            out.append(f"{term.metric} {format_value(bv, '{:.3g}')} -> not measured (the cell is kernel_error now "
                       f"and none of its cases holds a {term.metric})")
        else:
            out.append(_growth_message(term, bv, nv, row[f"ratio_{term.metric}"]))
    return out


def _unmeasured(new: float, new_verdict: str) -> bool:
    """Whether a cell's new value is missing because its cases raised: a kernel_error cell holds no number
    (a blind hunt read "cond_max grew 0.178 -> - (to a non-finite value ...)" where nothing was measured)."""
    return new_verdict == "kernel_error" and math.isnan(new)


#: A cond_max at or below this is inside the a-priori rounding bound (`harness.metrics`): its growth message says so.
INSIDE_BOUND = 1.0


def _growth_message(term: FailOn, base: float, new: float, ratio: float) -> str:
    """``cond_max grew 0.2 -> 0.9 (x4.5; allowed 1.5x by 'cond:1.5x'; both inside the rounding bound ...)``;
    a new NaN (measured as NaN: a missing value is `_unmeasured`) reads ``nan``, not the tables' ``-``.

    A cond_max that grew but stays inside the bound (`INSIDE_BOUND`) says so: a switch between two correct
    algorithms moves it by more than 1.5x (a blind hunt, session 24: 3-12% of the bound), and the bare line read
    like a regression."""
    if math.isfinite(ratio):
        how = "x" + format_value(ratio, "{:.3g}")
    elif isinstance(new, (int, float)) and math.isfinite(new):
        how = "from 0: no finite ratio"  # a baseline of exactly 0 (float64 bits equal), now not
    else:
        how = "to a non-finite value"
    inside = term.metric == "cond_max" and math.isfinite(new) and new <= INSIDE_BOUND
    note = (f"; both inside the rounding bound (cond <= {INSIDE_BOUND:g}): the error moved within what rounding "
            "allows, so an intended change is accepted with `harness update-baseline`") if inside else ""
    return (f"{term.metric} grew {format_value(base, '{:.3g}')} -> {format_value(new, '{:.3g}', missing='nan')} "
            f"({how}; allowed {term.factor:g}x by '{term.term}'{note})")


def _change_lines(row: Mapping[str, Any]) -> list[str]:
    """The message of one row of `diff_runs`: one line per cell (its verdict change and grown metrics)."""
    label = cell_label(row)
    if row["change"] == "missing":
        return [f"{label}: in the baseline ({row['base_n']} cases, {row['base_verdict']}), not in this run"]
    if row["change"] == "added":
        return [f"{label}: new in this run ({row['new_n']} cases, {row['new_verdict']})"]
    parts = []
    if row["verdict_change"]:
        parts.append(f"verdict {row['base_verdict']} -> {row['new_verdict']} "
                     f"(baseline {row['base_n']} cases, now {row['new_n']})")
    parts += list(row["grown"])
    return [f"{label}: {'; '.join(parts)}"] if parts else []


def _section_lines(table: pd.DataFrame, rows: pd.DataFrame, change: str) -> list[str]:
    """The messages of one section of `changes_markdown` (``rows``: the cells of ``table`` with that ``change``):
    one per cell (`_change_lines`), but a kernel wholly new or wholly missing says it in one line
    (`_kernel_line`), first. A kernel added to a run was 150 "new in this run" lines, 50 shown (a blind hunt,
    session 24)."""
    records = rows.to_dict("records")
    whole = _one_sided_kernels(table, change) if change in ("added", "missing") else set()
    grouped = [_kernel_line(k, [r for r in records if r["kernel"] == k], change)
               for k in dict.fromkeys(r["kernel"] for r in records) if k in whole]
    return grouped + [m for row in records if row["kernel"] not in whole for m in _change_lines(row)]


def _one_sided_kernels(table: pd.DataFrame, status: str) -> set[str]:
    """The kernels all of whose cells in ``table`` have ``status`` (``added``: only in this run, ``missing``:
    only in the baseline)."""
    return {kernel for kernel, seen in table.groupby("kernel")["status"].agg(set).items() if seen == {status}}


def _kernel_line(kernel: str, rows: Sequence[Mapping[str, Any]], status: str) -> str:
    """``kernel k: new in this run (150 cells, 600 cases, 3 dtypes: bfloat16, float16, float32; worst verdict
    equivalent)``, or ``kernel k: in the baseline (...), not in this run``."""
    side = "new" if status == "added" else "base"
    dtypes = sorted({str(r["dtype"]) for r in rows})
    worst = max((str(r[f"{side}_verdict"]) for r in rows), key=severity)
    what = (f"{len(rows)} cells, {sum(int(r[f'{side}_n']) for r in rows)} cases, {len(dtypes)} dtypes: "
            f"{', '.join(dtypes)}; worst verdict {worst}")
    return f"kernel {kernel}: new in this run ({what})" if side == "new" else \
        f"kernel {kernel}: in the baseline ({what}), not in this run"


def changes_markdown(table: pd.DataFrame, terms: Sequence[FailOn] = (), *, max_lines: int = 50,
                     extra_failures: Sequence[str] = ()) -> str:
    """What changed between two runs (a `diff_runs` table) as Markdown: a count line, then one section
    per kind of change (`CHANGE_TITLES`), worse verdicts first; unchanged cells are counted, not listed, and a
    kernel only in one run is one line (`_section_lines`)."""
    counts = {c: int((table["change"] == c).sum()) if len(table) else 0 for c in CHANGES}
    compared = int((table["status"] == "both").sum()) if len(table) else 0
    threshold = ", ".join(t.term for t in terms) or "no metric terms"
    lines = [f"{compared} cells compared: {counts['worse']} worse verdicts, {counts['grew']} grew past the "
             f"threshold ({threshold}), {counts['better']} better verdicts, {counts['unchanged']} unchanged "
             f"(not listed); {counts['added']} new cells, {counts['missing']} missing."]
    acted = table[table["change"].isin(("worse", "grew"))] if len(table) else table
    if len(acted):  # where the regressions are, before the cell-by-cell list
        tally = acted.groupby(["kernel", "dtype"], sort=False).size().sort_values(ascending=False, kind="stable")
        lines += ["", "Worse or grown, by kernel and dtype: " + ", ".join(
            f"{k} {d} ({n} cells)" for (k, d), n in tally.items()) + "."]
    if extra_failures:
        lines.append("")
        lines += [f"- {text}" for text in extra_failures]
    for change, title in CHANGE_TITLES.items():
        rows = table[table["change"] == change] if len(table) else table
        if not len(rows):
            continue
        messages = _section_lines(table, rows, change)
        lines += ["", f"**{title}** ({len(rows)})", ""]
        lines += [f"- {m}" for m in messages[:max_lines]]
        if len(messages) > max_lines:
            lines.append(f"- ... {len(messages) - max_lines} more")
    return "\n".join(lines)


def diff_markdown(table: pd.DataFrame, fail_on: str | Sequence[FailOn] | None = DEFAULT_FAIL_ON, *,
                  warnings: Sequence[str] = ()) -> str:
    """`harness diff`'s output: ``warnings`` (`partial_warnings`), then what changed first
    (`changes_markdown`), unchanged cells counted."""
    head = _warning_lines(warnings).lstrip("\n")
    return (head + "\n\n" if head else "") + changes_markdown(table, _terms(fail_on))


def _warning_lines(warnings: Sequence[str]) -> str:
    return "".join(f"\n- warning: {w}" for w in warnings)


def partial_warnings(base_header: Mapping[str, Any], new_header: Mapping[str, Any]) -> dict[str, str]:
    """Side (``baseline``, ``run``) -> what it means that this side is a partial run (its header's
    ``partial``: interrupted, or merged without all its shards; `harness.store.mark_partial`,
    `harness.shard.merge_runs`). Its cases that never ran are neither compared nor told apart from cells
    that were not drawn, so `harness diff` warns of it and `gate` fails on a partial run."""
    meaning = {
        "baseline": "its cells that never ran are not compared (the run's cells there count as new); make the "
                    "baseline from a complete run",
        "run": "a run stopped early cannot show that the kernel is no worse where it stopped (its cells that "
               "never ran count as missing); rerun it to completion",
    }
    return {side: f"the {side} is partial ({header.get('status') or 'partial: true in run.json'}): {meaning[side]}"
            for side, header in (("baseline", base_header), ("run", new_header)) if header.get("partial")}


# ------------------------------------------------------------------------------------------ coverage
#: The kinds of `Shortfall`, in the order the gate lists them: the widest first.
SHORTFALL_KINDS: tuple[str, ...] = ("profile", "kernel", "gradients", "dtype", "examples", "cells")

#: How `allow_missing` is spelt on the command line (the warnings name it).
ALLOW_MISSING_FLAG = "--allow-missing"


@dataclass(frozen=True)
class Shortfall:
    """One thing the baseline checked that the run did not (`coverage_shortfalls`).

    ``kind`` is one of `SHORTFALL_KINDS`; ``kernel`` the kernel it is about (None: the run as a whole);
    ``dtypes`` the dtypes it is about (empty: all, or none in particular); ``cells`` how many of the
    baseline's cells go unchecked with it (0 where the cells are counted by another shortfall: fewer examples
    in a search, a smaller profile); ``message`` says it in one line."""

    kind: str
    kernel: str | None
    dtypes: tuple[str, ...]
    cells: int
    message: str

    def __str__(self) -> str:
        return self.message


@dataclass
class _Search:
    """What a run holds of one (kernel, family, dtype): the unit a check searches (`harness check` runs one
    hypothesis search per kernel and dtype; its gradients are taken inside it)."""

    forward: int = 0  # forward cases (records that are not a gradient's)
    cells: set[tuple[str, ...]] = field(default_factory=set)
    gradient_cells: set[tuple[str, ...]] = field(default_factory=set)
    failing: bool = False  # a divergent or kernel_error record: the search stopped there and shrank it


def _searches(records: Sequence[Mapping[str, Any]]) -> dict[tuple[str, str, str], _Search]:
    """The records of a run by (kernel, family, dtype), a gradient's under its kernel (`kernel_of`)."""
    out: dict[tuple[str, str, str], _Search] = {}
    for record in records:
        search = out.setdefault((kernel_of(record), str(record.get("family")), str(record.get("dtype"))), _Search())
        cell = cell_key(record)
        search.cells.add(cell)
        if record.get("mode") == "grad":
            search.gradient_cells.add(cell)
        else:
            search.forward += 1
        search.failing = search.failing or is_failing(record.get("verdict"))
    return out


def _hypothesis_profile(profile: Any) -> str | None:
    """The hypothesis profile (`harness.settings.PROFILES`) a run header's ``profile`` names (``ci``, or
    ``pytest:ci`` for a pytest session's), None for a sweep's (``sweep:NAME``: a fixed grid) or none."""
    from harness.settings import PROFILES

    if not isinstance(profile, str):
        return None
    name = profile.split(":", 1)[1] if profile.startswith("pytest:") else profile
    return name if name in PROFILES else None


def _searched(header: Mapping[str, Any]) -> bool:
    """Whether a run's cases were drawn by searches that stop at a failure (a check, a pytest session, records
    without a header), not a sweep's fixed grid (``profile: sweep:NAME``), which runs every case whatever
    it finds."""
    return not str(header.get("profile") or "").startswith("sweep:")


#: The hypothesis profiles whose searches draw the same cases every run: `harness.settings.register_profiles`
#: derandomizes ``ci`` alone (``dev`` and ``nightly`` draw anew; docs/ci-workflow.md). Read from this list, not
#: from hypothesis's registry: a profile registered without ``derandomize`` inherits it from whichever profile
#: is loaded at the time.
REPEATING_PROFILES: frozenset[str] = frozenset({"ci"})


def _draws_anew(profile: Any) -> bool:
    """Whether a run of ``profile`` draws other cases every time (a hypothesis profile not in
    `REPEATING_PROFILES`), so that the cells of two runs differ by chance."""
    name = _hypothesis_profile(profile)
    return name is not None and name not in REPEATING_PROFILES


def _counted(n: int, what: str) -> str:
    return f"{n} {what}" if n == 1 else f"{n} {what}s"


def _profile_shortfall(base_header: Mapping[str, Any],
                       new_header: Mapping[str, Any]) -> tuple[list[Shortfall], list[str]]:
    """A run searched at a smaller hypothesis profile than the baseline (dev < ci < nightly: fewer examples,
    shorter lengths); a note where the two headers name other, unranked profiles (sweeps)."""
    from harness.settings import LIMITS, PROFILES

    base, new = base_header.get("profile"), new_header.get("profile")
    base_name, new_name = _hypothesis_profile(base), _hypothesis_profile(new)
    if base_name and new_name and PROFILES.index(new_name) < PROFILES.index(base_name):
        lb, ln = LIMITS[base_name], LIMITS[new_name]
        return [Shortfall("profile", None, (), 0,
                          f"profile: the baseline searched at {base}, this run at {new} (the profiles' defaults: "
                          f"{lb.max_examples} -> {ln.max_examples} examples per search, lengths up to "
                          f"{lb.max_length} -> {ln.max_length})")], []
    if base and new and base != new and base_name != new_name:
        return [], [f"profile differs: baseline {base!r}, run {new!r} (compared cell by cell)"]
    return [], []


def coverage_shortfalls(base_records: Sequence[Mapping[str, Any]], new_records: Sequence[Mapping[str, Any]],
                        base_header: Mapping[str, Any] | None = None,
                        new_header: Mapping[str, Any] | None = None) -> tuple[list[Shortfall], list[str]]:
    """(what the run checked less than the baseline, in `SHORTFALL_KINDS` order; notes on what was not held
    against it). The headers (run.json) give the profiles; without them only the records are compared.

    - ``profile``: a smaller hypothesis profile than the baseline's (`_profile_shortfall`);
    - ``kernel``: a kernel (and family) of the baseline with no record in the run;
    - ``gradients``: a kernel and dtype with gradient records in the baseline and none in the run (``--no-grad``),
      one line for the run as a whole when it took no gradient at all; not where the run's search failed
      (a gradient is taken only on an equivalent forward);
    - ``dtype``: a dtype of a kernel in both runs that the run did not check, one line per dtype the run did not
      check at all;
    - ``examples``: fewer forward cases in a (kernel, dtype) than the baseline's (``--max-examples``);
    - ``cells``: the baseline's other cells not in the run (``--max-length``, a sweep that lost cases).

    Examples and cells are not compared in a (kernel, dtype) whose search failed on either side (a search
    stops at its failure and shrinks it: its cases follow the failure, which the gate judges on its own; a
    sweep's grid runs every case whatever it finds, `_searched`); cells not at all where either run draws anew
    (`_draws_anew`): those are a note.
    """
    base_header, new_header = base_header or {}, new_header or {}
    base, new = _searches(base_records), _searches(new_records)
    shortfalls, notes = _profile_shortfall(base_header, new_header)
    kernels_run = {(kernel, family) for kernel, family, _ in new}
    dtypes_run = {dtype for _, _, dtype in new}
    for dtype in sorted({dtype for _, _, dtype in base} - dtypes_run):  # the run as a whole: one line
        of = {k: s for (k, f, d), s in base.items() if d == dtype and (k, f) in kernels_run}
        if of:
            cells = sum(len(s.cells) for s in of.values())
            shortfalls.append(Shortfall("dtype", None, (dtype,), cells,
                                        f"dtype {dtype}: checked in the baseline ({_counted(cells, 'cell')} of "
                                        f"{_counted(len(of), 'kernel')}), not in this run"))
    by_kernel: dict[tuple[str, str], dict[str, _Search]] = {}
    for (kernel, family, dtype), search in sorted(base.items()):
        by_kernel.setdefault((kernel, family), {})[dtype] = search

    for (kernel, family), searches in by_kernel.items():
        cells = sum(len(s.cells) for s in searches.values())
        if (kernel, family) not in kernels_run:
            grads = " and gradients" if any(s.gradient_cells for s in searches.values()) else ""
            shortfalls.append(Shortfall("kernel", kernel, tuple(searches), cells,
                                        f"kernel {kernel} ({family}): checked in the baseline "
                                        f"({_counted(cells, 'cell')}, {', '.join(searches)}{grads}), not in this run"))
            continue
        gone = {dtype: s for dtype, s in searches.items() if (kernel, family, dtype) not in new and dtype in dtypes_run}
        if gone:
            cells = sum(len(s.cells) for s in gone.values())
            shortfalls.append(Shortfall("dtype", kernel, tuple(gone), cells,
                                        f"dtype{'s' if len(gone) > 1 else ''} {', '.join(gone)} missing for kernel "
                                        f"{kernel}: checked in the baseline ({_counted(cells, 'cell')}), not in this "
                                        "run"))

    skipped = {key: s for key, s in base.items()
               if s.gradient_cells and key in new and not new[key].gradient_cells and not new[key].failing}
    by_skipped_kernel: dict[str | None, list[tuple[str, str, str]]] = {}
    took_none = not any(s.gradient_cells for s in new.values())  # the run as a whole: one line
    for key in sorted(skipped):
        by_skipped_kernel.setdefault(None if took_none else key[0], []).append(key)
    for kernel, keys in by_skipped_kernel.items():
        cells = sum(len(skipped[key].gradient_cells) for key in keys)
        dtypes = tuple(sorted({dtype for _, _, dtype in keys}))
        where = f"{', '.join(sorted({k for k, _, _ in keys}))} in {', '.join(dtypes)}"
        shortfalls.append(Shortfall("gradients", kernel, dtypes, cells,
                                    f"gradients{'' if kernel is None else f' of kernel {kernel}'}: checked in the "
                                    f"baseline, skipped in this run ({_counted(cells, 'cell')}: {where})"))

    stopped = {key for key, s in base.items() if s.failing and _searched(base_header)} | \
        {key for key, s in new.items() if s.failing and _searched(new_header)}
    both = [(key, s, new[key]) for key, s in sorted(base.items()) if key in new and key not in stopped]
    for (kernel, _, dtype), b, n in both:
        if n.forward < b.forward:
            shortfalls.append(Shortfall("examples", kernel, (dtype,), 0,
                                        f"examples: kernel {kernel} {dtype}: {_counted(n.forward, 'case')} in this "
                                        f"run, {b.forward} in the baseline"))
    unchecked = {key: len(b.cells - n.cells - (b.gradient_cells if key in skipped else set()))
                 for key, b, n in both}
    unchecked = {key: count for key, count in unchecked.items() if count}
    anew = [f"the {side}'s profile {header.get('profile')} draws anew each run"
            for side, header in (("baseline", base_header), ("run", new_header)) if _draws_anew(header.get("profile"))]
    if unchecked and anew:
        notes.append(f"{_counted(sum(unchecked.values()), 'cell')} of the baseline not drawn in this run "
                     f"({' and '.join(anew)}): listed as missing, not failed; kernels, dtypes, gradients and "
                     "examples were compared")
    elif unchecked:
        for (kernel, _, dtype), count in unchecked.items():
            shortfalls.append(Shortfall("cells", kernel, (dtype,), count,
                                        f"cells: kernel {kernel} {dtype}: {_counted(count, 'cell')} of the baseline "
                                        "not in this run (listed under Missing cells)"))
    shortfalls.sort(key=lambda item: SHORTFALL_KINDS.index(item.kind))  # stable: each kind in its own order
    return shortfalls, notes


def _shortfall_section(shortfalls: Sequence[Shortfall], max_lines: int) -> str:
    """The gate's first section when the run checked less than the baseline: one line per `Shortfall`."""
    if not shortfalls:
        return ""
    lines = [f"- {item.message}" for item in shortfalls[:max_lines]]
    if len(shortfalls) > max_lines:
        lines.append(f"- ... {len(shortfalls) - max_lines} more")
    return (f"\n\n**This run checked less than the baseline** ({len(shortfalls)}; {ALLOW_MISSING_FLAG} accepts it)"
            "\n\n" + "\n".join(lines))


def _allows_less(allow_missing: bool, fail_on_missing: bool | None) -> bool:
    """Whether shortfalls are accepted: ``allow_missing``, or ``fail_on_missing=False``, the older spelling
    (failing is the default; ``fail_on_missing=True`` says so)."""
    if allow_missing and fail_on_missing:
        raise InvalidArgument("allow_missing=True with fail_on_missing=True: the first accepts a run that checked "
                              "less than the baseline, the second fails it; expected at most one of them")
    return bool(allow_missing) or fail_on_missing is False


# ------------------------------------------------------------------------------------------ the gate
def _key_field(column: str) -> str:
    """The record field behind a `CELL_KEYS` column (the length bucket is made of ``length``)."""
    return "length" if column == "length_bucket" else column


def _columns_lacking(records: Sequence[Mapping[str, Any]], others: Sequence[Mapping[str, Any]]) -> list[str]:
    """The record fields behind the `CELL_KEYS` columns that no record of ``records`` carries while some of
    ``others`` do, and whose absence puts every record in another cell (a missing ``device`` reads as cpu)."""
    lacking = []
    for i, column in enumerate(CELL_KEYS):
        field = _key_field(column)
        if any(r.get(field) is not None for r in records) or not any(r.get(field) is not None for r in others):
            continue
        if {cell_key(r)[i] for r in others} - {cell_key(r)[i] for r in records}:
            lacking.append(field)
    return lacking


def _unmatched_why(base_records: Sequence[Mapping[str, Any]], new_records: Sequence[Mapping[str, Any]]) -> str:
    """Why no cell matched, when a side's records lack a key field (a hand-made or older baseline without
    ``regime`` matched nothing and the gate said only "is it the baseline of these kernels?", verification 23);
    else the question it asks."""
    said = [f"the {side}'s records carry no {fields} (the {other}'s do), so every cell differs in it"
            for side, other, fields in (("baseline", "run", _columns_lacking(base_records, new_records)),
                                        ("run", "baseline", _columns_lacking(new_records, base_records))) if fields]
    if said:
        return "; ".join(said) + ": compare runs whose records carry the same fields (remake the older one with " \
            "this harness)"
    return "is it the baseline of these kernels?"


def gate_records(base_records: Sequence[Mapping[str, Any]], new_records: Sequence[Mapping[str, Any]],
                 fail_on: str | Sequence[FailOn] | None = DEFAULT_FAIL_ON, *, allow_missing: bool = False,
                 fail_on_missing: bool | None = None, base_header: Mapping[str, Any] | None = None,
                 new_header: Mapping[str, Any] | None = None) -> GateResult:
    """`gate` on records already in memory; the headers (run.json), where given, add the profiles to what is
    compared (`coverage_shortfalls`). ``allow_missing`` accepts a run that checked less than the baseline,
    with a warning per shortfall; ``fail_on_missing`` is its older spelling (False accepts it, True is the
    default)."""
    allowed = _allows_less(allow_missing, fail_on_missing)
    terms = _terms(fail_on)
    table = diff_runs(base_records, new_records, terms)
    failures: list[str] = []
    lists: dict[str, list[str]] = {"missing": [], "added": [], "better": []}
    for row in table.to_dict("records"):
        if row["change"] in ("worse", "grew"):
            failures += _change_lines(row)
        elif row["change"] in lists:
            lists[row["change"]] += _change_lines(row)
    failures += new_failures(table)
    compared = bool(len(table)) and bool((table["status"] == "both").any())
    # with no cell in common, that one failure says it all (most likely the wrong baseline)
    shortfalls, notes = coverage_shortfalls(base_records, new_records, base_header, new_header) if compared \
        else ([], [])
    less = [] if allowed else [item.message for item in shortfalls]
    warnings = [f"checked less than the baseline, accepted ({ALLOW_MISSING_FLAG}): {item.message}"
                for item in shortfalls] if allowed else []
    run_failures: list[str] = []
    if len(table) and not compared:
        run_failures.append(f"no cell of this run matches the baseline ({len(lists['missing'])} baseline cells, "
                            f"{len(lists['added'])} new cells): nothing was compared; "
                            f"{_unmatched_why(base_records, new_records)}")
    run_failures += unmeasured_terms(table, base_records, new_records, terms)
    unchanged = int((table["change"] == "unchanged").sum()) if len(table) else 0
    failures = less + failures + run_failures
    return GateResult(passed=not failures, failures=failures, table=table, missing=lists["missing"],
                      added=lists["added"], terms=terms, better=lists["better"], unchanged=unchanged,
                      notes=notes, run_failures=run_failures, warnings=warnings, shortfalls=shortfalls,
                      allowed_less=allowed)


def new_failures(table: pd.DataFrame) -> list[str]:
    """One failure per cell only in the new run whose worst verdict fails (divergent, kernel_error) where the
    baseline's cells of that kernel, family and dtype all pass: a kernel added divergent, a dtype that crashes
    now, in cells the baseline never had. They were listed as new and passed the gate, 46 divergent cases of an
    added kernel with them (a blind hunt, session 24). Where the baseline fails in that kernel and dtype too, a
    failing cell new by its length or regime (a shrunk case of another size) is the known failure: listed."""
    if not len(table):
        return []
    rows = table.to_dict("records")
    known = {(r["kernel"], r["family"], r["dtype"]) for r in rows
             if r["status"] != "added" and is_failing(r["base_verdict"])}
    return [f"{cell_label(r)}: new in this run and {r['new_verdict']} ({r['new_n']} cases), where the baseline's "
            f"{r['kernel']} {r['dtype']} cells all pass" for r in rows
            if r["status"] == "added" and is_failing(r["new_verdict"])
            and (r["kernel"], r["family"], r["dtype"]) not in known]


def unmeasured_terms(table: pd.DataFrame, base_records: Sequence[Mapping[str, Any]],
                     new_records: Sequence[Mapping[str, Any]], terms: Sequence[FailOn]) -> list[str]:
    """One failure per term of ``terms`` that cannot be checked: no record of the compared cells (``table``'s
    ``both`` rows) on one side that measured something (any verdict but kernel_error, whose records carry
    no metric) holds the term's metric as a number (NaN, the written form of a value that could not be
    measured, is a number here). A few missing values are skipped cell by cell (`_grew`); none at all is a
    baseline damaged or written by another version, which would otherwise pass every cell on that term
    without a word (a blind hunt's baseline without ``cond_max``: "0 grew past the threshold").
    """
    compared = set(table.loc[table["status"] == "both", list(CELL_KEYS)].itertuples(index=False, name=None)) \
        if len(table) else set()
    out = []
    for side, records in (("baseline", base_records), ("run", new_records)):
        measured = [r for r in records if r.get("verdict") != "kernel_error" and cell_key(r) in compared]
        for term in terms:
            if measured and not any(_is_number(r.get(term.metric)) for r in measured):
                out.append(f"no {side} record of the {len(compared)} compared cells holds a number in "
                           f"{term.metric!r} (missing or not a number in all {len(measured)} records that measured "
                           f"something): the term {term.term!r} cannot be checked; the {side} may be damaged or "
                           "written by another harness version: remake it, or leave the term out of --fail-on")
            if term.metric != "cond_max" or (out and out[-1].startswith(f"no {side} record")):
                continue
            # an equivalent record's cond_max is a finite number (its cond is inside the threshold): NaN or Inf
            # there is damage, and as "nothing to grow from" it turned the term off (a blind hunt, session 27)
            damaged = [r for r in measured if r.get("verdict") == "equivalent" and r.get("cond_max") is not None
                       and not (_is_number(r["cond_max"]) and math.isfinite(r["cond_max"]))]
            if damaged:
                out.append(f"{len(damaged)} {side} record(s) judged equivalent hold cond_max "
                           f"{damaged[0]['cond_max']!r} (e.g. {damaged[0].get('kernel')} {damaged[0].get('dtype')} "
                           f"L={damaged[0].get('length')}), where an equivalent case's cond is a finite number: the "
                           f"{side} is damaged; remake it")
    return out


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _grew(term: FailOn, base: float, new: float, dtype: str) -> bool:
    if math.isnan(base) or math.isinf(base):
        return False  # nothing to grow from (missing, or already non-finite)
    if math.isnan(new) or math.isinf(new):
        return True
    floor = noise_floor(term.metric, dtype)
    if base <= floor and new <= floor:
        return False
    return new > term.factor * base


class IncomparableRuns(InvalidArgument):
    """The two runs' headers make a cell-by-cell comparison meaningless (`comparability`)."""


#: Header fields whose difference is worth a note but does not stop the comparison.
NOTED_FIELDS: tuple[str, ...] = ("device", "torch", "harness_version", "cuda")


def comparability(base_header: Mapping[str, Any], new_header: Mapping[str, Any],
                  base_records: Sequence[Mapping[str, Any]] = (),
                  new_records: Sequence[Mapping[str, Any]] = ()) -> tuple[list[str], list[str]]:
    """(reasons the runs cannot be compared, notes on what differs but is compared anyway).

    Refused: a header or record of a schema newer than `SCHEMA_VERSION` (its fields may mean something
    else), and runs on different device families (`harness.records.device_family`). A header missing on
    either side (an older baseline copied without run.json) is compared, with a note.
    """
    refuse: list[str] = []
    notes: list[str] = []
    for name, header, records in (("baseline", base_header, base_records), ("run", new_header, new_records)):
        newer = newer_schema([header, *records])
        if newer is not None:
            refuse.append(f"the {name} was written with record schema {newer}, newer than this harness reads "
                          f"({SCHEMA_VERSION}); upgrade the harness (its version: {header.get('harness_version')})")
    base_family, new_family = device_family(base_header), device_family(new_header)
    if base_family == new_family == "unknown":
        pass  # neither run has a header (records written by hand, or copied alone): nothing to compare
    elif "unknown" in (base_family, new_family):
        missing = [n for n, f in (("baseline", base_family), ("run", new_family)) if f == "unknown"]
        notes.append(f"no device in the {' and '.join(missing)} header (run.json): the device was not checked")
    elif base_family != new_family:
        refuse.append(f"the baseline ran on {base_family} ({base_header.get('device')}) and this run on "
                      f"{new_family} ({new_header.get('device')}): different device families round differently, "
                      "so a cell's change says nothing about the kernel; make a baseline on this device family")
    judged = judged_differently(base_header, new_header, base_records, new_records)
    if judged is not None:
        refuse.append(judged)
    for key in NOTED_FIELDS:
        if base_header and new_header and base_header.get(key) != new_header.get(key):
            notes.append(f"{key} differs: baseline {base_header.get(key)!r}, run {new_header.get(key)!r}")
    old = {schema_version(base_header), schema_version(new_header)} if base_header and new_header else set()
    if len(old) > 1:
        notes.append(f"record schemas {sorted(old)} (older records are read as they were written)")
    return refuse, notes


def judged_differently(base_header: Mapping[str, Any], new_header: Mapping[str, Any],
                       base_records: Sequence[Mapping[str, Any]] = (),
                       new_records: Sequence[Mapping[str, Any]] = ()) -> str | None:
    """Why the two runs' verdicts were judged by different rules, or None: the headers' verdict policies
    (``policy``, written by ``check`` and ``sweep``), else the thresholds their records were judged with
    (``cond_threshold``; a header without a policy: an older run, a pytest run). A run judged with a looser
    policy than its baseline (``--policy cond=4``) passed the gate cell by cell, better verdicts and all
    (a verification pass, session 23): the cells say nothing about the kernel then."""
    base, new = base_header.get("policy"), new_header.get("policy")
    if isinstance(base, Mapping) and isinstance(new, Mapping):
        if dict(base) == dict(new):
            return None
        changed = ", ".join(f"{key} {base.get(key)!r} -> {new.get(key)!r}"
                            for key in sorted(set(base) | set(new)) if base.get(key) != new.get(key))
        return (f"the run was judged under another verdict policy than the baseline ({changed}): its verdicts "
                "are not the baseline's kind; run it with the baseline's policy, or make it the new baseline")

    def thresholds(records: Sequence[Mapping[str, Any]]) -> list[float]:
        return sorted({r["cond_threshold"] for r in records if _is_number(r.get("cond_threshold"))})

    base_t, new_t = thresholds(base_records), thresholds(new_records)
    if base_t and new_t and base_t != new_t:
        return (f"the run's records were judged with cond_threshold {new_t} and the baseline's with {base_t} (the "
                "verdict policy): its verdicts are not the baseline's kind; run it with the baseline's policy, or "
                "make it the new baseline")
    return None


def gate(baseline_dir: str | os.PathLike, new_dir: str | os.PathLike, fail_on: str | None = DEFAULT_FAIL_ON, *,
         allow_missing: bool = False, fail_on_missing: bool | None = None,
         allow_mismatch: bool = False) -> GateResult:
    """Compare the run in ``new_dir`` with the baseline in ``baseline_dir`` (see the module docstring).

    A run that checked less than the baseline fails unless ``allow_missing`` (then each shortfall is a
    warning); ``fail_on_missing`` is its older spelling (False accepts it, True is the default).
    Raises `IncomparableRuns` when the headers make the comparison meaningless, unless ``allow_mismatch``
    (then the reasons are kept as notes of the result).
    """
    _allows_less(allow_missing, fail_on_missing)  # a contradiction is a usage error before anything is read
    from harness.store import load_header, load_records

    base_path, new_path = Path(baseline_dir), Path(new_dir)
    if not base_path.is_dir():
        raise InvalidArgument(f"baseline_dir={str(baseline_dir)!r} is not a directory; create the baseline with "
                              "`harness update-baseline RUN_DIR --baseline DIR` (harness.gate.update_baseline)")
    base_records = load_records(base_path)
    if not base_records:
        raise InvalidArgument(f"baseline_dir={str(baseline_dir)!r} holds no records (records*.jsonl); create it "
                              "with `harness update-baseline RUN_DIR --baseline DIR`")
    if not new_path.is_dir():
        raise InvalidArgument(f"new_dir={str(new_dir)!r} is not a directory; expected the run directory of a sweep or a "
                              "check (--report-dir)")
    if new_path.resolve() == base_path.resolve():
        raise InvalidArgument(f"new_dir={str(new_dir)!r} is the baseline itself ({str(baseline_dir)!r}): a run "
                              "compared with itself cannot fail; expected the run directory of a sweep or a check")
    new_records = load_records(new_path)
    if not new_records:
        raise InvalidArgument(f"new_dir={str(new_dir)!r} holds no records (records*.jsonl); run a sweep or a "
                              "check with --report-dir first")
    base_header, new_header = load_header(base_path), load_header(new_path)
    refuse, notes = comparability(base_header, new_header, base_records, new_records)
    if refuse and not allow_mismatch:
        raise IncomparableRuns(f"the gate refuses to compare {str(new_dir)!r} with the baseline {str(baseline_dir)!r}: "
                               + "; ".join(refuse) + ". Pass --allow-mismatch (allow_mismatch=True) to compare anyway")
    result = gate_records(base_records, new_records, fail_on, allow_missing=allow_missing,
                          fail_on_missing=fail_on_missing, base_header=base_header, new_header=new_header)
    result.notes = [f"compared although {r} (--allow-mismatch)" for r in refuse] + notes + result.notes
    partial = partial_warnings(base_header, new_header)
    result.warnings = ([partial["baseline"]] if "baseline" in partial else []) + result.warnings
    if "run" in partial:
        result.run_failures.append(partial["run"])
        result.failures.append(partial["run"])
        result.passed = False
    return result


def update_baseline(run_dir: str | os.PathLike, baseline_dir: str | os.PathLike, *,
                    allow_partial: bool = False) -> Path:
    """Make the run in ``run_dir`` the baseline: its records (merged, one file) and header (run.json).

    Records of an earlier baseline are replaced; other files in ``baseline_dir`` are left alone. A partial
    run (interrupted, or merged without all its shards) is refused unless ``allow_partial``: the cases it
    never ran would be missing from every later gate's comparison (`partial_warnings`).
    """
    from harness.report import canonical_order
    from harness.store import HEADER_FILE, RECORDS_GLOB, load_header, load_records, write_records

    src, dst = Path(run_dir), Path(baseline_dir)
    records = load_records(src) if src.is_dir() else []
    if not records:
        raise InvalidArgument(f"run_dir={str(run_dir)!r} holds no records (records*.jsonl); nothing to make the "
                              "baseline from")
    header = load_header(src)
    if header.get("partial") and not allow_partial:
        raise InvalidArgument(f"run_dir={str(run_dir)!r} is a partial run ({header.get('status') or 'partial'}); "
                              "expected a complete run: the cases it never ran would not be compared by any later "
                              "gate. Rerun it to completion, or pass allow_partial (--allow-partial) to make it "
                              "the baseline anyway")
    if src.resolve() == dst.resolve():
        raise InvalidArgument(f"run_dir={str(run_dir)!r} is the baseline itself; pass another run directory")
    dst.mkdir(parents=True, exist_ok=True)
    for old in dst.glob(RECORDS_GLOB):
        old.unlink()
    write_records(dst / "records.jsonl", canonical_order(records))
    if (src / HEADER_FILE).is_file():
        shutil.copyfile(src / HEADER_FILE, dst / HEADER_FILE)
    else:
        (dst / HEADER_FILE).unlink(missing_ok=True)
    return dst
