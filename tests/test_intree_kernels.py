"""The in-tree kernels (Blelloch scans, RetNet's three forms, the sequential baselines) against the definition.

Each in-tree kernel is checked in float64 on the CPU against the sequential definition to ~1e-12
relative (normwise: the largest error over the largest reference value), over hypothesis-drawn shapes,
lengths that are and are not powers of two, chunk sizes that do and do not divide the length, grouped
B/C and the selective-scan options; in float32 to ~1e-4 relative on benign inputs (decays inside the
unit disk, positive step sizes). Also: the kernels never modify their inputs, autograd works, the
retention forms agree with each other, and the sequential baselines wrap the oracles.

The sequential definition is `reference_impls` (the float64 oracles) when it imports; until it lands the
small float64 loops below stand in for it. The loops are kept either way: they are checked against the
oracles when both exist.
"""

from __future__ import annotations

import importlib
import math

import pytest
import torch

from reference_impls import autograd as ad
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.errors import InvalidArgument
from harness.kernels import blelloch, retnet_forms, sequential
from harness.kernels.contract import ALL_DTYPES, Family, retnet_gammas

LENGTHS = (1, 2, 3, 5, 7, 8, 9, 31, 33, 100)
F64 = torch.float64


# --------------------------------------------------------------------------- the sequential definition


def loop_linear_scan(a: torch.Tensor, b: torch.Tensor, dtype: torch.dtype = F64) -> torch.Tensor:
    """The plain loop in ``dtype`` (`reference_impls.autograd`, the oracle's definition written out of place)."""
    return ad.linear_recurrence(a.to(dtype), b.to(dtype))


def loop_selective_scan(u, delta, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False):
    up = lambda x: None if x is None else x.to(F64)  # noqa: E731
    return ad.selective_scan(*(up(x) for x in (u, delta, A, B, C)), D=up(D), z=up(z), delta_bias=up(delta_bias),
                             delta_softplus=delta_softplus)


def loop_retention(q, k, v, gamma=None, scale=None):
    heads, dk = q.shape[2], q.shape[3]
    return ad.retention(q.to(F64), k.to(F64), v.to(F64), retnet_gammas(heads) if gamma is None else gamma,
                        dk**-0.5 if scale is None else scale)


def loop_retention_normed(q, k, v, eps, gamma=None, scale=None):
    heads, dk = q.shape[2], q.shape[3]
    return ad.retention_normed(q.to(F64), k.to(F64), v.to(F64), eps, retnet_gammas(heads) if gamma is None else gamma,
                               dk**-0.5 if scale is None else scale)


def _oracle_module(name: str, attr: str):
    try:
        mod = importlib.import_module(f"reference_impls.{name}")
    except ImportError:
        return None
    return getattr(mod, attr, None)


def _out(result) -> torch.Tensor:
    if isinstance(result, (tuple, list)):
        result = result[0]
    return getattr(result, "out", result)


ORACLE_SCAN = _oracle_module("linear_recurrence", "linear_recurrence")
ORACLE_SELECTIVE = _oracle_module("selective_scan", "selective_scan")
ORACLE_RETENTION = _oracle_module("retention", "retention")
ORACLE_RETENTION_NORMED = _oracle_module("retention", "retention_normed")
ORACLE_GATED = _oracle_module("gated_decay", "simple_gla")


def definition_scan(a, b):
    return _out(ORACLE_SCAN(a, b)) if ORACLE_SCAN else loop_linear_scan(a, b)


def definition_selective(*args, **kwargs):
    return _out(ORACLE_SELECTIVE(*args, **kwargs)) if ORACLE_SELECTIVE else loop_selective_scan(*args, **kwargs)


def definition_retention(q, k, v, gamma=None, scale=None):
    if ORACLE_RETENTION:
        return _out(ORACLE_RETENTION(q, k, v, gamma=gamma, scale=scale))
    return loop_retention(q, k, v, gamma, scale)


