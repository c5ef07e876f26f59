"""The kernel contract: the four families, their call signatures, and what an adapter declares.

A kernel belongs to one `Family` and is a callable with that family's signature. The harness hands it
tensors in the case's dtype on the case's device and expects the documented output shape back:

- ``linear_scan``: ``fn(a, b) -> h``; a, b (batch, channels, length); ``h_t = a_t * h_{t-1} + b_t``,
  ``h_{-1} = 0``.
- ``selective_scan``: ``fn(u, delta, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False) -> y``
  with the layout and meaning of mamba-ssm's ``selective_scan_fn``: u, delta (batch, dim, L); A (dim, N);
  B, C (batch, N, L) or grouped (batch, G, N, L); D (dim,); z (batch, dim, L); delta_bias (dim,).
- ``retention``: ``fn(q, k, v) -> o``; q, k (batch, L, heads, dk), v (batch, L, heads, dv); per-head decay
  ``gamma_h = 1 - 2**(-5 - h)`` and scale ``dk**-0.5`` unless the spec declares another convention.
- ``retention_normed``: ``fn(q, k, v, eps) -> o``: the same followed by the per-head RMS group norm.

Kernels that take a chunk size accept ``chunk_size=`` as a keyword; the harness draws it.

A `KernelSpec` is what a module registers. It never imports the third-party package itself: ``load``
does, lazily, and raises `KernelUnavailable` with the reason when it cannot.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch

from harness.errors import InvalidArgument, KernelUnavailable


class Family(str, enum.Enum):
    """The four kernel families; the value is the name used on the command line and in records."""

    LINEAR_SCAN = "linear_scan"
    SELECTIVE_SCAN = "selective_scan"
    RETENTION = "retention"
    RETENTION_NORMED = "retention_normed"

    @classmethod
    def parse(cls, value: "str | Family") -> "Family":
        if isinstance(value, Family):
            return value
        try:
            return cls(value)
        except ValueError:
            names = ", ".join(f.value for f in cls)
            raise InvalidArgument(f"family={value!r} is not a kernel family; expected one of: {names}") from None

    @property
    def output_name(self) -> str:
        return {"linear_scan": "h", "selective_scan": "y"}.get(self.value, "o")


class Lengths(str, enum.Enum):
    """Which sequence lengths a kernel accepts."""

    ANY = "any"
    POW2 = "pow2"
    CHUNK_MULTIPLE = "chunk_multiple"


DTYPE_NAMES: dict[str, torch.dtype] = {
    "float64": torch.float64,
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
}
ALL_DTYPES: tuple[str, ...] = tuple(DTYPE_NAMES)


def dtype_name(dtype: torch.dtype | str) -> str:
    """`torch.float32` -> ``"float32"``; validates names."""
    if isinstance(dtype, str):
        if dtype not in DTYPE_NAMES:
            raise InvalidArgument(f"dtype={dtype!r} is not supported; expected one of {list(DTYPE_NAMES)}")
        return dtype
    for name, dt in DTYPE_NAMES.items():
        if dt == dtype:
            return name
    raise InvalidArgument(f"dtype={dtype!r} is not supported; expected one of {list(DTYPE_NAMES)}")


def retnet_gammas(heads: int) -> tuple[float, ...]:
    """RetNet's per-head decay: ``gamma_h = 1 - 2**(-5 - h)`` for h = 0..heads-1."""
    return tuple(1.0 - 2.0 ** (-5 - h) for h in range(heads))


def inverse_sqrt_scale(dk: int) -> float:
    """RetNet's query scale ``dk ** -0.5``."""
    return dk**-0.5


