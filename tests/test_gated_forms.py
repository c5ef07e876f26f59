"""The in-tree gated-decay kernels (`harness.kernels.gated_forms`) against the float64 oracle.

Every form agrees with `reference_impls.gated_decay` in float64 over chunk sizes that do and do not
divide the length, initial states, final states and packed sequences: the recurrent form bit for bit,
the chunk forms within 1.5e-14 absolutely (up to 44 u magnitude) and within the chunk-aware bound
u (growth + chunk_growth + magnitude). In
float32 under strong decay (log-decay uniform in [-20, 0], T = 70, chunk 64) the stable chunk form
errs by up to 52 times the sequential loop's bound u (growth + magnitude) and stays within the chunk
term's u (growth + chunk_growth + magnitude) (at most 0.49 of it); the recurrent form stays within the
sequential bound (0.34). The cumulative-product form returns NaN there, while the exact output is
finite and small. The in-tree ssd forms (dt bias, softplus, groups, D, z, seq_idx and initial/final
states inside the kernel) agree with the ssd oracle, the recurrent one bit for bit.
"""

from __future__ import annotations

import math

import pytest
import torch

from harness.errors import InvalidArgument
from harness.kernels import gated_forms as gf
from harness.kernels.contract import Family
from reference_impls import gated_decay as gd

U64 = 2.0**-53
U32 = 2.0**-24
FORMS = ("recurrent", "chunk", "chunk_cumprod")
#: The chunk forms' extra roundings per term, beyond the sequential loop's: exp(G_t - G_s) (stable) or
#: exp(G_t) and exp(-G_s) (cumulative product), and the products of q and k with them.
CHUNK_DEPTH = 4
KERNELS = [(f"{fam}_{form}", fam == "gla") for fam in ("simple_gla", "gla") for form in FORMS]


def _case(seed, *, per_key, batch=2, length=23, heads=2, dk=4, dv=3, lo=-2.0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(batch, length, heads, dk, generator=g, dtype=torch.float64) for _ in range(2))
    v = torch.randn(batch, length, heads, dv, generator=g, dtype=torch.float64)
    shape = (batch, length, heads, dk) if per_key else (batch, length, heads)
    lg = lo * torch.rand(shape, generator=g, dtype=torch.float64)
    return [x.to(dtype) for x in (q, k, v, lg)]


def _oracle(per_key):
    return (gd.gla, gd.gla_trace) if per_key else (gd.simple_gla, gd.simple_gla_trace)


def _units(err, magnitude):
    return float(torch.where(err == 0, 0.0, err / (U64 * magnitude)).max())


@pytest.mark.parametrize("name, per_key", KERNELS)
def test_float64_agrees_with_the_oracle(name, per_key):
    """Within u (growth + depth magnitude) of the oracle and within 1e-13 absolutely. For the chunk forms
    growth holds the chunk term (their exponents of cumulative sums) and depth = `CHUNK_DEPTH` counts a
    term's extra roundings (its own exp or two, and the products with them); the recurrent form is the
    oracle's loop (depth 1)."""
    fn = getattr(gf, name)
    _, trace_fn = _oracle(per_key)
    chunked = "chunk" in name
    worst = 0.0
    for seed, length in enumerate((1, 7, 23, 64, 65)):
        q, k, v, lg = _case(seed, per_key=per_key, length=length)
        h0 = torch.randn(q.shape[0], q.shape[2], q.shape[3], v.shape[3], dtype=torch.float64) if seed % 2 else None
        for chunk_size in ((1, 5, 64) if length < 30 else (16, 64)):  # dividing the length and not
            tr = trace_fn(q, k, v, lg, initial_state=h0, output_final_state=True, chunk_size=chunk_size)
            tr = tr.with_chunk_growth() if chunked else tr
            o, final = fn(q, k, v, lg, initial_state=h0, output_final_state=True, chunk_size=chunk_size)
            assert o.dtype == torch.float64 and o.shape == tr.out.out.shape
            for got, t in ((o, tr.out), (final, tr.final_state)):
                err = (got - t.out).abs()
                assert float(err.max()) < 1e-13
                worst = max(worst, _units(err, t.growth + (CHUNK_DEPTH if chunked else 1) * t.magnitude))
    assert worst <= 1.0, f"{name}: {worst} u (growth + depth magnitude)"
    if not chunked:
        assert worst == 0.0  # the recurrent form is the oracle's loop: same operations, same order


