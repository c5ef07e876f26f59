"""Identities the oracles must satisfy, checked with hypothesis on small shapes.

- Each oracle is, bit for bit, the plain per-step loop written out independently below (in float64,
  float32, float16 and bfloat16, and across block boundaries): blocking and vectorizing changed nothing.
  For the selective scan that holds with A = 0; otherwise up to an ulp of each ``exp``, whose torch CPU
  result can depend on the tensor's shape (vectorized body vs scalar tail), not on the order of work.
- Retention equals its parallel masked-matrix form; the selective scan with A = 0 is a cumulative sum;
  with delta = 0 its state stays zero; grouped B/C select the right channels; the last state is the
  state behind y[..., L-1]; h0 is a leading step of the linear recurrence.
- A run in float32 / float16 / bfloat16 stays within u(dtype) * (growth + magnitude) of the oracle.
- The trace's fields have out's shape, are nonnegative, non-decreasing where they are running maxima,
  and bound |out|.
- Memory does not grow with L beyond the inputs and outputs (measured in a subprocess).
- A CUDA run of the same code (skipped without a CUDA device).
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from reference_impls import (
    _loop,
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

HYPOTHESIS = settings(max_examples=50, deadline=None)
#: Peak memory a trace run may add per extra step, in units of its output bytes per step (measured about
#: 1.0: the outputs themselves), and a fixed allowance for the allocator's noise.
MEMORY_OUTPUTS = 2.0
MEMORY_NOISE = 16 << 20
F64 = torch.float64
UNIT_ROUNDOFF = {torch.float64: 2.0**-53, torch.float32: 2.0**-24, torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8}
LOW_DTYPES = [torch.float32, torch.float16, torch.bfloat16]
ALL_DTYPES = [torch.float64, *LOW_DTYPES]


def _assert_bitwise(actual: torch.Tensor, expected: torch.Tensor) -> None:
    __tracebackhide__ = True
    torch.testing.assert_close(actual, expected, rtol=0, atol=0, equal_nan=True)


@contextlib.contextmanager
def _block_elements(value: int):
    """Make the oracles' blocks small so that block boundaries fall inside short sequences."""
    saved = _loop.BLOCK_ELEMENTS
    _loop.BLOCK_ELEMENTS = value
    try:
        yield
    finally:
        _loop.BLOCK_ELEMENTS = saved


def _rand(g: torch.Generator, *shape: int) -> torch.Tensor:
    return torch.randn(shape, generator=g, dtype=F64)


def _uniform(g: torch.Generator, lo: float, hi: float, *shape: int) -> torch.Tensor:
    return lo + (hi - lo) * torch.rand(shape, generator=g, dtype=F64)


# ----------------------------------------------------------------------------------------------------
# Problems (drawn shapes, inputs from a seeded generator)


@st.composite
def linear_problems(draw, max_length: int = 24) -> dict:
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    batch, channels, length = draw(st.integers(1, 3)), draw(st.integers(1, 4)), draw(st.integers(1, max_length))
    a = _uniform(g, -1.1, 1.1, batch, channels, length)
    b = _rand(g, batch, channels, length)
    h0 = _rand(g, batch, channels) if draw(st.booleans()) else None
    return {"a": a, "b": b, "h0": h0}


@st.composite
def selective_problems(draw, max_length: int = 16) -> dict:
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    batch, n_state, length = draw(st.integers(1, 2)), draw(st.integers(1, 4)), draw(st.integers(1, max_length))
    dim = draw(st.sampled_from([1, 2, 4, 6]))
    groups_b = draw(st.sampled_from([None] + [x for x in (1, 2, 3, 6) if dim % x == 0]))
    groups_c = draw(st.sampled_from([None] + [x for x in (1, 2, 3, 6) if dim % x == 0]))
    softplus = draw(st.booleans())
    u = _rand(g, batch, dim, length)
    delta = _uniform(g, -1.0, 1.0, batch, dim, length) if softplus else _uniform(g, 0.0, 1.0, batch, dim, length)

    def bc(groups):
        return _rand(g, batch, n_state, length) if groups is None else _rand(g, batch, groups, n_state, length)

    return {
        "u": u,
        "delta": delta,
        "A": -_uniform(g, 0.1, 2.0, dim, n_state),
        "B": bc(groups_b),
        "C": bc(groups_c),
        "D": _rand(g, dim) if draw(st.booleans()) else None,
        "z": _rand(g, batch, dim, length) if draw(st.booleans()) else None,
        "delta_bias": _uniform(g, -0.5, 0.5, dim) if draw(st.booleans()) else None,
        "delta_softplus": softplus,
    }


