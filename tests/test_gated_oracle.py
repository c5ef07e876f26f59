"""The gated-decay oracles (`reference_impls.gated_decay`): exact arithmetic, identities, validation.

Exact arithmetic. Every input is a float64 value; ``exp`` (of the log-decay), softplus and silu are
evaluated with mpmath at 60 significant digits, as `tests/test_oracle_exact.py` does for the selective
scan. Two bounds hold element by element (u = 2**-53): ``|oracle - exact| <= u (growth + magnitude)``
(the trace's promise) and ``|oracle - exact| <= MAX_UNITS[name] u magnitude`` (measured, stated).
Measured maxima of |oracle - exact| / (u magnitude) (torch 2.13 CPU; the 48 seeds below / 300 seeds):
simple_gla 3.16 / 4.11, gla 3.54 / 3.67, ssd 4.10 / 4.10; final states 3.83 / 3.83 (simple_gla),
3.20 / 3.20 (gla), 4.68 / 4.68 (ssd). The largest |oracle - exact| / (u (growth + magnitude)) was
0.88 / 0.90.

Identities: simple_gla is gla with g broadcast over K; a constant gate is retention with
``gamma = exp(g)``; ssd is simple_gla under the documented mapping; cu_seqlens and seq_idx are separate
calls per sequence; an initial state is the state the earlier steps leave; the final state is the last
state (read out through one-hot queries).
"""

from __future__ import annotations

import math

import mpmath
import pytest
import torch

from reference_impls import retention
from reference_impls.gated_decay import gla, gla_trace, simple_gla, simple_gla_trace, ssd, ssd_trace

U = 2.0**-53
MAX_UNITS = {"simple_gla": 6.0, "gla": 6.0, "ssd": 6.0, "final_state": 7.0}
SEEDS = range(48)


@pytest.fixture(autouse=True)
def _mp_precision():
    with mpmath.workdps(60):
        yield


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _uniform(g: torch.Generator, shape, lo: float, hi: float) -> torch.Tensor:
    return lo + (hi - lo) * torch.rand(shape, generator=g, dtype=torch.float64)


def _randn(g: torch.Generator, *shape) -> torch.Tensor:
    return torch.randn(shape, generator=g, dtype=torch.float64)


def gla_case(seed: int, per_key: bool) -> dict:
    """Tiny fla-layout cases over regimes: mild, strong (-20 per step), near-zero gates, wide values."""
    g = _gen(seed)
    batch, length, heads, dk, dv = 1 + seed % 2, 5 + seed % 3, 2, 2 + seed % 2, 3
    q, k = _randn(g, batch, length, heads, dk), _randn(g, batch, length, heads, dk)
    v = _randn(g, batch, length, heads, dv)
    shape = (batch, length, heads, dk) if per_key else (batch, length, heads)
    regime = seed % 4
    if regime == 0:
        lg = _uniform(g, shape, -1.0, 0.0)
    elif regime == 1:  # strong decay
        lg = _uniform(g, shape, -20.0, 0.0)
    elif regime == 2:  # gates near 0: long memory
        lg = -(10.0 ** _uniform(g, shape, -8, -1))
    else:  # wide values: cancellation in the sums over K and over t
        lg = _uniform(g, shape, -2.0, 0.0)
        sign = torch.where(torch.rand(q.shape, generator=g) < 0.5, -1.0, 1.0).double()
        q = sign * 10.0 ** _uniform(g, q.shape, -3, 3)
    h0 = _randn(g, batch, heads, dk, dv) if seed % 3 == 1 else None
    scale = float(_uniform(g, (), 0.1, 2.0)) if seed % 5 == 0 else None
    return {"q": q, "k": k, "v": v, "g": lg, "scale": scale, "initial_state": h0, "output_final_state": True}


