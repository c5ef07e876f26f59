"""Judging a `Divergence` record: one documented policy, four verdicts, and the failure message.

`judge` turns the numbers `harness.metrics.measure` recorded into a `Verdict` and a sentence saying
which rule fired with which numbers. The rules, in the order they are tried:

1. ``kernel_error`` given (the kernel raised, or broke its contract) -> KERNEL_ERROR, the why is the
   error. A record whose output could not be compared at all (``problem``: wrong shape, not a tensor)
   is a KERNEL_ERROR too.
2. The kernel returned NaN/Inf where the oracle is finite and in domain -> DIVERGENT (the why names the
   first position).
3. No element is in domain -> OUT_OF_DOMAIN: the inputs overflow the dtype even in exact arithmetic
   (the range domain), or no element has a guaranteed digit (the precision domain: the valid rounding
   bound reaches the element's magnitude, `harness.metrics.PRECISION_LIMIT`; cause
   ``precision_exhausted``, `domain_kind`).
4. The condition-normalized error (see `harness.metrics`) over the in-domain elements:

   - float64 kernels are held to float64 rounding: DIVERGENT when ``cond_max > cond_threshold``
     (their baseline would be the oracle itself, so there is no baseline rule);
   - lower precisions are DIVERGENT when ``cond_max > cond_threshold`` AND ``baseline_ratio >
     baseline_factor``: rounding that the plain sequential loop in the same dtype also makes is not
     a kernel bug. Without a baseline in the record the cond rule alone decides.

5. Part of the output is out of domain and the in-domain part passed -> OUT_OF_DOMAIN when the compared
   fraction is below ``min_compared_fraction`` (by default any element out of domain): "equivalent"
   would claim more than was checked.
6. Otherwise EQUIVALENT.

`assert_equivalent` is the thin raising wrapper for tests (``DivergenceError``, an AssertionError),
`format_failure` the text it raises with. Every default threshold is a named constant below, with where
its value comes from; they are to be recalibrated from stored records (docs/verdict.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace
from enum import Enum
from typing import Any, Iterator, Mapping, Sequence

import torch

from harness import dtypes
from harness.errors import DivergenceError, InvalidArgument
from harness.metrics import BASELINE_FLOOR, COND_THRESHOLD, Divergence

__all__ = [
    "BASELINE_FACTOR",
    "BASELINE_FLOOR",
    "COND_THRESHOLD",
    "MIN_COMPARED_FRACTION",
    "Judgement",
    "Policy",
    "Verdict",
    "assert_equivalent",
    "domain_kind",
    "format_failure",
    "judge",
]

# COND_THRESHOLD (imported from harness.metrics, where mismatches are counted against it) is 1.0: "within
# the a-priori error bound" u * (growth + depth * magnitude). The bound adds worst cases, so correct
# kernels sit far below it; a kernel above it errs more than any correct ordering of the sum can.

#: A kernel above the cond threshold is still equivalent when its error is at most this many times the
#: error of the plain sequential loop in the same dtype. The value is flash-attention's test rule
#: ("the output error is at most 2x the error of the reference implementation in the same dtype",
#: Dao-AILab/flash-attention tests/test_flash_attn.py).
BASELINE_FACTOR: float = 2.0

#: The least fraction of the output that must be compared (in domain and finite) for EQUIVALENT; below
#: it the verdict is OUT_OF_DOMAIN. 1.0: any element whose exact state overflows the dtype makes the
#: case out of domain, so a report never calls a partly unchecked case equivalent.
MIN_COMPARED_FRACTION: float = 1.0

#: Whether `assert_equivalent` raises on OUT_OF_DOMAIN. False: an input that overflows the dtype is a
#: finding about the input, not a failure of the kernel.
FAIL_ON_OUT_OF_DOMAIN: bool = False


class Verdict(str, Enum):
    """The four outcomes of one case; the value is what records and reports store."""

    EQUIVALENT = "equivalent"
    DIVERGENT = "divergent"
    OUT_OF_DOMAIN = "out_of_domain"
    KERNEL_ERROR = "kernel_error"


@dataclass(frozen=True)
class Judgement:
    """A verdict, the sentence saying why, and the name of the rule that fired.

    Unpacks as ``verdict, why = judgement``. ``rule`` is one of ``kernel_error``, ``uncomparable``,
    ``kernel_nonfinite``, ``no_domain``, ``cond``, ``cond_and_baseline``, ``partial_domain``,
    ``within_bound``, ``baseline_explains``.
    """

    verdict: Verdict
    why: str
    rule: str = ""

    def __iter__(self) -> Iterator[Any]:
        return iter((self.verdict, self.why))

    def to_dict(self) -> dict[str, str]:
        return {"verdict": self.verdict.value, "why": self.why, "rule": self.rule}


# Keys of the override language: short name -> field. The long field names are accepted too.
_KEYS: dict[str, str] = {
    "cond": "cond_threshold",
    "baseline": "baseline_factor",
    "min_compared": "min_compared_fraction",
    "fail_ood": "fail_on_out_of_domain",
}
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


@dataclass(frozen=True)
class Policy:
    """The thresholds `judge` applies (see the module docstring for the rules).

    ``cond_threshold``: the condition-normalized error above which an element diverges.
    ``baseline_factor``: how many times the same-dtype sequential loop's cond error a kernel may make.
    ``min_compared_fraction``: the compared fraction of the output needed for EQUIVALENT.
    ``fail_on_out_of_domain``: whether `assert_equivalent` raises on OUT_OF_DOMAIN.
    """

    cond_threshold: float = COND_THRESHOLD
    baseline_factor: float = BASELINE_FACTOR
    min_compared_fraction: float = MIN_COMPARED_FRACTION
    fail_on_out_of_domain: bool = FAIL_ON_OUT_OF_DOMAIN

    def __post_init__(self) -> None:
        if not (isinstance(self.cond_threshold, (int, float)) and 0 < self.cond_threshold < math.inf):
            raise InvalidArgument(
                f"cond_threshold={self.cond_threshold!r} must be a positive finite number; "
                f"1.0 means 'within the a-priori error bound'"
            )
        if not (isinstance(self.baseline_factor, (int, float)) and 0 < self.baseline_factor <= math.inf):
            raise InvalidArgument(
                f"baseline_factor={self.baseline_factor!r} must be positive; use inf to let the baseline "
                f"excuse any error, or a large cond_threshold to disable the cond rule"
            )
        if not (isinstance(self.min_compared_fraction, (int, float)) and 0 <= self.min_compared_fraction <= 1):
            raise InvalidArgument(
                f"min_compared_fraction={self.min_compared_fraction!r} must be in [0, 1]; "
                f"1.0 makes any out-of-domain element an out_of_domain verdict"
            )
        if not isinstance(self.fail_on_out_of_domain, bool):
            raise InvalidArgument(f"fail_on_out_of_domain={self.fail_on_out_of_domain!r} must be True or False")

    @classmethod
    def parse(cls, spec: str, *, base: "Policy | None" = None) -> "Policy":
        """Overrides from a command line or pytest option: ``"cond=4,baseline=3"``.

        Keys: ``cond`` (cond_threshold), ``baseline`` (baseline_factor), ``min_compared``
        (min_compared_fraction), ``fail_ood`` (fail_on_out_of_domain: true/false/1/0/yes/no); the long
        field names work too. Unnamed fields keep ``base``'s values (default: the module defaults). An
        empty spec or ``"default"`` gives ``base``.
        """
        policy = base if base is not None else cls()
        if not isinstance(spec, str):
            raise InvalidArgument(f"spec={spec!r} must be a string such as 'cond=4,baseline=3'")
        text = spec.strip()
        if text in ("", "default"):
            return policy
        long_names = {f.name for f in fields(cls)}
        changes: dict[str, Any] = {}
        for item in text.split(","):
            item = item.strip()
            if not item:
                continue
            key, sep, raw = item.partition("=")
            key, raw = key.strip(), raw.strip()
            if not sep or not key or not raw:
                raise InvalidArgument(
                    f"policy item {item!r} in spec={spec!r} is not key=value; expected e.g. 'cond=4,baseline=3'"
                )
            name = _KEYS.get(key, key if key in long_names else None)
            if name is None:
                keys = ", ".join(f"{k} ({v})" for k, v in _KEYS.items())
                raise InvalidArgument(f"policy key {key!r} in spec={spec!r} is unknown; expected one of: {keys}")
            if name in changes:
                raise InvalidArgument(f"policy key {key!r} is given twice in spec={spec!r}")
            if name == "fail_on_out_of_domain":
                low = raw.lower()
                if low not in _TRUE | _FALSE:
                    raise InvalidArgument(f"{key}={raw!r} in spec={spec!r} is not a boolean; expected true or false")
                changes[name] = low in _TRUE
            else:
                try:
                    value = float(raw.rstrip("%")) / (100.0 if raw.endswith("%") else 1.0)
                except ValueError:
                    raise InvalidArgument(f"{key}={raw!r} in spec={spec!r} is not a number") from None
                changes[name] = value
        return replace(policy, **changes)

    def spec(self) -> str:
        """The override string that `parse` turns back into this policy (stored with records)."""
        return (
            f"cond={self.cond_threshold:g},baseline={self.baseline_factor:g},"
            f"min_compared={self.min_compared_fraction:g},fail_ood={str(self.fail_on_out_of_domain).lower()}"
        )

    def __str__(self) -> str:
        return self.spec()


def _record(record: Divergence | Mapping[str, Any] | None) -> Divergence | None:
    if record is None or isinstance(record, Divergence):
        return record
    if isinstance(record, Mapping):
        return Divergence.from_dict(dict(record))
    raise InvalidArgument(f"record={record!r:.80} is neither a Divergence nor its to_dict() dict")


def _final_state_view(record: Any) -> dict[str, Any] | None:
    """A record whose final state decides its verdict, with the final state's measurement in place of the
    output's; None for any other record."""
    if not isinstance(record, Mapping) or record.get("verdict_target") != "final_state":
        return None
    if record.get("final_state_worst_index") is None:
        return None
    prefix = "final_state_"
    return {**record, **{k[len(prefix):]: v for k, v in record.items() if k.startswith(prefix)}}


