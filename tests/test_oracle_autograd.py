"""`reference_impls.autograd` computes the same function as the oracles it mirrors (float64)."""

from __future__ import annotations

import pytest
import torch

from harness.problems import Problem
from harness.runner import reference_trace
from reference_impls import autograd as ad


def _inputs(problem):
    return {k: v.to(torch.float64) for k, v in problem.make_inputs().items()}


@pytest.mark.parametrize("length", [1, 5, 33])
def test_linear_recurrence(length):
    p = Problem("linear_scan", length, dtype="float64", batch=2, dim=3, seed=length)
    x = _inputs(p)
    assert torch.equal(ad.linear_recurrence(x["a"], x["b"]), reference_trace(p, x).out)


@pytest.mark.parametrize("groups", [0, 1, 2])
@pytest.mark.parametrize("options", [False, True])
def test_selective_scan(groups, options):
    p = Problem("selective_scan", 17, dtype="float64", batch=2, dim=4, state=3, groups=groups, has_D=options,
                has_z=options, has_delta_bias=options, delta_softplus=options, seed=3)
    x = _inputs(p)
    got = ad.selective_scan(x["u"], x["delta"], x["A"], x["B"], x["C"], D=x.get("D"), z=x.get("z"),
                            delta_bias=x.get("delta_bias"), delta_softplus=options)
    torch.testing.assert_close(got, reference_trace(p, x).out, rtol=4e-16, atol=1e-300)


@pytest.mark.parametrize("normed", [False, True])
def test_retention(normed):
    family = "retention_normed" if normed else "retention"
    p = Problem(family, 19, dtype="float64", batch=2, heads=3, dk=4, dv=5, seed=2, eps=1e-6 if normed else None)
    x = _inputs(p)
    gamma = [1 - 2.0 ** (-5 - h) for h in range(3)]
    got = (ad.retention_normed(x["q"], x["k"], x["v"], 1e-6, gamma, 0.5) if normed
           else ad.retention(x["q"], x["k"], x["v"], gamma, 0.5))
    torch.testing.assert_close(got, reference_trace(p, x).out, rtol=4e-16, atol=1e-300)


@pytest.mark.parametrize("family", ["linear_scan", "selective_scan", "retention", "retention_normed"])
def test_gradients_match_finite_differences(family):
    """Every input's gradient through the differentiable definitions agrees with central finite
    differences (torch.autograd.gradcheck, float64): a wrong or missing backward path fails here."""
    if family == "selective_scan":
        p = Problem(family, 6, dtype="float64", batch=1, dim=2, state=2, has_D=True, has_z=True,
                    has_delta_bias=True, delta_softplus=True, seed=1)
    elif family == "linear_scan":
        p = Problem(family, 7, dtype="float64", batch=1, dim=2, seed=1)
    else:
        p = Problem(family, 5, dtype="float64", batch=1, heads=2, dk=2, dv=3, seed=1,
                    eps=1e-6 if family == "retention_normed" else None)
    x = _inputs(p)
    names = list(x)

    def fn(*values):
        v = dict(zip(names, values))
        if family == "linear_scan":
            return ad.linear_recurrence(v["a"], v["b"])
        if family == "selective_scan":
            return ad.selective_scan(v["u"], v["delta"], v["A"], v["B"], v["C"], D=v["D"], z=v["z"],
                                     delta_bias=v["delta_bias"], delta_softplus=True)
        gamma = [0.9, 0.5]
        if family == "retention":
            return ad.retention(v["q"], v["k"], v["v"], gamma, 0.5)
        return ad.retention_normed(v["q"], v["k"], v["v"], 1e-6, gamma, 0.5)

    values = tuple(x[n].clone().requires_grad_() for n in names)
    assert torch.autograd.gradcheck(fn, values, eps=1e-6, atol=1e-6, rtol=1e-5)


def test_gradcheck_catches_a_wrong_backward():
    """The finite-difference check above can fail: a backward that drops the decay's gradient is caught."""

    class _NoDecayGrad(torch.autograd.Function):
        @staticmethod
        def forward(ctx, a, b):
            return ad.linear_recurrence(a, b)

        @staticmethod
        def backward(ctx, g):
            return torch.zeros_like(g), torch.flip(torch.cumsum(torch.flip(g, (-1,)), -1), (-1,))

    p = Problem("linear_scan", 5, dtype="float64", batch=1, dim=2, seed=1)
    x = _inputs(p)
    values = (x["a"].clone().requires_grad_(), x["b"].clone().requires_grad_())
    assert not torch.autograd.gradcheck(_NoDecayGrad.apply, values, eps=1e-6, atol=1e-6, raise_exception=False)
