"""The gated planted bugs (`tests.planted.gated`) are caught by a comparison with the float64 oracle.

For each bug: on a hand-made case that exposes it the kernel is ``divergent`` (an output or final-state
element outside ``u (growth + chunk_growth + CHUNK_DEPTH magnitude)``, or not finite where the oracle
is), on a case that does not expose it the same comparison passes, and the correct in-tree chunk kernel
passes on every case. The bug's ``exposes`` predicate agrees with what the comparison found. The search
that finds each one through the harness (``harness.api.check`` under the ``ci`` profile) comes with the
gated families' wiring in problems and strategies.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from harness.kernels import gated_forms as gf
from reference_impls import gated_decay as gd
from tests.planted.gated import GATED_PLANTED, by_name

UNIT = {torch.float64: 2.0**-53, torch.float32: 2.0**-24}
#: As in tests/test_gated_forms.py: the chunk forms' extra roundings per term.
CHUNK_DEPTH = 4


def _case(seed, *, per_key, length, dtype=torch.float64, lo=-1.0, g_value=None, h0=False, cu=None,
          final=False, chunk_size=8, batch=None):
    g = torch.Generator().manual_seed(seed)
    batch = batch or (1 if cu is not None else 2)
    heads, dk, dv = 2, 3, 4
    q, k = (torch.randn(batch, length, heads, dk, generator=g, dtype=torch.float64) for _ in range(2))
    v = torch.randn(batch, length, heads, dv, generator=g, dtype=torch.float64)
    shape = (batch, length, heads, dk) if per_key else (batch, length, heads)
    lg = lo * torch.rand(shape, generator=g, dtype=torch.float64) if g_value is None else torch.full(shape, g_value,
                                                                                                     dtype=torch.float64)
    rows = batch if cu is None else len(cu) - 1
    state = torch.randn(rows, heads, dk, dv, generator=g, dtype=torch.float64) if h0 else None
    return {"inputs": (q, k, v, lg), "initial_state": state, "cu_seqlens": None if cu is None else torch.tensor(cu),
            "output_final_state": final, "chunk_size": chunk_size, "dtype": dtype, "per_key": per_key}


def divergent(fn, case) -> bool:
    """Whether ``fn`` is outside the oracle's chunk-aware rounding bound on ``case`` (output or final state)."""
    q, k, v, lg = case["inputs"]
    dtype = case["dtype"]
    trace_fn = gd.gla_trace if case["per_key"] else gd.simple_gla_trace
    tr = trace_fn(q, k, v, lg, initial_state=case["initial_state"], output_final_state=case["output_final_state"],
                  cu_seqlens=case["cu_seqlens"], chunk_size=case["chunk_size"]).with_chunk_growth()
    h0 = None if case["initial_state"] is None else case["initial_state"].to(dtype)
    o, final = fn(*(x.to(dtype) for x in (q, k, v, lg)), initial_state=h0,
                  output_final_state=case["output_final_state"], cu_seqlens=case["cu_seqlens"],
                  chunk_size=case["chunk_size"])
    pairs = [(o, tr.out)] + ([(final, tr.final_state)] if case["output_final_state"] else [])
    for got, t in pairs:
        got = got.double()
        if not torch.isfinite(got).all():
            assert torch.isfinite(t.out).all()
            return True
        bound = UNIT[dtype] * (t.growth + CHUNK_DEPTH * t.magnitude)
        if ((got - t.out).abs() > bound).any():
            return True
    return False


def _problem(case) -> SimpleNamespace:
    q = case["inputs"][0]
    cu = case["cu_seqlens"]
    return SimpleNamespace(length=q.shape[1], chunk_size=case["chunk_size"],
                           has_initial_state=case["initial_state"] is not None,
                           final_state=case["output_final_state"], cu_seqlens=None if cu is None else cu.tolist(),
                           regime=case.get("regime", "trained"))


