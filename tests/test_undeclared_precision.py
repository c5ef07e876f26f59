"""A float64 case of a kernel that computes in float32 and does not say so: ``undeclared_precision``.

Found as a new user would: a chunkwise retention written as fused kernels are (float32 log-decays and
accumulators, the output cast back to the input dtype), checked with `harness check`, failed every float64
case from L=1 with cond 5.3e7 and the cause ``kernel_bug``: the second-dtype rerun saw its float32 run
equivalent and its float64 cond error 5e8 times larger, as a mistake's would be. The same output judged at
float32's bound is equivalent: the cause now says so, with the declaration that fixes it. A mistake in
such a kernel is still a ``kernel_bug`` (or its own cause), and a kernel that declares
``computes_in={"float64": "float32"}`` is held to float32's rounding and passes. The same for a float32 or
float64 kernel that computes in bfloat16 or float16 (below).
"""

from __future__ import annotations

import pytest
import torch

from harness.api import user_kernel_spec
from harness.errors import InvalidArgument
from harness.kernels import registry
from harness.kernels.contract import Capabilities, Family, KernelSpec
from harness.problems import Problem
from harness.runner import RunOptions, run_case

_PARALLEL = registry.get("intree.retention_parallel").callable()
_GLA = registry.get("intree.sequential_gla").callable()


def retention_in_float32(q, k, v):
    return _PARALLEL(q.float(), k.float(), v.float()).to(q.dtype)


def retention_in_float32_one_step_late(q, k, v):
    """Computes in float32, and applies each key one step late: a mistake, whatever the precision."""
    late = [torch.cat([torch.zeros_like(x[:, :1]), x[:, :-1]], dim=1).float() for x in (k, v)]
    return _PARALLEL(q.float(), *late).to(q.dtype)


def gla_in_float32(q, k, v, g, initial_state=None, output_final_state=False):
    o, s = _GLA(q.float(), k.float(), v.float(), g.float(), initial_state=None if initial_state is None
                else initial_state.float(), output_final_state=output_final_state)
    return o.to(q.dtype), (None if s is None else s.to(q.dtype))


RETENTION = Problem(family="retention", length=200, dtype="float64", batch=2, heads=3, dk=8, dv=5, seed=4)
OPTIONS = RunOptions(timeout_s=None, isolation="in-process")


@pytest.mark.parametrize("length", [1, 200])
def test_a_float64_case_of_a_float32_kernel_names_the_precision(length):
    spec = user_kernel_spec(retention_in_float32, family="retention")
    record = run_case(spec, RETENTION.replace(length=length), OPTIONS)
    assert record["verdict"] == "divergent" and record["cond_max"] > 1e6
    assert record["cause"] == "undeclared_precision", record["why"]
    assert record["float32_bound_cond_max"] <= 1
    assert "computes_in={'float64': 'float32'}" in record["why"]


def test_a_gated_kernel_with_a_float32_state_is_named_too():
    spec = user_kernel_spec(gla_in_float32, family="gla")
    problem = Problem(family="gla", length=90, dtype="float64", batch=1, heads=2, dk=6, dv=4, seed=7,
                      final_state=True)
    record = run_case(spec, problem, OPTIONS)
    assert record["verdict"] == "divergent" and record["cause"] == "undeclared_precision", record["why"]


def test_a_mistake_in_a_float32_kernel_is_not_called_a_precision():
    spec = user_kernel_spec(retention_in_float32_one_step_late, family="retention")
    record = run_case(spec, RETENTION, OPTIONS)
    assert record["verdict"] == "divergent" and record["cause"] != "undeclared_precision", record["why"]
    assert record["float32_bound_cond_max"] > 1


def test_the_same_kernel_declaring_float32_is_held_to_float32_and_passes():
    spec = KernelSpec(name="user.declared_float32", family=Family.RETENTION, load=lambda: retention_in_float32,
                      capabilities=Capabilities(computes_in={"float64": "float32"}))
    record = run_case(spec, RETENTION, OPTIONS)
    assert record["verdict"] == "equivalent" and record["precision"] == "float32", record["why"]


def test_a_float64_kernel_is_never_asked():
    record = run_case(registry.get("intree.retention_chunkwise"), RETENTION.replace(chunk_size=16), OPTIONS)
    assert record["verdict"] == "equivalent" and "float32_bound_cond_max" not in record


