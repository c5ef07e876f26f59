"""The two bug threads that started the project, reproduced with their expectations asserted.

Mamba (mamba.py: pscan vs selective_scan_seq, "inf in one and e32 in the other at L=512"): with the
seed's inputs (everything standard normal, so decay factors exp(delta*A) exceed 1) the float32 state
leaves the representable range: both the parallel and the sequential form are `out_of_domain` (the
inputs, not the scan), while a scan that returns NaN where the float64 oracle is finite and
representable is `divergent`. With `trained` inputs every form is equivalent.

RetNet (torchscale: chunkwise disagrees with parallel/recurrent after the second chunk; agree at
eps = 0): on the seed's input the forms are `divergent` through the norm's eps only (cause
`eps_effect`), equivalent at eps = 0, and the difference between the forms falls to rounding level.
"""

from __future__ import annotations

import pytest

from harness.kernels.contract import KernelSpec
from harness.kernels.registry import get
from harness.problems import Problem
from harness.runner import RunOptions, run_case, run_pair

MAMBA_FORMS = ("mambapy.selective_scan", "mambapy.selective_scan_seq", "intree.blelloch_selective_scan",
               "intree.sequential_selective_scan")


def _spec(name: str) -> KernelSpec:
    spec = get(name)
    reason = spec.unavailable_reason()
    if reason:
        pytest.skip(f"{name} unavailable here: {reason}")
    return spec


def mamba_seed_problem(length: int, regime: str = "unstable") -> Problem:
    return Problem("selective_scan", length, dtype="float32", regime=regime, batch=2, dim=64, state=16, seed=26)


@pytest.mark.parametrize("name", MAMBA_FORMS)
def test_mamba_seed_overflow_is_the_inputs_not_the_scan(name):
    spec = _spec(name)
    short = run_case(spec, mamba_seed_problem(64))
    assert short["verdict"] == "equivalent", short["why"]
    long = run_case(spec, mamba_seed_problem(512))
    assert long["verdict"] == "out_of_domain", long["why"]
    assert long["cause"] == "input_overflow"
    assert long["domain_onset_t"] is not None and 0 < long["domain_onset_t"] < 512


@pytest.mark.parametrize("name", MAMBA_FORMS)
def test_mamba_seed_trained_inputs_agree(name):
    record = run_case(_spec(name), mamba_seed_problem(512, regime="trained"))
    assert record["verdict"] == "equivalent", record["why"]
    assert record["cond_max"] < 1.0


def test_mamba_seed_nan_where_representable_is_a_kernel_bug():
    """A Blelloch scan that returns NaN before the state overflows is divergent, not out_of_domain."""
    from harness.kernels.blelloch import blelloch_selective_scan

    def nan_after_32(*args, **kwargs):
        y = blelloch_selective_scan(*args, **kwargs)
        y = y.clone()
        y[..., 32:40] = float("nan")
        return y

    spec = get("intree.blelloch_selective_scan")
    record = run_case(spec, mamba_seed_problem(512), kernel_fn=nan_after_32)
    assert record["verdict"] == "divergent", record["why"]
    assert record["first_nonfinite_t"] == 32


RETNET_SEED = dict(batch=3, length=16, heads=4, dk=4, dv=4, regime="ramp")


@pytest.mark.parametrize("name", ["torchscale.parallel", "torchscale.recurrent", "torchscale.chunkwise"])
@pytest.mark.parametrize("eps", [1e-5, 1e-6, 1e-8, 0.0])
def test_retnet_seed_eps_effect(name, eps):
    spec = _spec(name)
    chunk = 4 if spec.capabilities.takes_chunk else None
    record = run_case(spec, Problem("retention_normed", eps=eps, dtype="float32", chunk_size=chunk, **RETNET_SEED))
    if eps == 0.0:
        assert record["verdict"] == "equivalent", record["why"]
    else:
        assert record["verdict"] == "divergent", record["why"]
        assert record["cause"] == "eps_effect", record["why"]
        assert "eps outside the root" not in record["why"]  # torchscale's eps is inside, on a rescaled o