def _stored_kernel_error(record: Mapping[str, Any]) -> str | None:
    """The kernel error a stored runner record carries, or None when it holds a measurement.

    The runner stores a failed kernel call as ``outcome`` (not ``"ok"``) and ``error`` (the message)
    with no measurements; judging such a record again must give KERNEL_ERROR, not a verdict made of
    missing numbers. A mapping with neither a measurement nor an error cannot be judged.
    """
    outcome = record.get("outcome")
    error = record.get("error")
    if outcome not in (None, "ok") or (error and "n_elements" not in record):
        return f"{outcome}: {error}" if outcome not in (None, "ok") else str(error)
    if "n_elements" not in record:
        raise InvalidArgument(
            f"record with keys {sorted(record)[:8]} holds no measurement (no 'n_elements'); pass the output "
            f"of metrics.measure(...) or its to_dict(), or kernel_error= for a kernel that failed"
        )
    return None


def _g(value: float | None) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, float) and (math.isnan(value) or math.isinf(value)):
        return str(value)
    return f"{value:.3g}"


def _at(rec: Divergence, index: tuple[int, ...] | None) -> str:
    if index is None:
        return "(no element)"
    names = rec.axis_names or tuple(f"axis{i}" for i in range(len(index)))
    return "(" + ", ".join(f"{n}={i}" for n, i in zip(names, index)) + ")"


