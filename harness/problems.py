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
- ``large_dt`` (selective scan and SSD): steps of 20 to 60, with the softplus where the kernel takes the flag
  (pre-activations where softplus is linear and a softplus written as ``log1p(exp(x))`` overflows float16 past
  11), A in [-0.5, -0.05]: log-decays of -1 to -30 per step. Float64 cases keep the pre-activations out of
  (20, 37), where torch's softplus (x itself above 20) and the exact one differ (`harness.families.ssd`).
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

from harness import families
from harness.errors import InvalidArgument, ProblemTooLarge
from harness.families.base import randn, uniform
from harness.kernels.contract import DTYPE_NAMES, Family, dtype_name

#: The input regimes of each family (`harness.families`: each family's ``regimes``).
REGIMES: dict[Family, tuple[str, ...]] = {Family.parse(name): families.get(name).regimes for name in families.MODULES}

#: Problem fields added after records existed, with their defaults: `Problem.to_dict` leaves them out
#: at these values, so that a problem that does not use them keeps its key.
LATER_FIELDS: dict[str, Any] = {"has_initial_state": False, "final_state": False, "cu_seqlens": None,
                                "decay_floor": None, "range_dtype": None, "scale": None}

#: Largest number of elements a problem may carry as explicit ``values`` (hypothesis-drawn cases).
MAX_EXPLICIT_ELEMENTS = 4096

#: Largest number of input elements (all inputs together) of a problem: 2 GiB in float64, about three
#: times the nightly profile's largest (gla at L = 32,768, 3 x 4 heads of 64). A case file or a sweep
#: asking for more (L = 10**9) is refused with the sizes, not left to fail inside an allocation.
MAX_PROBLEM_ELEMENTS = 2**28

#: Seeds are drawn below 2**31; any one up to 2**63 - 1 is accepted (the generators take 64 bits, and
#: the gradients' cotangent adds to the seed).
MAX_SEED = 2**63 - 1


def _whole(value: Any) -> bool:
    """An int that is not a bool (JSON's ``true`` would otherwise pass as 1)."""
    return isinstance(value, int) and not isinstance(value, bool)


def _check_values(values: Any) -> None:
    """Explicit ``values``: a mapping of input names to flat lists of real numbers (a case file's)."""
    if not isinstance(values, dict):
        raise InvalidArgument(f"values={values!r} must map input names to lists of numbers")
    for name, flat in values.items():
        if isinstance(flat, (str, bytes)) or not hasattr(flat, "__len__"):
            raise InvalidArgument(f"values[{name!r}]={flat!r} must be a list of numbers")
        bad = next((v for v in flat if isinstance(v, bool) or not isinstance(v, (int, float))), None)
        if bad is not None:
            raise InvalidArgument(f"values[{name!r}] holds {bad!r}; expected real numbers only")


