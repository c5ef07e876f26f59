"""The CUDA path: in-tree kernels on each device, the TF32 axis, the determinism check, the GPU sweep.

Everything that can run on the CPU does; a test that needs a GPU is parametrized over an explicit
``"cuda"`` that skips with `harness.gpu.cuda_available`'s one-line reason where there is none. The
TF32 axis is checked on the CPU by emulating TF32 (`harness.gpu.round_to_tf32` on a matmul's inputs):
that error must be equivalent with ``tf32=True`` and divergent with ``tf32=False``.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from harness import dtypes
from harness.errors import InvalidArgument
from harness.gpu import (
    cuda_available,
    describe_environment,
    determinism_check,
    devices_to_test,
    restore_tf32_state,
    round_to_tf32,
    tf32_settings,
    tf32_state,
)
from harness.kernels import registry
from harness.kernels.blelloch import blelloch_linear_scan
from harness.kernels.contract import KernelSpec
from harness.kernels.retnet_forms import _decay_mask, _gammas
from harness.metrics import measure
from harness.problems import Problem
from harness.runner import reference_trace, run_case
from harness.verdict import Verdict, judge

ROOT = Path(__file__).resolve().parent.parent
CUDA_REASON = cuda_available()


def device_params() -> list:
    """`devices_to_test()` plus an explicit "cuda" that skips with the reason when there is no GPU."""
    params = []
    for device in dict.fromkeys([*devices_to_test(), "cuda"]):
        marks = []
        if device == "cuda":
            marks.append(pytest.mark.cuda)
            if CUDA_REASON is not None:
                marks.append(pytest.mark.skip(reason=CUDA_REASON))
        params.append(pytest.param(device, marks=marks, id=device))
    return params


DEVICES = device_params()
INTREE = [s.name for s in registry.all_kernels() if s.source == "intree"]
SHAPES = {
    "linear_scan": {"batch": 2, "dim": 3},
    "selective_scan": {"batch": 2, "dim": 4, "state": 3},
    "retention": {"batch": 1, "heads": 2, "dk": 8, "dv": 8},
    "retention_normed": {"batch": 1, "heads": 2, "dk": 8, "dv": 8, "eps": 1e-6},
}


def small_problem(spec: KernelSpec, device: str, dtype: str = "float32", tf32: bool = False,
                  length: int = 33) -> Problem:
    fam = spec.family.value
    chunk = 8 if spec.capabilities.takes_chunk else None
    return Problem(family=fam, length=length, dtype=dtype, tf32=tf32, device=device, chunk_size=chunk,
                   **SHAPES[fam])


def test_cuda_reason_is_one_line() -> None:
    devices = devices_to_test()
    assert devices[0] == "cpu"
    if CUDA_REASON is None:
        assert devices == ["cpu", "cuda"]
    else:
        assert devices == ["cpu"]
        assert "\n" not in CUDA_REASON and CUDA_REASON.startswith(("no CUDA device", "CUDA device present"))
        assert torch.__version__ in CUDA_REASON
    lines = describe_environment()
    assert lines[0] == f"torch {torch.__version__}"
    if CUDA_REASON is not None:
        assert CUDA_REASON in lines


# ------------------------------------------------------------------------------ (a) in-tree kernels
@pytest.mark.parametrize("setting", [("float32", False), ("float32", True), ("bfloat16", False)],
                         ids=["float32", "float32-tf32", "bfloat16"])
@pytest.mark.parametrize("kernel", INTREE)
@pytest.mark.parametrize("device", DEVICES)
def test_intree_kernel_equivalent_on_device(device: str, kernel: str, setting: tuple[str, bool]) -> None:
    spec = registry.get(kernel)
    dtype, tf32 = setting
    rec = run_case(spec, small_problem(spec, device, dtype, tf32))
    assert rec["device"] == device and rec["tf32"] is tf32
    assert rec["outcome"] == "ok", rec["error"]
    assert rec["verdict"] == "equivalent", rec["why"]


def test_intree_kernels_are_listed() -> None:
    assert {"intree.blelloch_scan", "intree.blelloch_selective_scan", "intree.retention_chunkwise"} <= set(INTREE)


# --------------------------------------------------------------------------------------- (b) TF32
def test_problem_accepts_tf32() -> None:
    p = Problem(family="retention", length=8, dtype="float32", tf32=True, device="cuda")
    assert p.tf32 is True
    assert Problem.from_dict(p.to_dict()) == p
    assert p.key != p.replace(tf32=False).key


def test_unit_roundoff_follows_tf32() -> None:
    assert dtypes.unit_roundoff("float32", tf32=True) == 2.0**-11
    assert dtypes.unit_roundoff("float32") == 2.0**-24
    assert dtypes.unit_roundoff("float16", tf32=True) == 2.0**-11  # only float32 changes
    assert dtypes.unit_roundoff("bfloat16", tf32=True) == 2.0**-8
    p = Problem(family="retention", length=16, **SHAPES["retention"])
    trace = reference_trace(p, p.make_inputs())
    out = trace.out.to(torch.float32)
    assert measure(out, trace, dtype="float32", length_axis=1, tf32=True).unit_roundoff == 2.0**-11
    assert measure(out, trace, dtype="float32", length_axis=1, tf32=False).unit_roundoff == 2.0**-24


def test_round_to_tf32() -> None:
    x = torch.tensor([1.0, 1.0 + 2.0**-11, 1.0 + 2.0**-10, 1.0 + 3 * 2.0**-12, -3.0, 0.0,
                      float("inf"), float("-inf"), float("nan")], dtype=torch.float32)
    y = round_to_tf32(x)
    # ties away from zero; 10 fraction bits kept; non-finite values untouched
    assert y[:6].tolist() == [1.0, 1.0 + 2.0**-10, 1.0 + 2.0**-10, 1.0 + 2.0**-10, -3.0, 0.0]
    assert y[6] == math.inf and y[7] == -math.inf and torch.isnan(y[8])
    r = torch.randn(10_000, dtype=torch.float32)
    rel = ((round_to_tf32(r).double() - r.double()).abs() / r.double().abs()).max().item()
    assert 0 < rel <= 2.0**-11
    with pytest.raises(InvalidArgument):
        round_to_tf32(r.double())


def tf32_retention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """`retention_parallel` with both matmuls' inputs rounded to TF32, as tensor cores do."""
    _, length, heads, dk = q.shape
    mask = _decay_mask(_gammas(None, heads), length, q.dtype, q.device)
    qh = round_to_tf32((q * dk**-0.5).transpose(1, 2))
    kh, vh = round_to_tf32(k.transpose(1, 2)), round_to_tf32(v.transpose(1, 2))
    scores = round_to_tf32((qh @ kh.transpose(-1, -2)) * mask)
    return (scores @ vh).transpose(1, 2)


