"""`measure`'s compiled pass (`harness._compiled_measure`) against its general torch code.

The compiled pass takes the common case (everything in range) and must give the numbers the general
code gives: the counts, maxima, positions, quantiles and per-position maxima exactly, the norm-based
fields to rounding. Each case below is measured twice, once with the compiled pass switched off.
"""

from __future__ import annotations

import math
import zlib

import numpy as np
import pytest
import torch

from harness import _compiled_measure, metrics
from harness.metrics import measure
from reference_impls.trace import Trace

pytestmark = pytest.mark.skipif(not _compiled_measure.AVAILABLE, reason="numba is not installed")

#: Fields whose value depends on the order of a long sum (rounding only).
SUMMED = {"rms_ratio", "cosine"}


def _case(shape, length_axis, dtype, seed, *, scale=1.0, bug=0.0, ties=False, underflow=False):
    """A float64 output with a trace, a kernel output in ``dtype`` and a same-dtype baseline."""
    gen = torch.Generator().manual_seed(seed)
    out = torch.randn(shape, dtype=torch.float64, generator=gen) * scale
    if underflow:  # values below the dtype's smallest subnormal, which a kernel may flush to zero
        out.view(-1)[3::7] = torch.finfo(getattr(torch, dtype)).smallest_normal * 2.0**-40
    mag = out.abs() * (1 + torch.rand(shape, dtype=torch.float64, generator=gen))
    trace = Trace(out=out, magnitude=mag, growth=mag * 3, state_peak=mag.cummax(dim=length_axis).values,
                  decay_peak=torch.rand(shape, dtype=torch.float64, generator=gen) + 0.5)
    x = out.to(getattr(torch, dtype))
    if not ties:  # rounding noise of a few ulps on top of the rounded oracle
        noise = torch.randn(shape, dtype=torch.float64, generator=gen) * torch.finfo(x.dtype).eps * 0.5
        x = (out * (1 + noise)).to(x.dtype)
    if bug:
        x.select(length_axis, shape[length_axis] - 1).mul_(1 + bug)  # the last step is wrong
    baseline = (out * (1 + 1e-3 * torch.rand(shape, dtype=torch.float64, generator=gen))).to(x.dtype)
    if underflow:
        x.view(-1)[3::7] = 0.0
    return x, trace, baseline


def _both(monkeypatch, *args, **kwargs):
    calls = []
    real = _compiled_measure.fast_pass

    def counted(*a, **k):
        got = real(*a, **k)
        calls.append(got is not None)
        return got

    monkeypatch.setattr(_compiled_measure, "fast_pass", counted)
    fast = measure(*args, **kwargs).to_dict()
    taken = list(calls)
    monkeypatch.setattr(_compiled_measure, "AVAILABLE", False)
    slow = measure(*args, **kwargs).to_dict()
    monkeypatch.setattr(_compiled_measure, "AVAILABLE", True)
    return fast, slow, taken


def _assert_same(fast, slow):
    for key, want in slow.items():
        got = fast[key]
        if key in SUMMED and isinstance(want, float) and math.isfinite(want):
            assert got == pytest.approx(want, rel=1e-9, abs=1e-300), key
        elif isinstance(want, float) and math.isnan(want):
            assert isinstance(got, float) and math.isnan(got), key
        else:
            assert got == want, key


@pytest.mark.parametrize("dtype", ["float64", "float32", "float16", "bfloat16"])
@pytest.mark.parametrize(
    "shape, axis",
    [((2, 3, 257), 2), ((1, 64, 4, 8), 1), ((3, 40, 2, 5), 1), ((1, 1, 1), 2), ((2, 70000), 1)],
)
@pytest.mark.parametrize("kind", ["noise", "bug", "ties", "underflow"])
def test_compiled_pass_gives_the_general_codes_numbers(monkeypatch, dtype, shape, axis, kind):
    seed = zlib.crc32(repr((dtype, shape, kind)).encode()) % 1000
    x, trace, baseline = _case(shape, axis, dtype, seed, bug=0.5 if kind == "bug" else 0.0,
                               ties=kind == "ties", underflow=kind == "underflow")
    fast, slow, calls = _both(monkeypatch, x, trace, dtype=dtype, baseline=baseline, length_axis=axis)
    assert calls == [True]  # the compiled pass took the case
    _assert_same(fast, slow)
    if kind == "bug":
        assert fast["n_mismatch"] > 0 and fast["onset_t"] == shape[axis] - 1
    if kind == "underflow" and dtype != "float64" and x.numel() > 3:  # (a float64 oracle is never below float64)
        assert fast["n_expected_underflow"] > 0


