"""Planted-bug kernels of the gated-decay families: the bug classes the chunked GLA / Mamba-2 kernels had.

Each is the in-tree stable chunk form (`harness.kernels.gated_forms`) with one realistic mistake, in
fla's signature ``fn(q, k, v, g, scale=None, initial_state=None, output_final_state=False,
cu_seqlens=None, chunk_size=64) -> (o, final_state)``; its docstring names the mistake. `GATED_PLANTED`
lists them as `tests.planted.bugs.PlantedBug` entries (what exposes each, as words and as a predicate
on a `harness.problems.Problem` with the gated fields ``has_initial_state``, ``final_state``,
``cu_seqlens``, ``chunk_size``). They are kept out of `tests.planted.bugs.PLANTED` until the gated
families are wired into the problems and strategies; ``tests/test_gated_planted.py`` shows that a plain
float64 comparison with the oracle catches each one on a case that exposes it, and not elsewhere.
"""

from __future__ import annotations

import torch

from harness.kernels import gated_forms as gf
from harness.kernels.contract import Capabilities, Family
from harness.problems import Problem
from tests.planted.bugs import PlantedBug

__all__ = ["GATED_PLANTED", "by_name"]


def _fla(form, per_key: bool):
    """A kernel with fla's signature running ``form`` through `gated_forms`' sequence handling."""
    def kernel(q, k, v, g, scale=None, initial_state=None, output_final_state=False, cu_seqlens=None,
               chunk_size=gf.DEFAULT_CHUNK):
        return gf._run(form, q, k, v, g, scale, initial_state, output_final_state, cu_seqlens, chunk_size,
                       per_key=per_key)

    kernel.__doc__ = form.__doc__
    return kernel


# ------------------------------------------------------------------------------------------ the forms


def _cross_decay_exclusive_form(q, k, v, g, scale, h0, chunk_size):
    """The carried state is read with the exclusive cumulative decay ``exp(G_t - g_t)``, one step short.

    Position t of a chunk reads the state left by the chunks before it decayed by steps 1..t-1 of the
    chunk instead of 1..t (the index of the cumulative sum off by one at the chunk boundary). Exact in
    the first chunk without an initial state; wrong once L > chunk_size, or with an initial state.
    """
    state = gf._zero_state(q, v, h0)
    o = gf._output(q, v)
    for t0, t1, qc, kc, vc, G in gf.chunks(q, k, v, g, scale, chunk_size):
        exclusive = G - g[:, t0:t1].transpose(1, 2)
        o[:, :, t0:t1] = gf.intra_scores(qc, kc, G, G) @ vc + (qc * torch.exp(exclusive)) @ state
        state = gf.chunk_state(kc, vc, G, state)
    return o.transpose(1, 2), state


def _initial_state_not_decayed_form(q, k, v, g, scale, h0, chunk_size):
    """The initial state enters the first chunk undecayed: ``q_t S_0`` and ``S_0 + ...`` in place of
    ``q_t exp(G_t) S_0`` and ``exp(G_c) S_0 + ...``. Later chunks carry their state correctly. Exact
    without an initial state (S_0 = 0); wrong whenever one is given and the decay is not 1."""
    state = gf._zero_state(q, v, h0)
    o = gf._output(q, v)
    for t0, t1, qc, kc, vc, G in gf.chunks(q, k, v, g, scale, chunk_size):
        if t0 == 0:
            o[:, :, t0:t1] = gf.intra_scores(qc, kc, G, G) @ vc + qc @ state
            state = state + (kc * torch.exp(G[:, :, -1:] - G)).transpose(-1, -2) @ vc
        else:
            o[:, :, t0:t1] = gf.chunk_output(qc, kc, vc, G, state)
            state = gf.chunk_state(kc, vc, G, state)
    return o.transpose(1, 2), state


def _final_state_one_step_early_form(q, k, v, g, scale, h0, chunk_size):
    """The returned final state is the state before the last step: the last chunk's state update runs
    over its first n - 1 steps (a loop bound off by one). The outputs are right; the final state is
    wrong whenever it is asked for (T >= 1)."""
    state = gf._zero_state(q, v, h0)
    o = gf._output(q, v)
    steps = list(gf.chunks(q, k, v, g, scale, chunk_size))
    for i, (t0, t1, qc, kc, vc, G) in enumerate(steps):
        o[:, :, t0:t1] = gf.chunk_output(qc, kc, vc, G, state)
        if i == len(steps) - 1:
            kc, vc, G = kc[:, :, :-1], vc[:, :, :-1], G[:, :, :-1]
            if kc.shape[2] == 0:
                break
        state = gf.chunk_state(kc, vc, G, state)
    return o.transpose(1, 2), state


# -------------------------------------------------------------------------------------- the kernels


simple_gla_chunk_cumprod_unbounded = gf.simple_gla_chunk_cumprod
gla_chunk_cross_decay_exclusive = _fla(_cross_decay_exclusive_form, per_key=True)
simple_gla_initial_state_not_decayed = _fla(_initial_state_not_decayed_form, per_key=False)
simple_gla_final_state_one_step_early = _fla(_final_state_one_step_early_form, per_key=False)


