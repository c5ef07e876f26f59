"""The verdict policy: every branch of `judge`, `Policy.parse`, the failure message, and the first seed.

Records are built with `measure` on hand-made traces (so the numbers are known) or, for the policy's
arithmetic alone, written directly as `Divergence` values.
"""

from __future__ import annotations

import dataclasses
import math
import re

import pytest
import torch

from harness.errors import DivergenceError, InvalidArgument
from harness.metrics import Divergence, measure
from harness.verdict import (
    BASELINE_FACTOR,
    COND_THRESHOLD,
    MIN_COMPARED_FRACTION,
    Judgement,
    Policy,
    Verdict,
    assert_equivalent,
    domain_kind,
    format_failure,
    judge,
)
from reference_impls.trace import Trace

U32 = 2.0**-24


def make_trace(out, *, magnitude=None, growth=None, state_peak=None, decay_peak=None) -> Trace:
    out = torch.as_tensor(out, dtype=torch.float64)

    def get(v, default):
        return default.clone() if v is None else torch.as_tensor(v, dtype=torch.float64).expand_as(out).clone()

    return Trace(out, get(magnitude, out.abs()), get(growth, out.abs()), get(state_peak, out.abs()),
                 get(decay_peak, torch.ones_like(out)))


def record(**fields) -> Divergence:
    """A record where everything is in domain and compared, cond 0.1, unless overridden."""
    base = dict(dtype="float32", shape=(1, 1, 8), axis_names=("batch", "channel", "t"), length_axis=2, length=8,
                depth=4, unit_roundoff=U32, n_elements=8, n_in_domain=8, n_compared=8, n_rows=1, cond_max=0.1,
                cond_p99=0.1, max_abs=1e-7, worst_index=(0, 0, 5), worst_t=5, worst_actual=1.0,
                worst_desired=1.0000001, worst_cond=0.1)
    base.update(fields)
    return Divergence(**base)


def planted(dtype: str = "float32", ulps: tuple[int, ...] = (1, 0, 3, 10), baseline=None) -> Divergence:
    """out = 1, 2, 4, 8 with errors of ``ulps`` float32 ulps: cond 0.4, 0, 1.2, 4.0 (see test_metrics)."""
    out = [[[1.0, 2.0, 4.0, 8.0]]]
    x = torch.tensor([[[v * (1 + k * 2.0**-23) for v, k in zip(out[0][0], ulps)]]], dtype=torch.float32)
    return measure(x, make_trace(out, growth=[[[2.0, 4.0, 8.0, 16.0]]]), dtype=dtype, baseline=baseline)


# --------------------------------------------------------------------------------------------------
# the policy's defaults and parser


def test_defaults_are_the_named_constants():
    p = Policy()
    assert p.cond_threshold == COND_THRESHOLD == 1.0
    assert p.baseline_factor == BASELINE_FACTOR == 2.0
    assert p.min_compared_fraction == MIN_COMPARED_FRACTION == 1.0
    assert p.fail_on_out_of_domain is False


def test_parse_good_specs():
    assert Policy.parse("cond=4,baseline=3") == Policy(cond_threshold=4.0, baseline_factor=3.0)
    assert Policy.parse(" cond = 0.5 , fail_ood = yes ") == Policy(cond_threshold=0.5, fail_on_out_of_domain=True)
    assert Policy.parse("min_compared=90%").min_compared_fraction == pytest.approx(0.9)
    assert Policy.parse("cond_threshold=2,baseline_factor=inf").baseline_factor == math.inf
    assert Policy.parse("") == Policy() == Policy.parse("default")
    base = Policy(cond_threshold=8.0)
    assert Policy.parse("baseline=5", base=base) == Policy(cond_threshold=8.0, baseline_factor=5.0)
    p = Policy(cond_threshold=3.5, baseline_factor=1.5, min_compared_fraction=0.75, fail_on_out_of_domain=True)
    assert Policy.parse(p.spec()) == p
    assert str(Policy()) == "cond=1,baseline=2,min_compared=1,fail_ood=false"


