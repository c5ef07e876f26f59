"""The pytest route: the ``harness_check`` fixture checks a kernel inside a user's own test suite.

An inner pytest session (pytester, in a temporary project) checks a correct and a wrong scan with the
fixture: the correct one passes, the wrong one fails with the shrunk counterexample's message, and the
counterexample lands in the temporary project's ``.harness/counterexamples/``.
"""

from __future__ import annotations

import json

import pytest

from tests.user_sources import LOOP_SCAN

pytestmark = pytest.mark.e2e  # end to end: `make test-all`

pytest_plugins = ["pytester"]

KERNELS = LOOP_SCAN + '''

def scan_drops_last_input(a, b):  # planted bug: the last step forgets b
    out = scan(a, b)
    if b.shape[-1] > 1:
        out[..., -1] = a[..., -1] * out[..., -2]
    return out
'''

TESTS = '''
from kernels import scan, scan_drops_last_input

OPTIONS = dict(family="linear_scan", dtypes=("float32",), max_examples=8, max_length=16, grad=False,
               profile="ci")

def test_correct(harness_check):
    result = harness_check(scan, **OPTIONS)
    assert result.passed and result.records

def test_wrong(harness_check):
    harness_check(scan_drops_last_input, **OPTIONS)

def test_each_dtype_is_a_search_of_its_own(harness_check):
    result = harness_check(scan, **dict(OPTIONS, dtypes=("float32", "float64")))
    counts = {d: sum(r["dtype"] == d for r in result.records) for d in ("float32", "float64")}
    assert counts == {"float32": 8, "float64": 8}, counts
'''


def test_the_fixture_passes_a_correct_kernel_and_fails_a_wrong_one_with_the_shrunk_case(pytester):
    pytester.makepyprojecttoml("[project]\nname = 'user-kernels'\n")
    pytester.makepyfile(kernels=KERNELS, test_user=TESTS)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-q", "--harness-in-process",
                                           "--harness-report-dir", "out", timeout=600)
    # one search per dtype, as `harness check` runs them: one over two dtypes split its 8 cases between them
    result.assert_outcomes(passed=2, failed=1)
    header = json.loads((pytester.path / "out" / "run.json").read_text())
    assert header["profile"] == "pytest:ci", header["profile"]  # the searches' profile, not hypothesis's "default"
    out = result.stdout.str()
    assert "DivergenceError" in out and "scan_drops_last_input" in out
    assert "counterexample saved:" in out
    assert "Classification: divergent (rule cond" in out  # the rule that fired, never an empty "(rule )"
    saved = list((pytester.path / ".harness" / "counterexamples").glob("*.json"))
    assert len(saved) == 1 and "scan_drops_last_input" in saved[0].name
