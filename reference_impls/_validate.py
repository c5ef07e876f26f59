"""Argument checks shared by the oracles, with messages that name the argument, its value and the fix.

Messages follow the project's form ``f"{name}={value!r} {what is wrong}; {what was expected}"``. Bad
shapes and values raise `ValueError`, wrong types and non-floating dtypes raise `TypeError`. This
module does not import `harness` (the oracles stay independent of the code they judge).
"""

from __future__ import annotations

import math
import numbers
from typing import Sequence

import torch


def _shape(x: torch.Tensor) -> tuple[int, ...]:
    return tuple(int(s) for s in x.shape)


def floating_tensor(name: str, x: object) -> torch.Tensor:
    """``x`` itself when it is a real floating `torch.Tensor`; else TypeError naming ``name``."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} is a {type(x).__name__}; expected a torch.Tensor (e.g. torch.as_tensor({name}))")
    if not x.is_floating_point():
        raise TypeError(
            f"{name}.dtype={x.dtype} is not a real floating dtype; expected float16, bfloat16, float32 or "
            f"float64 (convert with {name}.double())"
        )
    return x


def optional_tensor(name: str, x: object) -> torch.Tensor | None:
    return None if x is None else floating_tensor(name, x)


def floating_dtype(name: str, dtype: object) -> torch.dtype:
    """A real floating `torch.dtype`; else TypeError."""
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(
            f"{name}={dtype!r} is not a real floating torch.dtype; expected torch.float64 (the oracle) or a "
            f"kernel's dtype (torch.float32, torch.float16, torch.bfloat16)"
        )
    return dtype


def rank(name: str, x: torch.Tensor, layout: str) -> None:
    """Check that ``x`` has as many dimensions as ``layout`` names, e.g. ``"(batch, dim, L)"``."""
    ndim = layout.count(",") + 1
    if x.ndim != ndim:
        raise ValueError(
            f"{name}.shape={_shape(x)} has {x.ndim} dimension(s); expected {ndim}: {layout}"
        )


def shape(name: str, x: torch.Tensor, layout: str, expected: Sequence[int], hint: str = "") -> None:
    """Check ``x.shape == expected``; the message spells out ``layout = expected``."""
    expected = tuple(int(s) for s in expected)
    if _shape(x) != expected:
        extra = f" or {hint}" if hint else ""
        raise ValueError(f"{name}.shape={_shape(x)} does not match: expected {layout} = {expected}{extra}")


def positive_dim(name: str, x: torch.Tensor, axis_name: str, axis: int) -> None:
    """Check that axis ``axis`` of ``x`` (called ``axis_name``) is at least 1."""
    if x.shape[axis] < 1:
        raise ValueError(f"{name}.shape={_shape(x)} has {axis_name}=0; expected {axis_name} >= 1")


def real_number(name: str, value: object) -> float:
    """A real Python/NumPy number, or a 0-dim real floating tensor, as float; TypeError otherwise."""
    if isinstance(value, torch.Tensor) and value.ndim == 0 and value.is_floating_point():
        return float(value)
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        what = f"Tensor of shape {_shape(value)}" if isinstance(value, torch.Tensor) else type(value).__name__
        raise TypeError(f"{name}={value!r} is a {what}; expected a real number")
    return float(value)


def eps(value: object) -> float:
    """``eps`` as float: finite and >= 0."""
    eps_ = real_number("eps", value)
    if not (eps_ >= 0.0) or math.isinf(eps_):
        raise ValueError(
            f"eps={value!r} must be finite and >= 0; it is added to the mean square (or variance) under the "
            f"square root, e.g. eps=1e-6"
        )
    return eps_


def norm_kind(kind: object) -> str:
    if kind not in ("rms", "layer"):
        raise ValueError(
            f"kind={kind!r} is not a group-norm kind; expected 'rms' (o / sqrt(mean(o^2) + eps)) or "
            f"'layer' ((o - mean) / sqrt(var + eps))"
        )
    return kind  # type: ignore[return-value]


def per_head(name: str, value: object, heads: int) -> torch.Tensor:
    """A sequence of floats or a tensor of shape (heads,), returned as a float64 CPU tensor."""
    if isinstance(value, torch.Tensor):
        floating_tensor(name, value)
        if value.ndim != 1 or value.shape[0] != heads:
            raise ValueError(
                f"{name}.shape={_shape(value)} does not match: expected one value per head, (heads,) = ({heads},)"
            )
        return value.detach().to(device="cpu", dtype=torch.float64)
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise TypeError(f"{name}={value!r} is a {type(value).__name__}; expected a sequence of {heads} floats or a tensor of shape ({heads},)")
    if len(value) != heads:
        raise ValueError(f"{name}={value!r} has {len(value)} value(s); expected one per head (heads={heads})")
    return torch.tensor([real_number(f"{name}[{i}]", g) for i, g in enumerate(value)], dtype=torch.float64)
