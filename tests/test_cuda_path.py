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
    device_health,
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

pytestmark = pytest.mark.e2e  # end to end: `make test-all`

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
    "simple_gla": {"batch": 1, "heads": 2, "dk": 8, "dv": 8},
    "gla": {"batch": 1, "heads": 2, "dk": 8, "dv": 8},
    "ssd": {"batch": 1, "heads": 2, "groups": 1, "dv": 8, "state": 8},
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
    assert f"gpu_sweep: skipped: {CUDA_REASON}\n== gpu_check: exit status 0" in proc.stdout


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


def test_gpu_sweep_shares_the_oracle_through_the_runner_not_a_monkeypatch() -> None:
    """The sweep's oracle cache travels in RunOptions (harness.oracle_cache); the runner is left as it is."""
    from harness import runner
    from harness.kernels.registry import get
    from harness.runner import RunOptions, run_case

    sweep = load_sweep_module()
    original = (runner.reference_trace, runner.baseline_output)
    cache = sweep.oracle_cache()
    p = Problem(family="retention", length=16, dtype="float32", **SHAPES["retention"])
    a = cache.traces(p, p.make_inputs(), runner.RETNET)
    b = cache.traces(p.replace(tf32=True), p.make_inputs(), runner.RETNET)  # chunk_size stays in the key (gated bounds)
    c = cache.traces(p.replace(dtype="bfloat16"), p.replace(dtype="bfloat16").make_inputs(), runner.RETNET)
    assert a is b and c is not a and cache.stats == {"hits": 1, "misses": 2}
    spec = get("intree.retention_recurrent")
    options = RunOptions(oracle_cache=cache, isolation="in-process")
    first, again = run_case(spec, p, options), run_case(spec, p, options)
    assert first["verdict"] == again["verdict"] == "equivalent"
    assert cache.stats == {"hits": 4, "misses": 3}  # the trace reused twice, the baseline computed once
    assert (runner.reference_trace, runner.baseline_output) == original


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
    header = json.loads((tmp_path / "run.json").read_text())
    assert header["budget_exhausted"] is True and header["budget_s"] == 1e-6
    assert header["cases_run"] == 0 and header["cases_not_run"] > 0, header
    assert "budget of " in text and f"spent after 0 of {header['cases_not_run']} cases" in text, text


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
    """harness/sweeps/gpu.toml: every kernel is registered; without a GPU the sweep has no case at all."""
    from harness.cases import load_sweep

    sweep = load_sweep("gpu")
    assert sweep.description and sweep.groups and sweep.pairs
    names = {k for g in sweep.groups for k in g.kernels} | {k for pair in sweep.pairs for k in pair}
    for name in names:
        registry.get(name)
    assert all(g.fixed.get("device") == "cuda" for g in sweep.groups)
    if CUDA_REASON is not None:
        assert list(sweep.cases()) == [] and list(sweep.pair_cases()) == []


# ------------------------------------------------------- (f) the first GPU window (issue 20), rehearsed on the CPU
BUNDLE = ROOT / ".device-bundle"
DRY_RUN_LIMIT_S = 240  # the dry run's outer limit; it takes ~26 s on two idle cores (session 10), ~45 s under load


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory) -> dict:
    """`make test-gpu-dry`'s command, run once: gpu_check.sh end to end on the CPU, from another directory,
    with no PYTHONPATH of ours (the script must set it: defect 1)."""
    out = tmp_path_factory.mktemp("gpu-dry") / "run"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "TRITON_INTERPRET")}
    env.update(PYTHON=sys.executable, GPU_CHECK_TOTAL_S=str(DRY_RUN_LIMIT_S), FINISH_S="20", CASE_MARGIN_S="10",
               DEVICE_BUNDLE=str(BUNDLE), PYTHONDONTWRITEBYTECODE="1")  # as on CI runners and this machine
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh"), str(out), "--device", "cpu", "--dry-run"],
                          capture_output=True, text=True, timeout=DRY_RUN_LIMIT_S + 30, env=env,
                          cwd=str(out.parent))
    return {"proc": proc, "out": out, "header": json.loads((out / "run.json").read_text())
            if (out / "run.json").is_file() else {}}


