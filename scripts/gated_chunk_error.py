"""The chunk forms' precision loss under strong decay, measured against the gated oracle's bounds.

For simple GLA and GLA (fla's layout, B=1, H=2, K=V=16, T=70, chunk 64, ten seeds per row; inputs
rounded to the dtype first, so the oracle sees what the kernel sees), each kernel's largest
|o - oracle| and that error over the sequential loop's bound ``u (growth + magnitude)`` and over the
chunk-aware bound ``u (growth + chunk_growth + magnitude)`` of `reference_impls.gated_decay`. Kernels:
the in-tree recurrent, stable chunk and cumulative-product chunk forms (`harness.kernels.gated_forms`)
and, for simple GLA when fla is installed, its pure-PyTorch ``naive_recurrent_simple_gla`` and
``naive_chunk_simple_gla`` (which compute in float32 whatever the input; the Triton forms are the
adapters').

    python scripts/gated_chunk_error.py                        # float32, simple GLA (Markdown table)
    python scripts/gated_chunk_error.py --lows -20 -1          # log-decay uniform in [low, 0] per row
    python scripts/gated_chunk_error.py --dtype bfloat16 --gla # another dtype; GLA's in-tree forms

"n/a" in the ratio columns means the kernel's output was not finite (the cumulative-product form
overflows ``exp(-cumsum)`` there).
"""

from __future__ import annotations

import argparse
import math

import torch

from harness.kernels import gated_forms as gf
from reference_impls import gated_decay as gd

UNIT = {"float32": 2.0**-24, "float16": 2.0**-11, "bfloat16": 2.0**-8}


def _kernels(gla: bool) -> dict:
    prefix = "gla" if gla else "simple_gla"
    kernels = {
        f"intree.{prefix}_recurrent": lambda q, k, v, g: getattr(gf, f"{prefix}_recurrent")(q, k, v, g)[0],
        f"intree.{prefix}_chunk": lambda q, k, v, g: getattr(gf, f"{prefix}_chunk")(q, k, v, g, chunk_size=64)[0],
        f"intree.{prefix}_chunk_cumprod":
            lambda q, k, v, g: getattr(gf, f"{prefix}_chunk_cumprod")(q, k, v, g, chunk_size=64)[0],
    }
    if gla:
        return kernels
    try:
        from fla.ops.simple_gla.naive import naive_chunk_simple_gla, naive_recurrent_simple_gla
    except ImportError:
        return kernels
    kernels["fla.naive_recurrent_simple_gla"] = lambda q, k, v, g: naive_recurrent_simple_gla(q, k, v, g)[0]
    kernels["fla.naive_chunk_simple_gla"] = lambda q, k, v, g: naive_chunk_simple_gla(q, k, v, g, chunk_size=64)[0]
    return kernels


def measure(low: float, seeds: int = 10, length: int = 70, *, dtype: str = "float32",
            gla: bool = False) -> dict[str, tuple[float, float, float]]:
    """Per kernel: (max |o - oracle|, max error / u (growth + magnitude), max error / u (growth +
    chunk_growth + magnitude)) over ``seeds`` cases with log-decay uniform in [low, 0]."""
    found: dict[str, list[float]] = {}
    u, tdtype = UNIT[dtype], getattr(torch, dtype)
    for seed in range(seeds):
        gen = torch.Generator().manual_seed(seed)
        q, k = (torch.randn(1, length, 2, 16, generator=gen, dtype=torch.float64) for _ in range(2))
        v = torch.randn(1, length, 2, 16, generator=gen, dtype=torch.float64)
        g = low * torch.rand((1, length, 2, 16) if gla else (1, length, 2), generator=gen, dtype=torch.float64)
        q, k, v, g = (x.to(tdtype).double() for x in (q, k, v, g))
        trace = (gd.gla_trace if gla else gd.simple_gla_trace)(q, k, v, g, chunk_size=64)
        seq_bound = u * (trace.out.growth + trace.out.magnitude)
        chunk_bound = seq_bound + u * trace.chunk_growth
        for name, fn in _kernels(gla).items():
            o = fn(*(x.to(tdtype) for x in (q, k, v, g))).double()
            err = (o - trace.out.out).abs()
            finite = bool(torch.isfinite(o).all())
            row = [float(err.max()) if finite else math.inf,
                   float((err / seq_bound).max()) if finite else math.nan,
                   float((err / chunk_bound).max()) if finite else math.nan]
            old = found.setdefault(name, [0.0, 0.0, 0.0])
            found[name] = [max(a, b) if not (math.isnan(a) or math.isnan(b)) else math.nan for a, b in zip(old, row)]
    return {name: tuple(v) for name, v in found.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lows", type=float, nargs="+", default=[-20.0, -1.0],
                        help="the lower ends of the log-decay ranges, one table row group each")
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--dtype", choices=sorted(UNIT), default="float32")
    parser.add_argument("--gla", action="store_true", help="GLA (a gate per key channel) instead of simple GLA")
    args = parser.parse_args(argv)
    print(f"{args.dtype}, {'gla' if args.gla else 'simple_gla'}\n")
    print("| log-decay | kernel | max abs error | / u (growth + magnitude) | / u (growth + chunk_growth + magnitude) |")
    print("|---|---|---|---|---|")
    for low in args.lows:
        for name, (err, seq, chunk) in measure(low, args.seeds, dtype=args.dtype, gla=args.gla).items():
            fmt = (lambda x: "n/a" if math.isnan(x) else f"{x:.3g}")
            print(f"| [{low:g}, 0] | {name} | {'NaN/inf' if math.isinf(err) else f'{err:.3g}'} | {fmt(seq)} | {fmt(chunk)} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
