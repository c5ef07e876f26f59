"""The float64 oracles against exact arithmetic, on tiny inputs in several regimes.

Every input is a float64 value, hence an exact `fractions.Fraction`. Linear recurrence and retention
(only +, *) are computed exactly with Fractions; the selective scan (exp, softplus, silu) and the group
norm (sqrt) with mpmath at 60 significant digits, far beyond float64's 16.

Two bounds are checked element by element, with u = 2**-53 (float64's unit roundoff):

- ``|oracle - exact| <= u (growth + magnitude)``: the trace's growth bounds the sequential loop's
  rounding error, as `reference_impls.trace` promises;
- ``|oracle - exact| <= MAX_UNITS[oracle] * u * magnitude``: the agreement measured on these cases (the
  magnitude is the problem's scale: the same computation on absolute values), with the bound stated.

Measured maxima of |oracle - exact| / (u * magnitude) (torch 2.13 CPU; the 64 seeds below / 400 seeds):
linear_recurrence 4.06 / 4.25, retention 3.89 / 5.09, retention_normed 1.82 / 2.21 (rms and layer),
selective_scan 2.94 / 4.43; group_norm, against its conditioning |J| |o| + |y| (see `_norm_scale`),
1.27 / 1.27. The largest |oracle - exact| / (u * (growth + magnitude)) was 0.67 / 0.81.
"""

from __future__ import annotations

from fractions import Fraction

import mpmath
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

U = 2.0**-53
#: Stated bounds on max |oracle - exact| / (u * magnitude); measured values in the module docstring.
MAX_UNITS = {
    "linear_recurrence": 6.0,
    "retention": 8.0,
    "retention_normed": 4.0,
    "selective_scan": 6.0,
    "group_norm": 2.5,
}
#: |oracle - exact| <= GROWTH_FACTOR * u * (growth + magnitude), element by element.
GROWTH_FACTOR = 1.0
SEEDS = range(64)



@pytest.fixture(autouse=True)
def _mp_precision():
    with mpmath.workdps(60):
        yield


# ----------------------------------------------------------------------------------------------------
# Inputs


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _uniform(g: torch.Generator, shape, lo: float, hi: float) -> torch.Tensor:
    return lo + (hi - lo) * torch.rand(shape, generator=g, dtype=torch.float64)


def _wide(g: torch.Generator, shape, decades: float) -> torch.Tensor:
    """Random signs and magnitudes spread over ``2 * decades`` decades: sums that cancel."""
    sign = torch.where(torch.rand(shape, generator=g) < 0.5, -1.0, 1.0).double()
    return sign * 10.0 ** _uniform(g, shape, -decades, decades)


def linear_case(seed: int) -> dict:
    g = _gen(seed)
    batch, channels, length = 2, 3, 8
    shape = (batch, channels, length)
    regime = seed % 4
    if regime == 0:  # contracting and expanding decays of both signs
        a, b = _uniform(g, shape, -1.2, 1.2), torch.randn(shape, generator=g, dtype=torch.float64)
    elif regime == 1:  # decays just below 1 (long memory)
        a = 1.0 - 2.0 ** -_uniform(g, shape, 1, 30)
        b = torch.randn(shape, generator=g, dtype=torch.float64)
    elif regime == 2:  # inputs over 12 decades with random signs (cancellation)
        a, b = _uniform(g, shape, -2.0, 2.0), _wide(g, shape, 6)
    else:  # growing state
        a, b = _uniform(g, shape, 1.5, 3.0), torch.randn(shape, generator=g, dtype=torch.float64)
    h0 = torch.randn((batch, channels), generator=g, dtype=torch.float64) if seed % 2 else None
    return {"a": a, "b": b, "h0": h0}


