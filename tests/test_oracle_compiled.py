"""The compiled oracle loops (`reference_impls._compiled`, numba) give the torch loops' bits exactly.

- Every oracle (linear recurrence, selective scan with D, z, softplus, delta_bias and groups, retention
  and retention_normed, simple GLA, GLA and SSD), in float64 and float32, on several shapes including
  lengths that are not a multiple of the block: the compiled path and the pure-torch per-step loop are
  `torch.equal`, and the compiled path was really taken.
- Every trace (the fused trace kernels), on typical inputs and on extreme ones (overflow to inf, NaN
  and inf inputs, decays above 1, negative and NaN gammas): each of its five fields has the same bits
  as both torch loops (pure torch, and with `recur`/`recur_peak` compiled); the fused kernel is the one
  that runs, once per block.
- No fused multiply-add: the generated assembly has no FMA instruction, and inputs on which a fused
  step and an unfused step round differently (checked with exact fractions) give the unfused result.
- Special values (inf, NaN, subnormals, signed zeros) give the same bit patterns, NaN in the same
  places (a NaN's sign and payload are not compared: see `_assert_same`).
- float16 / bfloat16 and a missing numba take the torch loop (and work).
"""

from __future__ import annotations

import re
from fractions import Fraction

import pytest
import torch

from reference_impls import (
    _compiled,
    _loop,
    gla,
    gla_trace,
    linear_recurrence,
    linear_recurrence_trace,
    retention,
    retention_normed,
    retention_normed_trace,
    retention_trace,
    selective_scan,
    selective_scan_trace,
    simple_gla,
    simple_gla_trace,
    ssd,
    ssd_trace,
)
from reference_impls.gated_decay import GatedTrace
from reference_impls.trace import Trace

needs_numba = pytest.mark.skipif(not _compiled.AVAILABLE, reason=f"compiled loops off: {_compiled.UNAVAILABLE_REASON}")

KERNELS = ("_recur_kernel", "_recur_peak_kernel", "_selective_scan_kernel", "_retention_kernel",
           "_linear_recurrence_trace_kernel", "_selective_scan_trace_kernel", "_retention_trace_kernel",
           "_gated_kernel", "_gated_trace_kernel")
TRACE_WRAPPERS = ("linear_recurrence_trace", "selective_scan_trace_block", "retention_trace_block", "gated_trace_block")
WRAPPERS = ("recur", "recur_peak", "selective_scan_block", "retention_block", "gated_block", *TRACE_WRAPPERS)


@pytest.fixture
def calls(monkeypatch):
    """Counts the calls of each compiled wrapper (which still run)."""
    counts = dict.fromkeys(WRAPPERS, 0)
    for name in WRAPPERS:
        fn = getattr(_compiled, name)

        def counted(*args, _fn=fn, _name=name, **kwargs):
            counts[_name] += 1
            return _fn(*args, **kwargs)

        monkeypatch.setattr(_compiled, name, counted)
    return counts


def _torch_only(fn, *args, **kwargs):
    """``fn(*args, **kwargs)`` with the compiled loops switched off (the pure-torch per-step loop)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(_compiled, "AVAILABLE", False)
        return fn(*args, **kwargs)


def _bits(x: torch.Tensor) -> torch.Tensor:
    """The tensor's bit patterns as integers (torch.equal is False on NaN; bit patterns are not)."""
    ints = {torch.float64: torch.int64, torch.float32: torch.int32, torch.float16: torch.int16,
            torch.bfloat16: torch.int16}
    return x.contiguous().view(ints[x.dtype])


def _assert_same(a, b) -> None:
    if a is None or b is None:  # an output not asked for (a final state)
        assert a is None and b is None
        return
    if isinstance(a, GatedTrace):
        for field in ("out", "final_state", "chunk_growth", "final_state_chunk_growth"):
            _assert_same(getattr(a, field), getattr(b, field))
        return
    if isinstance(a, Trace):
        for field in ("out", "magnitude", "growth", "state_peak", "decay_peak"):
            _assert_same(getattr(a, field), getattr(b, field))
        return
    if isinstance(a, tuple):
        for x, y in zip(a, b, strict=True):
            _assert_same(x, y)
        return
    assert a.dtype == b.dtype and a.shape == b.shape
    nan_a, nan_b = torch.isnan(a), torch.isnan(b)
    if nan_a.any() or nan_b.any():
        # NaN in the same places, every other value in the same bits. A NaN's sign and payload are not
        # part of the arithmetic (IEEE 754 leaves them open; x86 returns the first operand's NaN, and
        # either compiler may swap the operands of a commutative * or +), so they are not compared.
        assert torch.equal(nan_a, nan_b), "NaN in different places"
        assert torch.equal(_bits(a)[~nan_a], _bits(b)[~nan_b])
    else:
        assert torch.equal(a, b), f"max |diff| {(a.double() - b.double()).abs().max().item():.3g}"


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# ------------------------------------------------------------------------------------------- inputs
def _linear(seed, batch, channels, length, dtype, h0=False):
    g = _gen(seed)
    a = torch.rand((batch, channels, length), generator=g, dtype=torch.float64).mul(1.2).sub(0.1)
    b = torch.randn((batch, channels, length), generator=g, dtype=torch.float64)
    h = torch.randn((batch, channels), generator=g, dtype=torch.float64) if h0 else None
    return a.to(dtype), b.to(dtype), None if h is None else h.to(dtype)


