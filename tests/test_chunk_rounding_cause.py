"""A chunk kernel that does not say it chunks is told so (`harness.runner._chunked_bound`).

A chunk form's decays are exp of differences of cumulative sums, which loses ``u`` times the within-chunk
log-decay mass; the bound carries that term only for a kernel whose chunk size the harness knows. The
in-tree simple GLA chunk form with its block fixed inside (as fla's ``chunk_simple_gla`` named directly,
or a user's Triton kernel with ``BT = 64``) was ``kernel_bug`` on 24 of 24 strong- and uniform-decay
cases at L = 40 and 130 (float32 and float64, seeds 1-3; cond 1.0 to 45), and is within the chunked
bound on every one (cond 0.02 to 0.19).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from harness.api import user_kernel_spec
from harness.kernels import registry
from harness.kernels.contract import KernelSpec
from harness.problems import Problem
from harness.runner import CHUNK_COUNTERFACTUAL, RunOptions, run_case

_CHUNK = registry.get("intree.simple_gla_chunk").callable()
_LOOP = registry.get("intree.sequential_simple_gla").callable()


def fixed_block(q, k, v, g):
    """Correct: the chunk form with its chunk fixed inside, as a Triton kernel's block."""
    return _CHUNK(q, k, v, g, chunk_size=CHUNK_COUNTERFACTUAL)


def fixed_block_stale_decay(q, k, v, g):
    """Wrong: every key decayed by one step too few (g shifted by one position)."""
    shifted = g.clone()
    shifted[:, 1:] = g[:, :-1]
    return _CHUNK(q, k, v, shifted, chunk_size=CHUNK_COUNTERFACTUAL)


def declared(q, k, v, g, chunk_size=CHUNK_COUNTERFACTUAL):
    return _CHUNK(q, k, v, g, chunk_size=chunk_size)


def _problem(dtype: str, seed: int = 1, length: int = 40, chunk_size: int | None = None) -> Problem:
    return Problem(family="simple_gla", length=length, dtype=dtype, batch=1, heads=2, dk=4, dv=4,
                   regime="strong_decay", seed=seed, chunk_size=chunk_size)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_an_undeclared_chunk_kernel_is_told_to_declare_its_chunk(dtype):
    """Named precision_loss by its second-dtype run (its error shrinks with u), with the chunk advice beside;
    chunk_rounding where that run is not made; kernel_bug only with both counterfactuals off."""
    spec = user_kernel_spec(fixed_block, family="simple_gla")
    record = run_case(spec, _problem(dtype))
    assert record["verdict"] == "divergent" and record["cause"] == "precision_loss", record["why"]
    assert record["cond_max"] > 1 and record["chunked_cond_max"] < 1
    assert f"within the bound of a chunked form with chunk {CHUNK_COUNTERFACTUAL}" in record["why"]
    alone = run_case(spec, _problem(dtype), RunOptions(precision_counterfactual=False))
    assert alone["cause"] == "chunk_rounding" and "declare its chunk size" in alone["why"], alone["why"]
    off = run_case(spec, _problem(dtype), RunOptions(chunk_counterfactual=False, precision_counterfactual=False))
    assert off["cause"] == "kernel_bug"


def test_a_real_mistake_in_an_undeclared_chunk_kernel_stays_a_kernel_bug():
    record = run_case(user_kernel_spec(fixed_block_stale_decay, family="simple_gla"), _problem("float64"))
    assert record["verdict"] == "divergent" and record["cause"] == "kernel_bug", record["why"]
    assert record["chunked_cond_max"] > 1e6


def half_clamp_loop(q, k, v, g, initial_state=None, output_final_state=False):
    """Wrong in half precision only: a step loop whose float16/bfloat16 path clamps the log decay at -5."""
    if g.dtype in (torch.float16, torch.bfloat16):
        g = g.clamp(min=-5.0)
    return _LOOP(q, k, v, g, initial_state=initial_state, output_final_state=output_final_state)