def retention_case(seed: int) -> dict:
    g = _gen(seed)
    batch, length, heads, dk, dv = 1 + seed % 2, 6, 3, 3 + seed % 2, 4
    q, k, v = (torch.randn((batch, length, heads, d), generator=g, dtype=torch.float64) for d in (dk, dk, dv))
    regime = seed % 3
    gamma = scale = None
    if regime == 1:
        gamma = _uniform(g, (heads,), 0.3, 1.0)
        scale = float(_uniform(g, (), 0.1, 2.0))
    elif regime == 2:  # wide values: the sums over dk and over t cancel
        q, k, v = (_wide(g, x.shape, 3) for x in (q, k, v))
    return {"q": q, "k": k, "v": v, "gamma": gamma, "scale": scale}


def selective_case(seed: int) -> dict:
    g = _gen(seed)
    batch, dim, n_state, length = 2, 4, 3, 6
    groups = (1, 2, 4)[seed % 3]
    u = torch.randn((batch, dim, length), generator=g, dtype=torch.float64)
    A = -_uniform(g, (dim, n_state), 0.05, 2.0)
    regime = seed % 4
    softplus = regime in (1, 2)
    if regime == 2:  # around the softplus threshold (x > 20 -> x)
        delta = _uniform(g, u.shape, 17.0, 23.0)
        A = A / 8
    elif regime == 3:  # wide inputs: cancellation in the sum over n
        delta = _uniform(g, u.shape, 0.0, 1.0)
        u = _wide(g, u.shape, 3)
    else:
        delta = _uniform(g, u.shape, -2.0, 1.5) if softplus else _uniform(g, u.shape, 0.0, 1.5)
    B = torch.randn((batch, groups, n_state, length), generator=g, dtype=torch.float64)
    C = torch.randn((batch, n_state, length), generator=g, dtype=torch.float64)
    if seed % 2:
        B = B[:, 0] if groups == 1 else B
        C = C[:, None].expand(batch, groups, n_state, length).clone() * 0.5
    D = torch.randn((dim,), generator=g, dtype=torch.float64) if seed % 3 != 2 else None
    z = torch.randn(u.shape, generator=g, dtype=torch.float64) * 3 if seed % 2 == 0 else None
    bias = _uniform(g, (dim,), -0.5, 0.5) if regime == 1 else None
    return {"u": u, "delta": delta, "A": A, "B": B, "C": C, "D": D, "z": z, "delta_bias": bias, "delta_softplus": softplus}


# ----------------------------------------------------------------------------------------------------
# Exact computations (nested lists of Fraction or mpf, shaped like the oracle's output)


def _fr(x: torch.Tensor):
    return [_fr(row) for row in x] if x.ndim else Fraction(float(x))


def exact_linear(a: torch.Tensor, b: torch.Tensor, h0: torch.Tensor | None) -> list:
    a_, b_ = _fr(a), _fr(b)
    h0_ = _fr(h0) if h0 is not None else [[Fraction(0)] * a.shape[1] for _ in range(a.shape[0])]
    out = []
    for i in range(a.shape[0]):
        rows = []
        for c in range(a.shape[1]):
            h, row = h0_[i][c], []
            for t in range(a.shape[2]):
                h = a_[i][c][t] * h + b_[i][c][t]
                row.append(h)
            rows.append(row)
        out.append(rows)
    return out


def exact_retention(q, k, v, gamma, scale) -> list:
    batch, length, heads, dk = q.shape
    dv = v.shape[-1]
    gammas = [Fraction(1) - Fraction(1, 2 ** (5 + h)) for h in range(heads)] if gamma is None else [Fraction(float(x)) for x in gamma]
    scale_ = Fraction(dk**-0.5 if scale is None else float(scale))
    q_, k_, v_ = _fr(q), _fr(k), _fr(v)
    out = [[[None] * heads for _ in range(length)] for _ in range(batch)]
    for b in range(batch):
        for h in range(heads):
            S = [[Fraction(0)] * dv for _ in range(dk)]
            for t in range(length):
                kt, vt, qt = k_[b][t][h], v_[b][t][h], q_[b][t][h]
                S = [[gammas[h] * S[i][j] + kt[i] * vt[j] for j in range(dv)] for i in range(dk)]
                out[b][t][h] = [scale_ * sum((qt[i] * S[i][j] for i in range(dk)), Fraction(0)) for j in range(dv)]
    return out


