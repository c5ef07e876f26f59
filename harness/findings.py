"""Findings: a run's conclusions, one line each, worst first (the top of ``index.md`` and of the CLI).

A *finding* is the set of records that share one conclusion: the same verdict and cause, and (unless the
verdict is ``equivalent``) the same family and kind (a kernel against the oracle, or a pair of kernels
against each other in differential mode). The line names the kernels and dtypes that share it, the
cause, the number that supports it and how many cases it covers, e.g.::

    torchscale.{chunkwise, parallel, recurrent} (float64, float32), regime trained: divergent, eps_effect
    (through the norm's eps only): cond 3.74e+05 at eps 1e-05, 3.26e+05 at 1e-06, 0.107 at eps 0 (18 cases)

The supporting number is read from the fields the records carry, not from the cause's name, so a new
cause or verdict (a new judging rule) gets its own line without a change here:

- records at 2 to `MAX_EPS_LISTED` eps values (a sweep's grid, not random draws), unless the inputs
  left the domain: the worst error at each eps (``cond_max``; ``ab_max_abs`` for a pair); records that
  carry ``eps0_cond_max`` (the same case rerun at eps = 0): that error too;
- records that all carry ``domain_onset_t``: the positions where the inputs leave the dtype's range,
  and why (``domain_cause``);
- records with ``onset_t`` / ``first_nonfinite_t``: the first mismatched / non-finite positions;
- records with ``error`` and no metrics (kernel errors): the distinct error messages;
- otherwise the worst ``cond_max`` and where it was met.

Known causes, domain causes and verdicts get a phrase (`CAUSE_PHRASES`, `DOMAIN_PHRASES`,
`VERDICT_TAILS`); an unknown one is shown by its name. Lines are ordered by the worst verdict
(`harness.report.SEVERITY`), then the worst ``cond_max`` (a NaN one first: a measurement that could not
be made), then the number of cases.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

#: How a cause reads in a finding (an unknown cause is shown by its name).
CAUSE_PHRASES: dict[str, str] = {
    "rounding": "within the rounding bound",
    "kernel_bug": "beyond the rounding bound and the same-dtype loop: a kernel bug",
    "eps_effect": "through the norm's eps only",
    "precision_loss": "the algorithm is right and loses digits a plain loop keeps",
    "precision_exhausted": "no digit is guaranteed in the dtype",
    "tf32": "its float32 dots run in TF32 (Triton's default); IEEE dots are equivalent",
    "chunk_rounding": "within the bound of decays formed over the whole sequence: declare decays_across_chunks",
    "undeclared_precision": "cases within a narrower dtype's bound: it computes in a narrower precision than its inputs and "
                            "does not declare it",
    "constant_factor": "the oracle's output times one constant: another scale or sign convention",
    "layout": "the oracle's output on the inputs read with two axes swapped: another layout",
    "input_overflow": "the inputs overflow the dtype",
    "near_overflow": "exact values in range, within their error bound of the dtype's max",
    "raised": "the kernel raised",
    "timeout": "the kernel did not return in time",
    "wrong_shape": "wrong output shape",
    "wrong_dtype": "wrong output dtype",
    "wrong_device": "output on the wrong device",
    "not_a_tensor": "the output is not a tensor",
    "mutated_input": "the kernel wrote into its inputs",
    "nondeterministic": "two calls gave different outputs",
}

#: Why a case is out of domain from a position on, by the record's ``domain_cause`` (`harness.metrics`): the
#: inputs leave the dtype's range, or no digit is guaranteed there (`harness.plots` labels its figures so).
DOMAIN_PHRASES: dict[str, str] = {
    "state": "the float64 state exceeds the dtype's max",
    "decay": "a product of decays exceeds the dtype's max",
    "norm": "the group norm's intermediates leave the dtype's range at some positions",
    "output": "the exact output exceeds the dtype's max",
    "terms": "the sum of the terms' absolute values exceeds the dtype's max (the value is in range)",
    "near_overflow": "the output is within its error bound of the dtype's max",
    "oracle_nonfinite": "the float64 oracle itself is not finite",
    "precision_exhausted": "no digit is guaranteed in the dtype (the rounding bound reaches the value's magnitude)",
    "loop_nonfinite": "the plain sequential loop in the dtype is NaN/Inf there too",
}

#: What a verdict says about who is at fault, appended to its findings.
VERDICT_TAILS: dict[str, str] = {"out_of_domain": "no kernel at fault"}

#: The most eps values a finding lists one by one (a sweep's grid; more are random draws).
MAX_EPS_LISTED = 6

#: Distinct error messages quoted per kernel-error finding, and their length.
MAX_ERRORS, MAX_ERROR_CHARS = 2, 120

#: A gradient record's kernel name, ``NAME:grad[INPUT]`` (`harness.gradients`).
_GRADIENT_NAME = re.compile(r":grad\[[^\]]*\]$")

_DTYPE_ORDER = ("float64", "float32", "float16", "bfloat16")


@dataclass(frozen=True)
class Finding:
    """One conclusion shared by ``n`` records (see the module docstring)."""

    verdict: str
    cause: str
    family: str | None
    kernels: tuple[str, ...]
    dtypes: tuple[str, ...]
    regimes: tuple[str, ...]
    n: int
    evidence: str
    severity: int
    worst: float  # the worst cond_max (NaN: could not be measured; -inf: none)
    everything_else: bool = False  # the equivalent line of a run that has other findings

    def line(self, markdown: bool = True) -> str:
        """The finding as one line of Markdown, or of plain text (``markdown=False``: `report.json`'s findings,
        read by programs: no escapes, no emphasis)."""
        if self.everything_else or (self.verdict == "equivalent" and len(self.kernels) > 3):
            pairs = sum(1 for k in self.kernels if " vs " in k)
            grads = sum(1 for k in self.kernels if " vs " not in k and _GRADIENT_NAME.search(k))
            singles = len(self.kernels) - pairs - grads
            count = f"{singles} kernel{'s' if singles != 1 else ''}"
            if grads:  # a gradient's records are named NAME:grad[INPUT] (`harness.gradients`): not a kernel of its own
                count += f", {grads} gradient{'s' if grads != 1 else ''}"
            if pairs:
                count += f" and {pairs} pair{'s' if pairs > 1 else ''}"
            who = f"{'Everything else' if self.everything_else else 'Every kernel'} ({count}; {', '.join(self.dtypes)})"
        else:
            who = f"{kernel_list(self.kernels)} ({', '.join(self.dtypes)})"
            if self.regimes and self.verdict != "equivalent":
                who += f", regime{'s' if len(self.regimes) > 1 else ''} {', '.join(self.regimes)}"
        from harness.report import markdown_escape  # kernel names come from users: shown, never rendered

        phrase = CAUSE_PHRASES.get(self.cause)
        what = f"{self.verdict}, {self.cause}" + (f" ({phrase})" if phrase else "")
        if markdown:
            who, what = markdown_escape(who), f"**{what}**"
        tail = VERDICT_TAILS.get(self.verdict)
        body = "; ".join(p for p in (self.evidence, tail) if p)
        cases = f"{self.n} case{'s' if self.n != 1 else ''}"
        return f"{who}: {what}" + (f": {body}" if body else "") + f" ({cases})"


# ------------------------------------------------------------------------------------------- grouping
def findings(records: Sequence[Mapping[str, Any]]) -> list[Finding]:
    """The run's findings, worst first (see the module docstring)."""
    from harness.report import canonical_order

    groups: dict[tuple, list[Mapping[str, Any]]] = {}
    for r in canonical_order(records):
        verdict, cause = str(r.get("verdict")), _text(r.get("cause"))
        if verdict == "equivalent":
            key: tuple = (verdict, cause, None, False)
        else:
            key = (verdict, cause, _text(r.get("family")), "pair" in r)
        groups.setdefault(key, []).append(r)
    out = [_finding(key, recs) for key, recs in groups.items()]
    out.sort(key=lambda f: (-f.severity, -_rank(f.worst), -f.n, f.line()))
    others = any(f.verdict != "equivalent" for f in out)
    return [Finding(**{**f.__dict__, "everything_else": True}) if others and f.verdict == "equivalent" else f
            for f in out]


