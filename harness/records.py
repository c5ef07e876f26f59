"""The case record: what one case was, what was measured, what was judged, and how long it took.

On disk a record stays one flat JSON object per line (`harness.store`), so a record is greppable and
every table reads a field by its name; `CaseRecord` is its typed view, split into the four parts
the harness reasons about:

- ``problem``: the `harness.problems.Problem` fields (family, shapes, length, dtype, device, tf32, seed...);
- ``measurement``: the numbers of `harness.metrics.Divergence`, with ``precision``, the precision the
  kernel was measured in (its declared compute precision: a kernel fed float64 that computes in float32
  is measured, and must be re-judged, as float32; see `measured_precision`);
- ``judgement``: ``verdict``, ``rule`` (the rule of `harness.verdict.judge` that fired), ``cause``, ``why``;
- ``timings``: the ``t_*`` seconds.

Versions. `SCHEMA_VERSION` is written into every record and every run header by `harness.store`.
Version 1 is the format before versioning (no ``schema_version`` field, no ``rule``): it is read as is.
A record or header of a newer version than this harness knows is refused by the gate (`newer_schema`)
unless the caller allows the mismatch: its fields may not mean what this version thinks they mean.

This module also holds the one definition of how bad a verdict is (`SEVERITY`) and which verdicts fail
a check, a sweep, the pytest route and replay (`FAILING_VERDICTS`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

#: The version of the record and header format this harness writes (1: unversioned, before it).
SCHEMA_VERSION = 2

#: The verdicts, in the order tables list them.
VERDICTS: tuple[str, ...] = ("equivalent", "divergent", "out_of_domain", "kernel_error")

#: How bad a verdict is (higher is worse). ``out_of_domain`` is the inputs' finding, not the kernel's,
#: so it ranks below the two verdicts that mean a kernel bug; an unknown verdict ranks with them.
SEVERITY: dict[str, int] = {"equivalent": 0, "out_of_domain": 1, "kernel_error": 2, "divergent": 3}
UNKNOWN_SEVERITY = 2

#: Verdicts that fail a check, a sweep's exit status, a pytest test and a replay.
FAILING_VERDICTS = frozenset({"divergent", "kernel_error"})

#: The judgement's fields in a flat record.
JUDGEMENT_FIELDS: tuple[str, ...] = ("verdict", "rule", "cause", "why")
#: Fields that say which kernel and case a record is (neither problem nor measurement).
IDENTITY_FIELDS: tuple[str, ...] = ("kernel", "family", "case", "replay", "schema_version")


def severity(verdict: Any) -> int:
    """`SEVERITY` of ``verdict`` (a string or a `harness.verdict.Verdict`)."""
    return SEVERITY.get(str(getattr(verdict, "value", verdict)), UNKNOWN_SEVERITY)


def is_failing(verdict: Any) -> bool:
    return str(getattr(verdict, "value", verdict)) in FAILING_VERDICTS


def kernel_of(record: Mapping[str, Any]) -> str:
    """The kernel a record ran: ``NAME`` of a gradient record's ``NAME:grad[INPUT]`` (`harness.gradients`)."""
    kernel = str(record["kernel"])
    return kernel.rsplit(":grad[", 1)[0] if record.get("mode") == "grad" else kernel


def schema_version(data: Mapping[str, Any]) -> int:
    """The schema version of a record or a run header: 1 when the field is missing (written before it)."""
    value = data.get("schema_version", 1)
    return value if isinstance(value, int) and not isinstance(value, bool) else 1


def measured_precision(record: Mapping[str, Any]) -> str | None:
    """The precision ``record`` was measured in: its ``precision`` field (the kernel's declared compute
    precision), else its problem's ``dtype`` (records of kernel errors carry none)."""
    return record.get("precision") or record.get("dtype")


def _problem_fields() -> frozenset[str]:
    from harness.problems import Problem

    return frozenset(f.name for f in dataclasses.fields(Problem)) - {"values"}


def _measurement_fields() -> frozenset[str]:
    from harness.metrics import Divergence

    return frozenset(f.name for f in dataclasses.fields(Divergence)) | {"precision"}


@dataclass
class CaseRecord:
    """The typed view of one flat record (see the module docstring); ``extra`` keeps every other field
    (outcome, error, isolation, counterfactual results...) so that ``to_dict`` gives the record back."""

    kernel: str
    case: str | None
    problem: dict[str, Any]
    measurement: dict[str, Any]
    judgement: dict[str, Any]
    timings: dict[str, float] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)
    schema_version: int = SCHEMA_VERSION

    @property
    def verdict(self) -> str | None:
        return self.judgement.get("verdict")

    @property
    def failing(self) -> bool:
        return is_failing(self.verdict)

    @property
    def precision(self) -> str | None:
        return self.measurement.get("precision") or self.problem.get("dtype")

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "CaseRecord":
        """Split a flat record (any schema version this harness reads) into its parts."""
        problem_fields, measured = _problem_fields(), _measurement_fields()
        parts: dict[str, dict[str, Any]] = {"problem": {}, "measurement": {}, "judgement": {}, "timings": {},
                                            "extra": {}}
        for key, value in data.items():
            if key in ("kernel", "case", "schema_version"):
                continue
            if key in JUDGEMENT_FIELDS:
                parts["judgement"][key] = value
            elif key.startswith("t_"):
                parts["timings"][key] = value
            elif key in problem_fields:  # dtype and length are the problem's (the measurement has precision)
                parts["problem"][key] = value
            elif key in measured:
                parts["measurement"][key] = value
            else:
                parts["extra"][key] = value
        return cls(kernel=str(data.get("kernel")), case=data.get("case"), schema_version=schema_version(data),
                   **parts)

    def to_dict(self) -> dict[str, Any]:
        """The flat record (what `harness.store` writes), with this record's schema version."""
        out: dict[str, Any] = {"kernel": self.kernel, "case": self.case, "schema_version": self.schema_version}
        for part in (self.extra, self.measurement, self.problem, self.timings, self.judgement):
            out.update(part)
        return out


def newer_schema(items: Iterable[Mapping[str, Any]]) -> int | None:
    """The highest schema version among ``items`` (records or headers) above `SCHEMA_VERSION`, else None."""
    newer = [v for v in (schema_version(i) for i in items) if v > SCHEMA_VERSION]
    return max(newer) if newer else None


def device_family(header: Mapping[str, Any]) -> str:
    """The family of device a run header describes: ``cpu`` or ``cuda`` (``unknown`` without a header).

    Two runs on different families round differently (fused multiply-adds, TF32, another library's
    reductions): comparing their cells says nothing about a change of the kernel.
    """
    if not header:
        return "unknown"
    if header.get("cuda") or not str(header.get("device", "")).startswith("cpu"):
        return "cuda" if header.get("device") else "unknown"
    return "cpu"
