"""`Problem`: one case's shapes, length, chunk, eps, dtype, device, input regime and seed.

A problem is plain data (it round-trips through JSON, so a saved counterexample replays exactly) and
generates its inputs deterministically: float64 values are drawn on the CPU from ``seed`` (or taken
from ``values`` when hypothesis drew the elements of a small case), rounded once to the kernel's dtype
and moved to the device. The oracle sees those same rounded values upcast to float64, so input
quantization is never charged to the kernel.

Input regimes (named, per family; `REGIMES` lists which apply):

- ``trained``: what a trained model feeds the kernel. Selective scan: delta = softplus(0.5 z + b) with
  b = log(expm1(dt)), dt log-uniform in [1e-3, 1e-1] per channel, A = -exp(log(1..N) + 0.1 z) (Mamba's
  S4D-real init), u, B, C, D, z standard normal. Linear scan: a = exp(-softplus(z - 2)) in (0, 1).
  Retention: q, k, v standard normal.
- ``long_memory``: decay factors within 1e-4..1e-2 of 1, so the state sums thousands of terms.
  Selective scan: dt in [1e-4, 1e-3], A in [-1, -0.01].

In every regime but ``unstable`` the selective scan's decays stay at or below 1 whatever ``delta_bias``:
without softplus the bias is drawn at the channel's step scale and taken out of delta, so that
``delta + delta_bias`` is the regime's positive step (with softplus the step is positive anyway).
Growth belongs to ``unstable`` alone.
- ``fast_decay``: decay factors well below 1 (a in (0, 0.5); delta*A in [-10, -1]).
- ``large`` / ``tiny``: ``trained`` with the data (b, u, B, C, q, k, v; D by the square) scaled so that
  products of three factors sit near the dtype's largest / smallest normal value (max**(1/4),
  tiny**(1/4) each; max**(1/6) for retention_normed, whose norm squares its input).
- ``unstable``: decay factors above 1. Selective scan: delta and A standard normal with no softplus
  (the Mamba seed's inputs); linear scan: a standard normal.
- ``ramp``: retention only: q = k = v = arange scaled to (0, 1] (the RetNet seed's input, without the
  projections; starting at 1/n, not 0, so no row is all zeros).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from dataclasses import dataclass, field
from typing import Any

import torch

from harness.errors import InvalidArgument
from harness.kernels.contract import DTYPE_NAMES, Family, dtype_name

REGIMES: dict[Family, tuple[str, ...]] = {
    Family.LINEAR_SCAN: ("trained", "long_memory", "fast_decay", "large", "tiny", "unstable"),
    Family.SELECTIVE_SCAN: ("trained", "long_memory", "fast_decay", "large", "tiny", "unstable"),
    Family.RETENTION: ("trained", "large", "tiny", "ramp"),
    Family.RETENTION_NORMED: ("trained", "large", "tiny", "ramp"),
}

#: Largest number of elements a problem may carry as explicit ``values`` (hypothesis-drawn cases).
MAX_EXPLICIT_ELEMENTS = 4096


@dataclass(frozen=True)
class Problem:
    """One case's inputs, described as data.

    Shapes by family: linear_scan uses (batch, dim, length); selective_scan (batch, dim, length) with
    state size ``state`` and ``groups`` (0: B, C ungrouped (batch, N, L); G >= 1: grouped
    (batch, G, N, L)); retention(_normed) uses (batch, length, heads, dk|dv).
    """

    family: Family
    length: int
    dtype: str = "float32"
    device: str = "cpu"
    regime: str = "trained"
    seed: int = 0
    batch: int = 1
    dim: int = 4
    state: int = 4
    groups: int = 0
    heads: int = 2
    dk: int = 8
    dv: int = 8
    chunk_size: int | None = None
    eps: float | None = None
    has_D: bool = False
    has_z: bool = False
    has_delta_bias: bool = False
    delta_softplus: bool = False
    tf32: bool = False
    values: dict[str, list[float]] | None = field(default=None, compare=False, hash=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "family", Family.parse(self.family))
        object.__setattr__(self, "dtype", dtype_name(self.dtype))
        positive = {"length": self.length, "batch": self.batch, "dim": self.dim, "state": self.state,
                    "heads": self.heads, "dk": self.dk, "dv": self.dv}
        for name, value in positive.items():
            if not isinstance(value, int) or value < 1:
                raise InvalidArgument(f"{name}={value!r} must be a positive integer")
        if self.chunk_size is not None and (not isinstance(self.chunk_size, int) or self.chunk_size < 1):
            raise InvalidArgument(f"chunk_size={self.chunk_size!r} must be a positive integer or None")
        if self.groups < 0 or (self.groups and self.dim % self.groups):
            raise InvalidArgument(
                f"groups={self.groups!r} must be 0 (ungrouped) or a positive divisor of dim={self.dim}"
            )
        if self.regime not in REGIMES[self.family]:
            raise InvalidArgument(
                f"regime={self.regime!r} does not apply to family {self.family.value}; "
                f"expected one of {list(REGIMES[self.family])}"
            )
        if self.family is Family.RETENTION_NORMED:
            if self.eps is None or not (self.eps >= 0 and math.isfinite(self.eps)):
                raise InvalidArgument(f"eps={self.eps!r} must be a finite number >= 0 for retention_normed")
        elif self.eps is not None:
            raise InvalidArgument(f"eps={self.eps!r} is only meaningful for retention_normed; pass None")
        if self.device not in ("cpu", "cuda") and not self.device.startswith("cuda:"):
            raise InvalidArgument(f"device={self.device!r} must be 'cpu' or 'cuda[:n]'")
        if not isinstance(self.seed, int) or self.seed < 0:
            raise InvalidArgument(f"seed={self.seed!r} must be a non-negative integer")

    # ----------------------------------------------------------------------------------- identity
    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready fields (values included only when present)."""
        # a field-by-field copy: dataclasses.asdict deep-copies the values one float at a time (2.75 ms
        # for 4096 of them, on every case a hypothesis draw carries)
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        d["family"] = self.family.value
        if self.values is None:
            del d["values"]
        else:
            d["values"] = {name: list(v) for name, v in self.values.items()}
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Problem":
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise InvalidArgument(f"problem fields {unknown} are unknown; expected a subset of {sorted(names)}")
        return cls(**d)

    def replace(self, **changes: Any) -> "Problem":
        return dataclasses.replace(self, **changes)

    @property
    def key(self) -> str:
        """A short stable hash of the problem (its values included)."""
        blob = json.dumps(self.to_dict(), sort_keys=True, default=str).encode()
        return hashlib.sha1(blob).hexdigest()[:12]

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPE_NAMES[self.dtype]

    @property
    def length_axis(self) -> int:
        """The axis of the sequence in the family's output."""
        return 1 if self.family in (Family.RETENTION, Family.RETENTION_NORMED) else -1

    def shapes(self) -> dict[str, tuple[int, ...]]:
        """The shape of each input tensor, by name, in the family's layout."""
        b, d, n, L = self.batch, self.dim, self.state, self.length
        if self.family is Family.LINEAR_SCAN:
            return {"a": (b, d, L), "b": (b, d, L)}
        if self.family is Family.SELECTIVE_SCAN:
            bc = (b, self.groups, n, L) if self.groups else (b, n, L)
            shapes = {"u": (b, d, L), "delta": (b, d, L), "A": (d, n), "B": bc, "C": bc}
            if self.has_D:
                shapes["D"] = (d,)
            if self.has_z:
                shapes["z"] = (b, d, L)
            if self.has_delta_bias:
                shapes["delta_bias"] = (d,)
            return shapes
        return {"q": (b, L, self.heads, self.dk), "k": (b, L, self.heads, self.dk),
                "v": (b, L, self.heads, self.dv)}

    def n_elements(self) -> int:
        return sum(math.prod(s) for s in self.shapes().values())

    # ------------------------------------------------------------------------------------- inputs
    def make_inputs(self) -> dict[str, torch.Tensor]:
        """The kernel's inputs: float64 values rounded once to ``dtype``, on ``device``."""
        return {name: t.to(self.torch_dtype).to(self.device) for name, t in self.float64_inputs().items()}

    def float64_inputs(self) -> dict[str, torch.Tensor]:
        """The unrounded float64 CPU values (explicit ``values`` or generated from ``seed``)."""
        shapes = self.shapes()
        if self.values is not None:
            missing = sorted(set(shapes) - set(self.values))
            if missing:
                raise InvalidArgument(f"values is missing inputs {missing}; expected all of {sorted(shapes)}")
            out = {}
            for name, shape in shapes.items():
                flat = self.values[name]
                if len(flat) != math.prod(shape):
                    raise InvalidArgument(
                        f"values[{name!r}] has {len(flat)} elements; expected {math.prod(shape)} for shape {shape}"
                    )
                out[name] = torch.tensor(flat, dtype=torch.float64).reshape(shape)
            return out
        gen = torch.Generator().manual_seed(self.seed)
        return _GENERATORS[self.family](self, shapes, gen)

    @property
    def function_room(self) -> float:
        """Last-place errors of the elementwise functions one step evaluates, in units of ``u * magnitude``.

        The rounding bound (`harness.metrics.rounding_bound`) counts multiplies and adds; a correct kernel
        (and the float64 oracle) also evaluates exp, softplus, silu, powers and roots, each to within an
        ulp or two. Selective scan: exp(delta A) 1, the bias add 1, softplus (log1p of exp) 2, silu (exp,
        add, divide, multiply) 2; retention: the decay powers 1; its normed form also the root and the
        divide 2.
        """
        if self.family is Family.SELECTIVE_SCAN:
            return 1.0 + self.has_delta_bias + 2.0 * self.delta_softplus + 2.0 * self.has_z
        if self.family is Family.RETENTION:
            return 1.0
        if self.family is Family.RETENTION_NORMED:
            return 3.0
        return 0.0

    def call_kwargs(self) -> dict[str, Any]:
        """Keyword arguments besides the tensors (selective_scan's flag, eps, chunk_size)."""
        kw: dict[str, Any] = {}
        if self.family is Family.SELECTIVE_SCAN and self.delta_softplus:
            kw["delta_softplus"] = True
        if self.chunk_size is not None:
            kw["chunk_size"] = self.chunk_size
        return kw


