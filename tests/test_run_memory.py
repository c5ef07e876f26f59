"""What a long run holds between cases: the oracle cache within its byte budget, worker arenas let go.

A nightly calibration of the gated families (12 kernels, lengths to 32,768) was killed by the out-of-memory
killer at 11 GB resident (session 12): 7 GB of shared-memory arenas, one per worker at its largest call's
size, and the oracle cache's eight problems of inputs and five-field float64 traces. Both are bounded now.
"""

from __future__ import annotations

import pytest
import torch

from harness.kernels import isolation
from harness.kernels.registry import get
from harness.oracle_cache import OracleCache, tensor_bytes
from harness.problems import Problem
from harness.runner import RETNET, RunOptions, run_case


def _problem(seed: int, length: int = 64) -> Problem:
    return Problem(family="retention", length=length, dtype="float32", batch=1, heads=2, dk=16, dv=16, seed=seed)


def test_tensor_bytes_counts_each_storage_once_through_dicts_and_traces():
    x = torch.zeros(10, dtype=torch.float64)
    assert tensor_bytes({"a": x, "b": (x[2:], [x.view(2, 5)])}) == 80  # one storage, three views
    cache = OracleCache()
    p = _problem(1)
    traces = cache.traces(p, p.make_inputs(), RETNET)
    out = 1 * 64 * 2 * 16 * 8  # one float64 field of the output's size
    assert tensor_bytes(traces) == 5 * out  # out, magnitude, growth, state_peak, decay_peak


def test_the_cache_keeps_within_its_byte_budget_and_always_the_newest():
    p1, p2 = _problem(1), _problem(2)
    one_trace = tensor_bytes(OracleCache().traces(p1, p1.make_inputs(), RETNET))
    cache = OracleCache(max_bytes=one_trace + 1)
    a = cache.traces(p1, p1.make_inputs(), RETNET)
    assert cache.traces(p1, p1.make_inputs(), RETNET) is a  # a hit
    cache.traces(p2, p2.make_inputs(), RETNET)  # two would pass the budget: the older goes
    assert cache.traces(p1, p1.make_inputs(), RETNET) is not a and cache.stats == {"hits": 1, "misses": 3}
    tiny = OracleCache(max_bytes=0)  # nothing fits, yet the entry being used is kept
    b = tiny.traces(p1, p1.make_inputs(), RETNET)
    assert tiny.traces(p1, p1.make_inputs(), RETNET) is b and tiny.held_bytes() == one_trace
    unbounded = OracleCache(max_bytes=1 << 40)
    for p in (p1, p2):
        unbounded.traces(p, p.make_inputs(), RETNET)
    assert unbounded.held_bytes() == 2 * one_trace
    with pytest.raises(Exception, match="max_bytes=-1 must be a whole number of bytes >= 0"):
        OracleCache(max_bytes=-1)


def test_a_worker_lets_go_of_an_arena_larger_than_it_keeps(monkeypatch):
    monkeypatch.setattr(isolation, "ARENA_KEEP_BYTES", 1 << 22)  # the smallest arena, 4 MiB, is kept
    spec = get("intree.retention_recurrent")
    options = RunOptions(isolation="process")
    small, large = _problem(1, length=16), _problem(2, length=16384)  # q, k, v 6 MiB: an arena of 12 MiB
    assert run_case(spec, small, options)["verdict"] == "equivalent"
    ref, _ = isolation.kernel_ref(spec)
    worker = isolation._WORKERS[ref.key]
    assert worker.arena is not None and worker.arena.nbytes == 1 << 22
    assert run_case(spec, large, options)["verdict"] == "equivalent"
    assert worker.arena is None  # grown past what is kept: let go, here and in the worker
    assert run_case(spec, small, options)["verdict"] == "equivalent"  # the next call makes one again
    assert worker.arena is not None and worker.arena.nbytes == 1 << 22 and worker is isolation._WORKERS[ref.key]
    isolation.shutdown()