@pytest.mark.parametrize("name, per_key", KERNELS)
def test_varlen_agrees_with_the_oracle(name, per_key):
    fn = getattr(gf, name)
    oracle, _ = _oracle(per_key)
    q, k, v, lg = _case(7, per_key=per_key, batch=1, length=30)
    cu = torch.tensor([0, 3, 17, 30])
    h0 = torch.randn(3, 2, 4, 3, dtype=torch.float64)
    o_ref, f_ref = oracle(q, k, v, lg, initial_state=h0, output_final_state=True, cu_seqlens=cu)
    o, final = fn(q, k, v, lg, initial_state=h0, output_final_state=True, cu_seqlens=cu, chunk_size=8)
    assert torch.allclose(o, o_ref, rtol=0, atol=1e-12) and torch.allclose(final, f_ref, rtol=0, atol=1e-12)
    o_leak, _ = oracle(q, k, v, lg, initial_state=h0[:1])
    assert not torch.allclose(o, o_leak, atol=1e-6)  # the case does tell a leak across boundaries


@pytest.mark.parametrize("name, per_key", KERNELS)
def test_final_state_only_when_asked(name, per_key):
    q, k, v, lg = _case(8, per_key=per_key, length=5)
    o, final = getattr(gf, name)(q, k, v, lg)
    assert final is None and o.shape == (2, 5, 2, 3)
    o0, f0 = getattr(gf, name)(q[:, :0], k[:, :0], v[:, :0], lg[:, :0], output_final_state=True)
    assert o0.shape == (2, 0, 2, 3) and torch.equal(f0, torch.zeros(2, 2, 4, 3, dtype=torch.float64))


@pytest.mark.parametrize("per_key", [False, True], ids=["simple_gla", "gla"])
def test_cumprod_form_overflows_under_strong_decay_where_the_exact_output_is_small(per_key):
    q, k, v, lg = _case(9, per_key=per_key, batch=1, length=40, lo=-20.0)
    lg = torch.full_like(lg, -20.0)  # -20 per step: exp(-cumsum) passes float32's range at step 5
    oracle, trace_fn = _oracle(per_key)
    exact, _ = oracle(q, k, v, lg)
    tr = trace_fn(q, k, v, lg)
    assert torch.isfinite(exact).all() and float(exact.abs().max()) < 100
    assert float(tr.out.state_peak.max()) < 100 and float(tr.out.decay_peak.max()) <= 1.0  # in range
    prefix = "gla_" if per_key else "simple_gla_"
    args = [x.float() for x in (q, k, v, lg)]
    o_bad, _ = getattr(gf, prefix + "chunk_cumprod")(*args, chunk_size=16)
    assert not torch.isfinite(o_bad).all()
    o_good, _ = getattr(gf, prefix + "chunk")(*args, chunk_size=16)
    assert torch.isfinite(o_good).all()
    assert float((o_good.double() - exact).abs().max()) < 1e-4
    o_mild, _ = getattr(gf, prefix + "chunk_cumprod")(*[x.float() for x in (q, k, v, lg / 40)], chunk_size=16)
    assert torch.isfinite(o_mild).all()  # the cumulative-product form is right under mild decay


