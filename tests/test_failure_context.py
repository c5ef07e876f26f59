"""What a failure message says around a shrunk case (blind hunt 26a, the gated families).

- A failing final state was shown with its own shape's first axis (its sequences) as the case's L: "shape
  (1, 2, 16, 9), L=1" and "first mismatch at t=0 of 1" for a case of L = 1,669. The case line now gives the
  case's L (and its chunk size, with L mod chunk_size), and the onset its sequence.
- A chunk form that leaves its last, partial chunk unscaled shrank below one chunk, where the whole output is
  that chunk and reads "the scale= passed was ignored" (`constant_factor`), the words a kernel that ignores
  ``scale=`` gets; every larger case was a ``kernel_bug`` from the partial chunk's first step. The message now
  says so ("Larger cases: kernel_bug ..."), and an onset at a chunk's first step says which chunk.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from harness.api import failure_message, larger_cases_unnamed, named_on_larger_cases, user_kernel_spec
from harness.cli import search_outcome
from harness.kernels import gated_forms as gf
from harness.kernels.contract import Capabilities, KernelSpec
from harness.problems import Problem
from harness.runner import RunOptions, run_case
from harness.verdict import Policy, chunk_position


def _state_decayed_once_more(q, k, v, g, scale=None, initial_state=None, output_final_state=False,
                             cu_seqlens=None, chunk_size=16):
    out, state = gf.simple_gla_chunk(q, k, v, g, scale, initial_state, output_final_state, None, chunk_size)
    if state is not None:
        state = state * g[:, -1].exp().transpose(0, 1).reshape(1, -1, 1, 1)
    return out, state


def test_a_failing_final_state_s_message_gives_the_case_s_length_and_its_sequence():
    spec = KernelSpec(name="planted.final_state_decayed", family="simple_gla", load=lambda: _state_decayed_once_more,
                      capabilities=Capabilities(dtypes=("float64",), final_state=True, scale=True,
                                                chunk_sizes=(16,)), source="test")
    record = run_case(spec, Problem("simple_gla", 21, dtype="float64", batch=1, heads=2, dk=8, dv=4, seed=3,
                                    final_state=True, chunk_size=16), RunOptions())
    assert record["verdict"] == "divergent" and record.get("verdict_target") == "final_state", record["why"]
    message = failure_message(record, Policy())
    assert "shape (1, 2, 8, 4) (the final state's), L=21, chunk_size 16 (L mod chunk_size = 5)" in message, message
    assert "Onset: first mismatch in sequence 0 of 1\n" in message, message
    assert "from sequence 0" in record["why"] and "from t=" not in record["why"], record["why"]


@pytest.mark.parametrize("t, length, chunk, said", [
    (256, 257, 32, " (the first step of chunk 8, the last and partial one)"),
    (32, 257, 32, " (the first step of chunk 1)"),
    (256, 288, 32, " (the first step of chunk 8)"),  # the last chunk, but a whole one
    (0, 1, 16, " (the first step of chunk 0, the last and partial one)"),
    (33, 257, 32, ""), (256, 257, None, ""), (None, 257, 32, ""),
])
def test_chunk_position(t, length, chunk, said):
    assert chunk_position(t, length, chunk) == said


def _record(cause, n, length, onset, chunk=32, verdict="divergent"):
    return {"kernel": "k", "verdict": verdict, "cause": cause, "n_elements": n, "length": length, "onset_t": onset,
            "chunk_size": chunk, "dtype": "float64", "regime": "trained", "mode": None,
            "why": "cond error 5 > threshold 1" + ("; constant factor: ... scale= passed was ignored"
                                                  if cause == "constant_factor" else "")}


def test_a_convention_named_on_a_shrunk_case_says_its_larger_cases_were_a_kernel_bug():
    shrunk = _record("constant_factor", 1, 1, 0, chunk=16)
    larger = [_record("kernel_bug", 257, 257, 256), _record("kernel_bug", 514, 257, 256, chunk=16),
              _record("constant_factor", 4, 4, 0)]
    records = [*larger, shrunk]
    assert larger_cases_unnamed(shrunk, records)
    line = named_on_larger_cases(shrunk, records)
    assert line.startswith("Larger cases: kernel_bug (2 of the search's 4 divergent cases; e.g. float64 L=257 "
                           "chunk_size 16, first mismatch at t=256 (the first step of chunk 16, the last and partial "
                           "one)): this case's constant_factor may be how the bug looks"), line
    outcome = search_outcome(SimpleNamespace(records=records, failure=shrunk, regimes=("trained",)))
    assert outcome.startswith("divergent, constant_factor") and "shrunk to L=1;" in outcome, outcome
    assert "larger cases: kernel_bug" in outcome, outcome
    # a convention that the larger cases name too is left as it is
    same = [_record("constant_factor", 257, 257, 0), shrunk]
    assert not larger_cases_unnamed(shrunk, same) and named_on_larger_cases(shrunk, same) is None


def test_a_shrunk_kernel_bug_says_where_its_larger_chunked_cases_started():
    """The same unscaled tail chunk in float16 shrank to one step, a plain kernel_bug; every larger case had
    started at its last, partial chunk's first step."""
    shrunk = _record("kernel_bug", 2, 1, 0, chunk=16)
    tail = [_record("kernel_bug", 1143, 1143, 1088, chunk=64), _record("kernel_bug", 257, 257, 256),
            _record("kernel_bug", 8, 8, 0)]  # one chunk: no evidence either way
    line = named_on_larger_cases(shrunk, [*tail, shrunk])
    assert line == ("Larger cases: all 2 of the search's divergent cases of more than one chunk first mismatch at "
                    "the first step of their last, partial chunk (e.g. float64 L=1143 chunk_size 64: t=1088): a slip "
                    "in the tail chunk, where L is not a multiple of chunk_size"), line
    boundary = [_record("kernel_bug", 128, 128, 32), _record("kernel_bug", 96, 96, 64)]
    assert "at a chunk boundary (e.g. float64 L=128 chunk_size 32: t=32): a slip at the chunk boundaries" in \
        named_on_larger_cases(shrunk, [*boundary, shrunk])
    for mixed in ([*boundary, _record("kernel_bug", 100, 100, 40)],  # one starts inside a chunk
                  [*boundary, _record("kernel_bug", 100, 100, 0)],  # one is wrong from the start
                  boundary[:1]):  # one case is no pattern
        assert named_on_larger_cases(shrunk, [*mixed, shrunk]) is None, mixed