@st.composite
def retention_problems(draw, max_length: int = 16) -> dict:
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    batch, length, heads = draw(st.integers(1, 2)), draw(st.integers(1, max_length)), draw(st.integers(1, 3))
    dk, dv = draw(st.integers(1, 5)), draw(st.integers(1, 5))
    custom = draw(st.booleans())
    return {
        "q": _rand(g, batch, length, heads, dk),
        "k": _rand(g, batch, length, heads, dk),
        "v": _rand(g, batch, length, heads, dv),
        "gamma": _uniform(g, 0.2, 1.0, heads) if custom else None,
        "scale": float(_uniform(g, 0.1, 2.0)) if custom else None,
    }


# ----------------------------------------------------------------------------------------------------
# The plain loops, written independently of the oracles' blocked form


def plain_linear(a, b, h0=None, dtype=F64):
    a, b = a.to(dtype), b.to(dtype)
    h = torch.zeros(a.shape[:2], dtype=dtype) if h0 is None else h0.to(dtype)
    out = []
    for t in range(a.shape[-1]):
        h = a[..., t] * h + b[..., t]
        out.append(h)
    return torch.stack(out, -1)


def _sum_left_to_right(x: torch.Tensor, dim: int) -> torch.Tensor:
    acc = x.select(dim, 0)
    for i in range(1, x.shape[dim]):
        acc = acc + x.select(dim, i)
    return acc