def test_chunk_term_bounds_the_float32_chunk_form():
    """The stable chunk form in float32 under strong decay errs beyond the sequential loop's bound
    u (growth + magnitude) and within u (growth + chunk_growth + magnitude); the recurrent form
    stays within the sequential bound."""
    beyond = 0.0
    for seed in range(3):
        q, k, v, lg = _case(10 + seed, per_key=False, batch=1, length=70, heads=2, dk=8, dv=8, lo=-20.0)
        exact, _ = gd.simple_gla(q, k, v, lg)
        tr = gd.simple_gla_trace(q, k, v, lg, chunk_size=64)
        args = [x.float() for x in (q, k, v, lg)]
        err = (gf.simple_gla_chunk(*args, chunk_size=64)[0].double() - exact).abs()
        beyond = max(beyond, float((err / (U32 * (tr.out.growth + tr.out.magnitude))).max()))
        assert float((err / (U32 * (tr.out.growth + tr.chunk_growth + tr.out.magnitude))).max()) <= 1.0
        err_rec = (gf.simple_gla_recurrent(*args)[0].double() - exact).abs()
        assert float((err_rec / (U32 * (tr.out.growth + tr.out.magnitude))).max()) <= 1.0
    assert beyond > 5.0


@pytest.mark.parametrize("name, per_key", KERNELS)
def test_gradients_match_the_recurrent_form(name, per_key):
    q, k, v, lg = _case(11, per_key=per_key, length=9)
    h0 = torch.randn(2, 2, 4, 3, dtype=torch.float64)
    leaves = [x.clone().requires_grad_() for x in (q, k, v, lg, h0)]
    ref = [x.clone().requires_grad_() for x in (q, k, v, lg, h0)]
    fn, rec = getattr(gf, name), getattr(gf, ("gla" if per_key else "simple_gla") + "_recurrent")
    w = torch.randn(2, 9, 2, 3, dtype=torch.float64)
    o, s = fn(*leaves[:4], initial_state=leaves[4], output_final_state=True, chunk_size=4)
    o_r, s_r = rec(*ref[:4], initial_state=ref[4], output_final_state=True)
    ((o * w).sum() + s.sum()).backward()
    ((o_r * w).sum() + s_r.sum()).backward()
    for a, b in zip(leaves, ref):
        assert torch.allclose(a.grad, b.grad, rtol=1e-10, atol=1e-10)


def test_arguments_are_checked():
    q, k, v, lg = _case(12, per_key=False, batch=1, length=6)
    with pytest.raises(InvalidArgument, match=r"chunk_size=0 must be a positive int"):
        gf.simple_gla_chunk(q, k, v, lg, chunk_size=0)
    with pytest.raises(InvalidArgument, match=r"g.shape=\(1, 6, 2\); expected \(batch, T, heads, K\)"):
        gf.gla_chunk(q, k, v, lg)
    with pytest.raises(InvalidArgument, match=r"v.shape="):
        gf.simple_gla_recurrent(q, k, v[:, :3], lg)
    with pytest.raises(InvalidArgument, match=r"cu_seqlens=\[0, 4\].*T=6"):
        gf.simple_gla_chunk(q, k, v, lg, cu_seqlens=torch.tensor([0, 4]))


def test_kernel_specs():
    names = {spec.name: spec for spec in gf.KERNELS}
    assert set(names) == {f"intree.{name}" for name, _ in KERNELS} | {"intree.ssd_recurrent", "intree.ssd_chunk"}
    for spec in gf.KERNELS:
        caps = spec.capabilities
        family = spec.name.split(".")[1].rsplit("_", 1)[0].removesuffix("_chunk")
        assert spec.family is Family(family), spec.name
        assert caps.initial_state and caps.final_state and caps.varlen and caps.autograd
        assert caps.takes_chunk == ("chunk" in spec.name)
        assert spec.unavailable_reason() is None
        if spec.family is Family.SSD:
            x = torch.randn(2, 3, 2, 4, dtype=torch.float64)
            out = spec.callable()(x, torch.rand(2, 3, 2, dtype=torch.float64), -torch.rand(2, dtype=torch.float64),
                                  *(torch.randn(2, 3, 1, 5, dtype=torch.float64) for _ in range(2)), 2)
            assert out.shape == x.shape
            continue
        q, k, v, lg = _case(13, per_key=spec.family is Family.GLA, length=3)
        o, _ = spec.callable()(q, k, v, lg)
        assert o.shape == (2, 3, 2, 3)


