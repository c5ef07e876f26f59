"""The Triton interpreter corrections (`harness.kernels.triton_interpreter`), each against torch.

Small ``@triton.jit`` programs run under the corrected interpreter and are compared with an independent
torch computation on the CPU in the same precision (bfloat16 rounding by torch; TF32 by clearing the low
13 fraction bits of float32 with integer ops). Each test also runs its program under `plain_interpreter`
and shows the defect the correction removes, so that it would fail without it. Then: kernels that ran
correctly before give bit-identical outputs with the corrections on; a Triton chunk kernel written here
(tests/planted/triton_chunk.py) passes `harness.check` and its planted chunk-boundary bug is found in every
dtype under the ci profile; and `harness check` runs a user's Triton kernel interpreted and corrected.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="with CUDA the Triton kernels run compiled")
triton = pytest.importorskip("triton")
tl = pytest.importorskip("triton.language")

from harness.errors import KernelUnavailable  # noqa: E402
from harness.kernels import triton_interpreter as ti  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True, scope="module")
def corrected():
    ti.enable_interpreter([])
    if not ti.interpreter_enabled():
        pytest.skip("the Triton interpreter is off in this session")
    ti.apply_corrections()
    assert ti.active_corrections() == [c.name for c in ti.CORRECTIONS]


# ------------------------------------------------------------------------------------------ programs
@triton.jit
def _loop_sum(o_ptr, n):
    acc = tl.zeros([1], dtype=tl.float32)
    for i in range(n):
        tl.static_assert(i.dtype == tl.int32)
        acc += i.to(tl.int64).to(tl.float32)
    tl.store(o_ptr + tl.arange(0, 1), acc)


@triton.jit
def _loop_sum_literal(o_ptr):
    acc = tl.zeros([1], dtype=tl.float32)
    for i in range(10):
        acc += i.to(tl.int64).to(tl.float32)
    tl.store(o_ptr + tl.arange(0, 1), acc)


@triton.jit
def _loop_wide(o_ptr, start):
    for i in range(start, start + 1):
        tl.static_assert(i.dtype == tl.int64)
        tl.store(o_ptr + tl.arange(0, 1), (i - start).to(tl.float32) + 7.0)
    for j in tl.static_range(2):
        tl.static_assert(isinstance(j, int))


@triton.jit
def _bf16_ops(x_ptr, y_ptr, f_ptr, add_ptr, sub_ptr, mul_ptr, max_ptr, neg_ptr, div_ptr, lt_ptr, cast_ptr,
              N: tl.constexpr):
    r = tl.arange(0, N)
    x = tl.load(x_ptr + r)
    y = tl.load(y_ptr + r)
    tl.store(add_ptr + r, x + y)
    tl.store(sub_ptr + r, x - y)
    tl.store(mul_ptr + r, x * y)
    tl.store(max_ptr + r, tl.maximum(x, y))
    tl.store(neg_ptr + r, -x)
    tl.store(div_ptr + r, x / y)  # Triton divides bfloat16 in float32 (and returns float32)
    tl.store(lt_ptr + r, (x < y).to(tl.int32))
    tl.store(cast_ptr + r, tl.load(f_ptr + r).to(tl.bfloat16))


@triton.jit
def _bf16_scaled(x_ptr, o_ptr, N: tl.constexpr):
    r = tl.arange(0, N)
    tl.store(o_ptr + r, tl.load(x_ptr + r) * 0.1)  # the constant becomes a bfloat16 (a scalar_constant)


@triton.jit
def _bf16_reductions(x_ptr, sum_ptr, max_ptr, cumsum_ptr, scan_ptr, promoted_ptr, N: tl.constexpr):
    r = tl.arange(0, N)
    x = tl.load(x_ptr + r)
    tl.store(sum_ptr + tl.arange(0, 1), tl.sum(x, axis=0, keep_dims=True))
    tl.store(max_ptr + tl.arange(0, 1), tl.max(x, axis=0, keep_dims=True))
    cumsum = tl.cumsum(x, axis=0)
    tl.store(cumsum_ptr + r, cumsum)
    # the scan tl.cumsum runs, on the bfloat16 values themselves (triton 3.5's tl.cumsum promotes them to float32)
    tl.store(scan_ptr + r, tl.associative_scan(x, 0, tl.standard._sum_combine))
    tl.store(promoted_ptr + tl.arange(0, 1), tl.full([1], cumsum.dtype == tl.float32, tl.int32))


@triton.jit
def _dot(a_ptr, b_ptr, o_ptr, M: tl.constexpr, PREC: tl.constexpr):
    r = tl.arange(0, M)
    a = tl.load(a_ptr + r[:, None] * M + r[None, :])
    b = tl.load(b_ptr + r[:, None] * M + r[None, :])
    if PREC == "default":
        out = tl.dot(a, b)
    else:
        out = tl.dot(a, b, input_precision=PREC)
    tl.store(o_ptr + r[:, None] * M + r[None, :], out)


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def tf32_truncated(x: torch.Tensor) -> torch.Tensor:
    """float32 with the low 13 fraction bits cleared, by integer ops in torch (independent of numpy)."""
    return (x.view(torch.int32) & ~0x1FFF).view(torch.float32)


# ------------------------------------------------------------------------------------------ loops
def _plain_reads_runtime_bounds() -> bool:
    """Whether the plain interpreter takes ``range(n)`` of a kernel argument ``n`` (a one-element array).

    triton 3.9 squeezes the array; triton 3.5's ``tensor.__index__`` is ``int()`` of it, which numpy >= 2.4 refuses.
    """
    import numpy as np

    try:
        int(np.ones(1))
    except TypeError:
        return triton.__version__ != "3.5.1"
    return True


def test_loop_variable_is_an_int32_tensor():
    out = torch.zeros(1)
    _loop_sum[(1,)](out, 10)
    assert out.item() == 45.0
    _loop_sum_literal[(1,)](out)
    assert out.item() == 45.0
    with ti.plain_interpreter(), pytest.raises(Exception, match="has no attribute"):
        _loop_sum_literal[(1,)](out)
    # the plain interpreter fails on the Python-int loop variable, or (triton 3.5, numpy >= 2.4) on the bound itself
    bound_error = "has no attribute" if _plain_reads_runtime_bounds() else "only 0-dimensional arrays can be converted"
    with ti.plain_interpreter(), pytest.raises(Exception, match=bound_error):
        _loop_sum[(1,)](out, 10)


def test_loop_variable_widens_to_int64_and_static_range_stays_an_int():
    out = torch.zeros(1)
    _loop_wide[(1,)](out, 2**31 + 5)
    assert out.item() == 7.0


# ------------------------------------------------------------------------------------------ bfloat16
def _bf16_inputs(n: int = 64):
    g = _gen(1)
    x = (torch.randn(n, generator=g) * 3).to(torch.bfloat16)
    y = (torch.randn(n, generator=g) * 3).to(torch.bfloat16)
    f = torch.randn(n, generator=g) * 1e3  # full float32 mantissas: the cast must round, not truncate
    return x, y, f


def _run_bf16_ops(x, y, f):
    n = x.numel()
    outs = {k: torch.empty(n, dtype=torch.bfloat16) for k in ("add", "sub", "mul", "max", "neg", "cast")}
    outs["div"] = torch.empty(n, dtype=torch.float32)
    outs["lt"] = torch.empty(n, dtype=torch.int32)
    _bf16_ops[(1,)](x, y, f, outs["add"], outs["sub"], outs["mul"], outs["max"], outs["neg"], outs["div"],
                    outs["lt"], outs["cast"], N=n)
    return outs


def test_bfloat16_elementwise_is_rounded_float32_arithmetic():
    x, y, f = _bf16_inputs()
    got = _run_bf16_ops(x, y, f)
    want = {"add": x + y, "sub": x - y, "mul": x * y, "max": torch.maximum(x, y), "neg": -x,
            "div": x.float() / y.float(), "lt": (x < y).int(), "cast": f.to(torch.bfloat16)}
    for name, expected in want.items():
        assert torch.equal(got[name], expected), name
    with ti.plain_interpreter():
        plain = _run_bf16_ops(x, y, f)
    assert not torch.equal(plain["add"], want["add"])  # integer arithmetic on the bit patterns
    assert not torch.equal(plain["cast"], want["cast"])  # truncation instead of rounding


def test_bfloat16_constant_is_rounded_to_nearest_even():
    from triton.runtime import interpreter

    x, _, _ = _bf16_inputs()
    out = torch.empty_like(x)
    want = x * torch.tensor(0.1, dtype=torch.bfloat16)  # 0.1 rounds up to 0x3dcd, truncates to 0x3dcc
    _bf16_scaled[(1,)](x, out, N=x.numel())
    assert torch.equal(out, want)
    with ti.plain_interpreter():
        if hasattr(interpreter.InterpreterBuilder, "get_bf16"):  # triton 3.9: truncated, then integer arithmetic
            _bf16_scaled[(1,)](x, out, N=x.numel())
            assert not torch.equal(out, want)
        else:  # triton 3.5 has no bfloat16 constant at all
            with pytest.raises(Exception, match="no attribute 'get_bf16'"):
                _bf16_scaled[(1,)](x, out, N=x.numel())


def test_bfloat16_reductions_and_cumsum():
    g = _gen(2)
    x = (torch.randint(-64, 64, (32,), generator=g).float() / 8).to(torch.bfloat16)  # exact float32 sums
    s, m, c = torch.empty(1, dtype=torch.bfloat16), torch.empty(1, dtype=torch.bfloat16), torch.empty_like(x)
    scan, promoted = torch.empty_like(x), torch.empty(1, dtype=torch.int32)
    cumsum = x.float().cumsum(0).to(torch.bfloat16)
    _bf16_reductions[(1,)](x, s, m, c, scan, promoted, N=32)
    assert torch.equal(s, x.float().sum().to(torch.bfloat16).reshape(1))
    assert torch.equal(m, x.max().reshape(1))
    assert torch.equal(c, cumsum)
    assert torch.equal(scan, cumsum)
    with ti.plain_interpreter():
        _bf16_reductions[(1,)](x, s, m, c, scan, promoted, N=32)
    assert not torch.equal(scan, cumsum)  # integer cumsum of the bit patterns
    # a tl.cumsum that promotes bfloat16 (triton 3.5; compiled too) never scans bfloat16: right without the correction
    assert torch.equal(c, cumsum) is bool(promoted.item())


def test_float32_to_bf16_rounds_to_nearest_even():
    import numpy as np

    values = np.array([1 + 2**-8, 1 + 3 * 2**-8, 1 + 2**-8 + 2**-20, -(1 + 2**-8), 3.4e38, float("nan"),
                       float("inf")], dtype=np.float32)
    bits = ti.float32_to_bf16_bits(values)
    expected = torch.from_numpy(values).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    assert (bits[:-2] == expected[:-2]).all()
    assert np.isnan(ti.bf16_bits_to_float32(bits[-2])) and np.isinf(ti.bf16_bits_to_float32(bits[-1]))


# ------------------------------------------------------------------------------------------ dots
def _exact_operands(dtype: torch.dtype, bits: int, m: int = 16):
    """Values with ``bits`` significant bits: products and their sums are exact in float32."""
    g = _gen(3)
    scale = 2.0 ** -(bits - 1)
    a = torch.randint(-(2**(bits - 1)) + 1, 2**(bits - 1), (m, m), generator=g).double() * scale
    b = torch.randint(-(2**(bits - 1)) + 1, 2**(bits - 1), (m, m), generator=g).double() * scale
    return a.to(dtype), b.to(dtype), a @ b


@pytest.mark.parametrize(("dtype", "bits"), [(torch.bfloat16, 8), (torch.float16, 9)])
def test_low_precision_dot_sums_exact_products_in_float32(dtype, bits):
    a, b, exact = _exact_operands(dtype, bits)
    out = torch.empty(16, 16, dtype=torch.float32)
    _dot[(1,)](a, b, out, M=16, PREC="ieee")
    assert torch.equal(out.double(), exact)  # exact products, exact float32 sums here
    if dtype == torch.bfloat16:
        with ti.plain_interpreter():
            _dot[(1,)](a, b, out, M=16, PREC="ieee")
        assert (out.double() - exact).abs().max() > 1e3  # bit patterns multiplied as integers


@pytest.mark.parametrize("precision", ["tf32", "ieee", "default"])
def test_float32_dot_honours_input_precision(precision):
    g = _gen(4)
    a, b = torch.randn(16, 16, generator=g), torch.randn(16, 16, generator=g)
    out = torch.empty(16, 16)
    _dot[(1,)](a, b, out, M=16, PREC=precision)
    full = a.double() @ b.double()
    truncated = tf32_truncated(a).double() @ tf32_truncated(b).double()
    as_tf32 = precision in ("tf32", "default")  # Triton's default on NVIDIA GPUs is tf32
    want, other = (truncated, full) if as_tf32 else (full, truncated)
    assert (out.double() - want).abs().max() < 1e-5
    assert (out.double() - other).abs().max() > 1e-3
    if as_tf32:
        with ti.plain_interpreter():
            _dot[(1,)](a, b, out, M=16, PREC=precision)
        assert (out.double() - full).abs().max() < 1e-5  # the interpreter ignored input_precision


def test_dot_input_precision_sets_the_default_and_restores_it():
    g = _gen(5)
    a, b = torch.randn(16, 16, generator=g), torch.randn(16, 16, generator=g)
    out = torch.empty(16, 16)
    before = os.environ.get("TRITON_F32_DEFAULT")
    with ti.dot_input_precision("ieee"):
        _dot[(1,)](a, b, out, M=16, PREC="default")
    assert (out.double() - a.double() @ b.double()).abs().max() < 1e-5
    assert os.environ.get("TRITON_F32_DEFAULT") == before
    with pytest.raises(Exception, match="precision='fp64'"):
        with ti.dot_input_precision("fp64"):
            pass


class _DotThenDot(torch.autograd.Function):
    """y = a @ b through the Triton ``_dot`` at the default (tf32) precision, forward and backward: a package's
    backward kernels run when gradients are asked for, after the call returned."""

    @staticmethod
    def forward(ctx, a, b):
        ctx.save_for_backward(a, b)
        out = torch.empty(16, 16)
        _dot[(1,)](a.contiguous(), b.contiguous(), out, M=16, PREC="default")
        return out

    @staticmethod
    def backward(ctx, grad):
        a, b = ctx.saved_tensors
        da = torch.empty(16, 16)
        _dot[(1,)](grad.contiguous(), b.t().contiguous(), da, M=16, PREC="default")
        return da, None


def test_call_in_dot_precision_runs_the_backward_in_the_same_precision():
    g = _gen(6)
    a, b, w = torch.randn(16, 16, generator=g), torch.randn(16, 16, generator=g), torch.randn(16, 16, generator=g)
    exact = w.double() @ b.double().t()  # d(sum(w * (a @ b)))/da

    def grad_of(run) -> torch.Tensor:
        leaf = a.clone().requires_grad_()
        (run(leaf) * w).sum().backward()
        return leaf.grad.double()

    ieee = grad_of(lambda x: ti.call_in_dot_precision("ieee", _DotThenDot.apply, x, b))
    assert (ieee - exact).abs().max() < 1e-5

    def forward_only(x):  # the precision around the call alone: the backward runs later, in tf32
        with ti.dot_input_precision("ieee"):
            return _DotThenDot.apply(x, b)

    assert (grad_of(forward_only) - exact).abs().max() > 1e-3
    with torch.no_grad():  # no gradient wanted: a plain call in the precision
        out = ti.call_in_dot_precision("ieee", _DotThenDot.apply, a, b)
    assert (out.double() - a.double() @ b.double()).abs().max() < 1e-5
    two = ti.call_in_dot_precision("ieee", lambda x, y: (_DotThenDot.apply(x, y), None), a.requires_grad_(), b)
    assert isinstance(two, tuple) and two[1] is None and two[0].requires_grad


# ------------------------------------------------------------------------------------------ autotuner
def test_autotuner_runs_its_first_config_once_even_when_it_asks_for_a_disk_cache():
    """fla's autotuners pass ``cache_results=True``: triton 3.5 then looks the kernel up in a disk cache keyed by the
    compiled kernel and the GPU target before benchmarking, even a single config; 3.9 benchmarks through the driver."""

    @triton.autotune(configs=[triton.Config({"BLOCK": b}) for b in (32, 16)], key=["n"], cache_results=True)
    @triton.jit
    def count_programs(x_ptr, y_ptr, count_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(y_ptr + offs, 2 * tl.load(x_ptr + offs, mask=offs < n), mask=offs < n)
        tl.atomic_add(count_ptr, 1)

    x, y, count = torch.arange(40, dtype=torch.float32), torch.empty(40), torch.zeros(1, dtype=torch.int32)
    count_programs[lambda meta: (triton.cdiv(40, meta["BLOCK"]),)](x, y, count, 40)
    assert count.item() == 2 and torch.equal(y, 2 * x)  # BLOCK=32 (2 programs), run once, never benchmarked
    error = "has no attribute 'fn'" if triton.__version__ == "3.5.1" else "active drivers"
    with ti.plain_interpreter(keep=()), pytest.raises(Exception, match=error):
        count_programs[lambda meta: (triton.cdiv(40, meta["BLOCK"]),)](x, y, count, 41)  # a new key


# ------------------------------------------------------------------------------------------ torch.cuda
_CPU_TORCH = pytest.mark.skipif(hasattr(torch._C, "_cuda_exchangeDevice"),
                                reason="torch built with CUDA: torch.cuda.device(None) works there already")


@_CPU_TORCH
def test_cuda_device_of_a_cpu_tensor_is_a_noop():
    """mamba-ssm launches every kernel under ``torch.cuda.device(x.device.index)``; a CPU tensor's index is None."""
    with torch.cuda.device(torch.zeros(1).device.index):
        pass
    with torch.cuda.device(-1):
        pass
    with pytest.raises(RuntimeError, match="without CUDA"):  # a real device still cannot be entered
        with torch.cuda.device(0):
            pass
    with ti.plain_interpreter(), pytest.raises(TypeError):
        with torch.cuda.device(None):
            pass