def test_small_mistakes_hidden_by_float32_s_wider_bound_are_not_called_a_precision():
    """The ci calibration's cases where a planted bug of a float64 kernel lies within float32's bound: the
    `tiny` regime (outputs near 1e-200, float32's bound absolute there) and a float16 state whose outputs all
    underflow to 0, as its float32 run's do. Neither is named; the planted bugs stay ``kernel_bug``, and since
    session 24 the tiny inputs, which float32 flushes, make no float32 run at all, and the why says so."""
    from tests.planted.bugs import scan_fp16_state

    tiny_scan = Problem(family="linear_scan", length=1, dtype="float64", batch=2, dim=7, regime="tiny", seed=2030441878)
    record = run_case(user_kernel_spec(scan_fp16_state, family="linear_scan"), tiny_scan, OPTIONS)
    assert record["verdict"] == "divergent" and record["cause"] == "kernel_bug", record["why"]
    # inputs that underflow in float32 make no float32 run to compare with (`runner.range_lost`, session 24)
    assert "no second-dtype check" in record["why"] and "float32_bound_cond_max" not in record

    def retention_scale_by_dv(q, k, v):  # the planted bug: scale dv**-0.5 instead of dk**-0.5
        return _PARALLEL(q, k, v, scale=v.shape[-1] ** -0.5)

    tiny_retention = Problem(family="retention", length=31, dtype="float64", batch=2, heads=1, dk=5, dv=8,
                             regime="tiny", seed=1290225236)
    record = run_case(user_kernel_spec(retention_scale_by_dv, family="retention"), tiny_retention,
                      RunOptions(timeout_s=None, isolation="in-process", factor_counterfactual=False))
    assert record["verdict"] == "divergent" and record["cause"] == "kernel_bug", record["why"]
    assert "no second-dtype check" in record["why"] and "float32_bound_cond_max" not in record


def test_a_float64_kernel_s_mistake_below_float32_s_bound_is_not_called_a_precision():
    """A float64 kernel off by a relative 1e-9 (a constant nudged in its last digits): within float32's
    bound on ordinary inputs, so only its own float32 run, which differs from its float64 output by the
    inputs' rounding (~1e-8), tells it from a kernel that computes in float32 (the same bits)."""
    def nudged(q, k, v):
        return _PARALLEL(q, k, v) * (1 + 1e-9)

    record = run_case(user_kernel_spec(nudged, family="retention"), RETENTION, OPTIONS)
    assert record["verdict"] == "divergent" and record["cause"] == "kernel_bug", record["why"]
    assert record["float32_bound_cond_max"] <= 1 and record["float32_run_distance"] > 0


def test_a_kernel_partly_in_float32_keeps_its_cause_and_is_told_why_it_may_look_so():
    """float64 arithmetic on a decay mask built from float32 log-decays: within float32's bound, not its own
    float32 run (its float64 inputs enter the float64 arithmetic). Not named (a small mistake looks the
    same), but the why says what the numbers say."""
    def float32_decays(q, k, v):
        heads, length = q.shape[2], q.shape[1]
        log_gammas = torch.log(torch.tensor([1 - 2.0 ** (-5 - h) for h in range(heads)], dtype=torch.float32))
        t = torch.arange(length, dtype=torch.float32)
        mask = torch.exp((t[:, None] - t[None, :]) * log_gammas[:, None, None]) * (t[:, None] >= t[None, :])
        qh, kh, vh = (x.transpose(1, 2) for x in (q * q.shape[-1] ** -0.5, k, v))
        return (((qh @ kh.transpose(-1, -2)) * mask.to(q.dtype)) @ vh).transpose(1, 2)  # the rest in the input dtype

    record = run_case(user_kernel_spec(float32_decays, family="retention"), RETENTION, OPTIONS)
    assert record["verdict"] == "divergent" and record["cause"] == "kernel_bug", record["why"]
    assert "but not its own float32 run" in record["why"] and "part of it may compute in float32" in record["why"]


# ------------------------------------------------------------------ half precision inside a float32/float64 kernel
# Found as a new user would: a linear scan that computes in bfloat16 whatever its input (as an autocast region
# does) was `kernel_bug` from L = 1 (cond 1.3e4 in float32, 4.7e12 in float64), and its float64 rerun diverged as
# much, so the second-dtype rerun could not name it. Its outputs are all bfloat16 numbers: that names it.

