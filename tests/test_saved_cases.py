"""Every saved counterexample in ``cases/counterexamples/`` is replayed on every run.

A file's ``expect`` is the verdict the suite requires now: ``equivalent`` once the kernel is fixed, or
the recorded failure for a case kept on purpose (e.g. a planted bug that must stay caught).
"""

from __future__ import annotations

import pytest

from harness.cases import load_case, resolve_kernel, saved_cases
from harness.runner import run_case

CASES = saved_cases()


@pytest.mark.parametrize("path", CASES, ids=[p.stem for p in CASES])
def test_saved_case_replays(path, harness_recorder):
    case = load_case(path)
    spec = resolve_kernel(case.kernel, case.kernel_target, case.problem.family.value)
    reason = spec.unavailable_reason()
    if reason:
        pytest.skip(f"{case.kernel} unavailable here: {reason}")
    record = run_case(spec, case.problem)
    harness_recorder.record(record)
    assert record["verdict"] == case.expect, f"{path.name}: expected {case.expect}, got {record['verdict']}: {record['why']}"


def test_there_are_saved_cases():
    assert CASES, "cases/counterexamples/ holds no saved case: the replay test would check nothing"
