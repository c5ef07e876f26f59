"""Each process of a harness run computes on its share of the cores (`harness.threads`).

torch's default (every core, in the harness process and in its kernel worker both) spin-waited at every
parallel region for threads another process had descheduled. The policy's decisions are tested here as a
function of the cores given and the user's settings; that a kernel worker and the ``harness`` command's own
process run with the decided count, by asking them; and that the oracles give the same bits at one thread
and at two, so that the count moves no verdict.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from harness import threads
from harness.errors import InvalidArgument
from harness.kernels import isolation
from harness.kernels.contract import RETNET
from harness.problems import Problem
from harness.runner import baseline_outputs, reference_traces
from reference_impls import _threads

NO_USER_SETTING: dict[str, str] = {}


# ------------------------------------------------------------------------------------------- the policy
@pytest.mark.parametrize("cores, runs, isolated, expected", [
    (2, 1, True, 1),  # the harness and its kernel worker: one thread each
    (2, 1, False, 2),  # kernels in-process: one process, both cores
    (16, 1, True, 8),
    (16, 2, True, 4),  # two pytest-xdist workers, each with a kernel worker
    (16, 3, False, 5),
    (1, 1, True, 1),  # never fewer than one
    (3, 4, True, 1),
])
def test_the_cores_given_are_split_among_the_processes_that_compute_at_once(cores, runs, isolated, expected):
    assert threads.thread_count(runs=runs, isolated=isolated, cores=cores, environ=NO_USER_SETTING) == expected


def test_the_cores_given_are_this_process_s_affinity():
    """Not the machine's core count: a process pinned to one core (taskset, a container's cpuset) gets one."""
    if not hasattr(os, "sched_setaffinity"):
        pytest.skip("no CPU affinity on this OS")
    given = os.sched_getaffinity(0)
    assert threads.thread_count(runs=1, isolated=False, environ=NO_USER_SETTING) == len(given)
    os.sched_setaffinity(0, {min(given)})
    try:
        assert threads.thread_count(runs=1, isolated=False, environ=NO_USER_SETTING) == 1
    finally:
        os.sched_setaffinity(0, given)


@pytest.mark.parametrize("environ, expected", [
    ({"OMP_NUM_THREADS": "3"}, 3),
    ({"OMP_NUM_THREADS": "12"}, 12),  # more than the cores: the user's choice still
    ({"MKL_NUM_THREADS": "5"}, 5),
    ({"OMP_NUM_THREADS": "3", "MKL_NUM_THREADS": "5"}, 5),  # torch's order: MKL's wins
    ({"OMP_NUM_THREADS": "4,2"}, 4),  # an OpenMP list: the outer level
    ({"OMP_NUM_THREADS": " "}, 1),  # blank is unset: the split (2 cores, a kernel worker: 1)
])
def test_the_user_s_setting_is_kept(environ, expected):
    assert threads.thread_count(runs=1, isolated=True, cores=2, environ=environ) == expected


@pytest.mark.parametrize("value", ["0", "-1", "two", "1.5"])
def test_a_user_setting_that_is_not_a_thread_count_is_an_error_naming_it(value):
    with pytest.raises(InvalidArgument, match=f"OMP_NUM_THREADS='{value}' is not a thread count.*>= 1"):
        threads.thread_count(runs=1, isolated=True, cores=2, environ={"OMP_NUM_THREADS": value})


@pytest.mark.parametrize("runs", [0, -1, 1.5, True])
def test_fit_threads_refuses_a_run_count_that_is_not_one(runs):
    with pytest.raises(InvalidArgument, match=f"runs={runs!r}"):
        threads.fit_threads(runs=runs)


@pytest.fixture
def restored_threads(monkeypatch):
    """This process's torch threads, the oracles' given count and the policy's run count, as they were."""
    monkeypatch.setattr(threads, "_RUNS", threads._RUNS)
    monkeypatch.setattr(_threads, "_process_threads", _threads._process_threads)
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_fit_threads_sets_this_process_and_the_oracles_compiled_kernels(monkeypatch, restored_threads):
    from reference_impls._compiled import numba, thread_budget

    for name in (*threads.USER_THREADS_ENV, _threads.THREADS_ENV):
        monkeypatch.delenv(name, raising=False)
    torch.set_num_threads(3)  # not what the policy decides below (8 cores: 4 or 2)
    monkeypatch.setattr(threads, "available_cores", lambda: 8)
    assert threads.fit_threads(runs=2) == threads.thread_count(runs=2) == (2 if isolation.default_isolation()
                                                                          == "process" else 4)
    assert torch.get_num_threads() == threads.thread_count()
    assert threads.worker_thread_count() == 2  # the run count is remembered for the kernel workers
    if numba is not None:
        assert thread_budget() == min(threads.thread_count(), numba.config.NUMBA_NUM_THREADS)
        monkeypatch.setenv(_threads.THREADS_ENV, "1")  # the user's setting for the oracles wins
        assert thread_budget() == 1


