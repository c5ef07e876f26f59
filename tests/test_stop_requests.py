"""A stop asked for (SIGINT, SIGTERM: `isolation.request_stop`) while the harness computes in its own process.

Measured with `harness check --kernel intree.retention_chunkwise --family retention --profile nightly` and a
SIGTERM at 10 to 130 s: the run ended 2 to 26 s later, because a stop was taken only at the next wait for a
kernel or the next stored record, and the oracle's backward pass of a gradient case, the sequential loop and
the measurement run here for seconds each at nightly lengths. A CI runner that cancels a job (SIGINT, then
SIGTERM 7.5 s later, SIGKILL 2.5 s after that) killed the run before its partial report was written. The
stop is now taken between those steps; and hypothesis's "add @seed(N) to this test", printed above the
harness's own line for a search that had not failed, is not printed.
"""

from __future__ import annotations

import pytest
import torch

from harness import gradients, runner
from harness.api import check, user_kernel_spec
from harness.kernels import isolation
from harness.problems import Problem
from harness.runner import RunOptions, run_case

IN_PROCESS = dict(isolation="in-process", timeout_s=None)  # no kernel wait that would take the stop


def scan(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    h, out = torch.zeros_like(b[..., 0]), []
    for t in range(b.shape[-1]):
        h = a[..., t] * h + b[..., t]
        out.append(h)
    return torch.stack(out, -1)


@pytest.fixture
def stops():
    isolation.clear_stop()
    yield
    isolation.clear_stop()


def _problem() -> Problem:
    return Problem(family="linear_scan", length=9, dtype="float32", batch=1, dim=2, seed=3)


def test_a_stop_asked_for_during_the_oracle_is_taken_before_the_kernel_is_called(stops, monkeypatch):
    calls = []

    def kernel(a, b):
        calls.append("kernel")
        return scan(a, b)

    real = runner.chunk_term_at

    def oracle_then_stop(*args, **kwargs):
        traces = real(*args, **kwargs)
        isolation.request_stop("terminated (SIGTERM)")
        return traces

    monkeypatch.setattr(runner, "chunk_term_at", oracle_then_stop)
    spec = user_kernel_spec(kernel, family="linear_scan")
    with pytest.raises(isolation.Interrupted, match="SIGTERM"):
        run_case(spec, _problem(), RunOptions(**IN_PROCESS))
    assert calls == []


def test_a_stop_asked_for_during_the_kernel_is_taken_before_the_loop_and_the_measurement(stops, monkeypatch):
    measured = []

    def kernel(a, b):
        isolation.request_stop("interrupted (SIGINT)")
        return scan(a, b)

    monkeypatch.setattr(runner, "_judge_outputs", lambda *a, **k: measured.append(1))
    monkeypatch.setattr(runner, "baseline_outputs", lambda *a, **k: measured.append(1))
    with pytest.raises(isolation.Interrupted, match="SIGINT"):
        run_case(user_kernel_spec(kernel, family="linear_scan"), _problem(), RunOptions(**IN_PROCESS))
    assert measured == []


def test_a_stop_asked_for_during_a_gradient_is_taken_before_the_oracle_s_backward(stops, monkeypatch):
    oracle = []

    def kernel(a, b):
        if b.requires_grad:  # the gradient's forward: the forward record was taken before
            isolation.request_stop("terminated (SIGTERM)")
        return scan(a, b)

    monkeypatch.setattr(gradients, "_oracle_output", lambda *a, **k: oracle.append(1))
    spec = user_kernel_spec(kernel, family="linear_scan")
    forward = run_case(spec, _problem(), RunOptions(**IN_PROCESS))
    assert forward["verdict"] == "equivalent"
    with pytest.raises(isolation.Interrupted, match="SIGTERM"):
        gradients.gradient_case(spec, _problem(), RunOptions(**IN_PROCESS), forward=forward)
    assert oracle == []


def test_a_stopped_search_does_not_tell_the_user_to_add_a_seed_to_a_test(stops, capsys, tmp_path):
    seen = []

    def kernel(a, b):
        seen.append(1)
        if len(seen) == 3:
            isolation.request_stop("terminated (SIGTERM)")
        return scan(a, b)

    with pytest.raises(isolation.Interrupted):  # a random (not derandomized) profile: hypothesis drew a seed
        check(kernel, family="linear_scan", profile="nightly", dtypes=("float32",), max_length=16,
              max_examples=20, grad=False, isolation="in-process", counterexample_dir=tmp_path)
    assert 3 <= len(seen) <= 4  # the third call (and its determinism check), not the 20 examples
    out = capsys.readouterr()
    assert "@seed(" not in out.out + out.err, out