@pytest.mark.parametrize("name", ["ssd_recurrent", "ssd_chunk"])
def test_ssd_forms_agree_with_the_oracle(name):
    fn = getattr(gf, name)
    for seed in range(6):
        g = torch.Generator().manual_seed(seed)
        batch, length, heads, headdim, groups, n_state = 2, 19, 4, 3, (1, 2, 4)[seed % 3], 5
        x = torch.randn(batch, length, heads, headdim, generator=g, dtype=torch.float64)
        dt = torch.rand(batch, length, heads, generator=g, dtype=torch.float64) * 3 - 1
        A = -torch.rand(heads, generator=g, dtype=torch.float64) * 4
        B, C = (torch.randn(batch, length, groups, n_state, generator=g, dtype=torch.float64) for _ in range(2))
        opts = {
            "D": torch.randn(heads, generator=g, dtype=torch.float64) if seed % 2 else
            torch.randn(heads, headdim, generator=g, dtype=torch.float64),
            "z": torch.randn(batch, length, heads, headdim, generator=g, dtype=torch.float64) if seed % 3 else None,
            "dt_bias": torch.rand(heads, generator=g, dtype=torch.float64) if seed % 2 else None,
            "dt_softplus": seed % 2 == 1,
            "initial_states": torch.randn(batch, heads, headdim, n_state, generator=g, dtype=torch.float64)
            if seed % 3 != 1 else None,
            "seq_idx": torch.tensor([[0] * 5 + [1] * 9 + [2] * 5, [0] * 19]) if seed >= 3 else None,
            "return_final_states": True,
        }
        chunk_size = (4, 7, 64)[seed % 3]
        y_ref, s_ref = gd.ssd(x, dt, A, B, C, chunk_size, **opts)
        y, s = fn(x, dt, A, B, C, chunk_size, **opts)
        assert torch.allclose(y, y_ref, rtol=0, atol=1e-12) and torch.allclose(s, s_ref, rtol=0, atol=1e-12)
        if name == "ssd_recurrent":
            assert torch.equal(y, y_ref)  # the oracle's loop, operation for operation
    assert fn(x, dt, A, B, C, 4).shape == x.shape  # y alone unless final states are asked for
    three = torch.randn(batch, length, 3, n_state, dtype=torch.float64)
    with pytest.raises(InvalidArgument, match=r"heads divisible by groups"):
        fn(x, dt, A, three, three, 4)


def test_the_chunk_term_bounds_both_blockings_of_a_packed_sequence():
    """A packed sequence may be chunked from its own first step (fla's varlen) or at multiples of the
    chunk size along the row (mamba-ssm's seq_idx): the chunk mass is the larger of the two at every
    step, a chunk's first step in either blocking counts, and a sequence at t0 = 0 keeps one blocking."""
    from reference_impls.gated_decay import _chunk_mass

    g_abs = torch.rand(1, 23, 1, 1, dtype=torch.float64, generator=torch.Generator().manual_seed(0)) * 20
    lam, first = _chunk_mass(g_abs, 5, 2, 23)  # the sequence runs over steps 2..22
    g = g_abs[0, :, 0, 0].tolist()

    def walk(c, t):  # sqrt of the sum of the squared partial masses |g_c| + ... + |g_i|, i = c..t
        return math.sqrt(sum(sum(g[c:i + 1]) ** 2 for i in range(c, t + 1)))

    for i, t in enumerate(range(2, 23)):
        own, row = walk(t - (t - 2) % 5, t), walk(t - t % 5, t)
        assert float(lam[0, i, 0, 0]) == pytest.approx(max(own, row), rel=1e-12)
        assert bool(first[i]) == ((t - 2) % 5 == 0 or t % 5 == 0)
    lam0, first0 = _chunk_mass(g_abs, 5)
    assert torch.equal(first0, torch.arange(23) % 5 == 0)
    assert lam0[0, :, 0, 0].tolist() == pytest.approx([walk(t - t % 5, t) for t in range(23)], rel=1e-12)