def ssd_case(seed: int) -> dict:
    g = _gen(seed)
    batch, length, heads, headdim, n_state = 1 + seed % 2, 6, 4, 2, 3
    groups = (1, 2, 4)[seed % 3]
    x = _randn(g, batch, length, heads, headdim)
    regime = seed % 4
    softplus = regime in (1, 2)
    if regime == 2:  # around softplus's threshold (x > 20 -> x) with large dt: strong decay
        dt = _uniform(g, (batch, length, heads), 17.0, 23.0)
        A = -_uniform(g, (heads,), 0.05, 1.0)
    else:
        dt = _uniform(g, (batch, length, heads), -2.0, 1.5) if softplus else _uniform(g, (batch, length, heads), 0.0, 1.5)
        A = -_uniform(g, (heads,), 0.05, 4.0)
    B, C = _randn(g, batch, length, groups, n_state), _randn(g, batch, length, groups, n_state)
    D = None if seed % 3 == 2 else (_randn(g, heads) if seed % 2 else _randn(g, heads, headdim))
    z = _randn(g, batch, length, heads, headdim) * 3 if seed % 2 == 0 else None
    bias = _uniform(g, (heads,), -0.5, 0.5) if regime == 1 else None
    h0 = _randn(g, batch, heads, headdim, n_state) if seed % 5 in (1, 3) else None
    seq_idx = None
    if seed % 4 == 3:
        seq_idx = torch.tensor([[0, 0, 1, 1, 1, 2]] * batch)
    return {"x": x, "dt": dt, "A": A, "B": B, "C": C, "D": D, "z": z, "dt_bias": bias, "dt_softplus": softplus,
            "initial_states": h0, "seq_idx": seq_idx, "return_final_states": True}


# ----------------------------------------------------------------------------------------------------
# Exact computations in mpmath (nested lists shaped like the oracle's outputs)


def _mp(x: torch.Tensor):
    return [_mp(row) for row in x] if x.ndim else mpmath.mpf(float(x))


def _mp_softplus(x):
    return x if x > 20 else mpmath.log1p(mpmath.exp(x))


def exact_gla(q, k, v, g, scale=None, initial_state=None, output_final_state=True, starts=None):
    """(o, final) of ``S_t = diag(exp(g_t)) S_{t-1} + k_t^T v_t``, ``o_t = scale q_t S_t``; g per key or per
    head (broadcast); ``starts``: per batch row, the steps where the state restarts from zeros."""
    batch, length, heads, dk = q.shape
    dv = v.shape[-1]
    per_key = g.ndim == 4
    sc = mpmath.mpf(dk**-0.5 if scale is None else float(scale))
    q_, k_, v_, g_ = map(_mp, (q, k, v, g))
    h0 = _mp(initial_state) if initial_state is not None else None
    out = [[[None] * heads for _ in range(length)] for _ in range(batch)]
    final = [[None] * heads for _ in range(batch)]
    for b in range(batch):
        for h in range(heads):
            S = [row[:] for row in h0[b][h]] if h0 is not None else [[mpmath.mpf(0)] * dv for _ in range(dk)]
            for t in range(length):
                if starts is not None and t in starts[b]:
                    S = [[mpmath.mpf(0)] * dv for _ in range(dk)]
                kt, vt, qt = k_[b][t][h], v_[b][t][h], q_[b][t][h]
                a = [mpmath.exp(g_[b][t][h][i] if per_key else g_[b][t][h]) for i in range(dk)]
                S = [[a[i] * S[i][j] + kt[i] * vt[j] for j in range(dv)] for i in range(dk)]
                out[b][t][h] = [sc * mpmath.fsum(qt[i] * S[i][j] for i in range(dk)) for j in range(dv)]
            final[b][h] = S
    return out, final


def exact_ssd(x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False, initial_states=None, seq_idx=None,
              return_final_states=True):
    """Mamba-2's definition written directly: h (P x N), ``h = exp(dt A) h + dt x^T B``, ``y = h C + D x``."""
    batch, length, heads, headdim = x.shape
    groups, n_state = B.shape[2], B.shape[3]
    x_, dt_, A_, B_, C_ = map(_mp, (x, dt, A, B, C))
    D_ = _mp(D) if D is not None else None
    z_ = _mp(z) if z is not None else None
    bias = _mp(dt_bias) if dt_bias is not None else None
    h0 = _mp(initial_states) if initial_states is not None else None
    out = [[[None] * heads for _ in range(length)] for _ in range(batch)]
    final = [[None] * heads for _ in range(batch)]
    for b in range(batch):
        for hd in range(heads):
            grp = hd // (heads // groups)
            st = [row[:] for row in h0[b][hd]] if h0 is not None else [[mpmath.mpf(0)] * n_state for _ in range(headdim)]
            for t in range(length):
                if seq_idx is not None and t > 0 and int(seq_idx[b, t]) != int(seq_idx[b, t - 1]):
                    st = [[mpmath.mpf(0)] * n_state for _ in range(headdim)]
                d = dt_[b][t][hd] + (bias[hd] if bias is not None else 0)
                if dt_softplus:
                    d = _mp_softplus(d)
                d = max(d, mpmath.mpf(0))  # mamba-ssm's dt_limit=(0, inf)
                a = mpmath.exp(d * A_[hd])
                st = [[a * st[p][n] + d * x_[b][t][hd][p] * B_[b][t][grp][n] for n in range(n_state)]
                      for p in range(headdim)]
                y = []
                for p in range(headdim):
                    yp = mpmath.fsum(st[p][n] * C_[b][t][grp][n] for n in range(n_state))
                    if D_ is not None:
                        yp += (D_[hd] if D.ndim == 1 else D_[hd][p]) * x_[b][t][hd][p]
                    if z_ is not None:
                        zz = z_[b][t][hd][p]
                        yp *= zz / (1 + mpmath.exp(-zz))
                    y.append(yp)
                out[b][t][hd] = y
            final[b][hd] = st
    return out, final