def judge(
    record: Divergence | Mapping[str, Any] | None,
    policy: Policy | None = None,
    *,
    kernel_error: str | BaseException | None = None,
    dtype: torch.dtype | str | None = None,
) -> Judgement:
    """Apply ``policy`` (default: `Policy()`) to a record; see the module docstring for the rules.

    ``record`` may be a `Divergence`, its ``to_dict()``, a stored runner record, or None when
    ``kernel_error`` is given. ``dtype`` overrides the record's dtype (float64 is held to float64
    rounding); a stored runner record is judged in its measured precision (`harness.records.
    measured_precision`: its ``precision`` field), not its problem's dtype: a float64 case of a kernel
    that computes in float32 was measured against float32 rounding and is re-judged the same way.
    """
    policy = policy if policy is not None else Policy()
    if dtype is None and isinstance(record, Mapping) and record.get("precision"):
        dtype = record["precision"]
    if kernel_error is None and isinstance(record, Mapping):
        kernel_error = _stored_kernel_error(record)
    if kernel_error is not None:
        text = kernel_error if isinstance(kernel_error, str) else f"{type(kernel_error).__name__}: {kernel_error}"
        return Judgement(Verdict.KERNEL_ERROR, text, "kernel_error")
    rec = _record(record)
    if rec is None:
        raise InvalidArgument("record=None: judge needs a Divergence record unless kernel_error is given")
    if rec.problem:
        return Judgement(Verdict.KERNEL_ERROR, f"the output could not be compared: {rec.problem}", "uncomparable")
    name = dtypes.dtype_key(dtype) if dtype is not None else (rec.dtype or "float32")
    max_finite = dtypes.info(name).max_finite

    # 2. NaN/Inf where the oracle is finite and in domain
    if rec.n_kernel_nonfinite_in_domain > 0:
        why = (
            f"the kernel returns NaN/Inf at {rec.n_kernel_nonfinite_in_domain} element(s) where the oracle is "
            f"finite and within {name} range, first at {_at(rec, rec.worst_index)} (the exact state, decay products "
            f"and output are in range there: the NaN/Inf arise in the kernel's own arithmetic, an intermediate "
            f"that overflows, e.g. exp of a long cumulative log-decay sum, or a 0 * inf or 0/0)"
        )
        return Judgement(Verdict.DIVERGENT, why, "kernel_nonfinite")

    domain_why = _domain_why(rec, name, max_finite)
    # 3. nothing in domain
    if rec.n_in_domain == 0 or rec.n_compared == 0:
        return Judgement(Verdict.OUT_OF_DOMAIN, f"no element is in domain: {domain_why}", "no_domain")

    # 4. the numbers, in domain
    thr, factor = policy.cond_threshold, policy.baseline_factor
    cond_max = rec.cond_max
    over = cond_max > thr or math.isnan(cond_max)
    at = f"at {_at(rec, rec.worst_index)}"
    baseline_note = ""
    if over:
        use_baseline = name != "float64" and rec.has_baseline and not math.isnan(rec.baseline_ratio)
        if not use_baseline:
            reason = (
                "float64 kernels are held to float64 rounding"
                if name == "float64"
                else "no same-dtype baseline was measured"
            )
            why = (
                f"cond error {_g(cond_max)} > threshold {_g(thr)} {at} ({reason}); "
                f"{rec.n_mismatch} of {rec.n_in_domain} in-domain elements exceed it"
                + (f", from t={rec.onset_t}" if rec.onset_t is not None else "")
            )
            return Judgement(Verdict.DIVERGENT, why, "cond")
        ratio = rec.baseline_ratio
        if ratio > factor:
            why = (
                f"cond error {_g(cond_max)} > threshold {_g(thr)} {at}, and {_g(ratio)}x the {name} sequential "
                f"loop's (cond {_g(rec.baseline_cond_max)}; allowed {_g(factor)}x); "
                f"{rec.n_mismatch} of {rec.n_in_domain} in-domain elements exceed the threshold"
                + (f", from t={rec.onset_t}" if rec.onset_t is not None else "")
            )
            return Judgement(Verdict.DIVERGENT, why, "cond_and_baseline")
        baseline_note = (
            f"cond error {_g(cond_max)} exceeds {_g(thr)} but is {_g(ratio)}x the {name} sequential loop's "
            f"(cond {_g(rec.baseline_cond_max)}; allowed {_g(factor)}x): rounding the plain loop makes too"
        )

    # 5. part of the output was not compared
    fraction = rec.n_compared / rec.n_elements if rec.n_elements else 0.0
    if rec.n_out_of_domain > 0 and fraction < policy.min_compared_fraction:
        why = (
            f"{domain_why}; the {rec.n_compared} in-domain elements ({fraction:.1%}) agree "
            f"(cond max {_g(cond_max)} <= {_g(thr)}"
            + (" or explained by the baseline" if baseline_note else "")
            + ")"
        )
        return Judgement(Verdict.OUT_OF_DOMAIN, why, "partial_domain")

    # 6. equivalent
    if baseline_note:
        return Judgement(Verdict.EQUIVALENT, baseline_note, "baseline_explains")
    why = f"cond error {_g(cond_max)} <= threshold {_g(thr)} over {rec.n_compared} compared elements"
    if rec.n_out_of_domain:
        why += f" ({rec.n_out_of_domain} out of domain: {domain_why})"
    return Judgement(Verdict.EQUIVALENT, why, "within_bound")