def _selective(seed, batch, dim, n_state, length, dtype, *, groups_b=1, groups_c=1, D=True, z=True,
               softplus=True, bias=True):
    g = _gen(seed)
    f = dict(generator=g, dtype=torch.float64)
    u = torch.randn((batch, dim, length), **f)
    delta = torch.randn((batch, dim, length), **f) if softplus else torch.rand((batch, dim, length), **f)
    A = -torch.rand((dim, n_state), **f) * 2
    B = torch.randn((batch, groups_b, n_state, length), **f)
    C = torch.randn((batch, groups_c, n_state, length), **f)
    B = B[:, 0] if groups_b == 1 and seed % 2 else B  # (batch, N, L) and (batch, 1, N, L) are both allowed
    kw = dict(
        D=torch.randn((dim,), **f) if D else None,
        z=torch.randn((batch, dim, length), **f) if z else None,
        delta_bias=torch.rand((dim,), **f) - 0.5 if bias else None,
        delta_softplus=softplus,
    )
    cast = lambda x: None if not isinstance(x, torch.Tensor) else x.to(dtype)  # noqa: E731
    args = tuple(cast(x) for x in (u, delta, A, B, C))
    return args, {k: cast(v) if isinstance(v, torch.Tensor) or v is None else v for k, v in kw.items()}


def _retention(seed, batch, length, heads, dk, dv, dtype):
    g = _gen(seed)
    q, k = (torch.randn((batch, length, heads, dk), generator=g, dtype=torch.float64) for _ in range(2))
    v = torch.randn((batch, length, heads, dv), generator=g, dtype=torch.float64)
    return q.to(dtype), k.to(dtype), v.to(dtype)


def _gated(seed, batch, length, heads, dk, dv, dtype, *, per_key):
    """q, k, v, g and an initial state for simple GLA (per_key False) or GLA; log-decays in [-2, 0]."""
    g = _gen(seed)
    f = dict(generator=g, dtype=torch.float64)
    q, k = (torch.randn((batch, length, heads, dk), **f) for _ in range(2))
    v = torch.randn((batch, length, heads, dv), **f)
    gate = -2 * torch.rand((batch, length, heads, *((dk,) if per_key else ())), **f)
    h0 = torch.randn((batch, heads, dk, dv), **f)
    return tuple(x.to(dtype) for x in (q, k, v, gate, h0))