@_CPU_TORCH
def test_cuda_device_properties_of_a_cpu_device_are_the_stand_in_gpu():
    props = torch.cuda.get_device_properties(torch.device("cpu"))
    assert props is ti.INTERPRETED_DEVICE and props.multi_processor_count == 132
    with pytest.raises(Exception):  # a CUDA device on a torch without CUDA still raises
        torch.cuda.get_device_properties(torch.device("cuda", 0))
    with ti.plain_interpreter(), pytest.raises(Exception):
        torch.cuda.get_device_properties(torch.device("cpu"))


def test_torch_cuda_corrections_are_not_listed_on_a_cuda_build(monkeypatch):
    monkeypatch.setattr(torch._C, "_cuda_exchangeDevice", lambda device: -1, raising=False)
    listed = ti.describe()["corrections"]
    assert "cuda_device_none_noop" not in listed and "cuda_device_properties_h100" not in listed
    assert "bfloat16_via_float32" in listed


# ------------------------------------------------------------------------------------------ the layer
def test_untested_triton_version_makes_kernels_unavailable(monkeypatch):
    monkeypatch.setattr(ti, "TESTED_TRITON_VERSIONS", ("0.0.0",))
    reason = ti.corrections_unavailable_reason()
    assert reason and triton.__version__ in reason and "0.0.0" in reason
    with pytest.raises(KernelUnavailable, match="tested on triton 0.0.0"):
        ti.require_corrections()


