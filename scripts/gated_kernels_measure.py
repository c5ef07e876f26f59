#!/usr/bin/env python3
"""The gated-family kernels (fla's simple_gla / gla forms, mamba-ssm's SSD forms) against the float64 gated oracles
(`reference_impls.gated_decay`), one Markdown row per kernel and dtype: the largest max |error| of the output and of
the final state, the largest normwise error (max |error| / max |oracle|), and the median seconds of one call
(interpreted for the Triton kernels on a machine without CUDA). The float32 rows of ``X`` against ``X.ieee`` give
TF32's share of the float32 error.

    PYTHONPATH=$PWD python scripts/gated_kernels_measure.py [KERNEL ...]

simple_gla / gla: B=1, H=2, K=V=16, L in {37, 70} (no multiple of a chunk size), every declared chunk size,
log-decays uniform in [-1, 0] and in [-20, 0] per step, an initial state and the final state where declared.
ssd: B=1, H=4, P=8, G=2, N=8, L=45 (48 for the kernels that need a chunk multiple), chunk sizes 16/32/64 where
declared (16 otherwise), three cases: plain (dt > 0), every option the kernel takes (D, z, dt_bias with softplus,
an initial state, a seq_idx boundary), and softplus with large dt (25 +- 10, where softplus is linear). The
mamba-ssm kernels need mamba-ssm importable (`make install-mamba-ssm`). Seeds are fixed (5 and 3).
"""

from __future__ import annotations

import statistics
import sys
import time
import warnings

import torch

from harness.kernels.triton_interpreter import interpret_if_no_gpu

interpret_if_no_gpu()

from harness.kernels.contract import Family  # noqa: E402
from harness.kernels.registry import all_kernels  # noqa: E402
from reference_impls import gated_decay as gd  # noqa: E402

F64 = torch.float64


def parts(spec) -> tuple[bool, bool]:
    """(takes an initial state, returns the final state) as the kernel declares them."""
    caps = spec.capabilities
    return bool(getattr(caps, "initial_state", False)), bool(getattr(caps, "final_state", False))


def gla_cases(spec):
    init, final = parts(spec)
    chunks = spec.capabilities.chunk_sizes or [None]
    for length in (37, 70):
        for lo in (-1.0, -20.0):
            for chunk in chunks:
                gen = torch.Generator().manual_seed(5)
                r = lambda *s: torch.randn(*s, generator=gen, dtype=F64)  # noqa: E731
                q, k, v = r(1, length, 2, 16), r(1, length, 2, 16), r(1, length, 2, 16)
                shape = (1, length, 2) if spec.family is Family.SIMPLE_GLA else (1, length, 2, 16)
                g = torch.rand(shape, generator=gen, dtype=F64) * lo
                h0 = r(1, 2, 16, 16) if init else None
                yield f"L={length} g in [{lo:g},0] chunk={chunk}", (q, k, v, g), h0, chunk, final


def run_gla(spec, fn, dtype):
    oracle = gd.simple_gla if spec.family is Family.SIMPLE_GLA else gd.gla
    for label, args, h0, chunk, final in gla_cases(spec):
        cast = [a.to(dtype) for a in args]
        h0c = None if h0 is None else h0.to(dtype)
        o64, f64 = oracle(*(a.to(F64) for a in cast), initial_state=None if h0c is None else h0c.to(F64),
                          output_final_state=True)
        t0 = time.perf_counter()
        o, f = fn(*cast, initial_state=h0c, output_final_state=final, **({"chunk_size": chunk} if chunk else {}))
        yield label, time.perf_counter() - t0, (o, o64), (f, f64) if final else None


def ssd_cases(spec):
    init, final = parts(spec)
    options = spec.capabilities.selective_options
    chunk_multiple = spec.capabilities.lengths.value == "chunk_multiple"
    length = 48 if chunk_multiple else 45
    chunks = [c for c in (spec.capabilities.chunk_sizes or ()) if not chunk_multiple] or [16]
    for chunk in chunks:
        for label in ("plain", "options", "large dt"):
            if label != "plain" and not options:
                continue
            gen = torch.Generator().manual_seed(3)
            r = lambda *s: torch.randn(*s, generator=gen, dtype=F64)  # noqa: E731
            x, dt = r(1, length, 4, 8), r(1, length, 4)
            A = -torch.rand(4, generator=gen, dtype=F64) * 2 - 0.1
            B, C = r(1, length, 2, 8), r(1, length, 2, 8)
            kw: dict = {}
            if label == "plain":
                dt = dt.abs() * 0.5
            elif label == "options":
                kw = dict(D=r(4), z=r(1, length, 4, 8), dt_bias=0.5 * r(4), dt_softplus=True)
                if init:
                    kw["initial_states"] = r(1, 4, 8, 8)
                if getattr(spec.capabilities, "varlen", False):
                    seq = torch.zeros(1, length, dtype=torch.long)
                    seq[:, length // 3:] = 1
                    kw["seq_idx"] = seq
            else:
                dt = dt * 10 + 25
                kw = dict(dt_softplus=True)
            yield f"{label} chunk={chunk}", (x, dt, A, B, C), chunk, kw, final


def run_ssd(spec, fn, dtype):
    for label, args, chunk, kw, final in ssd_cases(spec):
        cast = [a.to(dtype) for a in args]
        kwc = {k: (v.to(dtype) if isinstance(v, torch.Tensor) and v.is_floating_point() else v) for k, v in kw.items()}
        kw64 = {k: (v.to(F64) if isinstance(v, torch.Tensor) and v.is_floating_point() else v) for k, v in kwc.items()}
        y64, f64 = gd.ssd(*(a.to(F64) for a in cast), chunk, **kw64, return_final_states=True)
        t0 = time.perf_counter()
        out = fn(*cast, chunk, **kwc, **({"return_final_states": True} if final else {}))
        el = time.perf_counter() - t0
        y, f = out if final else (out, None)
        yield label, el, (y, y64), (f, f64) if final else None


def main(names: list[str]) -> None:
    warnings.simplefilter("ignore")
    print("| kernel | dtype (judged as) | cases | max abs err (output) | normwise | max abs err (final state) | "
          "time/call |")
    print("|---|---|---|---|---|---|---|")
    fams = (Family.SIMPLE_GLA, Family.GLA, Family.SSD)
    for spec in [s for s in all_kernels() if s.family in fams and (not names or s.name in names)]:
        reason = spec.unavailable_reason()
        if reason:
            print(f"| {spec.name} | - | unavailable: {reason[:160]} | | | | |", flush=True)
            continue
        fn = spec.callable()
        for dtype_name in spec.capabilities.dtypes:
            if spec.capabilities.runs(dtype_name, "cpu"):
                continue
            dtype = getattr(torch, dtype_name)
            run = run_ssd if spec.family is Family.SSD else run_gla
            times, worst, normwise, worst_final, n = [], 0.0, 0.0, None, 0
            for _label, el, (o, ref), fin in run(spec, fn, dtype):
                n += 1
                times.append(el)
                err = (o.to(F64) - ref).abs().max().item()
                worst = max(worst, err)
                normwise = max(normwise, err / ref.abs().max().item())
                if fin is not None:
                    ferr = (fin[0].to(F64) - fin[1]).abs().max().item()
                    worst_final = ferr if worst_final is None else max(worst_final, ferr)
            final_txt = "-" if worst_final is None else f"{worst_final:.3g}"
            print(f"| {spec.name} | {dtype_name} ({spec.capabilities.precision(dtype_name)}) | {n} | {worst:.3g} | "
                  f"{normwise:.3g} | {final_txt} | {statistics.median(times):.2f} s |", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
