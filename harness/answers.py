"""The question a sweep answers, and the table of its records that answers it.

A sweep file (``harness/sweeps/*.toml`` built in, or a project's own) may declare one or more ``[[answer]]`` tables::

    [[answer]]
    question = "Do parallel and chunkwise disagree because of the eps? max |A - B| by eps"
    where = { kind = "pair", dtype = "float32" }   # which records (optional)
    rows = ["kernel"]                                # one row per distinct value (of these fields)
    columns = "eps"                                  # one column per distinct value of this field
    value = "{ab_max_abs:.1e} {verdict}[ ({cause})]" # what a cell shows
    floor = 1e-5                                     # optional: numbers below it show as "< 1e-05"

``where`` keeps the records whose field equals the value (or is one of a list of values); the field
``kind`` is ``pair`` for a differential record (two kernels against each other) and ``kernel`` for a
kernel against the oracle. ``value`` is a Python format string over the record's fields; a part in
square brackets is left out when a field it names is missing (``[ from t={domain_onset_t}]`` shows only
for a record that has an onset). ``floor`` is for numbers at rounding level, whose digits differ between
CPUs (vector widths, MKL's code paths, thread counts): a number below it shows as ``< floor``, so that a
table generated on one machine is the table of every other. When several records fall in one cell, the worst is shown (worst
verdict, `harness.report.SEVERITY`, then highest ``cond_max``, then highest ``ab_max_abs``).

Rows and columns follow the sweep's own order: a field of the sweep's grid in the grid's order, the
kernels in the order the sweep lists them (pairs as ``a vs b``), any other field sorted. The sweep
stores its tables in the run's header (``run.json``, key ``answers``), so `harness.report` renders them
from the run directory alone, and `harness sweep` prints them.
"""

from __future__ import annotations

import math
import re
import string
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from harness.errors import InvalidArgument

_BRACKETS = re.compile(r"\[([^\[\]]*)\]")
_KNOWN_KEYS = frozenset({"question", "where", "rows", "columns", "value", "floor"})


@dataclass(frozen=True)
class AnswerTable:
    """One declared table (see the module docstring); ``orders`` maps a field to its values' order."""

    question: str
    rows: tuple[str, ...]
    columns: str
    value: str
    where: dict[str, Any] = field(default_factory=dict)
    orders: dict[str, list[Any]] = field(default_factory=dict)
    floor: float | None = None

    def to_dict(self) -> dict[str, Any]:
        data = {"question": self.question, "rows": list(self.rows), "columns": self.columns, "value": self.value,
                "where": dict(self.where), "orders": {k: list(v) for k, v in self.orders.items()}}
        return data if self.floor is None else {**data, "floor": self.floor}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], where: str = "answer",
                  orders: Mapping[str, Sequence[Any]] | None = None) -> "AnswerTable":
        """Validate a declaration (a TOML table or `to_dict` output); errors name the key and the value."""
        if not isinstance(data, Mapping):
            raise InvalidArgument(f"{where} must be a table with question, rows, columns and value; got {data!r}")
        unknown = sorted(set(data) - _KNOWN_KEYS - {"orders"})
        if unknown:
            raise InvalidArgument(f"{where} has unknown keys {unknown}; expected {sorted(_KNOWN_KEYS)}")
        for key in ("question", "rows", "columns", "value"):
            if key not in data:
                raise InvalidArgument(f"{where} has no {key!r}; expected {sorted(_KNOWN_KEYS)}")
        rows = data["rows"]
        # a number or a table there raised a TypeError traceback (a blind hunt, session 27)
        rows = (rows,) if isinstance(rows, str) else tuple(rows) if isinstance(rows, (list, tuple)) else ()
        if not rows or not all(isinstance(r, str) and r for r in rows):
            raise InvalidArgument(f"{where}: rows={data['rows']!r} must be a field name or a list of field names")
        columns = data["columns"]
        if not isinstance(columns, str) or not columns:
            raise InvalidArgument(f"{where}: columns={columns!r} must be one field name")
        value = data["value"]
        try:
            named = isinstance(value, str) and _fields(value)
        except ValueError as exc:  # "{verdict": a traceback before (blind hunt, session 23)
            raise InvalidArgument(f"{where}: value={value!r} is not a format string ({exc}); expected e.g. "
                                  "'{verdict}' or '{ab_max_abs:.1e}'") from None
        if not named:
            raise InvalidArgument(f"{where}: value={value!r} must be a format string naming a field, "
                                  "e.g. '{verdict}' or '{ab_max_abs:.1e}'")
        filt = data.get("where", {})
        if not isinstance(filt, Mapping):
            raise InvalidArgument(f"{where}: where={filt!r} must be a table of field = value (or list of values)")
        floor = data.get("floor")
        if floor is not None and (isinstance(floor, bool) or not isinstance(floor, (int, float))
                                  or not 0 < floor < math.inf):
            raise InvalidArgument(f"{where}: floor={floor!r} must be a positive number (values below it show as "
                                  "'< floor'), e.g. 1e-5")
        given = data.get("orders") or orders or {}
        return cls(question=str(data["question"]).strip(), rows=rows, columns=columns, value=value,
                   where=dict(filt), orders={k: list(v) for k, v in given.items()},
                   floor=None if floor is None else float(floor))