def test_one_step_gets_no_chunk_advice():
    """A blind hunt's half-only bug of a step loop shrank to L = 1 (one decay of the initial state) and was
    told to declare a chunk size (session 23): one step has no cumulative sum to round."""
    spec = user_kernel_spec(half_clamp_loop, family="simple_gla")
    one = Problem(family="simple_gla", length=1, dtype="float16", batch=1, heads=1, dk=1, dv=1,
                  regime="strong_decay", seed=0, has_initial_state=True)
    record = run_case(spec, one)
    assert record["verdict"] == "divergent" and record["cause"] == "precision_loss", record["why"]
    assert "chunk" not in record["why"] and "chunked_cond_max" not in record, record["why"]
    # and not "the algorithm is right and loses digits" alone: one step has almost nothing to round (session 25)
    assert ("but one step has almost nothing to round: a code path taken only for float16 inputs reads the same"
            in record["why"]), record["why"]
    longer = run_case(spec, dataclasses.replace(one, length=12, seed=3))
    assert longer["cause"] == "precision_loss" and "a code path taken only" in longer["why"], longer["why"]
    # the searches line and the findings say it too: their headline read "the algorithm is right" (hunt 26a)
    assert record["half_path_suspect"] is longer["half_path_suspect"] is True
    from types import SimpleNamespace

    from harness.cli import search_outcome
    from harness.findings import findings

    line = search_outcome(SimpleNamespace(records=[longer, record], failure=record, regimes=("strong_decay",)))
    assert line.startswith("divergent, precision_loss (or a code path taken only for float16 inputs: see the why), "
                           "shrunk to L=1"), line
    assert "2 of them one step or 100x the loop or more: or a code path taken only for float16 inputs" in \
        findings([longer, record])[0].line()
    off = run_case(spec, one, RunOptions(precision_counterfactual=False))
    assert off["cause"] == "kernel_bug" and "chunk" not in off["why"], off["why"]


def test_a_declared_chunk_kernel_and_a_loop_are_not_judged_twice():
    """The declared kernel (its chunk read from its signature) is held to its chunk's bound at once."""
    spec = user_kernel_spec(declared, family="simple_gla")
    assert spec.capabilities.chunk_sizes == (CHUNK_COUNTERFACTUAL,)
    for spec, chunk in ((spec, CHUNK_COUNTERFACTUAL), (user_kernel_spec(_LOOP, family="simple_gla"), None)):
        record = run_case(spec, _problem("float64", chunk_size=chunk))
        assert record["verdict"] == "equivalent" and "chunked_cond_max" not in record, record["why"]


# ------------------------------------------------------------------------ the chunk term's precision
def _float32_inside(q, k, v, g, scale=None, initial_state=None, output_final_state=False, cu_seqlens=None,
                    chunk_size=64):
    """Correct: the in-tree chunk form run in float32 on half-precision inputs (as fla's chunk kernels form
    their cumulative log-decays), the output rounded to the input dtype."""
    up = (lambda t: None if t is None else t.float())
    o, s = _CHUNK(up(q), up(k), up(v), up(g), scale, up(initial_state), output_final_state, cu_seqlens, chunk_size)
    return o.to(q.dtype), (None if s is None else s.to(q.dtype))


def _declared(name: str, fn, float32_decays: bool):
    base = registry.get("intree.simple_gla_chunk")
    caps = dataclasses.replace(base.capabilities, chunk_computes_in={"bfloat16": "float32", "float16": "float32"}
                               if float32_decays else {})
    return KernelSpec(name=name, family=base.family, load=lambda: fn, capabilities=caps)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("regime", ["uniform_decay", "strong_decay"])