@pytest.mark.parametrize(
    "spec, words",
    [
        ("cnd=4", "'cnd'"),
        ("cond=abc", "'abc'"),
        ("cond", "'cond'"),
        ("cond=", "'cond='"),
        ("cond=-1", "cond_threshold=-1.0"),
        ("cond=inf", "cond_threshold=inf"),
        ("baseline=0", "baseline_factor=0.0"),
        ("min_compared=1.5", "min_compared_fraction=1.5"),
        ("fail_ood=maybe", "'maybe'"),
        ("cond=1,cond=2", "given twice"),
    ],
)
def test_parse_bad_specs_name_the_key_or_value(spec, words):
    with pytest.raises(InvalidArgument, match=None) as info:
        Policy.parse(spec)
    assert words in str(info.value)


# --------------------------------------------------------------------------------------------------
# each branch of judge


def test_kernel_error():
    j = judge(None, kernel_error="raised: RuntimeError: CUDA out of memory")
    assert j.verdict is Verdict.KERNEL_ERROR and j.why == "raised: RuntimeError: CUDA out of memory"
    assert j.rule == "kernel_error"
    j2 = judge({}, kernel_error=ValueError("bad chunk"))  # the runner passes an empty record
    assert (j2.verdict, j2.why) == (Verdict.KERNEL_ERROR, "ValueError: bad chunk")
    verdict, why = j2  # unpacks as (verdict, why)
    assert verdict is Verdict.KERNEL_ERROR


def test_uncomparable_output_is_a_kernel_error():
    d = measure([1.0], make_trace(torch.ones(1, 1, 4)), dtype="float32")
    j = judge(d)
    assert j.verdict is Verdict.KERNEL_ERROR and "not a tensor" in j.why and j.rule == "uncomparable"


def test_kernel_nan_in_domain_is_divergent_and_names_the_position():
    out = torch.ones(1, 2, 8, dtype=torch.float64)
    x = out.to(torch.float32).clone()
    x[0, 1, 6] = math.nan
    j = judge(measure(x, make_trace(out), dtype="float32"))
    assert j.verdict is Verdict.DIVERGENT and j.rule == "kernel_nonfinite"
    assert "t=6" in j.why and "channel=1" in j.why
    # where they come from: a blind hunt's exp(S) * cumsum(exp(-S) x) form overflowed in float64 itself, and its
    # float64 message gave no hint that the NaN were its own intermediates' (session 25)
    assert "the NaN/Inf arise in the kernel's own arithmetic, an intermediate that overflows" in j.why


def test_nothing_in_domain_is_out_of_domain():
    out = torch.ones(1, 1, 4, dtype=torch.float64)
    x = torch.full((1, 1, 4), math.nan)
    j = judge(measure(x, make_trace(out, state_peak=1e40), dtype="float32"))
    assert j.verdict is Verdict.OUT_OF_DOMAIN and j.rule == "no_domain"
    assert "state exceeds float32 max" in j.why and "from t=0" in j.why


def test_domain_ending_before_L_is_out_of_domain_unless_the_policy_accepts_the_fraction():
    out = torch.ones(1, 2, 8, dtype=torch.float64)
    state = torch.ones_like(out)
    state[0, 0, 6:] = 1e39
    x = out.to(torch.float32).clone()
    x[0, 0, 6:] = math.inf
    d = measure(x, make_trace(out, state_peak=state), dtype="float32")
    j = judge(d)
    assert j.verdict is Verdict.OUT_OF_DOMAIN and j.rule == "partial_domain"
    assert "from t=6" in j.why and "exact arithmetic" in j.why and "14 in-domain elements" in j.why
    assert judge(d, Policy(min_compared_fraction=0.8)).verdict is Verdict.EQUIVALENT  # 14/16 = 0.875
    assert judge(d, Policy(min_compared_fraction=0.9)).verdict is Verdict.OUT_OF_DOMAIN