def _domain_why(rec: Divergence, name: str, max_finite: float) -> str:
    lost = rec.n_precision_exhausted
    ranged = rec.n_out_of_domain - lost
    precision = (
        f"{lost} element(s) from t={rec.precision_onset_t} have a valid rounding bound that reaches their "
        f"magnitude in {name} (precision exhausted: no significant digit is guaranteed there, so they are "
        f"not compared)"
    )
    if lost and not ranged:
        return precision
    why = _range_why(rec, name, max_finite, ranged)
    return f"{why}; {precision}" if lost else why


def domain_kind(rec: Divergence | Mapping[str, Any]) -> str:
    """Why elements were left out: ``precision_exhausted`` when every element out of domain is in range
    but has no guaranteed digit; ``near_overflow`` when the range is first left by exact values that are
    in range but within their error bound of the dtype's max (a correct kernel may overflow there: a
    float16 gradient's bound is wide); else ``input_overflow`` (the inputs overflow the dtype in exact
    arithmetic). The runner's ``cause`` of an OUT_OF_DOMAIN verdict."""
    get = rec.get if isinstance(rec, Mapping) else lambda k, d=None: getattr(rec, k, d)
    lost = get("n_precision_exhausted", 0) or 0
    if lost and lost >= (get("n_out_of_domain", 0) or 0):
        return "precision_exhausted"
    return "near_overflow" if get("domain_cause") == "near_overflow" else "input_overflow"