def test_a_chunk_kernel_that_forms_its_decays_in_float32_is_judged_at_float32_s_chunk_term(dtype, regime):
    """Charged at bfloat16's u, a chunk of 64 steps of strong decay leaves no guaranteed digit in most of the
    output: the case was out_of_domain (precision_exhausted) though the kernel loses nothing there; 80% of a
    nightly bfloat16 search of an SSD chunk kernel written this way was spent on such cases. Declared
    (`Capabilities.chunk_computes_in`), the term is float32's and the case is judged: equivalent. A kernel
    that declares it but forms its cumulative sums in the input dtype (the in-tree chunk form) is found."""
    p = Problem(family="simple_gla", length=200, dtype=dtype, batch=1, heads=2, dk=16, dv=16, regime=regime,
                chunk_size=64, seed=3)
    options = RunOptions(timeout_s=None, check_determinism=False)
    before = run_case(_declared("t.float32_inside", _float32_inside, False), p, options)
    after = run_case(_declared("t.float32_inside", _float32_inside, True), p, options)
    false_claim = run_case(_declared("t.input_dtype_cumsum", _CHUNK, True), p, options)
    assert before["verdict"] == "out_of_domain" and before["cause"] == "precision_exhausted", before["why"]
    assert after["verdict"] == "equivalent" and after["n_precision_exhausted"] == 0, after["why"]
    assert after["chunk_precision"] == "float32" and "chunk_precision" not in before
    assert false_claim["verdict"] == "divergent" and false_claim["cond_max"] > 4, false_claim["why"]
    # the why says what it was judged by and that the declaration does not hold (a blind hunt's kernel read
    # only "precision_loss", session 23)
    assert f"it forms them in {dtype}; drop the declaration" in false_claim["why"], false_claim["why"]


def test_fla_s_chunk_kernels_declare_float32_decays():
    for name in ("fla.simple_gla.naive_chunk", "fla.simple_gla.chunk", "fla.gla.chunk"):
        caps = registry.get(name).capabilities
        assert caps.chunk_precision("bfloat16") == caps.chunk_precision("float16") == "float32", name
    assert registry.get("intree.simple_gla_chunk").capabilities.chunk_precision("bfloat16") == "bfloat16"


def _whole_sequence_decays(q, k, v, g, scale=None, initial_state=None, output_final_state=False, cu_seqlens=None,
                           chunk_size=1):
    """Correct: takes a chunk size, and forms its decays from cumulative sums over the whole sequence (as
    mamba-ssm's ``state_passing_ref`` does between chunks): one chunk of L, whatever it is handed."""
    return _CHUNK(q, k, v, g, scale, initial_state, output_final_state, cu_seqlens, chunk_size=q.shape[1])


def test_a_kernel_whose_decays_span_the_sequence_is_charged_the_sequence_s_chunk_term():
    """mamba-ssm's SSD reference at a chunk of 1 (float32, L = 35, log-decay mass 36) was 11.5 times the float32
    loop's error, a kernel_bug: its decays between chunks are exp of differences of cumulative sums over
    every chunk, u times the mass since the start, where the chunk term of a chunk of 1 charges nothing.
    Declared (`Capabilities.decays_across_chunks`) the term is one chunk of L's; undeclared it is found."""
    base = registry.get("intree.simple_gla_chunk")

    def spec(declared: bool) -> KernelSpec:
        caps = dataclasses.replace(base.capabilities, decays_across_chunks=declared)
        return KernelSpec(name="t.whole_sequence", family=base.family, load=lambda: _whole_sequence_decays,
                          capabilities=caps)

    options = RunOptions(timeout_s=None, check_determinism=False, precision_counterfactual=False)
    judged = []
    for seed in range(4):
        p = _problem("float32", seed=seed, length=130, chunk_size=1)
        undeclared, declared = run_case(spec(False), p, options), run_case(spec(True), p, options)
        assert declared["verdict"] == "equivalent", declared["why"]
        judged.append(undeclared)
    found = [r for r in judged if r["verdict"] == "divergent"]
    # undeclared, the why names the declaration (a kernel handed a chunk size had no such advice: a blind hunt's
    # correct quadratic SSD form, session 25)
    assert found and all("declare Capabilities(decays_across_chunks=True)" in r["why"]
                         and r["cause"] == "kernel_bug" for r in found), [r["why"] for r in judged]  # advice only
    def decays_off(q, k, v, g, *args, **kw):  # wrong: every log-decay 1% too strong
        return _whole_sequence_decays(q, k, v, g * 1.01, *args, **kw)

    wrong = KernelSpec(name="t.stale", family=base.family, capabilities=spec(True).capabilities,
                       load=lambda: decays_off)
    assert run_case(wrong, _problem("float32", length=130, chunk_size=1), options)["verdict"] == "divergent"