def _abs_error(oracle: torch.Tensor, exact) -> torch.Tensor:
    if oracle.ndim:
        return torch.stack([_abs_error(o, e) for o, e in zip(oracle, exact)])
    return torch.tensor(float(abs(mpmath.mpf(float(oracle)) - exact)), dtype=torch.float64)


def _check(name: str, oracle: torch.Tensor, exact, trace) -> float:
    """Both bounds; returns max |oracle - exact| / (u magnitude)."""
    assert torch.isfinite(oracle).all()
    assert torch.equal(trace.out, oracle), "the trace's out must be the oracle's result"
    err = _abs_error(oracle, exact)
    by_growth = torch.where(err == 0, 0.0, err / (U * (trace.growth + trace.magnitude))).max()
    by_magnitude = torch.where(err == 0, 0.0, err / (U * trace.magnitude)).max()
    assert by_growth <= 1.0, f"{name}: |oracle - exact| = {float(by_growth)} u (growth + magnitude)"
    assert by_magnitude <= MAX_UNITS[name], f"{name}: |oracle - exact| = {float(by_magnitude)} u magnitude"
    return float(by_magnitude)


# ----------------------------------------------------------------------------------------------------
# Exact arithmetic


@pytest.mark.parametrize("per_key", [False, True], ids=["simple_gla", "gla"])
def test_gla_matches_mpmath(per_key):
    fn, trace_fn, name = (gla, gla_trace, "gla") if per_key else (simple_gla, simple_gla_trace, "simple_gla")
    worst = worst_final = 0.0
    for seed in SEEDS:
        args = gla_case(seed, per_key)
        o, final = fn(**args)
        trace = trace_fn(**args)
        exact_o, exact_final = exact_gla(**args)
        worst = max(worst, _check(name, o, exact_o, trace.out))
        worst_final = max(worst_final, _check("final_state", final, exact_final, trace.final_state))
    assert worst > 0 and worst_final > 0  # the cases do round


def test_ssd_matches_mpmath():
    worst = worst_final = 0.0
    for seed in SEEDS:
        args = ssd_case(seed)
        y, final = ssd(**args)
        trace = ssd_trace(**args)
        exact_y, exact_final = exact_ssd(**args)
        worst = max(worst, _check("ssd", y, exact_y, trace.out))
        worst_final = max(worst_final, _check("final_state", final, exact_final, trace.final_state))
    assert worst > 0 and worst_final > 0


def test_varlen_matches_mpmath():
    """cu_seqlens against the exact recurrence restarted at each boundary, with per-sequence initial states."""
    for seed in range(8):
        g = _gen(seed)
        args = gla_case(seed, per_key=bool(seed % 2))
        args = {name: (x[:1] if isinstance(x, torch.Tensor) and x.ndim == 4 or name == "g" else x)
                for name, x in args.items()}
        length = args["q"].shape[1]
        cu = torch.tensor([0, 2, 2, length])  # an empty sequence too
        heads, dk, dv = args["q"].shape[2], args["q"].shape[3], args["v"].shape[3]
        h0 = _randn(g, 3, heads, dk, dv)
        fn = gla if seed % 2 else simple_gla
        o, final = fn(**{**args, "initial_state": h0}, cu_seqlens=cu)
        for i, (t0, t1) in enumerate([(0, 2), (2, 2), (2, length)]):
            part = {**args, "q": args["q"][:, t0:t1], "k": args["k"][:, t0:t1], "v": args["v"][:, t0:t1],
                    "g": args["g"][:, t0:t1], "initial_state": h0[i:i + 1]}
            exact_o, exact_final = exact_gla(**part)
            if t1 > t0:
                assert float(_abs_error(o[:, t0:t1], exact_o).max()) <= 8 * U * float(o.abs().max() + 1)
            assert float(_abs_error(final[i:i + 1], exact_final).max()) <= 8 * U * float(final.abs().max() + 1)