def findings_markdown(records: Sequence[Mapping[str, Any]]) -> str:
    """The findings as a numbered Markdown list (``_No harness records._`` when there are none)."""
    found = findings(records)
    if not found:
        return "_No harness records._"
    return "\n".join(f"{i}. {f.line()}" for i, f in enumerate(found, start=1))


def _finding(key: tuple, recs: list[Mapping[str, Any]]) -> Finding:
    from harness.report import number, severity

    verdict, cause, family, _ = key
    conds = [number(r.get("cond_max")) for r in recs if r.get("cond_max") is not None]
    worst = (math.nan if any(math.isnan(c) for c in conds) else max(conds)) if conds else -math.inf
    return Finding(
        verdict=verdict, cause=cause, family=family,
        kernels=tuple(sorted({_text(r.get("kernel")) for r in recs})),
        dtypes=tuple(sorted({_text(r.get("dtype")) for r in recs}, key=_dtype_rank)),
        regimes=tuple(sorted({_text(r.get("regime")) for r in recs if r.get("regime") is not None})),
        n=len(recs), evidence=evidence(recs, breakdown=verdict != "equivalent"), severity=severity(verdict),
        worst=worst)


# ------------------------------------------------------------------------------------------ evidence
def evidence(recs: Sequence[Mapping[str, Any]], *, breakdown: bool = True) -> str:
    """The supporting numbers of a group of records, read from the fields they carry.

    A group that mixes kernels and pairs (the equivalent line) is described by its kernels' records.
    ``breakdown=False`` gives the worst value only (no per-eps list, no positions).
    """
    parts: list[str] = []
    kernels_only = [r for r in recs if "pair" not in r]
    pair = not kernels_only
    recs = kernels_only or list(recs)
    if not breakdown:
        return _worst(recs, pair)
    errors = _errors(recs)
    if errors and not any(r.get("cond_max") is not None for r in recs):
        return "; ".join(errors)
    # the domain is the story only when every case of the group left it (else it is a side note)
    domain = _domain(recs) if all(r.get("domain_onset_t") is not None for r in recs) else ""
    by_eps, at_eps0 = ("", "") if domain else _by_eps(recs, pair)
    if domain:
        parts.append(domain)
    if by_eps:
        parts.append(by_eps)
    if not domain:
        for field, what in (("onset_t", "first mismatch"), ("first_nonfinite_t", "first NaN/Inf in domain")):
            span = _span(r.get(field) for r in recs)
            if span:
                parts.append(f"{what} {span}")
    if not by_eps and not domain:
        parts.insert(0, _worst(recs, pair) + (f", {at_eps0}" if at_eps0 else ""))
    if pair:  # what each side's verdict against the oracle was
        sides = sorted({f"A {r.get('a_verdict')}, B {r.get('b_verdict')}" for r in recs if r.get("a_verdict")})
        if sides:
            parts.append("against the oracle: " + " | ".join(sides))
    suspect = sum(1 for r in recs if r.get("half_path_suspect"))
    if suspect:  # precision_loss at 100x the loop or on one step (`runner._half_path_clause`; blind hunt 26a)
        dtypes_ = "/".join(sorted({str(r.get("dtype")) for r in recs if r.get("half_path_suspect")}))
        parts.append(f"{suspect} of them one step or 100x the loop or more: or a code path taken only for "
                     f"{dtypes_} inputs")
    if errors:
        parts.append("; ".join(errors))
    return "; ".join(p for p in parts if p)