def test_divergence_in_domain_outranks_out_of_domain():
    out = torch.ones(1, 2, 8, dtype=torch.float64)
    state = torch.ones_like(out)
    state[0, 0, 6:] = 1e39
    x = out.to(torch.float32).clone()
    x[0, 1, 2] = 1.5  # a wrong value where the state is fine
    j = judge(measure(x, make_trace(out, state_peak=state), dtype="float32"))
    assert j.verdict is Verdict.DIVERGENT and j.rule == "cond"


def test_cond_rule_without_a_baseline():
    d = planted()
    j = judge(d)
    assert j.verdict is Verdict.DIVERGENT and j.rule == "cond"
    assert "cond error 4 > threshold 1" in j.why and "no same-dtype baseline" in j.why and "from t=2" in j.why
    assert judge(d, Policy(cond_threshold=5.0)).verdict is Verdict.EQUIVALENT


def test_baseline_explains_rounding_the_plain_loop_also_makes():
    # the baseline errs 3 ulps at t = 3: cond 1.2; the kernel's 4.0 is 3.33x that
    base = torch.tensor([[[1.0, 2.0, 4.0, 8.0 * (1 + 3 * 2.0**-23)]]], dtype=torch.float32)
    d = planted(baseline=base)
    assert d.baseline_cond_max == pytest.approx(1.2) and d.baseline_ratio == pytest.approx(4.0 / 1.2)
    j = judge(d)
    assert j.verdict is Verdict.DIVERGENT and j.rule == "cond_and_baseline"
    assert _ratios(j.why) == pytest.approx([d.baseline_ratio, 2.0], rel=5e-3), j.why  # the ratio and the one allowed
    j2 = judge(d, Policy(baseline_factor=4.0))
    assert j2.verdict is Verdict.EQUIVALENT and j2.rule == "baseline_explains"
    assert _ratios(j2.why) == pytest.approx([d.baseline_ratio, 4.0], rel=5e-3), j2.why


def _ratios(why: str) -> list[float]:
    """The ratios (``3.33x``) a why quotes, in order, as numbers."""
    return [float(x) for x in re.findall(r"(\d+(?:\.\d+)?)x\b", why)]


def test_an_exact_baseline_leaves_the_decision_to_the_cond_rule():
    base = torch.tensor([[[1.0, 2.0, 4.0, 8.0]]], dtype=torch.float32)
    assert judge(planted(baseline=base)).verdict is Verdict.DIVERGENT
    assert judge(planted(ulps=(1, 0, 1, 2), baseline=base)).verdict is Verdict.EQUIVALENT  # cond max 0.8


def test_within_bound_is_equivalent():
    j = judge(planted(ulps=(1, 0, 2, 2)))
    assert j.verdict is Verdict.EQUIVALENT and j.rule == "within_bound"
    assert "cond error 0.8 <= threshold 1" in j.why


def test_float64_is_held_to_float64_rounding():
    """A relative error of 1e-10 is divergent in float64 but far inside the bound in float32."""
    out = torch.ones(1, 1, 8, dtype=torch.float64)  # depth 4: bound = u (1 + 4) + tiny
    x = out * (1 + 1e-10)
    d64 = measure(x, make_trace(out), dtype="float64", baseline=x * (1 + 1e-9))
    j64 = judge(d64)
    assert j64.verdict is Verdict.DIVERGENT and j64.rule == "cond"
    assert "float64 kernels are held to float64 rounding" in j64.why  # the worse baseline does not excuse it
    # bound: u (1 + 4) / (1 - 5 u) for the kernel, plus u * growth for the float64 oracle's own rounding
    assert d64.cond_max == pytest.approx(1e-10 / (6 * 2.0**-53), rel=1e-5)
    d32 = measure(x, make_trace(out), dtype="float32")
    assert judge(d32).verdict is Verdict.EQUIVALENT
    assert d32.cond_max == pytest.approx(1e-10 / (5 * U32), rel=1e-5)
    # the dtype argument overrides the record's for the choice of rule
    baseline_excuses = record(cond_max=4.0, has_baseline=True, baseline_cond_max=3.0, baseline_ratio=4 / 3)
    assert judge(baseline_excuses).verdict is Verdict.EQUIVALENT
    assert judge(baseline_excuses, dtype="float64").verdict is Verdict.DIVERGENT