_SCAN = registry.get("intree.sequential_scan").callable()
SCAN = Problem(family="linear_scan", length=300, dtype="float32", batch=2, dim=5, seed=3)


def scan_in(dtype: torch.dtype, offset: float = 0.0):
    def scan(a, b):
        return (_SCAN(a.to(dtype), b.to(dtype)) + offset).to(a.dtype)
    return scan


@pytest.mark.parametrize(("half", "dtype"), [("bfloat16", "float32"), ("float16", "float32"),
                                             ("bfloat16", "float64")])
@pytest.mark.parametrize("length", [1, 300])
def test_a_kernel_computing_in_half_precision_names_it(half, dtype, length):
    spec = user_kernel_spec(scan_in(getattr(torch, half)), family="linear_scan")
    record = run_case(spec, SCAN.replace(length=length, dtype=dtype), OPTIONS)
    assert record["verdict"] == "divergent" and record["cond_max"] > 100
    assert record["cause"] == "undeclared_precision", record["why"]
    assert record[f"{half}_bound_cond_max"] <= 1
    assert f"computes_in={{'{dtype}': '{half}'}}" in record["why"], record["why"]


def test_half_precision_numbers_beyond_that_bound_are_a_mistake_still():
    """Outputs rounded to bfloat16 that are also off by 0.5: beyond bfloat16's bound, so not a precision."""
    spec = user_kernel_spec(scan_in(torch.bfloat16, offset=0.5), family="linear_scan")
    record = run_case(spec, SCAN, OPTIONS)
    assert record["verdict"] == "divergent" and record["cause"] == "kernel_bug", record["why"]
    assert record["bfloat16_bound_cond_max"] > 1


def test_a_float32_mistake_is_not_called_a_half_precision():
    """A float32 kernel's outputs are not all bfloat16 numbers: nothing is judged at bfloat16's bound."""
    spec = user_kernel_spec(scan_in(torch.float32, offset=1e-3), family="linear_scan")
    record = run_case(spec, SCAN, OPTIONS)
    assert record["verdict"] == "divergent" and record["cause"] == "kernel_bug", record["why"]
    assert "bfloat16_bound_cond_max" not in record and "float16_bound_cond_max" not in record


def test_the_kernel_declaring_bfloat16_is_held_to_it_and_passes():
    spec = KernelSpec(name="user.declared_bfloat16", family=Family.LINEAR_SCAN, load=lambda: scan_in(torch.bfloat16),
                      capabilities=Capabilities(computes_in={"float32": "bfloat16"}))
    for seed in range(4):
        record = run_case(spec, SCAN.replace(seed=seed), OPTIONS)
        assert record["verdict"] == "equivalent" and record["precision"] == "bfloat16", record["why"]


def _loop_in_bfloat16(a, b):
    """The plain loop in bfloat16 on torch operations (autograd through the casts)."""
    ab, bb = a.to(torch.bfloat16), b.to(torch.bfloat16)
    h, out = torch.zeros_like(ab[..., 0]), []
    for t in range(ab.shape[-1]):
        h = ab[..., t] * h + bb[..., t]
        out.append(h)
    return torch.stack(out, -1).to(a.dtype)


def test_a_gradient_computed_in_half_precision_names_it_too():
    """Its backward gives bfloat16 gradients. On a case whose forward is exact in bfloat16 (the inputs and
    every step bfloat16 numbers, as a shrunk case's are) the forward is equivalent and the gradients
    diverge (the cotangent rounded to bfloat16): `kernel_bug` before, as `harness check` said."""
    from harness.gradients import gradient_case

    spec = user_kernel_spec(_loop_in_bfloat16, family="linear_scan")
    exact = SCAN.replace(length=3, dim=2, batch=1, values={"a": [0.5, 0.25, 0.5, 0.75, 0.5, 1.0],
                                                          "b": [1.0, -2.0, 0.5, 3.0, 0.125, 1.5]})
    records = gradient_case(spec, exact, OPTIONS)
    assert {r["grad_of"] for r in records if r.get("mode") == "grad"} == {"a", "b"}
    divergent = [r for r in records if r["verdict"] == "divergent"]
    assert divergent and {r["cause"] for r in divergent} == {"undeclared_precision"}, [r["why"] for r in divergent]
    assert all("computes_in={'float32': 'bfloat16'}" in r["why"] for r in divergent)