def definition_retention_normed(q, k, v, eps, gamma=None, scale=None):
    if ORACLE_RETENTION_NORMED:
        return _out(ORACLE_RETENTION_NORMED(q, k, v, eps, gamma=gamma, scale=scale))
    return loop_retention_normed(q, k, v, eps, gamma, scale)


# --------------------------------------------------------------------------- helpers


def assert_rel_close(actual: torch.Tensor, expected: torch.Tensor, rtol: float, like: torch.Tensor) -> None:
    """Normwise: max |actual - expected| <= rtol * max |expected|; dtype and shape as ``like`` promises."""
    __tracebackhide__ = True
    assert actual.dtype == like.dtype, f"kernel returned {actual.dtype}, expected the input dtype {like.dtype}"
    assert actual.shape == expected.shape, f"shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    assert torch.isfinite(actual).all(), "kernel output has NaN/Inf on benign inputs"
    diff = (actual.to(F64) - expected.to(F64)).abs()
    scale = max(expected.abs().max().item(), 1e-300) if expected.numel() else 1.0
    worst = diff.max().item() if diff.numel() else 0.0
    index = tuple(int(i) for i in torch.unravel_index(diff.argmax(), diff.shape)) if diff.numel() else ()
    assert worst <= rtol * scale, (
        f"greatest difference {worst:.3e} at index {index} exceeds rtol={rtol:g} * max|expected|={scale:.3e} "
        f"(actual {actual.to(F64)[index].item()!r}, expected {expected.to(F64)[index].item()!r})"
    )


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def scan_inputs(seed, batch, channels, length, dtype=F64):
    g = _gen(seed)
    a = torch.empty(batch, channels, length, dtype=F64).uniform_(-1.0, 1.0, generator=g)
    b = torch.randn(batch, channels, length, dtype=F64, generator=g)
    return a.to(dtype), b.to(dtype)


def selective_inputs(seed, batch, dim, state, length, groups, *, grouped, use_d, use_z, use_bias, softplus, dtype=F64):
    g = _gen(seed)

    def randn(*shape):
        return torch.randn(*shape, dtype=F64, generator=g)

    u = randn(batch, dim, length)
    if softplus:
        delta = randn(batch, dim, length)
        bias = 0.5 * randn(dim)
    else:  # positive step sizes keep exp(delta A) inside (0, 1)
        delta = torch.rand(batch, dim, length, dtype=F64, generator=g) * 0.5
        bias = torch.rand(dim, dtype=F64, generator=g) * 0.2
    A = -torch.exp(0.5 * randn(dim, state))
    bc_shape = (batch, groups, state, length) if grouped else (batch, state, length)
    B, C = randn(*bc_shape), randn(*bc_shape)
    kwargs = dict(
        D=randn(dim) if use_d else None,
        z=randn(batch, dim, length) if use_z else None,
        delta_bias=bias if use_bias else None,
        delta_softplus=softplus,
    )
    cast = lambda x: x.to(dtype) if isinstance(x, torch.Tensor) else x  # noqa: E731
    return tuple(map(cast, (u, delta, A, B, C))), {key: cast(val) for key, val in kwargs.items()}


def retention_inputs(seed, batch, length, heads, dk, dv, dtype=F64):
    g = _gen(seed)
    q = torch.randn(batch, length, heads, dk, dtype=F64, generator=g)
    k = torch.randn(batch, length, heads, dk, dtype=F64, generator=g)
    v = torch.randn(batch, length, heads, dv, dtype=F64, generator=g)
    return q.to(dtype), k.to(dtype), v.to(dtype)


seeds = st.integers(0, 2**31 - 1)
lengths = st.one_of(st.sampled_from(LENGTHS), st.integers(1, 40))


@st.composite
def chunk_for(draw, length: int) -> int:
    """Chunk sizes of every kind: 1, 2, odd, = L, > L, not dividing L, anything up to L + 3."""
    return draw(
        st.one_of(
            st.sampled_from([1, 2, 3, 5, length, length + 1, length + 7]),
            st.integers(1, length + 3),
        )
    )