# ----------------------------------------------------------------------------------------------------
# Identities (bit for bit where the arithmetic is the same)


def _qkvg(seed, batch=2, length=9, heads=3, dk=4, dv=5, per_key=False, lo=-3.0):
    g = _gen(seed)
    q, k, v = _randn(g, batch, length, heads, dk), _randn(g, batch, length, heads, dk), _randn(g, batch, length, heads, dv)
    lg = _uniform(g, (batch, length, heads, dk) if per_key else (batch, length, heads), lo, 0.0)
    return q, k, v, lg


def test_simple_gla_is_gla_with_the_gate_broadcast_over_k():
    q, k, v, lg = _qkvg(1)
    h0 = _randn(_gen(2), 2, 3, 4, 5)
    o, f = simple_gla(q, k, v, lg, initial_state=h0, output_final_state=True)
    o2, f2 = gla(q, k, v, lg[..., None].expand(*lg.shape, 4), initial_state=h0, output_final_state=True)
    assert torch.equal(o, o2) and torch.equal(f, f2)
    t1 = simple_gla_trace(q, k, v, lg, chunk_size=4)
    t2 = gla_trace(q, k, v, lg[..., None].expand(*lg.shape, 4), chunk_size=4)
    for name in ("magnitude", "growth", "state_peak", "decay_peak"):
        assert torch.equal(getattr(t1.out, name), getattr(t2.out, name)), name
    assert torch.equal(t1.chunk_growth, t2.chunk_growth)


def test_gla_gate_per_key_channel_matters():
    """Per-key gates differ from any per-head gate: the oracle must not reduce gla's g over K."""
    q, k, v, lg = _qkvg(3, per_key=True)
    o, _ = gla(q, k, v, lg)
    o_mean, _ = gla(q, k, v, lg.mean(-1, keepdim=True).expand_as(lg))
    assert (o - o_mean).abs().max() > 1e-3


def test_constant_gate_is_retention():
    """A gate constant over time is retention with ``gamma_h = exp(g_h)`` (retention's convention:
    ``S_t = gamma S_{t-1} + k^T v``, ``o = scale q S``, scale dk**-0.5)."""
    q, k, v, _ = _qkvg(4)
    log_gamma = torch.tensor([-0.03, -0.5, -2.0], dtype=torch.float64)
    o, _ = simple_gla(q, k, v, log_gamma.expand(2, 9, 3))
    expected = retention(q, k, v, torch.exp(log_gamma))
    assert torch.allclose(o, expected, rtol=1e-14, atol=1e-14)
    assert not torch.allclose(o, retention(q, k, v, torch.exp(log_gamma) * 0.99), rtol=1e-6, atol=1e-6)


def test_ssd_is_simple_gla_under_the_mapping():
    args = ssd_case(5)  # groups 4 -> heads read their own group; use 2 groups for the repeat
    g = _gen(6)
    x, dt, A = args["x"], args["dt"].abs(), args["A"]  # dt >= 0: mamba-ssm clamps dt at 0
    B, C = _randn(g, *x.shape[:2], 2, 3), _randn(g, *x.shape[:2], 2, 3)
    h0 = _randn(g, x.shape[0], 4, 2, 3)
    y, final = ssd(x, dt, A, B, C, chunk_size=4, initial_states=h0, return_final_states=True)
    o, s = simple_gla(C.repeat_interleave(2, dim=2), B.repeat_interleave(2, dim=2), dt[..., None] * x, dt * A,
                      scale=1.0, initial_state=h0.transpose(-1, -2), output_final_state=True)
    assert torch.equal(y, o) and torch.equal(final, s.transpose(-1, -2))
    D, z = _randn(g, 4), _randn(g, *x.shape)
    y2 = ssd(x, dt, A, B, C, D=D, z=z)
    y = ssd(x, dt, A, B, C)
    assert torch.equal(y2, (y + x * D[:, None]) * torch.nn.functional.silu(z))  # D x added, then gated
    D2 = _randn(g, 4, 2)
    assert torch.equal(ssd(x, dt, A, B, C, D=D2), y + x * D2)  # D per head and channel


