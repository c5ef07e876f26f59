"""The CI gate: every kernel the harness knows, across lengths, chunk sizes, eps, dtypes and regimes.

One hypothesis test per registered kernel. Each case is run end to end (`harness.runner.run_case`),
recorded for the session's report, and judged; `hypothesis.target` on the condition-normalized error
steers the search toward the worst inputs. A divergent or contract-breaking case fails the test after
hypothesis has shrunk it, and the minimal case is written to ``cases/counterexamples/`` (or
``$HARNESS_CASES_DIR``), which `tests/test_saved_cases.py` replays on every run.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import given, settings, target

from harness.api import FAILING_VERDICTS, key_search
from harness.cases import COUNTEREXAMPLES_DIR, save_counterexample
from harness.errors import DivergenceError
from harness.kernels.registry import all_kernels
from harness.runner import RunOptions, run_case
from harness.settings import limits
from harness.strategies import problems
from harness.verdict import Judgement, Verdict, format_failure

#: In-tree kernels that are divergent by design where the search goes, and why (strict: the search must find it).
DIVERGENT_BY_DESIGN = {
    name: "exp(-cumsum) overflows under strong decay: 0 * inf = NaN where the exact output is small (issue 14)"
    for name in ("intree.simple_gla_chunk_cumprod", "intree.gla_chunk_cumprod")
}
CASES_DIR = Path(os.environ.get("HARNESS_CASES_DIR", COUNTEREXAMPLES_DIR))


def _kernel_params():
    for spec in all_kernels():
        marks = [pytest.mark.thirdparty] if spec.source != "intree" else []
        if spec.name in DIVERGENT_BY_DESIGN:
            marks.append(pytest.mark.xfail(strict=True, raises=DivergenceError, reason=DIVERGENT_BY_DESIGN[spec.name]))
        yield pytest.param(spec, id=spec.name, marks=marks)


@pytest.mark.parametrize("spec", list(_kernel_params()))
def test_kernel_matches_oracle(spec, harness_recorder, harness_policy):
    reason = spec.unavailable_reason()
    if reason:
        pytest.skip(f"{spec.name} unavailable here: {reason}")
    if all(spec.capabilities.runs(d, "cpu") for d in spec.capabilities.dtypes):
        pytest.skip(f"{spec.name} runs no dtype on the CPU: {spec.capabilities.runs(spec.capabilities.dtypes[0], 'cpu')}")
    lim = limits()
    slow = spec.capabilities.slow
    options = RunOptions(policy=harness_policy, check_determinism=False)

    @settings(max_examples=lim.slow_max_examples if slow else lim.max_examples)
    @given(problem=problems(spec, max_length=lim.slow_max_length if slow else None))
    def search(problem):
        record = run_case(spec, problem, options)
        harness_recorder.record(record)
        cond = record.get("cond_max")
        if isinstance(cond, float) and cond == cond and cond != float("inf"):
            target(cond, label="cond_max")
        if record["verdict"] in FAILING_VERDICTS:
            judgement = Judgement(Verdict(record["verdict"]), record["why"])
            if spec.name in DIVERGENT_BY_DESIGN:  # expected: nothing to save for replay
                raise DivergenceError(format_failure(record, judgement, replay=record["replay"]))
            path = save_counterexample(record, problem, directory=CASES_DIR)
            raise DivergenceError(format_failure(record, judgement, replay=f"harness replay {path}"))

    key_search(search, spec, None)  # one database key per kernel; ci draws seeded from the kernel, as in check
    search()
