"""A float32 Triton kernel whose dots run in TF32 is named for it (`harness.runner._ieee_dots`), not
called a kernel bug; a real bug in such a kernel still is.

Triton's float32 ``tl.dot`` defaults to TF32 (the corrected interpreter does as a GPU does). Before the
counterfactual, fla's ``chunk_simple_gla`` named directly (`harness check --kernel
fla.ops.simple_gla:chunk_simple_gla`) was ``divergent, kernel_bug`` on 110 of 110 float32 cases.
"""

from __future__ import annotations

import re

import pytest

from harness.api import check, user_kernel_spec
from harness.kernels.contract import Capabilities
from harness.kernels.triton_interpreter import corrections_unavailable_reason
from harness.problems import Problem
from harness.runner import RunOptions, run_case

pytestmark = pytest.mark.skipif(corrections_unavailable_reason() is not None,
                                reason=f"interpreted Triton: {corrections_unavailable_reason()}")


def _spec(name: str):
    from tests.planted import triton_chunk

    caps = Capabilities(dtypes=("float32",), chunk_sizes=(16,), slow=True)
    return user_kernel_spec(getattr(triton_chunk, name), family="retention", capabilities=caps, name=name)


def _problem(length: int = 40, seed: int = 3) -> Problem:
    return Problem(family="retention", length=length, dtype="float32", batch=1, heads=2, dk=16, dv=16,
                   chunk_size=16, seed=seed)


def test_default_precision_dots_are_named_tf32():
    record = run_case(_spec("chunk_retention_default_dots"), _problem())
    assert record["verdict"] == "divergent" and record["cause"] == "tf32", record["why"]
    assert record["cond_max"] > 100 and record["ieee_dots_cond_max"] <= 1
    assert "TF32: the same call with IEEE float32 Triton dots is equivalent" in record["why"]


def test_a_bug_behind_tf32_dots_stays_a_kernel_bug():
    record = run_case(_spec("chunk_retention_default_dots_boundary_bug"), _problem())
    assert record["verdict"] == "divergent" and record["cause"] != "tf32", record["why"]
    assert record["ieee_dots_cond_max"] > 1  # IEEE dots did not make it equivalent


def test_ieee_dots_and_kernels_without_triton_are_not_re_called():
    plain = run_case(_spec("chunk_retention_boundary_bug"), _problem())  # names input_precision='ieee' itself
    assert plain["cause"] != "tf32" and "ieee_dots_cond_max" not in plain  # same bits: nothing said
    off = run_case(_spec("chunk_retention_default_dots"), _problem(), RunOptions(tf32_counterfactual=False))
    assert off["cause"] != "tf32" and "t_ieee_dots" not in off


def test_check_reports_the_tf32_cause():
    result = check(_spec("chunk_retention_default_dots"), profile="ci", dtypes=("float32",), max_examples=3,
                   grad=False, save_counterexample=False, shrink_deadline_s=0)  # the cause of the case as found
    assert not result.passed and result.failure["cause"] == "tf32"
    assert "Cause: tf32" in result.message and "input_precision='ieee'" in result.message


def test_a_triton_chunk_kernel_named_directly_has_both_tf32_and_its_chunk_named():
    """fla's chunk_simple_gla as a plain function: TF32 dots and a chunk of 64 fixed inside, neither declared."""
    fla = pytest.importorskip("fla.ops.simple_gla", reason="flash-linear-attention is not installed")
    spec = user_kernel_spec(fla.chunk_simple_gla, family="simple_gla")
    problem = Problem(family="simple_gla", length=40, dtype="float32", batch=1, heads=2, dk=16, dv=16,
                      regime="strong_decay", seed=1)
    record = run_case(spec, problem)
    assert record["verdict"] == "divergent" and record["cause"] == "tf32", record["why"]
    assert record["ieee_dots_cond_max"] > 1  # IEEE dots alone are not enough: the chunk term is needed too
    assert re.search("TF32 and chunk rounding: the same call with IEEE float32 Triton dots is within the bound of a "
                     "chunked form with chunk (16|32|64) ", record["why"]), record["why"]