def _randn(shape, gen) -> torch.Tensor:
    return torch.randn(shape, generator=gen, dtype=torch.float64)


def _uniform(shape, gen, lo: float, hi: float) -> torch.Tensor:
    return lo + (hi - lo) * torch.rand(shape, generator=gen, dtype=torch.float64)


def data_scale(regime: str, dtype: str, family: Family | str | None = None) -> float:
    """Scale of the data tensors: 1, or near the dtype's limits for ``large`` / ``tiny``.

    Outputs are products of three data factors, so each factor is scaled to max**(1/4) (tiny**(1/4)).
    The normed family squares its output in the norm, so there the factors are scaled to max**(1/6)
    with room for the sums over time and dv: a larger scale only makes every case out of domain.
    """
    info = torch.finfo(DTYPE_NAMES[dtype])
    normed = family is not None and Family.parse(family) is Family.RETENTION_NORMED
    if regime == "large":
        return float(info.max) ** (1 / 6) / 64.0 if normed else float(info.max) ** 0.25 / 4.0
    if regime == "tiny":
        return float(info.tiny) ** (1 / 6) * 4.0 if normed else float(info.tiny) ** 0.25 * 4.0
    return 1.0


def _linear_scan_inputs(p: Problem, shapes, gen) -> dict[str, torch.Tensor]:
    shape = shapes["a"]
    z = _randn(shape, gen)
    if p.regime == "long_memory":
        a = 1.0 - 10.0 ** _uniform(shape, gen, -4.0, -2.0)
    elif p.regime == "fast_decay":
        a = _uniform(shape, gen, 0.0, 0.5)
    elif p.regime == "unstable":
        a = z
    else:
        a = torch.exp(-torch.nn.functional.softplus(z - 2.0))
    b = _randn(shape, gen) * data_scale(p.regime, p.dtype, p.family)
    return {"a": a, "b": b}


