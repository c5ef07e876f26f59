"""Kernels that break the call contract are reported as such, and a run survives them.

Each kernel of `tests.planted.broken` must come back from `harness.runner.run_case` as its own named
`harness.kernels.guard.Outcome` with the ``kernel_error`` verdict (never an exception out of the
harness), and a run of several kernels and cases through `harness.runner.run_cases` with a
`harness.store.RunStore` must go on past every one of them and keep one record line per case.

These tests run the kernels in worker processes (``isolation="process"``, the CLI's default), where a
crash is survivable; the suite's default is in-process (see conftest.py). The tests of the in-process
thread (timeout, grad mode) say ``isolation="in-process"``.
"""

from __future__ import annotations

import json
import re
import threading

import pytest
import torch

from harness.api import check, user_kernel_spec
from harness.kernels.guard import Outcome, _run_with_timeout
from harness.kernels.registry import get
from harness.problems import Problem
from harness.runner import RunOptions, run_case, run_cases
from harness.store import RunStore, load_records
from tests.planted import broken
from tests.planted.broken import BROKEN

#: Per-call timeout for these tests: long enough for a length-33 scan, short for the hanging kernel.
TIMEOUT_S = 1.0

OPTIONS = RunOptions(timeout_s=TIMEOUT_S, check_determinism=True, isolation="process")
IN_PROCESS = RunOptions(timeout_s=TIMEOUT_S, check_determinism=True, isolation="in-process")


@pytest.fixture(autouse=True)
def release_hanging_kernels():
    """Let the abandoned thread of the hanging kernel finish once its test has seen the timeout."""
    broken.RELEASE.clear()
    yield
    broken.RELEASE.set()


def problem(length: int = 33, dtype: str = "float32", seed: int = 1) -> Problem:
    return Problem(family="linear_scan", length=length, dtype=dtype, batch=2, dim=3, seed=seed)


def test_every_outcome_is_planted_once():
    outcomes = [k.outcome for k in BROKEN]
    assert len(outcomes) == len(set(outcomes))
    assert set(outcomes) == set(Outcome) - {Outcome.OK}


def test_correct_kernel_is_ok_and_equivalent():
    spec = broken.BrokenKernel("correct", broken.correct_scan, Outcome.OK, "control").spec
    record = run_case(spec, problem(), OPTIONS)
    assert record["outcome"] == Outcome.OK.value
    assert record["verdict"] == "equivalent", record["why"]


@pytest.mark.parametrize("kernel", BROKEN, ids=[k.name for k in BROKEN])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_contract_violation_is_named(kernel, dtype):
    record = run_case(kernel.spec, problem(dtype=dtype), OPTIONS)
    assert record["outcome"] == kernel.outcome.value, record.get("error")
    assert record["verdict"] == "kernel_error"
    assert record["cause"] == kernel.outcome.value
    assert record["error"], "a contract violation must say what happened"
    assert record["why"].startswith(kernel.outcome.value), record["why"]


def _seconds_waited(error: str) -> float:
    """The timeout a ``timeout`` record's error names (``... after 0.2 s``), as a number."""
    found = re.search(r"after (\S+) s\b", error)
    assert found is not None, error
    return float(found.group(1))


@pytest.mark.parametrize("isolation", ["process", "in-process"])
def test_timeout_is_bounded_by_the_option(isolation):
    spec = next(k for k in BROKEN if k.outcome is Outcome.TIMEOUT).spec
    record = run_case(spec, problem(), RunOptions(timeout_s=0.2, isolation=isolation))
    assert record["outcome"] == "timeout"
    assert record["t_kernel"] < 0.2 + 2.0  # the guard gave up at the timeout, not when the kernel returned
    assert _seconds_waited(record["error"]) == 0.2, record["error"]
    assert record["isolation"] == isolation


