"""The same-dtype sequential baseline of each family: the oracle's own loop, run in the kernel's dtype.

A kernel in float16 cannot be expected to match the float64 oracle to float64 precision; what it can be
expected to do is err no more than the plain sequential loop errs in float16. These baselines measure
that: each wrapper calls the oracle in `reference_impls` (the very same code, not a copy) with
``compute_dtype`` and ``device`` set to the input's dtype and device, and returns the output in the input
dtype. With float64 inputs on the CPU a baseline is the oracle itself.

`reference_impls` is imported inside the wrappers, so this module imports (and the registry lists these
kernels as unavailable, with the reason) before the oracles exist. `BASELINES` maps each family to its
baseline kernel; `baseline_for` looks one up.
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Callable, Sequence

import torch

from harness.errors import InvalidArgument, KernelUnavailable
from harness.kernels.contract import Capabilities, Family, KernelSpec

#: The oracles' decay argument: one float per head (a sequence or a (heads,) tensor), or None for RetNet's.
GammaArg = Sequence[float] | torch.Tensor | None

__all__ = [
    "sequential_linear_scan",
    "sequential_selective_scan",
    "sequential_retention",
    "sequential_retention_normed",
    "sequential_simple_gla",
    "sequential_gla",
    "sequential_ssd",
    "KERNELS",
    "BASELINES",
    "baseline_for",
]


def _output(result: object, like: torch.Tensor) -> torch.Tensor:
    """The oracle's output tensor (from a tensor, a `Trace` or an ``(out, ...)`` tuple) in ``like``'s dtype/device."""
    if isinstance(result, (tuple, list)):
        result = result[0]
    out = getattr(result, "out", result)
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"the oracle returned {type(result).__name__}; expected a tensor, a Trace or a tuple")
    return out.to(device=like.device, dtype=like.dtype)


def sequential_linear_scan(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``h_t = a_t h_{t-1} + b_t`` by the oracle's loop in a's dtype and on a's device."""
    from reference_impls.linear_recurrence import linear_recurrence

    return _output(linear_recurrence(a, b, compute_dtype=a.dtype, device=a.device), a)


def sequential_selective_scan(
    u: torch.Tensor,
    delta: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor | None = None,
    z: torch.Tensor | None = None,
    delta_bias: torch.Tensor | None = None,
    delta_softplus: bool = False,
) -> torch.Tensor:
    """Mamba's selective scan (mamba-ssm layout) by the oracle's loop in u's dtype and on u's device."""
    from reference_impls.selective_scan import selective_scan

    result = selective_scan(
        u,
        delta,
        A,
        B,
        C,
        D=D,
        z=z,
        delta_bias=delta_bias,
        delta_softplus=delta_softplus,
        return_last_state=False,
        compute_dtype=u.dtype,
        device=u.device,
    )
    return _output(result, u)


def sequential_retention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, gamma: GammaArg = None, scale: float | None = None
) -> torch.Tensor:
    """Retention by the oracle's recurrent loop in q's dtype and on q's device."""
    from reference_impls.retention import retention

    return _output(retention(q, k, v, gamma=gamma, scale=scale, compute_dtype=q.dtype, device=q.device), q)


def sequential_retention_normed(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, eps: float, gamma: GammaArg = None, scale: float | None = None
) -> torch.Tensor:
    """RMS-normed retention by the oracle's loop in q's dtype and on q's device."""
    from reference_impls.retention import retention_normed

    return _output(retention_normed(q, k, v, eps, gamma=gamma, scale=scale, compute_dtype=q.dtype, device=q.device), q)


def _sequential_gated(oracle: str, q, k, v, g, scale=None, initial_state=None, output_final_state=False,
                      cu_seqlens=None):
    from reference_impls import gated_decay

    o, state = getattr(gated_decay, oracle)(q, k, v, g, scale=scale, initial_state=initial_state,
                                            output_final_state=output_final_state, cu_seqlens=cu_seqlens,
                                            compute_dtype=q.dtype, device=q.device)
    return _output(o, q), (None if state is None else _output(state, q))


def sequential_simple_gla(q, k, v, g, scale=None, initial_state=None, output_final_state=False, cu_seqlens=None):
    """Simple GLA (fla's layout) by the oracle's recurrent loop in q's dtype: ``(o, final_state or None)``."""
    return _sequential_gated("simple_gla", q, k, v, g, scale, initial_state, output_final_state, cu_seqlens)