def _by_eps(recs: Sequence[Mapping[str, Any]], pair: bool) -> tuple[str, str]:
    """(the worst error at each eps, when the records span 2 to `MAX_EPS_LISTED` eps values; the worst
    error of the same cases rerun at eps = 0, when the records carry it)."""
    from harness.report import format_value, number

    field, label = ("ab_max_abs", "max |A - B|") if pair else ("cond_max", "cond")
    eps_values = {number(r.get("eps")) for r in recs if r.get("eps") is not None}
    eps_values = {e for e in eps_values if math.isfinite(e)}
    eps0 = [number(r.get("eps0_cond_max")) for r in recs if r.get("eps0_cond_max") is not None]
    at_eps0 = f"{format_value(_worst_value(eps0))} at eps 0 (the same cases rerun)" if eps0 and 0.0 not in eps_values \
        else ""
    if not 2 <= len(eps_values) <= MAX_EPS_LISTED:  # one eps, or eps drawn at random: no axis to read
        return "", at_eps0
    items = []
    for e in sorted(eps_values, reverse=True):
        worst = _worst_value(number(r.get(field)) for r in recs if number(r.get("eps")) == e)
        if not math.isnan(worst):
            items.append(f"{format_value(worst)} at {'eps ' if not items else ''}{format_value(e, '{:g}')}")
    if at_eps0:
        items.append(at_eps0)
    return (f"{label} " + ", ".join(items) if items else ""), ""


