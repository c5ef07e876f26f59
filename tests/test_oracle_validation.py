"""Bad inputs to the oracles raise at once, with a message naming the argument, its value and the fix.

Shapes and values: `ValueError`; types and non-floating dtypes: `TypeError`. Each oracle and its
``*_trace`` share the checks, so most cases run against both.
"""

from __future__ import annotations

import re

import pytest
import torch

from reference_impls import (
    group_norm,
    linear_recurrence,
    linear_recurrence_trace,
    retention,
    retention_normed,
    retention_normed_trace,
    retention_trace,
    selective_scan,
    selective_scan_trace,
)

F64 = torch.float64


def _z(*shape: int, dtype: torch.dtype = F64) -> torch.Tensor:
    return torch.zeros(shape, dtype=dtype)


# ----------------------------------------------------------------------------------------------------
# linear_recurrence

LINEAR = [linear_recurrence, linear_recurrence_trace]


@pytest.mark.parametrize("fn", LINEAR)
@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        ({"a": _z(2, 3), "b": _z(2, 3)}, ValueError, "a.shape=(2, 3) has 2 dimension(s); expected 3: (batch, channels, length)"),
        ({"a": _z(2, 3, 5), "b": _z(2, 3, 4)}, ValueError, "b.shape=(2, 3, 4) does not match: expected a.shape (batch, channels, length) = (2, 3, 5)"),
        ({"a": _z(2, 3, 5), "b": _z(2, 3, 5), "h0": _z(3, 2)}, ValueError, "h0.shape=(3, 2) does not match: expected (batch, channels) = (2, 3)"),
        ({"a": _z(2, 3, 5), "b": _z(2, 3, 5), "h0": _z(2, 3, 1)}, ValueError, "h0.shape=(2, 3, 1) does not match"),
        ({"a": _z(2, 3, 5, dtype=torch.int64), "b": _z(2, 3, 5)}, TypeError, "a.dtype=torch.int64 is not a real floating dtype"),
        ({"a": _z(2, 3, 5), "b": _z(2, 3, 5, dtype=torch.complex128)}, TypeError, "b.dtype=torch.complex128 is not a real floating dtype"),
        ({"a": [[[1.0]]], "b": _z(1, 1, 1)}, TypeError, "a is a list; expected a torch.Tensor"),
        ({"a": _z(1, 1, 1), "b": _z(1, 1, 1), "h0": _z(1, 1, dtype=torch.bool)}, TypeError, "h0.dtype=torch.bool"),
    ],
)
def test_linear_recurrence_rejects(fn, kwargs, error, message):
    with pytest.raises(error, match=re.escape(message)):
        fn(**kwargs)


@pytest.mark.parametrize("dtype", [torch.int32, "float32", torch.complex64])
def test_compute_dtype_must_be_a_floating_torch_dtype(dtype):
    message = f"compute_dtype={dtype!r} is not a real floating torch.dtype"
    with pytest.raises(TypeError, match=re.escape(message)):
        linear_recurrence(_z(1, 1, 2), _z(1, 1, 2), compute_dtype=dtype)
    with pytest.raises(TypeError, match=re.escape(message)):
        retention(_z(1, 2, 1, 1), _z(1, 2, 1, 1), _z(1, 2, 1, 1), compute_dtype=dtype)
    with pytest.raises(TypeError, match=re.escape(message)):
        selective_scan(_z(1, 2, 3), _z(1, 2, 3), _z(2, 4), _z(1, 4, 3), _z(1, 4, 3), compute_dtype=dtype)
    with pytest.raises(TypeError, match=re.escape(message)):
        group_norm(_z(2, 3), 1e-6, compute_dtype=dtype)


# ----------------------------------------------------------------------------------------------------
# selective_scan: u, delta (batch=2, dim=4, L=5); A (4, N=3); B, C (2, 3, 5)

SELECTIVE = [selective_scan, selective_scan_trace]


def _selective(**overrides) -> dict:
    args = {"u": _z(2, 4, 5), "delta": _z(2, 4, 5), "A": _z(4, 3), "B": _z(2, 3, 5), "C": _z(2, 3, 5)}
    args.update(overrides)
    return args