def _retention_under_autocast(q, k, v):
    """A parallel retention run under CPU autocast, as a training loop would: bfloat16 matmuls for float32
    inputs (float64 is left alone, so its float64 rerun is exact)."""
    heads, length = q.shape[2], q.shape[1]
    gamma = 1 - 2.0 ** (-5 - torch.arange(heads, dtype=torch.float64))
    n = torch.arange(length, dtype=torch.float64)
    mask = (gamma[:, None, None] ** (n[:, None] - n[None, :]).clamp(min=0)) * (n[:, None] >= n[None, :])
    with torch.autocast("cpu", dtype=torch.bfloat16):
        qh, kh, vh = (x.transpose(1, 2) for x in (q, k, v))
        scores = (qh @ kh.transpose(-1, -2)) * q.shape[-1] ** -0.5
        out = (scores * mask.to(scores.dtype)) @ vh
    return out.transpose(1, 2).to(q.dtype)


def test_autocast_is_an_undeclared_precision_not_a_precision_loss():
    """Its float64 rerun is equivalent (autocast leaves float64 alone), so the cause was ``precision_loss``:
    "the algorithm is right and loses digits a plain loop keeps", for a kernel 3e5 times the float32 loop's
    error at L = 1. Its outputs are bfloat16 numbers: the cause says what the kernel does."""
    spec = user_kernel_spec(_retention_under_autocast, family="retention")
    for length in (1, 64):
        record = run_case(spec, RETENTION.replace(dtype="float32", length=length), OPTIONS)
        assert record["verdict"] == "divergent" and record["float64_verdict"] == "equivalent"
        assert record["cause"] == "undeclared_precision", record["why"]
        assert "computes_in={'float32': 'bfloat16'}" in record["why"]


def test_a_search_s_tiny_or_large_kernel_bug_beside_an_undeclared_precision_is_said_to_be_its_range():
    """A float32-internal kernel's float64 search: 13 cases undeclared_precision, 13 kernel_bug in ``tiny`` and
    ``large`` (float32's range), the latter read as a second bug (blind hunt, session 23)."""
    from harness.api import _same_narrow_range

    reported = {"cause": "undeclared_precision"}
    assert "same narrower dtype's range" in _same_narrow_range(reported, {"cause": "kernel_bug", "regime": "tiny"})
    assert _same_narrow_range(reported, {"cause": "kernel_bug", "regime": "trained"}) == ""
    assert _same_narrow_range({"cause": "kernel_bug"}, {"cause": "kernel_bug", "regime": "large"}) == ""


def scan_accumulating_in_float32(a, b):
    """Correct: a loop that works in float32 whatever its input, and returns the input's dtype."""
    h, out = torch.zeros_like(b[..., 0], dtype=torch.float32), []
    for t in range(b.shape[-1]):
        h = a[..., t].float() * h + b[..., t].float()
        out.append(h)
    return torch.stack(out, -1).to(b.dtype)


def test_a_finer_internal_precision_needs_no_declaration_and_declaring_it_is_refused():
    """A blind hunt's bfloat16 loop accumulating in float32 declared ``computes_in={"bfloat16": "float32"}``: held
    to float32's bound with nothing for its output's rounding to bfloat16, it was divergent at L = 1 (cond 1,980)
    with the advice to declare ``{'float32': 'float16'}`` (session 25). Undeclared it passes; declared, the
    Capabilities say why not, and name chunk_computes_in."""
    with pytest.raises(InvalidArgument, match=r"computes_in=\{'bfloat16': 'float32'\}\): float32 is finer than "
                                              r"bfloat16.*needs no declaration.*chunk_computes_in=\{'bfloat16': "):
        Capabilities(computes_in={"bfloat16": "float32"})
    with pytest.raises(InvalidArgument, match=r"chunk_computes_in=\{'float32': 'bfloat16'\}\): bfloat16 is not finer"):
        Capabilities(chunk_computes_in={"float32": "bfloat16"})
    Capabilities(computes_in={"float64": "float32", "float32": "tf32_rz"})  # coarser: the declarations in use
    spec = user_kernel_spec(scan_accumulating_in_float32, family="linear_scan")
    for dtype in ("bfloat16", "float16"):
        for length in (1, 64):
            record = run_case(spec, Problem(family="linear_scan", length=length, dtype=dtype, seed=length), OPTIONS)
            assert record["verdict"] == "equivalent", record["why"]