#: Fields of a sweep's records, besides its problems' own, that a table's rows and columns may name.
RECORD_KEY_FIELDS = ("kernel", "kind", "family", "verdict", "cause", "precision", "outcome", "mode", "grad_of")


def row_fields() -> tuple[str, ...]:
    """The fields a table's ``rows`` and ``columns`` may name: `RECORD_KEY_FIELDS` and the problem's fields
    (those a sweep's every record carries, so that each row and column has a value)."""
    import dataclasses

    from harness.problems import Problem

    return (*RECORD_KEY_FIELDS, *(f.name for f in dataclasses.fields(Problem) if f.name not in ("family", "values")))


def _check_row_fields(table: AnswerTable, where: str) -> None:
    """`InvalidArgument` naming a ``rows`` or ``columns`` field no record of a sweep carries: ``rows =
    ["nofield"]`` was accepted and its table had one row labelled "-" (blind hunt 23b, P16)."""
    known = row_fields()
    for key, names in (("rows", table.rows), ("columns", (table.columns,))):
        unknown = [name for name in names if name not in known]
        if unknown:
            raise InvalidArgument(f"{where}: {key} names {unknown}, no field of a sweep's records; expected "
                                  f"fields among {list(known)}")


def parse_answers(data: Any, where: str, orders: Mapping[str, Sequence[Any]] | None = None) -> list[AnswerTable]:
    """The ``[[answer]]`` tables of a sweep file (none when absent); ``where`` names the file in errors."""
    if data is None:
        return []
    items = [data] if isinstance(data, Mapping) else data
    if not isinstance(items, list):
        raise InvalidArgument(f"{where}: answer={data!r} must be [[answer]] tables")
    tables = [AnswerTable.from_dict(item, f"{where}: answer {i}", orders) for i, item in enumerate(items)]
    for i, table in enumerate(tables):
        _check_row_fields(table, f"{where}: answer {i}")
    return tables


# ---------------------------------------------------------------------------------------- rendering
def _fields(template: str) -> list[str]:
    return [name.split(".")[0].split("[")[0] for _, name, _, _ in string.Formatter().parse(template) if name]


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def _field(record: Mapping[str, Any], name: str) -> Any:
    if name == "kind":
        return "pair" if "pair" in record else "kernel"
    return record.get(name)


def render_value(template: str, record: Mapping[str, Any], floor: float | None = None) -> str:
    """``template`` filled from ``record``; a bracketed part naming a missing field is left out, any other
    missing field is shown as ``-`` (and one whose format does not fit its value, as its text); a number
    whose magnitude is below ``floor`` as ``< floor``."""
    def optional(match: re.Match) -> str:
        part = match.group(1)
        return "" if any(_missing(_field(record, name)) for name in _fields(part)) else _fill(part, record, floor)

    return _fill(_BRACKETS.sub(optional, template), record, floor)


def _fill(text: str, record: Mapping[str, Any], floor: float | None) -> str:
    out = []
    for literal, name, spec, _ in string.Formatter().parse(text):
        out.append(literal)
        if name:
            v = _field(record, name)
            below = floor is not None and isinstance(v, (int, float)) and not isinstance(v, bool) and abs(v) < floor
            try:
                out.append("-" if _missing(v) else f"< {floor:g}" if below else format(v, spec or ""))
            except (ValueError, TypeError):
                out.append(str(v))
    return "".join(out)