@pytest.mark.parametrize("fn", SELECTIVE)
@pytest.mark.parametrize(
    "overrides, error, message",
    [
        ({"u": _z(2, 4)}, ValueError, "u.shape=(2, 4) has 2 dimension(s); expected 3: (batch, dim, L)"),
        ({"delta": _z(2, 4, 6)}, ValueError, "delta.shape=(2, 4, 6) does not match: expected u.shape (batch, dim, L) = (2, 4, 5)"),
        ({"A": _z(3, 3)}, ValueError, "A.shape=(3, 3) does not match: expected (dim, N) with dim=4 (u.shape[1])"),
        ({"A": _z(4)}, ValueError, "A.shape=(4,) has 1 dimension(s); expected 2: (dim, N)"),
        ({"A": _z(4, 0)}, ValueError, "A.shape=(4, 0) has N=0; expected N >= 1"),
        ({"B": _z(2, 4, 5)}, ValueError, "B.shape=(2, 4, 5) does not match: expected (batch, N, L) = (2, 3, 5) or grouped (batch, G, N, L)"),
        ({"B": _z(1, 3, 5)}, ValueError, "B.shape=(1, 3, 5) does not match: expected (batch, N, L) = (2, 3, 5)"),
        ({"C": _z(2, 3, 4)}, ValueError, "C.shape=(2, 3, 4) does not match: expected (batch, N, L) = (2, 3, 5) or grouped (batch, G, N, L)"),
        ({"C": _z(2, 3, 5, 1, 1)}, ValueError, "C.shape=(2, 3, 5, 1, 1) does not match: expected (batch, N, L) = (2, 3, 5)"),
        ({"B": _z(2, 3, 3, 5)}, ValueError, "B.shape=(2, 3, 3, 5) has G=3 groups, which does not divide dim=4; expected G >= 1 with dim % G == 0"),
        ({"C": _z(2, 0, 3, 5)}, ValueError, "C.shape=(2, 0, 3, 5) has G=0 groups, which does not divide dim=4"),
        ({"B": _z(2, 2, 4, 5)}, ValueError, "B.shape=(2, 2, 4, 5) does not match: expected grouped (batch, G, N, L) = (2, 2, 3, 5)"),
        ({"D": _z(4, 1)}, ValueError, "D.shape=(4, 1) does not match: expected (dim,) = (4,)"),
        ({"z": _z(2, 4, 4)}, ValueError, "z.shape=(2, 4, 4) does not match: expected u.shape (batch, dim, L) = (2, 4, 5)"),
        ({"delta_bias": _z(3)}, ValueError, "delta_bias.shape=(3,) does not match: expected (dim,) = (4,)"),
        ({"B": _z(2, 3, 5, dtype=torch.int32)}, TypeError, "B.dtype=torch.int32 is not a real floating dtype"),
        ({"A": 0.5}, TypeError, "A is a float; expected a torch.Tensor"),
        ({"D": _z(4, dtype=torch.int64)}, TypeError, "D.dtype=torch.int64"),
    ],
)
def test_selective_scan_rejects(fn, overrides, error, message):
    with pytest.raises(error, match=re.escape(message)):
        fn(**_selective(**overrides))


def test_selective_scan_accepts_grouped_B_and_C_separately():
    y = selective_scan(**_selective(B=_z(2, 2, 3, 5), C=_z(2, 4, 3, 5)))
    assert y.shape == (2, 4, 5)


# ----------------------------------------------------------------------------------------------------
# retention: q, k (batch=2, L=5, heads=3, dk=4); v (2, 5, 3, dv=6)

RETENTION = [retention, retention_trace]


def _retention(**overrides) -> dict:
    args = {"q": _z(2, 5, 3, 4), "k": _z(2, 5, 3, 4), "v": _z(2, 5, 3, 6)}
    args.update(overrides)
    return args


@pytest.mark.parametrize("fn", RETENTION)
@pytest.mark.parametrize(
    "overrides, error, message",
    [
        ({"q": _z(2, 5, 3)}, ValueError, "q.shape=(2, 5, 3) has 3 dimension(s); expected 4: (batch, L, heads, dk)"),
        ({"k": _z(2, 5, 3, 5)}, ValueError, "k.shape=(2, 5, 3, 5) does not match: expected q.shape (batch, L, heads, dk) = (2, 5, 3, 4)"),
        ({"v": _z(2, 5, 6)}, ValueError, "v.shape=(2, 5, 6) has 3 dimension(s); expected 4: (batch, L, heads, dv)"),
        ({"v": _z(1, 5, 3, 6)}, ValueError, "v.shape=(1, 5, 3, 6) does not match: expected (batch, L, heads, dv) = (2, 5, 3, dv)"),
        ({"v": _z(2, 4, 3, 6)}, ValueError, "v.shape=(2, 4, 3, 6) does not match: expected (batch, L, heads, dv) = (2, 5, 3, dv)"),
        ({"v": _z(2, 5, 2, 6)}, ValueError, "v.shape=(2, 5, 2, 6) does not match: expected (batch, L, heads, dv) = (2, 5, 3, dv)"),
        ({"q": _z(2, 5, 3, 0), "k": _z(2, 5, 3, 0)}, ValueError, "q.shape=(2, 5, 3, 0) has dk=0; expected dk >= 1"),
        ({"v": _z(2, 5, 3, 0)}, ValueError, "v.shape=(2, 5, 3, 0) has dv=0; expected dv >= 1"),
        ({"gamma": [0.9, 0.9]}, ValueError, "gamma=[0.9, 0.9] has 2 value(s); expected one per head (heads=3)"),
        ({"gamma": torch.ones(4, dtype=F64)}, ValueError, "gamma.shape=(4,) does not match: expected one value per head, (heads,) = (3,)"),
        ({"gamma": torch.ones(3, 1, dtype=F64)}, ValueError, "gamma.shape=(3, 1) does not match"),
        ({"gamma": torch.ones(3, dtype=torch.int64)}, TypeError, "gamma.dtype=torch.int64 is not a real floating dtype"),
        ({"gamma": 0.9}, TypeError, "gamma=0.9 is a float; expected a sequence of 3 floats or a tensor of shape (3,)"),
        ({"gamma": "abc"}, TypeError, "gamma='abc' is a str"),
        ({"gamma": [0.9, "x", 0.9]}, TypeError, "gamma[1]='x' is a str; expected a real number"),
        ({"scale": "0.5"}, TypeError, "scale='0.5' is a str; expected a real number"),
        ({"scale": torch.tensor([0.5, 0.5])}, TypeError, "scale=tensor([0.5000, 0.5000]) is a Tensor of shape (2,); expected a real number"),
        ({"scale": True}, TypeError, "scale=True is a bool; expected a real number"),
        ({"q": _z(2, 5, 3, 4, dtype=torch.float16).to(torch.int8)}, TypeError, "q.dtype=torch.int8"),
    ],
)
def test_retention_rejects(fn, overrides, error, message):
    with pytest.raises(error, match=re.escape(message)):
        fn(**_retention(**overrides))