def _mp_norm(row: list, eps: float, kind: str) -> list:
    row = [mpmath.mpf(x.numerator) / x.denominator if isinstance(x, Fraction) else mpmath.mpf(x) for x in row]
    n = len(row)
    if kind == "layer":
        mean = mpmath.fsum(row) / n
        row = [x - mean for x in row]
    denom = mpmath.sqrt(mpmath.fsum(x * x for x in row) / n + mpmath.mpf(eps))
    return [x / denom for x in row]


def _mp_softplus(x):
    return x if x > 20 else mpmath.log1p(mpmath.exp(x))


def exact_selective(u, delta, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False) -> list:
    mpf = lambda t: None if t is None else _to_mp(t)  # noqa: E731
    batch, dim, length = u.shape
    n_state = A.shape[1]
    B = B[:, None] if B.ndim == 3 else B
    C = C[:, None] if C.ndim == 3 else C
    u_, delta_, A_, B_, C_, D_, z_, bias_ = map(mpf, (u, delta, A, B, C, D, z, delta_bias))
    out = []
    for b in range(batch):
        rows = []
        for d in range(dim):
            gb, gc = d // (dim // B.shape[1]), d // (dim // C.shape[1])
            h = [mpmath.mpf(0)] * n_state
            row = []
            for t in range(length):
                dp = delta_[b][d][t] + (bias_[d] if bias_ is not None else 0)
                if delta_softplus:
                    dp = _mp_softplus(dp)
                h = [mpmath.exp(dp * A_[d][n]) * h[n] + dp * u_[b][d][t] * B_[b][gb][n][t] for n in range(n_state)]
                y = mpmath.fsum(C_[b][gc][n][t] * h[n] for n in range(n_state))
                if D_ is not None:
                    y += D_[d] * u_[b][d][t]
                if z_ is not None:
                    zz = z_[b][d][t]
                    y *= zz / (1 + mpmath.exp(-zz))
                row.append(y)
            rows.append(row)
        out.append(rows)
    return out


def _to_mp(x: torch.Tensor):
    return [_to_mp(row) for row in x] if x.ndim else mpmath.mpf(float(x))


def _abs_error(oracle: torch.Tensor, exact) -> torch.Tensor:
    """|oracle - exact| elementwise, as float64 (the difference is taken exactly, then rounded)."""
    if oracle.ndim:
        return torch.stack([_abs_error(o, e) for o, e in zip(oracle, exact)])
    value = float(oracle)
    if isinstance(exact, Fraction):
        return torch.tensor(float(abs(Fraction(value) - exact)), dtype=torch.float64)
    return torch.tensor(float(abs(mpmath.mpf(value) - exact)), dtype=torch.float64)


# ----------------------------------------------------------------------------------------------------
# Measuring


def _ratios(err: torch.Tensor, magnitude: torch.Tensor, growth: torch.Tensor) -> tuple[float, float]:
    """(max err / (u magnitude), max err / (u (growth + magnitude))); 0/0 counts as 0."""
    def worst(scale: torch.Tensor) -> float:
        r = torch.where(err == 0, torch.zeros_like(err), err / (U * scale))
        return float(r.max())

    return worst(magnitude), worst(growth + magnitude)


def _check(name: str, oracle: torch.Tensor, exact, trace) -> tuple[float, float]:
    err = _abs_error(oracle, exact)
    assert torch.isfinite(oracle).all()
    by_magnitude, by_growth = _ratios(err, trace.magnitude, trace.growth)
    assert by_growth <= GROWTH_FACTOR, f"{name}: |oracle - exact| = {by_growth} u (growth + magnitude)"
    assert by_magnitude <= MAX_UNITS[name], f"{name}: |oracle - exact| = {by_magnitude} u magnitude"
    return by_magnitude, by_growth