def test_the_chunk_term_grows_with_the_chunk_length_like_a_random_walk():
    """The float16 case a 200-example ci search found: the in-tree chunk form at chunk 861 (L=2048,
    strong decay) erred 2.1 times a chunk term of the mass alone (33x the float16 loop), on a head of mild
    decay where hundreds of roundings of the cumulative sum add up; the random-walk term covers it."""
    from harness.cases import problem_from_json
    from harness.kernels.registry import get
    from harness.runner import run_case

    p = problem_from_json({"batch": 1, "chunk_size": 861, "device": "cpu", "dk": 11, "dtype": "float16", "dv": 4,
                           "eps": None, "family": "simple_gla", "heads": 3, "length": 2048,
                           "regime": "strong_decay", "seed": 25453753, "tf32": False}, "problem")
    rec = run_case(get("intree.simple_gla_chunk"), p)
    assert rec["verdict"] in ("equivalent", "out_of_domain") and rec["cond_max"] <= 1, (rec["verdict"], rec.get("why"))


def test_ssd_chunk_restarting_at_each_sequence_is_not_a_false_alarm():
    """The float64 case a 200-example ci search found: cu_seqlens [0, 2, 196], chunk 98, strong decay.
    The in-tree ssd chunk form restarts its chunks at the second sequence (chunks 2..99, 100..195), so
    at t = 99 its decay factors carry 97 steps of log-decay mass; a bound made for row chunks (98..195)
    gave cond 1.76 there. Bounding both blockings: equivalent, cond 0.14."""
    from harness.cases import problem_from_json
    from harness.kernels.registry import get
    from harness.runner import run_case

    p = problem_from_json({"batch": 1, "chunk_size": 98, "cu_seqlens": [0, 2, 196], "delta_softplus": False,
                           "device": "cpu", "dim": 4, "dk": 8, "dtype": "float64", "dv": 2, "eps": None,
                           "family": "ssd", "groups": 1, "has_D": False, "has_delta_bias": False, "has_z": False,
                           "heads": 1, "length": 196, "regime": "strong_decay", "seed": 1, "state": 1,
                           "tf32": False}, "problem")
    rec = run_case(get("intree.ssd_chunk"), p)
    assert rec["verdict"] == "equivalent" and rec["cond_max"] < 0.5, (rec["verdict"], rec.get("why"))


@pytest.mark.parametrize("per_key", [False, True], ids=["simple_gla", "gla"])
def test_a_long_chunk_is_formed_in_tiles_with_the_same_result(monkeypatch, per_key):
    """A chunk as long as the sequence (legal: the kernels take any chunk size) forms its scores in square
    tiles, the keys before a tile carried as a running sum, so its memory is one tile (the nightly
    calibration drew chunk ~ L = 13,809 for gla: one (n, n, K) block was 116 GB; blocks of query rows
    against all keys before them still grew to 21 GB and 120 s: kernel_errors on a correct kernel); the
    tiled outputs equal the one-tile outputs to float64 rounding."""
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 37, 3, 4, dtype=torch.float64, generator=g) for _ in range(3))
    lg = -torch.rand(2, 37, 3, 4 if per_key else 1, dtype=torch.float64, generator=g) * 3
    if not per_key:
        lg = lg[..., 0]
    fn = gf.gla_chunk if per_key else gf.simple_gla_chunk
    whole, whole_state = fn(q, k, v, lg, chunk_size=37, output_final_state=True)
    calls = []
    real = gf.intra_scores
    monkeypatch.setattr(gf, "intra_scores",
                        lambda *a, **kw: calls.append((a[0].shape[2], a[1].shape[2])) or real(*a, **kw))
    kg = 4 if per_key else 1
    monkeypatch.setattr(gf, "INTRA_BLOCK_ELEMENTS", 2 * 3 * kg * 5 * 5 + 7)
    assert gf.intra_tile_rows(2, 3, kg) == 5
    tiled, tiled_state = fn(q, k, v, lg, chunk_size=37, output_final_state=True)
    assert calls == [(5, 5)] * 7 + [(2, 2)]  # 37 rows in tiles of 5, each against its own keys only
    torch.testing.assert_close(tiled, whole, rtol=1e-13, atol=1e-14)
    torch.testing.assert_close(tiled_state, whole_state, rtol=1e-13, atol=1e-14)