def _ssd_inputs(seed, batch, length, heads, headdim, n_state, groups, dtype):
    """x, dt, A, B, C and the keywords D, z, dt_bias, initial_states, seq_idx (two sequences per row)."""
    g = _gen(seed)
    f = dict(generator=g, dtype=torch.float64)
    x = torch.randn((batch, length, heads, headdim), **f)
    dt = torch.randn((batch, length, heads), **f)
    A = -torch.rand((heads,), **f) * 2
    B, C = (torch.randn((batch, length, groups, n_state), **f) for _ in range(2))
    cut = max(length // 3, 1)
    kw = dict(D=torch.randn((heads,), **f), z=torch.randn((batch, length, heads, headdim), **f),
              dt_bias=torch.rand((heads,), **f) - 0.5,
              initial_states=torch.randn((batch, heads, headdim, n_state), **f),
              seq_idx=torch.tensor([[0] * cut + [1] * (length - cut)] * batch))
    cast = lambda t: t.to(dtype) if t.is_floating_point() else t  # noqa: E731
    return tuple(cast(t) for t in (x, dt, A, B, C)), {k: cast(v) for k, v in kw.items()}


DTYPES = [torch.float64, torch.float32]
#: Values of `_loop.BLOCK_ELEMENTS`: small ones force many blocks (64: often one step each) and a
#: partial last block; the default one runs the oracles as shipped.
BLOCKS = [64, 4096, _loop.BLOCK_ELEMENTS]


def _with_blocks(shapes: list[tuple], length_at: int) -> list:
    """(shape, block) pairs; one-step blocks (64) only on short lengths, where the torch loop is quick. The
    middle block (a block boundary inside every longer case, besides the one-step and the default blocks) is in
    the end-to-end tier, `make test-all`: it doubles the torch loop's share of the default tier's time."""
    return [pytest.param(shape, block, marks=[pytest.mark.e2e] if block == 4096 else [])
            for shape in shapes for block in BLOCKS if block != 64 or shape[length_at] <= 100]


def _same_both_ways(fn, *args, **kwargs):
    compiled = fn(*args, **kwargs)
    plain = _torch_only(fn, *args, **kwargs)
    _assert_same(compiled, plain)
    return compiled


# -------------------------------------------------------------------------------------- equalities
@needs_numba
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape, block", _with_blocks([(1, 1, 1), (2, 3, 37), (3, 5, 1000)], -1))
def test_linear_recurrence_bit_identical(dtype, shape, block, monkeypatch, calls):
    monkeypatch.setattr(_loop, "BLOCK_ELEMENTS", block)
    for seed, h0 in ((0, False), (1, True)):
        a, b, h = _linear(seed, *shape, dtype, h0=h0)
        _same_both_ways(linear_recurrence, a, b, h, compute_dtype=dtype)
    assert calls["recur"] > 0


SELECTIVE_OPTIONS = [  # D, z, softplus and delta_bias each present and absent
    dict(),
    dict(D=False, z=False, softplus=False, bias=False),
    dict(z=False, bias=False),
    dict(D=False, softplus=False),
]


SELECTIVE_SHAPES = [  # (batch, dim, N, L, groups of B, groups of C)
    (1, 1, 1, 1, 1, 1),
    (2, 4, 3, 29, 2, 1),
    (2, 6, 5, 300, 3, 6),
    (2, 8, 16, 1000, 1, 2),
    (2, 64, 16, 300, 1, 1),  # the benchmark's channels: 128 steps per default block, 300 = 2 * 128 + 44
]


@needs_numba
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape, block", _with_blocks(SELECTIVE_SHAPES, 3))
def test_selective_scan_bit_identical(dtype, shape, block, monkeypatch, calls):
    monkeypatch.setattr(_loop, "BLOCK_ELEMENTS", block)
    batch, dim, n_state, length, gb, gc = shape
    for seed, opts in enumerate(SELECTIVE_OPTIONS):
        args, kw = _selective(seed, batch, dim, n_state, length, dtype, groups_b=gb, groups_c=gc, **opts)
        _same_both_ways(selective_scan, *args, **kw, return_last_state=True, compute_dtype=dtype)
    assert calls["selective_scan_block"] > 0


RETENTION_SHAPES = [  # (batch, L, heads, dk, dv)
    (1, 1, 1, 1, 1),
    (2, 33, 3, 5, 7),
    (1, 700, 2, 16, 8),
    (2, 130, 4, 8, 32),
]


@needs_numba
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape, block", _with_blocks(RETENTION_SHAPES, 1))
def test_retention_bit_identical(dtype, shape, block, monkeypatch, calls):
    monkeypatch.setattr(_loop, "BLOCK_ELEMENTS", block)
    q, k, v = _retention(0, *shape, dtype)
    heads = shape[2]
    gammas = [0.5 + 0.49 * h / heads for h in range(heads)]
    _same_both_ways(retention, q, k, v, compute_dtype=dtype)
    _same_both_ways(retention, q, k, v, gamma=gammas, scale=0.3, compute_dtype=dtype)
    _same_both_ways(retention_normed, q, k, v, 1e-6, kind="layer", compute_dtype=dtype)
    # non-contiguous inputs (a transposed view): the kernel reads a contiguous copy
    qt = q.transpose(0, 1).contiguous().transpose(0, 1)
    _same_both_ways(retention, qt, k, v, compute_dtype=dtype)
    assert calls["retention_block"] > 0


GATED_SHAPES = [  # (batch, L, heads, dk, dv)
    (1, 1, 1, 1, 1),
    (2, 37, 3, 5, 4),
    (1, 300, 2, 16, 8),
    (2, 130, 4, 8, 32),
]


@needs_numba
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape, block", _with_blocks(GATED_SHAPES, 1))
def test_gated_bit_identical(dtype, shape, block, monkeypatch, calls):
    """simple GLA and GLA (initial and final state, a given scale), varlen, and SSD (D, dt_bias, softplus,
    seq_idx), as the same-dtype baselines run them."""
    monkeypatch.setattr(_loop, "BLOCK_ELEMENTS", block)
    batch, length, heads, dk, dv = shape
    for per_key, fn in ((False, simple_gla), (True, gla)):
        q, k, v, g, h0 = _gated(0, *shape, dtype, per_key=per_key)
        _same_both_ways(fn, q, k, v, g, compute_dtype=dtype)
        _same_both_ways(fn, q, k, v, g, scale=-0.3, initial_state=h0, output_final_state=True, compute_dtype=dtype)
        if length > 2:
            cu = torch.tensor([0, 1, length // 2, length])
            _same_both_ways(fn, q[:1], k[:1], v[:1], g[:1], cu_seqlens=cu, output_final_state=True,
                            compute_dtype=dtype)
    (x, dt, A, B, C), kw = _ssd_inputs(1, batch, length, heads, dv, dk, 1, dtype)
    _same_both_ways(ssd, x, dt, A, B, C, 16, D=kw["D"], dt_bias=kw["dt_bias"], dt_softplus=True, seq_idx=kw["seq_idx"],
                    compute_dtype=dtype)
    assert calls["gated_block"] > 0


@needs_numba
@pytest.mark.parametrize("dtype", DTYPES)
def test_recur_special_values_same_bits(dtype, calls):
    """inf, NaN, subnormals and signed zeros: the same bits as the torch loop (NaN: the same places)."""
    tiny = torch.finfo(dtype).tiny
    values = torch.tensor([0.0, -0.0, 1.0, -1.0, 0.5, 2.0, float("inf"), float("-inf"), float("nan"),
                           tiny / 4, -tiny / 8, tiny, 3e38 if dtype == torch.float32 else 1e308], dtype=dtype)
    g = _gen(3)
    n, size = 40, 64
    decay = values[torch.randint(len(values), (n, size), generator=g)]
    inp = values[torch.randint(len(values), (n, size), generator=g)]
    state = values[torch.randint(len(values), (size,), generator=g)]
    for per_step in (True, False):
        d = decay if per_step else decay[0]
        out_c, out_t = torch.empty_like(inp), torch.empty_like(inp)
        last_c = _loop.recur(d, inp, state, out_c, per_step_decay=per_step)
        last_t = _torch_only(_loop.recur, d, inp, state, out_t, per_step_decay=per_step)
        _assert_same((out_c, last_c), (out_t, last_t))
        last_c = _loop.recur_peak(d.abs(), state, out_c, per_step_decay=per_step)
        last_t = _torch_only(_loop.recur_peak, d.abs(), state, out_t, per_step_decay=per_step)
        _assert_same((out_c, last_c), (out_t, last_t))
    assert calls["recur"] == 2 and calls["recur_peak"] == 2


# ------------------------------------------------------------------------------------------- traces
def _torch_loop(fn, *args, **kwargs):
    """``fn(*args, **kwargs)`` with the fused kernels off: the torch block loop, `recur` compiled."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(_compiled, "FUSED", False)
        return fn(*args, **kwargs)


def _trace_same_all_ways(fn, *args, **kwargs) -> Trace:
    """The fused trace kernel's Trace, checked field by field against the pure-torch loop and the torch
    loop with `recur`/`recur_peak` compiled."""
    fused = fn(*args, **kwargs)
    _assert_same(fused, _torch_only(fn, *args, **kwargs))
    _assert_same(fused, _torch_loop(fn, *args, **kwargs))
    return fused


#: What `_extreme` plants: overflowing products (1e200 * 1e200), inf - inf, NaN, signed zeros, subnormals.
SPECIALS = (float("inf"), float("-inf"), float("nan"), 1e200, -1e200, 1e300, 0.0, -0.0, 5e-324, -1e-310)


def _extreme(x: torch.Tensor | None, seed: int, rate: float = 0.03) -> torch.Tensor | None:
    """``x`` with about ``rate`` of its entries replaced by one of `SPECIALS` (None stays None)."""
    if x is None:
        return None
    g = _gen(seed)
    specials = torch.tensor(SPECIALS, dtype=x.dtype)
    pick = specials[torch.randint(len(SPECIALS), x.shape, generator=g)]
    return torch.where(torch.rand(x.shape, generator=g) < rate, pick, x)


def _overflows(trace: Trace) -> bool:
    """The inputs reached the range's edge: some trace field holds inf or NaN."""
    fields = (trace.out, trace.magnitude, trace.growth, trace.state_peak, trace.decay_peak)
    return any(not torch.isfinite(f).all() for f in fields)


VALUES = ["typical", "extreme"]


@needs_numba
@pytest.mark.parametrize("values", VALUES)
@pytest.mark.parametrize("shape, block", _with_blocks([(1, 1, 1), (2, 3, 37), (3, 5, 1000)], -1))
def test_linear_recurrence_trace_bit_identical(values, shape, block, monkeypatch, calls):
    monkeypatch.setattr(_loop, "BLOCK_ELEMENTS", block)
    for seed, h0 in ((0, False), (1, True)):
        a, b, h = _linear(seed, *shape, torch.float64, h0=h0)
        if values == "extreme":  # |a| up to 2.75: products of decays overflow; and the specials
            a, b, h = _extreme(a * 2.5, seed + 10), _extreme(b, seed + 20), _extreme(h, seed + 30, rate=0.3)
        trace = _trace_same_all_ways(linear_recurrence_trace, a, b, h)
    assert values == "typical" or shape[-1] < 37 or _overflows(trace)
    assert calls["linear_recurrence_trace"] == 2


@needs_numba
@pytest.mark.parametrize("values", VALUES)
@pytest.mark.parametrize("shape, block", _with_blocks(SELECTIVE_SHAPES, 3))
def test_selective_scan_trace_bit_identical(values, shape, block, monkeypatch, calls):
    """Grouped and ungrouped B/C, D and z present and absent, delta_bias, softplus, several blocks."""
    monkeypatch.setattr(_loop, "BLOCK_ELEMENTS", block)
    batch, dim, n_state, length, gb, gc = shape
    for seed, opts in enumerate(SELECTIVE_OPTIONS):
        (u, delta, A, B, C), kw = _selective(seed, batch, dim, n_state, length, torch.float64, groups_b=gb,
                                             groups_c=gc, **opts)
        if values == "extreme":  # A up to +5: decays exp(d' A) > 1 that overflow; and the specials everywhere
            A = A.mul(2.5).add(2.5)
            u, delta, B, C = (_extreme(x, seed + i) for i, x in enumerate((u, delta, B, C)))
            kw = {k: _extreme(v, seed + 7) if isinstance(v, torch.Tensor) else v for k, v in kw.items()}
        trace = _trace_same_all_ways(selective_scan_trace, u, delta, A, B, C, **kw)
    assert values == "typical" or length < 29 or _overflows(trace)
    assert calls["selective_scan_trace_block"] >= len(SELECTIVE_OPTIONS)


RETENTION_TRACE_SHAPES = RETENTION_SHAPES + [(2, 300, 3, 16, 4)]  # dk > dv as well as dk < dv


@needs_numba
@pytest.mark.parametrize("values", VALUES)
@pytest.mark.parametrize("shape, block", _with_blocks(RETENTION_TRACE_SHAPES, 1))
def test_retention_trace_bit_identical(values, shape, block, monkeypatch, calls):
    """retention_trace and retention_normed_trace (rms and layer), default and given gamma and scale."""
    monkeypatch.setattr(_loop, "BLOCK_ELEMENTS", block)
    q, k, v = _retention(0, *shape, torch.float64)
    heads = shape[2]
    gammas = [0.5 + 0.49 * h / heads for h in range(heads)]
    if values == "extreme":  # |gamma| > 1 (products that overflow), a negative and a NaN decay; specials
        gammas = torch.tensor([1.5, -1.3, float("nan"), 0.9][:heads], dtype=torch.float64)
        q, k, v = (_extreme(x, i) for i, x in enumerate((q, k, v)))
    trace = _trace_same_all_ways(retention_trace, q, k, v)
    _trace_same_all_ways(retention_trace, q, k, v, gamma=gammas, scale=-0.3)
    _trace_same_all_ways(retention_normed_trace, q, k, v, 1e-6, gamma=gammas)
    _trace_same_all_ways(retention_normed_trace, q, k, v, 0.0, kind="layer")
    assert values == "typical" or shape[1] < 33 or _overflows(trace)
    assert calls["retention_trace_block"] >= 4


GATED_TRACE_SHAPES = GATED_SHAPES + [(2, 120, 3, 4, 16)]  # dv > dk as well as dk > dv


@needs_numba
@pytest.mark.parametrize("values", VALUES)
@pytest.mark.parametrize("shape, block", _with_blocks(GATED_TRACE_SHAPES, 1))
def test_gated_trace_bit_identical(values, shape, block, monkeypatch, calls):
    """simple_gla_trace, gla_trace (with and without the chunk term, initial and final state, varlen) and
    ssd_trace (ssd's input-rounding terms: dt_bias, softplus, D, z, seq_idx, initial states, groups)."""
    monkeypatch.setattr(_loop, "BLOCK_ELEMENTS", block)
    batch, length, heads, dk, dv = shape
    trace = None
    for per_key, fn in ((False, simple_gla_trace), (True, gla_trace)):
        q, k, v, g, h0 = _gated(2, *shape, torch.float64, per_key=per_key)
        if values == "extreme":  # log-decays up to +3: decays > 1 whose products overflow; and the specials
            q, k, v, h0 = (_extreme(x, i) for i, x in enumerate((q, k, v, h0)))
            g = _extreme(g.mul(-2.5).add(-2), 9)
        for chunk in (None, 16):
            trace = _trace_same_all_ways(fn, q, k, v, g, initial_state=h0, output_final_state=True, chunk_size=chunk)
            _trace_same_all_ways(fn, q, k, v, g, scale=-0.3, chunk_size=chunk)
            if length > 2:
                cu = torch.tensor([0, 1, length // 2, length])
                _trace_same_all_ways(fn, q[:1], k[:1], v[:1], g[:1], initial_state=h0[:1].expand(3, -1, -1, -1),
                                     output_final_state=True, cu_seqlens=cu, chunk_size=chunk)
    groups = 1 if heads % 2 else 2
    (x, dt, A, B, C), kw = _ssd_inputs(3, batch, length, heads, dv, dk, groups, torch.float64)
    if values == "extreme":
        A = A.mul(-2.5).add(2)
        x, dt, B, C = (_extreme(t, 20 + i) for i, t in enumerate((x, dt, B, C)))
    for chunk, opts in ((16, dict(dt_softplus=True, **kw)), (64, dict(D=kw["D"], dt_bias=kw["dt_bias"])),
                        (8, dict(z=kw["z"], initial_states=kw["initial_states"]))):
        _trace_same_all_ways(ssd_trace, x, dt, A, B, C, chunk, **opts)
    assert values == "typical" or length < 37 or _overflows(trace.out)
    assert calls["gated_trace_block"] > 0


@needs_numba
def test_traces_take_the_fused_kernels(monkeypatch, calls):
    """Each trace runs its fused kernel once per block (the gated one once for all blocks) and none of the
    torch loop's compiled pieces; with `_compiled.FUSED` off it runs the torch loop instead."""
    monkeypatch.setattr(_loop, "BLOCK_ELEMENTS", 4096)
    a, b, h = _linear(0, 2, 3, 50, torch.float64, h0=True)
    args, kw = _selective(0, 2, 4, 16, 300, torch.float64, groups_b=2)  # 32 steps per block: 10 blocks
    q, k, v = _retention(0, 2, 300, 2, 8, 8, torch.float64)  # 32 steps per block: 10 blocks
    gq, gk, gv, gate, h0 = _gated(0, 2, 300, 2, 8, 4, torch.float64, per_key=True)  # 32 steps per block: 10

    def run():
        linear_recurrence_trace(a, b, h)
        selective_scan_trace(*args, **kw)
        retention_trace(q, k, v)
        retention_normed_trace(q, k, v, 1e-6)
        gla_trace(gq, gk, gv, gate, initial_state=h0, chunk_size=64)

    run()
    assert calls == dict.fromkeys(WRAPPERS, 0) | dict(linear_recurrence_trace=1, selective_scan_trace_block=10,
                                                      retention_trace_block=2 * 10, gated_trace_block=1)
    calls.update(dict.fromkeys(WRAPPERS, 0))
    _torch_loop(run)
    assert all(calls[name] == 0 for name in TRACE_WRAPPERS) and calls["recur"] > 0 and calls["recur_peak"] > 0


# ----------------------------------------------------------------------------------- no fused FMA
def _fused_vs_unfused(d: torch.Tensor, p: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """Where ``round(d * p + x)`` (one rounding, an FMA) differs from ``round(round(d * p) + x)``.

    float64: the fused value from exact fractions (float(Fraction) is correctly rounded). float32: from
    the float64 value of d * p + x (d * p is exact in float64), rounded to float32.
    """
    unfused = d * p + x  # two torch kernels: two roundings
    if d.dtype == torch.float64:
        fused = torch.tensor([float(Fraction(a) * Fraction(b) + Fraction(c))
                              for a, b, c in zip(d.tolist(), p.tolist(), x.tolist())], dtype=torch.float64)
    else:
        fused = (d.double() * p.double() + x.double()).float()
    return fused != unfused


def _fma_sensitive(dtype: torch.dtype, size: int = 512) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(d, p, x) with ``x`` close to ``-d * p``: the cancellation exposes the product's rounding, so a
    fused and an unfused multiply-add differ on most elements."""
    g = _gen(7)
    d = torch.rand(size, generator=g, dtype=torch.float64).add(0.5).to(dtype)
    p = torch.rand(size, generator=g, dtype=torch.float64).add(0.5).to(dtype)
    x = -(d.double() * p.double()).to(dtype) * (1 + torch.finfo(dtype).eps * torch.randint(-2, 3, (size,), generator=g))
    return d, p, x.to(dtype)


@needs_numba
@pytest.mark.parametrize("dtype", DTYPES)
def test_inputs_where_fma_differs_give_the_unfused_result(dtype, calls):
    """Each multiply-add of each kernel, fed (d, p, x) so that it computes ``d * p + x``: the result is
    the unfused ``round(round(d * p) + x)`` on every element, where an FMA would differ on most. In
    float64 the trace kernels' outputs too."""
    d, p, x = _fma_sensitive(dtype)
    assert _fused_vs_unfused(d, p, x).float().mean() > 0.5, "the inputs must tell fused from unfused"
    unfused = d * p + x
    n = len(d)
    one = torch.ones_like(d)

    def outputs(oracle, trace, *args, **kwargs):
        """The oracle's output in ``dtype`` and, in float64, its trace kernel's output."""
        found = [oracle(*args, **kwargs, compute_dtype=dtype)]
        return found + [trace(*args, **kwargs).out] if dtype == torch.float64 else found

    # recur, one step from state p
    out = torch.empty((1, n), dtype=dtype)
    _loop.recur(d[None], x[None], p, out)
    assert torch.equal(out[0], unfused)
    # the linear recurrence, two steps: h_0 = 0 * 0 + p, h_1 = d * h_0 + x
    a = torch.stack([torch.zeros_like(d), d], -1)[None]
    b = torch.stack([p, x], -1)[None]
    for h in outputs(linear_recurrence, linear_recurrence_trace, a, b):
        assert torch.equal(h[0, :, 1], unfused)
    # retention, the sum over dk (dk = 2, L = 1, dv = 1, v = 1): o = q_0 k_0 + q_1 k_1 = 1 * x + d * p
    q = torch.stack([one, d], -1).view(1, 1, n, 2)
    k = torch.stack([x, p], -1).view(1, 1, n, 2)
    for o in outputs(retention, retention_trace, q, k, one.view(1, 1, n, 1), gamma=[0.5] * n, scale=1.0):
        assert torch.equal(o.view(n), unfused)
    # retention, the state update (gamma = 1, dk = dv = 1, q = 1): S_1 = 1 * S_0 + k_1 v_1 = x + d * p
    for o in outputs(retention, retention_trace, one.view(1, 1, n, 1).expand(1, 2, n, 1),
                     torch.stack([x, d], 0).view(1, 2, n, 1), torch.stack([one, p], 0).view(1, 2, n, 1),
                     gamma=[1.0] * n, scale=1.0):
        assert torch.equal(o[0, 1].view(n), unfused)
    # selective scan, one channel per element (groups = dim, d' = delta = 1):
    # the sum over N (N = 2, L = 1): h_n = exp(A) * 0 + (1 * 1) B_n = B_n, y = 1 * x + d * p
    u = one.view(1, n, 1)
    for y in outputs(selective_scan, selective_scan_trace, u, u, -torch.ones((n, 2), dtype=dtype),
                     torch.stack([x, p], -1).view(1, n, 2, 1), torch.stack([one, d], -1).view(1, n, 2, 1)):
        assert torch.equal(y.view(n), unfused)
    # the state update (N = 1, L = 2, A = 0 so exp(d' A) = 1): h_1 = 1 * x + (1 * d) * p, y = 1 * h
    u = torch.stack([one, d], -1).view(1, n, 2)
    for y in outputs(selective_scan, selective_scan_trace, u, torch.ones_like(u), torch.zeros((n, 1), dtype=dtype),
                     torch.stack([x, p], -1).view(1, n, 1, 2), torch.ones((1, n, 1, 2), dtype=dtype)):
        assert torch.equal(y[0, :, 1], unfused)
    assert calls["recur"] >= 2 and calls["retention_block"] == 2 and calls["selective_scan_block"] == 2
    if dtype == torch.float64:
        assert calls["linear_recurrence_trace"] == 1
        assert calls["retention_trace_block"] == 2 and calls["selective_scan_trace_block"] == 2


_FMA_ASM = re.compile(r"\b(v?f(n?m(add|sub)\w*)|fmla|fmls|fmadd|fmsub|fnmadd|fnmsub)\b", re.IGNORECASE)


@pytest.mark.e2e
@needs_numba
@pytest.mark.parametrize("dtype", DTYPES)
def test_generated_assembly_has_no_fma(dtype):
    """Recompiled here without the cache (cached code cannot be inspected), with the module's options."""
    import numba
    import numpy as np

    dt = np.dtype("float64" if dtype == torch.float64 else "float32")
    z = lambda *shape: np.zeros(shape, dtype=dt)  # noqa: E731
    samples = {
        "_recur_kernel": (z(3, 4), z(3, 4), z(4), z(3, 4)),
        "_recur_peak_kernel": (z(3, 4), z(4), z(3, 4), dt.type(1)),
        "_selective_scan_kernel": (z(2, 4, 5, 3), z(2, 4, 5), z(2, 4, 5), z(2, 1, 5, 3), z(2, 2, 5, 3), z(4),
                                   True, 4, 2, 0, z(2, 4, 3), z(2, 4, 5)),
        "_retention_kernel": (z(2), z(1, 5, 2, 3), z(1, 5, 2, 3), z(1, 5, 2, 4), 0, 5, z(1, 2, 3, 4), z(1, 5, 2, 4)),
        "_linear_recurrence_trace_kernel": (z(2, 3, 5), z(2, 3, 5), z(2, 3), tuple(z(2, 3, 5) for _ in range(5)),
                                            dt.type(1)),
        "_selective_scan_trace_kernel": (z(2, 4, 5, 3), z(2, 4, 5), z(2, 4, 5), z(2, 1, 5, 3), z(2, 2, 5, 3), z(4),
                                         True, 4, 2, 0, tuple(z(2, 4, 3) for _ in range(4)),
                                         tuple(z(2, 4, 5) for _ in range(5)), dt.type(3), dt.type(1)),
        "_retention_trace_kernel": (z(2), z(1, 5, 2, 3), z(1, 5, 2, 3), z(1, 5, 2, 4), 0, 5,
                                    tuple(z(1, 2, 3, 4) for _ in range(3)), z(2), tuple(z(1, 5, 2, 4) for _ in range(5)),
                                    dt.type(1)),
        "_gated_kernel": (z(5, 1, 2, 3), z(1, 5, 2, 3), z(1, 5, 2, 3), z(1, 5, 2, 4), 0, z(1, 2, 3, 4), z(1, 5, 2, 4)),
        "_gated_trace_kernel": (z(5, 1, 2, 3), z(1, 5, 2, 3), z(1, 5, 2, 3), z(1, 5, 2, 4),
                                (z(1, 5, 2, 1), z(1, 5, 2, 1)), True, z(1, 5, 2, 3), np.zeros(5, dtype=bool), True, 0,
                                tuple(z(1, 2, 3, 4) for _ in range(6)), (z(1, 2, 3), z(1, 2, 3)),
                                tuple(z(1, 5, 2, 4) for _ in range(6)), dt.type(1)),
    }
    for name in KERNELS:
        fresh = numba.njit(fastmath=False, nogil=True)(getattr(_compiled, name).py_func)
        fresh(*samples[name])
        asm = "\n".join(fresh.inspect_asm().values())
        assert re.search(r"\b(v?mul|fmul)", asm, re.IGNORECASE), f"{name}: no multiply found: wrong listing?"
        found = sorted(set(m.group(0).lower() for m in _FMA_ASM.finditer(asm)))
        assert not found, f"{name} ({dt}): fused multiply-add instructions {found}"


# ------------------------------------------------------------------------------------------ fallback
def _refuse_compiled(monkeypatch):
    """Every compiled wrapper raises: a run that succeeds took the torch loop."""
    def boom(*args, **kwargs):
        raise AssertionError("the compiled path was taken")

    for name in WRAPPERS:
        monkeypatch.setattr(_compiled, name, boom)


@pytest.fixture
def no_kernels(monkeypatch):
    _refuse_compiled(monkeypatch)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_takes_the_torch_loop(dtype, no_kernels):
    a, b, _ = _linear(0, 2, 3, 50, dtype)
    assert _loop.compiled(a, b) is None and _loop.fused(a, b) is None
    assert linear_recurrence(a, b, compute_dtype=dtype).dtype == dtype
    args, kw = _selective(0, 2, 4, 3, 50, dtype)
    assert selective_scan(*args, **kw, compute_dtype=dtype).dtype == dtype
    q, k, v = _retention(0, 1, 50, 2, 4, 4, dtype)
    assert retention(q, k, v, compute_dtype=dtype).dtype == dtype
    assert retention_normed(q, k, v, 1e-3, compute_dtype=dtype).dtype == dtype
    gq, gk, gv, gate, h0 = _gated(0, 1, 50, 2, 4, 4, dtype, per_key=True)
    assert gla(gq, gk, gv, gate, initial_state=h0, compute_dtype=dtype)[0].dtype == dtype


def test_mixed_or_non_cpu_tensors_are_not_compiled():
    x64 = torch.zeros(3, dtype=torch.float64)
    assert _loop.compiled(x64, x64.float()) is None
    assert _loop.compiled(x64, None) is (_compiled if _compiled.AVAILABLE else None)
    meta = torch.zeros(3, dtype=torch.float64, device="meta")
    assert _loop.compiled(x64, meta) is None


def test_tensors_that_need_a_gradient_are_not_compiled():
    x = torch.zeros(3, dtype=torch.float64, requires_grad=True)
    with torch.enable_grad():
        assert _loop.compiled(x) is None
    with torch.no_grad():
        assert _loop.compiled(x) is (_compiled if _compiled.AVAILABLE else None)


def _every_oracle(dtype):
    """Each oracle and trace once, on fixed inputs: (name, output) pairs."""
    a, b, h = _linear(1, 2, 3, 40, dtype, h0=True)
    args, kw = _selective(1, 2, 4, 3, 40, dtype)
    q, k, v = _retention(1, 1, 40, 2, 4, 4, dtype)
    gq, gk, gv, gate, h0 = _gated(1, 1, 40, 2, 4, 4, dtype, per_key=True)
    ssd_args, ssd_kw = _ssd_inputs(1, 1, 40, 2, 4, 4, 1, dtype)
    outs = [("linear_recurrence", linear_recurrence(a, b, h, compute_dtype=dtype)),
            ("selective_scan", selective_scan(*args, **kw, compute_dtype=dtype)),
            ("retention", retention(q, k, v, compute_dtype=dtype)),
            ("gla", gla(gq, gk, gv, gate, initial_state=h0, compute_dtype=dtype)[0]),
            ("ssd", ssd(*ssd_args, 16, D=ssd_kw["D"], compute_dtype=dtype)[0])]
    if dtype == torch.float64:
        kw64 = {n: x.double() if isinstance(x, torch.Tensor) else x for n, x in kw.items()}
        outs += [("linear_recurrence_trace", linear_recurrence_trace(a, b).out),
                 ("selective_scan_trace", selective_scan_trace(*args, **kw64).out),
                 ("retention_trace", retention_trace(q, k, v).out),
                 ("gla_trace", gla_trace(gq, gk, gv, gate, chunk_size=16).out.growth),
                 ("ssd_trace", ssd_trace(*ssd_args, 16, dt_softplus=True, **ssd_kw).out.growth)]
    return outs


@pytest.mark.skipif(not _compiled.AVAILABLE, reason="numba is not available: there is no compiled path to compare")
@pytest.mark.parametrize("dtype", DTYPES)
def test_without_numba_every_oracle_runs_in_torch(monkeypatch, dtype):
    """With numba switched off no compiled kernel is called, and every oracle and trace gives the
    compiled path's bits (the torch loop is the definition the compiled one reproduces)."""
    compiled = _every_oracle(dtype)
    monkeypatch.setattr(_compiled, "AVAILABLE", False)
    _refuse_compiled(monkeypatch)
    in_torch = _every_oracle(dtype)
    for (name, want), (_, got) in zip(compiled, in_torch):
        assert got.dtype == want.dtype and torch.equal(got, want), name


@pytest.mark.e2e
def test_environment_switch_turns_the_compiled_path_off():
    import subprocess
    import sys

    code = "from reference_impls import _compiled as c; print(c.AVAILABLE, c.UNAVAILABLE_REASON)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**__import__("os").environ, "SEQKERNEL_ORACLE_JIT": "0"})
    assert out.stdout.strip() == "False SEQKERNEL_ORACLE_JIT=0 is set"


def test_oracles_run_torch_single_threaded(monkeypatch):
    """Inside the block loops torch runs on one thread (no oversubscribed parallel regions), and the
    caller's thread count is restored afterwards."""
    seen = []

    def spy(real):
        def wrapper(*tensors):
            seen.append(torch.get_num_threads())
            return real(*tensors)
        return wrapper

    monkeypatch.setattr(_loop, "fused", spy(_loop.fused))
    monkeypatch.setattr(_loop, "compiled", spy(_loop.compiled))
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        a, b, h = _linear(1, 2, 3, 40, torch.float64, h0=True)
        linear_recurrence(a, b, h)
        args, kw = _selective(1, 2, 4, 3, 40, torch.float64)
        selective_scan(*args, **kw)
        q, k, v = _retention(1, 1, 40, 2, 4, 4, torch.float64)
        retention(q, k, v)
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
    assert len(seen) >= 3 and set(seen) == {1}, seen


# ------------------------------------------------------------------------------------------ threads
@pytest.mark.skipif(not _compiled.AVAILABLE, reason="numba is not available")
@pytest.mark.parametrize("dtype", DTYPES)
def test_every_thread_count_gives_the_same_bits(monkeypatch, dtype):
    """Rows (batch x channels, batch x heads) run in parallel; each row's arithmetic is unchanged, so one
    thread and every larger count give the same bits, traces included (odd row counts, so that the
    threads' shares differ)."""
    pool = _compiled.numba.config.NUMBA_NUM_THREADS
    if pool < 2:
        pytest.skip("numba's pool has one thread here")
    runs = []
    for threads in sorted({1, 2, pool}):
        monkeypatch.setenv(_compiled.THREADS_ENV, str(threads))
        assert _compiled.thread_budget() == threads
        runs.append(_every_oracle_with_rows(dtype))
    for other in runs[1:]:
        for (name, want), (_, got) in zip(runs[0], other):
            assert torch.equal(got, want), name


def _every_oracle_with_rows(dtype):
    a, b, h = _linear(2, 3, 5, 70, dtype, h0=True)
    args, kw = _selective(2, 3, 7, 3, 70, dtype)
    q, k, v = _retention(2, 3, 70, 3, 4, 5, dtype)
    gq, gk, gv, gate, h0 = _gated(2, 3, 70, 3, 4, 5, dtype, per_key=False)
    outs = [("selective_scan", selective_scan(*args, **kw, compute_dtype=dtype)),
            ("retention", retention(q, k, v, compute_dtype=dtype)),
            ("simple_gla", simple_gla(gq, gk, gv, gate, initial_state=h0, compute_dtype=dtype)[0])]
    if dtype == torch.float64:
        gated = simple_gla_trace(gq, gk, gv, gate, initial_state=h0, output_final_state=True, chunk_size=16)
        outs += [("linear_recurrence_trace", linear_recurrence_trace(a, b).out),
                 ("selective_scan_trace", selective_scan_trace(*args, **kw)),
                 ("retention_trace", retention_trace(q, k, v)),
                 ("simple_gla_trace", gated.out), ("simple_gla_trace.final_state", gated.final_state),
                 ("simple_gla_trace.chunk_growth", gated.chunk_growth)]
    flat = []
    for name, value in outs:
        if isinstance(value, torch.Tensor):
            flat.append((name, value))
        else:  # a Trace: every companion
            flat += [(f"{name}.{f}", getattr(value, f)) for f in ("out", "magnitude", "growth", "state_peak",
                                                                   "decay_peak")]
    return flat


@pytest.mark.parametrize("value", ["0", "-2", "two", "1.5"])
def test_a_bad_thread_budget_names_the_variable(monkeypatch, value):
    monkeypatch.setenv(_compiled.THREADS_ENV, value)
    with pytest.raises(ValueError, match=_compiled.THREADS_ENV):
        _compiled.thread_budget()


def test_the_default_budget_is_the_cores_this_process_may_use(monkeypatch):
    from reference_impls import _threads

    monkeypatch.delenv(_compiled.THREADS_ENV, raising=False)
    monkeypatch.setattr(_threads, "_process_threads", None)  # no share of the cores given (`harness.threads`)
    assert _compiled.thread_budget() == min(_compiled.available_cores(), _compiled.numba.config.NUMBA_NUM_THREADS)


@pytest.mark.e2e
@pytest.mark.skipif(not _compiled.AVAILABLE, reason="numba is not available")
def test_oracles_called_from_two_threads_at_once_agree_and_survive():
    """The kernel under test runs on another thread and may call the oracles (the sequential baselines
    do) while this one does: launches are serialized, so numba's workqueue layer, which aborts the
    process when entered from two threads at once, never sees that. Run in a child process, so that an
    abort is a failed assertion here, not a lost test session."""
    import subprocess
    import sys

    code = """
import threading, torch
from reference_impls.retention import retention
from reference_impls.selective_scan import selective_scan
g = torch.Generator().manual_seed(0)
x = [torch.randn(2, 5, 300, generator=g, dtype=torch.float64), torch.rand(2, 5, 300, generator=g, dtype=torch.float64),
     -torch.rand(5, 3, generator=g, dtype=torch.float64), torch.randn(2, 3, 300, generator=g, dtype=torch.float64),
     torch.randn(2, 3, 300, generator=g, dtype=torch.float64)]
q = torch.randn(2, 300, 3, 4, generator=g, dtype=torch.float64)
want = (selective_scan(*x), retention(q, q, q))
bad = []
def work():
    for _ in range(20):
        if not (torch.equal(selective_scan(*x), want[0]) and torch.equal(retention(q, q, q), want[1])):
            bad.append(1)
threads = [threading.Thread(target=work) for _ in range(3)]
[t.start() for t in threads]; [t.join() for t in threads]
print("OK" if not bad else "MISMATCH")
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         env={**__import__("os").environ, _compiled.THREADS_ENV: "2"})
    assert out.returncode == 0 and out.stdout.strip() == "OK", (out.returncode, out.stdout, out.stderr[-2000:])