conventions = st.one_of(
    st.just((None, None)),
    st.tuples(st.floats(0.5, 0.999), st.sampled_from([None, 0.3, 1.0])),
)


def _gamma_list(gamma, heads):
    return None if gamma is None else [gamma ** (1 + h) for h in range(heads)]


# --------------------------------------------------------------------------- the registry entries


KERNEL_MODULES = (blelloch, retnet_forms, sequential)


def test_kernel_names_and_families():
    names = {spec.name: spec.family for mod in KERNEL_MODULES for spec in mod.KERNELS}
    assert names == {
        "intree.blelloch_scan": Family.LINEAR_SCAN,
        "intree.blelloch_selective_scan": Family.SELECTIVE_SCAN,
        "intree.retention_parallel": Family.RETENTION,
        "intree.retention_recurrent": Family.RETENTION,
        "intree.retention_chunkwise": Family.RETENTION,
        "intree.retention_normed_parallel": Family.RETENTION_NORMED,
        "intree.retention_normed_recurrent": Family.RETENTION_NORMED,
        "intree.retention_normed_chunkwise": Family.RETENTION_NORMED,
        "intree.sequential_scan": Family.LINEAR_SCAN,
        "intree.sequential_selective_scan": Family.SELECTIVE_SCAN,
        "intree.sequential_retention": Family.RETENTION,
        "intree.sequential_retention_normed": Family.RETENTION_NORMED,
        "intree.sequential_simple_gla": Family.SIMPLE_GLA,
        "intree.sequential_gla": Family.GLA,
        "intree.sequential_ssd": Family.SSD,
    }
    for mod in (blelloch, retnet_forms):
        for spec in mod.KERNELS:
            caps = spec.capabilities
            assert caps.dtypes == ALL_DTYPES and set(caps.devices) == {"cpu", "cuda"} and caps.autograd
            assert caps.takes_chunk == spec.name.endswith("chunkwise")
            if caps.takes_chunk:
                assert caps.chunk_sizes == ()
            assert all(caps.accepts_length(n, 3) for n in LENGTHS)
            assert spec.unavailable_reason() is None and callable(spec.callable())


def test_baselines_cover_every_family():
    assert set(sequential.BASELINES) == set(Family)
    for family in sequential.BASELINES:
        assert sequential.baseline_for(family).family is family
        assert sequential.baseline_for(family.value) is sequential.BASELINES[family]
    with pytest.raises(InvalidArgument):
        sequential.baseline_for("not_a_family")


def test_baselines_unavailable_with_a_reason_until_the_oracles_exist():
    for spec in sequential.KERNELS:
        reason = spec.unavailable_reason()
        module = {
            Family.LINEAR_SCAN: ORACLE_SCAN,
            Family.SELECTIVE_SCAN: ORACLE_SELECTIVE,
            Family.RETENTION: ORACLE_RETENTION,
            Family.RETENTION_NORMED: ORACLE_RETENTION_NORMED,
            Family.SIMPLE_GLA: ORACLE_GATED,
            Family.GLA: ORACLE_GATED,
            Family.SSD: ORACLE_GATED,
        }[spec.family]
        assert (reason is None) == (module is not None), reason
        if reason is not None:
            assert "reference_impls" in reason


# --------------------------------------------------------------------------- Blelloch scans


@settings(max_examples=60, deadline=None)
@given(seed=seeds, batch=st.integers(1, 2), channels=st.integers(1, 3), length=lengths)
def test_blelloch_scan_matches_definition_float64(seed, batch, channels, length):
    a, b = scan_inputs(seed, batch, channels, length)
    assert_rel_close(blelloch.blelloch_linear_scan(a, b), definition_scan(a, b), 1e-12, a)


@settings(max_examples=30, deadline=None)
@given(seed=seeds, length=st.sampled_from(LENGTHS))
def test_blelloch_scan_is_exact_on_integers(seed, length):
    """Decays in {-1, 0, 1} and small integer drives keep every partial result exact: any misplaced
    element of the tree shows as a nonzero difference."""
    g = _gen(seed)
    a = torch.randint(-1, 2, (2, 3, length), generator=g).to(F64)
    b = torch.randint(-4, 5, (2, 3, length), generator=g).to(F64)
    assert torch.equal(blelloch.blelloch_linear_scan(a, b), loop_linear_scan(a, b))