def test_check_takes_the_profiles_timeout_unless_the_session_sets_one(monkeypatch):
    """A profile's own per-call timeout (nightly's longest cases take a correct kernel over 120 s on a CPU:
    900 s there) is `check`'s default; ``--timeout`` / `configure` still wins."""
    import dataclasses

    from harness import settings
    from harness.kernels import isolation

    assert settings.LIMITS["nightly"].timeout_s == 900 and settings.LIMITS["ci"].timeout_s == 120
    monkeypatch.setitem(settings.LIMITS, "dev", dataclasses.replace(settings.LIMITS["dev"], timeout_s=0.25))
    monkeypatch.setattr(isolation, "_DEFAULTS", dataclasses.replace(isolation._DEFAULTS, timeout_configured=False,
                                                                    timeout_s=isolation.DEFAULT_TIMEOUT_S))
    hang = next(k for k in BROKEN if k.outcome is Outcome.TIMEOUT).spec

    def timeout_of_the_run() -> str:
        result = check(hang, profile="dev", dtypes=("float32",), max_examples=2, isolation="in-process",
                       save_counterexample=False, grad=False, check_determinism=False)
        timeouts = [r for r in result.records if r["outcome"] == "timeout"]
        assert timeouts and not result.passed, result.message
        return timeouts[0]["error"]

    assert _seconds_waited(timeout_of_the_run()) == 0.25  # the profile's, not the session default (120 s)
    isolation.configure(timeout_s=0.3)  # what --timeout does
    assert _seconds_waited(timeout_of_the_run()) == 0.3


def test_a_crash_is_recorded_with_its_signal_and_last_output():
    spec = next(k for k in BROKEN if k.outcome is Outcome.CRASHED).spec
    record = run_case(spec, problem(length=33), OPTIONS)
    assert record["outcome"] == "crashed" and record["verdict"] == "kernel_error"
    assert "SIGSEGV" in record["error"], record["error"]
    assert "planted crash at length 33" in record["error"], record["error"]  # the worker's last output
    control = broken.BrokenKernel("correct", broken.correct_scan, Outcome.OK, "control").spec
    assert run_case(control, problem(), OPTIONS)["outcome"] == "ok"  # the run goes on
    assert run_case(spec, problem(length=7), OPTIONS)["outcome"] == "crashed"  # a fresh worker, crashed again


def test_a_run_goes_on_after_a_timeout_on_a_fresh_caller_thread():
    hang = next(k for k in BROKEN if k.outcome is Outcome.TIMEOUT).spec
    correct = broken.BrokenKernel("correct", broken.correct_scan, Outcome.OK, "control").spec
    seen: list[int] = []

    def where(a, b):  # the control kernel, noting which thread ran it
        seen.append(threading.get_ident())
        return broken.correct_scan(a, b)

    for _ in range(2):
        assert run_case(correct, problem(), IN_PROCESS, kernel_fn=where)["outcome"] == "ok"
    assert len(set(seen)) == 1 and seen[0] != threading.get_ident()  # one worker, reused
    assert run_case(hang, problem(), RunOptions(timeout_s=0.2, isolation="in-process"))["outcome"] == "timeout"
    assert run_case(correct, problem(), IN_PROCESS, kernel_fn=where)["outcome"] == "ok"
    assert seen[-1] != seen[0]  # the stuck worker was left behind; a new one took the call


def test_the_kernel_runs_in_the_callers_grad_mode():
    modes: list[bool] = []

    def note(a, b):
        modes.append(torch.is_grad_enabled())
        return broken.correct_scan(a, b)

    spec = broken.BrokenKernel("correct", broken.correct_scan, Outcome.OK, "control").spec
    run_case(spec, problem(), IN_PROCESS, kernel_fn=note)  # the runner calls kernels under no_grad
    with torch.enable_grad():
        assert _run_with_timeout(torch.is_grad_enabled, 1.0) == ("ok", True)
    assert modes and not any(modes)


def test_nondeterminism_needs_the_determinism_check():
    spec = next(k for k in BROKEN if k.outcome is Outcome.NONDETERMINISTIC).spec
    record = run_case(spec, problem(), RunOptions(timeout_s=TIMEOUT_S, check_determinism=False, isolation="process"))
    assert record["outcome"] == Outcome.OK.value  # one call cannot show it
    record = run_case(spec, problem(), RunOptions(timeout_s=TIMEOUT_S, check_determinism=True, isolation="process"))
    assert record["outcome"] == Outcome.NONDETERMINISTIC.value
    assert record["verdict"] == "kernel_error"


