"""The third-party adapters (harness/kernels/*_adapter.py) against the definition, and the Triton interpreter shim.

For every adapter kernel: skipped with its reason when it is unavailable here, or for each dtype it does not
run here (the declared ``unsupported`` reason); otherwise run on a small case in each declared dtype and
checked against a float64 definition (normwise: max |error| <= rtol * max |reference|, rtol fitting the
dtype), with the output's shape and dtype and the inputs left untouched. Each declared limitation that is
testable here is checked to still hold (so a fix upstream shows up as a failure asking to re-declare), and
the kernels that declare autograd are checked for gradients. Plus: torchscale's adapters reproduce
``MultiScaleRetention.forward`` and the seed issue's eps effect; the mamba-ssm adapters' layout plumbing
against stand-ins with the package's documented semantics (mamba-ssm cannot be installed without CUDA);
the autotuner pinning and the interpreter switch of `harness.kernels.triton_interpreter`; and that
importing the adapter modules imports no third-party package.

The definition is `reference_impls`: the oracles, and their out-of-place loops in `reference_impls.autograd`.
The Triton interpreter is slow: shapes are tiny (the whole module runs in well under 90 s on 2 cores).
"""

from __future__ import annotations

import importlib
import math
import re
import subprocess
import sys
import types

import pytest
import torch
import torch.nn.functional as F

from reference_impls import autograd as ad

from harness.errors import InvalidArgument, KernelUnavailable
from harness.kernels import (
    accelerated_scan_adapter,
    fla_adapter,
    mamba_ssm_adapter,
    mambapy_adapter,
    torchmamba_adapter,
    torchscale_adapter,
    triton_interpreter,
    yet_another_retnet_adapter,
)
from harness.kernels.contract import ALL_DTYPES, DTYPE_NAMES, Family, KernelSpec, Lengths

pytestmark = pytest.mark.thirdparty

try:  # for the Triton function below (the pytest session has turned the interpreter on before collection)
    import triton.language as tl
except ImportError:  # pragma: no cover - triton is part of make install
    tl = None

ADAPTER_MODULES = (mambapy_adapter, torchscale_adapter, fla_adapter, accelerated_scan_adapter,
                   yet_another_retnet_adapter, mamba_ssm_adapter, torchmamba_adapter)
SPECS: list[KernelSpec] = [spec for mod in ADAPTER_MODULES for spec in mod.KERNELS]
BY_NAME = {spec.name: spec for spec in SPECS}
F64 = torch.float64

#: normwise tolerance per dtype on these small, benign cases (a few hundred units of roundoff; garbage is O(1))
RTOL = {"float64": 1e-11, "float32": 2e-5, "float16": 1e-2, "bfloat16": 6e-2,
        "tf32": 1e-2, "tf32_rz": 2e-2}  # float32 storage, 10-bit products (rounded, truncated)

#: kernels whose rounding is larger than a plain loop's by design, and the factor allowed on RTOL
LOOSER = {
    # recurrent_forward renormalises its state at every step (a sqrt, a product and two divides in the input
    # dtype): about ten times the rounding of the other forms in float16/bfloat16 (2.5e-2 / 1.7e-1 here)
    "torchscale.recurrent": 10.0,
}

# --------------------------------------------------------------------------- the float64 definition


def loop_linear_scan(a, b):
    """The plain float64 loop (`reference_impls.autograd`, the oracle's definition written out of place)."""
    return ad.linear_recurrence(a.to(F64), b.to(F64))


def loop_selective_scan(u, delta, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False):
    up = lambda x: None if x is None else x.to(F64)  # noqa: E731
    return ad.selective_scan(*(up(x) for x in (u, delta, A, B, C)), D=up(D), z=up(z), delta_bias=up(delta_bias),
                             delta_softplus=delta_softplus)


def loop_retention(q, k, v, gamma, scale):
    return ad.retention(q.to(F64), k.to(F64), v.to(F64), list(gamma), scale)


def _oracle(module: str, attr: str):
    try:
        return getattr(importlib.import_module(f"reference_impls.{module}"), attr, None)
    except ImportError:
        return None


def _out(result) -> torch.Tensor:
    if isinstance(result, (tuple, list)):
        result = result[0]
    return getattr(result, "out", result)


GATED = (Family.SIMPLE_GLA, Family.GLA, Family.SSD)


def declares(spec: KernelSpec, part: str) -> bool:
    """Whether ``spec`` takes ``part`` of the gated contract (``initial_state``, ``final_state``, ``varlen``)."""
    return bool(getattr(spec.capabilities, part, False))


def loop_gated(q, k, v, g, scale, h0=None, segments=None):
    """The gated recurrence written out of place in float64 (autograd can differentiate it): per step
    ``S = exp(g) S + k^T v``, ``o = scale q S``, g (batch, T, heads, K or 1); the state restarts from zero at
    each start in ``segments`` (a list of (start, stop)). Returns (o, final state)."""
    batch, length, heads, dk = q.shape
    state = torch.zeros(batch, heads, dk, v.shape[-1], dtype=F64) if h0 is None else h0.to(F64)
    starts = {a for a, _ in segments or []} - {0}
    outs = []
    for t in range(length):
        if t in starts:
            state = torch.zeros_like(state)
        state = torch.exp(g[:, t]).unsqueeze(-1) * state + k[:, t].unsqueeze(-1) * v[:, t].unsqueeze(-2)
        outs.append(scale * (q[:, t].unsqueeze(-1) * state).sum(-2))
    return torch.stack(outs, dim=1), state


def loop_ssd(x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False, initial_states=None, seq_idx=None):
    """Mamba-2's SSD through `loop_gated` (g = dt A, k = B, v = dt x, q = C, scale 1; dt clamped at 0, as
    mamba-ssm's default dt_limit), then ``+ D x`` and ``* silu(z)``. Returns (y, final states)."""
    heads, groups = x.shape[2], B.shape[2]
    dt = dt if dt_bias is None else dt + dt_bias
    dt = (F.softplus(dt) if dt_softplus else dt).clamp(min=0)
    rep = heads // groups
    segments = None
    if seq_idx is not None:
        ids = seq_idx[0].tolist()
        cuts = [t for t in range(1, len(ids)) if ids[t] != ids[t - 1]]
        segments = list(zip([0] + cuts, cuts + [len(ids)]))
    h0 = None if initial_states is None else initial_states.transpose(-1, -2)
    y, state = loop_gated(C.repeat_interleave(rep, 2), B.repeat_interleave(rep, 2), dt.unsqueeze(-1) * x,
                          (dt * A).unsqueeze(-1), 1.0, h0, segments)
    if D is not None:
        y = y + x * (D[:, None] if D.dim() == 1 else D)
    if z is not None:
        y = y * F.silu(z)
    return y, state.transpose(-1, -2)


ORACLE_GATED = {Family.SIMPLE_GLA: _oracle("gated_decay", "simple_gla"), Family.GLA: _oracle("gated_decay", "gla")}
ORACLE_SSD = _oracle("gated_decay", "ssd")
ORACLE_SCAN = _oracle("linear_recurrence", "linear_recurrence")
ORACLE_SELECTIVE = _oracle("selective_scan", "selective_scan")
ORACLE_RETENTION = _oracle("retention", "retention")
ORACLE_RETENTION_NORMED = _oracle("retention", "retention_normed")