def test_describe_names_the_corrections():
    info = ti.describe()
    assert info["interpreted"] and info["corrections"] == [c.name for c in ti.CORRECTIONS]


# ------------------------------------------------------------------------------------------ bit-identical
@pytest.mark.thirdparty
@pytest.mark.parametrize(("name", "dtype"), [("fla.fused_recurrent_retention", "float32"),
                                             ("fla.fused_recurrent_retention", "float16"),
                                             ("fla.parallel_retention.ieee", "float32"),
                                             ("fla.parallel_retention", "float16")])
def test_kernels_that_ran_before_are_bit_identical(name, dtype):
    from harness.kernels.registry import get

    spec = get(name)
    reason = spec.unavailable_reason()
    if reason:
        pytest.skip(reason)
    fn = spec.callable()
    g = _gen(6)
    dt = getattr(torch, dtype)
    q, k, v = (torch.randn(1, 40, 2, 16, generator=g).to(dt) for _ in range(3))
    corrected = fn(q, k, v)
    ti.pin_autotuners("fla")  # per-kernel pins: autotuned kernels need them without the layer
    # where the plain interpreter cannot read a runtime loop bound (triton 3.5, numpy >= 2.4) these kernels ran
    # only with loop_induction_int32; then the other corrections are the ones shown to change nothing here
    keep = () if _plain_reads_runtime_bounds() else ("loop_induction_int32",)
    with ti.plain_interpreter(keep=keep):
        plain = fn(q, k, v)
    assert torch.equal(corrected.view(torch.int16 if dt == torch.float16 else torch.int32),
                       plain.view(torch.int16 if dt == torch.float16 else torch.int32))