@dataclass(frozen=True)
class Problem:
    """One case's inputs, described as data.

    Which fields a family reads, and the shapes it makes of them, is the family's definition
    (`harness.families`): linear_scan uses (batch, dim, length); selective_scan (batch, dim, length) with
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
    # fields added with the gated families: left out of `to_dict` at their defaults (`LATER_FIELDS`), so
    # the keys of the problems of the other families are those they always had
    has_initial_state: bool = False
    final_state: bool = False
    cu_seqlens: tuple[int, ...] | None = None
    decay_floor: float | None = None
    #: The dtype whose range the ``large`` and ``tiny`` regimes scale to, when not ``dtype``: a kernel that
    #: declares it computes in a narrower dtype (torchscale: float64 inputs in float32) is drawn those
    #: regimes at that dtype's scale, where its cases can be judged (at float64's they overflow float32
    #: from t=0, out of domain).
    range_dtype: str | None = None
    #: simple_gla, gla: the ``scale`` passed to the kernel (None: not passed, the kernel's default K**-0.5)
    scale: float | None = None
    values: dict[str, list[float]] | None = field(default=None, compare=False, hash=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "family", Family.parse(self.family))
        if self.cu_seqlens is not None:
            if isinstance(self.cu_seqlens, (str, bytes)) or not all(_whole(c) for c in self.cu_seqlens):
                raise InvalidArgument(f"cu_seqlens={self.cu_seqlens!r} must be a list of integers")
            object.__setattr__(self, "cu_seqlens", tuple(int(c) for c in self.cu_seqlens))
        object.__setattr__(self, "dtype", dtype_name(self.dtype))
        if self.range_dtype is not None:
            object.__setattr__(self, "range_dtype", dtype_name(self.range_dtype))
        positive = {"length": self.length, "batch": self.batch, "dim": self.dim, "state": self.state,
                    "heads": self.heads, "dk": self.dk, "dv": self.dv}
        for name, value in positive.items():
            if not _whole(value) or value < 1:
                raise InvalidArgument(f"{name}={value!r} must be a positive integer")
        if self.chunk_size is not None and (not _whole(self.chunk_size) or self.chunk_size < 1):
            raise InvalidArgument(f"chunk_size={self.chunk_size!r} must be a positive integer or None")
        flags = [f.name for f in dataclasses.fields(self) if f.type == "bool"]
        for name in flags:  # a case file's "yes" or 2 would pass as true (and "no" too)
            if not isinstance(getattr(self, name), bool):
                raise InvalidArgument(f"{name}={getattr(self, name)!r} is a {type(getattr(self, name)).__name__}; "
                                      "expected true or false")
        if self.values is not None:
            _check_values(self.values)
        regimes = self.definition.regimes
        if self.regime not in regimes:
            raise InvalidArgument(
                f"regime={self.regime!r} does not apply to family {self.family.value}; "
                f"expected one of {list(regimes)}"
            )
        self.definition.validate(self)
        if self.device not in ("cpu", "cuda") and not self.device.startswith("cuda:"):
            raise InvalidArgument(f"device={self.device!r} must be 'cpu' or 'cuda[:n]'")
        if not isinstance(self.seed, int) or isinstance(self.seed, bool) or not 0 <= self.seed <= MAX_SEED:
            raise InvalidArgument(f"seed={self.seed!r} must be an integer from 0 to 2**63 - 1")
        shapes = self.shapes()
        if sum(math.prod(shape) for shape in shapes.values()) > MAX_PROBLEM_ELEMENTS:
            sizes = ", ".join(f"{name} {tuple(shape)}" for name, shape in shapes.items())
            raise ProblemTooLarge(
                f"the problem is too large: its inputs ({sizes}) hold {self.n_elements():,} elements, more than "
                f"MAX_PROBLEM_ELEMENTS = {MAX_PROBLEM_ELEMENTS:,} (length={self.length}, batch={self.batch})")

    # ----------------------------------------------------------------------------------- identity
    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready fields (values included only when present)."""
        # a field-by-field copy: dataclasses.asdict deep-copies the values one float at a time (2.75 ms
        # for 4096 of them, on every case a hypothesis draw carries)
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        d["family"] = self.family.value
        for name, default in LATER_FIELDS.items():
            if d[name] == default:
                del d[name]
            elif name == "cu_seqlens":
                d[name] = list(d[name])
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
    def scale_dtype(self) -> str:
        """The dtype the regimes' data scale follows: `range_dtype` when given, else ``dtype``."""
        return self.range_dtype or self.dtype

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPE_NAMES[self.dtype]

    @property
    def definition(self) -> "families.FamilyDef":
        """The family's definition (`harness.families`)."""
        return families.get(self.family)

    @property
    def length_axis(self) -> int:
        """The axis of the sequence in the family's output."""
        return self.definition.length_axis

    def shapes(self) -> dict[str, tuple[int, ...]]:
        """The shape of each input tensor, by name, in the family's layout."""
        return self.definition.shapes(self)

    def n_elements(self) -> int:
        return sum(math.prod(s) for s in self.shapes().values())

    # ------------------------------------------------------------------------------------- inputs
    def make_inputs(self) -> dict[str, torch.Tensor]:
        """The kernel's inputs: float64 values rounded once to ``dtype``, on ``device``."""
        if self.device != "cpu" and not torch.cuda.is_available():
            raise InvalidArgument(f"device={self.device!r} but this machine has no CUDA device "
                                  "(torch.cuda.is_available() is False); run the case where it was found, or on 'cpu'")
        return {name: t.to(self.torch_dtype).to(self.device) for name, t in self.float64_inputs().items()}

    def float64_inputs(self) -> dict[str, torch.Tensor]:
        """The unrounded float64 CPU values (explicit ``values`` or generated from ``seed``)."""
        shapes = self.shapes()
        if self.values is not None:
            missing, extra = sorted(set(shapes) - set(self.values)), sorted(set(self.values) - set(shapes))
            if missing or extra:
                wrong = f"is missing inputs {missing}" if missing else f"has inputs {extra} the problem does not take"
                raise InvalidArgument(f"values {wrong}; expected exactly {sorted(shapes)}")
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
        return self.definition.generate(self, shapes, gen)

    @property
    def function_room(self) -> float:
        """Last-place errors of the elementwise functions one step evaluates, in units of ``u * magnitude``.

        The rounding bound (`harness.metrics.rounding_bound`) counts multiplies and adds; a correct kernel
        (and the float64 oracle) also evaluates exp, softplus, silu, powers and roots, each to within an
        ulp or two: each family's definition counts its own (`FamilyDef.function_room`).
        """
        return self.definition.function_room(self)

    def call_kwargs(self) -> dict[str, Any]:
        """Keyword arguments besides the tensors (selective_scan's flag, eps, chunk_size)."""
        return self.definition.call_kwargs(self)

    def positional_names(self) -> list[str | None]:
        """The names of the kernel call's positional arguments (``["q", "k", "v", "g"]``; None for one that is
        not an input tensor): a message about "input #3" names it ``g``."""
        names, args, _ = self._meta_call()
        return [names.get(id(a)) if isinstance(a, torch.Tensor) else None for a in args]

    def _meta_call(self) -> tuple[dict[int, str], tuple, dict[str, Any]]:
        """The call's arguments made of meta tensors (no memory), and each input tensor's name by its id."""
        meta = {name: torch.empty(shape, dtype=self.torch_dtype, device="meta") for name, shape in self.shapes().items()}
        args, kwargs = self.definition.call_args(self, meta, dict(self.call_kwargs()))
        return {id(t): n for n, t in meta.items()}, args, kwargs

    def describe_call(self) -> str:
        """The kernel call this problem makes, tensors by shape: ``fn(u (2, 3, 5), ..., delta_softplus=True)``;
        a packed batch's boundaries with their values (``cu_seqlens=(3,) int64 [0, 2, 5]``, and ssd's
        ``seq_idx`` with the cu_seqlens it is made of): a varlen bug depends on them.

        What a kernel that raised or returned the wrong shape was handed (grouped B and C, a chunk size,
        an option it does not take), which the case's output shape alone does not say."""
        names, args, kwargs = self._meta_call()

        def show(value: Any, name: str = "") -> str:
            if not isinstance(value, torch.Tensor):
                return repr(value)
            text = f"{tuple(value.shape)} {str(value.dtype).removeprefix('torch.')}"
            if name in ("cu_seqlens", "seq_idx") and self.cu_seqlens is not None:
                text += f" {list(self.cu_seqlens)}" if name == "cu_seqlens" else f" (cu_seqlens {list(self.cu_seqlens)})"
            return text

        parts = [f"{names.get(id(a), 'arg')} {show(a)}" if isinstance(a, torch.Tensor) else show(a) for a in args]
        parts += [f"{k}={show(v, k)}" for k, v in kwargs.items()]
        return f"fn({', '.join(parts)})"


# the generators' helpers, kept under their old names for callers that import them from here
_randn, _uniform = randn, uniform