@settings(max_examples=30, deadline=None)
@given(seed=seeds, length=lengths)
def test_blelloch_scan_float32(seed, length):
    a, b = scan_inputs(seed, 2, 3, length, dtype=torch.float32)
    assert_rel_close(blelloch.blelloch_linear_scan(a, b), loop_linear_scan(a, b), 1e-4, a)


def test_blelloch_scan_any_leading_shape_and_bad_arguments():
    a, b = scan_inputs(0, 2, 3, 11)
    flat = blelloch.blelloch_linear_scan(a.reshape(6, 11), b.reshape(6, 11))
    assert torch.equal(flat.reshape(2, 3, 11), blelloch.blelloch_linear_scan(a, b))
    with pytest.raises(InvalidArgument, match="a.shape"):
        blelloch.blelloch_linear_scan(a, b[..., :5])


selective_options = dict(
    grouped=st.booleans(), use_d=st.booleans(), use_z=st.booleans(), use_bias=st.booleans(), softplus=st.booleans()
)


@settings(max_examples=50, deadline=None)
@given(
    seed=seeds,
    batch=st.integers(1, 2),
    groups=st.integers(1, 3),
    per_group=st.integers(1, 2),
    state=st.integers(1, 4),
    length=lengths,
    **selective_options,
)
def test_blelloch_selective_scan_matches_definition_float64(seed, batch, groups, per_group, state, length, **opts):
    args, kwargs = selective_inputs(seed, batch, groups * per_group, state, length, groups, **opts)
    out = blelloch.blelloch_selective_scan(*args, **kwargs)
    assert_rel_close(out, definition_selective(*args, **kwargs), 1e-12, args[0])


@settings(max_examples=25, deadline=None)
@given(seed=seeds, length=lengths, **selective_options)
def test_blelloch_selective_scan_float32(seed, length, **opts):
    args, kwargs = selective_inputs(seed, 2, 4, 3, length, 2, dtype=torch.float32, **opts)
    out = blelloch.blelloch_selective_scan(*args, **kwargs)
    assert_rel_close(out, loop_selective_scan(*args, **kwargs), 1e-4, args[0])


def test_blelloch_selective_scan_rejects_bad_groups():
    args, kwargs = selective_inputs(0, 1, 4, 2, 5, 3, grouped=True, use_d=False, use_z=False, use_bias=False,
                                    softplus=False)
    with pytest.raises(InvalidArgument, match="G dividing dim"):
        blelloch.blelloch_selective_scan(*args, **kwargs)


# --------------------------------------------------------------------------- retention


RETENTION_FORMS = {
    "parallel": retnet_forms.retention_parallel,
    "recurrent": retnet_forms.retention_recurrent,
    "chunkwise": retnet_forms.retention_chunkwise,
}
NORMED_FORMS = {
    "parallel": retnet_forms.retention_parallel_normed,
    "recurrent": retnet_forms.retention_recurrent_normed,
    "chunkwise": retnet_forms.retention_chunkwise_normed,
}


@settings(max_examples=50, deadline=None)
@given(
    data=st.data(),
    seed=seeds,
    batch=st.integers(1, 2),
    heads=st.integers(1, 3),
    dk=st.integers(1, 5),
    dv=st.integers(1, 5),
    length=lengths,
    convention=conventions,
)
def test_retention_forms_match_definition_float64(data, seed, batch, heads, dk, dv, length, convention):
    q, k, v = retention_inputs(seed, batch, length, heads, dk, dv)
    gamma, scale = _gamma_list(convention[0], heads), convention[1]
    expected = definition_retention(q, k, v, gamma=gamma, scale=scale)
    chunk = data.draw(chunk_for(length), label="chunk_size")
    for name, fn in RETENTION_FORMS.items():
        extra = {"chunk_size": chunk} if name == "chunkwise" else {}
        assert_rel_close(fn(q, k, v, gamma=gamma, scale=scale, **extra), expected, 1e-12, q)