# ------------------------------------------------------------------------------------------ speed-ups
@pytest.mark.thirdparty
def test_a_launch_lists_the_language_builtins_once_and_computes_the_same(monkeypatch):
    """`SPEED_UPS`' launch_builtins_listed_once: after a kernel's first launch, later launches do not list
    triton.language's members again (before: ``inspect.getmembers`` five times per launch, a quarter of an
    interpreted fla call), and the outputs are bit-identical to the interpreter's own patching."""
    import inspect

    from harness.kernels.registry import get

    spec = get("fla.fused_recurrent_retention")
    reason = spec.unavailable_reason()
    if reason:
        pytest.skip(reason)
    fn = spec.callable()
    g = _gen(7)
    q, k, v = (torch.randn(1, 24, 2, 16, generator=g) for _ in range(3))
    first = fn(q, k, v)
    listings = []
    real = inspect.getmembers
    monkeypatch.setattr(inspect, "getmembers", lambda obj, *a: listings.append(obj) or real(obj, *a))
    again = fn(q, k, v)
    assert listings == [], f"{len(listings)} listings of {sorted({getattr(o, '__name__', o) for o in listings})}"
    ti.remove_corrections(["launch_builtins_listed_once"])
    try:
        assert "launch_builtins_listed_once" not in {name for name, *_ in ti._PATCHES}
        plain = fn(q, k, v)
        assert len(listings) >= 3  # triton's own patching lists the modules on every launch
    finally:
        ti.apply_corrections()
    assert torch.equal(first.view(torch.int32), again.view(torch.int32))
    assert torch.equal(first.view(torch.int32), plain.view(torch.int32))
    assert "launch_builtins_listed_once" not in ti.active_corrections()  # a speed-up: runs are the same without it


