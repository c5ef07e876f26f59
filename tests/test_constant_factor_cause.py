"""A kernel off by one constant factor is told so (`harness.runner._constant_factor`).

A retention or GLA kernel on another scale convention (the query's ``dk**-0.5`` left out, applied twice,
taken from the value's head dimension) or a scan with its sign flipped is wrong at every element by the
same factor. Before, such a kernel was a plain ``kernel_bug``; the divergent output is now judged once
more against the oracle's times the least-squares factor, and where it is equivalent there the cause is
``constant_factor`` with the factor and what it usually means. A real mistake stays a ``kernel_bug``.
"""

from __future__ import annotations

import re

import pytest
import torch

from harness.api import user_kernel_spec
from harness.kernels import registry
from harness.problems import Problem
from harness.runner import RunOptions, run_case
from tests.planted.bugs import retention_scale_by_dv

_PARALLEL = registry.get("intree.retention_parallel").callable()
_SCAN = registry.get("intree.sequential_scan").callable()
_GLA = registry.get("intree.sequential_simple_gla").callable()


def _factor_in(text: str, pattern: str) -> float:
    """The number that ``pattern``'s group matches in ``text``, the factor a why or a message quotes: compared
    with the record's factor, not as text, so its digits are checked at the precision they are printed."""
    found = re.search(pattern, text)
    assert found is not None, f"{pattern!r} not in {text!r}"
    return float(found.group(1))


def retention_unscaled(q, k, v):
    """The query's dk**-0.5 left out."""
    return _PARALLEL(q, k, v, scale=1.0)


def scan_negated(a, b):
    return -_SCAN(a, b)


def gla_scaled_twice(q, k, v, g, scale=None, initial_state=None, output_final_state=False):
    """The scale applied to the query and again to the output."""
    dk = q.shape[-1]
    o, state = _GLA(q, k, v, g, scale=scale, initial_state=initial_state, output_final_state=output_final_state)
    return o * (dk ** -0.5 if scale is None else scale), state