def test_ties_in_cond_pick_the_first_element_in_row_major_order(monkeypatch):
    # every element has the same cond error: the worst is element 0 along the output's (rows, L) order
    out = torch.ones(2, 3, 5, dtype=torch.float64)
    trace = Trace(out=out, magnitude=out.clone(), growth=out.clone(), state_peak=out.clone(), decay_peak=out.clone())
    x = out * 2
    fast, slow, calls = _both(monkeypatch, x, trace, dtype="float64")
    assert calls == [True]
    _assert_same(fast, slow)
    assert fast["worst_index"] == [0, 0, 0]


@pytest.mark.parametrize("spoil", ["nan", "inf", "state", "decay", "huge", "tiny_values"])
def test_out_of_range_cases_go_to_the_general_code(monkeypatch, spoil):
    x, trace, baseline = _case((2, 3, 64), 2, "float32", 5)
    if spoil == "nan":
        x[0, 1, 10] = math.nan
    elif spoil == "inf":
        x[1, 2, 3] = math.inf
    elif spoil == "state":
        trace.state_peak[0, 0, 40:] = 1e39  # beyond float32's range: out of domain from t = 40
    elif spoil == "decay":
        trace.decay_peak[1, 1, 7:] = math.inf
    elif spoil == "huge":  # plain sums of squares would overflow: the general code rescales them
        x, trace, baseline = _case((2, 3, 64), 2, "float64", 5, scale=1e150)
    else:
        x, trace, baseline = _case((2, 3, 64), 2, "float64", 5, scale=1e-120)
    dtype = str(x.dtype).removeprefix("torch.")
    fast, slow, calls = _both(monkeypatch, x, trace, dtype=dtype, baseline=baseline)
    assert calls == [False]
    _assert_same(fast, slow)


def test_a_norm_in_range_keeps_the_compiled_pass(monkeypatch):
    x, trace, baseline = _case((2, 3, 64), 2, "float32", 6)
    trace.norm_peak = torch.full_like(trace.out, 1e30)  # below float32's max: changes nothing
    fast, slow, calls = _both(monkeypatch, x, trace, dtype="float32", baseline=baseline)
    assert calls == [True]
    _assert_same(fast, slow)
    assert fast["n_out_of_domain"] == 0 and fast["norm_peak_max"] == 1e30


def test_a_norm_out_of_range_excludes_its_own_positions_only(monkeypatch):
    # unlike the state, whose peak carries to every later position of its row (a suffix)
    x, trace, baseline = _case((2, 3, 64), 2, "float32", 7)
    trace.norm_peak = torch.ones_like(trace.out)
    trace.norm_peak[0, 1, 5] = trace.norm_peak[1, 2, 30] = 1e39  # beyond float32's max at two elements
    x[0, 1, 40] *= 1.5  # a wrong element later in the first of those rows: still compared, still found
    fast, slow, calls = _both(monkeypatch, x, trace, dtype="float32", baseline=baseline)
    assert calls == []  # declined before the pass starts
    _assert_same(fast, slow)
    assert fast["n_out_of_domain"] == 2 and fast["n_rows_out_of_domain"] == 2
    assert fast["domain_cause"] == "norm" and fast["domain_onset_t"] == 5 and fast["norm_peak_max"] == 1e39
    assert fast["n_mismatch"] == 1 and fast["onset_t"] == 40
    state = Trace(**{**trace.__dict__, "norm_peak": None, "state_peak": trace.state_peak.clone()})
    state.state_peak[0, 1, 5:] = 1e39  # the same overflow in the state: the rest of the row goes with it
    as_state = measure(x, state, dtype="float32", baseline=baseline).to_dict()
    assert as_state["n_out_of_domain"] == 59 and as_state["domain_cause"] == "state" and as_state["n_mismatch"] == 0