NORMED = [retention_normed, retention_normed_trace]


@pytest.mark.parametrize("fn", NORMED)
@pytest.mark.parametrize(
    "eps, kind, error, message",
    [
        (-1e-6, "rms", ValueError, "eps=-1e-06 must be finite and >= 0"),
        (float("nan"), "rms", ValueError, "eps=nan must be finite and >= 0"),
        (float("inf"), "layer", ValueError, "eps=inf must be finite and >= 0"),
        ("1e-6", "rms", TypeError, "eps='1e-6' is a str; expected a real number"),
        (1e-6, "group", ValueError, "kind='group' is not a group-norm kind; expected 'rms'"),
    ],
)
def test_retention_normed_rejects(fn, eps, kind, error, message):
    with pytest.raises(error, match=re.escape(message)):
        fn(**_retention(), eps=eps, kind=kind)


@pytest.mark.parametrize("fn", NORMED)
def test_retention_normed_checks_the_retention_arguments_too(fn):
    with pytest.raises(ValueError, match=re.escape("gamma=[0.9] has 1 value(s); expected one per head (heads=3)")):
        fn(**_retention(), eps=1e-6, gamma=[0.9])


@pytest.mark.parametrize(
    "o, eps, kind, error, message",
    [
        (torch.tensor(1.0, dtype=F64), 1e-6, "rms", ValueError, "o.shape=() has no axis to normalize; expected (..., dv)"),
        (_z(2, 0), 1e-6, "rms", ValueError, "o.shape=(2, 0) has dv=0; expected dv >= 1"),
        (_z(2, 3), -1.0, "rms", ValueError, "eps=-1.0 must be finite and >= 0"),
        (_z(2, 3), 1e-6, "RMS", ValueError, "kind='RMS' is not a group-norm kind"),
        (_z(2, 3, dtype=torch.int64), 1e-6, "rms", TypeError, "o.dtype=torch.int64 is not a real floating dtype"),
        ([1.0, 2.0], 1e-6, "rms", TypeError, "o is a list; expected a torch.Tensor"),
    ],
)
def test_group_norm_rejects(o, eps, kind, error, message):
    with pytest.raises(error, match=re.escape(message)):
        group_norm(o, eps, kind)


def test_scalar_tensors_are_accepted_as_numbers():
    q, k, v = (torch.ones(1, 2, 1, 2, dtype=F64) for _ in range(3))
    _ = retention(q, k, v, scale=torch.tensor(0.5)), retention_normed(q, k, v, eps=torch.tensor(1e-6))
    assert torch.equal(retention(q, k, v, scale=torch.tensor(0.5)), retention(q, k, v, scale=0.5))


def test_valid_inputs_in_any_floating_dtype_are_accepted():
    """The oracle upcasts what a kernel was given (float16, bfloat16, float32) to float64."""
    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        assert linear_recurrence(_z(1, 2, 3, dtype=dtype), _z(1, 2, 3, dtype=dtype)).dtype == F64
        assert retention(_z(1, 2, 1, 2, dtype=dtype), _z(1, 2, 1, 2, dtype=dtype), _z(1, 2, 1, 3, dtype=dtype)).dtype == F64
        assert selective_scan(**{k: v.to(dtype) for k, v in _selective().items()}).dtype == F64


def test_inputs_that_require_grad_are_accepted():
    """The oracles are not differentiable; they run under no_grad whatever the inputs say."""
    a = torch.rand(1, 2, 5, dtype=F64, requires_grad=True)
    assert not linear_recurrence(a, a).requires_grad
    assert not linear_recurrence_trace(a, a).growth.requires_grad
    args = {k: v.clone().requires_grad_() for k, v in _selective().items()}
    assert not selective_scan(**args).requires_grad
    q = torch.rand(1, 3, 2, 2, dtype=F64, requires_grad=True)
    assert not retention_normed(q, q, q, eps=1e-6).requires_grad
    assert not group_norm(q, 1e-6).requires_grad