# ------------------------------------------------------------------------------------------ planted bug
def _chunk_spec(fn, computes_in=None):
    from harness.api import user_kernel_spec
    from harness.kernels.contract import Capabilities

    caps = Capabilities(dtypes=("float32", "float16", "bfloat16"), chunk_sizes=(16, 32), slow=True,
                        computes_in=computes_in or {})
    return user_kernel_spec(fn, family="retention", capabilities=caps, name=fn.__name__)


def test_the_triton_chunk_kernel_written_here_is_equivalent(tmp_path):
    from harness.api import check
    from tests.planted import triton_chunk

    result = check(_chunk_spec(triton_chunk.chunk_retention), profile="ci", counterexample_dir=tmp_path)
    assert result.passed, result.message
    assert {r["dtype"] for r in result.records} == {"float32", "float16", "bfloat16"}


@pytest.mark.e2e
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_a_wrong_decay_exponent_at_the_chunk_boundary_is_found(tmp_path, dtype):
    from harness.api import check
    from tests.planted import triton_chunk

    # A slow kernel gets 5 ci examples; in bfloat16 the one draw past a boundary (L=17, chunk 16) is a single
    # step beyond it (cond 0.45): the sixth draw (L=32) shows the bug at cond 1.3-6. Eight keeps a margin.
    result = check(_chunk_spec(triton_chunk.chunk_retention_boundary_bug), profile="ci", dtypes=(dtype,),
                   max_examples=8, counterexample_dir=tmp_path)
    assert not result.passed and result.failure["verdict"] == "divergent", result.records[-1]
    assert result.failure["length"] > result.failure["chunk_size"]  # only a chunk boundary shows it