def test_ssd_dt_bias_softplus_and_limit():
    args = ssd_case(9)
    x, dt, A, B, C = (args[n] for n in ("x", "dt", "A", "B", "C"))
    bias = torch.linspace(-3, 25, x.shape[2], dtype=torch.float64)  # up to the linear side of softplus
    y = ssd(x, dt, A, B, C, dt_bias=bias, dt_softplus=True)
    dtp = torch.nn.functional.softplus(dt + bias)
    assert torch.equal(y, ssd(x, dtp, A, B, C))
    assert torch.equal(ssd(x, -dt.abs(), A, B, C), torch.zeros_like(x))  # dt' clamped at 0 (dt_limit)
    assert torch.equal(ssd(x, -dt.abs(), A, B, C, dt_limit=(-math.inf, math.inf)),
                       ssd(x, -dt.abs(), A, B, C, dt_limit=(-1e300, 1e300)))
    assert not torch.equal(ssd(x, -dt.abs(), A, B, C, dt_limit=(-math.inf, math.inf)), torch.zeros_like(x))


@pytest.mark.parametrize("per_key", [False, True], ids=["simple_gla", "gla"])
def test_cu_seqlens_is_one_call_per_sequence(per_key):
    fn = gla if per_key else simple_gla
    q, k, v, lg = _qkvg(7, batch=1, length=13, per_key=per_key)
    cu = torch.tensor([0, 4, 4, 9, 13], dtype=torch.int32)
    h0 = _randn(_gen(8), 4, 3, 4, 5)
    o, final = fn(q, k, v, lg, initial_state=h0, output_final_state=True, cu_seqlens=cu)
    for i, (t0, t1) in enumerate([(0, 4), (4, 4), (4, 9), (9, 13)]):
        oi, fi = fn(q[:, t0:t1], k[:, t0:t1], v[:, t0:t1], lg[:, t0:t1], initial_state=h0[i:i + 1],
                    output_final_state=True)
        assert torch.equal(o[:, t0:t1], oi) and torch.equal(final[i:i + 1], fi)
    assert torch.equal(final[1], h0[1])  # an empty sequence leaves its initial state
    whole, _ = fn(q, k, v, lg, initial_state=h0[:1])
    assert not torch.allclose(whole[:, 4:], o[:, 4:])  # the boundaries do restart the state
    tr = (gla_trace if per_key else simple_gla_trace)(q, k, v, lg, initial_state=h0, output_final_state=True,
                                                     cu_seqlens=cu, chunk_size=3)
    assert torch.equal(tr.out.out, o) and torch.equal(tr.final_state.out, final)
    tr_part = (gla_trace if per_key else simple_gla_trace)(q[:, 4:9], k[:, 4:9], v[:, 4:9], lg[:, 4:9],
                                                          initial_state=h0[2:3], chunk_size=3)
    assert torch.equal(tr.out.growth[:, 4:9], tr_part.out.growth)
    # the packed sequence's chunk term bounds chunks from its start (those of the sequence run alone) and
    # chunks along the row (3, 6): at least the alone term everywhere, more where the row blocking adds
    assert (tr.chunk_growth[:, 4:9] >= tr_part.chunk_growth).all()
    assert (tr.chunk_growth[:, 4:9] > tr_part.chunk_growth).any()
    first = (gla_trace if per_key else simple_gla_trace)(q[:, :4], k[:, :4], v[:, :4], lg[:, :4],
                                                        initial_state=h0[:1], chunk_size=3)
    assert torch.equal(tr.chunk_growth[:, :4], first.chunk_growth)  # a sequence at step 0: one blocking


