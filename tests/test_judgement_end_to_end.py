"""End-to-end judgement of a subtle algebraic mistake: the harness sees in float64 what allclose hides.

The kernel is exact except for one decay exponent: at one step it applies ``a**2`` instead of ``a``.
With decay factors within 1e-3 of 1 (the ``long_memory`` regime) its float32 output passes a loose
``torch.allclose(rtol=1e-2, atol=1e-2 * max|ref|)`` against the oracle, yet run in float64 it is held to float64 rounding and
judged divergent at the step where the mistake sits.
"""

from __future__ import annotations

import torch

from harness.kernels.registry import get
from harness.problems import Problem
from harness.runner import reference_trace, run_case

WRONG_STEP = 7


def scan_one_wrong_exponent(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """h_t = a_t h_{t-1} + b_t, except h_7 = a_7**2 h_6 + b_7."""
    h = torch.zeros_like(b[..., 0])
    out = torch.empty_like(b)
    for t in range(b.shape[-1]):
        decay = a[..., t] ** 2 if t == WRONG_STEP else a[..., t]
        h = decay * h + b[..., t]
        out[..., t] = h
    return out


def _problem(dtype: str) -> Problem:
    return Problem("linear_scan", 64, dtype=dtype, regime="long_memory", batch=2, dim=4, seed=5)


def test_loose_allclose_passes_in_float32():
    problem = _problem("float32")
    inputs = problem.make_inputs()
    out = scan_one_wrong_exponent(inputs["a"], inputs["b"]).double()
    ref = reference_trace(problem, inputs).out
    scale = float(ref.abs().max())
    assert torch.allclose(out, ref, rtol=1e-2, atol=1e-2 * scale)  # the loose check a seed user would write
    assert not torch.equal(out, ref)


def test_float64_run_is_divergent_at_the_wrong_step():
    spec = get("intree.sequential_scan")
    record = run_case(spec, _problem("float64"), kernel_fn=scan_one_wrong_exponent)
    assert record["verdict"] == "divergent", record["why"]
    assert record["cause"] == "kernel_bug"
    assert record["onset_t"] == WRONG_STEP


def test_the_correct_loop_is_equivalent_on_the_same_case():
    record = run_case(get("intree.sequential_scan"), _problem("float64"))
    assert record["verdict"] == "equivalent", record["why"]


def test_nan_where_no_digit_is_guaranteed_is_not_a_kernel_bug():
    """bfloat16 retention whose q.S cancels below the rounding of its terms: the plain loop rounds the row
    to zeros and the norm gives 0/0. That is the input's conditioning, not a bug (calibration found it)."""
    problem = Problem("retention_normed", 56, dtype="bfloat16", regime="large", seed=5, heads=2, dk=8, dv=1,
                      eps=0.0, batch=2)
    record = run_case(get("intree.sequential_retention_normed"), problem)
    assert record["n_kernel_nonfinite"] >= 1
    assert record["verdict"] == "out_of_domain", record["why"]
    assert "no significant digit is guaranteed" in record["why"]