def scan_scaled_late(a, b):
    """Wrong by a factor in the second half only: no constant factor."""
    h = _SCAN(a, b).clone()
    h[..., h.shape[-1] // 2:] *= 2
    return h


def _retention(dtype: str, dk: int = 16, dv: int = 16) -> Problem:
    return Problem(family="retention", length=24, dtype=dtype, batch=1, heads=2, dk=dk, dv=dv, seed=3)


@pytest.mark.parametrize("dtype", ["float64", "float32", "bfloat16"])
def test_a_scale_left_out_is_a_constant_factor(dtype):
    record = run_case(user_kernel_spec(retention_unscaled, family="retention"), _retention(dtype))
    assert record["verdict"] == "divergent" and record["cause"] == "constant_factor", record["why"]
    assert record["constant_factor"] == 4.0
    assert record["constant_factor_cond_max"] <= 1
    assert "the output is 4 times the oracle's" in record["why"]
    assert "4 = dk**0.5: the scale dk**-0.5 left out" in record["why"], record["why"]


def test_the_planted_scale_from_the_value_dimension_is_named():
    record = run_case(user_kernel_spec(retention_scale_by_dv, family="retention"), _retention("float32", 16, 4))
    assert record["cause"] == "constant_factor" and record["constant_factor"] == 2.0
    assert "(dk / dv)**0.5" in record["why"], record["why"]


def test_a_scale_applied_twice_and_a_flipped_sign():
    gla = Problem(family="simple_gla", length=30, dtype="float32", batch=1, heads=2, dk=16, dv=8, seed=1)
    record = run_case(user_kernel_spec(gla_scaled_twice, family="simple_gla"), gla)
    assert record["cause"] == "constant_factor" and "applied twice" in record["why"], record["why"]
    scan = Problem(family="linear_scan", length=40, dtype="float32", batch=2, dim=3, seed=2)
    record = run_case(user_kernel_spec(scan_negated, family="linear_scan"), scan)
    assert record["cause"] == "constant_factor" and record["constant_factor"] == -1.0
    assert "the sign is flipped" in record["why"]


def test_a_mistake_that_is_no_constant_factor_stays_a_kernel_bug():
    scan = Problem(family="linear_scan", length=40, dtype="float64", batch=2, dim=3, seed=2)
    record = run_case(user_kernel_spec(scan_scaled_late, family="linear_scan"), scan)
    assert record["verdict"] == "divergent" and record["cause"] == "kernel_bug", record["why"]
    assert record["constant_factor_cond_max"] > 1  # the best factor was tried and did not explain it


def test_the_factor_check_can_be_switched_off_and_skips_equivalent_cases():
    spec = user_kernel_spec(retention_unscaled, family="retention")
    off = run_case(spec, _retention("float32"), RunOptions(factor_counterfactual=False))
    assert off["cause"] == "kernel_bug" and "constant_factor" not in off and "t_constant_factor" not in off
    right = run_case(registry.get("intree.retention_parallel"), _retention("float32"))
    assert right["verdict"] == "equivalent" and "constant_factor" not in right


def test_a_final_state_that_is_wrong_too_keeps_the_kernel_bug():
    """Only the output is rescaled: a kernel whose state is off as well is not explained by a factor."""
    gla = Problem(family="simple_gla", length=30, dtype="float32", batch=1, heads=2, dk=16, dv=8, seed=1,
                  final_state=True)
    spec = user_kernel_spec(gla_state_doubled, family="simple_gla")
    record = run_case(spec, gla)
    assert record["verdict"] == "divergent" and record["cause"] == "kernel_bug", record["why"]


def gla_state_doubled(q, k, v, g, scale=None, initial_state=None, output_final_state=False):
    o, state = _GLA(q, k, v, g, scale=scale, initial_state=initial_state, output_final_state=output_final_state)
    return 2 * o, (None if state is None else 2 * state)


def test_the_cause_has_a_phrase_in_the_findings():
    from harness.findings import CAUSE_PHRASES

    assert "constant_factor" in CAUSE_PHRASES


def test_a_one_head_state_decayed_once_too_often_is_named_by_its_gamma():
    """The planted ``gamma (S + k^T v)``: every state, so every output, is gamma times the definition's."""
    from tests.planted.bugs import retention_recurrent_decay_after_add

    problem = Problem(family="retention", length=24, dtype="float32", batch=1, heads=1, dk=8, dv=8, seed=4)
    record = run_case(user_kernel_spec(retention_recurrent_decay_after_add, family="retention"), problem)
    assert record["cause"] == "constant_factor" and record["constant_factor"] == 1 - 2 ** -5, record["why"]
    # the why names the factor as gamma, and the state decayed once more
    assert _factor_in(record["why"], r"(\S+) = gamma: the state decayed once more") == record["constant_factor"], \
        record["why"]
    two_heads = problem.replace(heads=2)  # a factor per head: no one constant
    assert run_case(user_kernel_spec(retention_recurrent_decay_after_add, family="retention"),
                    two_heads)["cause"] == "kernel_bug"


def gla_unscaled(q, k, v, g, initial_state=None, output_final_state=False):
    """GLA with the K**-0.5 left out (the in-tree loop at scale 1)."""
    return _GLA_KEYED(q, k, v, g, scale=1.0, initial_state=initial_state, output_final_state=output_final_state)


_GLA_KEYED = registry.get("intree.sequential_gla").callable()


def test_a_factor_that_explains_every_judgeable_element_names_a_partly_out_of_domain_case():
    """bfloat16, long memory: the late elements have no guaranteed digit (out of the precision domain); the
    earlier ones agree at the factor, which names the case (found by `harness check` on such a kernel: 5
    bfloat16 cases stayed kernel_bug while every float32 one was named)."""
    problem = Problem(family="gla", length=220, dtype="bfloat16", regime="long_memory", seed=123, batch=2,
                      heads=3, dk=33, dv=6, final_state=True)
    record = run_case(user_kernel_spec(gla_unscaled, family="gla"), problem)
    assert record["verdict"] == "divergent" and record["n_out_of_domain"] > 0
    assert record["cause"] == "constant_factor" and record["constant_factor"] == 33 ** 0.5, record["why"]


def test_a_half_precision_case_of_a_few_elements_is_not_named_by_a_factor():
    """In bfloat16 a wrong value lies within the bound of -1 or gamma times the oracle's by chance now and
    then: a factor names a half-precision case of at least FACTOR_MIN_ELEMENTS_KNOWN elements only (float32
    and float64: any size)."""
    from harness.runner import FACTOR_MIN_ELEMENTS_KNOWN

    spec = user_kernel_spec(scan_negated, family="linear_scan")
    tiny = Problem(family="linear_scan", length=1, dtype="bfloat16", batch=1, dim=1, seed=2)
    assert run_case(spec, tiny)["cause"] == "kernel_bug"
    assert run_case(spec, tiny.replace(dtype="float32"))["cause"] == "constant_factor"
    enough = tiny.replace(length=FACTOR_MIN_ELEMENTS_KNOWN)
    assert run_case(spec, enough)["cause"] == "constant_factor"


def scan_off_by_a_hundredth(a, b):
    return _SCAN(a, b) * 1.01


def test_a_check_whose_shrunk_case_is_too_small_for_a_factor_names_the_factor_of_its_larger_cases():
    """Shrinking ends at one element, where no factor is named (`FACTOR_MIN_ELEMENTS`): the message says what
    the search's larger failing cases were named, so the author reads "1.01 times the oracle's". (At 1.001
    the least-squares factor of a long case lies within `FACTOR_MIN_OFFSET` of 1 by its rounding, and the
    search's largest cases name nothing.)"""
    from harness.api import check

    got = check(scan_off_by_a_hundredth, family="linear_scan", dtypes="float64", max_examples=5, grad=False,
                save_counterexample=False, isolation="in-process")
    assert got.failure is not None and got.failure["cause"] == "kernel_bug" and got.failure["n_elements"] < 16
    named = [r for r in got.records if r.get("cause") == "constant_factor"]
    assert named and all(r["constant_factor"] == pytest.approx(1.01, rel=1e-6) for r in named), named
    line = next(ln for ln in got.message.splitlines() if ln.startswith("Named on larger cases: constant_factor ("))
    assert _factor_in(line, r"the output is (\S+) times the oracle's") == pytest.approx(1.01, rel=1e-4), line


def test_the_line_is_only_for_a_bare_kernel_bug_of_the_same_kernel_and_mode():
    from harness.api import named_on_larger_cases

    shrunk = {"kernel": "k", "verdict": "divergent", "cause": "kernel_bug", "mode": None}
    factor = dict(shrunk, cause="constant_factor", n_elements=100, dtype="float32", length=9, regime="trained",
                  why="cond 3 > 1; constant factor: the output is -1 times the oracle's")
    assert named_on_larger_cases(shrunk, [shrunk]) is None  # nothing more specific was seen
    assert named_on_larger_cases(dict(shrunk, cause="eps_effect"), [factor]) is None  # the shrunk case is named
    assert named_on_larger_cases(shrunk, [dict(factor, kernel="other")]) is None
    assert named_on_larger_cases(shrunk, [dict(factor, mode="grad")]) is None
    # a factor seen on a small case while the search's largest failing case names nothing: no line
    largest_unnamed = dict(shrunk, n_elements=1056)
    assert named_on_larger_cases(shrunk, [shrunk, dict(factor, n_elements=24), largest_unnamed]) is None
    line = named_on_larger_cases(shrunk, [shrunk, factor])
    assert line == ("Named on larger cases: constant_factor (1 of the search's 2 divergent cases; e.g. float32 L=9 "
                    "trained: constant factor: the output is -1 times the oracle's)")


def _normed_mean_over_dk(q, k, v, eps):
    """A normed retention whose RMS norm divides the sum of squares by dk, not dv (one ``head_dim`` for both)."""
    from reference_impls.retention import default_gammas, retention

    o = retention(q, k, v, default_gammas(q.shape[2]), compute_dtype=q.dtype)
    return o / torch.sqrt((o * o).sum(-1, keepdim=True) / q.shape[-1] + eps)


def test_a_normed_output_off_by_a_factor_names_the_norm_not_the_scale():
    """After the RMS norm the attention scale cancels (eps = 0): session 19's blind hunt had a norm over dk named
    "the scale dv**-0.5 where the family's is dk**-0.5", which cannot change a normed output. The clause names the
    norm's mean over dk first."""
    from harness.kernels.contract import Capabilities, KernelSpec
    from harness.problems import Problem
    from harness.runner import run_case

    spec = KernelSpec(name="planted.normed_mean_over_dk", family="retention_normed", load=lambda: _normed_mean_over_dk,
                      capabilities=Capabilities(dtypes=("float64",)), source="test")
    record = run_case(spec, Problem("retention_normed", 16, dtype="float64", batch=1, heads=2, dk=4, dv=16, eps=0.0,
                                    seed=3))
    assert record["verdict"] == "divergent" and record["cause"] == "constant_factor", record["why"]
    assert "the norm's mean square taken over dk" in record["why"], record["why"]
    assert "the scale dv**-0.5 where" not in record["why"]


def _scale_folded_into_k(q, k, v, g, scale=None, initial_state=None, output_final_state=False):
    """A simple GLA whose ``scale`` is folded into k (``k * scale``, then the form without scale): the output is
    right, the state and so the final state carry the scale."""
    from harness.kernels import gated_forms as gf

    scale = q.shape[-1] ** -0.5 if scale is None else scale
    if initial_state is not None:
        initial_state = initial_state * scale
    return gf.simple_gla_chunk(q, k * scale, v, g, 1.0, initial_state, output_final_state, None, 16)


def test_a_final_state_off_by_a_factor_is_named_as_the_output_would_be():
    """A final state exactly K**-0.5 times the oracle's (the scale folded into k) is named by its factor: the factor
    check looks at the target that failed, not only at the output."""
    from harness.kernels.contract import Capabilities, KernelSpec

    spec = KernelSpec(name="planted.scale_folded_into_k", family="simple_gla", load=lambda: _scale_folded_into_k,
                      capabilities=Capabilities(dtypes=("float64",), final_state=True, scale=True), source="test")
    record = run_case(spec, Problem("simple_gla", 20, dtype="float64", batch=1, heads=2, dk=16, dv=8, seed=3,
                                    final_state=True), RunOptions())
    assert record["verdict"] == "divergent" and record.get("verdict_target") == "final_state", record["why"]
    assert record["cause"] == "constant_factor", record["why"]
    assert record["constant_factor"] == 16 ** -0.5 and "folded into k" in record["why"], record["why"]
    assert _factor_in(record["why"], r"final state is (\S+) times") == record["constant_factor"], record["why"]


def _final_state_decayed_once_more(q, k, v, g, scale=None, initial_state=None, output_final_state=False,
                                   cu_seqlens=None):
    """Output right; the final state decayed by the last step's gate once more (a padded tail chunk's slip)."""
    from harness.kernels import gated_forms as gf

    out, state = gf.simple_gla_chunk(q, k, v, g, scale, initial_state, output_final_state, None, 16)
    if state is not None:
        state = state * g[:, -1].exp().transpose(0, 1).reshape(1, -1, 1, 1)
    return out, state


def test_a_final_state_off_by_a_decay_is_no_convention():
    """A blind hunt's padded tail chunk decayed the final state once more: one head, so one factor (0.91),
    named "constant_factor: another scale or sign convention". A final state carries no convention but the
    scale folded into k; any other factor is a kernel bug."""
    from harness.kernels.contract import Capabilities, KernelSpec

    spec = KernelSpec(name="planted.final_state_decayed", family="simple_gla", load=lambda: _final_state_decayed_once_more,
                      capabilities=Capabilities(dtypes=("float64",), final_state=True, scale=True), source="test")
    record = run_case(spec, Problem("simple_gla", 20, dtype="float64", batch=1, heads=1, dk=16, dv=8, seed=3,
                                    final_state=True), RunOptions())
    assert record["verdict"] == "divergent" and record.get("verdict_target") == "final_state", record["why"]
    assert record["cause"] == "kernel_bug" and "convention" not in record["why"], record["why"]


def scan_chunked_carry_undecayed(a, b):
    """A chunked scan (chunks of 16, the loop inside, float32 for half inputs) whose carry into a chunk misses
    that chunk's first decay: a chunk-boundary slip, no scale."""
    a32, b32 = a.float(), b.float()
    out, carry = torch.empty_like(b32), torch.zeros_like(b32[..., 0])
    for start in range(0, a.shape[-1], 16):
        h, decay = torch.zeros_like(carry), torch.ones_like(carry)
        for t in range(start, min(start + 16, a.shape[-1])):
            h = a32[..., t] * h + b32[..., t]
            out[..., t] = h + decay * carry
            decay = decay * a32[..., t]  # wrong: the carry at step t needs the decays up to t, t included
        carry = out[..., t]
    return out.to(a.dtype)


def test_a_slip_at_a_few_elements_is_no_convention_whatever_its_least_squares_factor():
    """float16, L = 32: the slip above moves one element of 32; the least-squares factor over all of them is
    1.0026, and the output was judged equivalent at it (the other 31 within float16's bound of it too), so the
    case was "another scale or sign convention" (a blind hunt). The factor itself is tried only where the typical
    element is c times the oracle's (`runner._typical_ratio_near`), as a convention moves them all; a usual
    factor (the sign) still names a half-precision case."""
    spec = user_kernel_spec(scan_chunked_carry_undecayed, family="linear_scan")
    p = Problem(family="linear_scan", length=32, dtype="float16", regime="trained", batch=1, dim=1, seed=0)
    rec = run_case(spec, p)
    assert rec["verdict"] == "divergent" and rec["cause"] == "kernel_bug", rec["why"]
    assert rec["n_mismatch"] == 1 and "constant_factor" not in rec
    negated = user_kernel_spec(scan_negated, family="linear_scan")
    assert run_case(negated, p)["cause"] == "constant_factor"


def chunkwise_last_chunk_padded(q, k, v, chunk_size=16):
    """Wrong: a chunkwise retention whose last partial chunk takes its cross-chunk decays as if it were
    left-padded to a full chunk (gamma^(i + 1 + chunk - c) for gamma^(i + 1)); float32 work for half inputs."""
    _, length, heads, dk = q.shape
    work = torch.float32 if q.dtype in (torch.float16, torch.bfloat16) else q.dtype
    qq, kk, vv = (x.to(work).transpose(1, 2) for x in (q, k, v))
    log_gamma = torch.log(torch.tensor([1.0 - 2.0 ** (-5 - h) for h in range(heads)], dtype=torch.float64))
    state = torch.zeros(q.shape[0], heads, dk, v.shape[-1], dtype=work)
    outs = []
    for start in range(0, length, chunk_size):
        c = min(length, start + chunk_size) - start
        qc, kc, vc = (x[:, :, start:start + c] for x in (qq, kk, vv))
        i = torch.arange(c, dtype=torch.float64)
        diff = i[:, None] - i[None, :]
        inner_decay = (torch.exp(log_gamma[:, None, None] * diff.clamp(min=0)) * (diff >= 0)).to(work)
        e = i + 1 + (chunk_size - c if c < chunk_size else 0)
        cross = (qc * torch.exp(log_gamma[:, None] * e).to(work)[None, :, :, None]) @ state
        outs.append((((qc @ kc.transpose(-1, -2)) * inner_decay) @ vc + cross) * dk ** -0.5)
        key_decay = torch.exp(log_gamma[:, None] * (c - 1 - i)).to(work)[None, :, :, None]
        state = torch.exp(log_gamma * c).to(work)[None, :, None, None] * state + (kc * key_decay).transpose(-1, -2) @ vc
    return torch.cat(outs, dim=2).transpose(1, 2).to(q.dtype).contiguous()


def test_a_factor_the_bound_barely_admits_is_not_named():
    """A bfloat16 bound wide enough to admit a 3 % rescale (dk = 17) named a chunk-boundary slip's gradient
    "0.96875 = gamma: the state decayed once more than the definition", cond 1.0017 -> 0.998, for per-element
    ratios to the exact gradient from -4.1 to 14.2 (a blind hunt, session 24): a factor is named only where it
    shrinks the cond error (`runner.FACTOR_GAIN`)."""
    from harness.gradients import gradient_case

    spec = user_kernel_spec(chunkwise_last_chunk_padded, family="retention")
    problem = Problem("retention", 17, dtype="bfloat16", batch=1, heads=1, dk=17, dv=15, chunk_size=16,
                      regime="trained", seed=832098)
    v = {r["grad_of"]: r for r in gradient_case(spec, problem)}["v"]
    assert v["verdict"] == "divergent" and v["cause"] == "kernel_bug", v["why"]
    assert "constant factor" not in v["why"]


def gla_scale_by_dv(q, k, v, g, scale=None, initial_state=None, output_final_state=False):
    """The default scale taken from the value dimension."""
    return registry.get("intree.sequential_gla").callable()(
        q, k, v, g, scale=v.shape[-1] ** -0.5 if scale is None else scale, initial_state=initial_state,
        output_final_state=output_final_state)


def test_a_constant_factor_is_named_at_the_tiny_regime_s_magnitudes():
    """In float64's ``tiny`` regime (outputs near 1e-229) the least-squares factor squared the values to 0, so a
    kernel off by exactly (dk / dv)**0.5 stayed a kernel_bug, with the hint that "part of it may compute in
    float16", which holds no digit of such values (a blind hunt, session 28)."""
    p = Problem(family="gla", length=40, dtype="float64", batch=1, heads=2, dk=3, dv=33, seed=0, regime="tiny",
                has_initial_state=True)
    x = p.make_inputs()
    assert float(x["q"].abs().max() * x["k"].abs().max() * x["v"].abs().max()) < 1e-154  # squares underflow
    record = run_case(user_kernel_spec(gla_scale_by_dv, family="gla"), p)
    assert record["verdict"] == "divergent" and record["cause"] == "constant_factor", record["why"]
    assert "(dk / dv)**0.5" in record["why"] and "float16" not in record["why"], record["why"]


@pytest.mark.parametrize("magnitude", [1e-229, 1e-310, 1e300])
def test_the_least_squares_factor_holds_at_every_float64_magnitude(magnitude):
    """Squares of 1e-229 are 0 and of 1e300 are inf; the values are scaled by a power of two first (whose
    exponent is capped: 2**1074, for a subnormal peak, overflows a Python float)."""
    from harness.runner import factors_to_try

    p = Problem(family="retention", length=4, dtype="float64", batch=1, heads=1, dk=4, dv=4, seed=1)
    exact = torch.linspace(0.5, 1.0, 16, dtype=torch.float64).reshape(1, 1, 4, 4) * magnitude
    factor, meaning = factors_to_try(p, exact * 2, exact, "float64")[0]
    assert factor == 2.0 and "dk**-0.5 left out" in meaning, meaning
