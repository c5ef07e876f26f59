"""A selective kernel that leaves out an optional term, or its softplus, is told which (`runner._named_slip`).

A blind hunt's selective scan without its D skip term shrank to L = 1 with nothing but ACTUAL and DESIRED to
go on, and a bias added after the softplus (``softplus(delta) + bias``) read the same. The divergent output is
judged once more against the oracle with each of the family's slips (`FamilyDef.slips`: D, the gate silu(z)
or the step's bias left out, the softplus left out or applied unasked, the bias after the softplus); where one
is equivalent, the why names it and the record has ``slip``. The cause stays ``kernel_bug``: the slip is the
bug. Another bug is named no slip.
"""

from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F

from harness.api import larger_cases_slip, named_on_larger_cases, user_kernel_spec
from harness.problems import Problem
from harness.runner import RunOptions, run_case
from reference_impls.gated_decay import ssd
from reference_impls.selective_scan import selective_scan


def _scan(u, delta, A, B, C, D, z, delta_bias, delta_softplus):
    return selective_scan(u, delta, A, B, C, D=D, z=z, delta_bias=delta_bias, delta_softplus=delta_softplus,
                          compute_dtype=u.dtype).to(u.dtype)


def no_D(u, delta, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False):
    return _scan(u, delta, A, B, C, None, z, delta_bias, delta_softplus)


def no_gate(u, delta, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False):
    return _scan(u, delta, A, B, C, D, None, delta_bias, delta_softplus)


def no_bias(u, delta, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False):
    return _scan(u, delta, A, B, C, D, z, None, delta_softplus)


def no_softplus(u, delta, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False):
    return _scan(u, delta, A, B, C, D, z, delta_bias, False)


def softplus_always(u, delta, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False):
    return _scan(u, delta, A, B, C, D, z, delta_bias, True)


def bias_after_softplus(u, delta, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False):
    if delta_softplus and delta_bias is not None:
        return _scan(u, F.softplus(delta) + delta_bias[:, None].to(delta.dtype), A, B, C, D, z, None, False)
    return _scan(u, delta, A, B, C, D, z, delta_bias, delta_softplus)


def gate_sigmoid(u, delta, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False):
    """Another bug: the gate is sigmoid(z), not silu(z)."""
    y = _scan(u, delta, A, B, C, D, None, delta_bias, delta_softplus)
    return y * torch.sigmoid(z) if z is not None else y


def _selective(dtype: str, softplus: bool = True) -> Problem:
    return Problem(family="selective_scan", length=12, dtype=dtype, batch=2, dim=4, state=3, seed=2, has_D=True,
                   has_z=True, has_delta_bias=True, delta_softplus=softplus)


@pytest.mark.parametrize("dtype", ["float64", "float32", "bfloat16"])
@pytest.mark.parametrize("kernel, softplus, slip", [
    (no_D, True, "leaves out the skip term D * u"),
    (no_gate, True, "leaves out the output gate silu(z)"),
    (no_bias, True, "leaves out delta_bias"),
    (softplus_always, False, "applies softplus to delta though the case passes delta_softplus=False"),
    (bias_after_softplus, True, "adds delta_bias after the softplus"),
], ids=lambda v: getattr(v, "__name__", None) if callable(v) else None)
def test_a_selective_scan_s_slip_is_named(kernel, softplus, slip, dtype):
    record = run_case(user_kernel_spec(kernel, family="selective_scan"), _selective(dtype, softplus))
    assert record["verdict"] == "divergent" and record["cause"] == "kernel_bug", record["why"]
    assert record["slip"].startswith(slip) and record["slip_cond_max"] >= 0, record  # within the bound or the loop
    assert f"slip: the output is the oracle's for a kernel that {slip}" in record["why"], record["why"]


def test_a_slip_whose_loop_is_beyond_the_bound_itself_is_not_named():
    """Without softplus this case's steps go negative and its decays grow past float32: the loop without softplus,
    bit for bit the kernel's output, is beyond the bound too (cond 1.41, within it only by the loop's own
    measure), so it vouches for nothing. A loose loop named three other bugs "does not apply softplus" in the ci
    calibration (bfloat16, `large`); float64 is held to the bound alone and names it."""
    spec = user_kernel_spec(no_softplus, family="selective_scan")
    assert "slip" not in run_case(spec, _selective("float32")), "a loop beyond the bound vouched"
    assert run_case(spec, _selective("float64"))["slip"].startswith("does not apply softplus to delta + delta_bias")


def test_another_bug_is_named_no_slip_and_the_option_turns_it_off():
    spec = user_kernel_spec(gate_sigmoid, family="selective_scan")
    record = run_case(spec, _selective("float64"))
    assert record["verdict"] == "divergent" and "slip" not in record and "slip:" not in record["why"], record
    off = run_case(user_kernel_spec(no_D, family="selective_scan"), _selective("float64"),
                   RunOptions(slip_counterfactual=False))
    assert off["verdict"] == "divergent" and "slip" not in off, off