def definition(spec: KernelSpec, inputs: dict, eps: float | None = None, *, loops: bool = False) -> torch.Tensor:
    """The float64 output for ``inputs`` under ``spec``'s convention: the oracles, or with ``loops=True`` (or
    before the oracles exist) the loops above, which autograd can differentiate."""
    x = {k: v.to(F64) for k, v in inputs.items()}
    fam = spec.family
    if fam in GATED:
        return gated_definition(spec, x, loops=loops)
    if fam is Family.LINEAR_SCAN:
        oracle = None if loops else ORACLE_SCAN
        return _out(oracle(x["a"], x["b"])) if oracle else loop_linear_scan(x["a"], x["b"])
    if fam is Family.SELECTIVE_SCAN:
        oracle = None if loops else ORACLE_SELECTIVE
        args = (x["u"], x["delta"], x["A"], x["B"], x["C"])
        kw = {k: x[k] for k in ("D",) if k in x}
        return _out(oracle(*args, **kw)) if oracle else loop_selective_scan(*args, **kw)
    heads, dk = x["q"].shape[2], x["q"].shape[3]
    gamma, scale = list(spec.convention.gammas(heads)), spec.convention.scale(dk)
    if fam is Family.RETENTION_NORMED:
        if ORACLE_RETENTION_NORMED and not loops:
            return _out(ORACLE_RETENTION_NORMED(x["q"], x["k"], x["v"], eps, gamma=gamma, scale=scale))
        o = loop_retention(x["q"], x["k"], x["v"], gamma, scale)
        return o / torch.sqrt(o.pow(2).mean(-1, keepdim=True) + eps)
    if ORACLE_RETENTION and not loops:
        return _out(ORACLE_RETENTION(x["q"], x["k"], x["v"], gamma=gamma, scale=scale))
    return loop_retention(x["q"], x["k"], x["v"], gamma, scale)


def gated_definition(spec: KernelSpec, x: dict, *, loops: bool = False, kwargs: dict | None = None) -> list:
    """[output, final state when asked] of a gated-family case in float64: the oracle (`reference_impls.
    gated_decay`), or with ``loops=True`` the differentiable loops above."""
    kwargs = kwargs if kwargs is not None else {}
    final = declares(spec, "final_state")
    if spec.family is Family.SSD:
        opts = {k: x[k] for k in ("D", "z", "dt_bias", "initial_states") if k in x}
        opts.update(dt_softplus=SSD_SOFTPLUS if spec.capabilities.selective_options else False,
                    seq_idx=kwargs.get("seq_idx"))
        args = (x["x"], x["dt"], x["A"], x["B"], x["C"])
        if loops or ORACLE_SSD is None:
            y, state = loop_ssd(*args, **opts)
        else:
            y, state = ORACLE_SSD(*args, **opts, return_final_states=True)
        return [y, state] if final else [y]
    h0 = x.get("initial_state")
    g = x["g"] if spec.family is Family.GLA else x["g"].unsqueeze(-1)
    if loops or ORACLE_GATED[spec.family] is None:
        o, state = loop_gated(x["q"], x["k"], x["v"], g, x["q"].shape[-1] ** -0.5, h0)
    else:
        o, state = ORACLE_GATED[spec.family](x["q"], x["k"], x["v"], x["g"], initial_state=h0, output_final_state=True)
    return [o, state] if final else [o]


SSD_SOFTPLUS = True  # the ssd cases with dt_bias and softplus (kernels that take them) use them


# --------------------------------------------------------------------------- small cases


def _length(spec: KernelSpec, preferred: int) -> tuple[int, int | None]:
    """A length (and chunk size) inside the kernel's declared capabilities."""
    caps = spec.capabilities
    chunk = None
    if caps.takes_chunk:
        chunk = caps.chunk_sizes[0] if caps.chunk_sizes else 4
    if caps.lengths is Lengths.POW2:
        length = 1 << max(caps.min_length - 1, 1).bit_length() if caps.min_length > 16 else 16
    elif caps.lengths is Lengths.CHUNK_MULTIPLE:
        length = chunk * 3
    else:
        length = max(preferred, caps.min_length)
    if caps.max_length is not None:
        length = min(length, caps.max_length)
    assert caps.accepts_length(length, chunk)
    return length, chunk