@pytest.mark.parametrize("length", [16, 257])
def test_tf32_error_is_judged_by_the_tf32_axis(length: int) -> None:
    spec = registry.get("intree.retention_parallel")
    p = Problem(family="retention", length=length, dtype="float32", heads=2, dk=16, dv=16)
    on = run_case(spec, p.replace(tf32=True), kernel_fn=tf32_retention)
    off = run_case(spec, p.replace(tf32=False), kernel_fn=tf32_retention)
    assert on["unit_roundoff"] == 2.0**-11 and off["unit_roundoff"] == 2.0**-24
    assert on["verdict"] == "equivalent", on["why"]
    assert off["verdict"] == "divergent", off["why"]


def test_perturbed_output_is_judged_by_the_tf32_axis() -> None:
    p = Problem(family="retention", length=64, **SHAPES["retention"])
    trace = reference_trace(p, p.make_inputs())
    out = (trace.out * (1 + 1e-4)).to(torch.float32)  # a TF32-sized relative error
    assert judge(measure(out, trace, dtype="float32", length_axis=1, tf32=True)).verdict is Verdict.EQUIVALENT
    assert judge(measure(out, trace, dtype="float32", length_axis=1, tf32=False)).verdict is Verdict.DIVERGENT


@pytest.fixture
def keep_tf32_state():
    saved = tf32_state()
    yield saved
    restore_tf32_state(saved)
    assert tf32_state() == saved