def retention_eps_outside_the_root(q, k, v, eps):
    """Retention normed as ``o / (sqrt(mean(o^2)) + eps)``: eps outside the root, against the convention."""
    o = get("intree.retention_parallel").callable()(q, k, v)
    return o / ((o * o).mean(-1, keepdim=True).sqrt() + eps)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_eps_outside_the_root_is_an_eps_effect_that_says_where_eps_went(dtype):
    """An eps effect is true of eps in the wrong place too, and the README's advice for torchscale's (declare
    ``eps_values=(0,)``) would hide that slip: the why says where the kernel put eps (a blind hunt's kernel,
    session 22: every dtype ``eps_effect``, nothing said eps was outside the root)."""
    from harness.api import user_kernel_spec

    spec = user_kernel_spec(retention_eps_outside_the_root, family="retention_normed")
    record = run_case(spec, Problem("retention_normed", eps=1e-5, dtype=dtype, **RETNET_SEED))
    assert record["verdict"] == "divergent" and record["cause"] == "eps_effect", record["why"]
    assert "eps outside the root" in record["why"] and "put eps inside the square root" in record["why"]


def test_retnet_seed_forms_agree_at_eps_zero_differential():
    """parallel vs chunkwise: far apart at eps > 0, at float32 rounding level at eps = 0."""
    a, b = _spec("torchscale.parallel"), _spec("torchscale.chunkwise")
    diffs = {}
    for eps in (1e-5, 1e-6, 1e-8, 0.0):
        rec = run_pair(a, b, Problem("retention_normed", eps=eps, dtype="float32", chunk_size=4, **RETNET_SEED),
                       RunOptions(eps_counterfactual=False))
        diffs[eps] = rec["ab_max_abs"]
    assert diffs[0.0] < 1e-6, diffs
    assert min(diffs[1e-5], diffs[1e-6], diffs[1e-8]) > 100 * diffs[0.0], diffs
    assert diffs[1e-5] > diffs[1e-8], diffs


def test_a_pair_row_replays_as_the_pair(capsys):
    """A differential sweep's row replayed kernel A alone against the oracle: the pair's own number, A against B,
    could not be had again from the report (a blind hunt, session 24). Its replay command names B now."""
    import shlex

    from harness.cli import EXIT_OK, EXIT_USAGE, main
    from harness.report import failure_table

    a, b = get("intree.retention_normed_parallel"), get("intree.retention_normed_chunkwise")
    problem = Problem("retention_normed", eps=1e-5, dtype="float32", chunk_size=4, **RETNET_SEED)
    record = run_pair(a, b, problem, RunOptions(eps_counterfactual=False))
    assert record["replay"].endswith(" --against intree.retention_normed_chunkwise"), record["replay"]
    assert failure_table([dict(record, verdict="divergent")])["ab_max_abs"][0] == record["ab_max_abs"]
    argv = shlex.split(record["replay"])
    assert argv[:2] == ["harness", "replay"]
    assert main(argv[1:]) == EXIT_OK
    printed = dict(line.strip().split(": ", 1) for line in capsys.readouterr().out.splitlines() if ": " in line)
    assert float(printed["ab_max_abs"]) == record["ab_max_abs"] > 0
    assert printed["kernel"] == "intree.retention_normed_parallel vs intree.retention_normed_chunkwise"
    assert (printed["a_verdict"], printed["b_verdict"]) == (record["a_verdict"], record["b_verdict"])
    assert main([*argv[1:], "--grad-of", "q"]) == EXIT_USAGE
    assert "--against='intree.retention_normed_chunkwise' with --grad-of='q'" in capsys.readouterr().err


def test_retnet_seed_float64_floor_is_declared():
    """torchscale's RMSNorm computes in float32: float64 inputs meet a float32 floor, declared and shown."""
    spec = _spec("torchscale.parallel")
    assert spec.capabilities.precision("float64") == "float32"
    record = run_case(spec, Problem("retention_normed", eps=0.0, dtype="float64", **RETNET_SEED))
    assert record["precision"] == "float32"
    assert record["verdict"] == "equivalent", record["why"]
    assert record["max_abs"] > 1e-10, "a float64-accurate result would not need the declaration"
    exact = run_case(get("intree.retention_normed_parallel"),
                     Problem("retention_normed", eps=0.0, dtype="float64", **RETNET_SEED))
    assert exact["max_abs"] < 1e-12


def test_seed_sweeps_load():
    from harness.cases import load_sweep

    for name in ("mamba_seed", "retnet_seed"):
        sweep = load_sweep(name)
        assert sweep.description and sweep.groups
        for group in sweep.groups:
            for kernel in group.kernels:
                get(kernel)  # every named kernel is registered
