"""Hostile kernels cost one record each, never the run (`harness.kernels.isolation`).

Each test runs a kernel that misbehaves (tests/hostile/kernels.py) between correct ones, in worker
processes (the CLI's default; the suite's own default is in-process, see conftest.py), and asserts the
outcome it must be recorded with and that every record taken before it is still there.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from harness.api import check, user_kernel_spec
from harness.problems import Problem
from harness.runner import RunOptions, run_case, run_cases
from harness.store import RunStore, load_header, load_records

pytestmark = pytest.mark.e2e  # end to end: `make test-all`

ROOT = Path(__file__).resolve().parents[2]
KERNELS = Path(__file__).resolve().parent / "kernels.py"
ISOLATED = RunOptions(timeout_s=20.0, isolation="process")


def spec(name: str):
    return user_kernel_spec(f"{KERNELS}:{name}", family="linear_scan")


def problem(length: int = 17, seed: int = 1) -> Problem:
    return Problem(family="linear_scan", length=length, dtype="float32", batch=2, dim=3, seed=seed)


def harness(cwd: Path, *args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("HARNESS_ISOLATION", None)
    return subprocess.run([sys.executable, "-m", "harness", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)


def _out(proc) -> str:
    return f"exit {proc.returncode}\n--- stdout\n{proc.stdout[-3000:]}\n--- stderr\n{proc.stderr[-3000:]}"


def _between_correct_runs(tmp_path: Path, name: str, options: RunOptions = ISOLATED) -> list[dict]:
    """correct, NAME, correct, NAME, correct: the records as stored, in order."""
    cases = [(spec(n), problem(seed=i)) for i, n in enumerate(["correct", name, "correct", name, "correct"])]
    with RunStore(tmp_path / "run") as store:
        run_cases(cases, options, store=store)
    return [json.loads(line) for line in (tmp_path / "run" / "records.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("name, says", [("exits", "exited with code 3"), ("segfaults", "killed by signal SIGSEGV"),
                                        ("killed", "killed by signal SIGKILL (what the out-of-memory killer sends")])
def test_a_crash_costs_one_record(tmp_path, name, says):
    stored = _between_correct_runs(tmp_path, name)
    assert [r["outcome"] for r in stored] == ["ok", "crashed", "ok", "crashed", "ok"]
    assert [r["verdict"] for r in stored] == ["equivalent", "kernel_error", "equivalent", "kernel_error", "equivalent"]
    crashed = stored[1]
    assert crashed["cause"] == "crashed" and says in crashed["error"], crashed["error"]
    assert name + ":" in crashed["error"], "the worker's last output belongs in the record"
    assert crashed["isolation"] == "process"


def test_a_crashing_kernel_in_harness_check_keeps_every_record(tmp_path):
    proc = harness(tmp_path, "check", "--family", "linear_scan", "--kernel", f"{KERNELS}:segfaults_from_length_5",
                   "--profile", "ci", "--dtypes", "float32", "--max-length", "64", "--max-examples", "12",
                   "--report-dir", "run", "--cases-dir", "cases")
    assert proc.returncode == 1, _out(proc)
    assert "crashed" in proc.stdout and "SIGSEGV" in proc.stdout, _out(proc)
    records = load_records(tmp_path / "run")
    outcomes = {r["outcome"] for r in records}
    assert outcomes == {"ok", "crashed"}, outcomes  # the cases before (and after) the crashes are kept
    assert all(r["length"] >= 5 for r in records if r["outcome"] == "crashed")
    saved = json.loads(next((tmp_path / "cases").glob("*.json")).read_text())
    assert saved["found"]["outcome"] == "crashed" and saved["problem"]["length"] == 5  # shrunk to the boundary
    index = (tmp_path / "run" / "index.md").read_text()
    assert "crashed" in index


def test_a_hang_is_recorded_once_and_the_run_goes_on(tmp_path):
    began = time.perf_counter()
    stored = _between_correct_runs(tmp_path, "hangs", RunOptions(timeout_s=0.5, isolation="process"))
    assert [r["outcome"] for r in stored] == ["ok", "timeout", "ok", "timeout", "ok"]
    assert "0.5 s" in stored[1]["error"]
    assert time.perf_counter() - began < 30


def test_check_stops_at_a_timeout_instead_of_shrinking_it(tmp_path):
    began = time.perf_counter()
    with RunStore(tmp_path / "run") as store:
        result = check(f"{KERNELS}:hangs", family="linear_scan", profile="ci", max_examples=20, timeout_s=0.5,
                       isolation="process", store=store, counterexample_dir=tmp_path / "cases")
    assert result.failure["outcome"] == "timeout" and not result.passed
    assert len(load_records(tmp_path / "run")) == 1  # recorded once: no shrinking, no replay of the hang
    assert "not shrunk or re-run" in result.message and "--timeout" in result.message
    assert result.counterexample is not None and result.counterexample.is_file()
    assert time.perf_counter() - began < 20


def test_a_one_ulp_flaky_kernel_is_nondeterministic_not_a_hypothesis_error(tmp_path):
    with RunStore(tmp_path / "run") as store:
        result = check(f"{KERNELS}:one_ulp_flaky", family="linear_scan", profile="ci", max_examples=10,
                       dtypes=("float32",), max_length=64, isolation="process", store=store,
                       counterexample_dir=tmp_path / "cases")
    assert result.failure is not None
    assert result.failure["outcome"] == "nondeterministic" and result.failure["verdict"] == "kernel_error"
    assert "nondeterministic" in result.message
    assert len(load_records(tmp_path / "run")) == len(result.records) >= 1


def _running(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie waiting to be reaped is not)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _live_helper_files() -> set[Path]:
    """The pid files in `HELPERS` of processes still running, the others removed: a pid the system reuses would
    otherwise find its file there from an earlier run and never look started (59 stale files in this machine's
    /tmp after many sessions made one of two helpers look never started)."""
    from tests.hostile.kernels import HELPERS

    if not HELPERS.is_dir():
        return set()
    for stale in [p for p in HELPERS.iterdir() if not _running(int(p.name))]:
        stale.unlink(missing_ok=True)
    return set(HELPERS.iterdir())


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="reads process states from /proc (Linux)")
@pytest.mark.xdist_group("hostile_helpers")
def test_a_helper_in_a_session_of_its_own_does_not_outlive_its_worker(tmp_path):
    """Out of the worker's process group, killing the group missed it (a blind hunt: 15 orphaned helpers); the
    worker's descendants are found in /proc and killed with it."""
    from harness.kernels import isolation
    from tests.hostile.kernels import HELPERS

    before = _live_helper_files()
    stored = _between_correct_runs(tmp_path, "starts_a_helper_in_its_own_session")
    assert [r["verdict"] for r in stored] == ["equivalent"] * 5, [r.get("why") for r in stored]
    started = [int(p.name) for p in set(HELPERS.iterdir()) - before]
    assert len(started) == 2 and all(_running(pid) and os.getsid(pid) != os.getsid(0) for pid in started)
    isolation.shutdown()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(_running(pid) for pid in started):
        time.sleep(0.1)
    assert not [pid for pid in started if _running(pid)], "the kernel's helpers outlived its worker"


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="reads process states from /proc (Linux)")
@pytest.mark.xdist_group("hostile_helpers")  # both count the pid files in HELPERS: never side by side
def test_a_helper_process_the_kernel_started_does_not_outlive_its_worker(tmp_path):
    from harness.kernels import isolation
    from tests.hostile.kernels import HELPERS

    before = _live_helper_files()
    stored = _between_correct_runs(tmp_path, "starts_helper")
    assert [r["verdict"] for r in stored] == ["equivalent"] * 5, [r.get("why") for r in stored]
    started = [int(p.name) for p in set(HELPERS.iterdir()) - before]
    assert len(started) == 2 and all(_running(pid) for pid in started)  # the kernel did start them
    # in a process group of the worker's own, in the harness's session (the CPU weight it was given, `nice`
    # and autogroup, holds for its workers too)
    assert all(os.getpgid(pid) != os.getpgid(0) and os.getsid(pid) == os.getsid(0) for pid in started)
    isolation.shutdown()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(_running(pid) for pid in started):
        time.sleep(0.1)
    assert not [pid for pid in started if _running(pid)], "the kernel's helpers outlived its worker"