@settings(max_examples=30, deadline=None)
@given(
    data=st.data(),
    seed=seeds,
    heads=st.integers(1, 3),
    length=lengths,
    eps=st.sampled_from([1e-6, 1e-3, 0.5]),
)
def test_retention_normed_forms_match_definition_float64(data, seed, heads, length, eps):
    q, k, v = retention_inputs(seed, 2, length, heads, 3, 4)
    expected = definition_retention_normed(q, k, v, eps)
    chunk = data.draw(chunk_for(length), label="chunk_size")
    for name, fn in NORMED_FORMS.items():
        extra = {"chunk_size": chunk} if name == "chunkwise" else {}
        assert_rel_close(fn(q, k, v, eps, **extra), expected, 1e-12, q)


@settings(max_examples=20, deadline=None)
@given(seed=seeds, length=lengths, heads=st.integers(1, 4))
def test_retention_forms_agree_with_each_other_float64(seed, length, heads):
    """Every chunk size from 1 to L + 2 gives the parallel form's output, and so does the recurrent form."""
    q, k, v = retention_inputs(seed, 1, length, heads, 2, 3)
    parallel = retnet_forms.retention_parallel(q, k, v)
    assert_rel_close(retnet_forms.retention_recurrent(q, k, v), parallel, 1e-12, q)
    for chunk in sorted({*range(1, min(length, 12) + 1), length, length + 1, length + 2}):
        assert_rel_close(retnet_forms.retention_chunkwise(q, k, v, chunk_size=chunk), parallel, 1e-12, q)


@settings(max_examples=20, deadline=None)
@given(data=st.data(), seed=seeds, length=lengths)
def test_retention_forms_float32(data, seed, length):
    q, k, v = retention_inputs(seed, 2, length, 3, 4, 4, dtype=torch.float32)
    expected = loop_retention(q, k, v)
    chunk = data.draw(chunk_for(length), label="chunk_size")
    for name, fn in RETENTION_FORMS.items():
        extra = {"chunk_size": chunk} if name == "chunkwise" else {}
        assert_rel_close(fn(q, k, v, **extra), expected, 1e-4, q)
    expected = loop_retention_normed(q, k, v, 1e-5)
    for name, fn in NORMED_FORMS.items():
        extra = {"chunk_size": chunk} if name == "chunkwise" else {}
        assert_rel_close(fn(q, k, v, 1e-5, **extra), expected, 1e-4, q)


@pytest.mark.parametrize("chunk_size", [0, -3, 2.5, True, None, "4"])
def test_chunkwise_rejects_a_bad_chunk_size(chunk_size):
    q, k, v = retention_inputs(0, 1, 4, 1, 2, 2)
    with pytest.raises(InvalidArgument, match="chunk_size"):
        retnet_forms.retention_chunkwise(q, k, v, chunk_size=chunk_size)


def test_retention_rejects_a_gamma_per_head_of_the_wrong_length():
    q, k, v = retention_inputs(0, 1, 4, 3, 2, 2)
    with pytest.raises(InvalidArgument, match="gamma"):
        retnet_forms.retention_parallel(q, k, v, gamma=[0.9, 0.8])


def test_rms_group_norm():
    o = torch.tensor([[3.0, 4.0], [0.0, 0.0]], dtype=F64)
    out = retnet_forms.rms_group_norm(o, 0.0 + 1e-300)
    assert torch.allclose(out[0], torch.tensor([3.0, 4.0], dtype=F64) / math.sqrt(12.5))
    assert torch.equal(out[1], torch.zeros(2, dtype=F64))


# --------------------------------------------------------------------------- every kernel: inputs, dtypes, autograd


#: The single-output kernels exercised here; the gated families' (which return (output, final state))
#: have their own tests (tests/test_gated_families.py).
GATED = (Family.SIMPLE_GLA, Family.GLA, Family.SSD)
SPECS = {spec.name: spec for mod in KERNEL_MODULES for spec in mod.KERNELS if spec.family not in GATED}