def test_judge_accepts_the_flat_dict_of_a_record_and_extra_keys():
    d = planted()
    flat = {**d.to_dict(), "kernel": "intree.blelloch", "verdict": "old", "replay": "x"}
    assert judge(flat) == judge(d)
    with pytest.raises(InvalidArgument):
        judge(None)
    with pytest.raises(InvalidArgument):
        judge(42)  # type: ignore[arg-type]


def test_written_records_cover_the_policy_arithmetic():
    assert judge(record()).verdict is Verdict.EQUIVALENT
    assert judge(record(cond_max=1.5)).verdict is Verdict.DIVERGENT
    ratio_ok = record(cond_max=1.5, has_baseline=True, baseline_cond_max=1.0, baseline_ratio=1.5)
    assert judge(ratio_ok).verdict is Verdict.EQUIVALENT
    ratio_bad = dataclasses.replace(ratio_ok, baseline_ratio=2.5)
    assert judge(ratio_bad).verdict is Verdict.DIVERGENT
    assert judge(record(cond_max=1.0)).verdict is Verdict.EQUIVALENT  # the threshold itself passes


# --------------------------------------------------------------------------------------------------
# assert_equivalent and the message


def test_assert_equivalent_message_a_person_can_act_on():
    d = planted()
    with pytest.raises(DivergenceError) as info:
        assert_equivalent(d, replay="harness replay --kernel intree.blelloch --problem '{}'")
    msg = str(info.value)
    assert isinstance(info.value, AssertionError)
    assert "Mismatched elements: 2 / 4 (50%)" in msg
    assert "Worst element at (batch=0, channel=0, t=3)" in msg
    # the worst element's values at full precision: they read back as the planted float32 value and the oracle's
    worst = dict(re.findall(r"^  (ACTUAL|DESIRED) +(\S+)$", msg, flags=re.MULTILINE))
    assert float(worst["ACTUAL"]) == float(torch.tensor(8 * (1 + 10 * 2.0**-23), dtype=torch.float32)), msg
    assert float(worst["DESIRED"]) == 8.0, msg
    assert "cond error 4 " in msg and "threshold 1" in msg
    assert "Onset: first mismatch at t=2 of 4" in msg
    assert "Classification: divergent" in msg and "cond error 4 > threshold 1" in msg
    assert msg.rstrip().endswith("Replay: harness replay --kernel intree.blelloch --problem '{}'")
    assert msg == format_failure(d, judge(d), "harness replay --kernel intree.blelloch --problem '{}'")


def _ones(ulps: dict[int, int], length: int = 16) -> Divergence:
    """out = 1 at every t of ``length``, with ``ulps[t]`` float32 ulps of error at t (none elsewhere)."""
    x = torch.tensor([[[1.0 + ulps.get(t, 0) * 2.0**-23 for t in range(length)]]], dtype=torch.float32)
    return measure(x, make_trace([[[1.0] * length]], growth=[[[2.0] * length]]), dtype="float32")


