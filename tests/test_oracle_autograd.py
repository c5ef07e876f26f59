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


def test_gradients_flow():
    p = Problem("selective_scan", 6, dtype="float64", has_D=True, has_z=True, seed=1)
    x = {k: v.requires_grad_() for k, v in _inputs(p).items()}
    y = ad.selective_scan(x["u"], x["delta"], x["A"], x["B"], x["C"], D=x["D"], z=x["z"])
    grads = torch.autograd.grad(y.sum(), list(x.values()))
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