def _parallel_form(q, k, v, g, scale=None, initial_state=None, output_final_state=False, cu_seqlens=None):
    """Correct, and takes no chunk size: a parallel form with one cumulative sum over the whole sequence."""
    return _CHUNK(q, k, v, g, scale, initial_state, output_final_state, cu_seqlens, chunk_size=q.shape[1])


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_a_parallel_form_without_a_chunk_size_declares_its_sequence_long_decays(dtype):
    """A blind hunt's correct parallel simple GLA (``exp(G_t - G_s)`` of one cumsum) was divergent in float64 at
    L = 7, and ``decays_across_chunks=True`` changed nothing unless the kernel also took a dummy chunk_size.
    Declared, it is charged one chunk of the whole length; undeclared, the why names the declaration."""
    base = registry.get("intree.simple_gla_recurrent")

    def spec(declared: bool) -> KernelSpec:
        caps = dataclasses.replace(base.capabilities, decays_across_chunks=declared)
        return KernelSpec(name="t.parallel", family=base.family, load=lambda: _parallel_form, capabilities=caps)

    assert not spec(True).capabilities.takes_chunk
    options = RunOptions(timeout_s=None, check_determinism=False)
    undeclared = []
    for seed in range(6):
        p = _problem(dtype, seed=seed, length=130)
        declared = run_case(spec(True), p, options)
        assert declared["verdict"] == "equivalent", declared["why"]
        undeclared.append(run_case(spec(False), p, options))
    found = [r for r in undeclared if r["verdict"] == "divergent"]
    assert found and all("decays_across_chunks=True" in r["why"] for r in found), [r["why"] for r in undeclared]


def test_mamba_ssm_s_ssd_reference_is_judged_at_its_float32_cumulative_sums():
    """mamba-ssm's pure-PyTorch SSD reference casts dt to float32 "before cumsum": charged at bfloat16's u,
    its chunk term left no guaranteed digit in 44 of 76 bfloat16 cases of a nightly calibration (seed 37),
    out_of_domain; at float32's, 15 of 20 of them are judged, equivalent (this one: strong decay, L = 344,
    chunk 172, cond 0.07)."""
    spec = registry.get("mamba_ssm.ssd_chunk_scan_combined_ref")
    assert spec.capabilities.chunk_precision("bfloat16") == spec.capabilities.chunk_precision("float16") == "float32"
    if spec.unavailable_reason():
        pytest.skip(f"{spec.name} unavailable here: {spec.unavailable_reason()}")
    p = Problem(family="ssd", length=344, dtype="bfloat16", batch=1, heads=3, groups=1, dv=65, state=11,
                chunk_size=172, regime="strong_decay", seed=370604442)
    options = RunOptions(timeout_s=None, check_determinism=False)
    undeclared = dataclasses.replace(spec, capabilities=dataclasses.replace(spec.capabilities, chunk_computes_in={}))
    assert run_case(undeclared, p, options)["cause"] == "precision_exhausted"
    record = run_case(spec, p, options)
    assert record["verdict"] == "equivalent" and record["chunk_precision"] == "float32", record["why"]