@pytest.mark.xdist_group("hostile_helpers")  # both count the pid files in HELPERS: never side by side
def test_an_idle_worker_that_will_not_exit_is_killed_with_what_it_started(tmp_path):
    """Workers are let go by asking them to exit (`isolation.RETIRE_S`); one that cannot, because it waits for a
    child the kernel started, is killed after that grace, its child with it."""
    from harness.kernels import isolation
    from tests.hostile.kernels import HELPERS

    before = _live_helper_files()
    assert run_case(spec("keeps_a_child"), problem(), ISOLATED)["verdict"] == "equivalent"
    started = [int(p.name) for p in set(HELPERS.iterdir()) - before]
    assert len(started) == 1 and _running(started[0])
    began = time.monotonic()
    isolation.shutdown()
    took = time.monotonic() - began
    assert isolation.RETIRE_S - 0.1 <= took < isolation.RETIRE_S + 5, took  # the grace, then the kill
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and _running(started[0]):
        time.sleep(0.1)
    assert not _running(started[0]), "the kernel's child outlived its worker"


def test_a_worker_that_keeps_growing_is_replaced_before_it_takes_the_machine(tmp_path, monkeypatch):
    from harness.kernels import isolation

    monkeypatch.setattr(isolation, "RETAINED_LIMIT_BYTES", 150 << 20)
    cases = [(spec("keeps_memory"), problem(seed=i)) for i in range(6)]
    with RunStore(tmp_path / "run") as store:
        run_cases(cases, ISOLATED, store=store)
    stored = load_records(tmp_path / "run")
    assert [r["verdict"] for r in stored] == ["equivalent"] * 6  # measured as ever
    notes = [n for n in (r.get("isolation_note", "") for r in stored) if n]
    # 64 MiB kept a call: past 150 MiB at the third call of each worker, which is then replaced (twice in 6)
    assert len(notes) == 2, notes
    for note in notes:
        assert "more private memory after 3 call(s)" in note and "worker replaced" in note, note
        assert 190 <= int(note.split("kept ")[1].split(" MiB")[0]) <= 260, note
    isolation.shutdown()