def _ssd(x, dt, A, B, C, D, z, dt_bias, dt_softplus):
    return ssd(x, dt, A, B, C, None, D=D, z=z, dt_bias=dt_bias, dt_softplus=dt_softplus,
               compute_dtype=x.dtype).to(x.dtype)


def ssd_no_D(x, dt, A, B, C, chunk_size=None, D=None, z=None, dt_bias=None, dt_softplus=False):
    return _ssd(x, dt, A, B, C, None, z, dt_bias, dt_softplus)


def ssd_bias_after_softplus(x, dt, A, B, C, chunk_size=None, D=None, z=None, dt_bias=None, dt_softplus=False):
    return _ssd(x, F.softplus(dt) + dt_bias.to(dt.dtype), A, B, C, D, z, None, False)


@pytest.mark.parametrize("kernel, slip", [(ssd_no_D, "leaves out the skip term D * x"),
                                          (ssd_bias_after_softplus, "adds dt_bias after the softplus")])
def test_an_ssd_kernel_s_slip_is_named(kernel, slip):
    problem = Problem(family="ssd", length=10, dtype="float32", batch=1, heads=2, dv=3, state=4, groups=1, seed=2,
                      has_D=True, has_z=True, has_delta_bias=True, delta_softplus=True)
    record = run_case(user_kernel_spec(kernel, family="ssd"), problem)
    assert record["verdict"] == "divergent" and record["cause"] == "kernel_bug", record["why"]
    assert record["slip"].startswith(slip), record


def test_a_shrunk_case_too_small_to_name_its_slip_says_what_its_larger_cases_were_named():
    """A half-precision case of one element is not tried (a few values match another form by chance)."""
    spec = user_kernel_spec(bias_after_softplus, family="selective_scan")
    shrunk = run_case(spec, Problem(family="selective_scan", length=1, dtype="bfloat16", batch=1, dim=1, state=1,
                                    seed=5, has_delta_bias=True, delta_softplus=True))
    larger = run_case(spec, _selective("bfloat16"))
    assert shrunk["verdict"] == larger["verdict"] == "divergent" and "slip" not in shrunk, shrunk
    assert larger_cases_slip(shrunk, [larger, shrunk]) == larger["slip"]
    line = named_on_larger_cases(shrunk, [larger, shrunk])
    assert line.startswith("Named on larger cases: slip (") and "slip: the" not in line, line
    assert re.search(r"\b1 of the search's 2 divergent cases", line), line  # the larger case of the two failing
    assert "a kernel that adds delta_bias after the softplus" in line, line
    assert larger_cases_slip(larger, [larger, shrunk]) is None  # named on its own case


def ssd_softplus_in_half(x, dt, A, B, C, chunk_size=None, D=None, z=None, dt_bias=None, dt_softplus=False):
    """Correct but for float16: softplus as log1p(exp(dt)) in the input's dtype, inf for 11.09 < dt <= 20."""
    dt = dt + dt_bias if dt_bias is not None else dt
    if dt_softplus:
        dt = torch.where(dt > 20, dt, torch.log1p(torch.exp(dt)))
    return ssd(x, dt, A, B, C, None, D=D, z=z, compute_dtype=x.dtype).to(x.dtype)


def test_a_softplus_that_overflows_float16_is_named_in_a_nonfinite_why():
    """An SSD loop that computes the softplus in float16 returns inf from dt = 11.1 on; the why names the steps
    in that range, not a generic intermediate that overflows (a long cumulative log-decay sum)."""
    from harness.families.base import FLOAT16_EXP_MAX, softplus_overflow
    from reference_impls.selective_scan import SOFTPLUS_THRESHOLD

    base = Problem(family="ssd", length=4, dtype="float16", batch=1, heads=1, dv=1, state=1, groups=1, seed=1,
                   delta_softplus=True)
    ones = lambda n: [1.0] * n  # noqa: E731
    problem = base.replace(values={"x": ones(4), "dt": [0.5, 12.0, 0.5, 0.5], "A": [-1.0], "B": ones(4),
                                   "C": ones(4)})
    record = run_case(user_kernel_spec(ssd_softplus_in_half, family="ssd"), problem)
    assert record["verdict"] == "divergent" and "kernel_nonfinite" == record["rule"], record["why"]
    # how many steps of how many, and the range they lie in, as numbers: from log(65504), where exp passes
    # float16's max, to the threshold above which softplus is x
    why = record["why"]
    assert "log1p(exp(x)) in float16 overflows" in why, why
    steps, between = re.search(r"(\d+) of the case's (\d+) steps", why), re.search(r"between (\S+) and (\S+),", why)
    assert steps is not None and (int(steps[1]), int(steps[2])) == (1, 4), why
    assert between is not None and float(between[1]) == pytest.approx(FLOAT16_EXP_MAX, rel=1e-3), why
    assert float(between[2]) == SOFTPLUS_THRESHOLD, why
    assert softplus_overflow(base, torch.tensor([12.0]), "float32") is None  # float32's exp passes 88.7 only
    assert softplus_overflow(base, torch.tensor([25.0, 5.0]), "float16") is None  # above 20 softplus is x