def make_case(spec: KernelSpec, dtype: str, seed: int = 0) -> tuple[dict, dict]:
    """Inputs (already in ``dtype``: the definition sees the same rounded values) and keyword arguments."""
    gen = torch.Generator().manual_seed(seed)
    dt = DTYPE_NAMES[dtype]
    fam = spec.family

    def randn(*shape):
        return torch.randn(*shape, generator=gen, dtype=F64)

    def rand(*shape):
        return torch.rand(*shape, generator=gen, dtype=F64)

    length, chunk = _length(spec, preferred=13 if fam in (Family.LINEAR_SCAN, Family.SELECTIVE_SCAN) else
                            20 if fam in GATED else 12)
    if fam is Family.SSD:
        heads, groups = 4, 2
        inputs = {"x": randn(1, length, heads, 4), "dt": 0.05 + 0.5 * rand(1, length, heads),
                  "A": -(0.2 + rand(heads)), "B": randn(1, length, groups, 4), "C": randn(1, length, groups, 4)}
        kwargs = {} if chunk is None else {"chunk_size": chunk}
        if spec.capabilities.selective_options:
            inputs.update(dt=randn(1, length, heads), D=randn(heads), z=randn(1, length, heads, 4),
                          dt_bias=0.5 * randn(heads))
        if declares(spec, "initial_state"):
            inputs["initial_states"] = randn(1, heads, 4, 4)
        if declares(spec, "varlen"):
            kwargs["seq_idx"] = (torch.arange(length) >= length // 2).long().unsqueeze(0)
        return {k: v.to(dt) for k, v in inputs.items()}, kwargs
    if fam in (Family.SIMPLE_GLA, Family.GLA):
        hd = spec.capabilities.head_dims[0] if spec.capabilities.head_dims else 8
        g_shape = (2, length, 2) if fam is Family.SIMPLE_GLA else (2, length, 2, hd)
        inputs = {"q": randn(2, length, 2, hd), "k": randn(2, length, 2, hd), "v": randn(2, length, 2, hd),
                  "g": -rand(*g_shape)}
        if declares(spec, "initial_state"):
            inputs["initial_state"] = randn(2, 2, hd, hd)
        return {k: v.to(dt) for k, v in inputs.items()}, ({} if chunk is None else {"chunk_size": chunk})
    if fam is Family.LINEAR_SCAN:
        a = (0.5 + 0.5 * rand(2, 3, length)) * torch.where(rand(2, 3, length) < 0.2, -1.0, 1.0)
        inputs = {"a": a, "b": randn(2, 3, length)}
    elif fam is Family.SELECTIVE_SCAN:
        inputs = {"u": randn(2, 4, length), "delta": 0.05 + 0.5 * rand(2, 4, length),
                  "A": -(0.2 + rand(4, 3)), "B": randn(2, 3, length), "C": randn(2, 3, length)}
    else:
        hd = spec.capabilities.head_dims[0] if spec.capabilities.head_dims else 8
        inputs = {"q": randn(2, length, 2, hd), "k": randn(2, length, 2, hd), "v": randn(2, length, 2, hd)}
    inputs = {k: v.to(dt) for k, v in inputs.items()}
    kwargs = {} if chunk is None else {"chunk_size": chunk}
    return inputs, kwargs


def call(spec: KernelSpec, fn, inputs: dict, kwargs: dict, eps: float | None):
    """The kernel's output; for the gated families a list [output, final state when declared]."""
    if spec.family in GATED:
        return call_gated(spec, fn, inputs, kwargs)
    args = tuple(inputs.values())
    if spec.family is Family.RETENTION_NORMED:
        args = args + (eps,)
    return fn(*args, **kwargs)


def call_gated(spec: KernelSpec, fn, inputs: dict, kwargs: dict) -> list:
    final = declares(spec, "final_state")
    if spec.family is Family.SSD:
        kw = dict(kwargs)
        chunk = kw.pop("chunk_size", 16)
        opts = {k: inputs[k] for k in ("D", "z", "dt_bias", "initial_states") if k in inputs}
        if spec.capabilities.selective_options:
            opts["dt_softplus"] = SSD_SOFTPLUS
        out = fn(inputs["x"], inputs["dt"], inputs["A"], inputs["B"], inputs["C"], chunk, **opts, **kw,
                 **({"return_final_states": True} if final else {}))
        return list(out) if final else [out]
    o, state = fn(inputs["q"], inputs["k"], inputs["v"], inputs["g"], initial_state=inputs.get("initial_state"),
                  output_final_state=final, **kwargs)
    assert (state is None) is not final, f"{spec.name}: final state {'missing' if final else 'returned unasked'}"
    return [o, state] if final else [o]


def normwise_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    err = (actual.detach().to(F64) - expected).abs().max().item()
    return err / max(expected.abs().max().item(), 1e-300)


def tolerance(name: str, dtype: str) -> float:
    """The dtype's tolerance, at the kernel's declared internal precision (``computes_in``)."""
    return RTOL[BY_NAME[name].capabilities.precision(dtype)] * LOOSER.get(name, 1.0)


def loaded(spec: KernelSpec):
    reason = spec.unavailable_reason()
    if reason is not None:
        pytest.skip(f"{spec.name} unavailable: {reason}")
    return spec.callable()


# --------------------------------------------------------------------------- every kernel, every dtype


def _by_cost(specs) -> list:
    """The kernels' names; a slow one's (a Triton kernel under the interpreter: seconds a call) in the end-to-end
    tier, `make test-all` (`tests/test_kernel_suite.py` searches every kernel in the default tier)."""
    return [pytest.param(s.name, marks=[pytest.mark.e2e] if s.capabilities.slow else []) for s in specs]


@pytest.mark.parametrize("dtype", ALL_DTYPES)
@pytest.mark.parametrize("name", _by_cost(SPECS))
def test_kernel_matches_float64_definition(name: str, dtype: str) -> None:
    spec = BY_NAME[name]
    fn = loaded(spec)
    why_not = spec.capabilities.runs(dtype, "cpu")
    if why_not is not None:
        pytest.skip(f"{name} {dtype}@cpu: {why_not}")
    inputs, kwargs = make_case(spec, dtype)
    before = {k: v.clone() for k, v in inputs.items()}
    eps = 0.0 if spec.family is Family.RETENTION_NORMED else None  # eps > 0: the forms differ by design
    with torch.no_grad():
        out = call(spec, fn, inputs, kwargs, eps)
    expected = definition(spec, inputs, eps) if spec.family not in GATED else \
        gated_definition(spec, {k: v.to(F64) for k, v in inputs.items()}, kwargs=kwargs)
    for k, v in inputs.items():
        assert torch.equal(v, before[k]), f"{name} wrote to its input {k!r}"
    outs, refs = (out, expected) if spec.family in GATED else ([out], [expected])
    rtol = tolerance(name, dtype)
    for what, got, ref in zip(("output", "final state"), outs, refs):
        assert isinstance(got, torch.Tensor), f"{name}: {what} is {type(got).__name__}"
        assert tuple(got.shape) == tuple(ref.shape), f"{name} returned {what} of shape {tuple(got.shape)}"
        err = normwise_error(got, ref)
        assert err <= rtol, f"{name} {dtype}: {what} normwise error {err:.3g} > {rtol:g}"
    assert outs[0].dtype == DTYPE_NAMES[dtype], f"{name} returned {outs[0].dtype} for {dtype} inputs"


def _declared_limits() -> list[tuple[str, str]]:
    """(kernel, dtype) pairs declared unsupported here for a reason testable on this machine."""
    pairs = []
    for spec in SPECS:
        caps = spec.capabilities
        for key in caps.unsupported:
            dtype, _, device = key.partition("@")
            if dtype in ALL_DTYPES and device in ("", "cpu") and "cpu" not in caps.unsupported:
                pairs.append((spec.name, dtype))
    return pairs


@pytest.mark.parametrize(("name", "dtype"), _declared_limits())
def test_declared_limitation_still_holds(name: str, dtype: str) -> None:
    """A dtype declared unsupported really fails here (raises, NaN, or far off); if not, re-declare it."""
    spec = BY_NAME[name]
    fn = loaded(spec)
    inputs, kwargs = make_case(spec, dtype)
    eps = 0.0 if spec.family is Family.RETENTION_NORMED else None
    try:
        with torch.no_grad():
            out = call(spec, fn, inputs, kwargs, eps)
    except Exception:  # noqa: BLE001 - raising is one way of failing
        return
    if spec.family in GATED:
        out = out[0]
        expected = gated_definition(spec, {k: v.to(F64) for k, v in inputs.items()}, kwargs=kwargs)[0]
    else:
        expected = definition(spec, inputs, eps)
    err = normwise_error(out, expected)
    assert math.isnan(err) or err > tolerance(name, dtype), (
        f"{name} {dtype} is declared unsupported ({spec.capabilities.runs(dtype, 'cpu')}) but now matches the "
        f"definition (normwise error {err:.3g}): re-check and declare it supported")


@pytest.mark.parametrize("name", ["fla.fused_recurrent_retention", "torchscale.parallel", "torchscale.recurrent",
                                  "torchscale.chunkwise"])
def test_float64_is_float32_accurate(name: str) -> None:
    """The float64 entries that say "computed in float32": float64 out, float32 accuracy (not garbage)."""
    spec = BY_NAME[name]
    fn = loaded(spec)
    inputs, kwargs = make_case(spec, "float64")
    eps = 0.0 if spec.family is Family.RETENTION_NORMED else None
    with torch.no_grad():
        out = call(spec, fn, inputs, kwargs, eps)
    err = normwise_error(out, definition(spec, inputs, eps))
    assert out.dtype == F64 and RTOL["float64"] < err < RTOL["float32"], err


@pytest.mark.parametrize("name", _by_cost([s for s in SPECS if s.capabilities.autograd]))
def test_gradients_match_definition(name: str) -> None:
    spec = BY_NAME[name]
    fn = loaded(spec)
    caps = spec.capabilities
    dtype = next((d for d in ("float64", "float32") if caps.runs(d, "cpu") is None), None)
    if dtype is None:
        pytest.skip(f"{name} runs neither float64 nor float32 on the CPU")
    inputs, kwargs = make_case(spec, dtype, seed=1)
    inputs = {k: v.requires_grad_() for k, v in inputs.items()}
    eps = 0.0 if spec.family is Family.RETENTION_NORMED else None  # torchscale's detached row scales cancel at 0
    out = call(spec, fn, inputs, kwargs, eps)
    outs = out if spec.family in GATED else [out]
    gen = torch.Generator().manual_seed(2)
    weights = [torch.randn(o.shape, generator=gen, dtype=F64) for o in outs]
    loss = sum((o.to(F64) * w).sum() for o, w in zip(outs, weights))
    grads = torch.autograd.grad(loss, list(inputs.values()), allow_unused=spec.family in GATED)
    ref_inputs = {k: v.detach().to(F64).requires_grad_() for k, v in inputs.items()}
    expected = (gated_definition(spec, ref_inputs, loops=True, kwargs=kwargs) if spec.family in GATED
                else [definition(spec, ref_inputs, eps, loops=True)])
    ref_grads = torch.autograd.grad(sum((e * w).sum() for e, w in zip(expected, weights)), list(ref_inputs.values()))
    rtol = tolerance(name, dtype)
    for key, g, r in zip(inputs, grads, ref_grads):
        assert g is not None, f"{name}: no gradient for {key}"
        err = normwise_error(g, r)
        assert err <= 10 * rtol, f"{name}: gradient of {key} off by {err:.3g} (normwise)"


@pytest.mark.parametrize("name", [s.name for s in SPECS if s.family in (Family.SIMPLE_GLA, Family.GLA)
                                  and declares(s, "varlen") and not s.name.endswith(".ieee")])
def test_gated_kernels_reset_the_state_at_cu_seqlens(name: str) -> None:
    """Variable-length batches (fla's cu_seqlens): three sequences packed in one row, boundaries at no chunk
    multiple, each from its own initial state where the kernel takes one; output and final states against the
    oracle. The same call without cu_seqlens (state carried across the boundaries) is far off: the check sees it."""
    spec = BY_NAME[name]
    fn = loaded(spec)
    gen = torch.Generator().manual_seed(7)
    length, heads, hd, cu = 33, 2, 16, torch.tensor([0, 7, 20, 33])
    r = lambda *shape: torch.randn(*shape, generator=gen, dtype=F64)  # noqa: E731
    g_shape = (1, length, heads) if spec.family is Family.SIMPLE_GLA else (1, length, heads, hd)
    x = {"q": r(1, length, heads, hd), "k": r(1, length, heads, hd), "v": r(1, length, heads, hd),
         "g": -torch.rand(*g_shape, generator=gen, dtype=F64) * 0.2}
    h0 = r(3, heads, hd, hd) if declares(spec, "initial_state") else None
    final = declares(spec, "final_state")
    cast = {k: v.float() for k, v in x.items()}
    o64, state64 = ORACLE_GATED[spec.family](*(v.double() for v in cast.values()), initial_state=h0,
                                             output_final_state=True, cu_seqlens=cu)
    h0c = None if h0 is None else h0.float()
    o, state = fn(*cast.values(), initial_state=h0c, output_final_state=final, cu_seqlens=cu)
    rtol = tolerance(name, "float32")
    assert normwise_error(o, o64) <= rtol, normwise_error(o, o64)
    if final:
        assert state.shape == state64.shape and normwise_error(state, state64) <= rtol
    leaked, _ = fn(*cast.values(), initial_state=None if h0c is None else h0c[:1], output_final_state=False)
    assert normwise_error(leaked, o64) > 10 * rtol


@pytest.mark.parametrize(("name", "kwargs", "match"), [
    ("fla.simple_gla.parallel", {"initial_state": "state"}, "initial_state was given, but fla.simple_gla.parallel"),
    ("fla.simple_gla.parallel", {"output_final_state": True}, "output_final_state=True was given"),
    ("fla.simple_gla.naive_recurrent", {"cu_seqlens": torch.tensor([0, 4, 6])}, "cu_seqlens was given"),
    ("fla.gla.naive_recurrent", {"scale": 0.5}, "scale=0.5: fla.gla.naive_recurrent always scales by K"),
    ("fla.simple_gla.fused_recurrent", {"chunk": 4}, r"unexpected keyword arguments \['chunk'\]"),
    ("fla.simple_gla.fused_recurrent", {"chunk_size": 16}, "chunk_size=16: fla.simple_gla.fused_recurrent takes no"),
    ("fla.gla.chunk", {"chunk_size": 16}, "chunk_size=16: fla.gla.chunk forms its chunks of 64 itself"),
])
def test_gated_adapters_refuse_what_the_kernel_does_not_take(name: str, kwargs: dict, match: str) -> None:
    """A part of the contract the kernel does not declare is refused with the argument named, not dropped."""
    spec = BY_NAME[name]
    fn = loaded(spec)
    q = torch.randn(1, 6, 1, 16)
    g = -torch.rand(1, 6, 1) if spec.family is Family.SIMPLE_GLA else -torch.rand(1, 6, 1, 16)
    if kwargs.get("initial_state") == "state":
        kwargs = {"initial_state": torch.zeros(1, 1, 16, 16)}
    with pytest.raises(InvalidArgument, match=match):
        fn(q, q, q, g, **kwargs)


def test_ssd_adapters_refuse_what_the_kernel_does_not_take(mamba_path) -> None:
    if not triton_interpreter.runs_interpreted():
        pytest.skip("CUDA is present: mamba-ssm's kernels run compiled (tests/test_cuda_path.py)")
    minimal = mamba_ssm_adapter._load_ssd_minimal(path=mamba_path)
    ref = mamba_ssm_adapter._load_chunk_scan_combined_ref(path=mamba_path)
    x, dt, A = torch.randn(1, 8, 2, 4), torch.rand(1, 8, 2), -torch.rand(2)
    B, C = torch.randn(1, 8, 1, 4), torch.randn(1, 8, 1, 4)
    with pytest.raises(InvalidArgument, match="D was given, but ssd_minimal_discrete"):
        minimal(x, dt, A, B, C, 4, D=torch.ones(2))
    with pytest.raises(InvalidArgument, match="dt_softplus=True"):
        minimal(x, dt, A, B, C, 4, dt_softplus=True)
    with pytest.raises(InvalidArgument, match=r"does not take \['initial_states'\]"):
        ref(x, dt, A, B, C, 4, initial_states=torch.zeros(1, 2, 4, 4))
    y = minimal(x, dt, A, B, C, 4)  # what it does take runs
    assert y.shape == x.shape


# --------------------------------------------------------------------------- torchscale


def test_torchscale_adapters_are_the_layer_code_paths() -> None:
    """Adapters + rotary/gate/out_proj around them == MultiScaleRetention.forward (the seed's setup)."""
    fns = {form: loaded(BY_NAME[f"torchscale.{form}"]) for form in ("parallel", "recurrent", "chunkwise")}
    from torchscale.architecture.config import RetNetConfig
    from torchscale.architecture.retnet import RetNetRelPos
    from torchscale.component.multiscale_retention import MultiScaleRetention, theta_shift

    batch, length, dim, heads, chunk = 3, 16, 16, 4, 4
    x = torch.arange(batch * length * dim, dtype=torch.float).view(batch, length, dim)
    x = x / x.max()
    diffs = {}
    for eps in (1e-5, 0.0):
        args = RetNetConfig(decoder_embed_dim=dim, decoder_value_embed_dim=dim, decoder_retention_heads=heads,
                            recurrent_chunk_size=chunk, layernorm_eps=eps)
        rng = torch.random.get_rng_state()
        torch.manual_seed(0)
        layer, rel_pos = MultiScaleRetention(args, dim, dim, heads), RetNetRelPos(args)
        torch.random.set_rng_state(rng)
        with torch.no_grad():
            full = {"parallel": layer(x, rel_pos(length)),
                    "chunkwise": layer(x, rel_pos(length, chunkwise_recurrent=True), chunkwise_recurrent=True)}
            state: dict = {}
            full["recurrent"] = torch.cat([layer(x[:, t:t + 1], rel_pos(t + 1, activate_recurrent=True),
                                                 incremental_state=state) for t in range(length)], dim=1)
            (sin, cos), _ = rel_pos(length)

            def rotate(t):
                return theta_shift(t.view(batch, length, heads, -1).transpose(1, 2), sin, cos).transpose(1, 2)

            q, k = rotate(layer.q_proj(x)), rotate(layer.k_proj(x))
            v = layer.v_proj(x).view(batch, length, heads, -1)
            gate = layer.gate_fn(layer.g_proj(x))
            for form, fn in fns.items():
                o = fn(q, k, v, eps, **({"chunk_size": chunk} if form == "chunkwise" else {}))
                y = layer.out_proj(gate * o.reshape(batch, length, dim))
                # parallel and chunkwise agree bit for bit; the recurrent layer projects one token at a time
                # (another summation order in the Linear layers), which eps = 0 amplifies to ~5e-7
                tol = dict(rtol=1e-5, atol=2e-6) if form == "recurrent" else dict(rtol=0.0, atol=0.0)
                torch.testing.assert_close(y, full[form], **tol,
                                           msg=lambda m, form=form, eps=eps: f"torchscale.{form}, eps={eps}: {m}")
        diffs[eps] = (full["parallel"] - full["chunkwise"]).abs().max().item()
    # the seed issue: 4.4e-2 at eps = 1e-5, 3.4e-7 at eps = 0 (float32, through the layer)
    assert diffs[1e-5] > 1e-2 and diffs[0.0] < 1e-5, diffs


def test_torchscale_import_leaves_no_stubs() -> None:
    loaded(BY_NAME["torchscale.parallel"])
    for top in ("fairscale", "timm"):
        if importlib.util.find_spec(top) is None:
            assert top not in sys.modules, f"the {top} import stub was left in sys.modules"


def test_torchscale_convention_is_the_float32_decay() -> None:
    gammas = torchscale_adapter.torchscale_gammas(4)
    exact = [1 - 2.0 ** (-5 - h) for h in range(4)]
    assert all(0 < abs(g - e) / (1 - e) < 1e-5 for g, e in zip(gammas, exact))  # float32 log: close, not equal
    assert BY_NAME["torchscale.parallel"].convention.scale(16) == 0.25


# --------------------------------------------------------------------------- mambapy, yar


def test_mambapy_selective_scan_passes_D() -> None:
    for name in ("mambapy.selective_scan", "mambapy.selective_scan_seq"):
        spec = BY_NAME[name]
        fn = loaded(spec)
        inputs, _ = make_case(spec, "float64")
        D = torch.randn(4, dtype=F64)
        out = fn(*inputs.values(), D=D)
        expected = loop_selective_scan(*inputs.values(), D=D)
        assert normwise_error(out, expected) <= RTOL["float64"]
        with pytest.raises(InvalidArgument, match="delta_softplus"):
            fn(*inputs.values(), delta_softplus=True)


def test_yar_convention_differs_from_retnet() -> None:
    assert yet_another_retnet_adapter.yar_gammas(5) == pytest.approx([1 - 2.0 ** (-5 - h) for h in range(5)])
    assert yet_another_retnet_adapter.yar_gammas(3)[1] == pytest.approx(1 - 2.0**-7)  # RetNet's h=1 is 1 - 2**-6
    assert BY_NAME["yar.parallel"].convention.name == "yet-another-retnet"


# --------------------------------------------------------------------------- mamba-ssm (stand-ins)


def _fake_selective_scan_fn(u, delta, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False):
    """selective_scan_fn's documented semantics and dtype checks (the CUDA kernel's TORCH_CHECKs)."""
    assert u.dtype in (torch.float32, torch.float16, torch.bfloat16) and delta.dtype == u.dtype
    assert A.dtype == torch.float32 and (D is None or D.dtype == torch.float32)
    assert delta_bias is None or delta_bias.dtype == torch.float32
    assert B.dtype == u.dtype and C.dtype == u.dtype
    return loop_selective_scan(u, delta, A, B, C, D, z, delta_bias, delta_softplus).to(u.dtype)


def _fake_selective_state_update(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False):
    """selective_state_update's documented semantics, 3-D and multi-head forms; updates ``state`` in place."""
    heads = state.dim() > 3
    if not heads:
        state4, x, dt, A = state.unsqueeze(1), x.unsqueeze(1), dt.unsqueeze(1), A.unsqueeze(0)
        B, C = B.unsqueeze(1), C.unsqueeze(1)
        D = None if D is None else D.unsqueeze(0)
        z = None if z is None else z.unsqueeze(1)
        dt_bias = None if dt_bias is None else dt_bias.unsqueeze(0)
    else:
        state4 = state
    nheads, ngroups = state4.shape[1], B.shape[1]
    dt = dt.double() + (0 if dt_bias is None else dt_bias.double())
    dt = F.softplus(dt) if dt_softplus else dt
    B = B.double().repeat_interleave(nheads // ngroups, dim=1)
    C = C.double().repeat_interleave(nheads // ngroups, dim=1)
    decay = torch.exp(dt[..., None] * A.double())
    new = state4.double() * decay + dt[..., None] * B[:, :, None] * x.double()[..., None]
    state4.copy_(new)
    out = (new * C[:, :, None]).sum(-1)
    if D is not None:
        out = out + x.double() * D.double()
    if z is not None:
        out = out * F.silu(z.double())
    out = out.to(x.dtype)
    return out if heads else out.squeeze(1)


def _install_fake_mamba_ssm(monkeypatch) -> None:
    names = {
        "mamba_ssm": {},
        "mamba_ssm.ops": {},
        "mamba_ssm.ops.selective_scan_interface": {"selective_scan_fn": _fake_selective_scan_fn},
        "mamba_ssm.ops.triton": {},
        "mamba_ssm.ops.triton.selective_state_update": {"selective_state_update": _fake_selective_state_update},
    }
    for name, attrs in names.items():
        module = types.ModuleType(name)
        module.__dict__.update(attrs)
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.setattr(mamba_ssm_adapter, "require_cuda", lambda: None)


@pytest.mark.parametrize("grouped", [False, True])
@pytest.mark.parametrize("loader", ["_load_selective_scan_fn", "_load_selective_state_update"])
def test_mamba_ssm_adapters_wire_layouts(monkeypatch, loader: str, grouped: bool) -> None:
    _install_fake_mamba_ssm(monkeypatch)
    fn = getattr(mamba_ssm_adapter, loader)()  # not spec.callable(): the stand-in must not be cached
    gen = torch.Generator().manual_seed(3)
    batch, dim, n, length, groups = 2, 4, 3, 7, 2
    bc_shape = (batch, groups, n, length) if grouped else (batch, n, length)
    args = dict(u=torch.randn(batch, dim, length, generator=gen), delta=torch.rand(batch, dim, length, generator=gen),
                A=-torch.rand(dim, n, generator=gen) - 0.1, B=torch.randn(bc_shape, generator=gen),
                C=torch.randn(bc_shape, generator=gen), D=torch.randn(dim, generator=gen),
                z=torch.randn(batch, dim, length, generator=gen), delta_bias=torch.randn(dim, generator=gen) * 0.1)
    before = {k: v.clone() for k, v in args.items()}
    out = fn(*(args[k] for k in ("u", "delta", "A", "B", "C")), D=args["D"], z=args["z"],
             delta_bias=args["delta_bias"], delta_softplus=True)
    expected = loop_selective_scan(**args, delta_softplus=True)
    assert out.dtype == torch.float32 and out.shape == (batch, dim, length)
    assert normwise_error(out, expected) <= RTOL["float32"]
    assert all(torch.equal(args[k], before[k]) for k in args)


def test_mamba_ssm_unavailable_reason_names_cuda() -> None:
    if importlib.util.find_spec("mamba_ssm") is not None or torch.cuda.is_available():
        pytest.skip("mamba-ssm or CUDA is present here")
    reason = BY_NAME["mamba_ssm.selective_scan_fn"].unavailable_reason()
    assert reason and "mamba-ssm" in reason and "CUDA" in reason


# --------------------------------------------------------------------------- mamba-ssm's Triton kernels, interpreted
BUNDLE = __import__("pathlib").Path(__file__).resolve().parents[1] / ".device-bundle"


@pytest.fixture(scope="module")
def mamba_path():
    """Where mamba-ssm is imported from: installed (None), else `make device-bundle`'s build without CUDA."""
    if importlib.util.find_spec("mamba_ssm") is not None:
        return None
    if (BUNDLE / "mamba_ssm").is_dir():
        return [str(BUNDLE)]
    pytest.skip("mamba-ssm is neither installed (`make install-mamba-ssm`) nor in the device bundle "
                "(`make device-bundle`)")


def _mamba_module(module: str, path):
    if not triton_interpreter.runs_interpreted():
        pytest.skip("CUDA is present: mamba-ssm's kernels run compiled (tests/test_cuda_path.py)")
    try:
        return mamba_ssm_adapter.import_triton_module(module, path=path)
    except KernelUnavailable as exc:
        pytest.fail(f"{module} does not load interpreted: {exc.reason}")


@pytest.mark.parametrize("grouped", [False, True])
def test_mamba_selective_state_update_runs_interpreted(mamba_path, grouped: bool) -> None:
    """The Triton single-step kernel, on the CPU: bfloat16 with every option, both layouts, at bfloat16's
    tolerance; float32 without softplus at float32's (its softplus: the next test)."""
    mod = _mamba_module("mamba_ssm.ops.triton.selective_state_update", mamba_path)
    fn = mamba_ssm_adapter.state_update_scan(mod.selective_state_update)
    gen = torch.Generator().manual_seed(4)
    batch, dim, n, length, groups = 2, 4, 4, 9, 2
    bc = (batch, groups, n, length) if grouped else (batch, n, length)
    base = dict(u=torch.randn(batch, dim, length, generator=gen),
                delta=0.1 + torch.rand(batch, dim, length, generator=gen),
                A=-torch.rand(dim, n, generator=gen) - 0.1, B=torch.randn(bc, generator=gen),
                C=torch.randn(bc, generator=gen), D=torch.randn(dim, generator=gen),
                z=torch.randn(batch, dim, length, generator=gen), delta_bias=torch.randn(dim, generator=gen) * 0.1)
    for dtype, softplus in ((torch.bfloat16, True), (torch.float32, False)):
        args = {k: v.to(dtype) if k not in ("A", "D", "delta_bias") else v for k, v in base.items()}
        out = fn(*(args[k] for k in ("u", "delta", "A", "B", "C")), D=args["D"], z=args["z"],
                 delta_bias=args["delta_bias"], delta_softplus=softplus)
        expected = loop_selective_scan(**args, delta_softplus=softplus)
        assert out.dtype == dtype and out.shape == (batch, dim, length)
        name = "bfloat16" if dtype == torch.bfloat16 else "float32"
        assert normwise_error(out, expected) <= RTOL[name], (name, normwise_error(out, expected))


def _softplus_log1p(dt):
    """log1p(exp(dt)) to float32 accuracy, as a Triton function: log(w) * e / (w - 1) with w = 1 + e."""
    e = tl.exp(dt)
    w = 1.0 + e
    return tl.where(w == 1.0, e, tl.log(w) * (e / (w - 1.0)))


@pytest.mark.e2e
def test_mamba_state_update_float32_softplus_is_mamba_ssm_s_own(mamba_path, monkeypatch) -> None:
    """Found by the harness: in float32 with ``dt_softplus`` the kernel is divergent (cond error 5-17, 25-300 times
    the float32 loop), because mamba-ssm's Triton-3 softplus is ``log(exp(dt) + 1)``
    (ops/triton/softplus.py), which loses dt's relative precision for negative arguments (exp(dt) + 1 rounds
    to 1), not ``log1p``. The same kernel with an accurate softplus put in its place is equivalent: the
    finding is the kernel's, not the interpreter's or the adapter's."""
    triton = pytest.importorskip("triton")

    from harness.problems import Problem
    from harness.runner import RunOptions, run_case

    mod = _mamba_module("mamba_ssm.ops.triton.selective_state_update", mamba_path)

    accurate = triton.jit(_softplus_log1p)
    spec = BY_NAME["mamba_ssm.selective_state_update"]
    probe = KernelSpec(name="probe.selective_state_update", family=Family.SELECTIVE_SCAN,
                       load=lambda: mamba_ssm_adapter.state_update_scan(mod.selective_state_update),
                       capabilities=spec.capabilities)
    problem = Problem(family="selective_scan", length=37, dtype="float32", seed=11, batch=2, dim=4, state=8,
                      delta_softplus=True, has_delta_bias=True)
    shipped = run_case(probe, problem, RunOptions(timeout_s=None, check_determinism=False))
    monkeypatch.setattr(mod, "softplus", accurate)
    fixed = run_case(probe, problem, RunOptions(timeout_s=None, check_determinism=False))
    assert shipped["verdict"] == "divergent" and shipped["cond_max"] > 2, shipped["why"]
    assert fixed["verdict"] == "equivalent", fixed["why"]
    assert shipped["cond_max"] > 10 * fixed["cond_max"]


@pytest.mark.e2e
def test_mamba_chunk_scan_combined_float32_softplus_is_mamba_ssm_s_own(mamba_path) -> None:
    """The same finding in Mamba-2's SSD: ``_chunk_cumsum_fwd_kernel`` applies the same softplus to dt before its
    cumulative sums; with ieee dots (float32 held to float32) the kernel is divergent with ``dt_softplus``, and
    equivalent with an accurate softplus in its place. (With TF32 dots, the default, TF32's rounding hides it.)"""
    triton = pytest.importorskip("triton")

    from harness.problems import Problem
    from harness.runner import RunOptions, run_case

    if not triton_interpreter.runs_interpreted():
        pytest.skip("CUDA is present: mamba-ssm's kernels run compiled (tests/test_cuda_path.py)")
    spec = BY_NAME["mamba_ssm.mamba_chunk_scan_combined.ieee"]
    problem = Problem(family="ssd", length=20, dtype="float32", seed=0, regime="long_memory", heads=2, groups=1,
                      dv=4, state=4, chunk_size=16, delta_softplus=True)
    options = RunOptions(timeout_s=None, check_determinism=False)
    shipped = run_case(spec, problem, options, kernel_fn=mamba_ssm_adapter._load_chunk_scan_combined(
        "ieee", path=mamba_path))
    patched = _mamba_module("mamba_ssm.ops.triton.ssd_combined", mamba_path)  # a fresh import of its own
    patched._chunk_cumsum_fwd.__globals__["softplus"] = triton.jit(_softplus_log1p)  # ssd_chunk_state's globals

    def accurate(*args, **kwargs):
        with triton_interpreter.dot_input_precision("ieee"):
            return patched.mamba_chunk_scan_combined(*args, **kwargs)

    fixed = run_case(spec, problem, options, kernel_fn=accurate)
    assert shipped["verdict"] == "divergent" and shipped["cond_max"] > 10, shipped["why"]
    assert fixed["verdict"] == "equivalent", fixed["why"]


@pytest.mark.e2e
def test_mamba_chunk_scan_combined_runs_interpreted(mamba_path) -> None:
    """Mamba-2's SSD (forward and backward Triton kernels) on the CPU, in mamba-ssm's layout, against the
    ssd oracle: grouped B/C, D, z, dt_bias with softplus, an initial state, a seq_idx boundary and the final
    states, over two chunks and a partial third (float32 with ieee dots; bfloat16); then softplus with large dt."""
    ssd = ORACLE_SSD or pytest.skip("the ssd oracle (reference_impls.gated_decay) is not here")
    mod = _mamba_module("mamba_ssm.ops.triton.ssd_combined", mamba_path)
    gen = torch.Generator().manual_seed(5)
    length, heads, groups, p, n = 37, 4, 2, 4, 4
    r = lambda *shape: torch.randn(*shape, generator=gen, dtype=F64)  # noqa: E731
    args = dict(x=r(1, length, heads, p), dt=r(1, length, heads), A=-(0.2 + torch.rand(heads, generator=gen,
                dtype=F64)), B=r(1, length, groups, n), C=r(1, length, groups, n))
    opts = dict(D=r(heads), z=r(1, length, heads, p), dt_bias=0.5 * r(heads), initial_states=r(1, heads, p, n))
    seq_idx = (torch.arange(length) >= 21).long().unsqueeze(0)
    y64, final64 = ssd(*args.values(), 16, **opts, dt_softplus=True, seq_idx=seq_idx, return_final_states=True)
    for dtype, precision, rtol in ((torch.float32, "ieee", RTOL["float32"]), (torch.bfloat16, None, RTOL["bfloat16"])):
        cast = {k: v.to(dtype).requires_grad_() for k, v in {**args, **opts}.items()}
        with triton_interpreter.dot_input_precision(precision):
            y, final = mod.mamba_chunk_scan_combined(*(cast[k] for k in args), 16, D=cast["D"], z=cast["z"],
                                                     dt_bias=cast["dt_bias"], initial_states=cast["initial_states"],
                                                     seq_idx=seq_idx.int(), dt_softplus=True,
                                                     return_final_states=True)
        assert y.dtype == dtype and normwise_error(y, y64) <= rtol, normwise_error(y, y64)
        assert normwise_error(final, final64) <= rtol, normwise_error(final, final64)
        if dtype == torch.float32:  # the backward kernels (mamba-ssm's SSD backward, interpreted) against autograd
            weights = torch.randn(y.shape, generator=gen, dtype=F64)  # through the float64 loop
            with triton_interpreter.dot_input_precision(precision):
                grads = torch.autograd.grad((y.to(F64) * weights).sum(), list(cast.values()))
            ref = {k: v.detach().to(F64).requires_grad_() for k, v in cast.items()}
            y_ref, _ = loop_ssd(*(ref[k] for k in args), D=ref["D"], z=ref["z"], dt_bias=ref["dt_bias"],
                                dt_softplus=True, initial_states=ref["initial_states"], seq_idx=seq_idx)
            ref_grads = torch.autograd.grad((y_ref * weights).sum(), list(ref.values()))
            for key, g, r in zip(cast, grads, ref_grads):
                assert normwise_error(g, r) <= 10 * rtol, (key, normwise_error(g, r))
    # softplus with large dt (25 +- 10: linear there; mamba-ssm's threshold is 20), float32 with ieee dots
    big = {**args, "dt": 25 + 10 * args["dt"]}
    y64 = ssd(*big.values(), 16, dt_softplus=True)
    with triton_interpreter.dot_input_precision("ieee"):
        y = mod.mamba_chunk_scan_combined(*(v.float() for v in big.values()), 16, dt_softplus=True)
    assert normwise_error(y, y64) <= RTOL["float32"], normwise_error(y, y64)


@pytest.mark.e2e
def test_mamba_chunk_scan_combined_is_judged_at_its_float32_chunk_decays(mamba_path) -> None:
    """mamba-ssm's SSD forms dA's cumulative sums in float32 whatever the input; charged at bfloat16's (float16's)
    own u, its strong-decay cases had no guaranteed digit over most of the output (out_of_domain,
    precision_exhausted: 2,432 of 2,560 elements). Declared (`Capabilities.chunk_computes_in`), they are judged:
    equivalent, cond <= 0.05."""
    from harness.problems import Problem
    from harness.runner import RunOptions, run_case

    if not triton_interpreter.runs_interpreted():
        pytest.skip("CUDA is present: mamba-ssm's kernels run compiled (tests/test_cuda_path.py)")
    spec = BY_NAME["mamba_ssm.mamba_chunk_scan_combined"]
    fn = mamba_ssm_adapter._load_chunk_scan_combined(None, path=mamba_path)
    for dtype in ("bfloat16", "float16"):
        assert spec.capabilities.chunk_precision(dtype) == "float32"
        p = Problem(family="ssd", length=80, dtype=dtype, batch=1, heads=2, groups=1, dv=16, state=16,
                    regime="strong_decay", chunk_size=64, seed=7)
        record = run_case(spec, p, RunOptions(timeout_s=None, check_determinism=False), kernel_fn=fn)
        assert record["verdict"] == "equivalent" and record["chunk_precision"] == "float32", record["why"]

def test_mamba_ssm_triton_kernels_say_how_to_get_them() -> None:
    if importlib.util.find_spec("mamba_ssm") is not None or not triton_interpreter.runs_interpreted():
        pytest.skip("mamba-ssm is installed here, or CUDA is present")
    for name in ("mamba_ssm.selective_state_update", "mamba_ssm.mamba_chunk_scan_combined"):
        reason = BY_NAME[name].unavailable_reason()
        assert reason and "make install-mamba-ssm" in reason and "interpreter" in reason, reason


def test_torchmamba_unavailable_reason_names_python() -> None:
    if sys.version_info >= (3, 12):
        pytest.skip("torchmamba may install on this Python")
    reason = BY_NAME["torchmamba.selective_scan_loop"].unavailable_reason()
    required = re.search(r"Requires-Python >=(\d+)\.(\d+)", reason or "")
    assert required is not None, reason
    assert (int(required[1]), int(required[2])) > sys.version_info[:2], reason  # a Python newer than this one
    assert f"Python {sys.version_info.major}.{sys.version_info.minor}" in reason, reason  # and this one, named


# --------------------------------------------------------------------------- the Triton interpreter shim


def test_pin_autotuner_runs_one_config_without_benchmarking() -> None:
    triton = pytest.importorskip("triton")
    triton_interpreter.enable_interpreter([])
    if not triton_interpreter.interpreter_enabled():
        pytest.skip("CUDA is present: kernels run compiled and are not pinned")
    import triton.language as tl

    runs: list[int] = []

    def count(nargs):
        runs.append(nargs["BLOCK"])

    @triton.autotune(configs=[triton.Config({"BLOCK": b}, pre_hook=count) for b in (16, 32, 64)], key=["n"])
    @triton.jit
    def double(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(y_ptr + offs, 2 * tl.load(x_ptr + offs, mask=offs < n), mask=offs < n)

    assert triton_interpreter.is_interpreted(double)
    module = types.ModuleType("harness_test_fake_kernels")
    module.double = double
    sys.modules[module.__name__] = module
    try:
        assert triton_interpreter.pin_autotuners(module.__name__) == 1
        assert triton_interpreter.pin_autotuners(module.__name__) == 0  # idempotent
        assert triton_interpreter.pin_autotuner(double) == 0
    finally:
        del sys.modules[module.__name__]
    x = torch.arange(40, dtype=torch.float32)
    y = torch.empty_like(x)
    double[lambda meta: (triton.cdiv(40, meta["BLOCK"]),)](x, y, 40)
    assert runs == [16], f"pinned autotuner ran configs {runs}; expected the first config once, no benchmark"
    assert torch.equal(y, 2 * x)


def test_enable_interpreter_refuses_after_compiled_import(monkeypatch) -> None:
    monkeypatch.setattr(triton_interpreter, "interpreter_enabled", lambda: False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setitem(sys.modules, "harness_test_compiled_kernels", types.ModuleType("harness_test_compiled_kernels"))
    with pytest.raises(KernelUnavailable, match="was imported before TRITON_INTERPRET=1"):
        triton_interpreter.enable_interpreter(["harness_test_compiled_kernels"])


def test_require_interpreted_finds_compiled_kernels(monkeypatch) -> None:
    pytest.importorskip("triton")
    from triton.runtime.jit import JITFunction

    def kernel(x_ptr):
        pass

    module = types.ModuleType("harness_test_gpu_kernels")
    module.kernel = JITFunction(kernel)  # what @triton.jit returns with the interpreter off
    monkeypatch.setitem(sys.modules, module.__name__, module)
    assert triton_interpreter.compiled_kernels(module.__name__) == ["harness_test_gpu_kernels.kernel"]
    monkeypatch.setattr(triton_interpreter, "interpreter_enabled", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(KernelUnavailable, match="compiled for a GPU"):
        triton_interpreter.require_interpreted(module.__name__)


def test_triton_adapters_declare_the_interpreter() -> None:
    interpreted = triton_interpreter.runs_interpreted()
    for name in ("accelerated_scan.scalar", "fla.parallel_retention", "fla.fused_recurrent_retention"):
        caps = BY_NAME[name].capabilities
        assert caps.slow is interpreted
        assert ("cpu" in caps.unsupported) is (not interpreted)


def test_every_autotuner_is_pinned_by_the_layer() -> None:
    """A kernel nobody passed to pin_autotuners (a user's) still runs one config, unbenchmarked."""
    triton = pytest.importorskip("triton")
    triton_interpreter.enable_interpreter([])
    if not triton_interpreter.interpreter_enabled():
        pytest.skip("CUDA is present: kernels run compiled and are not pinned")
    assert "autotuner_pinned" in triton_interpreter.active_corrections()
    import triton.language as tl

    runs: list[int] = []

    @triton.autotune(configs=[triton.Config({"BLOCK": b}, pre_hook=lambda nargs: runs.append(nargs["BLOCK"]))
                              for b in (32, 16)], key=["n"])
    @triton.jit
    def triple(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(y_ptr + offs, 3 * tl.load(x_ptr + offs, mask=offs < n), mask=offs < n)

    x = torch.arange(40, dtype=torch.float32)
    y = torch.empty_like(x)
    triple[lambda meta: (triton.cdiv(40, meta["BLOCK"]),)](x, y, 40)
    assert runs == [32] and torch.equal(y, 3 * x)


def test_fla_declares_tf32_for_its_dots_and_ieee_twins_do_not() -> None:
    """Every Triton kernel with float32 dots (fla's, mamba-ssm's SSD) declares TF32 and has an ``.ieee`` twin,
    float32 only, held to float32, whose gradients are checked too (backward in ieee: call_in_dot_precision)."""
    triton_specs = [s for s in fla_adapter.KERNELS + mamba_ssm_adapter.KERNELS
                    if "PyTorch" not in s.description and s.name != "mamba_ssm.selective_scan_fn"]
    twins = {s.name for s in triton_specs if s.name.endswith(".ieee")}
    assert twins and all(s.capabilities.dtypes == ("float32",) and not s.capabilities.computes_in
                         for s in triton_specs if s.name in twins)
    for spec in triton_specs:
        if spec.name in twins:
            continue
        has_twin = f"{spec.name}.ieee" in twins
        assert (spec.capabilities.computes_in.get("float32") == "tf32_rz") is has_twin, spec.name
        assert spec.capabilities.autograd or spec.name == "mamba_ssm.selective_state_update"
    assert all(BY_NAME[name].capabilities.autograd for name in twins)


def test_fused_chunk_gla_is_unavailable_with_fla_s_reason() -> None:
    spec = BY_NAME["fla.fused_chunk_gla"]
    reason = spec.unavailable_reason()
    loads = BY_NAME["fla.chunk_gla"].unavailable_reason()  # fla itself: not installed, or a version that fails
    if loads is not None or reason is None:
        pytest.skip(f"fla does not load here: {loads}" if loads else "fused_chunk_gla loads in this fla version")
    assert "deprecated" in reason


# --------------------------------------------------------------------------- lazy imports


@pytest.mark.e2e
def test_adapter_modules_import_no_third_party_package() -> None:
    modules = [m.__name__ for m in ADAPTER_MODULES] + [triton_interpreter.__name__]
    packages = ["mambapy", "torchscale", "fla", "accelerated_scan", "yet_another_retnet", "mamba_ssm",
                "torchmamba", "triton", "einops", "fairscale", "timm"]
    code = (f"import sys\nfor m in {modules!r}: __import__(m)\n"
            f"print([p for p in {packages!r} if p in sys.modules])")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                            cwd=str(__import__("pathlib").Path(__file__).resolve().parents[1]))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]", f"imported at module import time: {result.stdout.strip()}"