def _calls(dtype=F64, length=7, requires_grad=False):
    """name -> (fn, args, kwargs) for every in-tree kernel on small benign inputs."""
    a, b = scan_inputs(1, 2, 3, length, dtype)
    sel_args, sel_kwargs = selective_inputs(2, 2, 4, 3, length, 2, grouped=True, use_d=True, use_z=True,
                                            use_bias=True, softplus=True, dtype=dtype)
    q, k, v = retention_inputs(3, 1, length, 2, 3, 4, dtype)
    for t in [a, b, *_tensors(sel_args, sel_kwargs), q, k, v]:
        t.requires_grad_(requires_grad)
    qkv, qkv_eps, chunk = (q, k, v), (q, k, v, 1e-3), {"chunk_size": 3}
    return {
        "intree.blelloch_scan": (blelloch.blelloch_linear_scan, (a, b), {}),
        "intree.blelloch_selective_scan": (blelloch.blelloch_selective_scan, sel_args, sel_kwargs),
        "intree.retention_parallel": (retnet_forms.retention_parallel, qkv, {}),
        "intree.retention_recurrent": (retnet_forms.retention_recurrent, qkv, {}),
        "intree.retention_chunkwise": (retnet_forms.retention_chunkwise, qkv, chunk),
        "intree.retention_normed_parallel": (retnet_forms.retention_parallel_normed, qkv_eps, {}),
        "intree.retention_normed_recurrent": (retnet_forms.retention_recurrent_normed, qkv_eps, {}),
        "intree.retention_normed_chunkwise": (retnet_forms.retention_chunkwise_normed, qkv_eps, chunk),
        "intree.sequential_scan": (sequential.sequential_linear_scan, (a, b), {}),
        "intree.sequential_selective_scan": (sequential.sequential_selective_scan, sel_args, sel_kwargs),
        "intree.sequential_retention": (sequential.sequential_retention, qkv, {}),
        "intree.sequential_retention_normed": (sequential.sequential_retention_normed, qkv_eps, {}),
    }


def _tensors(args, kwargs):
    return [x for x in (*args, *kwargs.values()) if isinstance(x, torch.Tensor)]


def _skip_if_unavailable(name: str) -> None:
    reason = SPECS[name].unavailable_reason()
    if reason is not None:
        pytest.skip(f"{name} is unavailable: {reason}")


def test_every_kernel_is_exercised():
    assert set(_calls()) == set(SPECS)


@pytest.mark.parametrize("name", sorted(SPECS))
def test_kernel_specs_load_the_tested_functions(name):
    _skip_if_unavailable(name)
    assert SPECS[name].load() is _calls()[name][0]


@pytest.mark.parametrize("name", sorted(SPECS))
def test_kernels_do_not_modify_inputs(name):
    _skip_if_unavailable(name)
    fn, args, kwargs = _calls()[name]
    tensors = _tensors(args, kwargs)
    before = [(t.clone(), t._version) for t in tensors]
    out = fn(*args, **kwargs)
    for t, (copy, version) in zip(tensors, before):
        assert t._version == version and torch.equal(t, copy), f"{name} modified an input in place"
        assert out.data_ptr() != t.data_ptr(), f"{name} returned a view of an input"


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("name", sorted(SPECS))
def test_kernels_run_in_half_precision(name, dtype):
    """Half dtypes: computed and returned in that dtype, finite and near float64 on benign inputs."""
    _skip_if_unavailable(name)
    rtol = 2e-2 if dtype == torch.float16 else 1e-1
    fn, args, kwargs = _calls(dtype, 9)[name]
    # the float64 run sees the same (rounded) values as the half run
    up = lambda x: x.to(F64) if isinstance(x, torch.Tensor) else x  # noqa: E731
    out = fn(*args, **kwargs)
    assert out.dtype == dtype
    assert_rel_close(out, fn(*map(up, args), **{key: up(x) for key, x in kwargs.items()}), rtol, args[0])


