"""`FamilyDef`: everything the harness knows about one kernel family, in one object.

A family definition answers every family-dependent question the harness asks: the names and call order
of the tensor arguments, the input shapes of a `Problem`, the output shape and its sequence axis, the
input regimes and how each one's inputs are generated, the float64 oracle (its `Trace` and its
differentiable form), the same-dtype sequential baseline, the last-place room of the elementwise
functions a step evaluates, the hypothesis bounds of explicit element values and the family's own
problem fields, and the per-element term scales of its gradients. The problem, the runner, the
strategies, the gradients and the reports ask the family (`harness.families.get`) instead of branching
on it, so adding a family is one module here (plus its oracle and its baseline kernel).

Modules here import `reference_impls` inside the methods that need it (the oracles are heavy) and never
import `harness.problems` at module level (problems imports the families).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Callable

import torch

from harness.errors import InvalidArgument
from harness.kernels.contract import DTYPE_NAMES, Capabilities, Family, RetentionConvention

if TYPE_CHECKING:
    from harness.problems import Problem
    from reference_impls.trace import Trace


def randn(shape, gen: torch.Generator) -> torch.Tensor:
    """Standard normal float64 values from ``gen``."""
    return torch.randn(shape, generator=gen, dtype=torch.float64)


def uniform(shape, gen: torch.Generator, lo: float, hi: float) -> torch.Tensor:
    """Uniform float64 values in [lo, hi) from ``gen``."""
    return lo + (hi - lo) * torch.rand(shape, generator=gen, dtype=torch.float64)


def limit_scale(regime: str, dtype: str, *, power: float, large_div: float, tiny_mul: float) -> float:
    """The data scale of ``large`` (max**power / large_div) and ``tiny`` (tiny**power * tiny_mul); else 1."""
    info = torch.finfo(DTYPE_NAMES[dtype])
    if regime == "large":
        return float(info.max) ** power / large_div
    if regime == "tiny":
        return float(info.tiny) ** power * tiny_mul
    return 1.0


def option_slips(p: "Problem", x: dict[str, torch.Tensor], *, terms: tuple[tuple[str, str], ...], step: str,
                 bias: str, softplus: str, biased: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
                 ) -> list[tuple[str, "Problem", dict[str, torch.Tensor]]]:
    """The slips of a kernel with the selective options (`FamilyDef.slips`): each optional input of ``terms``
    (name, what it is) that the case hands left out; the softplus of the step left out, or applied though the
    case asks for none; and the bias added after the softplus (``softplus(step) + bias``, not
    ``softplus(step + bias)``), as the step ``softplus(step) + bias`` formed here in float64 without softplus.
    ``biased(step, bias)`` adds the bias with the family's broadcasting."""
    import torch.nn.functional as F

    from reference_impls.selective_scan import SOFTPLUS_THRESHOLD

    found = [(f"leaves out {what}", p, {k: v for k, v in x.items() if k != name}) for name, what in terms if name in x]
    try:
        flipped = p.replace(delta_softplus=not p.delta_softplus)
    except (InvalidArgument, ValueError):
        return found
    if not p.delta_softplus:
        return found + [(f"applies softplus to {step} though the case passes {softplus}=False", flipped, x)]
    found.append((f"does not apply softplus to {step}{f' + {bias}' if bias in x else ''} ({softplus}=True)", flipped,
                  x))
    if bias in x:
        after = biased(F.softplus(x[step].to(torch.float64), beta=1.0, threshold=SOFTPLUS_THRESHOLD),
                       x[bias].to(torch.float64))
        found.append((f"adds {bias} after the softplus (softplus({step}) + {bias}, not softplus({step} + {bias}))",
                      flipped, {**{k: v for k, v in x.items() if k != bias}, step: after}))
    return found


#: The largest x whose exp is finite in float16 (exp(11.09) = 65,500): a softplus computed as log1p(exp(x)) in
#: float16 overflows for x above it, below the threshold (20) where softplus returns x.
FLOAT16_EXP_MAX = math.log(65504.0)


def softplus_overflow(p: "Problem", step: torch.Tensor, precision: str) -> str | None:
    """The clause for a float16 case with softplus whose steps (``step``: the step plus its bias) reach past
    `FLOAT16_EXP_MAX`: a blind hunt's SSD loop computed ``log1p(exp(dt))`` in float16 and returned inf from dt =
    11.1 on, and the why's example (a long cumulative log-decay sum) sent its author to the decays."""
    from reference_impls.selective_scan import SOFTPLUS_THRESHOLD

    if precision != "float16" or not p.delta_softplus:
        return None
    over = int(((step > FLOAT16_EXP_MAX) & (step <= SOFTPLUS_THRESHOLD)).sum())
    if not over:
        return None
    return (f"{over} of the case's {step.numel()} steps (with their bias) lie between {FLOAT16_EXP_MAX:.4g} and "
            f"{SOFTPLUS_THRESHOLD:g}, where a softplus computed as log1p(exp(x)) in float16 overflows to inf (exp "
            "passes 65,504) while softplus(x) is about x: compute the softplus in float32, as mamba-ssm does")