def test_ssd_seq_idx_is_one_call_per_sequence():
    g = _gen(10)
    x, dt = _randn(g, 2, 10, 2, 3), _uniform(g, (2, 10, 2), 0.0, 1.0)
    A, B, C = -_uniform(g, (2,), 0.1, 2.0), _randn(g, 2, 10, 1, 4), _randn(g, 2, 10, 1, 4)
    h0 = _randn(g, 2, 2, 3, 4)
    seq_idx = torch.tensor([[0, 0, 0, 1, 1, 1, 1, 2, 2, 2], [0] * 10])
    y, final = ssd(x, dt, A, B, C, initial_states=h0, seq_idx=seq_idx, return_final_states=True)
    row = slice(0, 1)
    for t0, t1, start in [(0, 3, h0[row]), (3, 7, None), (7, 10, None)]:
        yi, fi = ssd(x[row, t0:t1], dt[row, t0:t1], A, B[row, t0:t1], C[row, t0:t1], initial_states=start,
                     return_final_states=True)
        assert torch.equal(y[row, t0:t1], yi)
    assert torch.equal(final[row], fi)  # the row's final state is its last sequence's
    y1, f1 = ssd(x[1:], dt[1:], A, B[1:], C[1:], initial_states=h0[1:], return_final_states=True)
    assert torch.equal(y[1:], y1) and torch.equal(final[1:], f1)


@pytest.mark.parametrize("per_key", [False, True], ids=["simple_gla", "gla"])
def test_initial_state_is_the_state_earlier_steps_leave(per_key):
    fn = gla if per_key else simple_gla
    q, k, v, lg = _qkvg(11, per_key=per_key)
    o, final = fn(q, k, v, lg, output_final_state=True)
    o1, s1 = fn(q[:, :4], k[:, :4], v[:, :4], lg[:, :4], output_final_state=True)
    o2, s2 = fn(q[:, 4:], k[:, 4:], v[:, 4:], lg[:, 4:], initial_state=s1, output_final_state=True)
    assert torch.equal(o[:, :4], o1) and torch.equal(o[:, 4:], o2) and torch.equal(final, s2)
    o_zero, _ = fn(q[:, 4:], k[:, 4:], v[:, 4:], lg[:, 4:])
    assert not torch.allclose(o_zero, o2)


@pytest.mark.parametrize("per_key", [False, True], ids=["simple_gla", "gla"])
def test_final_state_is_the_last_state(per_key):
    """Row i of S_T is what a one-hot query e_i reads at the last step with scale 1."""
    fn = gla if per_key else simple_gla
    q, k, v, lg = _qkvg(12, per_key=per_key)
    _, final = fn(q, k, v, lg, output_final_state=True)
    dk = q.shape[-1]
    for i in range(dk):
        probe = torch.zeros_like(q)
        probe[..., i] = 1.0
        o, _ = fn(probe, k, v, lg, scale=1.0)
        assert torch.equal(o[:, -1], final[:, :, i])
    _, before = fn(q[:, :-1], k[:, :-1], v[:, :-1], lg[:, :-1], output_final_state=True)
    assert not torch.allclose(before, final)  # one step early is a different state
    assert fn(q, k, v, lg)[1] is None


def test_same_dtype_baseline_rounds_in_its_dtype():
    q, k, v, lg = _qkvg(13)
    o64, _ = simple_gla(q, k, v, lg)
    o32, _ = simple_gla(q, k, v, lg, compute_dtype=torch.float32)
    assert o32.dtype == torch.float32
    err = (o32.double() - o64).abs().max()
    assert 0 < err < 1e-4


# ----------------------------------------------------------------------------------------------------
# The chunk term


def _naive_chunk_term(q, k, v, lg, scale, chunk_size, starts_row_chunks=None):
    """An independent per-step evaluation of the chunk term (module docstring), per key channel."""
    batch, length, heads, dk = q.shape
    dv = v.shape[-1]
    lg4 = lg if lg.ndim == 4 else lg[..., None].expand(batch, length, heads, dk)
    out = torch.zeros(batch, length, heads, dv, dtype=torch.float64)
    H = torch.zeros(batch, heads, dk, dv, dtype=torch.float64)
    Dc = torch.zeros_like(H)
    lam = torch.zeros(batch, heads, dk, dtype=torch.float64)
    mass, squares = torch.zeros_like(lam), torch.zeros_like(lam)
    for t in range(length):
        a = lg4[:, t].exp()
        first = t % chunk_size == 0
        if first and t > 0:
            Dc = Dc + 2 * lam[..., None] * H
        Dc = a[..., None] * Dc
        mass = lg4[:, t].abs() if first else mass + lg4[:, t].abs()
        squares = mass ** 2 if first else squares + mass ** 2
        lam = squares.sqrt()  # the random walk of the partial masses' roundings
        H = a[..., None] * H + k[:, t, :, :, None].abs() * v[:, t, :, None, :].abs()
        Y = Dc + 2 * lam[..., None] * H
        out[:, t] = abs(scale) * (q[:, t, :, :, None].abs() * Y).sum(-2)
    return out, Y


