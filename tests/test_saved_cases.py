"""Every saved counterexample in ``cases/counterexamples/`` is replayed on every run.

A file's ``expect`` is the verdict the suite requires now: ``equivalent`` once the kernel is fixed, or
the recorded failure for a case kept on purpose (e.g. a planted bug that must stay caught).
"""

from __future__ import annotations

import pytest

from harness.cases import load_case, replay, resolve_kernel, saved_cases

CASES = saved_cases()


@pytest.mark.parametrize("path", CASES, ids=[p.stem for p in CASES])
def test_saved_case_replays(path, harness_recorder):
    case = load_case(path)
    spec = resolve_kernel(case.kernel, case.kernel_target, case.problem.family.value)
    reason = spec.unavailable_reason()
    if reason:
        pytest.skip(f"{case.kernel} unavailable here: {reason}")
    record = replay(spec, case.problem, case.grad_of)  # a gradient's case takes that gradient again
    harness_recorder.record(record)
    assert record["verdict"] == case.expect, f"{path.name}: expected {case.expect}, got {record['verdict']}: {record['why']}"


def test_there_are_saved_cases():
    assert CASES, "cases/counterexamples/ holds no saved case: the replay test would check nothing"


def test_a_problems_dict_round_trips_and_is_its_own_copy():
    from harness.problems import Problem

    p = Problem(family="linear_scan", length=3, dim=1, values={"a": [0.5, 0.25, 1.0], "b": [1.0, -2.0, 3.0]})
    d = p.to_dict()
    assert Problem.from_dict(d) == p and d["values"] == p.values and d["family"] == "linear_scan"
    d["values"]["a"][0] = 9.0  # a caller editing the dict (e.g. a shrunk case) leaves the problem as it was
    assert p.values["a"][0] == 0.5
    assert "values" not in Problem(family="linear_scan", length=3).to_dict()