class FamilyDef:
    """One family's definition. Subclasses set the class attributes and override what differs.

    Attributes:
        family: the `Family` it defines.
        arg_order: the tensor arguments of the call, in order (optional ones included).
        regimes: the input regimes that apply (`harness.problems` documents each).
        grad_inputs: the inputs that are differentiated (the rest are flags or integer-valued).
        length_axis: the sequence axis of the output.
        per_step_inputs: the inputs that hold one value per step, along the same axis as the output's
            (``length_axis``); the rest (decay parameters, D, biases, initial states) have no sequence axis.
            A gradient is measured along its input's sequence axis (`input_length_axis`).
        uses_matmuls: whether every form of the family computes matmuls (TF32 applies on CUDA).
        has_convention: whether a kernel's `RetentionConvention` (decays, scale) enters the oracle.
        takes_eps: whether problems carry a norm ``eps`` (required then, refused otherwise).
        linear_input: an input the output is linear in, laid out along the output's length axis (a
            scan's ``b`` or ``u``, retention's ``v``): flipping its sign after position t leaves every
            output at or before t of a causal kernel unchanged (`harness.runner`'s future-leak probe).
        option_keywords: the keyword arguments passed only to a kernel that declares
            `Capabilities.selective_options` (the selective scan's D, z, bias and softplus flag).
        chunk_positional: ``chunk_size`` is a positional argument of the family's signature (mamba-ssm's
            ``mamba_chunk_scan_combined``), not an optional keyword.
        state_keywords: the gated families' (initial state, final-state flag) keyword names, passed to a
            kernel that declares `Capabilities.initial_state` / `Capabilities.final_state`.
        scale_keyword: the keyword of the family's scale (simple_gla, gla: ``scale``), passed to a kernel that
            declares `Capabilities.scale` (or whose signature names it) now and then.
        packed_keyword: the keyword of packed sequences (simple_gla, gla: ``cu_seqlens``; ssd: ``seq_idx``),
            passed to a kernel that declares `Capabilities.varlen` (or whose signature names it) now and then.
        chunk_term: the oracle's bound carries a chunk-form term when the problem has a chunk size (decays
            formed as exp of differences of cumulative sums within a chunk: the gated families and the
            selective scan).
        swapped_layout: (the problem field of the axis next to the sequence's, the layout a kernel that
            reads the two swapped takes) where every input and the output have those two axes at 1 and 2
            (`harness.runner._swapped_layout`): retention's and the gated families' heads (fla's old
            ``head_first`` layout), the linear scan's channels.
    """

    family: Family
    arg_order: tuple[str, ...] = ()
    regimes: tuple[str, ...] = ()
    grad_inputs: tuple[str, ...] = ()
    length_axis: int = -1
    per_step_inputs: tuple[str, ...] = ()
    uses_matmuls: bool = False
    has_convention: bool = False
    takes_eps: bool = False
    linear_input: str | None = None
    option_keywords: tuple[str, ...] = ()
    chunk_positional: bool = False
    state_keywords: tuple[str, str] | None = None
    chunk_term: bool = False
    scale_keyword: str | None = None
    packed_keyword: str | None = None
    swapped_layout: tuple[str, str] | None = None

    def slips(self, p: "Problem", x: dict[str, torch.Tensor]) -> list[tuple[str, "Problem", dict[str, torch.Tensor]]]:
        """``(what the kernel does, problem, inputs)``: the oracle on that problem and those inputs computes what
        a kernel returns that makes that slip on ``p`` and ``x`` (leaves out an optional term, or the softplus;
        `harness.runner._named_slip`). Empty here: the selective families override it (`option_slips`)."""
        return []

    def nonfinite_hint(self, p: "Problem", x: dict[str, torch.Tensor], precision: str) -> str | None:
        """A clause for a kernel's NaN/Inf where the oracle is finite, naming an intermediate of this family that
        overflows ``precision`` on this case; None here (the selective families: `softplus_overflow`)."""
        return None

    def input_length_axis(self, name: str) -> int | None:
        """The sequence axis of input ``name`` (the output's ``length_axis``), or None for an input that holds
        no value per step."""
        return self.length_axis if name in self.per_step_inputs else None

    def input_axes(self, p: "Problem", name: str) -> tuple[str, ...] | None:
        """The names of input ``name``'s axes in a gradient's record where they are not the output's (mamba's B
        (batch, state, t) has the output's shape (batch, channel, t) when N = dim, but not its axes); None: the
        output's axes when it has the output's shape, else ``batch``, ``t`` and numbers (`harness.gradients`)."""
        return None

    # ------------------------------------------------------------------------------- problems
    def validate(self, p: "Problem") -> None:
        """Family-specific checks of a problem's fields (raise `InvalidArgument`)."""
        for name, default in (("has_initial_state", False), ("final_state", False), ("cu_seqlens", None),
                              ("decay_floor", None), ("scale", None)):
            if getattr(p, name) != default:
                raise InvalidArgument(f"{name}={getattr(p, name)!r} does not apply to family {self.family.value}; "
                                      f"leave it at {default!r}")
        if p.groups < 0 or (p.groups and p.dim % p.groups):
            raise InvalidArgument(
                f"groups={p.groups!r} must be 0 (ungrouped) or a positive divisor of dim={p.dim}"
            )
        if self.takes_eps:
            if p.eps is None or not (p.eps >= 0 and math.isfinite(p.eps)):
                raise InvalidArgument(f"eps={p.eps!r} must be a finite number >= 0 for {self.family.value}")
        elif p.eps is not None:
            raise InvalidArgument(f"eps={p.eps!r} is only meaningful for retention_normed; pass None")

    def shapes(self, p: "Problem") -> dict[str, tuple[int, ...]]:
        """The shape of each input tensor, by name, in the family's layout."""
        raise NotImplementedError

    def output_shape(self, p: "Problem") -> tuple[int, ...]:
        """The shape the family's contract promises for ``p``."""
        raise NotImplementedError

    def data_scale(self, regime: str, dtype: str) -> float:
        """Scale of the data tensors: 1, or near the dtype's limits for ``large`` / ``tiny``: outputs are
        products of three data factors, so each factor is scaled to max**(1/4) (tiny**(1/4))."""
        return limit_scale(regime, dtype, power=0.25, large_div=4.0, tiny_mul=4.0)

    def generate(self, p: "Problem", shapes: dict[str, tuple[int, ...]], gen: torch.Generator,
                 ) -> dict[str, torch.Tensor]:
        """The regime's float64 inputs, drawn from ``gen`` (the problem's seed)."""
        raise NotImplementedError

    def function_room(self, p: "Problem") -> float:
        """Last-place errors of the elementwise functions one step evaluates, in units of ``u * magnitude``."""
        return 0.0

    def contract_hint(self, p: "Problem") -> str | None:
        """For a kernel that failed its contract on ``p``: an input layout the family allows and a simple kernel
        may not take, and how a kernel without it says so (None when ``p`` uses none)."""
        return None

    def call_kwargs(self, p: "Problem") -> dict[str, Any]:
        """Keyword arguments besides the tensors (flags, eps, chunk_size)."""
        kw: dict[str, Any] = {}
        if p.chunk_size is not None:
            kw["chunk_size"] = p.chunk_size
        return kw

    def call_args(self, p: "Problem", inputs: dict[str, torch.Tensor], kwargs: dict[str, Any],
                  ) -> tuple[tuple, dict[str, Any]]:
        """The positional and keyword arguments of the family's signature (``kwargs``: `call_kwargs`)."""
        return tuple(inputs[n] for n in self.arg_order), kwargs

    # -------------------------------------------------------------------------------- oracles
    def trace(self, p: "Problem", x: dict[str, torch.Tensor], convention: RetentionConvention) -> "Trace":
        """The float64 oracle's `Trace` on float64 CPU inputs ``x``."""
        raise NotImplementedError

    def traces(self, p: "Problem", x: dict[str, torch.Tensor], convention: RetentionConvention,
               ) -> dict[str, "Trace"]:
        """The oracle's `Trace` of each measured target: ``"output"``, and ``"final_state"`` where the
        family and the problem have one."""
        return {"output": self.trace(p, x, convention)}

    def split_output(self, p: "Problem", value: Any) -> dict[str, torch.Tensor | None]:
        """A kernel's (or baseline's) return value as its targets (``"output"``, ``"final_state"``...)."""
        if isinstance(value, (tuple, list)):
            value = value[0]
        return {"output": value}

    def state_shape(self, p: "Problem") -> tuple[int, ...] | None:
        """The shape of the final state, for families that return one."""
        return None

    def state_elements(self, p: "Problem") -> int:
        """The elements of one batch row and head's state (dk x dv; SSD's headdim x N): what a chunk kernel
        holds per chunk when it keeps every chunk's state (`Capabilities.chunk_states`)."""
        shape = self.state_shape(p)
        return math.prod(shape[2:]) if shape else p.dk * p.dv

    def differentiable(self, p: "Problem", x: dict[str, torch.Tensor], convention: RetentionConvention,
                       ) -> torch.Tensor:
        """The oracle's definition, differentiable (`reference_impls.autograd`), in the dtype of ``x``."""
        raise NotImplementedError

    def baseline_kwargs(self, p: "Problem", convention: RetentionConvention) -> dict[str, Any]:
        """What the baseline takes besides the call's arguments (a retention convention's decays, scale)."""
        return {}

    #: The problem's dk and dv are the kernel's head dims (drawn by `draw_heads`, within `Capabilities.head_dims`
    #: and `Capabilities.head_dim_multiple`).
    draws_head_dims: bool = False

    def gradient_traces(self, p: "Problem", x: dict[str, torch.Tensor], cot: torch.Tensor, names: tuple[str, ...],
                        convention: RetentionConvention) -> dict[str, "Trace"] | None:
        """Per input in ``names``: the oracle's trace of its gradient along ``cot``, where the family's gradients
        are themselves instances of an oracle (retention's are retentions): judged then as an output is, on its
        own componentwise bound. None where they are not: the normwise bound applies (`harness.gradients`)."""
        return None

    def gradient_alternatives(self, p: "Problem", x: dict[str, torch.Tensor], want: dict[str, torch.Tensor],
                              ) -> dict[str, torch.Tensor]:
        """Per input: the gradient under the other one-sided derivative where the definition has a kink on the case's
        inputs (SSD's clamp of the steps at exactly 0: torch's clamp passes 1 there, a ``relu`` or a mask ``> 0`` 0,
        both right), from the oracle's ``want``; each element of a kernel's gradient is judged against whichever of
        the two it is nearer (`harness.gradients`). Empty where there is no kink."""
        return {}

    def eps_placement(self, p: "Problem", x: dict[str, torch.Tensor], actual: torch.Tensor,
                      convention: RetentionConvention) -> str | None:
        """For an output found divergent through the norm's eps only (`harness.runner`'s ``eps_effect``): a clause
        saying where the kernel puts eps when its output is another placement's (eps outside the root), else
        None. Only a family with a norm has one."""
        return None

    def gradient_norm_peak(self, p: "Problem", x: dict[str, torch.Tensor], names: tuple[str, ...],
                           convention: RetentionConvention) -> dict[str, torch.Tensor] | None:
        """Per element of each input in ``names``: the largest intermediate a correct backward forms on the
        way to its gradient, where the family has one beyond the forward's (`harness.gradients`: judged as a
        trace's ``norm_peak``, out of domain above the dtype's max); None where it has none."""
        return None

    # ----------------------------------------------------------------------------- strategies
    def element_bounds(self, p: "Problem", name: str) -> tuple[float, float]:
        """The range of hypothesis-drawn element values of input ``name`` in ``p``'s regime."""
        s = self.data_scale(p.regime, p.scale_dtype)
        return (-2.0 * s, 2.0 * s)

    def draw_fields(self, draw: Callable, caps: Capabilities, lim: Any, regime: str, common: dict[str, Any],
                    ) -> dict[str, Any]:
        """The family's own problem fields (sizes, flags), drawn by hypothesis inside ``caps`` and the
        profile's limits ``lim``; ``common`` holds the fields drawn before (length, batch, ...), and the
        result may replace some of them (a packed variable-length batch is one row)."""
        return {}

    def __repr__(self) -> str:
        return f"<family {self.family.value}>"