def _range_why(rec: Divergence, name: str, max_finite: float, ranged: int) -> str:
    t = rec.domain_onset_t
    what = {
        "state": f"state exceeds {name} max ({max_finite:.3g}; peak {_g(rec.state_peak_max)})",
        "decay": f"a product of decays exceeds {name} max ({max_finite:.3g}; peak {_g(rec.decay_peak_max)})",
        "norm": (f"the group norm's sum of squares or the reciprocal of its mean square (in a gradient also the "
                 f"backward's 1/r^3 or its reciprocal: 1/r^3 below the smallest normal keeps few digits) exceeds {name} max "
                 f"({max_finite:.3g}; peak {_g(rec.norm_peak_max)}: outputs too small or too large to normalise "
                 f"in {name}, at those positions only)"),
        "output": f"the exact output exceeds {name} max ({max_finite:.3g})",
        "terms": (f"the sum of its terms' absolute values exceeds {name} max ({max_finite:.3g}; the value itself is in "
                  "range): a correct kernel's products or partial sums may overflow there"),
        "near_overflow": (f"the value is within its error bound of {name} max ({max_finite:.3g}): a correct kernel may "
                          "overflow there"),
        "oracle_nonfinite": "the oracle's output or error bound is not finite",
        "loop_nonfinite": (f"the kernel is NaN/Inf where the plain {name} sequential loop is NaN/Inf too (an "
                           f"intermediate of a correct algorithm leaves {name}'s range)"),
    }.get(rec.domain_cause)
    where = f" from t={t}" if t is not None else ""
    rows = f" in {rec.n_rows_out_of_domain} of {rec.n_rows} rows" if rec.n_rows else ""
    if what is None and rec.domain_cause == "precision_exhausted":  # the range is left later than the digits
        return (f"{ranged} element(s) leave {name}'s range or lie within their error bound of its max (state, "
                f"decays or output beyond {max_finite:.3g}; state peak {_g(rec.state_peak_max)})")
    if what is None:  # no overflow behind it: the kernel is non-finite only where no digit is guaranteed
        return (f"{ranged} element(s){where}{rows} have a rounding bound at least as large as "
                f"the value itself in {name} (no significant digit is guaranteed; the kernel is non-finite "
                "there, as a correct loop can be, e.g. a norm of a row rounded to zeros)")
    if rec.domain_cause in ("loop_nonfinite", "near_overflow", "terms"):  # the exact values are in range
        return f"{what}{where}{rows}"
    if rec.domain_cause == "norm":  # inputs and output in range: the norm's own exact intermediates are not
        return f"{what}{where}{rows}, in exact arithmetic too (the inputs themselves are in range)"
    return f"{what}{where}{rows}, the inputs overflow the dtype even in exact arithmetic"