def test_mutated_input_names_the_input():
    spec = next(k for k in BROKEN if k.outcome is Outcome.MUTATED_INPUT).spec
    record = run_case(spec, problem(), OPTIONS)
    assert "input 'b'" in record["error"] and "#" not in record["error"]  # the second argument, named (s. 28)


@pytest.mark.e2e
def test_a_run_goes_on_past_every_broken_kernel(tmp_path):
    control = broken.BrokenKernel("correct", broken.correct_scan, Outcome.OK, "control")
    kernels = [control, *BROKEN, control]
    problems = [problem(length=n, seed=n) for n in (1, 7, 64)]
    cases = [(k.spec, p) for k in kernels for p in problems]
    seen: list[str] = []
    with RunStore(tmp_path / "run") as store:
        records = run_cases(cases, OPTIONS, store=store, progress=lambda rec: seen.append(rec["kernel"]))
    lines = (tmp_path / "run" / "records.jsonl").read_text().splitlines()
    assert len(lines) == len(cases) == len(records) == len(seen)
    stored = [json.loads(line) for line in lines]
    assert [r["kernel"] for r in stored] == [spec.name for spec, _ in cases]
    expected = {f"broken.{k.name}": k.outcome.value for k in kernels}
    for rec in stored:
        assert rec["outcome"] == expected[rec["kernel"]], (rec["kernel"], rec.get("error"))
        assert rec["verdict"] == ("equivalent" if rec["outcome"] == "ok" else "kernel_error")
    assert len(load_records(tmp_path / "run")) == len(cases)


_CHECKS: dict = {}


def _check(name: str, tmp_path_factory):
    """`check` on a broken kernel, once per session (a kernel that always fails shrinks for seconds)."""
    kernel = next(k for k in BROKEN if k.name == name)
    if name not in _CHECKS:
        _CHECKS[name] = check(kernel.spec, profile="ci", dtypes=("float32",), max_length=64, max_examples=5,
                              counterexample_dir=tmp_path_factory.mktemp(name), isolation="process")
    return kernel, _CHECKS[name]


# check() itself: a kernel error fails the check (the determinism re-call is on by default there)
@pytest.mark.parametrize("name", ["raises", "mutates_input", "nondeterministic"])
def test_check_reports_a_broken_kernel(tmp_path_factory, name):
    kernel, result = _check(name, tmp_path_factory)
    assert not result.passed
    assert result.failure["verdict"] == "kernel_error"
    assert result.failure["outcome"] == kernel.outcome.value
    assert result.counterexample is not None and result.counterexample.is_file()


def test_check_message_names_the_contract_violation(tmp_path_factory):
    kernel, result = _check("raises", tmp_path_factory)
    assert "kernel_error" in result.message, result.message
    assert kernel.outcome.value in result.message and "planted failure" in result.message, result.message


def test_check_message_shows_what_the_kernel_was_handed(tmp_path_factory):
    """A kernel that raised gets the call it was given, tensors by shape and dtype, before the replay line."""
    kernel, result = _check("raises", tmp_path_factory)
    lines = result.message.splitlines()
    call = next(line for line in lines if line.startswith("Call: "))
    p = result.failure
    shape = f"({p['batch']}, {p['dim']}, {p['length']}) float32"
    assert call == f"Call: fn(a {shape}, b {shape})", call
    assert lines.index(call) < next(i for i, line in enumerate(lines) if line.startswith("Replay:"))