@pytest.mark.parametrize("per_key", [False, True], ids=["simple_gla", "gla"])
def test_chunk_term_matches_its_definition(per_key):
    q, k, v, lg = _qkvg(14, length=11, per_key=per_key, lo=-20.0)
    trace_fn = gla_trace if per_key else simple_gla_trace
    for chunk_size in (1, 3, 4, 16):
        tr = trace_fn(q, k, v, lg, output_final_state=True, chunk_size=chunk_size)
        expected, y_last = _naive_chunk_term(q, k, v, lg, 4**-0.5, chunk_size)
        assert torch.allclose(tr.chunk_growth, expected, rtol=1e-12, atol=0)
        assert torch.allclose(tr.final_state_chunk_growth, y_last, rtol=1e-12, atol=0)
        folded = tr.with_chunk_growth()
        assert torch.equal(folded.out.growth, tr.out.growth + tr.chunk_growth)
    assert trace_fn(q, k, v, lg).chunk_growth is None
    with pytest.raises(ValueError, match="chunk_size"):
        trace_fn(q, k, v, lg).with_chunk_growth()
    # no decay mass, no chunk term
    assert torch.equal(trace_fn(q, k, v, torch.zeros_like(lg), chunk_size=4).chunk_growth, torch.zeros_like(expected))


def test_ssd_chunk_term_counts_chunks_along_the_row():
    g = _gen(16)
    x, dt = _randn(g, 1, 10, 2, 3), _uniform(g, (1, 10, 2), 0.0, 1.0)
    A, B, C = -_uniform(g, (2,), 0.1, 2.0), _randn(g, 1, 10, 1, 4), _randn(g, 1, 10, 1, 4)
    seq_idx = torch.tensor([[0, 0, 0, 1, 1, 1, 1, 2, 2, 2]])
    tr = ssd_trace(x, dt, A, B, C, chunk_size=4, seq_idx=seq_idx)
    alone = ssd_trace(x[:, 3:7], dt[:, 3:7], A, B[:, 3:7], C[:, 3:7], chunk_size=4)
    # the second sequence starts at step 3, inside the first chunk (0..3): its mass at step 3 includes steps 0-2
    assert torch.equal(tr.out.growth[:, 3:7], alone.out.growth)
    assert not torch.allclose(tr.chunk_growth[:, 3:7], alone.chunk_growth)
    assert (tr.chunk_growth[:, 3] > alone.chunk_growth[:, 0]).all()


# ----------------------------------------------------------------------------------------------------
# Argument validation


def _ok():
    q, k, v, lg = _qkvg(17, batch=1, length=6)
    return {"q": q, "k": k, "v": v, "g": lg}


@pytest.mark.parametrize("change, error, match", [
    (lambda a: {**a, "q": a["q"][0]}, ValueError, r"q.shape=.*expected 4: \(batch, T, heads, K\)"),
    (lambda a: {**a, "k": a["k"][..., :2]}, ValueError, r"k.shape=.*does not match"),
    (lambda a: {**a, "v": a["v"][:, :3]}, ValueError, r"v.shape=.*expected \(batch, T, heads, V\)"),
    (lambda a: {**a, "g": a["g"][..., None].expand(1, 6, 3, 4)}, ValueError, r"g.shape=.*use gla"),
    (lambda a: {**a, "g": a["g"].long()}, TypeError, r"g.dtype=torch.int64 is not a real floating dtype"),
    (lambda a: {**a, "q": a["q"].tolist()}, TypeError, r"q is a list; expected a torch.Tensor"),
    (lambda a: {**a, "initial_state": torch.zeros(1, 3, 4)}, ValueError, r"initial_state.shape=.*\(batch, heads, K, V\)"),
    (lambda a: {**a, "output_final_state": 1}, TypeError, r"output_final_state=1 is a int; expected True or False"),
    (lambda a: {**a, "scale": "2"}, TypeError, r"scale='2'"),
    (lambda a: {**a, "cu_seqlens": torch.tensor([0, 3, 5])}, ValueError, r"must start at 0 and end at T=6"),
    (lambda a: {**a, "cu_seqlens": torch.tensor([0, 4, 3, 6])}, ValueError, r"cu_seqlens=\[0, 4, 3, 6\] decreases"),
    (lambda a: {**a, "cu_seqlens": torch.tensor([0.0, 6.0])}, TypeError, r"cu_seqlens.dtype=torch.float32 is not an integer"),
    (lambda a: {**a, "cu_seqlens": torch.tensor([6])}, ValueError, r"cu_seqlens.shape=\(1,\)"),
    (lambda a: {**a, "cu_seqlens": torch.tensor([0, 3, 6]), "initial_state": torch.zeros(1, 3, 4, 5, dtype=torch.float64)},
     ValueError, r"initial_state.shape=\(1, 3, 4, 5\).*one row per cu_seqlens sequence.*\(2, 3, 4, 5\)"),
    (lambda a: {**{n: torch.cat([x, x]) for n, x in a.items()}, "cu_seqlens": torch.tensor([0, 6])}, ValueError,
     r"batch=2 with cu_seqlens.*expected batch=1"),
])
def test_gla_arguments_are_checked(change, error, match):
    with pytest.raises(error, match=match):
        simple_gla(**change(_ok()))