_HEADLINES: dict[Verdict, str] = {
    Verdict.EQUIVALENT: "Kernel output is equivalent to the float64 oracle.",
    Verdict.DIVERGENT: "Kernel output diverges from the float64 oracle.",
    Verdict.OUT_OF_DOMAIN: ("The case is out of domain: its inputs (or a norm's exact intermediates) overflow the "
                            "dtype even in exact arithmetic, its exact values lie within their error bound of the "
                            "dtype's max, or no digit of the output is guaranteed in the dtype."),
    Verdict.KERNEL_ERROR: "The kernel failed; there is no output to compare with the float64 oracle.",
}


def chunk_position(t: Any, length: Any, chunk: Any) -> str:
    """`` (the first step of chunk i[, the last and partial one])`` where position ``t`` of a case of ``length``
    steps at ``chunk`` starts a chunk, else "": a chunk form's slip at its chunk boundaries or in its last, partial
    chunk starts there (a blind hunt's unscaled tail chunk started at t = 256 of 257, chunk 32)."""
    if not (isinstance(chunk, int) and chunk > 0 and isinstance(t, int) and isinstance(length, int)) or t % chunk:
        return ""
    last = t == (length - 1) // chunk * chunk and length % chunk
    return f" (the first step of chunk {t // chunk}" + (", the last and partial one" if last else "") + ")"


