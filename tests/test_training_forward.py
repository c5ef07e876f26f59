"""The forward a kernel runs with inputs requiring grad is judged as its plain forward is.

A fused kernel takes another path in training (a forward that saves its intermediates for a hand-written
backward, an `autograd.Function`). One whose forward was wrong only there, with a right backward, passed
`harness check` with exit 0: the gradient check threw that forward's output away (a blind hunt, session 27).
"""

from __future__ import annotations

import pytest
import torch

from harness.api import check, user_kernel_spec
from harness.gradients import gradient_case
from harness.problems import Problem
from harness.runner import RunOptions
from reference_impls.linear_recurrence import linear_recurrence

OPTIONS = RunOptions(timeout_s=60, isolation="in-process")


def _scan(a, b):
    """A differentiable sequential scan in the inputs' dtype."""
    h, out = torch.zeros_like(b[..., 0]), []
    for t in range(a.shape[-1]):
        h = a[..., t] * h + b[..., t]
        out.append(h)
    return torch.stack(out, -1)


def doubled_in_training(a, b):
    """Right without grad; with grad, twice the output but the right gradient (a straight-through slip)."""
    out = _scan(a, b)
    if a.requires_grad or b.requires_grad:
        return out.detach() * 2 + (out - out.detach())
    return out


def other_order_in_training(a, b):
    """Right on both paths: the plain path in float64, the training path in the inputs' dtype, so the two
    outputs differ in their last bits and the training one must be judged, not compared."""
    if a.requires_grad or b.requires_grad:
        return _scan(a, b)
    return linear_recurrence(a.double(), b.double()).to(a.dtype)


def problem(dtype: str = "float32", length: int = 33) -> Problem:
    return Problem(family="linear_scan", length=length, dtype=dtype, batch=2, dim=3, seed=4, regime="trained")


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_a_forward_wrong_only_with_grad_is_divergent(dtype):
    records = gradient_case(user_kernel_spec(doubled_in_training, family="linear_scan"), problem(dtype), OPTIONS)
    training = [r for r in records if r.get("training_forward")]
    assert len(training) == 1, [(r["kernel"], r["verdict"]) for r in records]
    record = training[0]
    assert record["verdict"] == "divergent" and record["cause"] == "kernel_bug", record["why"]
    assert record["kernel"].endswith(":grad[*]") and record["grad_of"] == "*"
    assert record["why"].startswith("the forward with inputs requiring grad (the path a training step takes)")
    assert "without grad the same case's forward is equivalent" in record["why"]
    # its gradients are right and stay judged beside it
    assert {r["grad_of"]: r["verdict"] for r in records if not r.get("training_forward")} == {
        "a": "equivalent", "b": "equivalent"}


def test_a_right_training_path_with_other_rounding_is_not_flagged():
    spec = user_kernel_spec(other_order_in_training, family="linear_scan")
    records = gradient_case(spec, problem("float32", 257), OPTIONS)
    assert records and not any(r.get("training_forward") for r in records), [r["why"] for r in records]
    assert all(r["verdict"] == "equivalent" for r in records), [r["why"] for r in records]


def test_a_training_output_equal_to_the_plain_one_is_not_judged_again(monkeypatch):
    """The plain forward's output (kept by `harness check`) spares the second judgement where they agree bit
    for bit."""
    from harness.kernels.isolation import same_bits

    calls = []
    monkeypatch.setattr("harness.runner.judged_output",
                        lambda *a, **k: calls.append(1) or pytest.fail("judged although equal"))
    spec = user_kernel_spec(_scan, family="linear_scan")
    p = problem("float32", 17)
    plain = _scan(*(p.make_inputs()[k] for k in ("a", "b"))).double()
    assert same_bits(plain, plain.clone()) and not same_bits(plain, plain + 1e-12)
    records = gradient_case(spec, p, OPTIONS, forward_output=plain)
    assert not calls and all(r["verdict"] == "equivalent" for r in records)


def test_check_fails_and_names_the_training_forward(tmp_path):
    result = check(doubled_in_training, family="linear_scan", profile="ci", dtypes=("float32",), max_examples=4,
                   counterexample_dir=tmp_path, isolation="in-process")
    assert not result.passed
    assert result.failure.get("training_forward") and result.failure["verdict"] == "divergent"
    assert "with inputs requiring grad (the path a training step takes) is divergent" in str(result.message)


def test_check_keeps_passing_a_right_kernel_with_a_training_path(tmp_path):
    result = check(other_order_in_training, family="linear_scan", profile="ci", dtypes=("float32",),
                   max_examples=6, counterexample_dir=tmp_path, isolation="in-process")
    assert result.passed, result.message
