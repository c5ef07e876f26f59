"""scripts/calibrate.py as a CI matrix: ``--shard K/N`` jobs draw every problem and run their share, and
``--from-records`` joins their records into the tables of the unsharded run."""

from __future__ import annotations

import collections
import json
import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
ARGS = ["--cases", "2", "--families", "linear_scan", "--dtypes", "float64,bfloat16", "--print", "--quiet"]


@pytest.fixture(scope="module")
def calibrate():
    sys.path.insert(0, str(ROOT / "scripts"))  # its sibling module docblock, as when run as a script
    try:
        spec = importlib.util.spec_from_file_location("calibrate_script", ROOT / "scripts" / "calibrate.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    return module


def _tables(text: str) -> str:
    return text.split("### Per dtype", 1)[1]  # past the command line and the time


def test_sharded_calibration_joins_to_the_unsharded_tables(calibrate, tmp_path, capsys):
    calibrate.main(ARGS + ["--records", str(tmp_path / "whole.jsonl")])
    whole = capsys.readouterr().out
    parts = []
    for k in (1, 2, 3):
        calibrate.main(ARGS + ["--shard", f"{k}/3", "--records", str(tmp_path / f"part{k}.jsonl")])
        capsys.readouterr()
        parts.append(tmp_path / f"part{k}.jsonl")
    sizes = [len(p.read_text().splitlines()) for p in parts]
    assert all(sizes) and sum(sizes) == len((tmp_path / "whole.jsonl").read_text().splitlines())
    calibrate.main(ARGS + ["--from-records", *map(str, parts)])
    joined = capsys.readouterr().out
    assert "joined from the jobs records" in joined and "false alarms" in joined
    assert _tables(joined) == _tables(whole)


def test_joining_refuses_overlapping_jobs_and_records_without_the_full_record(calibrate, tmp_path):
    part = tmp_path / "part.jsonl"
    calibrate.main(ARGS + ["--shard", "1/4", "--records", str(part)])
    with pytest.raises(SystemExit, match="overlap"):
        calibrate.load_rows([str(part), str(part)])
    old = tmp_path / "old.jsonl"
    old.write_text('{"kernel": "k", "case": "c", "position": 0}\n')
    with pytest.raises(SystemExit, match="no full record"):
        calibrate.load_rows([str(old)])


def test_every_kernel_of_a_problem_shares_one_draw_one_oracle_and_one_baseline(calibrate, monkeypatch):
    """The calibration runs each correct (and planted) kernel of a family on the same problem: the inputs,
    the float64 oracle and the same-dtype baseline are computed once per problem, not once per kernel (a
    monkeypatch on names the runner no longer called once made every kernel recompute all three)."""
    from harness import runner
    from harness.problems import Problem

    calls = {"inputs": [], "traces": [], "baselines": []}
    real = (Problem.make_inputs, runner.reference_traces, runner.baseline_outputs)

    def counting(name, fn):
        def wrapper(problem, *args):
            calls[name].append(problem.replace(chunk_size=None, tf32=False).key)
            return fn(problem, *args)
        return wrapper

    monkeypatch.setattr(Problem, "make_inputs", counting("inputs", real[0]))
    monkeypatch.setattr(runner, "reference_traces", counting("traces", real[1]))
    monkeypatch.setattr(runner, "baseline_outputs", counting("baselines", real[2]))
    rows = calibrate.run(2, 3, "ci", ("float32",), None, False, families=("retention",), planted_bugs=False)
    assert len(rows) >= 3 * len({r["problem"] for r in rows})
    assert not [r for r in rows if r["verdict"] == "divergent"]  # whose precision re-run draws its own oracle
    for name, keys in calls.items():
        assert len(keys) == len(set(keys)) == len({r["problem"] for r in rows}), (name, len(keys))


@pytest.mark.e2e
def test_a_calibration_keeps_one_worker_per_kernel_alive(calibrate, monkeypatch):
    """Each problem cycles through its family's kernels (here 7, over the default of 4 live workers): the
    run keeps one worker per kernel instead of restarting each kernel's worker, and its package import,
    on every case; the session's limit is restored afterwards."""
    from harness.kernels import isolation

    isolation.shutdown()
    started = []

    class Counting(isolation.Worker):
        def __init__(self, ref):
            started.append(ref.key)
            super().__init__(ref)

    monkeypatch.setattr(isolation, "Worker", Counting)
    monkeypatch.setattr(isolation._DEFAULTS, "isolation", "process")  # the tests' default is in-process
    rows = calibrate.run(3, 3, "ci", ("float32",), None, False, families=("linear_scan",))
    kernels = {r["kernel"] for r in rows}
    assert len(kernels) > isolation.MAX_WORKERS and len(rows) == 3 * len(kernels)
    assert len(started) == len(set(started)) == len(kernels), len(started)
    assert isolation.max_workers() == isolation.MAX_WORKERS and len(isolation._WORKERS) <= isolation.MAX_WORKERS


def test_the_worker_limit_is_checked_and_closes_the_least_recently_used(monkeypatch):
    from harness.errors import InvalidArgument
    from harness.kernels import isolation

    for bad in (0, -1, 2.5, True, "4"):
        with pytest.raises(InvalidArgument, match="max_workers"):
            isolation.configure(max_workers=bad)
    assert isolation.max_workers() == isolation.MAX_WORKERS

    closed, asked = [], []

    class Fake:
        def __init__(self, name):
            self.name = name

        def ask_to_exit(self):  # let go idle: asked to exit first (isolation.RETIRE_S), then closed
            asked.append(self.name)
            return False

        def descendants(self):  # what runs below it, killed with it (none here)
            return []

        def close(self, below=None):
            closed.append(self.name)

    monkeypatch.setattr(isolation, "_WORKERS", collections.OrderedDict((n, Fake(n)) for n in "abcd"))
    isolation._WORKERS.move_to_end("a")  # used last
    try:
        isolation.configure(max_workers=2)
        assert asked == closed == ["b", "c"] and list(isolation._WORKERS) == ["d", "a"]
    finally:
        isolation.configure(max_workers=isolation.MAX_WORKERS)


def test_with_grad_a_wrong_backward_of_a_correct_forward_is_a_false_alarm_and_the_right_ones_are_not(
        calibrate, monkeypatch):
    """``--grad`` differentiates the equivalent cases of autograd kernels (as `harness check` does): each
    input's gradient is a row, counted with the correct kernels. Without it a correct forward with a wrong
    backward passed the calibration unseen (only forwards were run)."""
    from harness.kernels.contract import Capabilities, KernelSpec
    from tests.test_gradients import _LeakyBackward

    leaky = KernelSpec(name="planted.leaky_backward", family="linear_scan", load=lambda: _LeakyBackward.apply,
                       capabilities=Capabilities(dtypes=("float64", "float32"), autograd=True), source="test")
    real = calibrate.kernels

    def with_leaky(third_party=False, planted_bugs=True, interpreted=False):
        correct, planted = real(third_party, planted_bugs, interpreted)
        return [*correct, (leaky, None)], planted

    monkeypatch.setattr(calibrate, "kernels", with_leaky)
    rows = calibrate.run(2, 3, "ci", ("float64",), None, False, families=("linear_scan",), planted_bugs=False,
                         grad=True)
    grads = [r for r in rows if r["record"].get("mode") == "grad"]
    assert {r["kernel"] for r in grads} >= {"intree.blelloch_scan:grad[a]", "intree.blelloch_scan:grad[b]",
                                            "planted.leaky_backward:grad[b]"}
    assert all(r["kind"] == "correct" for r in grads)
    per_dtype, _, alarms = calibrate.summarize(rows, ("float64",))
    assert alarms and {r["kernel"].split(":")[0] for r in alarms} == {"planted.leaky_backward"}  # no in-tree one
    assert per_dtype[0]["false alarms"].startswith(f"{len(alarms)} ")
    without = calibrate.run(2, 3, "ci", ("float64",), None, False, families=("linear_scan",), planted_bugs=False)
    assert not [r for r in without if r["verdict"] in calibrate.FAILING]  # forwards only: the wrong backward unseen


@pytest.mark.e2e
def test_the_interpreted_kernels_are_calibrated_alone_at_their_lengths(calibrate, tmp_path):
    """`--interpreted`: the third-party Triton kernels this CPU runs through the interpreter (left out of the
    nightly calibration, 1000 times slower), alone and at the profile's lengths for them."""
    from harness.settings import LIMITS

    correct, planted = calibrate.kernels(interpreted=True, planted_bugs=False)
    assert correct and not planted and all(spec.capabilities.slow for spec, _ in correct)
    names = {spec.name for spec, _ in correct}
    usual, _ = calibrate.kernels(third_party=True, planted_bugs=False)
    assert not names & {spec.name for spec, _ in usual}
    if "accelerated_scan.scalar" not in names:
        pytest.skip("accelerated-scan's Triton kernel is not available here")
    records = tmp_path / "r.jsonl"
    assert calibrate.main(["--interpreted", "--cases", "1", "--families", "linear_scan", "--dtypes", "float32",
                           "--profile", "ci", "--records", str(records), "--out", str(tmp_path / "c.md"),
                           "--quiet"]) == 0
    rows = [json.loads(line) for line in records.read_text().splitlines()]
    assert {r["kernel"] for r in rows} == {"accelerated_scan.scalar"}
    assert len(rows) == 1 and rows[0]["length"] <= LIMITS["ci"].slow_max_length


def test_states_draw_initial_states_final_states_and_packed_rows_without_moving_the_other_draws(calibrate):
    """``--states``: the gated families' problems carry initial states, final states and packed rows (the
    calibration drew none: those paths had only `harness check`'s ci searches as evidence). They come from the
    problem's own seed, so the run's draws stay the ones of a run without them, and `_fit` takes away what a
    kernel does not declare (a packed row cut where the fitted row ends)."""
    import random

    from harness.kernels import registry
    from harness.kernels.contract import Family

    def draws(states: bool):
        rng, out = random.Random(5), []
        for i in range(60):
            family = (Family.SIMPLE_GLA, Family.SSD, Family.RETENTION)[i % 3]
            p = calibrate.draw_problem(rng, family, "trained", "float32", chunked=True, profile="ci")
            out.append(calibrate.draw_states(p, chunk_grid=p.chunk_size) if states else p)
        return out

    plain, stated = draws(False), draws(True)
    assert [p.seed for p in plain] == [p.seed for p in stated]
    gated = [p for p in stated if p.family is not Family.RETENTION]
    assert all(p == q for p, q in zip(plain, stated) if p.family is Family.RETENTION)
    assert 0.25 < sum(p.has_initial_state for p in gated) / len(gated) < 0.75
    assert any(p.final_state for p in gated)
    packed = [p for p in gated if p.cu_seqlens is not None]
    assert packed and all(p.batch == 1 and p.cu_seqlens[0] == 0 and p.cu_seqlens[-1] == p.length for p in packed)
    assert calibrate.draw_states(stated[0]) == calibrate.draw_states(stated[0])  # seeded by the problem

    from dataclasses import replace

    full = next(s for s in registry.all_kernels() if s.family is Family.SIMPLE_GLA and s.capabilities.varlen
                and s.capabilities.initial_state and s.capabilities.final_state)
    bare = replace(full, capabilities=replace(full.capabilities, varlen=False, initial_state=False, final_state=False))
    p = next(p for p in packed if p.family is Family.SIMPLE_GLA).replace(has_initial_state=True, final_state=True)
    assert calibrate._fit(p, full).cu_seqlens == p.cu_seqlens and calibrate._fit(p, full).has_initial_state
    fitted = calibrate._fit(p, bare)
    assert (fitted.cu_seqlens, fitted.has_initial_state, fitted.final_state) == (None, False, False)
    long_ = p.replace(length=100, cu_seqlens=(0, 10, 60, 100))
    short = replace(full, capabilities=replace(full.capabilities, max_length=50))
    assert calibrate._fit(long_, short).cu_seqlens == (0, 10, 50)  # the cut past the fitted row is gone
    assert calibrate._fit(long_.replace(cu_seqlens=(0, 60, 100)), short).cu_seqlens is None