def _measure(name: str, case, run, exact, trace_fn) -> float:
    worst = 0.0
    for seed in SEEDS:
        args = case(seed)
        oracle = run(**args)
        trace = trace_fn(**args)
        assert torch.equal(trace.out, oracle), "the trace's out must be the oracle's output"
        worst = max(worst, _check(name, oracle, exact(**args), trace)[0])
    return worst


# ----------------------------------------------------------------------------------------------------
# Tests


def test_linear_recurrence_matches_fractions():
    worst = _measure("linear_recurrence", linear_case, linear_recurrence, exact_linear, linear_recurrence_trace)
    assert worst > 0  # the cases do round


def test_retention_matches_fractions():
    worst = _measure("retention", retention_case, retention, exact_retention, retention_trace)
    assert worst > 0


@pytest.mark.parametrize("kind", ["rms", "layer"])
def test_retention_normed_matches_mpmath(kind):
    for seed in SEEDS:
        args = retention_case(seed)
        eps = (0.0, 1e-6, 0.5)[seed % 3]
        oracle = retention_normed(**args, eps=eps, kind=kind)
        trace = retention_normed_trace(**args, eps=eps, kind=kind)
        assert torch.equal(trace.out, oracle)
        o = exact_retention(**args)
        exact = [[[_mp_norm(row, eps, kind) for row in heads] for heads in steps] for steps in o]
        _check("retention_normed", oracle, exact, trace)


def test_selective_scan_matches_mpmath():
    worst = _measure("selective_scan", selective_case, selective_scan, exact_selective, selective_scan_trace)
    assert worst > 0


def _norm_scale(o: torch.Tensor, y: torch.Tensor, eps: float, kind: str) -> torch.Tensor:
    """The group norm's conditioning at o: ``|J| |o| + |y|`` (J its Jacobian; see reference_impls.retention).

    For ``layer`` this includes ``mean(|o|) / s``: a common offset in o cancels in the mean, and the
    result can only be as accurate as the offset allows.
    """
    centred = o - o.mean(-1, keepdim=True) if kind == "layer" else o
    denom = ((centred * centred).mean(-1, keepdim=True) + eps).sqrt()
    y_abs, o_abs = y.abs(), o.abs()
    bound = o_abs + y_abs * (y_abs * o_abs).mean(-1, keepdim=True)
    if kind == "layer":
        bound = bound + o_abs.mean(-1, keepdim=True)
    return bound / denom + y_abs


@pytest.mark.parametrize("kind", ["rms", "layer"])
def test_group_norm_matches_mpmath(kind):
    worst = 0.0
    for seed in SEEDS:
        g = _gen(seed)
        dv = 1 + seed % 8
        o = torch.randn((2, 3, dv), generator=g, dtype=torch.float64) * 10.0 ** _uniform(g, (2, 3, 1), -3, 3)
        if seed % 2:
            o = o + 50.0 * o.abs().amax(-1, keepdim=True)  # a common offset: the mean cancels
        eps = (1e-6 if dv == 1 else 0.0, 1e-6, 1.0)[seed % 3]  # layer with dv = 1 and eps = 0 is 0/0
        y = group_norm(o, eps, kind)
        exact = [[_mp_norm([float(x) for x in row], eps, kind) for row in rows] for rows in o]
        err = _abs_error(y, exact)
        worst = max(worst, float((err / (U * _norm_scale(o, y, eps, kind))).max()))
    assert 0 < worst <= MAX_UNITS["group_norm"], f"group_norm({kind}): {worst} u (|J| |o| + |y|)"


def test_exact_references_detect_a_decay_one_step_late():
    """The comparison is sharp enough to see a recurrence change far below the tolerance's scale."""
    args = linear_case(0)
    a, b = args["a"], args["b"]
    late = torch.cat([torch.ones_like(a[..., :1]), a[..., :-1]], dim=-1)  # decay applied one step late
    trace = linear_recurrence_trace(a, b)
    err = _abs_error(linear_recurrence(late, b), exact_linear(a, b, None))
    assert float((err / (U * (trace.growth + trace.magnitude))).max()) > 1e6 * GROWTH_FACTOR
