"""A kernel written for another layout is told so (`harness.runner._swapped_layout`).

A retention or GLA kernel in fla's old ``head_first`` layout (batch, heads, T, d), or a scan that reads
(batch, L, channels), runs without complaint on the family's tensors whenever the shapes allow and
computes the recurrence along the wrong axis: every case was a plain ``kernel_bug`` (a head-first GLA
under `harness check`: divergent from L = 1 with two heads). The divergent output is judged once more
against the oracle run on the inputs with axes 1 and 2 swapped; equivalent there, the cause is
``layout``. A real mistake stays a ``kernel_bug``.
"""

from __future__ import annotations

import pytest

from harness.api import user_kernel_spec
from harness.kernels import registry
from harness.problems import Problem
from harness.runner import RunOptions, run_case

_RETENTION = registry.get("intree.retention_recurrent").callable()
_GLA = registry.get("intree.sequential_simple_gla").callable()
_SCAN = registry.get("intree.sequential_scan").callable()


def retention_head_first(q, k, v):
    """Right for (batch, heads, L, d) tensors: given the family's (batch, L, heads, d), axis 1 is its heads."""
    return _RETENTION(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)).transpose(1, 2)


def gla_head_first(q, k, v, g, scale=None):
    t = lambda x: x.transpose(1, 2)  # noqa: E731
    o, _ = _GLA(t(q), t(k), t(v), t(g), scale=scale)
    return t(o)


def scan_channels_last(a, b):
    """Right for (batch, L, channels): scans along axis 1."""
    return _SCAN(a.transpose(1, 2), b.transpose(1, 2)).transpose(1, 2)


def scan_channels_last_no_carry(a, b):
    """Channels-last and wrong: the carry is dropped every 4 steps."""
    h = scan_channels_last(a, b).clone()
    h[:, 4:] -= h[:, 4:] * 0.5
    return h


@pytest.mark.parametrize("dtype", ["float64", "float32", "bfloat16"])
def test_a_head_first_retention_kernel_is_named_by_its_layout(dtype):
    problem = Problem(family="retention", length=12, dtype=dtype, batch=1, heads=3, dk=8, dv=8, seed=2)
    record = run_case(user_kernel_spec(retention_head_first, family="retention"), problem)
    assert record["verdict"] == "divergent" and record["cause"] == "layout", record["why"]
    assert record["layout_cond_max"] <= 1
    assert "read as (batch, heads, L, d)" in record["why"], record["why"]


def test_a_head_first_gla_and_a_channels_last_scan():
    gla = Problem(family="simple_gla", length=9, dtype="float32", batch=2, heads=4, dk=8, dv=4, seed=1)
    record = run_case(user_kernel_spec(gla_head_first, family="simple_gla"), gla)
    assert record["cause"] == "layout" and "head_first" in record["why"], record["why"]
    scan = Problem(family="linear_scan", length=30, dtype="float32", batch=2, dim=5, seed=3)
    record = run_case(user_kernel_spec(scan_channels_last, family="linear_scan"), scan)
    assert record["cause"] == "layout" and "(batch, L, channels)" in record["why"], record["why"]


def test_a_real_mistake_in_another_layout_stays_a_kernel_bug():
    scan = Problem(family="linear_scan", length=30, dtype="float64", batch=2, dim=9, seed=3)
    record = run_case(user_kernel_spec(scan_channels_last_no_carry, family="linear_scan"), scan)
    assert record["verdict"] == "divergent" and record["cause"] == "kernel_bug", record["why"]
    assert record["layout_cond_max"] > 1


def test_the_layout_check_can_be_switched_off_and_leaves_right_kernels_alone():
    problem = Problem(family="retention", length=12, dtype="float32", batch=1, heads=3, dk=8, dv=8, seed=2)
    off = run_case(user_kernel_spec(retention_head_first, family="retention"), problem,
                   RunOptions(layout_counterfactual=False))
    assert off["cause"] == "kernel_bug" and "layout_cond_max" not in off and "t_layout" not in off
    right = run_case(registry.get("intree.retention_recurrent"), problem)
    assert right["verdict"] == "equivalent" and "layout_cond_max" not in right


def test_the_cause_has_a_phrase_in_the_findings():
    from harness.findings import CAUSE_PHRASES

    assert "layout" in CAUSE_PHRASES