def sequential_gla(q, k, v, g, scale=None, initial_state=None, output_final_state=False, cu_seqlens=None):
    """GLA (fla's layout) by the oracle's recurrent loop in q's dtype: ``(o, final_state or None)``."""
    return _sequential_gated("gla", q, k, v, g, scale, initial_state, output_final_state, cu_seqlens)


def sequential_ssd(x, dt, A, B, C, chunk_size=None, D=None, z=None, dt_bias=None, dt_softplus=False,
                   initial_states=None, seq_idx=None, return_final_states=False):
    """Mamba-2's SSD (mamba-ssm's layout) by the oracle's recurrent loop in x's dtype: y, or
    ``(y, final_states)`` when ``return_final_states``."""
    from reference_impls.gated_decay import ssd

    found = ssd(x, dt, A, B, C, chunk_size, D=D, z=z, dt_bias=dt_bias, dt_softplus=dt_softplus,
                initial_states=initial_states, seq_idx=seq_idx, return_final_states=return_final_states,
                compute_dtype=x.dtype, device=x.device)
    if return_final_states:
        return _output(found[0], x), _output(found[1], x)
    return _output(found, x)


def _loader(module: str, attr: str, fn: Callable) -> Callable[[], Callable]:
    """``load`` for a baseline: the wrapper, once ``reference_impls.<module>.<attr>`` imports."""

    def load() -> Callable:
        try:
            mod = importlib.import_module(f"reference_impls.{module}")
        except ImportError as exc:
            raise KernelUnavailable(f"the oracle module reference_impls.{module} does not import ({exc})") from None
        if not hasattr(mod, attr):
            raise KernelUnavailable(f"reference_impls.{module} has no {attr!r}; the oracle is not written yet")
        return fn

    return load


_CAPS = Capabilities(notes="the float64 oracle's own loop, run in the input dtype")
_GATED_CAPS = dataclasses.replace(_CAPS, initial_state=True, final_state=True, varlen=True, scale=True)

KERNELS: list[KernelSpec] = [
    KernelSpec(
        name="intree.sequential_scan",
        family=Family.LINEAR_SCAN,
        load=_loader("linear_recurrence", "linear_recurrence", sequential_linear_scan),
        capabilities=_CAPS,
        description="the oracle's sequential loop in the input dtype",
    ),
    KernelSpec(
        name="intree.sequential_selective_scan",
        family=Family.SELECTIVE_SCAN,
        load=_loader("selective_scan", "selective_scan", sequential_selective_scan),
        capabilities=_CAPS,
        description="the oracle's sequential selective scan in the input dtype",
    ),
    KernelSpec(
        name="intree.sequential_retention",
        family=Family.RETENTION,
        load=_loader("retention", "retention", sequential_retention),
        capabilities=_CAPS,
        description="the oracle's recurrent retention in the input dtype",
    ),
    KernelSpec(
        name="intree.sequential_retention_normed",
        family=Family.RETENTION_NORMED,
        load=_loader("retention", "retention_normed", sequential_retention_normed),
        capabilities=_CAPS,
        description="the oracle's recurrent retention + RMS group norm in the input dtype",
    ),
    KernelSpec(
        name="intree.sequential_simple_gla",
        family=Family.SIMPLE_GLA,
        load=_loader("gated_decay", "simple_gla", sequential_simple_gla),
        capabilities=_GATED_CAPS,
        description="the oracle's recurrent simple GLA in the input dtype",
    ),
    KernelSpec(
        name="intree.sequential_gla",
        family=Family.GLA,
        load=_loader("gated_decay", "gla", sequential_gla),
        capabilities=_GATED_CAPS,
        description="the oracle's recurrent GLA in the input dtype",
    ),
    KernelSpec(
        name="intree.sequential_ssd",
        family=Family.SSD,
        load=_loader("gated_decay", "ssd", sequential_ssd),
        capabilities=_GATED_CAPS,
        description="the oracle's recurrent Mamba-2 SSD in the input dtype",
    ),
]

#: Each family's same-dtype sequential baseline (the kernel its definition names, `FamilyDef.baseline`).
BASELINES: dict[Family, KernelSpec] = {spec.family: spec for spec in KERNELS}


def baseline_for(family: Family | str) -> KernelSpec:
    """The same-dtype sequential baseline of ``family`` (a `Family` or its name)."""
    fam = Family.parse(family)
    try:
        return BASELINES[fam]
    except KeyError:  # every family has one; this guards a family added later without a baseline
        raise InvalidArgument(f"family={fam.value!r} has no sequential baseline; add one to {__name__}") from None
