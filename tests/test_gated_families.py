"""The gated families (simple_gla, gla, ssd) as the harness wires them: regimes, problem options (initial
state, final state, packed sequences), the final state as a second measured target, and the harness
catching the bug classes of these kernels (a final state taken one step early, state leaking across a
sequence boundary, an initial state not decayed) on small cases. The oracles themselves are tested in
the oracle tests; the in-tree chunked forms in their own tests."""

from __future__ import annotations

import pytest
import torch

from harness import families
from harness.errors import InvalidArgument
from harness.kernels import registry
from harness.kernels.sequential import sequential_gla, sequential_simple_gla, sequential_ssd
from harness.problems import Problem
from harness.runner import RunOptions, run_case

IN_PROCESS = RunOptions(isolation="in-process")
SEQUENTIAL = {"simple_gla": sequential_simple_gla, "gla": sequential_gla, "ssd": sequential_ssd}


def _problem(family: str, **kw) -> Problem:
    base = dict(family=family, length=11, heads=2, dk=3, dv=2, seed=5)
    if family == "ssd":
        base.update(groups=1, state=3)
    base.update(kw)
    return Problem(**base)


def test_the_new_fields_leave_the_keys_of_other_problems_unchanged():
    # keys computed before the gated families existed: records and saved cases of the other families still match
    assert Problem(family="linear_scan", length=8).key == "8f6d569c2d74"
    assert Problem(family="retention_normed", length=5, eps=1e-6, dtype="bfloat16").key == "5a56ac94f133"
    p = _problem("gla", has_initial_state=True, final_state=True, batch=1, cu_seqlens=(0, 4, 11))
    assert Problem.from_dict(p.to_dict()) == p and p.to_dict()["cu_seqlens"] == [0, 4, 11]


@pytest.mark.parametrize("family", ["simple_gla", "gla", "ssd"])
def test_regimes_give_log_decays_of_their_strength(family):
    fam = families.get(family)
    for regime in fam.regimes:
        x = _problem(family, regime=regime, length=64).float64_inputs()
        if family == "ssd":
            step = torch.nn.functional.softplus(x["dt"]) if _problem(family, regime=regime).delta_softplus else x["dt"]
            if regime == "negative_steps":  # a quarter of them, clamped to 0 by the kernels' dt_limit
                assert 0.1 < float((step < 0).double().mean()) < 0.4
            g = step.clamp(min=0.0) * x["A"]
        else:
            g = x["g"]
        assert bool((g <= 0).all()), regime
        if regime == "strong_decay":  # a 64-step chunk's cumulative sum leaves float32's exp range
            assert float(g.min()) < -20 and float(g.sum(1).min()) < -103
        if regime == "long_memory":
            assert float(g.min()) > -1e-2
    a, b = _problem(family).make_inputs(), _problem(family).make_inputs()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_problem_options_are_checked():
    with pytest.raises(InvalidArgument, match="batch=2 with cu_seqlens"):
        _problem("gla", batch=2, cu_seqlens=(0, 4, 11))
    with pytest.raises(InvalidArgument, match="cu_seqlens"):
        _problem("simple_gla", cu_seqlens=(0, 4, 10))
    with pytest.raises(InvalidArgument, match="final_state=True does not apply to family retention"):
        Problem(family="retention", length=4, final_state=True)
    with pytest.raises(InvalidArgument, match="groups=2 must be a positive divisor of heads=3"):
        _problem("ssd", heads=3, groups=2)