def draw_size(draw, top: int, lim, cap: int | None = None) -> int:
    """A head dim or state size: 1 .. ``top`` three times in four, else one of the profile's tile edges
    beyond ``top`` (`harness.settings.Limits.tile_edges`, up to the kernel's ``cap``). Shrinks to 1."""
    from hypothesis import strategies as st

    edges = [e for e in lim.tile_edges if e > top and (cap is None or e <= cap)]
    if edges and draw(st.sampled_from(("range", "range", "range", "edge"))) == "edge":
        return draw(st.sampled_from(edges))
    return draw(st.integers(1, top))


def draw_heads(draw, caps, lim) -> dict[str, int]:
    """Heads and head dims (dk, dv) of a (q, k, v) family, within the kernel's declared head dims or the
    profile's limits; drawn in this order (heads, dk, dv), which the derandomized ci draws depend on."""
    from hypothesis import strategies as st

    fields = {"heads": draw(st.integers(1, lim.max_heads))}
    if caps.head_dims:
        fields["dk"] = draw(st.sampled_from(caps.head_dims))
        fields["dv"] = draw(st.sampled_from(caps.head_dims))
    else:
        top_d = min(lim.max_head_dim, caps.max_state or lim.max_head_dim)
        fields["dk"] = caps.fit_head_dim(draw_size(draw, top_d, lim, caps.max_state))
        fields["dv"] = caps.fit_head_dim(draw_size(draw, top_d, lim, caps.max_state))
    return fields