def test_tf32_dots_are_found_in_float32_and_equivalent_when_declared(tmp_path):
    """Default float32 dots (TF32 on a GPU) are divergent held to float32, equivalent at truncated TF32's.

    Held to rounded TF32 (``"tf32"``, 2**-11, what cuBLAS does) a short case reaches about twice the bound:
    Triton's TF32 truncates (``"tf32_rz"``, 2**-10).
    """
    from harness.api import check
    from tests.planted import triton_chunk

    held = check(_chunk_spec(triton_chunk.chunk_retention_tf32), profile="ci", dtypes=("float32",),
                 max_examples=3, counterexample_dir=tmp_path, shrink_deadline_s=0)  # the failures as found
    assert not held.passed and held.failure["cond_max"] > 100
    rounded = check(_chunk_spec(triton_chunk.chunk_retention_tf32, {"float32": "tf32"}), profile="ci",
                    dtypes=("float32",), max_examples=3, counterexample_dir=tmp_path, shrink_deadline_s=0)
    assert 1 < max(r["cond_max"] for r in rounded.records) < 4
    declared = check(_chunk_spec(triton_chunk.chunk_retention_tf32, {"float32": "tf32_rz"}), profile="ci",
                     dtypes=("float32",), counterexample_dir=tmp_path)
    assert declared.passed, declared.message


# ------------------------------------------------------------------------------------------ the CLI
@pytest.mark.e2e
def test_harness_check_runs_a_user_triton_kernel_interpreted_and_corrected(tmp_path):
    import json

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    target = f"{ROOT / 'tests' / 'planted' / 'triton_chunk.py'}:chunk_retention_boundary_bug"
    proc = subprocess.run([sys.executable, "-m", "harness", "check", "--kernel", target, "--family", "retention",
                           "--dtypes", "bfloat16", "--max-examples", "4", "--max-length", "48",
                           "--shrink-deadline", "0",  # the first failure as found: this test is about running it
                           "--report-dir", str(tmp_path / "run"), "--cases-dir", str(tmp_path / "cases")],
                          capture_output=True, text=True, env=env, timeout=600, cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "Shrinking stopped at the 0 s deadline" in proc.stdout, proc.stdout[-2000:]
    header = json.loads((tmp_path / "run" / "run.json").read_text())
    assert header["triton_interpreter"]["corrections"] == [c.name for c in ti.CORRECTIONS]