def test_an_error_at_isolated_positions_is_not_given_a_growth_exponent():
    """A bug at one position, later positions right again, read "error grows like (t+1)^0.73": a slope fitted
    to a spike (a blind hunt, session 24). A mismatch that persists keeps its growth."""
    spike = _ones({8: 10})
    assert spike.onset_t == 8 and spike.n_mismatch_t == 1
    msg = format_failure(spike, judge(spike), "r")
    assert "Onset: first mismatch at t=8 of 16" in msg
    assert "mismatched at 1 of the 8 positions from there, the rest within the bound" in msg
    assert "grows like" not in msg and "falls like" not in msg
    lasting = _ones({t: 10 + t for t in range(8, 16)})
    assert lasting.n_mismatch_t == 8
    msg = format_failure(lasting, judge(lasting), "r")
    assert "like (t+1)^" in msg and "isolated positions" not in msg
    one = _ones({0: 10}, length=1)
    msg = format_failure(one, judge(one), "r")
    assert "Onset: first mismatch at t=0 of 1" in msg and "second" not in msg  # one step has no second half
    older = {k: v for k, v in lasting.to_dict().items() if k != "n_mismatch_t"}  # a record written before the field
    assert "like (t+1)^" in format_failure(older, judge(older), "r")
    last = _ones({15: 10})  # a spike at the last position read "grows like (t+1)^5.45" (blind hunt 26a)
    msg = format_failure(last, judge(last), "r")
    assert "Onset: first mismatch at t=15 of 16" in msg and "like (t+1)^" not in msg, msg
    assert "at the last position only, no growth to fit" in msg, msg


def test_a_record_s_message_names_its_cause():
    record = {**planted().to_dict(), "cause": "precision_loss"}
    msg = format_failure(record, judge(record), "harness replay x")
    assert "\nCause: precision_loss\nReplay: harness replay x" in msg
    assert "Cause:" not in format_failure(planted(), judge(planted()))  # a bare Divergence has none


def test_assert_equivalent_passes_and_returns_the_judgement():
    j = assert_equivalent(planted(ulps=(0, 0, 0, 1)))
    assert isinstance(j, Judgement) and j.verdict is Verdict.EQUIVALENT
    assert "__tracebackhide__" in assert_equivalent.__code__.co_varnames


def test_assert_equivalent_out_of_domain_raises_only_when_asked():
    out = torch.ones(1, 1, 4, dtype=torch.float64)
    d = measure(torch.full((1, 1, 4), math.nan), make_trace(out, state_peak=1e40), dtype="float32")
    assert assert_equivalent(d).verdict is Verdict.OUT_OF_DOMAIN
    with pytest.raises(DivergenceError, match="out_of_domain"):
        assert_equivalent(d, policy=Policy.parse("fail_ood=true"))


def test_assert_equivalent_kernel_error_raises_with_the_error():
    with pytest.raises(DivergenceError, match="wrong_dtype: float16 returned for bfloat16"):
        assert_equivalent(None, kernel_error="wrong_dtype: float16 returned for bfloat16")


def test_message_for_a_nonfinite_kernel_shows_nan_side_by_side():
    out = torch.ones(1, 2, 8, dtype=torch.float64)
    x = out.to(torch.float32).clone()
    x[0, 1, 6] = math.nan
    with pytest.raises(DivergenceError) as info:
        assert_equivalent(measure(x, make_trace(out), dtype="float32"))
    msg = str(info.value)
    assert "ACTUAL   nan" in msg and "DESIRED  1.0" in msg and "(batch=0, channel=1, t=6)" in msg
    assert "Mismatched elements: 1 / 16" in msg and "kernel_nonfinite" in msg


# --------------------------------------------------------------------------------------------------
# the first seed: mamba.py issue 26 ("fine at L=64; e32 in one form and inf in the other at L=512")


def _seed_case(length: int):
    ss = pytest.importorskip("reference_impls.selective_scan")
    gen = torch.Generator().manual_seed(26)
    batch, dim, n = 2, 64, 16
    u = torch.randn(batch, dim, length, generator=gen)
    delta = torch.randn(batch, dim, length, generator=gen)
    A = torch.randn(dim, n, generator=gen)
    B = torch.randn(batch, n, length, generator=gen)
    C = torch.randn(batch, n, length, generator=gen)
    D = torch.randn(dim, generator=gen)
    inputs = (u, delta, A, B, C, D)  # float32: the oracle sees the same (exactly upcast) values
    trace = ss.selective_scan_trace(*(t.double() for t in inputs))
    loop32 = ss.selective_scan(*inputs, compute_dtype=torch.float32)
    return trace, loop32


