"""Per-dtype floating-point facts in one table, and measurements on a dtype's own grid.

The metrics judge a kernel against what its dtype can represent: the unit roundoff ``u`` scales the
a-priori error bounds, the largest finite value marks where the input domain ends (an input whose exact
state overflows the dtype is not a kernel bug), the smallest normal is the absolute floor below which
differences are underflow noise, and ULP distances are counted on the dtype's grid.

The table (`DTYPES`), one row per format; ``u = 2**-precision`` (round-to-nearest), ``precision`` counts
the significand bits including the implicit leading one, ``mantissa_bits`` the stored fraction bits:

=========  =========  =============  ===========  ===============  ==================  ==========
name       precision  mantissa_bits  u            max_finite       smallest_normal     subnormal
=========  =========  =============  ===========  ===============  ==================  ==========
float64    53         52             2**-53       1.797...e+308    2**-1022            2**-1074
float32    24         23             2**-24       3.403e+38        2**-126             2**-149
float16    11         10             2**-11       65504            2**-14              2**-24
bfloat16   8          7              2**-8        3.390e+38        2**-126             2**-133
tf32       11         10             2**-11       3.403e+38        2**-126             2**-149
tf32_rz    11         10             2**-10       3.403e+38        2**-126             2**-149
=========  =========  =============  ===========  ===============  ==================  ==========

``tf32`` is not a storage type: it is float32 storage whose matrix products are computed with a 10-bit
fraction on tensor cores (``torch.backends.cuda.matmul.allow_tf32``). Its range is float32's; only
``u`` differs. Pass ``tf32=True`` to `unit_roundoff` for a float32 kernel that multiplies in TF32.
``tf32_rz`` is TF32 reached by truncation: Triton hands float32 registers to the TF32 ``mma`` as they are
and the tensor core ignores the low 13 fraction bits (triton-lang/triton#4574), so an operand's relative
error reaches ``2**-10``, twice cuBLAS's rounded TF32. A kernel declares it (``computes_in``) for
float32 ``tl.dot`` calls that name no ``input_precision``.

The values match ``torch.finfo`` (``u = finfo.eps / 2``); the tests check that.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from harness.errors import InvalidArgument


@dataclass(frozen=True)
class DtypeInfo:
    """The facts about one floating-point format that the metrics use (see the module table)."""

    name: str
    torch_dtype: torch.dtype  # the storage dtype (float32 for tf32)
    precision: int  # significand bits including the implicit one: u = 2**-precision
    mantissa_bits: int  # stored fraction bits (precision - 1)
    unit_roundoff: float
    max_finite: float
    smallest_normal: float
    smallest_subnormal: float
    int_view: torch.dtype  # the signed integer type of the same width, for ordered bit patterns

    @property
    def eps(self) -> float:
        """Machine epsilon, the gap between 1.0 and the next value: ``2 * u``."""
        return 2.0 * self.unit_roundoff


DTYPES: dict[str, DtypeInfo] = {
    "float64": DtypeInfo(
        "float64", torch.float64, 53, 52, 2.0**-53, 1.7976931348623157e308, 2.0**-1022, 2.0**-1074, torch.int64
    ),
    "float32": DtypeInfo(
        "float32", torch.float32, 24, 23, 2.0**-24, 3.4028234663852886e38, 2.0**-126, 2.0**-149, torch.int32
    ),
    "float16": DtypeInfo("float16", torch.float16, 11, 10, 2.0**-11, 65504.0, 2.0**-14, 2.0**-24, torch.int16),
    "bfloat16": DtypeInfo(
        "bfloat16", torch.bfloat16, 8, 7, 2.0**-8, 3.3895313892515355e38, 2.0**-126, 2.0**-133, torch.int16
    ),
    # float32 storage, 10-bit fraction in tensor-core matmuls (NVIDIA A100 whitepaper; torch docs on TF32).
    "tf32": DtypeInfo("tf32", torch.float32, 11, 10, 2.0**-11, 3.4028234663852886e38, 2.0**-126, 2.0**-149, torch.int32),
    # the same products with truncated operands (round toward zero): Triton's TF32 tl.dot on NVIDIA GPUs
    "tf32_rz": DtypeInfo("tf32_rz", torch.float32, 11, 10, 2.0**-10, 3.4028234663852886e38, 2.0**-126, 2.0**-149,
                         torch.int32),
}

#: Other spellings accepted wherever a dtype name is.
ALIASES: dict[str, str] = {
    "fp64": "float64",
    "double": "float64",
    "fp32": "float32",
    "float": "float32",
    "fp16": "float16",
    "half": "float16",
    "bf16": "bfloat16",
}

_BY_TORCH: dict[torch.dtype, str] = {
    torch.float64: "float64",
    torch.float32: "float32",
    torch.float16: "float16",
    torch.bfloat16: "bfloat16",
}


def dtype_key(dtype: torch.dtype | str) -> str:
    """The table name of ``dtype`` (a `torch.dtype`, a name, or an alias such as ``"bf16"``)."""
    if isinstance(dtype, torch.dtype):
        if dtype in _BY_TORCH:
            return _BY_TORCH[dtype]
    elif isinstance(dtype, str):
        key = dtype.strip().lower()
        if key.startswith("torch."):
            key = key[len("torch.") :]
        key = ALIASES.get(key, key)
        if key in DTYPES:
            return key
    raise InvalidArgument(
        f"dtype={dtype!r} is not a floating-point format the harness knows; "
        f"expected a torch dtype or one of {list(DTYPES)}"
    )


def info(dtype: torch.dtype | str) -> DtypeInfo:
    """The `DtypeInfo` row for ``dtype``."""
    return DTYPES[dtype_key(dtype)]


def torch_dtype(dtype: torch.dtype | str) -> torch.dtype:
    """The storage `torch.dtype` of ``dtype`` (``"tf32"`` -> ``torch.float32``)."""
    return info(dtype).torch_dtype


def unit_roundoff(dtype: torch.dtype | str, *, tf32: bool = False) -> float:
    """``u`` of ``dtype``; with ``tf32=True`` a float32 dtype gets TF32's ``2**-11`` (others are unchanged)."""
    key = dtype_key(dtype)
    if tf32 and key == "float32":
        key = "tf32"
    return DTYPES[key].unit_roundoff


