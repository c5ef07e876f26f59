"""Adapters for yet-another-retnet (``pip install yet-another-retnet``, https://github.com/fkodom/yet-another-retnet).

The functions ``retention_parallel``, ``retention_recurrent`` and ``retention_chunkwise`` of
``yet_another_retnet.retention`` take ``query, key, value`` of shape (B, H, T, D) (the recurrent one
(B, H, D), one step) and return ``(retention, state_or_weights)``. Ours are (batch, L, heads, d): the
adapter transposes (a fresh contiguous copy, so the package never sees our tensors) and back.

- ``yar.parallel``: one call on the whole sequence.
- ``yar.recurrent``: one ``retention_recurrent`` call per step, carrying the returned state.
- ``yar.chunkwise``: one ``retention_chunkwise`` call per chunk of ``chunk_size`` steps, carrying the
  state; the last chunk may be shorter (the function builds its masks from the chunk it is given), so any
  chunk size and any length work.

Convention (declared, so the float64 oracle follows it): the decays are *not* RetNet's
``1 - 2**(-5 - h)`` but ``1 - exp(linspace(log(1/32), log(1/512), heads))`` (``_build_decay_gammas``), which
coincides with RetNet's only for 1 or 5 heads; the package builds them in the input dtype. Keys are divided
by ``sqrt(dk)`` (``scale=None`` means ``key.size(-1) ** 0.5``), the same product as RetNet's ``dk**-0.5`` on
the query. There is no normalisation inside these functions (the group norm lives in the
``MultiScaleRetention`` module), so this is family ``retention``.

Importing ``yet_another_retnet`` runs ``git describe`` in the current directory to find its version unless
``YET_ANOTHER_RETNET_VERSION`` is set; the adapter sets it for the duration of the import (to the installed
distribution's version) so that no subprocess is started in the harness's repository.
"""

from __future__ import annotations

import math
import os
from typing import Callable, Sequence

import torch

from harness.errors import InvalidArgument
from harness.kernels.contract import (
    Capabilities,
    Family,
    KernelSpec,
    RetentionConvention,
    inverse_sqrt_scale,
    require_module,
)

__all__ = ["KERNELS", "YAR_CONVENTION", "yar_gammas"]

PACKAGE = "yet-another-retnet"


def yar_gammas(heads: int) -> Sequence[float]:
    """yet-another-retnet's decays ``1 - exp(linspace(log(1/32), log(1/512), heads))``, in float64."""
    lo, hi = math.log(1 / 32), math.log(1 / 512)
    if heads == 1:
        return (1.0 - math.exp(lo),)
    return tuple(1.0 - math.exp(lo + (hi - lo) * h / (heads - 1)) for h in range(heads))


YAR_CONVENTION = RetentionConvention(gammas=yar_gammas, scale=inverse_sqrt_scale, name="yet-another-retnet")


def _retention_module():
    key = "YET_ANOTHER_RETNET_VERSION"
    had = key in os.environ
    if not had:
        try:
            from importlib.metadata import version

            os.environ[key] = version(PACKAGE)
        except Exception:  # noqa: BLE001 - only a version string; the import decides availability
            os.environ[key] = "unknown"
    try:
        return require_module("yet_another_retnet.retention", package=PACKAGE)
    finally:
        if not had:
            os.environ.pop(key, None)


def _heads_first(t: torch.Tensor) -> torch.Tensor:
    """(batch, L, heads, d) -> a fresh contiguous (batch, heads, L, d)."""
    return t.transpose(1, 2).clone(memory_format=torch.contiguous_format)


def _back(o: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """(batch, heads, L, dv) -> (batch, L, heads, dv) in ``dtype``."""
    return o.transpose(1, 2).contiguous().to(dtype)


def _load_parallel() -> Callable:
    mod = _retention_module()

    def yar_parallel(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        o, _ = mod.retention_parallel(_heads_first(q), _heads_first(k), _heads_first(v))
        return _back(o, q.dtype)

    return yar_parallel


def _load_recurrent() -> Callable:
    mod = _retention_module()

    def yar_recurrent(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        qh, kh, vh = _heads_first(q), _heads_first(k), _heads_first(v)
        state = None
        outs = []
        for t in range(qh.shape[2]):
            o, state = mod.retention_recurrent(qh[:, :, t], kh[:, :, t], vh[:, :, t], state)
            outs.append(o)
        return _back(torch.stack(outs, dim=2), q.dtype)

    return yar_recurrent


def _load_chunkwise() -> Callable:
    mod = _retention_module()

    def yar_chunkwise(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, chunk_size: int) -> torch.Tensor:
        if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
            raise InvalidArgument(f"chunk_size={chunk_size!r} must be a positive int")
        qh, kh, vh = _heads_first(q), _heads_first(k), _heads_first(v)
        state = None
        outs = []
        for start in range(0, qh.shape[2], chunk_size):
            stop = start + chunk_size
            o, state = mod.retention_chunkwise(qh[:, :, start:stop], kh[:, :, start:stop],
                                               vh[:, :, start:stop], state)
            outs.append(o)
        return _back(torch.cat(outs, dim=2), q.dtype)

    return yar_chunkwise


_NOTES = ("decay 1 - exp(linspace(log(1/32), log(1/512), heads)) built in the input dtype; keys divided by "
          "sqrt(dk); no normalisation")

KERNELS: list[KernelSpec] = [
    KernelSpec(
        name="yar.parallel",
        family=Family.RETENTION,
        load=_load_parallel,
        capabilities=Capabilities(autograd=True, square_scores=True,
                                  notes="one parallel call; its decay mask takes gamma ** |i - j| over positions "
                                        "torch.arange(L, dtype=input dtype), whole numbers exact in float16 only to "
                                        "2048 (bfloat16: 256); " + _NOTES),
        convention=YAR_CONVENTION,
        description="yet_another_retnet.retention.retention_parallel",
        source=PACKAGE,
    ),
    KernelSpec(
        name="yar.recurrent",
        family=Family.RETENTION,
        load=_load_recurrent,
        capabilities=Capabilities(autograd=True, notes="retention_recurrent once per step; " + _NOTES),
        convention=YAR_CONVENTION,
        description="yet_another_retnet.retention.retention_recurrent, one step at a time",
        source=PACKAGE,
    ),
    KernelSpec(
        name="yar.chunkwise",
        family=Family.RETENTION,
        load=_load_chunkwise,
        capabilities=Capabilities(autograd=True, chunk_sizes=(), square_scores=True,
                                  chunk_states=0, chunk_pairs=0,  # one state carried from chunk to chunk
                                  notes="retention_chunkwise once per chunk (the last may be partial); " + _NOTES),
        convention=YAR_CONVENTION,
        description="yet_another_retnet.retention.retention_chunkwise, chunk by chunk",
        source=PACKAGE,
    ),
]