def test_gla_per_key_gate_shape_is_checked():
    a = _ok()
    with pytest.raises(ValueError, match=r"g.shape=\(1, 6, 3\) does not match: expected \(batch, T, heads, K\)"):
        gla(**a)
    with pytest.raises(ValueError, match="chunk_size=0 is not a positive integer"):
        simple_gla_trace(**a, chunk_size=0)
    with pytest.raises(TypeError, match="compute_dtype=torch.int32"):
        simple_gla(**a, compute_dtype=torch.int32)


def _ssd_ok():
    g = _gen(18)
    return {"x": _randn(g, 1, 6, 4, 2), "dt": _uniform(g, (1, 6, 4), 0, 1), "A": -_uniform(g, (4,), 0.1, 1),
            "B": _randn(g, 1, 6, 2, 3), "C": _randn(g, 1, 6, 2, 3)}


@pytest.mark.parametrize("change, error, match", [
    (lambda a: {**a, "dt": a["dt"][..., :2]}, ValueError, r"dt.shape=\(1, 6, 2\).*\(batch, T, heads\)"),
    (lambda a: {**a, "A": a["A"][None]}, ValueError, r"A.shape=\(1, 4\).*\(heads,\)"),
    (lambda a: {**a, "B": a["B"].repeat(1, 1, 3, 1)[:, :, :3]}, ValueError, r"B.shape=\(1, 6, 3, 3\).*divisible by groups"),
    (lambda a: {**a, "C": a["C"][..., :2]}, ValueError, r"C.shape=.*does not match"),
    (lambda a: {**a, "D": torch.zeros(3, dtype=torch.float64)}, ValueError, r"D.shape=\(3,\).*\(heads,\) = \(4,\) or \(heads, P\) = \(4, 2\)"),
    (lambda a: {**a, "z": a["x"][..., :1]}, ValueError, r"z.shape="),
    (lambda a: {**a, "dt_bias": torch.zeros(2, dtype=torch.float64)}, ValueError, r"dt_bias.shape="),
    (lambda a: {**a, "initial_states": torch.zeros(1, 4, 3, 2, dtype=torch.float64)}, ValueError,
     r"initial_states.shape=\(1, 4, 3, 2\).*\(batch, heads, P, N\) = \(1, 4, 2, 3\)"),
    (lambda a: {**a, "seq_idx": torch.tensor([[0, 0, 1, 1, 0, 0]])}, ValueError, r"seq_idx decreases"),
    (lambda a: {**a, "seq_idx": torch.tensor([[0, 0, 1]])}, ValueError, r"seq_idx.shape=\(1, 3\)"),
    (lambda a: {**a, "seq_idx": torch.tensor([[1, 1, 1, 2, 2, 2]]), "initial_states": torch.zeros(1, 4, 2, 3)},
     ValueError, r"seq_idx\[:, 0\]=\[1\] with initial_states.*start at 0"),
    (lambda a: {**a, "chunk_size": -4}, ValueError, r"chunk_size=-4 is not a positive integer"),
    (lambda a: {**a, "dt_softplus": "yes"}, TypeError, r"dt_softplus='yes'"),
    (lambda a: {**a, "dt_limit": (1.0, 0.0)}, ValueError, r"dt_limit=\(1.0, 0.0\) has low > high"),
])
def test_ssd_arguments_are_checked(change, error, match):
    with pytest.raises(error, match=match):
        ssd(**change(_ssd_ok()))