def test_dry_run_end_to_end(dry_run: dict) -> None:
    """Defect 1: the script runs from the checkout (not an installed harness), and the whole GPU path,
    loading, determinism, warm-up, grid, report and summary, goes through on the CPU."""
    proc, out, header = dry_run["proc"], dry_run["out"], dry_run["header"]
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert header["harness_path"] == str(ROOT / "harness")  # this checkout's harness, whatever is installed
    # no byte code written: no cache prefix, which would only hide the installed caches (every process of the
    # run compiled torch from source: 60 s for this run instead of 26 s)
    assert header["pycache_prefix"] is None and not header["writes_bytecode"]
    records = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]
    assert len(records) == header["cases_planned"] == header["cases_run"] > 0
    assert {r["device"] for r in records} == {"cpu"}
    assert not [r["why"] for r in records if r["verdict"] not in ("equivalent", "out_of_domain")]
    assert header["warmups"] > 0 and (out / "warmup.jsonl").read_text().strip()
    assert (out / "index.md").is_file() and (out / "gpu_summary.md").is_file()
    text = proc.stdout
    assert text.index("## Determinism") < text.index("## TF32") < text.index("## Summary (cpu)")
    assert "complete:" in text and "== gpu_check: exit status 0" in text


def test_dry_run_imports_every_package_from_the_bundle(dry_run: dict) -> None:
    """The bundle `make device-bundle` builds is what the GPU machine will import: every package from it,
    and mamba-ssm's Triton kernel importable without its CUDA extension (only CUDA is missing here)."""
    if not (BUNDLE / "MANIFEST.json").is_file():
        pytest.skip(f"no device bundle at {BUNDLE}: `make device-bundle` (needs PyPI) was not run or failed")
    header = dry_run["header"]
    assert dry_run["proc"].returncode == 0, dry_run["proc"].stdout[-3000:]
    for name, where in header["packages"].items():
        assert where and where.startswith(str(BUNDLE)), (name, where)
    left_out = header["kernels_left_out"]
    # mamba-ssm's Triton kernels need no CUDA extension: here they run from the bundle under the interpreter
    assert "mamba_ssm.selective_state_update" not in left_out, left_out.get("mamba_ssm.selective_state_update")
    assert "without its CUDA extension 'selective_scan_cuda'" in left_out["mamba_ssm.selective_scan_fn"]
    ran = set(header["kernels"])
    assert {"mambapy.pscan", "torchscale.recurrent", "yar.chunkwise", "accelerated_scan.ref",
            "fla.fused_recurrent_retention"} <= ran


# defect 2: a load that raises anything (a failed nvcc build) makes the kernel unavailable, never the run fail
def _raising_load(exc: BaseException):
    def load():
        raise exc
    return load


@pytest.mark.parametrize("exc", [RuntimeError("Error building extension 'warpscan': nvcc exited with 1"),
                                 OSError("CUDA_HOME environment variable is not set")], ids=["runtime", "oserror"])
def test_a_load_that_raises_makes_the_kernel_unavailable(exc: BaseException) -> None:
    from harness.errors import KernelUnavailable

    spec = KernelSpec(name=f"user.bad_load_{type(exc).__name__}", family="linear_scan", load=_raising_load(exc),
                      source="user")
    reason = spec.unavailable_reason()
    assert reason == f"loading failed: {type(exc).__name__}: {exc}"
    with pytest.raises(KernelUnavailable, match="loading failed"):
        spec.callable()


def test_a_package_kernel_that_fails_to_load_names_the_installed_version() -> None:
    # a package's published versions differ: fla-core 0.5.x raises at import under triton 3.9, 0.6.0 loads
    from importlib import metadata

    spec = KernelSpec(name="pytest.bad_load", family="linear_scan", load=_raising_load(ValueError("key BT")),
                      source="pytest")
    assert spec.unavailable_reason() == f"loading failed with pytest {metadata.version('pytest')}: ValueError: key BT"


