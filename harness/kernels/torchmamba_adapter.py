"""Adapters for torchmamba (``pip install torchmamba``): PyTorch reference kernels for Mamba-1/2/3.

Not installable on this project's machines: every release (0.1.0, 0.1.1, 0.1.2) declares
``Requires-Python >=3.12``, and 0.1.2 also ``torch>=2.14.0``; the machines run Python 3.11 and torch 2.13.
Its source parses under 3.11, but installing it would take ``--ignore-requires-python`` and a torch it
does not declare support for, so it is treated as unavailable rather than forced in. Where it is
installed (Python >= 3.12), these adapters drive it:

- ``torchmamba.selective_scan_loop``: ``torchmamba.mamba1.core.selective_scan_loop(x, dt, A, B, C,
  D_skip=None, h0=None) -> (y, h_last)``, a loop over t (exponential-Euler: ``h = exp(dt A) h + dt B x``,
  ``y = C.h + D_skip x``);
- ``torchmamba.selective_scan_matrix``: ``selective_scan_matrix`` (same arguments), the explicit
  (L, L) decay mixer, which raises for L > 32 (``max_length=32``).

Layouts: x, dt (B, L, D); A (D, N); B, C (B, L, N); D_skip (D,) or None. Ours (batch, dim, L) and
(batch, N, L) are transposed (fresh contiguous copies) and y is transposed back. Both take ``dt`` after
softplus and A as given, have no z gate, no delta bias and no groups: ``selective_options`` (which also
covers D) and ``grouped_bc`` are off. Per the package's dtype policy, float16/bfloat16/float32 inputs are
computed in float32 and float64 in float64; outputs return in the input dtype.

Mamba-2 (``ssd_*``) and Mamba-3 forms are left out: their decay is a scalar per head, not the per-(channel,
state) A of this family (see docs/adapters.md).
"""

from __future__ import annotations

import sys
from typing import Callable

import torch

from harness.errors import InvalidArgument, KernelUnavailable
from harness.kernels.contract import Capabilities, Family, KernelSpec, require_module

__all__ = ["KERNELS"]

PACKAGE = "torchmamba"

_NOT_ON_311 = ("torchmamba is not installed and cannot be on Python {v}: every release (0.1.0-0.1.2) declares "
               "Requires-Python >=3.12 (0.1.2 also torch>=2.14), so pip refuses it; forcing it with "
               "--ignore-requires-python is not done")


def _core():
    try:
        return require_module("torchmamba.mamba1.core", package=PACKAGE)
    except KernelUnavailable:
        if sys.version_info < (3, 12):
            version = f"{sys.version_info.major}.{sys.version_info.minor}"
            raise KernelUnavailable(_NOT_ON_311.format(v=version)) from None
        raise


def _copy_t(t: torch.Tensor) -> torch.Tensor:
    """(batch, c, L) -> a fresh contiguous (batch, L, c)."""
    return t.transpose(1, 2).clone(memory_format=torch.contiguous_format)


def _load(form: str) -> Callable:
    fn = getattr(_core(), form)
    name = f"torchmamba.{form}"

    def torchmamba_selective_scan(u, delta, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False):
        if B.dim() != 3 or C.dim() != 3:
            raise InvalidArgument(f"B.shape={tuple(B.shape)!r}: {name} takes B, C of shape (batch, N, L) only "
                                  "(grouped_bc=False)")
        if z is not None or delta_bias is not None or delta_softplus:
            raise InvalidArgument(f"z, delta_bias and delta_softplus are not taken by {name} "
                                  "(selective_options=False): torchmamba applies them outside the scan")
        y, _h_last = fn(_copy_t(u), _copy_t(delta), A.clone(), _copy_t(B), _copy_t(C),
                        D_skip=None if D is None else D.clone())
        return y.transpose(1, 2).contiguous().to(u.dtype)

    torchmamba_selective_scan.__name__ = form
    return torchmamba_selective_scan


_CAPS = dict(autograd=True, grouped_bc=False, selective_options=False)

KERNELS: list[KernelSpec] = [
    KernelSpec(
        name="torchmamba.selective_scan_loop",
        family=Family.SELECTIVE_SCAN,
        load=lambda: _load("selective_scan_loop"),
        capabilities=Capabilities(**_CAPS, notes="loop over t; half and float32 computed in float32"),
        description="torchmamba.mamba1.core.selective_scan_loop",
        source=PACKAGE,
    ),
    KernelSpec(
        name="torchmamba.selective_scan_matrix",
        family=Family.SELECTIVE_SCAN,
        load=lambda: _load("selective_scan_matrix"),
        capabilities=Capabilities(**_CAPS, max_length=32,
                                  notes="explicit (L, L) mixer from cumprod ratios; L <= 32"),
        description="torchmamba.mamba1.core.selective_scan_matrix",
        source=PACKAGE,
    ),
]