def _domain(recs: Sequence[Mapping[str, Any]]) -> str:
    span = _span(r.get("domain_onset_t") for r in recs)
    if not span:
        return ""
    counts: dict[str, int] = {}
    for r in recs:
        if r.get("domain_onset_t") is not None and r.get("domain_cause") not in (None, "none"):
            counts[str(r.get("domain_cause"))] = counts.get(str(r.get("domain_cause")), 0) + 1
    if len(counts) > 1:  # each cause with its cases: "A or B" read as if one case had either (a blind hunt, session 25)
        phrases = [f"{DOMAIN_PHRASES.get(c, c)} ({n} case{'s' if n != 1 else ''})"
                   for c, n in sorted(counts.items(), key=lambda cn: (-cn[1], cn[0]))]
        return f"out of domain {span}: " + "; ".join(phrases)
    return f"out of domain {span}" + (f": {DOMAIN_PHRASES.get(c, c)}" if (c := next(iter(counts), None)) else "")


def _span(values: Iterable[Any]) -> str:
    """``at t=5`` or ``from t=5 to t=296`` over the finite positions given; '' when there are none."""
    from harness.report import number

    ts = sorted({int(v) for v in (number(x) for x in values) if math.isfinite(v)})
    if not ts:
        return ""
    return f"at t={ts[0]}" if len(ts) == 1 else f"from t={ts[0]} to t={ts[-1]}"


def _worst(recs: Sequence[Mapping[str, Any]], pair: bool) -> str:
    from harness.report import case_cond, format_value, number

    # a case's cond is its output's or its final state's, whichever is worse (`case_cond`): a kernel divergent
    # on its final state alone read "worst cond 0.265" with the state at 6e14 (blind hunt, session 23)
    label, value = ("max |A - B|", lambda r: r.get("ab_max_abs")) if pair else ("worst cond", case_cond)
    measured = [r for r in recs if value(r) is not None]
    if not measured:
        return ""
    top = max(measured, key=lambda r: _rank(number(value(r))))
    where = " ".join(p for p in (_text(top.get("kernel")) if len({_text(r.get("kernel")) for r in recs}) > 1 else "",
                                 _text(top.get("dtype")), f"L={format_value(number(top.get('length')))}",
                                 _text(top.get("regime"))) if p and p != "-")
    said = f"{label} {format_value(number(value(top)))} ({where})"
    # a kernel's NaN/Inf is no cond: its cases read "worst cond -" or the finite elements' cond (blind hunt 26a)
    nonfinite = sum(1 for r in recs if number(r.get("n_kernel_nonfinite_in_domain")) > 0)
    if nonfinite and not pair:
        said += f"; NaN/Inf where the oracle is finite in {nonfinite} case{'' if nonfinite == 1 else 's'}"
    return said


def _errors(recs: Sequence[Mapping[str, Any]]) -> list[str]:
    seen: list[str] = []
    for r in recs:
        text = r.get("error")
        if text and str(text) not in seen:
            seen.append(str(text))
    quoted = [f"`{' '.join(e.split())[:MAX_ERROR_CHARS]}`" for e in seen[:MAX_ERRORS]]
    if len(seen) > MAX_ERRORS:
        quoted.append(f"{len(seen) - MAX_ERRORS} more messages")
    return quoted


# --------------------------------------------------------------------------------------------- text
def kernel_list(kernels: Sequence[str]) -> str:
    """``torchscale.{chunkwise, parallel}, intree.blelloch_scan``: names sharing a package prefix folded."""
    by_prefix: dict[str, list[str]] = {}
    order: list[str] = []
    for name in kernels:
        prefix, dot, rest = name.partition(".")
        key = prefix if dot and " vs " not in name else name
        if key not in by_prefix:
            order.append(key)
        by_prefix.setdefault(key, []).append(rest if key != name else "")
    parts = []
    for key in order:
        rests = by_prefix[key]
        if rests == [""]:
            parts.append(key)
        elif len(rests) == 1:
            parts.append(f"{key}.{rests[0]}")
        else:
            parts.append(f"{key}.{{{', '.join(rests)}}}")
    return ", ".join(parts)


def _text(value: Any) -> str:
    return "-" if value is None else str(value)


def _rank(value: float) -> float:
    return math.inf if math.isnan(value) else value


def _worst_value(values: Iterable[float]) -> float:
    vals = list(values)
    if not vals:
        return math.nan
    return math.nan if any(math.isnan(v) for v in vals) else max(vals)


def _dtype_rank(name: str) -> tuple[int, str]:
    return (_DTYPE_ORDER.index(name) if name in _DTYPE_ORDER else len(_DTYPE_ORDER), name)