@pytest.mark.parametrize("enabled", [True, False])
def test_tf32_settings_sets_and_restores(keep_tf32_state, enabled: bool) -> None:
    with tf32_settings(enabled):
        assert torch.backends.cuda.matmul.allow_tf32 is enabled
        assert torch.get_float32_matmul_precision() == ("high" if enabled else "highest")
        assert torch.backends.cudnn.allow_tf32 is enabled
    assert tf32_state() == keep_tf32_state


def test_tf32_settings_restores_after_an_exception(keep_tf32_state) -> None:
    with pytest.raises(ZeroDivisionError), tf32_settings(True):
        1 / 0
    assert tf32_state() == keep_tf32_state
    with pytest.raises(InvalidArgument):
        with tf32_settings("yes"):  # type: ignore[arg-type]
            pass


NEW_API_STARTS = {
    "matmul-tf32": lambda: setattr(torch.backends.cuda.matmul, "fp32_precision", "tf32"),
    "generic-tf32": lambda: setattr(torch.backends, "fp32_precision", "tf32"),
    "conv-ieee": lambda: setattr(torch.backends.cudnn.conv, "fp32_precision", "ieee"),
    "medium": lambda: torch.set_float32_matmul_precision("medium"),
}


@pytest.mark.parametrize("start", list(NEW_API_STARTS))
def test_tf32_settings_with_the_new_torch_api(keep_tf32_state, start: str) -> None:
    """A process that set TF32 through torch's per-backend ``fp32_precision`` (torch >= 2.9), where the
    legacy getters refuse to answer: inside the block every getter answers; afterwards the state is back."""
    if not hasattr(torch.backends, "fp32_precision"):
        pytest.skip(f"torch {torch.__version__} has no per-backend fp32_precision API")
    NEW_API_STARTS[start]()
    before = tf32_state()
    for enabled in (True, False):
        with tf32_settings(enabled):
            inside = tf32_state()
            assert inside["matmul.allow_tf32"] is enabled and inside["cudnn.allow_tf32"] is enabled
            assert inside["float32_matmul_precision"] == ("high" if enabled else "highest")
        assert tf32_state() == before