def test_sweep_leaves_out_a_kernel_whose_load_raises_or_hangs(monkeypatch) -> None:
    import threading

    sweep = load_sweep_module()
    release = threading.Event()

    def hanging_load():
        release.wait(30)
        return blelloch_linear_scan

    bad = KernelSpec(name="user.nvcc_fails", family="linear_scan",
                     load=_raising_load(RuntimeError("Ninja is required to load C++ extensions")), source="user")
    slow = KernelSpec(name="user.nvcc_builds", family="linear_scan", load=hanging_load, source="user")
    good = registry.get("intree.blelloch_scan")
    monkeypatch.setattr(registry, "all_kernels", lambda family=None: [bad, slow, good])
    try:
        chosen, left_out = sweep.select_kernels("cpu", (), load_timeout_s=0.5)
    finally:
        release.set()
    assert [s.name for s in chosen] == ["intree.blelloch_scan"]
    reasons = dict(left_out)
    failed = reasons["user.nvcc_fails"]
    assert failed.startswith("loading failed") and "RuntimeError" in failed, failed
    assert "Ninja is required to load C++ extensions" in failed, failed  # the exception's own words, as raised
    assert reasons["user.nvcc_builds"].startswith("loading did not finish within 0.5 s")


# defect 3: mamba-ssm's selective_state_update with its own argument handling
def strict_selective_state_update(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False):
    """A stand-in for mamba-ssm 2.x's ``selective_state_update``: its launch-argument handling (which
    raises TypeError for ``D=None`` or ``dt_bias=None``: ``*(...) if x is not None else 0`` unpacks 0),
    then one step of the recurrence in float64. 3-D and multi-head forms; updates ``state`` in place."""
    heads = state.dim() > 3

    def launch(*strides):  # what mamba-ssm hands its Triton kernel
        return strides

    if not heads:
        state4, x, dt, A, B, C = state.unsqueeze(1), x.unsqueeze(1), dt.unsqueeze(1), A.unsqueeze(0), \
            B.unsqueeze(1), C.unsqueeze(1)
        D = None if D is None else D.unsqueeze(0)
        z = None if z is None else z.unsqueeze(1)
        dt_bias = None if dt_bias is None else dt_bias.unsqueeze(0)
    else:
        state4 = state
    launch(*(dt_bias.stride(0), dt_bias.stride(1)) if dt_bias is not None else 0,
           *(D.stride(0), D.stride(1)) if D is not None else 0)
    nheads, ngroups = state4.shape[1], B.shape[1]
    dt = dt.double() + dt_bias.double()
    dt = torch.nn.functional.softplus(dt) if dt_softplus else dt
    B = B.double().repeat_interleave(nheads // ngroups, dim=1)
    C = C.double().repeat_interleave(nheads // ngroups, dim=1)
    new = state4.double() * torch.exp(dt[..., None] * A.double()) + dt[..., None] * B[:, :, None] * x.double()[..., None]
    state4.copy_(new)
    out = (new * C[:, :, None]).sum(-1) + x.double() * D.double()
    if z is not None:
        out = out * torch.nn.functional.silu(z.double())
    out = out.to(x.dtype)
    return out if heads else out.squeeze(1)


def test_strict_state_update_reproduces_the_mamba_ssm_type_error() -> None:
    state, x = torch.zeros(1, 2, 3), torch.ones(1, 2)
    with pytest.raises(TypeError, match="after \\* must be an iterable"):
        strict_selective_state_update(state, x, x, -torch.ones(2, 3), torch.ones(1, 3), torch.ones(1, 3))


@pytest.mark.parametrize("options", [{}, {"has_D": True}, {"has_delta_bias": True, "delta_softplus": True},
                                     {"has_D": True, "has_z": True, "has_delta_bias": True, "delta_softplus": True}],
                         ids=["bare", "D", "bias", "mamba"])
@pytest.mark.parametrize("groups", [1, 2], ids=["3d", "grouped"])
def test_state_update_adapter_passes_what_mamba_ssm_accepts(options: dict, groups: int) -> None:
    from harness.kernels.mamba_ssm_adapter import state_update_scan

    spec = registry.get("mamba_ssm.selective_state_update")
    p = Problem(family="selective_scan", length=12, batch=2, dim=4, state=3, groups=groups, dtype="float32", **options)
    rec = run_case(spec, p, kernel_fn=state_update_scan(strict_selective_state_update))
    assert rec["outcome"] == "ok", rec["error"]
    assert rec["verdict"] == "equivalent", rec["why"]


def test_mamba_ssm_triton_kernel_imports_without_the_package_init(tmp_path: Path, monkeypatch) -> None:
    """A mamba-ssm built without its CUDA extension: the package's __init__ cannot import, its Triton module
    can, through `import_skipping_init`; selective_scan_fn says the extension is missing; nothing is left
    in sys.modules to answer a later plain import."""
    from harness.errors import KernelUnavailable
    from harness.kernels import mamba_ssm_adapter

    pkg = tmp_path / "mamba_ssm"
    (pkg / "ops" / "triton").mkdir(parents=True)
    (pkg / "__init__.py").write_text("import selective_scan_cuda\n")
    (pkg / "ops" / "__init__.py").write_text("")
    (pkg / "ops" / "triton" / "__init__.py").write_text("")
    (pkg / "ops" / "triton" / "softplus.py").write_text("def softplus(x):\n    return x\n")
    (pkg / "ops" / "triton" / "selective_state_update.py").write_text(
        "from mamba_ssm.ops.triton.softplus import softplus\n"
        "def selective_state_update(*args, **kwargs):\n    return 'stepped'\n")
    (pkg / "ops" / "selective_scan_interface.py").write_text("import selective_scan_cuda\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(mamba_ssm_adapter, "require_cuda", lambda: None)
    for name in [name for name in sys.modules if name.startswith("mamba_ssm")]:  # a real one imported earlier
        monkeypatch.delitem(sys.modules, name)
    with pytest.raises(ImportError):
        importlib.import_module("mamba_ssm.ops.triton.selective_state_update")
    module = mamba_ssm_adapter._import("mamba_ssm.ops.triton.selective_state_update")
    assert module.selective_state_update() == "stepped" and module.softplus(3) == 3
    assert not [name for name in sys.modules if name.startswith("mamba_ssm")]
    with pytest.raises(KernelUnavailable, match="without its CUDA extension 'selective_scan_cuda'"):
        mamba_ssm_adapter._load_selective_scan_fn()


# defects 5 and 8: the kernel runs on its inputs' device and finishes inside the guarded call
class FakeCuda:
    """torch.cuda.device / synchronize stand-ins that record what a CPU-only machine cannot show."""

    def __init__(self, sync_s: float = 0.0, sync_error: str | None = None):
        self.current, self.events, self.sync_s, self.sync_error = 0, [], sync_s, sync_error

    def device(self, device):
        fake = self

        class Ctx:
            def __enter__(self):
                self.saved, fake.current = fake.current, torch.device(device).index
                fake.events.append(("enter", fake.current))

            def __exit__(self, *exc):
                fake.current = self.saved

        return Ctx()

    def synchronize(self, device=None):
        import time

        self.events.append(("synchronize", torch.device(device).index))
        time.sleep(self.sync_s)
        if self.sync_error:
            raise RuntimeError(self.sync_error)


@pytest.fixture
def fake_cuda(monkeypatch):
    from harness.kernels import contract

    def install(**kwargs) -> FakeCuda:
        fake = FakeCuda(**kwargs)
        monkeypatch.setattr(torch.cuda, "device", fake.device)
        monkeypatch.setattr(torch.cuda, "synchronize", fake.synchronize)
        monkeypatch.setattr(contract, "kernel_device", lambda args, kwargs: torch.device("cuda", 1))
        return fake

    return install


def test_on_device_sets_the_inputs_device_and_synchronizes(fake_cuda) -> None:
    from harness.kernels.contract import on_device

    fake = fake_cuda()
    seen = []

    def kernel(a, b):
        seen.append(fake.current)
        fake.events.append(("kernel", fake.current))
        return a + b

    wrapped = on_device(kernel)
    out = wrapped(torch.ones(2), torch.ones(2))
    assert torch.equal(out, torch.full((2,), 2.0)) and seen == [1]
    assert fake.events == [("enter", 1), ("kernel", 1), ("synchronize", 1)] and fake.current == 0
    assert on_device(wrapped) is wrapped and wrapped.__name__ == "kernel"
    assert registry.get("intree.blelloch_scan").callable().harness_on_device is True


def test_a_hang_on_the_device_times_out_inside_the_guarded_call(fake_cuda) -> None:
    from harness.kernels.contract import on_device
    from harness.kernels.guard import Outcome, call_guarded

    fake_cuda(sync_s=3.0)  # the launch returns at once; the kernel never finishes
    a = torch.ones(1, 2, 4)
    result = call_guarded(on_device(blelloch_linear_scan), (a, a), {}, expected_shape=(1, 2, 4),
                          expected_dtype=torch.float32, expected_device="cpu", timeout_s=0.5)
    assert result.outcome is Outcome.TIMEOUT


def test_guarded_time_includes_the_device_work(fake_cuda) -> None:
    from harness.kernels.contract import on_device
    from harness.kernels.guard import call_guarded

    fake_cuda(sync_s=0.3)
    a = torch.ones(1, 2, 4)
    result = call_guarded(on_device(blelloch_linear_scan), (a, a), {}, expected_shape=(1, 2, 4),
                          expected_dtype=torch.float32, expected_device="cpu", timeout_s=10)
    assert result.ok and result.seconds >= 0.3


def test_an_asynchronous_cuda_error_is_the_kernels_and_is_sticky(fake_cuda) -> None:
    from harness.gpu import is_sticky_error
    from harness.kernels.contract import on_device
    from harness.kernels.guard import Outcome, call_guarded

    fake_cuda(sync_error="CUDA error: an illegal memory access was encountered")
    a = torch.ones(1, 2, 4)
    result = call_guarded(on_device(blelloch_linear_scan), (a, a), {}, expected_shape=(1, 2, 4),
                          expected_dtype=torch.float32, expected_device="cpu", timeout_s=10)
    assert result.outcome is Outcome.RAISED and "illegal memory access" in result.message
    assert is_sticky_error(result.message)
    assert not is_sticky_error("CUDA out of memory. Tried to allocate 2.00 GiB") and not is_sticky_error(None)


def test_device_health() -> None:
    assert device_health("cpu") is None
    if CUDA_REASON is None:
        assert device_health("cuda") is None
    else:
        reason = device_health("cuda", timeout_s=10)
        assert reason and reason.startswith("cuda fails a 4-element add")


def _planted_specs(**kernels) -> list[KernelSpec]:
    return [KernelSpec(name=f"planted.{name}", family="linear_scan", load=(lambda fn=fn: fn), source=f"pkg_{name}")
            for name, fn in kernels.items()]


def test_sweep_stops_on_the_first_sticky_cuda_error(tmp_path: Path, capsys, monkeypatch) -> None:
    sweep = load_sweep_module()
    calls = []

    def poisoned(a, b):
        calls.append(a.shape)
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    specs = [registry.get("intree.blelloch_scan"), *_planted_specs(poisoned=poisoned)]
    monkeypatch.setattr(sweep, "select_kernels", lambda *a, **k: (specs, []))
    out = tmp_path / "run"
    rc = sweep.main([str(out), "--device", "cpu", "--lengths", "16,33", "--no-report"])
    text = capsys.readouterr().out
    header = json.loads((out / "run.json").read_text())
    assert rc == sweep.EXIT_STOPPED
    assert header["stopped"]["kernel"] == "planted.poisoned" and "illegal memory access" in header["stopped"]["error"]
    assert len(calls) == 1  # nothing ran after the first failure
    assert header["cases_run"] < header["cases_planned"]
    summary = (out / "gpu_summary.md").read_text()
    assert "STOPPED after planted.poisoned" in summary and "illegal memory access" in summary
    assert text.rstrip().splitlines()[-1].startswith("status: STOPPED")


def test_warm_up_keeps_first_call_compilation_out_of_the_timed_call(tmp_path: Path, capsys, monkeypatch) -> None:
    """Defect 6: a kernel whose first call at each shape takes 2 s (a Triton compile and autotune) against a
    1 s call timeout: every timed case is ok because an untimed warm-up call came first."""
    import time

    sweep = load_sweep_module()
    seen: set = set()

    def compiles_per_shape(a, b):
        if a.shape not in seen:
            seen.add(a.shape)
            time.sleep(2.0)
        return blelloch_linear_scan(a, b)

    monkeypatch.setattr(sweep, "select_kernels", lambda *a, **k: (_planted_specs(autotuned=compiles_per_shape), []))
    out = tmp_path / "run"
    rc = sweep.main([str(out), "--device", "cpu", "--lengths", "16,33", "--timeout-s", "1", "--no-report"])
    capsys.readouterr()
    assert rc == 0
    records = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]
    assert records and all(r["outcome"] == "ok" for r in records), [r["error"] for r in records]
    assert max(r["t_kernel"] for r in records) < 1.0
    warmups = [json.loads(line) for line in (out / "warmup.jsonl").read_text().splitlines()]
    assert max(w["seconds"] for w in warmups) >= 2.0


def test_a_warm_up_that_times_out_skips_the_rest_of_its_package(tmp_path: Path, capsys, monkeypatch) -> None:
    """Defect 6: a warm-up still running after its timeout leaves its thread in the package; no case of
    that package is timed beside it, and other packages go on."""
    import threading

    sweep = load_sweep_module()
    release = threading.Event()

    def never_done(a, b):
        release.wait(30)
        return blelloch_linear_scan(a, b)

    specs = [registry.get("intree.blelloch_scan"), *_planted_specs(stuck=never_done)]
    monkeypatch.setattr(sweep, "select_kernels", lambda *a, **k: (specs, []))
    out = tmp_path / "run"
    try:
        rc = sweep.main([str(out), "--device", "cpu", "--lengths", "16", "--warmup-timeout-s", "0.5",
                         "--determinism-budget-s", "0.001", "--no-report"])
    finally:
        release.set()
    capsys.readouterr()
    header = json.loads((out / "run.json").read_text())
    records = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]
    stuck = [r for r in records if r["kernel"] == "planted.stuck"]
    assert len(stuck) == 1 and stuck[0]["outcome"] == "timeout" and "warm-up" in stuck[0]["why"]
    assert header["not_run_by_kernel"]["planted.stuck"] > 0 and "pkg_stuck" in header["skipped_packages"]
    assert "budget" in header["determinism_not_checked"]["planted.stuck"]  # that phase had 1 ms
    assert {r["verdict"] for r in records if r["kernel"] == "intree.blelloch_scan"} == {"equivalent"}
    assert rc == 0


# defect 7: the TF32 axis only for kernels that compute with matmuls
def test_tf32_is_planned_only_for_kernels_with_matmuls() -> None:
    from harness.kernels.contract import Capabilities

    sweep = load_sweep_module()
    matmul_scan = KernelSpec(name="user.matmul_scan", family="linear_scan", load=lambda: blelloch_linear_scan,
                             capabilities=Capabilities(matmuls=True), source="user")
    specs = [registry.get(n) for n in ("intree.blelloch_scan", "intree.blelloch_selective_scan",
                                       "intree.retention_parallel")] + [matmul_scan]
    cases = sweep.plan_cases(specs, device="cuda", lengths=(64,), tf32=True)
    with_tf32 = {s.name for s, p in cases if p.tf32}
    assert with_tf32 == {"intree.retention_parallel", "user.matmul_scan"}
    assert not registry.get("mamba_ssm.selective_state_update").uses_matmuls
    assert registry.get("intree.retention_chunkwise").uses_matmuls


def test_finish_reports_a_killed_sweep_from_its_records(tmp_path: Path, capsys) -> None:
    """What gpu_check.sh runs after the outer limit killed the sweep: report and summary from the files."""
    sweep = load_sweep_module()
    out = tmp_path / "run"
    assert sweep.main([str(out), "--device", "cpu", "--kernels", "intree.blelloch_scan", "--lengths", "8",
                       "--no-report"]) == 0
    header = json.loads((out / "run.json").read_text())
    for key in ("cases_run", "stopped", "cut_short"):  # as a kill leaves it: the header of the start only
        header.pop(key)
    (out / "run.json").write_text(json.dumps(header))
    capsys.readouterr()
    rc = sweep.main([str(out), "--finish", "--cut-short", "the outer time limit"])
    text = capsys.readouterr().out
    assert rc == 0
    assert "CUT SHORT: the outer time limit" in (out / "gpu_summary.md").read_text()
    assert (out / "index.md").is_file() and "## Summary (cpu)" in text
    assert json.loads((out / "run.json").read_text())["cases_recorded"] == header["cases_planned"]


def test_on_device_pickles_when_the_kernel_does() -> None:
    """A worker process may be handed the wrapped kernel by value: wrapping must not make it unpicklable."""
    import pickle

    from harness.kernels.contract import on_device

    wrapped = pickle.loads(pickle.dumps(on_device(blelloch_linear_scan)))
    a = torch.rand(1, 2, 5)
    assert torch.equal(wrapped(a, a), blelloch_linear_scan(a, a)) and wrapped.harness_on_device


def test_gpu_check_cut_short_by_its_outer_limit_still_reports(tmp_path: Path) -> None:
    """The outer limit stops a sweep that would run past it (SIGTERM): it stops between cases, and the
    summary is printed and the report written. (A sweep stuck in one call gets SIGKILL and the finish
    pass instead: `test_finish_reports_a_killed_sweep_from_its_records`.)"""
    out = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "TRITON_INTERPRET")}
    # 30 s: the script keeps 2 x FINISH_S and needs 5 s of sweep after its preamble (environment, imports),
    # which took 4 s on a busy machine (at 20 s the script then refused to start the sweep at all)
    env.update(PYTHON=sys.executable, GPU_CHECK_TOTAL_S="30", FINISH_S="6", CASE_MARGIN_S="0",
               DEVICE_BUNDLE=str(tmp_path / "no-bundle"))
    # thousands of short cases, and --budget-s after the script's own (it wins): only the outer limit ends it
    lengths = ",".join(str(n) for n in range(8, 4000))  # far more than 30 s of cases even on an idle machine
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh"), str(out), "--device", "cpu",
                           "--kernels", "intree.blelloch_scan,intree.sequential_scan", "--lengths", lengths,
                           "--budget-s", "1000", "--no-report"],
                          capture_output=True, text=True, timeout=90, env=env)
    text = proc.stdout
    assert "cut short: signal 15" in text, text[-3000:] + proc.stderr[-2000:]
    header = json.loads((out / "run.json").read_text())
    assert header["cut_short"].startswith("signal 15") and 0 < header["cases_run"] < header["cases_planned"]
    assert "CUT SHORT" in (out / "gpu_summary.md").read_text()
    assert "## Summary (cpu)" in text.split("cut short: signal 15")[1]
    assert proc.returncode == 0 and "== cut short by" not in text  # no finish pass was needed