def test_fit_threads_keeps_the_user_s_setting(monkeypatch, restored_threads):
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    monkeypatch.delenv("MKL_NUM_THREADS", raising=False)
    assert threads.fit_threads(runs=2) == 3
    assert torch.get_num_threads() == 3 and threads.worker_thread_count() == 3


# ------------------------------------------------------------------------------- the processes, asked
def reports_its_threads(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """A "kernel" that returns the thread counts of the process it runs in: torch's intra-op and the
    oracles' compiled kernels'."""
    from reference_impls._threads import process_threads

    return torch.tensor([torch.get_num_threads(), process_threads()], dtype=torch.float64)


def _asked_in_a_worker() -> list[int]:
    isolation.shutdown()  # a fresh worker: one started before this test decided by its own setting
    try:
        status, value, _ = isolation.run(isolation.KernelRef("callable", reports_its_threads, "linear_scan"),
                                         "call", (torch.ones(1, 1, 1), torch.ones(1, 1, 1)), {}, timeout_s=60)
    finally:
        isolation.shutdown()
    assert status == "ok", value
    return [int(v) for v in value.tolist()]


def test_a_kernel_worker_runs_on_its_share_of_the_cores(monkeypatch):
    for name in (*threads.USER_THREADS_ENV, _threads.THREADS_ENV):
        monkeypatch.delenv(name, raising=False)
    share = threads.worker_thread_count()
    assert share == threads.thread_count(isolated=True) <= max(1, len(os.sched_getaffinity(0)) // 2)
    assert _asked_in_a_worker() == [share, share]


def test_a_kernel_worker_keeps_the_user_s_setting(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    monkeypatch.delenv("MKL_NUM_THREADS", raising=False)
    assert _asked_in_a_worker() == [3, 3]


@pytest.mark.e2e
def test_the_harness_command_and_its_kernel_worker_run_on_their_share(tmp_path):
    """``harness check``: its own process (the oracle, the measurement) and the kernel's worker both, asked: the
    kernel writes its worker's count to a file, and the command's process prints its own when the run is over."""
    kernel = tmp_path / "scan_reporting_threads.py"
    kernel.write_text(textwrap.dedent("""\
        import os

        import torch


        def scan(a, b):
            with open(os.environ["THREADS_SEEN"], "a") as fh:
                fh.write(f"{torch.get_num_threads()}\\n")
            h, out = torch.zeros_like(b[..., 0]), []
            for t in range(b.shape[-1]):
                h = a[..., t] * h + b[..., t]
                out.append(h)
            return torch.stack(out, -1)
        """))
    seen = tmp_path / "seen.txt"
    script = textwrap.dedent(f"""\
        import torch
        from harness.cli import main
        from reference_impls._threads import process_threads
        code = main(["check", "--kernel", {str(kernel) + ':scan'!r}, "--family", "linear_scan", "--dtypes",
                     "float64", "--max-examples", "2", "--no-grad", "--report-dir", {str(tmp_path / 'run')!r},
                     "--cases-dir", {str(tmp_path / 'cases')!r}])
        print("PARENT", code, torch.get_num_threads(), process_threads())
        """)
    env = {k: v for k, v in os.environ.items()
           if k not in (*threads.USER_THREADS_ENV, _threads.THREADS_ENV, "HARNESS_ISOLATION")}
    env["THREADS_SEEN"] = str(seen)
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    share = threads.thread_count(runs=1, isolated=True, environ=NO_USER_SETTING)
    parent = [line.split()[1:] for line in done.stdout.splitlines() if line.startswith("PARENT ")]
    assert parent == [["0", str(share), str(share)]], (done.stdout, done.stderr)
    counts = seen.read_text().split()
    assert counts and set(counts) == {str(share)}, counts


# ----------------------------------------------------------------------------------------- same bits
#: One problem per family, each large enough that torch runs its whole-tensor operations (and the
#: compiled kernels their rows) on several threads when it has them; and the dtypes the baselines run in.
BITS_PROBLEMS = [
    Problem(family="linear_scan", length=2048, batch=2, dim=16, dtype="float32", seed=1),
    Problem(family="selective_scan", length=512, batch=2, dim=16, state=8, dtype="bfloat16", seed=2, has_D=True,
            has_z=True, has_delta_bias=True, delta_softplus=True),
    Problem(family="retention", length=512, batch=2, heads=2, dk=16, dv=16, dtype="float32", seed=3),
    Problem(family="retention_normed", length=512, batch=2, heads=2, dk=16, dv=16, dtype="float16", seed=4,
            eps=1e-6),
    Problem(family="simple_gla", length=512, batch=2, heads=2, dk=16, dv=16, dtype="float32", seed=5,
            has_initial_state=True, final_state=True),
    Problem(family="gla", length=512, batch=2, heads=2, dk=16, dv=16, dtype="bfloat16", seed=6),
    Problem(family="ssd", length=512, batch=2, heads=2, dk=16, dv=16, state=8, groups=1, dtype="float32", seed=7,
            chunk_size=64),
]


def _oracle_tensors(problem: Problem, inputs: dict[str, torch.Tensor]) -> list[tuple[str, torch.Tensor]]:
    """Every tensor the oracle gives the measurement: each target's trace (output and companions), the
    same-dtype baseline, and the gradients of the differentiable oracle along a fixed cotangent."""
    found = []
    for target, trace in reference_traces(problem, inputs).items():
        found += [(f"{target}.{f.name}", getattr(trace, f.name)) for f in dataclasses.fields(trace)
                  if isinstance(getattr(trace, f.name), torch.Tensor)]
    for target, value in (baseline_outputs(problem, inputs) or {}).items():
        found.append((f"baseline.{target}", value))
    names = [k for k in problem.definition.grad_inputs if k in inputs]
    x = {k: v.detach().to(torch.float64).requires_grad_(k in names) for k, v in inputs.items()}
    with torch.enable_grad():
        out = problem.definition.differentiable(problem, x, RETNET)
        cot = torch.randn(out.shape, generator=torch.Generator().manual_seed(problem.seed), dtype=out.dtype)
        grads = torch.autograd.grad(out, [x[k] for k in names], cot, allow_unused=True)
    found += [(f"grad.{k}", g) for k, g in zip(names, grads) if g is not None]
    return found


@pytest.mark.e2e  # every family's trace, gradients and loop twice: seconds each
@pytest.mark.parametrize("problem", BITS_PROBLEMS, ids=lambda p: f"{p.family.value}-{p.dtype}")
def test_the_oracles_give_the_same_bits_at_one_thread_and_at_two(problem, restored_threads):
    inputs = problem.make_inputs()
    runs = {}
    for count in (1, 2):
        torch.set_num_threads(count)
        _threads.set_process_threads(count)
        runs[count] = _oracle_tensors(problem, inputs)
    assert [name for name, _ in runs[1]] == [name for name, _ in runs[2]]
    differ = [name for (name, one), (_, two) in zip(runs[1], runs[2]) if not isolation.same_bits(one, two)]
    assert not differ, f"{problem.family.value}: these differ between 1 and 2 threads: {differ}"