def plain_selective(u, delta, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False, dtype=F64):
    u, delta, A, B, C, D, z, delta_bias = (None if x is None else x.to(dtype) for x in (u, delta, A, B, C, D, z, delta_bias))
    batch, dim, length = u.shape
    B = B[:, None] if B.ndim == 3 else B
    C = C[:, None] if C.ndim == 3 else C
    group_b = [d // (dim // B.shape[1]) for d in range(dim)]
    group_c = [d // (dim // C.shape[1]) for d in range(dim)]
    dp = delta if delta_bias is None else delta + delta_bias[:, None]
    if delta_softplus:
        dp = F.softplus(dp)
    h = torch.zeros((batch, dim, A.shape[1]), dtype=dtype)
    ys = []
    for t in range(length):
        decay = torch.exp(dp[:, :, t, None] * A)
        h = decay * h + (dp[:, :, t] * u[:, :, t])[:, :, None] * B[:, group_b, :, t]
        ys.append(_sum_left_to_right(C[:, group_c, :, t] * h, -1))
    y = torch.stack(ys, -1) if ys else torch.zeros_like(u)
    if D is not None:
        y = y + D[:, None] * u
    if z is not None:
        y = y * F.silu(z)
    return y, h


def plain_retention(q, k, v, gamma=None, scale=None, dtype=F64):
    batch, length, heads, dk = q.shape
    gamma = torch.tensor([1 - 2.0 ** (-5 - h) for h in range(heads)]) if gamma is None else torch.as_tensor(gamma)
    scale = dk**-0.5 if scale is None else scale
    q, k, v, gamma = q.to(dtype), k.to(dtype), v.to(dtype), gamma.to(dtype)
    S = torch.zeros((batch, heads, dk, v.shape[-1]), dtype=dtype)
    out = []
    for t in range(length):
        S = gamma[:, None, None] * S + k[:, t, :, :, None] * v[:, t, :, None, :]
        out.append(_sum_left_to_right(q[:, t, :, :, None] * S, -2) * scale)
    return torch.stack(out, 1)


# ----------------------------------------------------------------------------------------------------
# The oracles are the plain loops


@HYPOTHESIS
@given(problem=linear_problems(), dtype=st.sampled_from(ALL_DTYPES), block=st.sampled_from([1, 7, 1 << 18]))
def test_linear_recurrence_is_the_plain_loop(problem, dtype, block):
    with _block_elements(block):
        _assert_bitwise(linear_recurrence(**problem, compute_dtype=dtype), plain_linear(**problem, dtype=dtype))


@HYPOTHESIS
@given(problem=selective_problems(), dtype=st.sampled_from(ALL_DTYPES), block=st.sampled_from([1, 50, 1 << 18]))
def test_selective_scan_is_the_plain_loop(problem, dtype, block):
    """Bit for bit with A = 0 (exp(0) = 1 on every code path).

    With A != 0 the per-step ``exp`` is evaluated on tensors of other shapes here and in the oracle's
    blocks, and torch's CPU exp may differ by an ulp between its vectorized body and its scalar tail:
    `test_selective_scan_is_the_plain_loop_up_to_exp` covers that case.
    """
    problem = {**problem, "A": torch.zeros_like(problem["A"])}
    with _block_elements(block):
        y, last = selective_scan(**problem, return_last_state=True, compute_dtype=dtype)
    y_plain, last_plain = plain_selective(**problem, dtype=dtype)
    _assert_bitwise(y, y_plain)
    _assert_bitwise(last, last_plain)


def _assert_within(actual: torch.Tensor, expected: torch.Tensor, scale: torch.Tensor) -> None:
    """``|actual - expected| <= u * scale`` (u = 2**-53), elementwise."""
    __tracebackhide__ = True
    ratio = (actual - expected).abs() / (2.0**-53 * scale)
    assert (ratio.nan_to_num(0.0) <= 1).all(), f"|difference| up to {float(ratio.max())} u * scale"


def _selective_scale(problem: dict) -> torch.Tensor:
    """growth + magnitude of the float64 trace: an ulp or so of each exp moves y by at most u times it."""
    trace = selective_scan_trace(**problem)
    return trace.growth + trace.magnitude


@HYPOTHESIS
@given(problem=selective_problems(), block=st.sampled_from([1, 50, 1 << 18]))
def test_selective_scan_is_the_plain_loop_up_to_exp(problem, block):
    with _block_elements(block):
        y = selective_scan(**problem)
    _assert_within(y, plain_selective(**problem)[0], _selective_scale(problem))


@HYPOTHESIS
@given(problem=retention_problems(), dtype=st.sampled_from(ALL_DTYPES), block=st.sampled_from([1, 60, 1 << 18]))
def test_retention_is_the_plain_loop(problem, dtype, block):
    with _block_elements(block):
        _assert_bitwise(retention(**problem, compute_dtype=dtype), plain_retention(**problem, dtype=dtype))


@HYPOTHESIS
@given(problem=retention_problems(), eps=st.sampled_from([0.0, 1e-6, 0.25]), kind=st.sampled_from(["rms", "layer"]))
def test_retention_normed_is_group_norm_of_retention(problem, eps, kind):
    o = retention(**problem)
    normed = retention_normed(**problem, eps=eps, kind=kind)
    _assert_bitwise(normed, group_norm(o, eps, kind))
    trace = retention_normed_trace(**problem, eps=eps, kind=kind)
    _assert_bitwise(trace.out, normed)
    # the definition, written out
    centred = o - o.mean(-1, keepdim=True) if kind == "layer" else o
    expected = centred / ((centred * centred).mean(-1, keepdim=True) + eps).sqrt()
    torch.testing.assert_close(normed, expected, rtol=1e-12, atol=1e-12, equal_nan=True)


def test_traces_output_is_the_oracle():
    g = torch.Generator().manual_seed(0)
    a, b = _uniform(g, -1, 1, 2, 3, 40), _rand(g, 2, 3, 40)
    _assert_bitwise(linear_recurrence_trace(a, b).out, linear_recurrence(a, b))
    q, k, v = _rand(g, 2, 30, 2, 3), _rand(g, 2, 30, 2, 3), _rand(g, 2, 30, 2, 4)
    _assert_bitwise(retention_trace(q, k, v).out, retention(q, k, v))
    u, delta, A, B, C = _rand(g, 2, 4, 30), _uniform(g, 0, 1, 2, 4, 30), -_uniform(g, 0, 1, 4, 3), _rand(g, 2, 3, 30), _rand(g, 2, 3, 30)
    _assert_bitwise(selective_scan_trace(u, delta, A, B, C, z=u).out, selective_scan(u, delta, A, B, C, z=u))


# ----------------------------------------------------------------------------------------------------
# Mathematical identities


@HYPOTHESIS
@given(problem=retention_problems())
def test_retention_equals_parallel_masked_form(problem):
    q, k, v = problem["q"], problem["k"], problem["v"]
    batch, length, heads, dk = q.shape
    gamma = torch.tensor([1 - 2.0 ** (-5 - h) for h in range(heads)], dtype=F64) if problem["gamma"] is None else problem["gamma"]
    scale = dk**-0.5 if problem["scale"] is None else problem["scale"]
    n = torch.arange(length)
    lag = (n[:, None] - n[None, :]).to(F64)  # n - m
    mask = torch.where(lag >= 0, gamma[:, None, None] ** lag.clamp_min(0), torch.zeros(()))  # (heads, L, L)
    scores = torch.einsum("bnhi,bmhi->bhnm", q, k) * mask
    parallel = scale * torch.einsum("bhnm,bmhj->bnhj", scores, v)
    trace = retention_trace(**problem)
    assert ((trace.out - parallel).abs() <= 1e-12 * trace.magnitude).all()


@HYPOTHESIS
@given(problem=selective_problems())
def test_selective_scan_with_zero_A_is_a_cumulative_sum(problem):
    problem = {**problem, "A": torch.zeros_like(problem["A"]), "D": None}
    u, delta, B, C = problem["u"], problem["delta"], problem["B"], problem["C"]
    batch, dim, length = u.shape
    B = (B[:, None] if B.ndim == 3 else B).repeat_interleave(dim // (1 if B.ndim == 3 else B.shape[1]), 1)
    C = (C[:, None] if C.ndim == 3 else C).repeat_interleave(dim // (1 if C.ndim == 3 else C.shape[1]), 1)
    dp = delta if problem["delta_bias"] is None else delta + problem["delta_bias"][:, None]
    if problem["delta_softplus"]:
        dp = F.softplus(dp)
    h = torch.cumsum((dp * u)[:, :, None, :] * B, dim=-1)  # (batch, dim, N, L)
    y = (C * h).sum(2)
    if problem["z"] is not None:
        y = y * F.silu(problem["z"])
    trace = selective_scan_trace(**problem)
    assert ((trace.out - y).abs() <= 1e-12 * trace.magnitude).all()


@HYPOTHESIS
@given(problem=selective_problems())
def test_selective_scan_with_zero_delta_keeps_the_state_zero(problem):
    problem = {**problem, "delta": torch.zeros_like(problem["delta"]), "delta_bias": None, "delta_softplus": False}
    y, last = selective_scan(**problem, return_last_state=True)
    assert (last == 0).all()
    u = problem["u"]
    expected = problem["D"][:, None] * u if problem["D"] is not None else torch.zeros_like(u)
    if problem["z"] is not None:
        expected = expected * F.silu(problem["z"])
    _assert_bitwise(y, expected)


def test_softplus_follows_mamba_threshold():
    """delta_softplus: x > 20 -> x exactly; otherwise log1p(exp(x)) (read back as y with A = 0, L = 1)."""
    one = torch.ones((1, 1, 1), dtype=F64)

    def softplus_seen(x: float) -> float:
        y = selective_scan(one, torch.full((1, 1, 1), x, dtype=F64), torch.zeros((1, 1), dtype=F64), one, one, delta_softplus=True)
        return float(y)  # y = C * (exp(0) * 0 + d' * u * B) = d'

    log1p_exp = lambda x: float(torch.log1p(torch.exp(torch.tensor(x, dtype=F64))))  # noqa: E731
    assert softplus_seen(25.0) == 25.0
    assert softplus_seen(20.5) == 20.5 != log1p_exp(20.5)
    assert softplus_seen(20.0) == log1p_exp(20.0) != 20.0
    assert softplus_seen(3.0) == log1p_exp(3.0)
    assert softplus_seen(-40.0) == float(torch.exp(torch.tensor(-40.0, dtype=F64)))  # log1p(e^-40) = e^-40


@HYPOTHESIS
@given(problem=selective_problems(), data=st.data())
def test_grouped_B_C_select_their_channels(problem, data):
    u, B, C = problem["u"], problem["B"], problem["C"]
    dim = u.shape[1]
    y = selective_scan(**problem)
    if B.ndim == 3:  # ungrouped == grouped with G = 1
        _assert_bitwise(selective_scan(**{**problem, "B": B[:, None]}), y)
    if C.ndim == 3:
        _assert_bitwise(selective_scan(**{**problem, "C": C[:, None]}), y)
    # every channel d computed alone, with its group's B and C, gives the same y[:, d]
    d = data.draw(st.integers(0, dim - 1), label="channel")
    pick = lambda x: None if x is None else x[d : d + 1]  # noqa: E731
    by_channel = lambda x: None if x is None else x[:, d : d + 1]  # noqa: E731
    group = lambda x: x if x.ndim == 3 else x[:, d // (dim // x.shape[1])]  # noqa: E731
    problem_of_channel = {
        "u": by_channel(u), "delta": by_channel(problem["delta"]), "A": pick(problem["A"]), "B": group(B),
        "C": group(C), "D": pick(problem["D"]), "z": by_channel(problem["z"]),
        "delta_bias": pick(problem["delta_bias"]), "delta_softplus": problem["delta_softplus"],
    }
    alone = selective_scan(**problem_of_channel)
    # the channel alone evaluates exp and silu on tensors of another shape: equal up to their ulps
    _assert_within(alone, y[:, d : d + 1], _selective_scale(problem_of_channel))


@HYPOTHESIS
@given(problem=selective_problems())
def test_last_state_is_the_state_behind_the_last_output(problem):
    u, delta, A, B, C, D, z, bias = (problem[k] for k in ("u", "delta", "A", "B", "C", "D", "z", "delta_bias"))
    y, last = selective_scan(**problem, return_last_state=True)
    batch, dim, length = u.shape
    n_state = A.shape[1]
    Cc = (C[:, None] if C.ndim == 3 else C).repeat_interleave(dim // (1 if C.ndim == 3 else C.shape[1]), 1)
    y_last = _sum_left_to_right(Cc[..., -1] * last, -1)
    if D is not None:
        y_last = y_last + D * u[..., -1]
    if z is None:
        _assert_bitwise(y[..., -1], y_last)
    else:  # silu evaluated on another shape: up to its ulp
        y_last = y_last * F.silu(z[..., -1])
        _assert_within(y[..., -1], y_last, _selective_scale(problem)[..., -1])
    # the state is the linear recurrence with a = exp(d' A), b = d' u B, one per (channel, n)
    dp = delta if bias is None else delta + bias[:, None]
    if problem["delta_softplus"]:
        dp = F.softplus(dp)
    Bc = (B[:, None] if B.ndim == 3 else B).repeat_interleave(dim // (1 if B.ndim == 3 else B.shape[1]), 1)
    a = torch.exp(dp[:, :, None, :] * A[None, :, :, None]).reshape(batch, dim * n_state, length)
    b = ((dp * u)[:, :, None, :] * Bc).reshape(batch, dim * n_state, length)
    trace = linear_recurrence_trace(a, b)
    scale = (trace.growth + trace.magnitude)[..., -1].reshape(batch, dim, n_state)
    _assert_within(last, trace.out[..., -1].reshape(batch, dim, n_state), scale)


@HYPOTHESIS
@given(problem=linear_problems())
def test_h0_is_a_leading_step(problem):
    a, b, h0 = problem["a"], problem["b"], problem["h0"]
    h0 = torch.zeros(a.shape[:2], dtype=F64) if h0 is None else h0
    lead_a = torch.cat([torch.zeros_like(a[..., :1]), a], -1)  # h_{-1} = 0 * 0 + h0
    lead_b = torch.cat([h0[..., None], b], -1)
    _assert_bitwise(linear_recurrence(a, b, h0), linear_recurrence(lead_a, lead_b)[..., 1:])


def test_empty_lengths_and_batches():
    empty = torch.zeros((2, 3, 0), dtype=F64)
    assert linear_recurrence(empty, empty).shape == (2, 3, 0)
    assert linear_recurrence_trace(empty, empty).state_peak.shape == (2, 3, 0)
    A, BC = -torch.ones((3, 2), dtype=F64), torch.zeros((2, 2, 0), dtype=F64)
    y, last = selective_scan(empty, empty, A, BC, BC, return_last_state=True)
    assert y.shape == (2, 3, 0) and (last == 0).all() and last.shape == (2, 3, 2)
    assert selective_scan_trace(empty, empty, A, BC, BC).growth.shape == (2, 3, 0)
    q = torch.zeros((0, 5, 2, 3), dtype=F64)
    assert retention_trace(q, q, q).out.shape == (0, 5, 2, 3)


# ----------------------------------------------------------------------------------------------------
# Lower precision: the same loop in another dtype stays within u * (growth + magnitude)


def _within_growth(low: torch.Tensor, trace, dtype: torch.dtype, factor: float = 2.0) -> None:
    __tracebackhide__ = True
    err = (low.double() - trace.out).abs()
    bound = factor * UNIT_ROUNDOFF[dtype] * (trace.growth + trace.magnitude)
    worst = float((err / bound).nan_to_num(0.0).max())
    assert (err <= bound).all(), f"{dtype}: error up to {worst} x {factor} u (growth + magnitude)"


def _representable(problem: dict, dtype: torch.dtype) -> dict:
    """The problem with every tensor rounded to ``dtype`` (so the oracle sees the kernel's values)."""
    return {k: v.to(dtype).double() if isinstance(v, torch.Tensor) else v for k, v in problem.items()}


@HYPOTHESIS
@given(problem=linear_problems(max_length=64), dtype=st.sampled_from(LOW_DTYPES))
def test_linear_recurrence_in_lower_precision(problem, dtype):
    problem = _representable(problem, dtype)
    _within_growth(linear_recurrence(**problem, compute_dtype=dtype), linear_recurrence_trace(**problem), dtype)


@HYPOTHESIS
@given(problem=selective_problems(max_length=32), dtype=st.sampled_from(LOW_DTYPES))
def test_selective_scan_in_lower_precision(problem, dtype):
    problem = _representable(problem, dtype)
    _within_growth(selective_scan(**problem, compute_dtype=dtype), selective_scan_trace(**problem), dtype)


@HYPOTHESIS
@given(problem=retention_problems(max_length=32), dtype=st.sampled_from(LOW_DTYPES))
def test_retention_in_lower_precision(problem, dtype):
    problem = _representable(problem, dtype)
    if problem["gamma"] is None:  # the dtype's own gammas, so the oracle sees the values the loop uses
        problem["gamma"] = torch.tensor([1 - 2.0 ** (-5 - h) for h in range(problem["q"].shape[2])]).to(dtype).double()
    _within_growth(retention(**problem, compute_dtype=dtype), retention_trace(**problem), dtype)


@HYPOTHESIS
@given(problem=retention_problems(max_length=32), dtype=st.sampled_from(LOW_DTYPES), kind=st.sampled_from(["rms", "layer"]))
def test_retention_normed_in_lower_precision(problem, dtype, kind):
    problem = _representable(problem, dtype)
    heads = problem["q"].shape[2]
    problem["gamma"] = torch.tensor([1 - 2.0 ** (-5 - h) for h in range(heads)]).to(dtype).double() if problem["gamma"] is None else problem["gamma"]
    eps = 1e-2  # representable well enough in every dtype; keeps r away from 0
    low = retention_normed(**problem, eps=eps, kind=kind, compute_dtype=dtype)
    _within_growth(low, retention_normed_trace(**problem, eps=eps, kind=kind), dtype)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device; none is present on this machine")
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16])
def test_the_same_loop_runs_on_cuda(dtype):
    """The same-dtype baseline on the GPU: same code, output on the device, within u * (growth + magnitude)."""
    g = torch.Generator().manual_seed(0)
    lin = _representable({"a": _uniform(g, -1, 1, 2, 3, 200), "b": _rand(g, 2, 3, 200)}, dtype)
    ret = _representable({"q": _rand(g, 2, 50, 2, 4), "k": _rand(g, 2, 50, 2, 4), "v": _rand(g, 2, 50, 2, 3),
                          "gamma": [0.5, 0.75], "scale": 0.5}, dtype)
    sel = _representable({"u": _rand(g, 2, 4, 100), "delta": _uniform(g, 0, 1, 2, 4, 100), "A": -_uniform(g, 0.1, 1, 4, 3),
                          "B": _rand(g, 2, 2, 3, 100), "C": _rand(g, 2, 3, 100), "D": _rand(g, 4), "z": _rand(g, 2, 4, 100),
                          "delta_bias": _uniform(g, -0.5, 0.5, 4), "delta_softplus": True}, dtype)
    for fn, trace_fn, problem in ((linear_recurrence, linear_recurrence_trace, lin), (retention, retention_trace, ret),
                                  (selective_scan, selective_scan_trace, sel)):
        out = fn(**problem, compute_dtype=dtype, device="cuda")
        assert out.device.type == "cuda" and out.dtype == dtype
        _within_growth(out.cpu(), trace_fn(**problem), dtype, factor=4.0)


# ----------------------------------------------------------------------------------------------------
# The trace's fields


def _check_trace_fields(trace, state_axis: int) -> None:
    __tracebackhide__ = True
    for name in ("magnitude", "growth", "state_peak", "decay_peak"):
        field = getattr(trace, name)
        assert field.shape == trace.out.shape, name
        assert field.dtype == F64 and field.device.type == "cpu", name
        assert (field >= 0).all(), name
    assert (trace.magnitude >= trace.out.abs()).all()  # exact: same operations on absolute values
    assert (trace.growth >= trace.magnitude).all()
    for name in ("state_peak", "decay_peak"):
        field = getattr(trace, name)
        assert (field.diff(dim=state_axis) >= 0).all(), f"{name} must be a running maximum along t"


@HYPOTHESIS
@given(problem=linear_problems())
def test_linear_recurrence_trace_fields(problem):
    trace = linear_recurrence_trace(**problem)
    _check_trace_fields(trace, -1)
    assert (trace.state_peak >= trace.out.abs()).all()
    a = problem["a"].abs()
    assert (trace.decay_peak >= a).all()
    assert torch.equal(trace.decay_peak[..., 0], a[..., 0])


@HYPOTHESIS
@given(problem=selective_problems())
def test_selective_scan_trace_fields(problem):
    trace = selective_scan_trace(**problem)
    _check_trace_fields(trace, -1)
    dp = problem["delta"] if problem["delta_bias"] is None else problem["delta"] + problem["delta_bias"][:, None]
    if problem["delta_softplus"]:
        dp = F.softplus(dp)
    decay = torch.exp(dp[:, :, None, :] * problem["A"][None, :, :, None]).amax(2)  # (batch, dim, L)
    assert (trace.decay_peak >= decay * (1 - 2.0**-50)).all()  # exp on another shape: up to its ulp
    if (dp >= 0).all():  # A < 0, so every exp(d' A) <= 1 and so is every window product
        assert (trace.decay_peak <= 1).all()


@HYPOTHESIS
@given(problem=retention_problems(), eps=st.sampled_from([1e-6, 0.5]), kind=st.sampled_from(["rms", "layer"]))
def test_retention_trace_fields(problem, eps, kind):
    trace = retention_trace(**problem)
    _check_trace_fields(trace, 1)
    heads = problem["q"].shape[2]
    gamma = torch.tensor([1 - 2.0 ** (-5 - h) for h in range(heads)], dtype=F64) if problem["gamma"] is None else problem["gamma"]
    assert torch.equal(trace.decay_peak, gamma.view(1, 1, heads, 1).expand_as(trace.out))  # |gamma| <= 1
    normed = retention_normed_trace(**problem, eps=eps, kind=kind)
    _check_trace_fields(normed, 1)
    # the normed trace adds the norm's own intermediates (mean square and its reciprocal) to the peak
    assert bool((normed.state_peak >= trace.state_peak).all())


def test_decay_peak_is_the_largest_window_product():
    a = torch.tensor([[[0.5, 3.0, 2.0, 0.1, 4.0, 0.9]]], dtype=F64)
    products = [max(float(torch.prod(a[0, 0, s : t + 1])) for s in range(t + 1)) for t in range(6)]
    running = torch.cummax(torch.tensor(products, dtype=F64), 0).values
    _assert_bitwise(linear_recurrence_trace(a, torch.zeros_like(a)).decay_peak[0, 0], running)


def test_state_peak_of_retention_is_per_output_column():
    q = torch.ones((1, 2, 1, 2), dtype=F64)
    k = torch.tensor([[[[1.0, 0.0]], [[0.0, 0.0]]]], dtype=F64)
    v = torch.tensor([[[[2.0, -5.0]], [[0.0, 1.0]]]], dtype=F64)
    trace = retention_trace(q, k, v, gamma=[0.5], scale=1.0)
    # S_0 = [[2, -5], [0, 0]]; S_1 = 0.5 S_0 + [[0, 0], [0, 0]]
    _assert_bitwise(trace.state_peak[0, :, 0], torch.tensor([[2.0, 5.0], [2.0, 5.0]], dtype=F64))
    _assert_bitwise(trace.out[0, :, 0], torch.tensor([[2.0, -5.0], [1.0, -2.5]], dtype=F64))


# ----------------------------------------------------------------------------------------------------
# Bounded memory

_MEMORY_PROBE = textwrap.dedent(
    """
    import ctypes, json, os, resource, sys, torch
    import reference_impls as R

    try:  # hand freed heap back to the OS before measuring, so that reused pages do not hide growth
        malloc_trim = ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):
        malloc_trim = lambda pad: 0

    PAGE = os.sysconf("SC_PAGE_SIZE")

    def rss_now():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * PAGE

    def rss_peak():  # ru_maxrss is in KiB on Linux
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

    def problem(family, length):
        g = torch.Generator().manual_seed(0)
        randn = lambda *s: torch.randn(s, generator=g, dtype=torch.float64)
        rand = lambda *s: torch.rand(s, generator=g, dtype=torch.float64)
        if family == "linear_recurrence":
            batch, channels = 1, 256
            return R.linear_recurrence_trace, (rand(batch, channels, length), randn(batch, channels, length)), 0
        if family == "selective_scan":
            batch, dim, n = 1, 8, 256
            args = (randn(batch, dim, length), rand(batch, dim, length), -rand(dim, n), randn(batch, n, length),
                    randn(batch, n, length), randn(dim), randn(batch, dim, length))
            return R.selective_scan_trace, args, batch * dim * n * 8
        batch, heads, dk, dv = 1, 2, 64, 64
        args = (randn(batch, length, heads, dk), randn(batch, length, heads, dk), randn(batch, length, heads, dv))
        return R.retention_trace, args, batch * heads * dk * dv * 8

    family, lengths = sys.argv[1], [int(x) for x in sys.argv[2:]]
    fn, args, _ = problem(family, 8)
    torch.set_num_threads(1)  # this process only: steadier timing when other processes share the cores
    fn(*args)  # warm up: kernels, allocator
    growth = []
    for length in lengths:  # increasing, so each run's peak is its own
        fn, args, state_bytes = problem(family, length)
        malloc_trim(0)
        before = rss_now()
        trace = fn(*args)
        growth.append(rss_peak() - before)
        output_bytes = 5 * trace.out[..., 0].numel() * 8 if family != "retention" else 5 * trace.out[:, 0].numel() * 8
        del trace, args
    print(json.dumps({"lengths": lengths, "growth": growth, "state_bytes_per_step": state_bytes,
                      "output_bytes_per_step": output_bytes}))
    """
)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/statm and ru_maxrss in KiB")
@pytest.mark.parametrize(
    "family, short, long",
    [("linear_recurrence", 1 << 11, 1 << 13), ("selective_scan", 1 << 11, 1 << 13), ("retention", 1 << 10, 1 << 12)],
)
@pytest.mark.e2e
def test_trace_memory_grows_with_length_only_as_the_outputs(family, short, long):
    """Peak memory added by the extra steps stays a small multiple of the outputs' bytes.

    Measured in a fresh subprocess (torch's CPU tensors are invisible to tracemalloc): the peak RSS a
    trace run adds, at two lengths; the difference is what grows with L, the block buffers being a
    fixed cost. ``MEMORY_NOISE`` absorbs the allocator's reuse of freed pages. A state kept for every
    step would add ``state_bytes_per_step`` per step, at least twice the allowance for selective scan
    and retention; for the linear recurrence the state is the output, and the check bounds the number
    of length-sized temporaries.
    """
    root = Path(__file__).resolve().parents[1]
    proc = subprocess.run(
        [sys.executable, "-c", _MEMORY_PROBE, family, str(short), str(long)],
        cwd=root, capture_output=True, text=True, timeout=300, check=False,
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    extra_steps = long - short
    added = result["growth"][1] - result["growth"][0]
    allowed = MEMORY_OUTPUTS * result["output_bytes_per_step"] * extra_steps + MEMORY_NOISE
    assert added <= allowed, f"{family}: {extra_steps} more steps added {added} bytes of peak memory > {allowed} ({result})"
    if result["state_bytes_per_step"]:
        assert result["state_bytes_per_step"] * extra_steps >= 2 * allowed, "the probe must see an (L x state) tensor"