def test_seed_L64_float32_sequential_loop_is_equivalent():
    trace, loop32 = _seed_case(64)
    j = judge(measure(loop32, trace, dtype="float32", baseline=loop32))
    assert j.verdict is Verdict.EQUIVALENT


def test_seed_L512_float32_sequential_loop_is_out_of_domain_not_divergent():
    trace, loop32 = _seed_case(512)
    # the seed's premise: the loop returns NaN/Inf where the output itself is still representable,
    # because the state behind it has overflowed float32 -- judging the output alone would blame it
    representable = trace.out.abs() <= torch.finfo(torch.float32).max
    assert bool((~torch.isfinite(loop32) & representable).any())
    d = measure(loop32, trace, dtype="float32", baseline=loop32)
    j = judge(d)
    assert j.verdict is Verdict.OUT_OF_DOMAIN, j.why
    assert d.domain_cause == "state" and d.n_kernel_nonfinite > 0 and d.n_kernel_nonfinite_in_domain == 0
    assert d.cond_max <= 1.0  # where the state is representable, the loop is within the bound
    assert "state exceeds float32 max" in j.why
    # without the baseline the verdict is the same (the rule does not lean on the baseline)
    assert judge(measure(loop32, trace, dtype="float32")).verdict is Verdict.OUT_OF_DOMAIN

    # a NaN planted where the oracle is finite and in domain is a kernel bug
    rows_fine = (trace.state_peak <= 1e30).all(dim=-1)  # (batch, dim) rows whose state stays small
    b, c = (int(i) for i in torch.nonzero(rows_fine)[0])
    bad = loop32.clone()
    bad[b, c, 300] = math.nan
    d_bad = measure(bad, trace, dtype="float32", baseline=loop32)
    j_bad = judge(d_bad)
    assert j_bad.verdict is Verdict.DIVERGENT and j_bad.rule == "kernel_nonfinite"
    assert d_bad.first_nonfinite_t == 300 and d_bad.worst_index == (b, c, 300)
    assert "t=300" in j_bad.why


def test_judging_a_stored_runner_record_again():
    # a failed kernel call: the runner stores outcome and error, no measurements
    failed = {"kernel": "broken.raises", "outcome": "raises", "error": "RuntimeError: boom", "verdict": "kernel_error"}
    j = judge(failed)
    assert j.verdict is Verdict.KERNEL_ERROR and j.why == "raises: RuntimeError: boom"
    with pytest.raises(DivergenceError) as info:
        assert_equivalent(failed)
    assert "raises: RuntimeError: boom" in str(info.value) and "Mismatched" not in str(info.value)
    # a measured case: outcome ok, the measurement decides
    measured = {**planted().to_dict(), "kernel": "k", "outcome": "ok", "error": None}
    assert judge(measured).rule == "cond"
    # nothing to judge
    with pytest.raises(InvalidArgument, match="n_elements"):
        judge({"kernel": "k"})
    with pytest.raises(InvalidArgument, match="n_elements"):
        judge({})


# --------------------------------------------------------------------------------------------------
# the precision domain (issue 19)


def test_a_case_with_no_guaranteed_digit_is_out_of_domain_with_its_own_cause():
    # bfloat16, growth 300 |out|: r = 2**-8 (300 + 3) > 1/2 everywhere, however wrong the kernel's finite values are
    out = [[[1.0, 2.0, 4.0]]]
    tr = make_trace(out, growth=[[[300.0, 600.0, 1200.0]]])
    x = torch.tensor([[[1.5, 100.0, 9.0]]], dtype=torch.bfloat16)
    d = measure(x, tr, dtype="bfloat16")
    assert d.n_precision_exhausted == d.n_out_of_domain == 3 and d.n_in_domain == 0
    assert d.domain_cause == "precision_exhausted" and d.precision_onset_t == 0
    j = judge(d)
    assert j.verdict is Verdict.OUT_OF_DOMAIN and j.rule == "no_domain"
    assert "precision exhausted" in j.why and domain_kind(d) == "precision_exhausted"


