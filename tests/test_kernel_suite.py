"""The CI gate: every kernel the harness knows, across lengths, chunk sizes, eps, dtypes and regimes.

One test per registered kernel, each one `harness.api.check` through the ``harness_check`` fixture: the
same engine as `harness check` and a user's own suite (the property search per dtype, shrinking, the
database key and the kernel-seeded ci draws), with every case recorded for the session's report. A divergent or contract-breaking case fails the test with the
shrunk case, which is written to the project's counterexamples folder (``cases/counterexamples/``
here, or ``$HARNESS_CASES_DIR``) and replayed by `tests/test_saved_cases.py` on every run.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from harness.errors import DivergenceError
from harness.kernels.gated_forms import DIVERGENT_BY_DESIGN
from harness.kernels.registry import all_kernels
from harness.project import current
from harness.settings import limits
from tests.known_findings import FORWARD_FINDINGS

# In-tree kernels divergent by design (gated_forms.DIVERGENT_BY_DESIGN): strict xfail, the search must find it.

#: Third-party kernels with a finding the harness reports (`tests.known_findings`).
KNOWN_FINDINGS = FORWARD_FINDINGS


def _cases_dir() -> Path:
    return Path(os.environ["HARNESS_CASES_DIR"]) if os.environ.get("HARNESS_CASES_DIR") else current().counterexamples_dir


def _kernel_params():
    for spec in all_kernels():
        marks = [pytest.mark.thirdparty] if spec.source != "intree" else []
        if spec.name in DIVERGENT_BY_DESIGN:
            marks.append(pytest.mark.xfail(strict=True, raises=DivergenceError, reason=DIVERGENT_BY_DESIGN[spec.name]))
        if spec.name in KNOWN_FINDINGS:
            marks.append(pytest.mark.xfail(strict=False, raises=DivergenceError, reason=KNOWN_FINDINGS[spec.name]))
        yield pytest.param(spec, id=spec.name, marks=marks)


@pytest.mark.parametrize("spec", list(_kernel_params()))
def test_kernel_matches_oracle(spec, harness_check, tmp_path):
    reason = spec.unavailable_reason()
    if reason:
        pytest.skip(f"{spec.name} unavailable here: {reason}")
    if all(spec.capabilities.runs(d, "cpu") for d in spec.capabilities.dtypes):
        pytest.skip(f"{spec.name} runs no dtype on the CPU: {spec.capabilities.runs(spec.capabilities.dtypes[0], 'cpu')}")
    # forwards only (gradients have tests/test_gradients.py); determinism is the hostile tests' concern
    # a kernel divergent by design leaves nothing to replay: its shrunk case goes to a temporary folder
    cases = tmp_path if spec.name in DIVERGENT_BY_DESIGN or spec.name in KNOWN_FINDINGS else _cases_dir()
    # a kernel divergent by design only has to diverge: its failure is not shrunk (tens of seconds each)
    shrink = {"shrink_deadline_s": 0.0} if spec.name in DIVERGENT_BY_DESIGN else {}
    # one search per dtype (the fixture's, as `harness check`), the profile's examples spread over them: the
    # suite's cost stays that of one search, and no dtype gets one case of 25 by chance
    runs = [d for d in spec.capabilities.dtypes if spec.capabilities.runs(d, "cpu") is None]
    lim = limits()
    each = -(-(lim.slow_max_examples if spec.capabilities.slow else lim.max_examples) // len(runs))
    harness_check(spec, grad=False, check_determinism=False, counterexample_dir=cases, max_examples=max(2, each),
                  **shrink)
