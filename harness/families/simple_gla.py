"""``simple_gla``: fla's ``fn(q, k, v, g, scale=None, initial_state=None, output_final_state=False,
cu_seqlens=None) -> (o, final_state)``; q, k (batch, T, heads, K), v (batch, T, heads, V), g (batch, T,
heads) the log-decay; ``S_t = exp(g_t) S_{t-1} + k_t^T v_t``, ``o_t = K**-0.5 q_t S_t``
(`reference_impls.gated_decay`). The problem's ``dk`` is K and ``dv`` is V.

Targets: the output ``o`` always; the final state (batch, heads, K, V) as a second target when the
problem asks for it (``final_state``, for kernels that declare ``final_state``). ``has_initial_state``
passes an initial state; ``cu_seqlens`` packs several sequences in one row (batch 1).

Regimes (g is the log-decay, <= 0; q, k, v standard normal times the data scale):

- ``trained``: ``g = logsigmoid(z) / 16`` (fla's gate with its normalizer 16: decays near 0.96);
- ``long_memory``: ``g = -10**U(-4, -2)``: the state sums thousands of terms;
- ``strong_decay``: ``g = U(-30, 0)``: down to -20 per step and below, so that a cumulative sum over a
  64-step chunk (several hundred) leaves float32's exp range (-103 .. 88.7) and the chunk form's
  exponent of a difference of two large sums loses ``u * |cumsum|`` absolutely;
- ``mixed_heads``: per head a decay scale ``10**U(-3, 1.3)`` times ``logsigmoid(z)``: long-memory heads
  next to fast-forgetting ones in one call;
- ``large`` / ``tiny``: ``trained`` with q, k, v near the dtype's largest / smallest normal value
  (products of three factors: max**(1/4), tiny**(1/4) each);
- ``uniform_decay``: ``g = U(decay_floor, 0)`` (the problem's ``decay_floor``, -20 when None): the knob
  of the ``gated_decay`` sweep (error against decay strength; the issue's measurement is floor -20).

The chunk forms' bound: a kernel that takes a ``chunk_size`` is measured against ``u (growth +
chunk_growth)``, the oracle's chunk term (the within-chunk cumulative log-decay mass times the state's
absolute sum, `reference_impls.gated_decay`), so the precision an exponent of a difference of two
cumulative sums loses is rounding of the algorithm, named by its size, not a bug.
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, Any

import torch

from harness.errors import InvalidArgument
from harness.families.base import FamilyDef, draw_heads, randn, uniform
from harness.kernels.contract import Family

if TYPE_CHECKING:
    from reference_impls.trace import Trace

#: The log-decay ranges of hypothesis-drawn explicit values, per regime.
G_BOUNDS = {"long_memory": (-0.01, 0.0), "strong_decay": (-30.0, 0.0), "mixed_heads": (-20.0, 0.0)}


#: The floor of ``uniform_decay``'s log-decays when the problem gives none (the issue's measurement).
DEFAULT_DECAY_FLOOR = -20.0


def decay_floor(p) -> float:
    return DEFAULT_DECAY_FLOOR if p.decay_floor is None else float(p.decay_floor)


def check_decay_floor(p) -> None:
    """``decay_floor``: a finite number <= 0, meaningful for the ``uniform_decay`` regime only."""
    if p.decay_floor is None:
        return
    if p.regime != "uniform_decay":
        raise InvalidArgument(f"decay_floor={p.decay_floor!r} is only meaningful for regime 'uniform_decay' "
                              f"(regime={p.regime!r}); pass None")
    if not (isinstance(p.decay_floor, (int, float)) and -1e6 <= p.decay_floor <= 0):
        raise InvalidArgument(f"decay_floor={p.decay_floor!r} must be a number in [-1e6, 0] (the lowest log-decay)")


#: The ``scale`` values a case passes to a kernel that takes one (`Capabilities.scale`): not passed (its
#: default, K**-0.5) twice in four, then 1 and 0.25, neither of which is K**-0.5 but at K = 1 or 16.
SCALES: tuple[float | None, ...] = (None, None, 1.0, 0.25)


class StatefulFamily(FamilyDef):
    """A family whose kernels return ``(output, final_state)`` where asked: the gated families.

    The oracle's `GatedTrace` gives one trace per measured target (the chunk term added for a chunked
    kernel), and a kernel's return value is split into the same targets.
    """

    chunk_term = True

    def contract_hint(self, p):
        if not p.has_initial_state or self.state_keywords is None:
            return None
        return (f"this case hands an initial state ({self.state_keywords[0]}, in the case's dtype {p.dtype}, as the "
                "family's signature says); a kernel that keeps its state in another dtype (fla: float32) converts it, "
                "and one that takes no initial state declares Capabilities(initial_state=False) in a KernelSpec")

    @staticmethod
    def targets(p, t) -> dict[str, Any]:
        """``{"output": ..., "final_state": ...}`` of a `GatedTrace`, with the chunk term where chunked."""
        if p.chunk_size is not None:
            t = t.with_chunk_growth()
        found = {"output": t.out}
        if t.final_state is not None:
            found["final_state"] = t.final_state
        return found

    def trace(self, p, x, convention):
        return self.traces(p, x, convention)["output"]

    def split_output(self, p, value):
        """``(o, final_state)`` -> targets; a kernel that returns o alone has no final state."""
        if isinstance(value, (tuple, list)):
            found = {"output": value[0]}
            if p.final_state:
                found["final_state"] = value[1] if len(value) > 1 else None
            return found
        return {"output": value, **({"final_state": None} if p.final_state else {})}


class SimpleGLA(StatefulFamily):
    family = Family.SIMPLE_GLA
    arg_order = ("q", "k", "v", "g")
    state_keywords = ("initial_state", "output_final_state")
    scale_keyword = "scale"
    packed_keyword = "cu_seqlens"
    linear_input = "v"
    swapped_layout = ("heads", "(batch, heads, T, d): fla's old head_first=True layout")
    regimes = ("trained", "long_memory", "strong_decay", "mixed_heads", "large", "tiny", "uniform_decay")
    grad_inputs = ("q", "k", "v", "g", "initial_state")
    length_axis = 1
    per_step_inputs = ("q", "k", "v", "g")
    uses_matmuls = True
    targets_state = True
    draws_head_dims = True
    #: g's trailing shape: () per head (simple_gla) or (K,) per key channel (gla).
    per_key = False

    # ------------------------------------------------------------------------------- problems
    def validate(self, p):
        if p.eps is not None:
            raise InvalidArgument(f"eps={p.eps!r} is only meaningful for retention_normed; pass None")
        check_decay_floor(p)
        if p.scale is not None and (isinstance(p.scale, bool) or not isinstance(p.scale, (int, float))
                                    or not math.isfinite(p.scale) or p.scale == 0):
            raise InvalidArgument(f"scale={p.scale!r} must be a finite nonzero number or None (the kernel's "
                                  "default, K**-0.5)")
        if p.cu_seqlens is not None:
            cu = list(p.cu_seqlens)
            if p.batch != 1:
                raise InvalidArgument(f"batch={p.batch!r} with cu_seqlens={cu}: packed sequences share one row; "
                                      f"expected batch=1")
            if len(cu) < 2 or cu[0] != 0 or cu[-1] != p.length or any(b <= a for a, b in zip(cu, cu[1:])):
                raise InvalidArgument(f"cu_seqlens={cu} must rise strictly from 0 to length={p.length}")

    def n_sequences(self, p) -> int:
        return p.batch if p.cu_seqlens is None else len(p.cu_seqlens) - 1

    def g_shape(self, p) -> tuple[int, ...]:
        b, L, H = p.batch, p.length, p.heads
        return (b, L, H, p.dk) if self.per_key else (b, L, H)

    def shapes(self, p):
        b, L, H = p.batch, p.length, p.heads
        shapes = {"q": (b, L, H, p.dk), "k": (b, L, H, p.dk), "v": (b, L, H, p.dv), "g": self.g_shape(p)}
        if p.has_initial_state:
            shapes["initial_state"] = (self.n_sequences(p), H, p.dk, p.dv)
        return shapes

    def output_shape(self, p):
        return (p.batch, p.length, p.heads, p.dv)

    def input_axes(self, p, name):
        """g's head (and key channel) by name: a gradient's worst element read ``axis2=0`` (blind hunt)."""
        return {"q": ("batch", "t", "head", "k"), "k": ("batch", "t", "head", "k"),
                "g": ("batch", "t", "head", "k")[:len(self.g_shape(p))],
                "initial_state": ("sequence", "head", "k", "v")}.get(name)

    def state_shape(self, p) -> tuple[int, ...]:
        return (self.n_sequences(p), p.heads, p.dk, p.dv)

    def generate(self, p, shapes, gen):
        s = self.data_scale(p.regime, p.scale_dtype)
        out = {name: randn(shapes[name], gen) * s for name in ("q", "k", "v")}
        gs = shapes["g"]
        if p.regime == "long_memory":
            g = -(10.0 ** uniform(gs, gen, -4.0, -2.0))
        elif p.regime == "strong_decay":
            g = uniform(gs, gen, -30.0, 0.0)
        elif p.regime == "uniform_decay":
            g = uniform(gs, gen, decay_floor(p), 0.0)
        elif p.regime == "mixed_heads":
            per_head = 10.0 ** uniform((p.heads,) + (1,) * (len(gs) - 3), gen, -3.0, 1.3)
            g = torch.nn.functional.logsigmoid(randn(gs, gen)) * per_head
        else:
            g = torch.nn.functional.logsigmoid(randn(gs, gen)) / 16.0
        out["g"] = g
        if p.has_initial_state:  # a state like the one a previous chunk of the sequence would leave
            out["initial_state"] = randn(shapes["initial_state"], gen) * s * s
        return out

    def function_room(self, p):
        """exp(g): 1."""
        return 1.0

    def call_kwargs(self, p) -> dict[str, Any]:
        kw = super().call_kwargs(p)
        if p.scale is not None:
            kw["scale"] = p.scale
        if p.final_state:
            kw["output_final_state"] = True
        return kw

    def call_args(self, p, inputs, kwargs):
        args = tuple(inputs[n] for n in self.arg_order)
        if "initial_state" in inputs:
            kwargs["initial_state"] = inputs["initial_state"]
        if p.cu_seqlens is not None:
            kwargs["cu_seqlens"] = torch.tensor(p.cu_seqlens, dtype=torch.long, device=inputs["q"].device)
        return args, kwargs

    # -------------------------------------------------------------------------------- oracles
    def _oracle(self, name: str):
        from reference_impls import gated_decay

        return getattr(gated_decay, name)

    def traces(self, p, x, convention):
        trace_fn = self._oracle("gla_trace" if self.per_key else "simple_gla_trace")
        cu = None if p.cu_seqlens is None else torch.tensor(p.cu_seqlens, dtype=torch.long)
        t = trace_fn(x["q"], x["k"], x["v"], x["g"], p.scale, initial_state=x.get("initial_state"),
                     output_final_state=bool(p.final_state), cu_seqlens=cu, chunk_size=p.chunk_size)
        return self.targets(p, t)

    def differentiable(self, p, x, convention):
        from reference_impls import autograd as ad

        fn = ad.gla if self.per_key else ad.simple_gla
        cu = None if p.cu_seqlens is None else list(p.cu_seqlens)
        return fn(x["q"], x["k"], x["v"], x["g"], initial_state=x.get("initial_state"), cu_seqlens=cu,
                  scale=p.scale)[0]

    def gradient_traces(self, p, x, cot, names, convention):
        """Simple GLA's gradients of q, k and v are simple GLAs of the same decays and scale, placed as
        retention's (`harness.families.retention.ADJOINT_PLACES`; the scale passed, K**-0.5 of the forward's K
        when none is): dq runs forwards from the transposed initial state; dk and dv run backwards,
        ``dS_t = exp(g_{t+1}) dS_{t+1} + scale q_t^T g_t``, so their decays are shifted by one step within each
        sequence (`reference_impls.gated_decay.gla_adjoint_trace`, which charges a chunked backward the chunk
        term of its forward's chunks). Each has the oracle's own trace, the chunk term included for a chunked
        kernel.

        GLA's gates act on the key channel. Its dv is a GLA again (``GLA(q=k, k=q, v=g)`` backwards); dq and dk
        hold the gated channel on their output's side, so each key channel i is a simple GLA of its own, with
        that channel's decays: ``dq[..., i] = simple_gla(q=g, k=v, v=k[..., i])`` from row i of the initial state,
        ``dk[..., i] = simple_gla(q=v, k=g, v=q[..., i])`` backwards (the channels run as heads). The gates'
        gradient comes from dq's and dk's (`_gate_trace`); the initial state's from the state that dv's backward
        recurrence reaches at each sequence's first step (`initial_state_adjoint`)."""
        scale = p.dk ** -0.5 if p.scale is None else p.scale
        cuts = None if p.cu_seqlens is None else torch.tensor(p.cu_seqlens, dtype=torch.long)
        wanted = tuple(n for n in names if n in ("q", "k", "v", "initial_state")) + (("q", "k") if "g" in names else ())
        traces = gated_adjoints(x, cot, tuple(dict.fromkeys(wanted)), scale=scale, chunk_size=p.chunk_size,
                                cu_seqlens=cuts, per_key=self.per_key)
        if "g" in names:
            traces["g"] = self._gate_trace(p, x, traces["q"], traces["k"])
        return {name: traces[name] for name in names if name in traces}

    def _gate_trace(self, p, x, dq, dk):
        """dg from the traces of dq and dk (`gate_adjoint`), within each packed sequence."""
        bounds = [0, p.length] if p.cu_seqlens is None else list(p.cu_seqlens)
        return gate_adjoint(x["q"], x["k"], dq, dk, bounds=bounds, keys=p.dk, per_key=self.per_key)

    # ----------------------------------------------------------------------------- strategies
    def element_bounds(self, p, name):
        if name == "g":
            return (decay_floor(p), 0.0) if p.regime == "uniform_decay" else G_BOUNDS.get(p.regime, (-1.0, 0.0))
        if name == "initial_state":
            s = self.data_scale(p.regime, p.scale_dtype)
            return (-2.0 * s * s, 2.0 * s * s)
        return super().element_bounds(p, name)

    def draw_fields(self, draw, caps, lim, regime, common):
        from hypothesis import strategies as st

        fields = draw_heads(draw, caps, lim)
        fields.update(draw_state_options(draw, caps, common))
        if caps.scale:  # a kernel that takes scale and ignores it, or applies it to one part only, shows here
            fields["scale"] = draw(st.sampled_from(SCALES))
        return fields


def gate_adjoint(q: torch.Tensor, k: torch.Tensor, dq: "Trace", dk: "Trace", *, bounds: list[int], keys: int,
                 per_key: bool) -> "Trace":
    """dg from the traces of dq and dk: the gradient of a cumulative log-decay G_t is ``q_t . dq_t - k_t . dk_t``
    (G_t scales every term of o_t and divides every term that k_t's state enters), so

        dg_t = sum_{r >= t} (q_r . dq_r - k_r . dk_r)        (within t's sequence; per key channel for GLA)

    the reversed cumulative sum fla's chunk backward forms. Its terms are bounded by the magnitudes of dq and
    dk against |q| and |k| (also for a backward that forms ``exp(g_t) <S_{t-1}, dS_t>`` directly: each of its
    terms is one of q_r . dq_r's), and it errs by the error of dq and dk against them, plus a sum of
    (sequence's remaining steps + K) of those terms. The peaks are the larger of dq's and dk's from t on."""
    from reference_impls.trace import Trace

    gated = (lambda t: t) if per_key else (lambda t: t.sum(-1))  # noqa: E731 - per key channel, or over it
    qa, ka = q.abs(), k.abs()
    value = gated(q * dq.out - k * dk.out)
    magnitude = gated(qa * dq.magnitude + ka * dk.magnitude)
    growth = gated(qa * dq.growth + ka * dk.growth)
    peaks = [torch.maximum(a, b) if per_key else torch.maximum(a, b).amax(-1)
             for a, b in ((dq.state_peak, dk.state_peak), (dq.decay_peak, dk.decay_peak))]
    fields = [torch.zeros_like(value) for _ in range(5)]
    for a, b in zip(bounds, bounds[1:]):
        for into, x_ in zip(fields, (value, magnitude, growth)):
            into[:, a:b] = x_[:, a:b].flip(1).cumsum(1).flip(1)
        for into, peak in zip(fields[3:], peaks):
            into[:, a:b] = peak[:, a:b].flip(1).cummax(1).values.flip(1)
        steps = torch.arange(b - a, 0, -1, dtype=value.dtype).view(1, -1, *(1,) * (value.dim() - 2))
        fields[2][:, a:b] += (steps + keys) * fields[1][:, a:b]
    out, mag, gro, state_peak, decay_peak = fields
    return Trace(out=out, magnitude=mag, growth=gro, state_peak=state_peak, decay_peak=decay_peak)


def gated_adjoints(x: dict[str, torch.Tensor], cot: torch.Tensor, names: tuple[str, ...], *, scale: float,
                   chunk_size: int | None, cu_seqlens: torch.Tensor | None, per_key: bool,
                   input_rounding: tuple[torch.Tensor, torch.Tensor] | None = None) -> dict[str, Trace]:
    """The traces of simple GLA's (``per_key``: GLA's) gradients of q, k, v in ``names`` along the output
    cotangent ``cot``, each a gated recurrence of its own (`SimpleGLA.gradient_traces`), in fla's layout; the
    selective scan's are GLA's with one head per channel (`harness.families.selective_scan`). ``input_rounding``
    (simple GLA only): the rounding of log-decays and values the caller formed from other inputs (SSD's,
    `reference_impls.gated_decay.simple_gla_trace`), carried with the decays into every adjoint and with ``v``
    into dq's."""
    from harness.families.retention import ADJOINT_PLACES
    from reference_impls import gated_decay

    g, h0 = x["g"], x.get("initial_state")
    e_a = None if input_rounding is None else input_rounding[0]

    want_state = "initial_state" in names and h0 is not None
    finals = []  # dv's backward recurrence's state at each sequence's first step, kept from dv's run

    def run(args, gates, state, backwards: bool, gated_keys: bool, keep_final: bool = False) -> Trace:
        if backwards:  # forms its own decays one step later, and its chunk term on the forward's chunks
            t = gated_decay.gla_adjoint_trace(*args, gates, scale, cu_seqlens, chunk_size=chunk_size,
                                              per_key=gated_keys, decay_rounding=e_a, with_final=keep_final)
            if keep_final:
                t, final = t
                finals.append(final)
            return t
        if gated_keys:
            t = gated_decay.gla_trace(*args, gates, scale, initial_state=state, cu_seqlens=cu_seqlens,
                                      chunk_size=chunk_size)
        else:
            t = gated_decay.simple_gla_trace(*args, gates, scale, initial_state=state, cu_seqlens=cu_seqlens,
                                             chunk_size=chunk_size, input_rounding=input_rounding)
        return (t if chunk_size is None else t.with_chunk_growth()).out

    def adjoint(name: str) -> Trace:
        places, backwards = ADJOINT_PLACES[name]
        args = [cot if place == "cot" else x[place] for place in places]
        if not per_key or name == "v":
            return run(args, g, None if h0 is None else h0.transpose(-1, -2), backwards, per_key,
                       keep_final=want_state and name == "v")
        b, length, heads, keys = g.shape  # one simple GLA per (head, key channel)
        wide = [a.unsqueeze(3).expand(-1, -1, -1, keys, -1).reshape(b, length, heads * keys, -1) for a in args[:2]]
        state = None if h0 is None else h0.reshape(h0.shape[0], heads * keys, -1, 1)
        t = run(wide + [args[2].reshape(b, length, heads * keys, 1)], g.reshape(b, length, heads * keys), state,
                backwards, False)
        return t.mapped(lambda field: field.reshape(b, length, heads, keys))

    traces = {name: adjoint(name) for name in names if name in ADJOINT_PLACES}
    if want_state:
        if not finals:  # dv not asked for: its run, for the state it reaches
            adjoint("v")
        traces["initial_state"] = initial_state_adjoint(finals[0], g, scale=scale, cu_seqlens=cu_seqlens,
                                                        per_key=per_key, decay_rounding=e_a)
    return traces


def initial_state_adjoint(z0: "Trace", g: torch.Tensor, *, scale: float, cu_seqlens: torch.Tensor | None,
                          per_key: bool, decay_rounding: torch.Tensor | None = None) -> "Trace":
    """The trace of the initial state's gradient, (sequences or batch, heads, K, V): every output o_r reads it
    through the decays of steps 0..r, so ``dS0 = scale exp(g_0) Z_0`` with ``Z_0 = sum_r exp(g_1 + ... + g_r)
    q_r^T cot_r``, the state after the first step of the backward recurrence dv runs (``z0``, from the same run
    as dv: `reference_impls.gated_decay.gla_adjoint_trace` with ``with_final``), per sequence; ``exp(g_0)`` on
    the key channels for GLA (its argument's rounding, ``decay_rounding``, charged where the caller formed it)."""

    def at_starts(t: torch.Tensor) -> torch.Tensor:  # (sequences, heads[, K])
        return t[:, 0] if cu_seqlens is None else t[0, cu_seqlens[:-1]]

    decay = torch.exp(at_starts(g)) if per_key else torch.exp(at_starts(g))[..., None]
    state = z0.times(scale * decay[..., None])
    if decay_rounding is None:
        return state
    return dataclasses.replace(state, growth=state.growth + at_starts(decay_rounding)[..., None] * state.magnitude)


def draw_state_options(draw, caps, common) -> dict[str, Any]:
    """Initial state, final state and packed sequences, each drawn only where the kernel declares it
    (``caps.initial_state``, ``final_state``, ``varlen``): a packed batch is one row cut at 1 to 3 points,
    which shrink towards fewer cuts and earlier ones. Half the packed cases put every cut on the chunk grid
    (the case's chunk, else 64, the usual default) where the row spans more than one chunk: a sequence that
    starts exactly at a chunk's start is where a chunk kernel's state passing forgets to reset (session 19's
    blind hunt: 17 of 100 float32 cases were packed and none had a cut on a chunk multiple)."""
    from hypothesis import strategies as st

    fields: dict[str, Any] = {}
    fields["has_initial_state"] = caps.initial_state and draw(st.booleans())
    fields["final_state"] = caps.final_state and draw(st.booleans())
    length = common["length"]
    if caps.varlen and length > 1 and draw(st.booleans()):
        grid = common.get("chunk_size") or VARLEN_GRID
        on_grid = draw(st.booleans())  # drawn always: the choice sequence keeps its shape
        if on_grid and length > grid:
            steps = (length - 1) // grid
            cuts = [grid * j for j in draw(st.lists(st.integers(1, steps), min_size=1, max_size=min(3, steps),
                                                    unique=True))]
        else:
            cuts = draw(st.lists(st.integers(1, length - 1), min_size=1, max_size=min(3, length - 1), unique=True))
        fields["cu_seqlens"] = (0, *sorted(cuts), length)
        fields["batch"] = 1
    return fields


#: The chunk grid a packed case's cuts are put on when the case has no chunk size of its own (fla's and
#: mamba-ssm's default chunk, 64).
VARLEN_GRID = 64


FAMILY = SimpleGLA()