#: What the GPU machine has besides the standard library (issue 20); their dependencies are found from
#: the installed metadata here.
GPU_MACHINE_DISTRIBUTIONS = ("torch", "triton", "numpy", "pandas", "tabulate", "hypothesis", "pytest", "numba",
                             "matplotlib", "einops")
#: Imported here only because they are installed here (each import is inside a try in its importer).
OPTIONAL_HERE = {
    "scipy": "numba, when present", "yaml": "numba, when present", "cffi": "numba's cffi support, when present",
    "pycparser": "cffi's", "charset_normalizer": "numpy.f2py, when present", "certifi": "a .pth at start-up",
}


def _requirement_closure(names) -> set[str]:
    import importlib.metadata as md
    import re

    def norm(name: str) -> str:
        return re.sub(r"[-_.]+", "-", name).lower()

    seen, todo = set(), [norm(n) for n in names]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        try:
            requires = md.requires(name) or []
        except md.PackageNotFoundError:
            continue
        for req in requires:
            if "extra ==" in req:
                continue
            todo.append(norm(re.split(r"[\s;<>=!~\[(]", req, maxsplit=1)[0]))
    return seen


def test_dry_run_imports_nothing_the_gpu_machine_lacks(dry_run: dict) -> None:
    """Every non-standard module the rehearsal imported comes from this checkout, the bundle, or a
    distribution the GPU machine has (or one of their dependencies)."""
    import importlib.metadata as md
    import re

    header = dry_run["header"]
    assert dry_run["proc"].returncode == 0, dry_run["proc"].stdout[-3000:]
    allowed = _requirement_closure(GPU_MACHINE_DISTRIBUTIONS)
    owners = md.packages_distributions()
    foreign = {}
    for module, where in header["imported_modules"].items():
        if where.startswith((str(ROOT / "harness"), str(ROOT / "reference_impls"), str(BUNDLE))):
            continue
        if module in OPTIONAL_HERE or module.endswith("__mypyc"):  # (mypyc: charset_normalizer's compiled part)
            continue
        dists = {re.sub(r"[-_.]+", "-", d).lower() for d in owners.get(module, [])}
        if not dists & allowed:
            foreign[module] = (where, sorted(dists))
    if not (BUNDLE / "MANIFEST.json").is_file():  # the third-party packages then come from this machine
        bundled = {"mambapy", "torchscale", "yet_another_retnet", "accelerated_scan", "fla", "mamba_ssm"}
        foreign = {k: v for k, v in foreign.items() if k not in bundled}
    assert not foreign, f"imported here but absent on the GPU machine: {foreign}"
