"""`Trace`: what an oracle saw while computing its float64 output.

The harness's metrics need more than the output to judge a kernel fairly:

- ``magnitude``: the same recurrence run on absolute values, mapped through the output map. For
  ``h_t = a_t h_{t-1} + b_t`` it is ``H_t = |a_t| H_{t-1} + |b_t|``; for ``y = C.h + D u`` it is
  ``sum_n |C_n| H_n + |D u|``. A tree-shaped (parallel) scan of depth d may make an error of about
  ``d * u * magnitude``.
- ``growth``: how rounding accumulates in the plain sequential loop,
  ``W_t = |a_t| (W_{t-1} + H_{t-1}) + |b_t|``, mapped through the output map the same way. A correct
  sequential loop in a dtype with unit roundoff u errs by at most about ``u * growth``.
- ``state_peak``: the running maximum over t' <= t of |state| among the state entries that feed the
  output element (all N state entries of a channel, all dk rows of a retention column). An output can be
  representable while the state behind it has already overflowed the dtype; this is how the harness
  tells an input that overflows the dtype from a kernel bug.
- ``decay_peak``: the running maximum over t' <= t of the largest product of |decay| over any window
  ending at t' (``P_t = |a_t| * max(P_{t-1}, 1)``): the partial products a parallel scan forms.
- ``norm_peak`` (optional; None for an output map without a norm): the largest intermediate of the
  output map at that element alone, not a running maximum: for the normed retention, the group norm's
  sum of squares and the reciprocal of its mean square (plus eps). A position's norm does not carry to
  the next, so where it leaves the dtype's range only that position is out of domain, while the state
  and decay peaks, which do carry, exclude the rest of the row.

All fields (``norm_peak`` where present) are float64 CPU tensors with the shape of ``out``. Each oracle's module docstring gives its
exact recurrences and output maps (including the reduction terms in growth and, for the normed
retention, the group norm's first-order sensitivity).
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Callable

import torch


@dataclass
class Trace:
    out: torch.Tensor
    magnitude: torch.Tensor
    growth: torch.Tensor
    state_peak: torch.Tensor
    decay_peak: torch.Tensor
    norm_peak: torch.Tensor | None = None
    #: The part of ``growth`` that is a chunk form's term (None: the trace carries none), so that the term can be
    #: charged at another dtype's rounding than the rest (`harness.runner.chunk_term_at`).
    chunk_growth: torch.Tensor | None = None

    def flipped(self, dim: int) -> "Trace":
        """This trace with every field reversed along ``dim``: the trace of a recurrence run backwards (an
        adjoint), put back in forward order; its running peaks then run over the later positions."""
        return self.mapped(lambda field: field.flip(dim))

    def mapped(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> "Trace":
        """This trace with ``fn`` (a permutation, reshape or flip of the elements) applied to every field."""
        return replace(self, **{f.name: fn(getattr(self, f.name)) for f in fields(self)
                                if getattr(self, f.name) is not None})

    def summed(self, dim: int) -> "Trace":
        """The trace of this output summed along ``dim`` (a gradient of an input shared by several heads or
        channels): values, magnitudes and rounding terms added, and the sum's own roundings, one per term, each
        bounded by the sum's magnitude; the peaks the largest of the terms'."""
        count = self.out.shape[dim]
        magnitude = self.magnitude.sum(dim)
        return Trace(out=self.out.sum(dim), magnitude=magnitude, growth=self.growth.sum(dim) + count * magnitude,
                     state_peak=self.state_peak.amax(dim), decay_peak=self.decay_peak.amax(dim),
                     norm_peak=None if self.norm_peak is None else self.norm_peak.amax(dim),
                     chunk_growth=None if self.chunk_growth is None else self.chunk_growth.sum(dim))

    def times(self, weight: torch.Tensor) -> "Trace":
        """The trace of this output times ``weight`` (exact, broadcast): the product's rounding, one, charged at
        its magnitude; the peaks stay the computation's."""
        w = weight.abs()
        magnitude = self.magnitude * w
        return replace(self, out=self.out * weight, magnitude=magnitude, growth=self.growth * w + magnitude,
                       chunk_growth=None if self.chunk_growth is None else self.chunk_growth * w)

    def plus(self, other: "Trace") -> "Trace":
        """The trace of the sum of two outputs of one shape: values, magnitudes and rounding terms added, the
        add's own rounding charged at the sum's magnitude; the peaks the larger."""
        magnitude = self.magnitude + other.magnitude
        chunk = [t.chunk_growth for t in (self, other) if t.chunk_growth is not None]
        return Trace(out=self.out + other.out, magnitude=magnitude, growth=self.growth + other.growth + magnitude,
                     state_peak=torch.maximum(self.state_peak, other.state_peak),
                     decay_peak=torch.maximum(self.decay_peak, other.decay_peak),
                     norm_peak=None if self.norm_peak is None or other.norm_peak is None
                     else torch.maximum(self.norm_peak, other.norm_peak),
                     chunk_growth=sum(chunk) if chunk else None)

    @classmethod
    def of_product(cls, a: torch.Tensor, b: torch.Tensor) -> "Trace":
        """The trace of ``a * b`` of exact inputs: one rounding; no state, no decays (the value its own peak)."""
        out = a * b
        magnitude = out.abs()
        return cls(out=out, magnitude=magnitude, growth=magnitude, state_peak=magnitude,
                   decay_peak=torch.zeros_like(out))

    def scaled(self, factor: float) -> "Trace":
        """The trace of ``factor`` times this output: the output times it, its magnitude and rounding terms
        times its absolute value (the bound scales with the value; the peaks stay the computation's)."""
        f = abs(factor)
        return replace(self, out=self.out * factor, magnitude=self.magnitude * f, growth=self.growth * f,
                       chunk_growth=None if self.chunk_growth is None else self.chunk_growth * f)