CASES = {
    "gla_chunk_cross_decay_exclusive": [
        (True, _case(1, per_key=True, length=20)),
        (False, _case(2, per_key=True, length=6)),
        (True, _case(3, per_key=True, length=6, h0=True)),
    ],
    "simple_gla_initial_state_not_decayed": [
        (True, _case(4, per_key=False, length=5, h0=True)),
        (True, _case(5, per_key=False, length=20, h0=True, final=True)),
        (False, _case(6, per_key=False, length=20, final=True)),
    ],
    "gla_varlen_state_leaks": [
        (True, _case(7, per_key=True, length=15, cu=[0, 7, 15])),
        (True, _case(8, per_key=True, length=15, cu=[0, 7, 15], h0=True, final=True)),
        (False, _case(9, per_key=True, length=15, cu=[0, 15], h0=True, final=True)),
        (False, _case(10, per_key=True, length=15, h0=True, final=True)),
    ],
    "gla_varlen_leaks_at_chunk_starts": [
        (True, _case(17, per_key=True, length=17, cu=[0, 8, 17])),  # a sequence starts at chunk 8's start
        (True, _case(18, per_key=True, length=20, cu=[0, 3, 16, 20], h0=True, final=True)),
        (False, _case(19, per_key=True, length=17, cu=[0, 7, 17], h0=True, final=True)),
        (False, _case(20, per_key=True, length=17, cu=[0, 9, 17])),
    ],
    "simple_gla_final_state_one_step_early": [
        (True, _case(11, per_key=False, length=9, final=True)),
        (True, _case(12, per_key=False, length=1, final=True, h0=True)),
        (False, _case(13, per_key=False, length=9)),
    ],
    "simple_gla_chunk_cumprod_unbounded": [
        (True, {**_case(14, per_key=False, length=20, g_value=-20.0, dtype=torch.float32), "regime": "strong_decay"}),
        (False, _case(15, per_key=False, length=20, lo=-0.5, dtype=torch.float32)),
        (False, {**_case(16, per_key=False, length=20, g_value=-20.0), "regime": "strong_decay"}),  # float64's range
    ],
}


def test_every_gated_bug_has_cases():
    assert {bug.name for bug in GATED_PLANTED} == set(CASES)
    for bug in GATED_PLANTED:
        assert bug.fn.__doc__ and bug.description and bug.capabilities.takes_chunk
        assert bug.spec.name == f"planted.{bug.name}" and bug.spec.family is bug.family
        assert any(exposed for exposed, _ in CASES[bug.name]) and not all(exposed for exposed, _ in CASES[bug.name])


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_oracle_comparison_catches_the_bug_where_it_shows(name):
    bug = by_name(name)
    for exposed, case in CASES[name]:
        assert divergent(bug.fn, case) is exposed, (name, exposed)
        if name != "simple_gla_chunk_cumprod_unbounded":  # that one is a regime, and float64 has more room
            assert bug.exposes(_problem(case)) is exposed


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_correct_chunk_kernel_passes_the_same_cases(name):
    for _, case in CASES[name]:
        correct = gf.gla_chunk if case["per_key"] else gf.simple_gla_chunk
        assert not divergent(correct, case)
        recurrent = gf.gla_recurrent if case["per_key"] else gf.simple_gla_recurrent
        assert not divergent(recurrent, case)


def test_a_wrong_final_state_s_message_shows_the_final_state_not_the_output():
    """A kernel whose outputs are right and whose final state is wrong failed with the output's numbers:
    "Mismatched elements: 0 / 1", ACTUAL equal to DESIRED, and the final state's values nowhere. The
    message now says the final state diverges and shows its worst element."""
    import re

    from harness.api import check
    from tests.planted.gated import by_name

    bug = by_name("simple_gla_final_state_one_step_early")
    result = check(bug.spec, profile="ci", dtypes=("float64",), max_examples=25, grad=False,
                   save_counterexample=False, shrink_deadline_s=10.0, isolation="in-process")
    assert not result.passed and result.failure.get("verdict_target") == "final_state", result.message
    text = result.message
    assert text.startswith("The kernel's final state diverges"), text
    actual = float(re.search(r"ACTUAL +(\S+)", text).group(1))
    desired = float(re.search(r"DESIRED +(\S+)", text).group(1))
    assert actual != desired and "Mismatched elements: 0 /" not in text, text
    assert "(sequence=" in text, text  # the final state's axes name the worst element