def round_to(x: torch.Tensor, dtype: torch.dtype | str) -> torch.Tensor:
    """Round float64 values onto ``dtype``'s grid (round to nearest even), returned as float64.

    Values beyond the range become +-inf, values below half the smallest subnormal become +-0, exactly
    as a cast does. ``"tf32"`` rounds to float32 (the storage grid).
    """
    return x.to(torch_dtype(dtype)).to(torch.float64)


def ulp_distance(x: torch.Tensor, y: torch.Tensor, dtype: torch.dtype | str) -> torch.Tensor:
    """How many representable ``dtype`` values lie between ``x`` and ``y`` (float64 tensor, elementwise).

    ``x`` and ``y`` are first rounded onto the dtype's grid (a no-op for values already there). The
    distance is counted through ordered bit patterns, so it is exact across binades, across zero
    (``-tiny`` to ``+tiny`` is 2 for the smallest subnormal) and into the subnormals; ``-0.0`` and
    ``+0.0`` are 0 apart; ``+inf`` is 1 ulp above the largest finite value; a NaN on either side gives
    ``inf``. Distances beyond 2**53 (possible only in float64) are rounded to float64.
    """
    d = info(dtype)
    x = torch.as_tensor(x)
    y = torch.as_tensor(y)
    x, y = torch.broadcast_tensors(x, y)
    xs = x.detach().to("cpu", d.torch_dtype)
    ys = y.detach().to("cpu", d.torch_dtype)
    dist = grid_distance(xs, ys)
    nan = torch.isnan(xs) | torch.isnan(ys)
    return dist.masked_fill_(nan, math.inf)


#: The signed integer type of each float dtype's width: its bit patterns, as `grid_distance` reads them.
INT_VIEW: dict[torch.dtype, torch.dtype] = {
    torch.float64: torch.int64,
    torch.float32: torch.int32,
    torch.float16: torch.int16,
    torch.bfloat16: torch.int16,
}


def grid_distance(xs: torch.Tensor, ys: torch.Tensor) -> torch.Tensor:
    """`ulp_distance` for two tensors of the same shape already in the same floating dtype, without the
    NaN handling (a NaN's distance is then meaningless); float64 result. The metrics' inner loop.

    Ordered integers: a bit pattern ``i`` read as a signed integer orders the non-negative floats
    (``+0.0`` is 0, ``+inf`` is just above the largest finite value); a negative float reads as
    ``i = MIN + m`` with ``m`` its magnitude's pattern, and ``MIN - i = -m`` mirrors it below zero, so
    ``-0.0`` lands on 0 beside ``+0.0``. Two values of the same sign are ``|i_x - i_y|`` apart (this
    cannot overflow the integer type); two of opposite signs ``m_x + m_y`` apart, summed in float64
    (it can exceed the integer type).
    """
    iv = INT_VIEW[xs.dtype]
    bx = xs.contiguous().view(iv)
    by = ys.contiguous().view(iv)
    dist = (bx - by).abs_().to(torch.float64)  # right where the signs agree
    mixed = (bx ^ by) < 0
    if bool(mixed.any()):
        top = torch.iinfo(iv).max
        mx = (bx[mixed] & top).to(torch.float64)
        my = (by[mixed] & top).to(torch.float64)
        dist[mixed] = mx + my
    return dist


def significant_bits(rel_err: float | torch.Tensor, dtype: torch.dtype | str) -> float | torch.Tensor:
    """Correct significant bits implied by a relative error: ``-log2(rel_err)``, clipped to [0, precision].

    ``rel_err = 0`` gives the dtype's full precision (53 for float64, 24 for float32, ...), a relative
    error of 1 or more (or NaN) gives 0. A tensor argument gives a float64 tensor, a number a float.
    """
    p = float(info(dtype).precision)
    if isinstance(rel_err, torch.Tensor):
        r = rel_err.to(torch.float64)
        bits = (-torch.log2(r)).clamp(0.0, p)
        return torch.where(torch.isnan(r), torch.zeros_like(bits), bits)
    r = float(rel_err)
    if math.isnan(r) or r >= 1.0:
        return 0.0
    if r <= 0.0:
        return p
    return min(p, max(0.0, -math.log2(r)))