@pytest.mark.parametrize("family", ["simple_gla", "gla", "ssd"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_recurrent_baseline_is_equivalent_with_every_option(family, dtype):
    spec = registry.get(f"intree.sequential_{family}")
    p = _problem(family, dtype=dtype, regime="strong_decay", has_initial_state=True, final_state=True, batch=1,
                 cu_seqlens=(0, 4, 11))
    record = run_case(spec, p, IN_PROCESS)
    assert record["verdict"] == "equivalent" and record["final_state_verdict"] == "equivalent", record["why"]


def _spec(family):
    return registry.get(f"intree.sequential_{family}")


def test_a_final_state_one_step_early_is_divergent_through_the_second_target():
    def early(q, k, v, g, scale=None, initial_state=None, output_final_state=False, cu_seqlens=None):
        o, _ = sequential_simple_gla(q, k, v, g, scale, initial_state, False)
        _, s = sequential_simple_gla(q[:, :-1], k[:, :-1], v[:, :-1], g[:, :-1], scale, initial_state, True)
        return o, s

    p = _problem("simple_gla", final_state=True, dtype="float64")
    record = run_case(_spec("simple_gla"), p, IN_PROCESS, kernel_fn=early)
    assert record["verdict"] == "divergent" and record["why"].startswith("final state:"), record["why"]
    assert record["final_state_verdict"] == "divergent"
    # the output alone is right: without the final state asked for, the same kernel is equivalent
    assert run_case(_spec("simple_gla"), p.replace(final_state=False), IN_PROCESS, kernel_fn=early)["verdict"] \
        == "equivalent"


def test_a_missing_final_state_is_a_kernel_error():
    def forgets(q, k, v, g, scale=None, initial_state=None, output_final_state=False, cu_seqlens=None):
        return sequential_gla(q, k, v, g, scale, initial_state, False)

    record = run_case(_spec("gla"), _problem("gla", final_state=True), IN_PROCESS, kernel_fn=forgets)
    assert record["verdict"] == "kernel_error" and "no final state" in record["why"]
    assert record["cause"] == "not_a_tensor"  # a contract outcome, as for the output (before: "kernel_error")


def test_a_final_state_of_the_wrong_shape_is_a_wrong_shape():
    def head_first_state(q, k, v, g, scale=None, initial_state=None, output_final_state=False, cu_seqlens=None):
        o, state = sequential_gla(q, k, v, g, scale, initial_state, True)
        return o, state[:, :1]

    record = run_case(_spec("gla"), _problem("gla", final_state=True), IN_PROCESS, kernel_fn=head_first_state)
    assert record["verdict"] == "kernel_error" and record["cause"] == "wrong_shape", record["why"]
    assert "returned a final state of shape" in record["why"]


def test_state_leaking_across_a_sequence_boundary_is_divergent():
    def leaks(q, k, v, g, scale=None, initial_state=None, output_final_state=False, cu_seqlens=None):
        return sequential_gla(q, k, v, g, scale, None, output_final_state)  # ignores the boundaries

    p = _problem("gla", batch=1, cu_seqlens=(0, 3, 11), dtype="float64", regime="long_memory")
    assert run_case(_spec("gla"), p, IN_PROCESS, kernel_fn=leaks)["verdict"] == "divergent"

    def ssd_leaks(x, dt, A, B, C, chunk_size=None, seq_idx=None, **kw):
        return sequential_ssd(x, dt, A, B, C, chunk_size, **kw)

    p = _problem("ssd", batch=2, cu_seqlens=(0, 3, 11), dtype="float64", regime="long_memory")
    assert run_case(_spec("ssd"), p, IN_PROCESS, kernel_fn=ssd_leaks)["verdict"] == "divergent"


def test_an_initial_state_not_decayed_is_divergent():
    def undecayed(q, k, v, g, scale=None, initial_state=None, output_final_state=False, cu_seqlens=None):
        # the initial state added after the first step's decay instead of before it
        g0 = g.clone()
        g0[:, 0] = 0.0
        return sequential_simple_gla(q, k, v, g0, scale, initial_state, output_final_state, cu_seqlens) \
            if initial_state is not None else sequential_simple_gla(q, k, v, g, scale, None, output_final_state)

    p = _problem("simple_gla", has_initial_state=True, dtype="float64", regime="strong_decay")
    assert run_case(_spec("simple_gla"), p, IN_PROCESS, kernel_fn=undecayed)["verdict"] == "divergent"


def test_large_dt_turns_softplus_on_only_for_kernels_that_take_it():
    """An ssd kernel without the selective options (dt_bias, softplus, D, z) never gets dt_softplus."""
    import dataclasses

    from hypothesis import HealthCheck, given, settings

    from harness.strategies import problems

    plain = registry.get("intree.ssd_recurrent")
    bare = dataclasses.replace(plain, name="bare_ssd",
                               capabilities=dataclasses.replace(plain.capabilities, selective_options=False))
    seen = {True: 0, False: 0}

    @settings(max_examples=30, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(p=problems(bare, regimes=("large_dt",)), q=problems(plain, regimes=("large_dt",)))
    def draw(p, q):
        assert not p.delta_softplus, p
        seen[q.delta_softplus] += 1

    draw()
    assert seen[True] > 0  # the kernel that takes the flag does get softplus in large_dt


def test_a_sweep_runs_a_kernel_only_at_the_chunk_sizes_it_declares():
    """fla's fused_chunk forms its own chunks of 64: a sweep's chunk 16 or 128 cell is not its case."""
    import dataclasses

    from harness.cases import runnable

    spec = registry.get("intree.simple_gla_chunk")
    fixed = dataclasses.replace(spec, capabilities=dataclasses.replace(spec.capabilities, chunk_sizes=(64,)))
    assert runnable(fixed, _problem("simple_gla", length=70, chunk_size=64))
    assert not runnable(fixed, _problem("simple_gla", length=70, chunk_size=16))
    assert runnable(spec, _problem("simple_gla", length=70, chunk_size=16))


def test_a_kernel_that_takes_negative_steps_as_given_is_not_drawn_them():
    """mamba-ssm's PyTorch SSD references take a negative step as given, where its kernels clamp it to 0: they
    skip the ``negative_steps`` regime (`Capabilities.skip_regimes`); the in-tree forms, which clamp, are
    drawn it. A planted kernel without the clamp is found there (tests/planted/bugs.py)."""
    from hypothesis import given, settings

    from harness.cases import runnable
    from harness.kernels import registry
    from harness.strategies import problems

    def regimes(name: str) -> set[str]:
        seen: set[str] = set()

        # 300 draws: one regime of nine comes up in about 8% of them (measured), so 60 could miss it (a change of
        # the SSD draws made them miss it once)
        @settings(max_examples=300, derandomize=True, database=None, deadline=None)
        @given(problems(registry.get(name), profile="dev", explicit=False, dtypes=("float32",)))
        def collect(problem):
            seen.add(problem.regime)

        collect()
        return seen

    skipping = registry.get("mamba_ssm.ssd_minimal_discrete")
    assert "negative_steps" in skipping.capabilities.skip_regimes
    assert "negative_steps" in regimes("intree.ssd_chunk")
    assert "negative_steps" not in regimes("mamba_ssm.ssd_minimal_discrete")
    case = _problem("ssd", regime="negative_steps", chunk_size=4, length=12)
    assert runnable(registry.get("intree.ssd_chunk"), case) and not runnable(skipping, case)
    with pytest.raises(InvalidArgument, match="softplus makes every step positive"):
        _problem("ssd", regime="negative_steps", delta_softplus=True)


def test_a_failure_names_the_regime_of_its_case():
    """The regime is what a kernel author reads first to know which inputs broke the kernel: a negative step
    (`negative_steps`) says "clamp" where the shape and the numbers do not."""
    from harness.runner import RunOptions, run_case
    from harness.verdict import Judgement, Verdict, format_failure
    from tests.planted.bugs import by_name

    bug = by_name("ssd_negative_step_not_clamped")
    record = run_case(bug.spec, bug.witness, RunOptions(timeout_s=None))
    assert record["verdict"] == "divergent"
    message = format_failure(record, Judgement(Verdict.DIVERGENT, record["why"], record.get("rule")))
    assert "Case: dtype float64, regime negative_steps, shape" in message, message


def test_harness_list_says_which_regime_a_kernel_skips_and_why(capsys):
    from harness.cli import main

    assert main(["list", "--family", "ssd"]) == 0
    line = next(row for row in capsys.readouterr().out.splitlines() if "mamba_ssm.ssd_minimal_discrete" in row)
    assert "regime negative_steps: a negative step is used as given" in line


def test_a_kernel_that_needs_even_head_dims_is_drawn_only_those():
    """fla's chunk backward asserts even K and V in float16 and bfloat16 (`chunk_bwd_dv`); on a GPU its head dims are
    tl.dot sizes, but the interpreter takes any, and the ci gradient calibration's float16 and bfloat16 searches drew
    odd ones: 7 `kernel_error`s of fla.simple_gla.chunk's backward. A kernel declares the multiple
    (`Capabilities.head_dim_multiple`); every draw keeps it, and the sizes still vary."""
    from hypothesis import given, settings

    from harness.kernels.contract import Capabilities, KernelSpec
    from harness.kernels.sequential import sequential_simple_gla
    from harness.strategies import problems

    spec = KernelSpec(name="test.even_dims", family="simple_gla", load=lambda: sequential_simple_gla,
                      capabilities=Capabilities(head_dim_multiple=2), source="test")
    seen = set()

    @settings(max_examples=60, derandomize=True, database=None, deadline=None)
    @given(problems(spec, profile="ci", explicit=False))
    def collect(problem):
        seen.add((problem.dk, problem.dv))

    collect()
    assert all(dk % 2 == 0 and dv % 2 == 0 for dk, dv in seen), sorted(seen)
    assert len({d for pair in seen for d in pair}) >= 4, sorted(seen)
    with pytest.raises(InvalidArgument, match="head_dim_multiple=0"):
        Capabilities(head_dim_multiple=0)
    # a case drawn for another kernel (the calibration's, a saved one) is fitted to it, or not run on it
    from harness.cases import runnable

    odd = _problem("simple_gla", dk=5, dv=1)
    assert not runnable(spec, odd) and runnable(spec, odd.replace(dk=4, dv=2))
    assert [spec.capabilities.fit_head_dim(d) for d in (1, 2, 5, 33)] == [2, 2, 4, 32]
    fla_chunk = {s.name: s for s in registry.all_kernels("simple_gla")}.get("fla.simple_gla.chunk")
    if fla_chunk is not None and fla_chunk.capabilities.head_dims is None:  # fla registered, interpreted here
        assert fla_chunk.capabilities.head_dim_multiple == 2