# -------------------------------------------------------------------------------- (c) determinism
def noisy_scan(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    out = blelloch_linear_scan(a, b)
    return out + 1e-3 * torch.rand(out.shape, dtype=out.dtype, device=out.device)


def failing_scan(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    raise RuntimeError("kernel exploded")


def spec_for(fn, name: str) -> KernelSpec:
    return KernelSpec(name=name, family="linear_scan", load=lambda: fn, source="user")


@pytest.mark.parametrize("device", DEVICES)
def test_deterministic_kernel_is_deterministic(device: str) -> None:
    spec = registry.get("intree.blelloch_scan")
    row = determinism_check(spec, Problem(family="linear_scan", length=257, device=device), repeats=3)
    assert row["kernel"] == "intree.blelloch_scan" and row["device"] == device
    assert row["deterministic"] is True
    assert row["max_run_to_run_diff"] == 0.0 and row["n_differing"] == 0 and row["outcome"] == "ok"


@pytest.mark.parametrize("device", DEVICES)
def test_noisy_kernel_is_caught(device: str) -> None:
    row = determinism_check(spec_for(noisy_scan, "user.noisy"), Problem(family="linear_scan", length=64, device=device))
    assert row["deterministic"] is False
    assert 0 < row["max_run_to_run_diff"] <= 1e-3 and row["n_differing"] > 0


def test_determinism_check_treats_nan_in_place_as_equal() -> None:
    row = determinism_check(spec_for(lambda a, b: torch.full_like(a, math.nan), "user.nan"),
                            Problem(family="linear_scan", length=8))
    assert row["deterministic"] is True and row["max_run_to_run_diff"] == 0.0


def test_determinism_check_reports_a_failing_kernel() -> None:
    row = determinism_check(spec_for(failing_scan, "user.failing"), Problem(family="linear_scan", length=8))
    assert row["deterministic"] is None and row["outcome"] == "raised"
    assert "call 1 of 2" in row["error"] and "kernel exploded" in row["error"]


def test_determinism_check_needs_two_calls() -> None:
    with pytest.raises(InvalidArgument, match="repeats=1"):
        determinism_check(registry.get("intree.blelloch_scan"), Problem(family="linear_scan", length=8), repeats=1)


def test_determinism_check_under_tf32(keep_tf32_state) -> None:
    seen = []

    def spy(q, k, v):
        seen.append(torch.get_float32_matmul_precision())
        return registry.get("intree.retention_parallel").callable()(q, k, v)

    spec = registry.get("intree.retention_parallel")
    row = determinism_check(spec, Problem(family="retention", length=16, tf32=True, **SHAPES["retention"]),
                            kernel_fn=spy)
    assert row["deterministic"] is True and seen == ["high", "high"]
    assert tf32_state() == keep_tf32_state


# ------------------------------------------------------------------------------------- (d) the sweep
def load_sweep_module():
    path = ROOT / "scripts" / "gpu_sweep.py"
    spec = importlib.util.spec_from_file_location("gpu_sweep", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.skipif(CUDA_REASON is None, reason="a GPU is present: the sweep would run, not skip")
def test_gpu_sweep_without_gpu_exits_0_with_the_reason(tmp_path: Path) -> None:
    out = tmp_path / "gpu"
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_sweep.py"), str(out)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"gpu_sweep: skipped: {CUDA_REASON}"
    assert not out.exists()


@pytest.mark.skipif(CUDA_REASON is None, reason="a GPU is present: the check would run the sweep")
def test_gpu_check_without_gpu_exits_0(tmp_path: Path) -> None:
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh"), str(tmp_path / "gpu")],
                          capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHON": sys.executable})
    assert proc.returncode == 0, proc.stderr
    assert "== torch / CUDA" in proc.stdout and f"torch {torch.__version__}" in proc.stdout
    assert proc.stdout.rstrip().endswith(f"gpu_sweep: skipped: {CUDA_REASON}")


def test_gpu_sweep_plan() -> None:
    sweep = load_sweep_module()
    specs = [registry.get(n) for n in ("intree.blelloch_scan", "intree.retention_chunkwise",
                                       "intree.blelloch_selective_scan")]
    cases = sweep.plan_cases(specs, device="cuda", lengths=(64, 257), tf32=True)
    assert [p.length for _, p in cases] == sorted(p.length for _, p in cases)  # shortest first
    assert all(p.device == "cuda" for _, p in cases)
    assert {(p.dtype, p.tf32) for _, p in cases} == set(sweep.DTYPE_SETTINGS)
    chunked = [p for s, p in cases if s.name == "intree.retention_chunkwise"]
    assert {p.chunk_size for p in chunked} == {16, 64} and {p.regime for p in chunked} == {"trained"}
    assert {p.regime for s, p in cases if s.name == "intree.blelloch_scan"} == {"trained", "unstable"}
    assert any(p.delta_softplus and p.has_D for s, p in cases if s.name == "intree.blelloch_selective_scan")
    without = sweep.plan_cases(specs, device="cuda", lengths=(64,), tf32=False)
    assert not any(p.tf32 for _, p in without)
    det = sweep.determinism_problems(cases)
    assert sorted(s.name for s, _ in det) == sorted(s.name for s in specs)
    assert all(p.dtype == "float32" and not p.tf32 and p.length == 257 for _, p in det)


def test_gpu_sweep_memoizes_the_oracle_and_restores_it() -> None:
    from harness import runner

    sweep = load_sweep_module()
    original = runner.reference_trace
    p = Problem(family="retention", length=16, dtype="float32", **SHAPES["retention"])
    with sweep.memoized_oracle() as stats:
        a = runner.reference_trace(p, p.make_inputs())
        b = runner.reference_trace(p.replace(tf32=True, chunk_size=4), p.make_inputs())
        c = runner.reference_trace(p.replace(dtype="bfloat16"), p.replace(dtype="bfloat16").make_inputs())
    assert a is b and c is not a and stats == {"hits": 1, "misses": 2}
    assert runner.reference_trace is original


@pytest.mark.parametrize("device", DEVICES)
def test_gpu_sweep_runs_end_to_end(tmp_path: Path, capsys, device: str) -> None:
    """The sweep on a tiny grid: on the CPU a rehearsal, on a GPU the real path (TF32 cases included)."""
    sweep = load_sweep_module()
    out = tmp_path / "run"
    rc = sweep.main([str(out), "--device", device, "--kernels", "intree.blelloch_scan,intree.retention_chunkwise",
                     "--lengths", "16,33", "--no-report"])
    text = capsys.readouterr().out
    assert rc == 0, text
    records = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]
    header = json.loads((out / "run.json").read_text())
    assert len(records) == header["cases_planned"] == header["cases_run"] and header["budget_exhausted"] is False
    assert {r["device"] for r in records} == {device}
    failing = [r["why"] for r in records if r["verdict"] != "equivalent"]
    assert not failing, failing
    assert {r["kernel"] for r in records} == {"intree.blelloch_scan", "intree.retention_chunkwise"}
    det = [json.loads(line) for line in (out / "determinism.jsonl").read_text().splitlines()]
    assert {r["kernel"] for r in det} == {r["kernel"] for r in records} and all(r["deterministic"] for r in det)
    assert text.index("## Determinism") < text.index("## Summary") and "| kernel" in text.split("## Summary")[1]


def test_gpu_sweep_stops_at_the_budget(tmp_path: Path, capsys) -> None:
    sweep = load_sweep_module()
    rc = sweep.main([str(tmp_path), "--device", "cpu", "--kernels", "intree.blelloch_scan", "--lengths", "8",
                     "--budget-s", "1e-6", "--no-report"])
    text = capsys.readouterr().out
    assert rc == 0
    assert "budget of 1e-06 s spent after 0 of" in text
    assert json.loads((tmp_path / "run.json").read_text())["budget_exhausted"] is True


# ------------------------------------------------------------------------- (e) the oracle stays on the CPU
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_oracle_runs_in_float64_on_the_cpu_for_cuda_problems(dtype: str) -> None:
    p = Problem(family="retention", length=16, dtype=dtype, device="cuda", **SHAPES["retention"])
    rounded = {k: v.to(p.torch_dtype) for k, v in p.float64_inputs().items()}  # rounded once, on the CPU
    trace = reference_trace(p, rounded)
    for name in ("out", "magnitude", "growth", "state_peak", "decay_peak"):
        t = getattr(trace, name)
        assert t.device.type == "cpu" and t.dtype == torch.float64, name
    cpu = p.replace(device="cpu")
    assert all(torch.equal(rounded[k], v) for k, v in cpu.make_inputs().items())
    assert torch.equal(trace.out, reference_trace(cpu, cpu.make_inputs()).out)


@pytest.mark.parametrize("device", DEVICES)
def test_oracle_reads_device_inputs_back_to_the_cpu(device: str) -> None:
    p = Problem(family="selective_scan", length=16, device=device, dtype="float16", **SHAPES["selective_scan"])
    inputs = p.make_inputs()
    assert all(v.device.type == device and v.dtype == torch.float16 for v in inputs.values())
    trace = reference_trace(p, inputs)
    assert trace.out.device.type == "cpu" and trace.out.dtype == torch.float64
    cpu = p.replace(device="cpu")
    assert torch.equal(trace.out, reference_trace(cpu, cpu.make_inputs()).out)


def test_gpu_sweep_file() -> None:
    """cases/sweeps/gpu.toml: every kernel is registered; without a GPU the sweep has no case at all."""
    from harness.cases import load_sweep

    sweep = load_sweep("gpu")
    assert sweep.description and sweep.groups and sweep.pairs
    names = {k for g in sweep.groups for k in g.kernels} | {k for pair in sweep.pairs for k in pair}
    for name in names:
        registry.get(name)
    assert all(g.fixed.get("device") == "cuda" for g in sweep.groups)
    if CUDA_REASON is not None:
        assert list(sweep.cases()) == [] and list(sweep.pair_cases()) == []