def test_a_kernel_that_writes_into_a_keyword_input_is_reported_by_its_name():
    """The initial state (and D, z, a bias) travel as keywords: a kernel that reuses its caller's state
    buffer is a mutated input, named, not the nondeterminism that its second call would show."""
    from harness.api import user_kernel_spec
    from reference_impls.gated_decay import simple_gla

    def reuses_the_initial_state(q, k, v, g, scale=None, initial_state=None, output_final_state=False):
        out = simple_gla(q, k, v, g, scale, initial_state, output_final_state, compute_dtype=q.dtype)
        if initial_state is not None:
            initial_state.mul_(0.5)  # its own scratch buffer, it thought
        return out

    spec = user_kernel_spec(reuses_the_initial_state, family="simple_gla")
    p = Problem(family="simple_gla", length=9, dtype="float32", batch=1, heads=2, dk=4, dv=4, seed=3,
                has_initial_state=True)
    record = run_case(spec, p, IN_PROCESS)
    assert record["outcome"] == Outcome.MUTATED_INPUT.value, record["error"]
    assert "input 'initial_state'" in record["error"] and record["verdict"] == "kernel_error"
    record = run_case(spec, p.replace(has_initial_state=False), IN_PROCESS)  # the same kernel, no state handed
    assert record["verdict"] == "equivalent", record.get("why")


def scan_channels_last_out(a, b):
    """Right values, returned as (batch, L, channels): the family's shape with axes 1 and 2 swapped."""
    return get("intree.sequential_scan").callable()(a, b).transpose(1, 2).contiguous()


def test_a_wrong_shape_that_is_the_expected_one_transposed_says_so():
    problem = Problem(family="linear_scan", length=7, dtype="float32", batch=2, dim=3, seed=1)
    record = run_case(user_kernel_spec(scan_channels_last_out, family="linear_scan"), problem)
    assert record["verdict"] == "kernel_error" and record["cause"] == "wrong_shape", record["why"]
    assert "returned shape (2, 7, 3), expected (2, 3, 7) (the expected shape with axes 1 and 2 swapped" in record["why"]


def takes_a_third_input(a, b, c):
    """The family calls fn(a, b): the call cannot bind."""
    return b.clone()


def raises_its_own_type_error(a, b):
    return torch.cumsum(b, "the last axis")


@pytest.mark.parametrize("options", [OPTIONS, IN_PROCESS], ids=["process", "in-process"])
def test_a_signature_that_cannot_take_the_call_is_said_so_not_placed_in_the_harness(options):
    """A kernel whose signature does not take the family's call read "TypeError: ... missing 1 required positional
    argument: 'c' (at .../harness/kernels/isolation.py:495)", which sent its reader into the harness (a blind hunt,
    session 27). A TypeError of the kernel's own code keeps its own line."""
    p = problem(length=5)
    record = run_case(user_kernel_spec(takes_a_third_input, family="linear_scan"), p, options)
    assert record["verdict"] == "kernel_error" and record["cause"] == "raised", record["why"]
    assert "missing 1 required positional argument: 'c' (raised by the call itself, before any line of the " \
        "kernel ran: its signature does not take the arguments of the family's call)" in record["error"]
    assert "harness/kernels" not in record["error"]
    record = run_case(user_kernel_spec(raises_its_own_type_error, family="linear_scan"), p, options)
    assert record["cause"] == "raised" and "raised by the call itself" not in record["error"]
    assert f"(at {__file__}:" in record["error"], record["error"]


def gla_cumsum_into_g(q, k, v, g, scale=None, initial_state=None, output_final_state=False):
    """Right values, but ``g.to(torch.float32)`` is ``g`` itself in float32, and its in-place cumsum writes it."""
    out = get("intree.sequential_gla").callable()(q, k, v, g, scale=scale, initial_state=initial_state,
                                                   output_final_state=output_final_state)
    g.to(torch.float32).cumsum_(1)
    return out


@pytest.mark.parametrize("options", [OPTIONS, IN_PROCESS], ids=["process", "in-process"])
def test_a_written_positional_input_is_named_as_the_family_calls_it(options):
    """"input #3 (shape (1, 2, 1)) was written to": the reader had to count the call's arguments to find ``g``
    (a blind hunt, session 28)."""
    p = Problem(family="gla", length=5, dtype="float32", batch=1, heads=2, dk=4, dv=4, seed=1)
    record = run_case(user_kernel_spec(gla_cumsum_into_g, family="gla"), p, options)
    assert record["cause"] == "mutated_input", record["why"]
    assert record["error"].startswith("input 'g' (shape (1, 5, 2, 4)) was written to"), record["error"]
    assert "input 'g'" in record["why"]