@pytest.mark.parametrize("chunk_size", [512, 300])
def test_a_long_chunk_in_float16_restarts_its_decays_at_each_tile(monkeypatch, chunk_size):
    """Under strong decay a whole long chunk's cumsum(g) passes float16's max (65,504) and two of them
    differ by inf - inf = NaN (found by the nightly calibration: chunk 4,811, float16, NaN from the second
    chunk on). Formed in sub-chunks from each chunk's own start, the chunk form stays finite and agrees
    with the recurrent form; its chunk boundaries stay where ``chunk_size`` puts them."""
    g = torch.Generator().manual_seed(7)
    q, k, v = (torch.randn(1, 700, 2, 4, generator=g).to(torch.float16) for _ in range(3))
    lg = (-200.0 * torch.rand(1, 700, 2, 4, generator=g) - 100.0).to(torch.float16)  # exp(g) is 0
    monkeypatch.setattr(gf, "INTRA_BLOCK_ELEMENTS", 2 * 4 * 64 * 64)
    starts = []
    real = gf.chunk_decays
    monkeypatch.setattr(gf, "chunk_decays", lambda gc: starts.append(gc.shape[2]) or real(gc))
    out, state = gf.gla_chunk(q, k, v, lg, chunk_size=chunk_size, output_final_state=True)
    ref, ref_state = gf.gla_recurrent(q, k, v, lg, output_final_state=True)
    assert torch.isfinite(out).all() and torch.isfinite(state).all()
    torch.testing.assert_close(out.double(), ref.double(), rtol=2e-3, atol=2e-3)
    torch.testing.assert_close(state.double(), ref_state.double(), rtol=2e-3, atol=2e-3)
    # sub-chunks of 64 restart at every multiple of chunk_size: 300 -> 64 x 4 + 44, twice, then 64 + 36
    within = [min(64, n - i) for n in [min(chunk_size, 700 - c) for c in range(0, 700, chunk_size)]
              for i in range(0, n, 64)]
    assert starts == within