def format_failure(
    record: Divergence | Mapping[str, Any] | None,
    judgement: Judgement,
    replay: str | None = None,
    context: Sequence[str] = (),
    headline: str | None = None,
) -> str:
    """The message `assert_equivalent` raises with: what mismatched, where, by how much, why, how to replay.

    ``headline``: the first line in place of the verdict's (`harness.api` says a gradient's there).

    ``context``: lines about the case itself (``Call: ...``, ``Hint: ...``), put before the replay line.
    A record whose verdict its final state decides (``verdict_target``) is shown by the final state's
    measurement (`harness.runner.FINAL_STATE_SHOWN`): the output's said "Mismatched elements: 0 / 1" with
    ACTUAL equal to DESIRED, and the final state's values were nowhere."""
    final = _final_state_view(record)
    rec = _record(final if final is not None else record)
    lines = [headline or _HEADLINES[judgement.verdict]]
    if final is not None:
        lines = ["The kernel's final state diverges from the float64 oracle's (the numbers below are the final "
                 "state's, shape (sequence, head, k, v); its output is not what fails)."]
    if rec is not None and not rec.problem and rec.n_elements and judgement.verdict is not Verdict.KERNEL_ERROR:
        regime = record.get("regime") if isinstance(record, Mapping) else None  # which inputs (harness.problems)
        chunk = record.get("chunk_size") if isinstance(record, Mapping) else None
        # a final state's measurement runs along its sequences, not the case's steps: the case's own L is the
        # record's (a failing final state read "shape (1, 2, 16, 9), L=1" for a case of L = 1,669; blind hunt 26a)
        length = record.get("length") if final is not None else rec.length
        case = (f"dtype {rec.dtype}" + (" (tf32)" if rec.tf32 else "") + (f", regime {regime}" if regime else "")
                + f", shape {tuple(rec.shape)}" + (" (the final state's)" if final is not None else "")
                + f", L={length}" + (f", chunk_size {chunk} (L mod chunk_size = {length % chunk})"
                                     if isinstance(chunk, int) and isinstance(length, int) and chunk > 0 else ""))
        lines.append(f"Case: {case}")
        pct = 100.0 * rec.n_mismatch / rec.n_in_domain if rec.n_in_domain else 0.0
        lines.append(
            f"Mismatched elements: {rec.n_mismatch} / {rec.n_in_domain} ({pct:.3g}%) of the in-domain elements "
            f"(cond error > {_g(rec.cond_threshold)}, or NaN/Inf where the oracle is finite)"
        )
        if rec.worst_index is not None:
            lines.append(f"Worst element at {_at(rec, rec.worst_index)}:")
            lines.append(f"  ACTUAL   {rec.worst_actual!r}")
            lines.append(f"  DESIRED  {rec.worst_desired!r}")
            lines.append(
                f"  abs error {_g(rec.worst_abs)}, cond error {_g(rec.worst_cond)} "
                f"(bound {_g(rec.worst_bound)}; threshold {_g(rec.cond_threshold)})"
            )
        lines.append(
            f"Errors over {rec.n_compared} compared elements: max abs {_g(rec.max_abs)}, max rel {_g(rec.max_rel)}, "
            f"cond p99 {_g(rec.cond_p99)}, cond max {_g(rec.cond_max)}, ulp p99 {_g(rec.ulp_p99)}, "
            f"ulp max {_g(rec.ulp_max)}"
        )
        onset = f"first mismatch at t={rec.onset_t} of {rec.length}" if rec.onset_t is not None else "no mismatch"
        onset += chunk_position(rec.onset_t, rec.length, chunk)
        half = (
            f"; max cond error {_g(rec.max_error_first_half)} in the first half, "
            f"{_g(rec.max_error_second_half)} in the second"
        ) if rec.length >= 2 else ""  # one position has no second half ("nan in the second")
        growth = (
            f"; error {'grows' if rec.growth_exponent >= 0 else 'falls'} like (t+1)^{rec.growth_exponent:.2f}"
            if rec.growth_exponent is not None else ""
        )
        after = rec.length - rec.onset_t if rec.onset_t is not None and rec.length else 0
        if after > 1 and rec.n_mismatch_t and rec.n_mismatch_t * 2 <= after:  # None: an older record
            # a mismatch at isolated positions: a fitted growth of a spike read "grows like (t+1)^0.73"
            growth = (f"; mismatched at {rec.n_mismatch_t} of the {after} positions from there, the rest within the "
                      "bound: an error at isolated positions, not one that grows")
        elif after == 1 and rec.length > 1:  # a spike at the end read "grows like (t+1)^5.45" (hunt 26a)
            growth = "; at the last position only, no growth to fit"
        if final is not None:  # per sequence (packed rows): no position, no halves, no growth
            onset, half, growth = ((f"first mismatch in sequence {rec.onset_t} of {rec.length}"
                                    if rec.onset_t is not None else "no mismatch"), "", "")
        lines.append(f"Onset: {onset}{half}{growth}")
        if rec.has_baseline:
            lines.append(
                f"Baseline ({rec.dtype} sequential loop): cond max {_g(rec.baseline_cond_max)}, "
                f"max abs {_g(rec.baseline_max_abs)}, ratio {_g(rec.baseline_ratio)}"
            )
        dom = (
            f"{rec.n_out_of_domain} of {rec.n_elements} elements out of domain from t={rec.domain_onset_t} "
            f"({rec.domain_cause}; {rec.n_precision_exhausted} of them precision exhausted)"
            if rec.n_out_of_domain
            else "all elements in domain"
        )
        lines.append(f"Non-finite: {rec.nonfinite_class} ({rec.n_kernel_nonfinite} NaN/Inf in the output); {dom}")
    rule = f" (rule {judgement.rule})" if judgement.rule else ""
    lines.append(f"Classification: {judgement.verdict.value}{rule} -- {judgement.why}")
    cause = record.get("cause") if isinstance(record, Mapping) else None
    if cause:
        lines.append(f"Cause: {cause}")
    lines.extend(context)
    if replay:
        lines.append(f"Replay: {replay}")
    return "\n".join(lines)


def assert_equivalent(
    record: Divergence | Mapping[str, Any] | None,
    *,
    policy: Policy | None = None,
    replay: str | None = None,
    kernel_error: str | BaseException | None = None,
) -> Judgement:
    """Raise `DivergenceError` unless the record judges EQUIVALENT; return the judgement otherwise.

    OUT_OF_DOMAIN raises only when ``policy.fail_on_out_of_domain``. ``replay`` (a command line) is
    printed at the end of the message.
    """
    __tracebackhide__ = True
    policy = policy if policy is not None else Policy()
    judgement = judge(record, policy, kernel_error=kernel_error)
    if judgement.verdict is Verdict.EQUIVALENT:
        return judgement
    if judgement.verdict is Verdict.OUT_OF_DOMAIN and not policy.fail_on_out_of_domain:
        return judgement
    raise DivergenceError(format_failure(record, judgement, replay))