@dataclass(frozen=True)
class Capabilities:
    """What a kernel supports; the strategies draw only inside it.

    ``dtypes`` and ``devices`` list what the kernel is run on; ``unsupported`` maps a dtype name, device
    or ``"dtype@device"`` (e.g. ``"bfloat16@cpu"``) to the reason it is left out, so that a limitation
    of the environment (e.g. the Triton interpreter) is reported as such and not as a kernel bug.
    ``chunk_sizes``: None when the kernel takes no ``chunk_size``; an empty tuple when any positive
    chunk size works; otherwise the allowed values.
    """

    dtypes: tuple[str, ...] = ALL_DTYPES
    devices: tuple[str, ...] = ("cpu", "cuda")
    lengths: Lengths = Lengths.ANY
    min_length: int = 1
    max_length: int | None = None
    chunk_sizes: tuple[int, ...] | None = None
    autograd: bool = False
    grouped_bc: bool = True  # selective_scan: accepts B/C of shape (batch, G, N, L)
    selective_options: bool = True  # selective_scan: accepts D, z, delta_bias, delta_softplus
    max_state: int | None = None  # selective_scan: largest N; retention: largest dk/dv
    head_dims: tuple[int, ...] | None = None  # retention: allowed dk/dv values (None: any)
    unsupported: dict[str, str] = field(default_factory=dict)
    slow: bool = False  # run by an interpreter (Triton on the CPU): the suite draws fewer, shorter cases
    #: Declared internal precision: input dtype -> the dtype the kernel really computes in (e.g.
    #: ``{"float64": "float32"}`` for a kernel whose norm or state is float32 whatever the input). The
    #: case still runs in the input dtype; the verdict holds it to the declared precision's rounding and
    #: the report shows the declaration, so the floor it causes is explained, not hidden.
    computes_in: dict[str, str] = field(default_factory=dict)
    #: retention_normed: the norm eps values at which the kernel is the oracle's function (None: any).
    #: A kernel that rescales rows before its norm agrees with the plain normed retention only at
    #: eps = 0; the suite then draws eps = 0, and sweeps show the eps effect separately.
    eps_values: tuple[float, ...] | None = None
    notes: str = ""

    @property
    def takes_chunk(self) -> bool:
        return self.chunk_sizes is not None

    def precision(self, dtype: str) -> str:
        """The dtype whose rounding the verdict expects for inputs of ``dtype``."""
        return self.computes_in.get(dtype, dtype)

    def runs(self, dtype: str, device: str) -> str | None:
        """None if (dtype, device) is in range, else the reason it is not."""
        for key in (f"{dtype}@{device}", dtype, device):
            if key in self.unsupported:
                return self.unsupported[key]
        if dtype not in self.dtypes:
            return f"dtype {dtype} is not among the declared dtypes {list(self.dtypes)}"
        if device not in self.devices:
            return f"device {device} is not among the declared devices {list(self.devices)}"
        return None

    def accepts_length(self, length: int, chunk_size: int | None = None) -> bool:
        if length < self.min_length or (self.max_length is not None and length > self.max_length):
            return False
        if self.lengths is Lengths.POW2:
            return length & (length - 1) == 0
        if self.lengths is Lengths.CHUNK_MULTIPLE:
            return chunk_size is not None and length % chunk_size == 0
        return True


@dataclass(frozen=True)
class RetentionConvention:
    """How a retention kernel defines decay and scale; the oracle follows the declaration.

    ``gammas(heads)`` gives the per-head decay, ``scale(dk)`` the factor on ``q S``.
    """

    gammas: Callable[[int], Sequence[float]] = retnet_gammas
    scale: Callable[[int], float] = inverse_sqrt_scale
    name: str = "retnet"


RETNET = RetentionConvention()


@dataclass(frozen=True)
class KernelSpec:
    """One kernel the harness can drive.

    ``load()`` returns the callable with the family's signature (importing its package lazily) or
    raises `KernelUnavailable`. ``name`` is dotted: ``<source>.<form>`` (``intree.blelloch``,
    ``mambapy.pscan``).
    """

    name: str
    family: Family
    load: Callable[[], Callable]
    capabilities: Capabilities = field(default_factory=Capabilities)
    convention: RetentionConvention = RETNET
    description: str = ""
    source: str = "intree"  # "intree", a third-party package name, "user" or "entry-point:<dist>"

    def __post_init__(self) -> None:
        object.__setattr__(self, "family", Family.parse(self.family))

    def unavailable_reason(self) -> str | None:
        """None when the kernel loads here, else the reason (cached per process)."""
        try:
            _load_cached(self)
        except KernelUnavailable as exc:
            return exc.reason
        return None

    def callable(self) -> Callable:
        """The loaded kernel; raises `KernelUnavailable` with the reason."""
        return _load_cached(self)


_LOADED: dict[tuple[str, int], Callable | KernelUnavailable] = {}


def _load_cached(spec: KernelSpec) -> Callable:
    key = (spec.name, id(spec.load))
    if key not in _LOADED:
        try:
            _LOADED[key] = spec.load()
        except KernelUnavailable as exc:
            _LOADED[key] = exc
        except ImportError as exc:  # a missing package is the common case; say which
            _LOADED[key] = KernelUnavailable(f"import failed: {exc}")
    value = _LOADED[key]
    if isinstance(value, KernelUnavailable):
        raise value
    return value


def require_module(module: str, *, package: str | None = None):
    """Import ``module`` or raise `KernelUnavailable` naming the pip package to install."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:
        pkg = package or module.split(".")[0]
        raise KernelUnavailable(f"package {pkg!r} is not installed ({exc}); `pip install {pkg}`") from None


def require_cuda() -> None:
    """Raise `KernelUnavailable` when no CUDA device is present."""
    if not torch.cuda.is_available():
        raise KernelUnavailable("needs a CUDA device; none is present on this machine")


def is_pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def next_pow2(n: int) -> int:
    return 1 << max(0, math.ceil(math.log2(max(n, 1))))