def test_a_nan_where_no_digit_is_guaranteed_is_still_a_finding_unless_the_loop_makes_it_too():
    """Issue 19: where the bound reaches the value a finite result of any size is rounding, but NaN/Inf is not (a
    correct algorithm whose intermediates stay in range makes none): session 19's blind hunt had a GLA kernel in
    factorised form, exp(G) q against exp(-G) k, NaN at 663 of 960 bfloat16 outputs, all without a guaranteed
    digit, called out_of_domain. It is divergent now; where the same-dtype loop is NaN there too, or after a norm
    (0/0 of an input rounded to zeros), it stays excused."""
    out = [[[1.0, 2.0, 4.0]]]
    tr = make_trace(out, growth=[[[300.0, 600.0, 1200.0]]])
    x = torch.tensor([[[1.5, math.nan, 9.0]]], dtype=torch.bfloat16)
    d = measure(x, tr, dtype="bfloat16")
    assert d.n_precision_exhausted == 3 and d.n_kernel_nonfinite == d.n_kernel_nonfinite_in_domain == 1
    j = judge(d)
    assert j.verdict is Verdict.DIVERGENT and j.rule == "kernel_nonfinite", j.why
    loop = torch.tensor([[[1.0, math.nan, 4.0]]], dtype=torch.bfloat16)
    d = measure(x, tr, dtype="bfloat16", baseline=loop)
    assert d.n_kernel_nonfinite_in_domain == 0 and judge(d).verdict is Verdict.OUT_OF_DOMAIN
    # the same output where digits are left (growth |out|): divergent, the NaN first
    d2 = measure(x, make_trace(out), dtype="bfloat16")
    assert judge(d2).verdict is Verdict.DIVERGENT and d2.n_kernel_nonfinite_in_domain == 1


def test_part_of_a_case_without_digits_leaves_the_rest_judged():
    out = [[[1.0, 2.0, 4.0, 8.0]]]
    tr = make_trace(out, growth=[[[1.0, 2.0, 1200.0, 2400.0]]])  # t = 2, 3 have no guaranteed digit
    fine = torch.tensor([[[1.0, 2.0, 5.0, 1.0]]], dtype=torch.bfloat16)
    j = judge(measure(fine, tr, dtype="bfloat16"))
    assert j.verdict is Verdict.OUT_OF_DOMAIN and j.rule == "partial_domain" and "2 element(s) from t=2" in j.why
    wrong = torch.tensor([[[1.0, 3.0, 4.0, 8.0]]], dtype=torch.bfloat16)  # t = 1 is wrong and has digits
    d = measure(wrong, tr, dtype="bfloat16")
    assert judge(d).verdict is Verdict.DIVERGENT and d.worst_t == 1
    # the cause of an out_of_domain verdict: range overflow outranks lost digits
    assert domain_kind({"n_out_of_domain": 5, "n_precision_exhausted": 2}) == "input_overflow"
    assert domain_kind({"n_out_of_domain": 2, "n_precision_exhausted": 2}) == "precision_exhausted"
    # exact values in range but within their bound of the max: not "the inputs overflow"
    assert domain_kind({"n_out_of_domain": 5, "domain_cause": "near_overflow"}) == "near_overflow"
    assert domain_kind({"n_out_of_domain": 5, "domain_cause": "state"}) == "input_overflow"


@pytest.mark.parametrize("exponent, says", [(0.5, "error grows like (t+1)^0.50"), (-0.3, "error falls like (t+1)^-0.30")])
def test_the_onset_line_says_whether_the_error_grows_or_falls(exponent, says):
    record = {**planted().to_dict(), "growth_exponent": exponent}
    assert says in format_failure(record, judge(record))
