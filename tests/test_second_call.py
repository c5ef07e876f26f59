"""The determinism check's second call is held to the whole contract, as the first is.

A kernel that raises, returns no tensor, or returns another shape or dtype on its second call on the same
inputs (a race that corrupts every other launch, a cache keyed wrongly) passed `harness check` with exit 0: the
second call was compared only when it returned a tensor, and a wrong shape read "two calls differ by 0"
(a blind hunt, session 27). Each kernel below misbehaves only when it is called again on the inputs of its
previous call, so the first call of every case is right whatever ran before in its process.
"""

from __future__ import annotations

import pytest
import torch

from harness.api import user_kernel_spec
from harness.kernels.guard import Outcome
from harness.problems import Problem
from harness.runner import RunOptions, run_case
from reference_impls.linear_recurrence import linear_recurrence

_last: list = [None]


@pytest.fixture(autouse=True)
def first_call_first():
    """Each test starts with no previous call in this process (a worker's ends on another seed's inputs)."""
    _last[0] = None


def _again(a: torch.Tensor) -> bool:
    """Whether this call repeats the previous one's inputs (then the next call counts as a first again)."""
    key = (tuple(a.shape), float(a.double().sum()))
    repeated = _last[0] == key
    _last[0] = None if repeated else key
    return repeated


def _right(a, b):
    return linear_recurrence(a.double(), b.double()).to(a.dtype)


def raises_again(a, b):
    if _again(a):
        raise RuntimeError("an illegal memory access was encountered")
    return _right(a, b)


def none_again(a, b):
    return None if _again(a) else _right(a, b)


def flat_again(a, b):
    out = _right(a, b)
    return out.reshape(-1) if _again(a) else out


def float64_again(a, b):
    out = _right(a, b)
    return out.double() if _again(a) else out


def right(a, b):
    _again(a)
    return _right(a, b)


CASES = [
    (raises_again, Outcome.RAISED, "the second call (determinism check): RuntimeError: an illegal memory access"),
    (none_again, Outcome.NOT_A_TENSOR, "the second call (determinism check) returned NoneType"),
    (flat_again, Outcome.WRONG_SHAPE, "the second call (determinism check) returned shape (42,), expected (2, 3, 7)"),
    (float64_again, Outcome.WRONG_DTYPE,
     "the second call (determinism check) returned dtype torch.float64, expected torch.float32"),
]


@pytest.mark.parametrize("isolation", ["process", "in-process"])
@pytest.mark.parametrize("kernel,outcome,message", CASES, ids=[c[0].__name__ for c in CASES])
def test_a_second_call_that_breaks_the_contract_is_named(kernel, outcome, message, isolation):
    problem = Problem(family="linear_scan", length=7, dtype="float32", batch=2, dim=3, seed=11)
    options = RunOptions(timeout_s=30, check_determinism=True, isolation=isolation)
    record = run_case(user_kernel_spec(kernel, family="linear_scan"), problem, options)
    assert record["verdict"] == "kernel_error" and record["outcome"] == outcome.value, record["why"]
    assert message in record["error"], record["error"]
    record = run_case(user_kernel_spec(kernel, family="linear_scan"), problem.replace(seed=12),
                      RunOptions(timeout_s=30, check_determinism=False, isolation=isolation))
    assert record["verdict"] == "equivalent", record["why"]  # one call is right: only the second call shows it


def test_a_kernel_right_on_both_calls_passes_the_check():
    problem = Problem(family="linear_scan", length=7, dtype="float32", batch=2, dim=3, seed=11)
    record = run_case(user_kernel_spec(right, family="linear_scan"), problem,
                      RunOptions(timeout_s=30, check_determinism=True, isolation="process"))
    assert record["verdict"] == "equivalent", record["why"]


def nested_output(a, b):
    return torch.nested.nested_tensor([_right(a, b)[0], _right(a, b)[1]])


def quantized_output(a, b):
    return torch.quantize_per_tensor(_right(a, b), 0.1, 0, torch.qint8)


@pytest.mark.filterwarnings("ignore::UserWarning")  # torch's own: nested tensors in prototype, quantized deprecated
@pytest.mark.parametrize("kernel,kind", [(nested_output, "a nested tensor"), (quantized_output, "a quantized tensor")])
@pytest.mark.parametrize("isolation", ["process", "in-process"])
def test_a_nested_or_quantized_output_is_not_a_tensor_the_harness_reads(kernel, kind, isolation):
    """Both crashed the harness's own copy of the output into shared memory, reported as the kernel's crash."""
    problem = Problem(family="linear_scan", length=7, dtype="float32", batch=2, dim=3, seed=11)
    record = run_case(user_kernel_spec(kernel, family="linear_scan"), problem,
                      RunOptions(timeout_s=30, isolation=isolation))
    assert record["outcome"] == Outcome.NOT_A_TENSOR.value, record["error"]
    assert f"returned {kind} (expected a dense, strided one)" in record["error"], record["error"]
