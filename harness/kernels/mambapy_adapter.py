"""Adapters for mambapy (``pip install mambapy``, https://github.com/alxndrTL/mamba.py): pure PyTorch.

Three kernels, each the package's own code with only layouts converted:

- ``mambapy.pscan`` (linear_scan): ``mambapy.pscan.pscan``, a Blelloch scan as an autograd Function, on
  ``(B, L, D, N)``. Our ``a, b`` of shape (batch, channels, L) become ``(batch, L, channels, 1)``.
  Lengths that are not powers of two are zero-padded to the next power by ``pscan`` itself (mambapy
  1.2.0; older releases "only handled power of 2 lens"), so any length is accepted.
- ``mambapy.selective_scan`` / ``mambapy.selective_scan_seq`` (selective_scan): the methods
  ``MambaBlock.selective_scan`` (parallel, through ``pscan``) and ``MambaBlock.selective_scan_seq``
  (a loop over t) on ``x, delta (B, L, ED)``, ``A (ED, N)``, ``B, C (B, L, N)``, ``D (ED,)``.
  They are called as plain functions with a stand-in ``self``: ``selective_scan`` never touches
  ``self``; ``selective_scan_seq`` reads only ``self.config.d_inner`` and ``self.config.d_state`` (for
  its zero initial state), so it gets a real ``MambaConfig`` with those values. No ``MambaBlock`` is
  built, so no parameters are initialised and the global RNG is not touched.

What the methods compute, and so what is declared: ``A`` is used as given (the block passes
``-exp(A_log)``; we pass the contract's actual A), ``delta`` as given (the block applies
``softplus(delta + dt_proj.bias)`` *before* calling them), and ``y = C.h + D * x`` with D always
added. There is no ``z`` gate, no ``delta_bias``, no softplus and no grouped B/C in these methods, so
``selective_options`` and ``grouped_bc`` are off; ``D=None`` (no skip term) is passed as zeros.

``selective_scan_seq`` raises for float16/bfloat16 inputs (a mambapy bug: its initial state is created in
torch's default dtype, float32, and ``hs @ C`` then mixes dtypes); declared unsupported with that reason.

Every tensor handed to mambapy is a fresh contiguous copy made by the layout conversion, so in-place work
inside the package can never reach the harness's inputs. Outputs come back in the input dtype.
"""

from __future__ import annotations

import types
from typing import Callable

import torch

from harness.errors import InvalidArgument
from harness.kernels.contract import Capabilities, Family, KernelSpec, require_module

__all__ = ["KERNELS"]

PACKAGE = "mambapy"


def _copy(t: torch.Tensor) -> torch.Tensor:
    """A fresh contiguous copy (also of a transposed view): what the package gets instead of ours."""
    return t.clone(memory_format=torch.contiguous_format)