def _same(a: Any, b: Any) -> bool:
    """Equal, with numbers compared as numbers (a TOML ``0`` matches a record's ``0.0``)."""
    numeric = isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool) \
        and not isinstance(b, bool)
    return float(a) == float(b) if numeric else a == b


def _matches(record: Mapping[str, Any], where: Mapping[str, Any]) -> bool:
    for key, want in where.items():
        got = _field(record, key)
        allowed = want if isinstance(want, list) else [want]
        if not any(_same(got, a) for a in allowed):
            return False
    return True


def _ordered(values: list[Any], order: Sequence[Any] | None) -> list[Any]:
    from harness.report import _sortable

    def key(v: Any) -> tuple:
        if order is not None:
            for i, o in enumerate(order):
                if _same(v, o):
                    return (0, i, _sortable(v))
        return (1, 0, _sortable(v))

    return sorted(values, key=key)


def answer_cells(table: AnswerTable, records: Sequence[Mapping[str, Any]]) -> tuple[list[tuple], list[Any], dict]:
    """(row keys, column values, {(row key, column value): the worst record}) of ``table``."""
    from harness.report import _cond_rank, number, severity

    chosen: dict[tuple, Mapping[str, Any]] = {}
    for r in records:
        if not _matches(r, table.where):
            continue
        cell = (tuple(_field(r, f) for f in table.rows), _field(r, table.columns))
        rank = (severity(r.get("verdict")), _cond_rank(r.get("cond_max")), number(r.get("ab_max_abs")))
        old = chosen.get(cell)
        if old is None or rank > (severity(old.get("verdict")), _cond_rank(old.get("cond_max")),
                                  number(old.get("ab_max_abs"))):
            chosen[cell] = r
    row_keys = list({k for k, _ in chosen})
    for i in range(len(table.rows) - 1, -1, -1):  # stable sorts, last field first
        order = table.orders.get(table.rows[i])
        by_value = _ordered(list({k[i] for k in row_keys}), order)
        row_keys.sort(key=lambda k: by_value.index(k[i]))
    columns = _ordered(list({c for _, c in chosen}), table.orders.get(table.columns))
    return row_keys, columns, chosen


def answer_markdown(table: AnswerTable, records: Sequence[Mapping[str, Any]]) -> str:
    """The question in bold (escaped, on one line), then the table as GitHub Markdown (``-`` for an empty cell)."""
    from tabulate import tabulate

    from harness.report import _md_cell, format_value

    row_keys, columns, chosen = answer_cells(table, records)
    head = f"**{_md_cell(table.question)}**"  # the sweep author's text: shown, never rendered (no HTML, no link)
    if not chosen:
        return head + "\n\n_No record matches this table._"
    headers = [" / ".join(table.rows) + " \\ " + table.columns,
               *(format_value(c, "{:g}") if isinstance(c, float) else format_value(c) for c in columns)]
    body = []
    for key in row_keys:
        cells = [_md_cell(" ".join(format_value(k) for k in key))]
        for c in columns:
            rec = chosen.get((key, c))
            cells.append(_md_cell(render_value(table.value, rec, table.floor)) if rec is not None else "-")
        body.append(cells)
    return head + "\n\n" + tabulate(body, headers=headers, tablefmt="github", disable_numparse=True)


def answers_markdown(header: Mapping[str, Any], records: Sequence[Mapping[str, Any]]) -> str:
    """Every table a run's header declares (``''`` when none)."""
    tables = [AnswerTable.from_dict(d, "run.json answer") for d in header.get("answers") or []]
    return "\n\n".join(answer_markdown(t, records) for t in tables)


def generated_block(sweep_name: str, tables: Sequence[AnswerTable], records: Sequence[Mapping[str, Any]]) -> str:
    """A sweep's answer tables between marker comments, as the README carries them (see
    ``scripts/seed_tables.py``, which writes them, and ``tests/test_findings.py``, which checks them)."""
    begin, end = block_markers(sweep_name)
    body = "\n\n".join(answer_markdown(t, records) for t in tables)
    return f"{begin}\n{body}\n{end}"


def block_markers(sweep_name: str) -> tuple[str, str]:
    """The lines that open and close a generated block of ``sweep_name``'s tables."""
    return (f"<!-- BEGIN generated by `harness sweep {sweep_name}` (scripts/seed_tables.py) -->",
            f"<!-- END generated: {sweep_name} -->")