def gla_varlen_state_leaks(q, k, v, g, scale=None, initial_state=None, output_final_state=False, cu_seqlens=None,
                           chunk_size=gf.DEFAULT_CHUNK):
    """Packed sequences run one after another from the state the previous one left.

    Each sequence of ``cu_seqlens`` starts from the previous sequence's final state instead of its own
    initial state (or zeros): the state is not reset at the boundary, as in a varlen kernel that
    indexes its state by batch row instead of by sequence. Exact without cu_seqlens and for the first
    sequence; wrong from the second sequence on.
    """
    if cu_seqlens is None:
        return gf.gla_chunk(q, k, v, g, scale, initial_state, output_final_state, None, chunk_size)
    bounds = [int(c) for c in cu_seqlens]
    carried = None if initial_state is None else initial_state[:1]
    outs, finals = [], []
    for t0, t1 in zip(bounds[:-1], bounds[1:]):
        o, carried = gf.gla_chunk(q[:, t0:t1], k[:, t0:t1], v[:, t0:t1], g[:, t0:t1], scale, carried, True, None,
                                  chunk_size)
        outs.append(o)
        finals.append(carried)
    return torch.cat(outs, dim=1), (torch.cat(finals) if output_final_state else None)


def gla_varlen_leaks_at_chunk_starts(q, k, v, g, scale=None, initial_state=None, output_final_state=False,
                                     cu_seqlens=None, chunk_size=gf.DEFAULT_CHUNK):
    """Packed sequences whose boundary falls on a chunk's start take the state the previous one left.

    A varlen chunk kernel that resets its state where a sequence starts inside a chunk but reads the chunk's
    carried state when the boundary is the chunk's first step (the sequence index read at the chunk's start
    instead of the step before). Exact unless a sequence starts exactly at a positive multiple of the chunk
    size (session 19's blind hunt: such cuts were never drawn, and the bug passed float32 to bfloat16).
    """
    if cu_seqlens is None:
        return gf.gla_chunk(q, k, v, g, scale, initial_state, output_final_state, None, chunk_size)
    bounds = [int(c) for c in cu_seqlens]
    carried = None
    outs, finals = [], []
    for i, (t0, t1) in enumerate(zip(bounds[:-1], bounds[1:])):
        own = None if initial_state is None else initial_state[i:i + 1]
        start = carried if t0 > 0 and t0 % chunk_size == 0 else own
        o, carried = gf.gla_chunk(q[:, t0:t1], k[:, t0:t1], v[:, t0:t1], g[:, t0:t1], scale, start, True, None,
                                  chunk_size)
        outs.append(o)
        finals.append(carried)
    return torch.cat(outs, dim=1), (torch.cat(finals) if output_final_state else None)


for _fn, _name in ((gla_chunk_cross_decay_exclusive, "gla_chunk_cross_decay_exclusive"),
                   (simple_gla_initial_state_not_decayed, "simple_gla_initial_state_not_decayed"),
                   (simple_gla_final_state_one_step_early, "simple_gla_final_state_one_step_early")):
    _fn.__name__ = _fn.__qualname__ = _name  # picklable by name


# ------------------------------------------------------------------------------------- the registry

#: What every gated planted kernel accepts: any chunk size, initial and final states, packed sequences.
GATED_CAPS = Capabilities(chunk_sizes=(), initial_state=True, final_state=True, varlen=True, matmuls=True,
                          scale=True)

GATED_PLANTED: list[PlantedBug] = [
    PlantedBug("simple_gla_chunk_cumprod_unbounded", Family.SIMPLE_GLA, simple_gla_chunk_cumprod_unbounded,
               "chunk form through exp(-cumsum): overflows to inf, 0 * inf = NaN under strong decay",
               exposed_by="float32, a chunk whose cumulative log-decay passes -88.7 (five steps of -20)",
               dtypes=("float32",), capabilities=GATED_CAPS,
               exposes=lambda p: p.regime in ("strong_decay", "mixed_heads")),
    PlantedBug("gla_chunk_cross_decay_exclusive", Family.GLA, gla_chunk_cross_decay_exclusive,
               "carried state read with the exclusive cumulative decay exp(G_t - g_t): one step short",
               exposed_by="L > chunk_size, or an initial state", capabilities=GATED_CAPS,
               exposes=lambda p: p.length > p.chunk_size or p.has_initial_state),
    PlantedBug("simple_gla_initial_state_not_decayed", Family.SIMPLE_GLA, simple_gla_initial_state_not_decayed,
               "initial state enters the first chunk without its decay", exposed_by="an initial state",
               capabilities=GATED_CAPS, exposes=lambda p: p.has_initial_state),
    PlantedBug("gla_varlen_state_leaks", Family.GLA, gla_varlen_state_leaks,
               "packed sequences: the state carried across cu_seqlens boundaries",
               exposed_by="cu_seqlens with two or more sequences", capabilities=GATED_CAPS,
               exposes=lambda p: p.cu_seqlens is not None and len(p.cu_seqlens) > 2),
    PlantedBug("gla_varlen_leaks_at_chunk_starts", Family.GLA, gla_varlen_leaks_at_chunk_starts,
               "packed sequences: the state carried across a boundary that falls on a chunk's start",
               exposed_by="cu_seqlens with a sequence starting at a positive multiple of the chunk size",
               capabilities=GATED_CAPS,
               exposes=lambda p: p.cu_seqlens is not None and p.chunk_size is not None
               and any(0 < c < p.length and c % p.chunk_size == 0 for c in p.cu_seqlens),
               witness=Problem(family="gla", length=17, dtype="float64", batch=1, heads=2, dk=3, dv=4, chunk_size=8,
                               has_initial_state=True, final_state=True, cu_seqlens=(0, 8, 17), seed=1)),
    PlantedBug("simple_gla_final_state_one_step_early", Family.SIMPLE_GLA, simple_gla_final_state_one_step_early,
               "final state taken one step early (before the last update)", exposed_by="the final state asked for",
               capabilities=GATED_CAPS, exposes=lambda p: bool(p.final_state)),
]


def by_name(name: str) -> PlantedBug:
    for bug in GATED_PLANTED:
        if bug.name == name:
            return bug
    raise KeyError(f"no gated planted bug named {name!r}; known: {[b.name for b in GATED_PLANTED]}")