def _selective_scan_inputs(p: Problem, shapes, gen) -> dict[str, torch.Tensor]:
    b, d, n, L = p.batch, p.dim, p.state, p.length
    s = data_scale(p.regime, p.dtype, p.family)
    if p.regime == "unstable":
        delta = _randn((b, d, L), gen)
        A = _randn((d, n), gen)
    else:
        if p.regime == "long_memory":
            dt = 10.0 ** _uniform((d, 1), gen, -4.0, -3.0)
            A = -_uniform((d, n), gen, 0.01, 1.0)
        elif p.regime == "fast_decay":
            dt = _uniform((d, 1), gen, 0.5, 1.0)
            A = -_uniform((d, n), gen, 2.0, 10.0)
        else:
            dt = 10.0 ** _uniform((d, 1), gen, -3.0, -1.0)
            A = -torch.exp(torch.log(torch.arange(1, n + 1, dtype=torch.float64)) + 0.1 * _randn((d, n), gen))
        if p.delta_softplus:
            # raw pre-activation whose softplus is about dt: the kernel applies the softplus
            delta = torch.log(torch.expm1(dt)) + 0.5 * _randn((b, d, L), gen)
        else:
            delta = dt * torch.exp(0.5 * _randn((b, d, L), gen))
    out = {"u": _randn((b, d, L), gen) * s, "delta": delta, "A": A,
           "B": _randn(shapes["B"], gen) * s, "C": _randn(shapes["C"], gen) * s}
    if p.has_D:  # D u is an output term like C h (~ s**3): D ~ s**2 keeps both paths visible
        out["D"] = _randn((d,), gen) * s * s
    if p.has_z:
        out["z"] = _randn((b, d, L), gen)
    if p.has_delta_bias:
        bias = 0.1 * _randn((d,), gen)
        if p.regime != "unstable" and not p.delta_softplus:
            # The decays see delta + bias: keep that sum the regime's positive draw, so every decay
            # factor stays below 1 whatever the bias (a bias of 0.1 against a step of 1e-4 made
            # long_memory's decays reach 1.1 and its state grow: that is the unstable regime). The bias
            # is scaled to the channel's step and taken out of delta (which may then be negative).
            bias = bias * dt[:, 0]
            out["delta"] = delta - bias[None, :, None]
        out["delta_bias"] = bias
    return out


def _retention_inputs(p: Problem, shapes, gen) -> dict[str, torch.Tensor]:
    if p.regime == "ramp":
        out = {}
        for name, shape in shapes.items():
            x = torch.arange(1, math.prod(shape) + 1, dtype=torch.float64)
            out[name] = (x / float(x.max())).reshape(shape)
        return out
    s = data_scale(p.regime, p.dtype, p.family)
    return {name: _randn(shape, gen) * s for name, shape in shapes.items()}


_GENERATORS = {
    Family.LINEAR_SCAN: _linear_scan_inputs,
    Family.SELECTIVE_SCAN: _selective_scan_inputs,
    Family.RETENTION: _retention_inputs,
    Family.RETENTION_NORMED: _retention_inputs,
}