@pytest.mark.parametrize("name", sorted(name for name, spec in SPECS.items() if spec.capabilities.autograd))
def test_kernels_support_autograd(name):
    fn, args, kwargs = _calls(F64, 4, requires_grad=True)[name]
    assert torch.autograd.gradcheck(lambda *ts: fn(*ts, **kwargs), args, eps=1e-6, atol=1e-6)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device; none is present")
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_kernels_on_cuda_match_cpu(dtype):
    rtol = 1e-12 if dtype == F64 else 1e-4
    cuda = lambda x: x.cuda() if isinstance(x, torch.Tensor) else x  # noqa: E731
    for name, (fn, args, kwargs) in _calls(dtype, 33).items():
        if SPECS[name].unavailable_reason() is not None:
            continue
        out = fn(*map(cuda, args), **{key: cuda(x) for key, x in kwargs.items()})
        assert out.device.type == "cuda", name
        assert_rel_close(out.cpu(), fn(*args, **kwargs), rtol, args[0])


# --------------------------------------------------------------------------- the sequential baselines


def _skip_unless(oracle) -> None:
    if oracle is None:
        pytest.skip("reference_impls has not landed this oracle yet")


@settings(max_examples=15, deadline=None)
@given(seed=seeds, length=st.sampled_from(LENGTHS))
def test_sequential_baselines_are_the_oracles(seed, length):
    """In float64 on the CPU each baseline is its oracle, and the loops in this file agree with it."""
    _skip_unless(ORACLE_SCAN and ORACLE_SELECTIVE and ORACLE_RETENTION and ORACLE_RETENTION_NORMED)
    a, b = scan_inputs(seed, 2, 3, length)
    assert torch.equal(sequential.sequential_linear_scan(a, b), _out(ORACLE_SCAN(a, b)).to(F64))
    assert_rel_close(_out(ORACLE_SCAN(a, b)), loop_linear_scan(a, b), 1e-13, a)
    args, kwargs = selective_inputs(seed, 2, 4, 3, length, 2, grouped=True, use_d=True, use_z=True, use_bias=True,
                                    softplus=True)
    assert torch.equal(sequential.sequential_selective_scan(*args, **kwargs),
                       _out(ORACLE_SELECTIVE(*args, **kwargs)).to(F64))
    assert_rel_close(_out(ORACLE_SELECTIVE(*args, **kwargs)), loop_selective_scan(*args, **kwargs), 1e-13, args[0])
    q, k, v = retention_inputs(seed, 1, length, 2, 3, 4)
    assert torch.equal(sequential.sequential_retention(q, k, v), _out(ORACLE_RETENTION(q, k, v)).to(F64))
    assert_rel_close(_out(ORACLE_RETENTION(q, k, v)), loop_retention(q, k, v), 1e-13, q)
    assert torch.equal(sequential.sequential_retention_normed(q, k, v, 1e-3),
                       _out(ORACLE_RETENTION_NORMED(q, k, v, 1e-3)).to(F64))
    assert_rel_close(_out(ORACLE_RETENTION_NORMED(q, k, v, 1e-3)), loop_retention_normed(q, k, v, 1e-3), 1e-13, q)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_sequential_baselines_compute_in_the_input_dtype(dtype):
    """The baseline rounds every step in the input dtype: bit for bit the plain loop run in that dtype."""
    _skip_unless(ORACLE_SCAN and ORACLE_SELECTIVE and ORACLE_RETENTION and ORACLE_RETENTION_NORMED)
    a, b = scan_inputs(5, 2, 3, 33, dtype)
    h = sequential.sequential_linear_scan(a, b)
    assert h.dtype == dtype and torch.equal(h, loop_linear_scan(a, b, dtype))
    others = ("intree.sequential_selective_scan", "intree.sequential_retention", "intree.sequential_retention_normed")
    for name in others:
        fn, args, kwargs = _calls(dtype, 9)[name]
        out = fn(*args, **kwargs)
        assert out.dtype == dtype and out.device == args[0].device, name