def test_a_float16_chunk_that_fits_one_block_restarts_its_decays_where_its_sum_could_overflow(monkeypatch):
    """The same overflow in a chunk short enough for one block (batch 1 x heads 1: up to 4,096 rows): the
    nightly calibration's seed 42 had the in-tree SSD chunk form NaN from t = 3,120 (chunk 3,120 of L = 6,241,
    float16, strong decay) where the exact output is in range. A float16 chunk whose log-decay mass could
    pass half of float16's max runs in sub-chunks too; a chunk of milder decay is formed whole as before."""
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 800, 1, 4, generator=g).to(torch.float16) for _ in range(3))
    strong = (-100.0 * torch.rand(1, 800, 1, 4, generator=g) - 60.0).to(torch.float16)  # mass > 48,000
    starts = []
    real = gf.chunk_decays
    monkeypatch.setattr(gf, "chunk_decays", lambda gc: starts.append(gc.shape[2]) or real(gc))
    out, state = gf.gla_chunk(q, k, v, strong, chunk_size=800, output_final_state=True)
    ref, ref_state = gf.gla_recurrent(q, k, v, strong, output_final_state=True)
    assert torch.isfinite(out).all() and torch.isfinite(state).all()
    torch.testing.assert_close(out.double(), ref.double(), rtol=2e-3, atol=2e-3)
    assert starts == [64] * 12 + [32]
    starts.clear()
    gf.gla_chunk(q, k, v, strong / 1000, chunk_size=800)  # mass about 80: one chunk, formed whole
    assert starts == [800]
    starts.clear()
    # each chunk's mass about 11,000, the sequence's 44,000: judged chunk by chunk, each formed whole
    out = gf.gla_chunk(q, k, v, strong / 2, chunk_size=200)[0]
    assert float((strong.float() / 2).abs().sum(1).max()) > 32752 and starts == [200] * 4 and torch.isfinite(out).all()


def test_a_chunk_of_the_whole_sequence_stays_within_its_tile(monkeypatch):
    """The work of a long chunk is linear in its length: 4,096 steps in one chunk, tiles of 64, agree with
    the recurrent form in float64 and never form more than one tile of scores."""
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(1, 4096, 2, 8, dtype=torch.float64, generator=g) for _ in range(3))
    lg = -torch.rand(1, 4096, 2, 8, dtype=torch.float64, generator=g) * 0.05
    monkeypatch.setattr(gf, "INTRA_BLOCK_ELEMENTS", 2 * 8 * 64 * 64)
    largest = []
    real = gf.intra_scores
    monkeypatch.setattr(gf, "intra_scores",
                        lambda *a, **kw: largest.append(a[0].shape[2] * a[1].shape[2]) or real(*a, **kw))
    out, state = gf.gla_chunk(q, k, v, lg, chunk_size=4096, output_final_state=True)
    ref, ref_state = gf.gla_recurrent(q, k, v, lg, output_final_state=True)
    assert len(largest) == 64 and max(largest) == 64 * 64
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(state, ref_state, rtol=1e-10, atol=1e-10)


_GROWTH_SCRIPT = """
import resource, torch
from harness.kernels import gated_forms as gf
L = 8192
g = torch.Generator().manual_seed(0)
q, k, v = (torch.randn(1, L, 1, 64, dtype=torch.float64, generator=g) for _ in range(3))
lg = -torch.rand(1, L, 1, 64, dtype=torch.float64, generator=g) * 0.1
with torch.no_grad():
    gf.chunk_form(q[:, :128], k[:, :128], v[:, :128], lg[:, :128], 0.125, None, 129)  # two tiles: warm
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    gf.chunk_form(q, k, v, lg, 0.125, None, L + 1)
print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024)
"""


@pytest.mark.e2e
def test_a_long_chunk_s_tiles_do_not_grow_the_process():
    """The nightly calibration's kill: `intree.gla_chunk` float64, one chunk of L = 28,737 formed in 449
    tiles, grew to 11 GB and was killed for memory, though one tile's scores are 25 MB. The tiles' outputs,
    kept in a list while each tile's temporaries came and went, split glibc's free memory so that every
    next temporary took new memory. Filled in place, the peak past two tiles' is flat in L: here 128 tiles
    add 8 MB (the output is 4 MB); kept in a list they added 213 MB. In a fresh process with glibc's
    default allocator settings, where the growth shows."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    done = subprocess.run([sys.executable, "-c", _GROWTH_SCRIPT], capture_output=True, text=True,
                          env=dict(env, OMP_NUM_THREADS="1"), timeout=120)
    assert done.returncode == 0, done.stderr
    grown_mib = float(done.stdout.split()[-1])
    assert grown_mib < 48, f"128 tiles of one chunk grew the process by {grown_mib:.0f} MiB"