def _load_pscan() -> Callable:
    pscan = require_module("mambapy.pscan", package=PACKAGE).pscan

    def mambapy_pscan(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        # ours (batch, channels, L) -> mambapy (B, L, D, N) with D = channels, N = 1
        A = _copy(a.transpose(1, 2).unsqueeze(-1))
        X = _copy(b.transpose(1, 2).unsqueeze(-1))
        h = pscan(A, X)  # (batch, L, channels, 1)
        return h.squeeze(-1).transpose(1, 2).contiguous().to(a.dtype)

    return mambapy_pscan


def _check_options(name: str, B: torch.Tensor, C: torch.Tensor, z, delta_bias, delta_softplus) -> None:
    if B.dim() != 3 or C.dim() != 3:
        raise InvalidArgument(
            f"B.shape={tuple(B.shape)!r}, C.shape={tuple(C.shape)!r}: {name} takes B, C of shape (batch, N, L) "
            "only (grouped_bc=False); mambapy's selective scan has no groups"
        )
    for arg, value in (("z", z), ("delta_bias", delta_bias)):
        if value is not None:
            raise InvalidArgument(
                f"{arg}= was given, but {name} does not take it (selective_options=False): mambapy applies "
                "the z gate, delta's bias and softplus outside the selective scan, in MambaBlock.ssm/forward"
            )
    if delta_softplus:
        raise InvalidArgument(
            f"delta_softplus=True was given, but {name} does not take it (selective_options=False): mambapy "
            "applies softplus before calling the selective scan"
        )


def _selective(method_name: str) -> Callable:
    """Load ``MambaBlock.<method_name>`` and wrap it into the selective_scan signature."""
    mamba = require_module("mambapy.mamba", package=PACKAGE)
    method = getattr(mamba.MambaBlock, method_name)
    name = f"mambapy.{method_name}"

    def mambapy_selective_scan(u, delta, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False):
        _check_options(name, B, C, z, delta_bias, delta_softplus)
        batch, dim, length = u.shape
        n = A.shape[1]
        # the only attributes the methods read from self (selective_scan_seq: its initial state's shape)
        self_ = types.SimpleNamespace(config=mamba.MambaConfig(d_model=dim, n_layers=1, d_state=n, expand_factor=1))
        x = _copy(u.transpose(1, 2))  # (B, L, ED)
        dl = _copy(delta.transpose(1, 2))  # (B, L, ED)
        Bm = _copy(B.transpose(1, 2))  # (B, L, N)
        Cm = _copy(C.transpose(1, 2))  # (B, L, N)
        Dv = _copy(D) if D is not None else torch.zeros(dim, dtype=u.dtype, device=u.device)
        y = method(self_, x, dl, _copy(A), Bm, Cm, Dv)  # (B, L, ED)
        return y.transpose(1, 2).contiguous().to(u.dtype)

    mambapy_selective_scan.__name__ = method_name
    return mambapy_selective_scan


_SELECTIVE_NOTES = (
    "A and delta used as given (no -exp(A_log), no softplus: MambaBlock.ssm does those before the call); "
    "D=None passed as zeros; no z / delta_bias / softplus / groups in mambapy's selective scan"
)

#: mambapy 1.2.0 (a package bug, found by trying it; not a limitation of this machine)
_SEQ_HALF = (
    "mambapy bug: selective_scan_seq creates its initial state with torch.zeros(...) in torch's default dtype "
    "(float32), so h becomes float32 and `hs @ C` raises 'RuntimeError: expected scalar type Float but found "
    "Half' (BFloat16 likewise); the same happens inside MambaBlock with pscan=False"
)

KERNELS: list[KernelSpec] = [
    KernelSpec(
        name="mambapy.pscan",
        family=Family.LINEAR_SCAN,
        load=_load_pscan,
        capabilities=Capabilities(
            autograd=True,
            notes="Blelloch scan (autograd Function with a reverse-scan backward); lengths that are not powers "
                  "of two are zero-padded to the next power by pscan itself",
        ),
        description="mambapy.pscan.pscan: Blelloch parallel scan, (B, L, D, N) layout",
        source=PACKAGE,
    ),
    KernelSpec(
        name="mambapy.selective_scan",
        family=Family.SELECTIVE_SCAN,
        load=lambda: _selective("selective_scan"),
        capabilities=Capabilities(autograd=True, grouped_bc=False, selective_options=False,
                                  notes="parallel: exp(delta A), delta B x, then pscan; " + _SELECTIVE_NOTES),
        description="mambapy MambaBlock.selective_scan: the parallel (pscan) selective scan",
        source=PACKAGE,
    ),
    KernelSpec(
        name="mambapy.selective_scan_seq",
        family=Family.SELECTIVE_SCAN,
        load=lambda: _selective("selective_scan_seq"),
        capabilities=Capabilities(
            dtypes=("float64", "float32"),
            autograd=True, grouped_bc=False, selective_options=False,
            unsupported={half: _SEQ_HALF for half in ("float16", "bfloat16")},
            notes="sequential loop over t; " + _SELECTIVE_NOTES,
        ),
        description="mambapy MambaBlock.selective_scan_seq: the sequential selective scan",
        source=PACKAGE,
    ),
]