def test_a_compiled_kernel_s_worker_leaves_no_semaphore_to_the_resource_tracker():
    """numba's thread pool, started in a worker by a compiled oracle-style kernel, registers a named
    semaphore; killed at exit, the worker left it to multiprocessing's resource tracker, which warned "There
    appear to be 1 leaked semaphore objects to clean up at shutdown" after every run with such a kernel. An
    idle worker now exits on its own, and its finalizers unlink the semaphore."""
    code = textwrap.dedent("""
        from harness.kernels.registry import get
        from harness.problems import Problem
        from harness.runner import RunOptions, run_case
        p = Problem(family="retention", length=16, dtype="float32", batch=1, heads=2, dk=8, dv=8, seed=1)
        print(run_case(get("intree.sequential_retention"), p, RunOptions(isolation="process"))["verdict"])
    """)
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.split() == ["equivalent"], _out(proc)
    assert "leaked semaphore" not in proc.stderr, _out(proc)


def test_a_leaked_thread_neither_keeps_the_harness_alive_nor_goes_unsaid(tmp_path):
    proc = harness(tmp_path, "check", "--family", "linear_scan", "--kernel", f"{KERNELS}:leaks_thread",
                   "--profile", "ci", "--dtypes", "float32", "--max-length", "32", "--max-examples", "3",
                   "--no-grad", "--report-dir", "run", timeout=120)
    assert proc.returncode == 0, _out(proc)  # and it returned: subprocess.run did not time out
    records = load_records(tmp_path / "run")
    assert len(records) == 3 and all(r["verdict"] == "equivalent" for r in records)
    assert all("leaked-prefetcher" in r.get("isolation_note", "") for r in records), records[0]


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_an_interrupted_run_keeps_its_records_and_says_it_is_partial(tmp_path, sig):
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.Popen([sys.executable, "-m", "harness", "check", "--family", "linear_scan", "--kernel",
                             f"{KERNELS}:slow", "--profile", "ci", "--dtypes", "float32", "--max-length", "16",
                             "--max-examples", "200", "--report-dir", "run"],
                            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            # an xdist worker ignores SIGINT, and a child inherits that (the harness then
                            # leaves it ignored, as a background job's): give the child the default back
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    records = tmp_path / "run" / "records.jsonl"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and (not records.is_file() or len(records.read_text().splitlines()) < 2):
        time.sleep(0.2)
    taken = len(records.read_text().splitlines())
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, f"exit {proc.returncode}\n{out[-2000:]}\n{err[-2000:]}"
    assert "Traceback" not in err, err
    assert len(load_records(tmp_path / "run")) >= taken >= 2
    header = load_header(tmp_path / "run")
    assert header["partial"] is True and header["status"].startswith("PARTIAL"), header
    assert "PARTIAL" in (tmp_path / "run" / "index.md").read_text()


def _children(pid: int) -> list[int]:
    """The live processes whose parent is ``pid`` (from /proc)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as fh:
                    fields = fh.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid and fields[0] != "Z":
                found.append(int(entry))
    return found


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc and relies on PR_SET_PDEATHSIG (Linux)")
def test_a_worker_hung_in_a_kernel_dies_with_a_killed_harness(tmp_path):
    """A worker leads its own process group (so closing it kills what the kernel started); a SIGKILL of the
    harness (a CI runner cancelling a job) must still not leave it running in its kernel forever."""
    script = tmp_path / "hang.py"
    script.write_text(textwrap.dedent(f"""
        import sys
        from harness.api import user_kernel_spec
        from harness.problems import Problem
        from harness.runner import RunOptions, run_case
        spec = user_kernel_spec({str(KERNELS)!r} + ":hangs", family="linear_scan")
        print("calling", flush=True)
        run_case(spec, Problem(family="linear_scan", length=5, dtype="float32", batch=1, dim=1, seed=1),
                 RunOptions(timeout_s=600.0, isolation="process"))
    """))
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.Popen([sys.executable, str(script)], env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "calling"
        deadline, workers = time.monotonic() + 60, []
        while time.monotonic() < deadline and not workers:  # harness -> forkserver -> worker
            workers = [w for server in _children(proc.pid) for w in _children(server)]
            time.sleep(0.2)
        assert workers, "no worker process was started"
        time.sleep(1.0)  # the worker is in the kernel now
        proc.kill()
        proc.wait(30)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and any(_running(w) for w in workers):
            time.sleep(0.2)
        assert not [w for w in workers if _running(w)], "a hung worker outlived the killed harness"
    finally:
        proc.kill()


@pytest.mark.skipif(not hasattr(signal, "SIGSTOP") or not hasattr(os, "sched_setaffinity"),
                    reason="stops a worker with SIGSTOP (POSIX)")
def test_time_the_run_was_stopped_is_not_a_timeout(monkeypatch):
    """The whole run stopped (SIGSTOP to its session, Ctrl-Z, a suspended laptop) for 3 s during a 2 s-timeout
    call of a kernel that needs 0.5 s of CPU: the harness's wait comes back 3 s late, and that time is given
    back (`isolation.PAUSED_S`). Before, the call timed out on resuming: a nightly calibration stopped for
    `make test` counted a correct SSD chunk form (1.6 s) as a 900 s timeout."""
    from multiprocessing.connection import Connection

    from harness.kernels import isolation

    real_poll, stopped = Connection.poll, []

    def poll_after_a_stop(conn, timeout=0.0):
        pids = [w.process.pid for w in isolation._WORKERS.values() if w.conn is conn]
        if pids and not stopped:  # the first wait for the kernel: the worker and this process stop for 3 s
            os.kill(pids[0], signal.SIGSTOP)
            stopped.append(pids[0])
            time.sleep(3.0)
            os.kill(pids[0], signal.SIGCONT)
        return real_poll(conn, timeout)

    monkeypatch.setattr(Connection, "poll", poll_after_a_stop)
    record = run_case(spec("needs_half_a_cpu_second_on_cpu0"), problem(), RunOptions(timeout_s=2.0, isolation="process"))
    assert stopped, "the worker was not found to stop"
    assert record["verdict"] == "equivalent", record.get("error") or record.get("why")
    assert record["t_kernel"] > 3.0


@pytest.mark.skipif(not os.path.isdir("/proc/self/task") or not hasattr(os, "sched_setaffinity"),
                    reason="reads a worker's CPU waiting time from /proc/PID/task/*/schedstat (Linux)")
def test_a_kernel_waiting_for_a_busy_cpu_is_given_that_time_back_not_a_timeout():
    """A 1 s timeout, a kernel that needs 0.5 s of CPU on a CPU that three other processes keep busy: it
    takes about 2 s, most of it runnable but waiting. The waiting is given back (a busy CI runner is not a
    hung kernel); a hung kernel (`test_a_hang_is_recorded_once_and_the_run_goes_on`) still times out on time."""
    from harness.kernels import isolation

    busy = "import os\nos.sched_setaffinity(0, {min(os.sched_getaffinity(0))})\nwhile True:\n    pass\n"
    hogs = [subprocess.Popen([sys.executable, "-c", busy]) for _ in range(3)]
    try:
        record = run_case(spec("needs_half_a_cpu_second_on_cpu0"), problem(),
                          RunOptions(timeout_s=1.0, isolation="process"))
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    assert record["verdict"] == "equivalent", record.get("error") or record.get("why")
    assert 1.0 < record["t_kernel"] < isolation.STARVED_TIMEOUT_FACTOR * 1.0  # past its timeout, on a busy CPU


@pytest.mark.parametrize("name, says, which", [
    ("writes_on_its_second_call", "on the second call (determinism check)", "input 'a'"),
    ("zeroes_b_in_training", "in the forward and backward with inputs requiring grad", "input 'b'"),
])
def test_a_write_into_an_input_on_any_call_is_mutated_input(name, says, which):
    """Only the first call's inputs were compared: a kernel that wiped ``b`` whenever it required grad (every
    training step) passed 15 of 15 equivalent (a blind hunt, session 22), one that wrote on its second call too."""
    from harness.gradients import gradient_case

    p = problem()
    options = RunOptions(timeout_s=20.0, isolation="process", check_determinism=True)
    if name == "writes_on_its_second_call":
        rec = run_case(spec(name), p, options)
        assert rec["verdict"] == "kernel_error" and rec["cause"] == "mutated_input", rec["why"]
    else:
        forward = run_case(spec(name), p, options)
        assert forward["verdict"] == "equivalent", forward["why"]  # without grad it writes nothing
        (rec,) = gradient_case(spec(name), p, options, forward=forward)
        assert rec["verdict"] == "kernel_error" and rec["cause"] == "mutated_input", rec["why"]
        (local,) = gradient_case(spec(name), p, RunOptions(timeout_s=None), forward=forward)  # in this process too
        assert local["cause"] == "mutated_input" and says in local["error"] and "input 'b'" in local["error"]
    assert says in rec["error"] and which in rec["error"], rec["error"]


def test_a_child_the_kernel_forks_does_not_answer_for_the_call(tmp_path):
    """The child of a ``fork`` inside the kernel returned into the worker's loop and sent its zeros as the call's
    result; every later record was then one call behind (a blind hunt: "returned shape (2, 2, 509), expected
    (1, 1, 1)" for an L=1 case). It now ends without a word, and each call gets its own answer."""
    records = _between_correct_runs(tmp_path, "forks_a_child_that_returns")
    assert [r["verdict"] for r in records] == ["equivalent"] * 5, [(r["kernel"], r["why"]) for r in records]


@pytest.mark.parametrize("name, outcome, says", [
    ("returns_sparse", "not_a_tensor", "a tensor of layout torch.sparse_coo"),
    ("raises_unprintable", "raised", "_Unprintable: <its str() raised RuntimeError>"),
    ("raises_30_mb", "raised", "(30,000,000 characters, cut)"),
])
def test_an_output_or_error_the_worker_cannot_pass_on_as_it_is_is_named(name, outcome, says):
    """A sparse output and an exception whose str() raises broke the worker's own code (reported as a crash with
    the harness's traceback); a 30 MB message went whole into every report file (1.26 GB)."""
    from harness.kernels.isolation import MAX_MESSAGE_CHARS

    rec = run_case(spec(name), problem(), ISOLATED)
    assert rec["verdict"] == "kernel_error" and rec["cause"] == outcome, rec["why"]
    assert says in rec["error"] and len(rec["error"]) < MAX_MESSAGE_CHARS + 500, rec["error"][:300]


def test_a_kernel_whose_output_carries_no_gradient_is_said_to_have_none_checked(tmp_path, capsys):
    from harness.cli import main

    code = main(["check", "--kernel", f"{KERNELS}:detaches", "--family", "linear_scan", "--dtypes", "float32",
                 "--max-examples", "2", "--max-length", "16", "--report-dir", str(tmp_path / "run")])
    out = capsys.readouterr().out
    assert code == 0 and "gradients: not checked for" in out and "its output carried no gradient in 2 case(s)" in out, out


def _simple_gla_state_as(kind: str):
    from reference_impls.gated_decay import simple_gla

    def kernel(q, k, v, g, scale=None, initial_state=None, output_final_state=False):
        out, state = simple_gla(q, k, v, g, scale, initial_state, output_final_state, compute_dtype=q.dtype)
        if output_final_state:
            state = state.double() if kind == "float64" else state.numpy()
        return out, state

    return kernel


@pytest.mark.parametrize("kind, outcome, says", [
    ("float64", "wrong_dtype", "final state of dtype torch.float64, expected torch.float32 (the case's)"),
    ("numpy", "not_a_tensor", "tuple whose element 1 is ndarray"),
])
def test_a_final_state_of_another_dtype_or_type_is_a_kernel_error(kind, outcome, says):
    """A float64 final state of a float32 case passed (its dtype was never looked at); a numpy one was "returned
    tuple, expected a torch.Tensor", as if the tuple were wrong."""
    p = Problem(family="simple_gla", length=9, dtype="float32", batch=1, heads=2, dk=4, dv=4, seed=1, final_state=True)
    rec = run_case(user_kernel_spec(_simple_gla_state_as(kind), family="simple_gla"), p, RunOptions(timeout_s=None))
    assert rec["verdict"] == "kernel_error" and rec["cause"] == outcome and says in rec["why"], (rec["cause"], rec["why"])


@pytest.mark.parametrize("length", [2, 17])
def test_a_kernel_that_returns_its_input_is_said_to(length):
    """Shrunk to shape (1, 1, 2), the swapped-axes reading made the oracle's output equal b and the cause read
    ``layout`` with the advice to transpose (a blind hunt); the why now says the output is the input."""
    p = Problem(family="linear_scan", length=length, dtype="float32", batch=1, dim=1, seed=4)
    rec = run_case(spec("returns_b"), p, RunOptions(timeout_s=None))
    assert rec["verdict"] == "divergent" and rec["cause"] == "kernel_bug", (rec["cause"], rec["why"])
    assert "the output is input 'b' as it was handed" in rec["why"], rec["why"]