def test_a_trace_without_a_norm_reports_no_norm_peak():
    x, trace, baseline = _case((2, 3, 16), 2, "float32", 8)
    got = measure(x, trace, dtype="float32", baseline=baseline)
    assert math.isnan(got.norm_peak_max)
    trace.norm_peak = torch.ones(2, 3, 15, dtype=torch.float64)
    with pytest.raises(Exception, match="trace.norm_peak must be a tensor of the output's shape"):
        measure(x, trace, dtype="float32")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_function_room_and_the_valid_bound_are_the_same_in_both_paths(monkeypatch, dtype):
    x, trace, baseline = _case((2, 3, 129), 2, dtype, 11)
    trace.growth.mul_(20.0)  # growth 60 magnitude: r = 2**-8 (60 + depth 8 + room 3) ~ 0.28 in bfloat16
    fast, slow, calls = _both(monkeypatch, x, trace, dtype=dtype, baseline=baseline, function_room=3.0)
    assert calls == [True]
    _assert_same(fast, slow)
    assert fast["function_room"] == 3.0 and fast["n_precision_exhausted"] == 0


def test_elements_without_a_guaranteed_digit_go_to_the_general_code(monkeypatch):
    # bfloat16 (u = 2**-8): growth 1200 magnitude from t = 40 puts r = u (1200 + 7) past 1/2 there
    x, trace, baseline = _case((2, 3, 64), 2, "bfloat16", 12)
    trace.growth[..., 40:] *= 400.0
    fast, slow, calls = _both(monkeypatch, x, trace, dtype="bfloat16", baseline=baseline)
    assert calls == [False]
    _assert_same(fast, slow)
    assert fast["n_precision_exhausted"] == 2 * 3 * 24 and fast["precision_onset_t"] == 40
    assert fast["n_compared"] == 2 * 3 * 40 and fast["domain_cause"] == "precision_exhausted"


def test_a_non_finite_baseline_goes_to_the_general_code(monkeypatch):
    x, trace, baseline = _case((2, 3, 64), 2, "float32", 6)
    baseline[0, 0, 5] = math.nan
    fast, slow, calls = _both(monkeypatch, x, trace, dtype="float32", baseline=baseline)
    assert calls == [False]
    _assert_same(fast, slow)
    assert fast["n_baseline_nonfinite"] == 1


# --------------------------------------------------------------------------------------------------
# exact quantiles


@pytest.mark.parametrize(
    "make",
    [
        lambda rng: np.abs(rng.standard_normal(300_001)),  # continuous: bins small enough to sort
        lambda rng: np.abs(rng.standard_normal(300_001)) * 1e-3 + 1.0,  # one binade: multi-level
        lambda rng: np.round(rng.exponential(size=400_000), 1),  # many ties
        lambda rng: np.zeros(200_000),
        lambda rng: np.concatenate([np.zeros(199_000), np.arange(1000.0), [math.inf]]),
        lambda rng: rng.integers(0, 3, size=250_000).astype(np.float64),  # ULP distances
        lambda rng: np.array([5e-324, 0.0, 1e308, 2.0]),
    ],
)
def test_select_is_exact(make):
    a = make(np.random.default_rng(1))
    rng = np.random.default_rng(2)
    ranks = [0, a.size - 1, a.size // 2, *rng.integers(0, a.size, size=5).tolist()]
    s = np.sort(a)
    assert _compiled_measure.select(a, ranks) == [s[r] for r in ranks]
    got = metrics._quantiles(a, (0.5, 0.99))
    assert got == [s[max(0, math.ceil(q * a.size) - 1)] for q in (0.5, 0.99)]


@pytest.mark.parametrize("bad", [-1.0, math.nan, -0.0, -math.inf])
def test_select_declines_values_it_cannot_order_by_pattern(bad):
    a = np.ones(100)
    a[17] = bad
    assert _compiled_measure.select(a, [3]) is None
    # _quantiles falls back to the torch/numpy code, which still gives the exact answer
    assert metrics._quantiles(np.concatenate([a, np.ones(100_000)]), (0.5,)) == [1.0]
