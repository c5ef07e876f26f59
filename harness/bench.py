"""Side-by-side benchmark: oracles vs peers (wall time, peak memory, equality) and suite throughput.

Run ``python -m harness.bench --out reports/bench [--lengths 1024,8192,65536] [--long] [--quick]``.
Writes ``bench.md`` and ``bench.csv`` under ``--out`` and prints the tables.

- Wall time: best of ``reps`` calls in this process (inputs built once, float64, no grad; a function
  whose calls pass `TIME_BUDGET_S` stops early, after at least one).
- Oracle vs peers: per length, the oracle's time next to the fastest peer's, and their ratio (the
  issue's target is an oracle at least `TARGET_RATIO` times faster than the fastest peer at L >= 8192).
- Peak memory: each (function, length) runs once in a fresh ``python -c`` subprocess. It first calls the
  function on a tiny input (imports, numba's JIT or cache load), then builds the inputs, then resets the
  kernel's peak-RSS mark (``/proc/self/clear_refs``) and reads ``VmHWM`` after the call: the growth is
  the call's own peak in MiB, the output included (``out_mib``). glibc is told to serve blocks above
  64 KiB with mmap, so freed memory leaves the RSS and a call cannot hide inside memory the input
  builder freed (without ``clear_refs`` the growth of ``ru_maxrss`` is used, which can read 0 then).
  A peer runs only where its estimated memory (`PEER_MEMORY`) fits in a third of MemAvailable.
- Speed-up: oracle time / function time, both measured in this run (> 1: the function is faster).
- Technique: the oracles' three loop implementations side by side (torch per-step loop, compiled
  `recur` only, compiled fused block kernels; see ``docs/performance.md``), and numba's first-use cost
  with an empty and with a warm cache, each in a fresh subprocess.
- Cases: where a `harness.runner.run_case` case's time goes at the shapes above, from its record's
  timings (the harness's share = measure + records; target under `HARNESS_TARGET`).
- Test runs (full runs only; ``--no-tests`` skips them): ``make test``'s command serially and with
  ``-n 2``, and the ci profile's cases per second per family from the serial run's records.
- Peers: mambapy, fla, torchscale and the in-tree recurrent form come from the project's install;
  mamba-ssm's reference from ``$BENCH_PEERS`` (``make bench-peers``, see `_mamba_ssm_ref`). A peer that
  is missing is listed as skipped, with the reason.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Iterator

import torch

# ----------------------------------------------------------------------------------------- functions
SEL_SHAPE = dict(batch=2, dim=64, state=16)
RET_SHAPE = dict(batch=1, heads=4, dk=64, dv=64)


def sel_inputs(length: int, batch: int = SEL_SHAPE["batch"]) -> tuple:
    from harness.problems import Problem

    p = Problem(family="selective_scan", length=length, dtype="float64", batch=batch, dim=SEL_SHAPE["dim"],
                state=SEL_SHAPE["state"], has_D=True, seed=0)
    x = p.make_inputs()
    return tuple(x[n] for n in ("u", "delta", "A", "B", "C", "D"))


def ret_inputs(length: int) -> tuple:
    from harness.problems import Problem

    p = Problem(family="retention", length=length, dtype="float64", seed=0, **RET_SHAPE)
    x = p.make_inputs()
    return x["q"], x["k"], x["v"]


def gated_inputs(length: int, family: str) -> tuple:
    """q, k, v, g of a float64 ``simple_gla`` or ``gla`` case at the retention shapes (log-decays of the
    family's default regime)."""
    from harness.problems import Problem

    p = Problem(family=family, length=length, dtype="float64", seed=0, **RET_SHAPE)
    x = p.make_inputs()
    return x["q"], x["k"], x["v"], x["g"]


def ssd_inputs(length: int) -> tuple:
    """x, dt, A, B, C and the chunk size of a float64 ``ssd`` case: batch 1, heads 4, headdim 64, state 64,
    one group (Mamba-2's shapes, the retention comparison's size)."""
    from harness.problems import Problem

    p = Problem(family="ssd", length=length, dtype="float64", seed=0, batch=1, heads=4, dv=64, state=64, groups=1)
    x = p.make_inputs()
    return x["x"], x["dt"], x["A"], x["B"], x["C"], 64


def _first(fn: Callable) -> Callable:
    """``fn`` returning only its output (the gated forms return ``(o, final_state)``)."""
    def output(*args):
        out = fn(*args)
        return out[0] if isinstance(out, tuple) else out
    return output


def _fla_naive() -> Callable:
    """fla's naive_retention takes (batch, heads, L, d) and computes in float32 internally.

    Imported through the fla adapter, which turns Triton's interpreter on first where there is no GPU:
    a plain import here would decorate fla's kernels for a GPU, and every Triton kernel imported later
    in this process (fla's, accelerated-scan's) would then fail to run.
    """
    from harness.kernels.fla_adapter import import_fla

    naive_retention = import_fla("fla.ops.retention.naive").naive_retention

    def fla_naive(q, k, v):
        t = lambda x: x.transpose(1, 2).contiguous()  # noqa: E731  (b, L, h, d) <-> (b, h, L, d)
        return naive_retention(t(q), t(k), t(v)).transpose(1, 2).to(q.dtype)

    return fla_naive


def _mamba_ssm_ref() -> Callable:
    """mamba-ssm's pure-torch ``selective_scan_ref``, from the copy ``make bench-peers`` builds without its
    CUDA extension (``MAMBA_SKIP_CUDA_BUILD``) into ``$BENCH_PEERS`` (default ``.bench-peers``).

    Two things stand between that copy and ``selective_scan_ref``, and both are stepped around without
    touching its files (`harness.kernels.contract.import_skipping_init`): the package's ``__init__``
    imports the Mamba2/Mamba3 modules (which need huggingface_hub and more), so the package is entered
    through its path without running it; and
    ``selective_scan_interface`` imports the ``selective_scan_cuda`` extension at the top, which
    ``selective_scan_ref`` never calls, so a placeholder module that raises on any use stands in for it.
    The function casts u, delta, B, C to float32 itself; A must match (its einsum), so it is passed in
    float32 too, and the output comes back in the input's dtype.
    """
    from harness.kernels.contract import import_skipping_init
    from harness.kernels.triton_interpreter import interpret_if_no_gpu

    where = Path(os.environ.get("BENCH_PEERS", ".bench-peers")).resolve()
    if not (where / "mamba_ssm").is_dir():
        raise RuntimeError(f"mamba-ssm is not built in {where}: run `make bench-peers`")
    interpret_if_no_gpu()  # its Triton layer-norm module is decorated at import (see harness.kernels.fla_adapter)
    selective_scan_ref = import_skipping_init("mamba_ssm.ops.selective_scan_interface", path=[str(where)],
                                              stand_ins=("selective_scan_cuda",)).selective_scan_ref

    def mamba_ssm_ref(u, delta, A, B, C, D=None):
        return selective_scan_ref(u, delta, A.float(), B, C, D)

    return mamba_ssm_ref


def load_fn(name: str) -> Callable:
    """The callable benchmarked under ``name`` (raises if unavailable)."""
    if name == "oracle.selective_scan":
        from reference_impls.selective_scan import selective_scan
        return selective_scan
    if name == "oracle.retention":
        from reference_impls.retention import retention
        return retention
    if name == "fla.naive_retention":
        return _fla_naive()
    if name == "mamba_ssm.selective_scan_ref":
        return _mamba_ssm_ref()
    if name == "intree.retention_recurrent":
        from harness.kernels.retnet_forms import retention_recurrent
        return retention_recurrent
    if name in ("oracle.simple_gla", "oracle.gla", "oracle.ssd"):
        from reference_impls import gated_decay
        return _first(getattr(gated_decay, name.removeprefix("oracle.")))
    if name == "oracle.retention_normed":
        from reference_impls.retention import retention_normed
        return lambda q, k, v: retention_normed(q, k, v, eps=NORM_EPS)
    if name == "torchscale.recurrent":  # through its adapter: the layer's own loop, float64 in and out
        from harness.kernels.registry import get

        spec = get(name)
        if spec.unavailable_reason():
            raise RuntimeError(spec.unavailable_reason())
        loop = spec.callable()
        return lambda q, k, v: loop(q, k, v, eps=NORM_EPS)
    from harness.kernels.registry import get

    spec = get(name)
    reason = spec.unavailable_reason()
    if reason:
        raise RuntimeError(reason)
    return _first(spec.callable()) if name in GLA_FNS + SIMPLE_GLA_FNS + SSD_FNS else spec.callable()


def inputs_for(name: str, length: int) -> tuple:
    if name in SIMPLE_GLA_FNS:
        return gated_inputs(length, "simple_gla")
    if name in GLA_FNS:
        return gated_inputs(length, "gla")
    if name in SSD_FNS:
        return ssd_inputs(length)
    return sel_inputs(length) if name in SEL_FNS else ret_inputs(length)  # retention, with or without norm


SEL_FNS = ("oracle.selective_scan", "mambapy.selective_scan_seq", "mamba_ssm.selective_scan_ref")
RET_FNS = ("oracle.retention", "fla.naive_retention", "intree.retention_recurrent")
NORMED_FNS = ("oracle.retention_normed", "torchscale.recurrent")
#: The gated families' peers: fla's pure-PyTorch recurrent forms (float32 inside) and the in-tree
#: recurrent forms (one torch step per t, in the input dtype). SSD's only peer here is the in-tree recurrent
#: form: mamba-ssm's pure-torch forms need `make install-mamba-ssm` (its `ssd_minimal_discrete` is then
#: listed, skipped with the reason otherwise).
SIMPLE_GLA_FNS = ("oracle.simple_gla", "fla.simple_gla.naive_recurrent", "intree.simple_gla_recurrent")
GLA_FNS = ("oracle.gla", "fla.gla.naive_recurrent", "intree.gla_recurrent")
SSD_FNS = ("oracle.ssd", "intree.ssd_recurrent", "mamba_ssm.ssd_minimal_discrete")
#: The group norm's eps in the normed comparison (torchscale's default).
NORM_EPS = 1e-6
NOTES = {
    "mamba_ssm.selective_scan_ref": "computes in float32 (casts u, delta, B, C; A passed in float32); "
                                    "materialises exp(delta*A) and delta*B*u as (B, ED, L, N); built "
                                    "without its CUDA extension (make bench-peers)",
    "torchscale.recurrent": "MultiScaleRetention.recurrent_forward once per step + its group norm; the layer "
                            "computes in float32 (harness.kernels.torchscale_adapter)",
    "mambapy.selective_scan_seq": "float64 in; materialises exp(delta*A) and B*x as (B, L, ED, N)",
    "fla.naive_retention": "computes in float32 internally (q.float()); forms (heads, L, L) decay mask",
    "intree.retention_recurrent": "one Python step per t, float64",
    "fla.simple_gla.naive_recurrent": "one torch step per t; computes in float32 (x.float())",
    "fla.gla.naive_recurrent": "one torch step per t; computes in float32 (x.float())",
    "intree.simple_gla_recurrent": "one torch step per t, float64",
    "intree.gla_recurrent": "one torch step per t, float64",
    "intree.ssd_recurrent": "one torch step per t, float64",
    "mamba_ssm.ssd_minimal_discrete": "Listing 1 of the Mamba-2 paper (segsum, chunked), in the input dtype",
}
#: The issue's target: the oracle at least this many times faster than the fastest peer at L >= 8192.
TARGET_RATIO = 5.0
#: A function whose calls have taken this long in all stops repeating (after one call at least).
TIME_BUDGET_S = 30.0
#: Estimated peak bytes of a peer at length L (its large temporaries), to skip the lengths that do not fit.
PEER_MEMORY: dict[str, Callable[[int], float]] = {
    # exp(delta A), delta B, B x and the stacked states: about five (batch, L, ED, N) float64 tensors
    "mambapy.selective_scan_seq": lambda L: 5 * SEL_SHAPE["batch"] * L * SEL_SHAPE["dim"] * SEL_SHAPE["state"] * 8,
    # exp(delta A) and delta B u, float32 (batch, ED, L, N), plus the float32 casts of the inputs
    "mamba_ssm.selective_scan_ref": lambda L: 3 * SEL_SHAPE["batch"] * L * SEL_SHAPE["dim"] * SEL_SHAPE["state"] * 4,
    # the (heads, L, L) float32 decay mask, scores and their product: about three
    "fla.naive_retention": lambda L: 3 * RET_SHAPE["batch"] * RET_SHAPE["heads"] * L * L * 4,
}


def _available_bytes() -> float:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return float(line.split()[1]) * 1024
    except OSError:
        pass
    return float("inf")


def fits(name: str, length: int) -> str:
    """"" when ``name`` can run at ``length`` here, else why not (its estimated memory)."""
    need = PEER_MEMORY.get(name, lambda L: 0.0)(length)
    budget = _available_bytes() / 3
    if need > budget:
        return (f"skipped: needs ~{need / 2**30:.1f} GiB, more than a third of the memory available "
                f"({budget * 3 / 2**30:.1f} GiB)")
    return ""


# ------------------------------------------------------------------------------------------ memory
def _proc_status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(field)


def _reset_peak() -> tuple[str, int]:
    """Reset the peak-RSS mark; returns (method, baseline KiB) for `_read_peak`."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM to the current RSS (Linux >= 4.0)
        return "VmHWM", _proc_status_kib("VmRSS")
    except OSError:
        import resource

        return "ru_maxrss", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux


def _read_peak(method: str) -> int:
    if method == "VmHWM":
        return _proc_status_kib("VmHWM")
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def _mem_child(name: str, length: int, threads: int = 1) -> None:
    """Body of the fresh subprocess: prints {"mib": the call's peak growth, "out_mib", "method"}."""
    torch.set_num_threads(threads)
    with torch.no_grad():
        fn = load_fn(name)
        fn(*inputs_for(name, 16))  # imports, JIT or cache load, first-touch of torch's pools
        args = inputs_for(name, length)
        gc.collect()
        method, before = _reset_peak()
        out = fn(*args)
        after = _read_peak(method)
    out_mib = out.numel() * out.element_size() / 2**20
    print(json.dumps({"mib": max(after - before, 0) / 1024.0, "out_mib": out_mib, "method": method}))


#: glibc: blocks above 64 KiB come from mmap and go back to the system when freed (fixed thresholds).
_MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "0",
               "GLIBC_TUNABLES": "glibc.malloc.mmap_threshold=65536:glibc.malloc.trim_threshold=0"}


def peak_record(name: str, length: int, timeout: float = 600) -> dict[str, Any]:
    """`_mem_child`'s record for ``name`` at ``length`` (``{"error": ...}`` when it fails)."""
    code = f"from harness.bench import _mem_child; _mem_child({name!r}, {length}, {torch.get_num_threads()})"
    env = dict(os.environ, PYTHONWARNINGS="ignore", **_MALLOC_ENV)
    try:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout, env=env)
        return json.loads(out.stdout.strip().splitlines()[-1])
    except Exception as exc:  # noqa: BLE001
        return {"error": f"n/a ({type(exc).__name__})"}


def peak_mib(name: str, length: int, timeout: float = 600) -> float | str:
    """Peak memory growth of one call of ``name`` at ``length``, in MiB (a string saying why when it fails)."""
    rec = peak_record(name, length, timeout)
    return rec["mib"] if "mib" in rec else rec["error"]


# ------------------------------------------------------------------------------------------ timing
def best_time(fn: Callable, args: tuple, reps: int, budget_s: float = TIME_BUDGET_S) -> tuple[float, Any]:
    """Best of ``reps`` calls (fewer once the calls have taken ``budget_s`` in all) and the last output."""
    best, out, spent = float("inf"), None, 0.0
    with torch.no_grad():
        for _ in range(reps):
            t0 = time.perf_counter()
            out = fn(*args)
            took = time.perf_counter() - t0
            best, spent = min(best, took), spent + took
            if spent > budget_s:
                break
    return best, out


def _compare(out: torch.Tensor, ref: torch.Tensor) -> str:
    if torch.equal(out, ref):
        return "bit-identical"
    return f"max|diff|={(out.double() - ref).abs().max().item():.3g}"


def compare_group(group: str, names: tuple[str, ...], lengths: list[int], reps: int, mem: bool) -> list[dict]:
    """One row per (function, length): time, speed-up vs the group's oracle (names[0]), memory, equality."""
    fns: dict[str, Callable | str] = {}
    for n in names:
        try:
            fns[n] = load_fn(n)
            with torch.no_grad():
                fns[n](*inputs_for(n, 16))  # imports, numba's JIT or cache load: outside the timings
        except Exception as exc:  # noqa: BLE001 - a missing peer is reported, not fatal
            fns[n] = f"skipped: {type(exc).__name__}: {exc}"
    jobs = [(n, L) for L in lengths for n in names if callable(fns[n]) and not fits(n, L)]
    mems: dict[tuple[str, int], dict] = {}
    if mem:  # fresh processes, two at a time (the peak is per process; timings below run alone)
        with ThreadPoolExecutor(2) as pool:
            mems = dict(zip(jobs, pool.map(lambda j: peak_record(*j), jobs)))
    rows = []
    for L in lengths:
        args = inputs_for(names[0], L)
        t_ref, ref = best_time(fns[names[0]], args, reps)
        for n in names:
            row = {"group": group, "function": n, "L": L}
            skip = fns[n] if not callable(fns[n]) else fits(n, L)
            if skip:
                row.update(time_s=None, speedup_vs_oracle=None, peak_mib=None, out_mib=None, vs_oracle=skip,
                           note=NOTES.get(n, ""))
                rows.append(row)
                continue
            t, out = (t_ref, ref) if n == names[0] else best_time(fns[n], args, reps)
            m = mems.get((n, L), {"error": "not measured"})
            row.update(time_s=round(t, 4), speedup_vs_oracle=round(t_ref / t, 3),
                       peak_mib=round(m["mib"], 1) if "mib" in m else m["error"],
                       out_mib=round(m["out_mib"], 1) if "out_mib" in m else None,
                       vs_oracle="(reference)" if n == names[0] else _compare(out, ref), note=NOTES.get(n, ""))
            rows.append(row)
        del args, ref
    return rows


def oracle_vs_peers(groups: dict[str, list[dict]]) -> list[dict]:
    """Per group and length: the oracle's time, the fastest peer's, and how many times faster the oracle is."""
    rows = []
    for group, grows in groups.items():
        for L in dict.fromkeys(r["L"] for r in grows):
            at = [r for r in grows if r["L"] == L]
            oracle = at[0]
            peers = [r for r in at[1:] if r["time_s"]]
            fastest = min(peers, key=lambda r: r["time_s"]) if peers else None
            ratio = fastest["time_s"] / oracle["time_s"] if fastest and oracle["time_s"] else None
            rows.append({
                "group": "summary", "family": group, "L": L, "oracle_s": oracle["time_s"],
                "fastest_peer": fastest["function"] if fastest else "(none ran)",
                "peer_s": fastest["time_s"] if fastest else None,
                "oracle_x_faster": round(ratio, 2) if ratio else None,
                f"target_{TARGET_RATIO:g}x": ("met" if ratio >= TARGET_RATIO else "NOT met") if ratio and L >= 8192
                else "-",
                "oracle_peak_mib": oracle["peak_mib"], "oracle_out_mib": oracle["out_mib"],
            })
    return rows


# ------------------------------------------------------------------------------------------ threads
#: (family, oracle, peer) compared per thread count and load.
THREAD_PAIRS = (("selective_scan", "oracle.selective_scan", "mambapy.selective_scan_seq"),
                ("retention", "oracle.retention", "intree.retention_recurrent"),
                ("retention_normed", "oracle.retention_normed", "torchscale.recurrent"))


@contextlib.contextmanager
def busy_core(core: int = 0) -> Iterator[None]:
    """A competing process spinning on ``core`` for the duration (the same load for every contender)."""
    code = f"import os; os.sched_setaffinity(0, {{{core}}})\nwhile True: pass"
    proc = subprocess.Popen([sys.executable, "-c", code])
    try:
        time.sleep(0.2)  # let it start spinning
        yield
    finally:
        proc.kill()
        proc.wait()


@contextlib.contextmanager
def thread_count(threads: int) -> Iterator[None]:
    """torch's intra-op threads and the oracles' compiled kernels (`reference_impls._compiled`) at
    ``threads``, restored afterwards."""
    from reference_impls._compiled import THREADS_ENV

    before, env = torch.get_num_threads(), os.environ.get(THREADS_ENV)
    torch.set_num_threads(threads)
    os.environ[THREADS_ENV] = str(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)
        if env is None:
            os.environ.pop(THREADS_ENV, None)
        else:
            os.environ[THREADS_ENV] = env


def thread_scaling(length: int, reps: int) -> list[dict]:
    """Oracle vs peer at 1, 2 and all cores, on the machine as it is ("idle") and with one core kept
    busy by another process ("busy"): time and ratio per cell, every contender under the same load."""
    from reference_impls._compiled import available_cores

    counts = sorted({1, min(2, available_cores()), available_cores()})
    loaded = [("idle", contextlib.nullcontext)]
    if hasattr(os, "sched_setaffinity"):
        loaded.append(("busy", busy_core))
    rows = []
    for family, oracle, peer in THREAD_PAIRS:
        try:
            fns = {n: load_fn(n) for n in (oracle, peer)}
        except Exception as exc:  # noqa: BLE001 - a missing peer is reported, not fatal
            rows.append({"group": "threads", "family": family, "L": length, "threads": None, "load": None,
                         "oracle_s": None, "peer": f"skipped: {type(exc).__name__}: {exc}", "peer_s": None,
                         "oracle_x_faster": None})
            continue
        args = inputs_for(oracle, length)
        with torch.no_grad():
            for fn in fns.values():
                fn(*inputs_for(oracle, 16))  # imports and JIT outside the timings
        for load, context in loaded:
            with context():
                for threads in counts:
                    with thread_count(threads):
                        t_oracle, _ = best_time(fns[oracle], args, reps)
                        t_peer, _ = best_time(fns[peer], args, reps)
                    rows.append({"group": "threads", "family": family, "L": length, "threads": threads,
                                 "load": load, "oracle_s": float(f"{t_oracle:.4g}"), "peer": peer,
                                 "peer_s": float(f"{t_peer:.4g}"), "oracle_x_faster": round(t_peer / t_oracle, 2)})
    return rows


# ------------------------------------------------------------------------------------------ suite
#: The harness's own work (metrics, records) should stay under this share of a case's time at L >= 1024.
HARNESS_TARGET = 0.10
#: The parts of `harness.runner.run_case`'s record timings, in the order of a case.
PARTS = ("t_inputs", "t_oracle", "t_kernel", "t_baseline", "t_measure", "t_eps0")
#: One in-tree kernel per family, at the shapes of the oracle comparison (float32 cases).
CASE_KERNELS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("intree.blelloch_scan", dict(family="linear_scan", batch=SEL_SHAPE["batch"], dim=SEL_SHAPE["dim"])),
    ("intree.blelloch_selective_scan", dict(family="selective_scan", **SEL_SHAPE)),
    ("intree.retention_chunkwise", dict(family="retention", chunk_size=64, **RET_SHAPE)),
    ("intree.retention_normed_chunkwise", dict(family="retention_normed", chunk_size=64, eps=1e-6, **RET_SHAPE)),
    ("intree.simple_gla_chunk", dict(family="simple_gla", chunk_size=64, **RET_SHAPE)),
    ("intree.gla_chunk", dict(family="gla", chunk_size=64, **RET_SHAPE)),
    ("intree.ssd_chunk", dict(family="ssd", chunk_size=64, batch=1, heads=4, dv=64, state=64, groups=1)),
)


def _shares(recs: list[dict], wall: float) -> dict[str, Any]:
    """Shares of ``wall`` (the cases' summed time): each part of `PARTS`, the rest (``records``: the
    record, the guard's checks, the bookkeeping), and the harness's share (measure + records)."""
    tot = {k: sum(r.get(k) or 0.0 for r in recs) for k in PARTS}
    rest = max(wall - sum(tot.values()), 0.0)
    wall = wall or 1e-12
    row = {k.removeprefix("t_") + "_share": round(v / wall, 3) for k, v in tot.items() if k != "t_eps0"}
    row["records_share"] = round(rest / wall, 3)
    row["harness_share"] = round((tot["t_measure"] + rest) / wall, 3)
    row["harness_ms_per_case"] = round((tot["t_measure"] + rest) / max(len(recs), 1) * 1e3, 2)
    return row


def case_cost(lengths: list[int], seeds: int = 2) -> list[dict]:
    """Where a case's time goes at realistic shapes: one `run_case` per seed, after a warm-up case.

    ``harness_share`` = (measure + records) / the case's wall time; the input generation (float64
    normals from the case's seed) is shown apart, as the stimulus every test pays for.
    """
    from harness.kernels.registry import get
    from harness.problems import Problem
    from harness.runner import run_case

    rows = []
    for name, kw in CASE_KERNELS:
        spec = get(name)
        run_case(spec, Problem(length=min(lengths), seed=seeds, **kw))  # imports, JIT, caches
        for L in lengths:
            recs, began = [], time.perf_counter()
            for seed in range(seeds):
                recs.append(run_case(spec, Problem(length=L, seed=seed, **kw)))
            wall = time.perf_counter() - began
            shares = _shares(recs, wall)
            rows.append({
                "group": "cases", "function": name, "L": L, "elements": recs[0]["n_elements"], "cases": seeds,
                "ms_per_case": round(wall / seeds * 1e3, 1), **shares,
                f"target_{HARNESS_TARGET:.0%}": "met" if shares["harness_share"] < HARNESS_TARGET else "NOT met",
                "verdicts": ",".join(sorted({r["verdict"] for r in recs})),
            })
    return rows


def _pytest(run_dir: Path, workers: int | None) -> tuple[float, str]:
    """Run the README's test command (ci profile) in a subprocess: (wall seconds, pytest's last line)."""
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--hypothesis-profile=ci",
           "--harness-report-dir", str(run_dir), "-m", "not slow"]
    if workers:
        cmd[3:3] = ["-n", str(workers), "--dist", "loadgroup"]  # as `make test`
    began = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=Path(__file__).resolve().parent.parent)
    wall = time.perf_counter() - began
    lines = [ln for ln in out.stdout.splitlines() if ln.strip()]
    return wall, (lines[-1].strip("= ") if lines else f"exit {out.returncode}")


def make_test_runs() -> tuple[list[dict], list[dict]]:
    """`make test`'s wall time, serial and with ``-n 2``, idle and (``-n 2``) with one core kept busy
    by `busy_core`, and the ci profile's cases per second per family, from the records of the serial
    run (each case's own time, ``t_case``)."""
    from harness.store import load_records

    walls, families = [], []
    runs = [(None, "idle", contextlib.nullcontext), (2, "idle", contextlib.nullcontext)]
    if hasattr(os, "sched_setaffinity"):
        runs.append((2, "busy", busy_core))
    with tempfile.TemporaryDirectory() as tmp:
        for workers, load, context in runs:
            run_dir = Path(tmp) / f"run-{workers or 1}-{load}"
            with context():
                wall, last = _pytest(run_dir, workers)
            walls.append({"group": "make_test", "command": "pytest --hypothesis-profile=ci -m 'not slow'"
                          + (f" -n {workers} --dist loadgroup" if workers else " (serial)"), "load": load,
                          "wall_s": round(wall, 1), "result": last})
            if workers:
                continue
            recs = [r for r in load_records(run_dir) if r.get("t_case") is not None]
            for family in sorted({r["family"] for r in recs}):
                mine = [r for r in recs if r["family"] == family]
                spent = sum(r["t_case"] for r in mine)
                long = [r for r in mine if (r.get("length") or 0) >= 1024]
                families.append({
                    "group": "ci_suite", "family": family, "cases": len(mine),
                    "cases_per_s": round(len(mine) / spent, 1) if spent else None,
                    "median_L": sorted(r.get("length") or 0 for r in mine)[len(mine) // 2],
                    **_shares(mine, spent),
                    "cases_L_ge_1024": len(long),
                    "harness_share_L_ge_1024": _shares(long, sum(r["t_case"] for r in long))["harness_share"]
                    if long else None,
                })
    return walls, families


# -------------------------------------------------------------------------------- oracle per-step
class loop_mode:  # noqa: N801 - used as a context manager, named like one
    """Within the block, the oracles run the given loop implementation (see `TECHNIQUES`)."""

    def __init__(self, technique: str):
        self.compiled, self.fused = TECHNIQUES[technique]

    def __enter__(self):
        from reference_impls import _compiled

        self._saved = _compiled.AVAILABLE, _compiled.FUSED
        if self.compiled and not _compiled.AVAILABLE:
            raise RuntimeError(f"compiled loops unavailable: {_compiled.UNAVAILABLE_REASON}")
        _compiled.AVAILABLE, _compiled.FUSED = self.compiled, self.fused
        return self

    def __exit__(self, *exc):
        from reference_impls import _compiled

        _compiled.AVAILABLE, _compiled.FUSED = self._saved
        return False


#: The oracles' loop implementations: (compiled loops on, fused block kernels on).
TECHNIQUES: dict[str, tuple[bool, bool]] = {
    "torch per-step loop": (False, False),
    "numba recur only": (True, False),
    "numba fused blocks (default)": (True, True),
}


def technique_comparison(length: int, reps: int) -> list[dict]:
    """Each oracle under each of `TECHNIQUES` at ``length``: time, speed-up over the torch loop, equality."""
    from reference_impls.retention import retention
    from reference_impls.selective_scan import selective_scan

    rows = []
    for family, fn, make in (("selective_scan", selective_scan, sel_inputs), ("retention", retention, ret_inputs)):
        args = make(length)
        t_torch = ref = None
        for technique in TECHNIQUES:
            row = {"group": "technique", "family": family, "L": length, "technique": technique}
            try:
                with loop_mode(technique):
                    fn(*make(16))  # JIT or cache load outside the timing
                    t, out = best_time(fn, args, reps)
            except RuntimeError as exc:
                row.update(time_s=None, x_faster_than_torch_loop=None, vs_torch_loop=f"skipped: {exc}")
                rows.append(row)
                continue
            if ref is None:
                t_torch, ref = t, out
            row.update(time_s=round(t, 4), x_faster_than_torch_loop=round(t_torch / t, 2),
                       vs_torch_loop="(reference)" if out is ref else _compare(out, ref))
            rows.append(row)
    return rows


_JIT_PROBE = """
import json, time
t0 = time.perf_counter()
import torch
from reference_impls import _compiled
t1 = time.perf_counter()
from harness.bench import sel_inputs, ret_inputs
from reference_impls import linear_recurrence, linear_recurrence_trace, retention, selective_scan
from reference_impls import selective_scan_trace, retention_trace
x = sel_inputs(8); q = ret_inputs(8)
t2 = time.perf_counter()
for dt in (torch.float64, torch.float32):  # every kernel in both dtypes: what a test session compiles
    selective_scan(*x, compute_dtype=dt); retention(*q, compute_dtype=dt)
    linear_recurrence(x[1], x[0], compute_dtype=dt)
tr = selective_scan_trace(*x); retention_trace(*q); linear_recurrence_trace(x[1], x[0])
from harness.metrics import measure  # the measurement pass, one version per grid, and its quantiles
for dt in ("float64", "float32", "bfloat16"):
    measure(tr.out.to(getattr(torch, dt)), tr, dtype=dt)
from harness._compiled_measure import select
select(tr.out.abs().flatten().numpy(), [0])
t3 = time.perf_counter()
print(json.dumps({"available": _compiled.AVAILABLE, "import_s": t1 - t0, "first_calls_s": t3 - t2}))
"""


def jit_cost() -> list[dict]:
    """numba's first-use cost in fresh subprocesses: with an empty cache (a new machine or clone: every
    kernel compiled) and with the cache that run left (every later process)."""
    rows = []
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, NUMBA_CACHE_DIR=cache, PYTHONWARNINGS="ignore")
        for label in ("empty cache: compile", "warm cache: load"):
            try:
                out = subprocess.run([sys.executable, "-c", _JIT_PROBE], capture_output=True, text=True,
                                     timeout=600, env=env, check=True)
                rec = json.loads(out.stdout.strip().splitlines()[-1])
            except Exception as exc:  # noqa: BLE001
                rows.append({"group": "jit", "cache": label, "first_calls_s": f"n/a ({type(exc).__name__})"})
                continue
            rows.append({"group": "jit", "cache": label, "compiled_loops": rec["available"],
                         "import_torch_and_numba_s": round(rec["import_s"], 2),
                         "first_calls_s": round(rec["first_calls_s"], 2),
                         "what": "the oracles' kernels (plain: float32 and float64; traces: float64), the "
                                 "measurement pass (float64, float32, half) and the quantile selection, "
                                 "on tiny inputs"})
    return rows


def oracle_step_cost(length: int, batches: list[int]) -> list[dict]:
    """Selective-scan oracle: microseconds per step vs batch, compiled and torch loop; the torch loop's
    floor is two tiny torch ops per step."""
    from reference_impls.selective_scan import selective_scan

    x, o = torch.zeros(1, dtype=torch.float64), torch.zeros(1, dtype=torch.float64)
    t0 = time.perf_counter()
    for _ in range(length):
        torch.mul(x, o, out=o)
        o.add_(x)
    floor_us = (time.perf_counter() - t0) / length * 1e6
    rows = []
    for b in batches:
        args = sel_inputs(length, batch=b)
        for technique in ("numba fused blocks (default)", "torch per-step loop"):
            try:
                with loop_mode(technique):
                    selective_scan(*sel_inputs(16, batch=b))
                    t, _ = best_time(selective_scan, args, 2)
            except RuntimeError:
                continue
            elems = b * SEL_SHAPE["dim"] * SEL_SHAPE["state"]
            rows.append({"group": "oracle_step", "function": "oracle.selective_scan", "technique": technique,
                         "L": length, "batch": b, "state_elems_per_step": elems,
                         "us_per_step": round(t / length * 1e6, 2),
                         "ns_per_state_elem": round(t / length / elems * 1e9, 3),
                         "dispatch_floor_us_per_step": round(floor_us, 2)})
    return rows


# ------------------------------------------------------------------------------------------ output
def _md(rows: list[dict]) -> str:
    from tabulate import tabulate

    cols = [k for k in rows[0] if k != "group"]
    return tabulate([[r.get(c) for c in cols] for r in rows], headers=cols, tablefmt="github")


def run(out: Path, lengths: list[int], case_lengths: list[int], reps: int, mem: bool = True,
        step_length: int = 2048, step_batches: tuple[int, ...] = (1, 2, 8, 32),
        threads: int = 1, technique_length: int | None = None, jit: bool = True,
        test_runs: bool = False) -> dict[str, list[dict]]:
    """Every group of the benchmark; writes ``bench.md`` and ``bench.csv`` under ``out``.

    ``case_lengths``: L of the per-case cost table; ``technique_length``: L of the technique comparison
    (default: the largest of ``lengths`` up to 8192); ``jit``: measure numba's first-use cost (two
    fresh subprocesses); ``test_runs``: run the test suite serially and with ``-n 2`` (minutes).
    """
    t0 = time.perf_counter()
    # One intra-op thread by default: on this 2-core box torch's default (2 threads) made the per-step
    # loops ~80x slower (thread hand-off per tiny op), which would measure the scheduler, not the code.
    torch.set_num_threads(threads)
    if technique_length is None:
        technique_length = max([L for L in lengths if L <= 8192] or [min(lengths)])
    groups = {
        "selective_scan": compare_group("selective_scan", SEL_FNS, lengths, reps, mem),
        "retention": compare_group("retention", RET_FNS, lengths, reps, mem),
        "retention_normed": compare_group("retention_normed", NORMED_FNS, lengths, reps, mem),
        "simple_gla": compare_group("simple_gla", SIMPLE_GLA_FNS, lengths, reps, mem),
        "gla": compare_group("gla", GLA_FNS, lengths, reps, mem),
        "ssd": compare_group("ssd", SSD_FNS, lengths, reps, mem),
    }
    groups = {"summary": oracle_vs_peers(groups), **groups}
    groups["technique"] = technique_comparison(technique_length, reps)
    if jit:
        groups["jit"] = jit_cost()
    groups["cases"] = case_cost(case_lengths)
    if test_runs:
        groups["make_test"], groups["ci_suite"] = make_test_runs()
    groups["oracle_step"] = oracle_step_cost(step_length, list(step_batches))
    groups["threads"] = thread_scaling(technique_length, reps)
    total = time.perf_counter() - t0
    titles = {
        "summary": f"Oracle vs the fastest peer (float64; target: oracle >= {TARGET_RATIO:g}x faster at L >= 8192; "
                   "peak = the call's peak memory growth, out = its output's size, MiB)",
        "selective_scan": f"Selective scan, float64, batch {SEL_SHAPE['batch']}, ED={SEL_SHAPE['dim']}, "
                          f"N={SEL_SHAPE['state']} (time: best of {reps}; speed-up = oracle time / time)",
        "retention": f"Retention, float64 in, batch {RET_SHAPE['batch']}, heads {RET_SHAPE['heads']}, "
                     f"d {RET_SHAPE['dk']} (time: best of {reps})",
        "retention_normed": f"Retention with the group norm (eps {NORM_EPS:g}), the same shapes (time: best of {reps})",
        "simple_gla": f"Simple GLA (one log-decay per head), float64 in, the retention shapes (time: best of {reps})",
        "gla": f"GLA (one log-decay per key channel), float64 in, the same shapes (time: best of {reps})",
        "ssd": f"SSD (Mamba-2), float64 in, batch 1, heads 4, headdim 64, state 64, chunk 64 (time: best of {reps})",
        "technique": "Oracle loop implementations side by side (same shapes, float64; docs/performance.md)",
        "jit": "numba first use in a fresh process (import, then every kernel in float32 and float64)",
        "cases": f"Where a case's time goes (run_case, float32, the shapes above; harness = measure + records, "
                 f"target < {HARNESS_TARGET:.0%}; inputs = the seeded float64 draws, shown apart)",
        "make_test": "make test's wall time on this machine (the README's test command, ci profile), idle and "
                     "with one core kept busy by a spinning process",
        "ci_suite": "ci profile: generated cases per second per family (records of the serial run; each case's "
                    "own time, t_case)",
        "oracle_step": "Selective-scan oracle cost per step vs batch (what limits it)",
        "threads": "Oracle vs peer by thread count (torch's and the oracle's), on the machine as found (idle) and "
                   "with one core kept busy by a spinning process (busy); best of the repetitions",
    }
    from reference_impls import _compiled

    loops = ("compiled (numba " + __import__("numba").__version__ + ")") if _compiled.AVAILABLE else (
        f"torch loops ({_compiled.UNAVAILABLE_REASON})")
    md = [f"# Benchmark\n\nOne run, `python -m harness.bench`, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads, oracle loops: {loops}, {total:.0f} s in all. Peak memory = the "
          "growth of the peak RSS across one call in a fresh subprocess, after a warm-up call and after the "
          "inputs are built (MiB; `VmHWM` reset through /proc/self/clear_refs).\n"]
    for g, rows in groups.items():
        if rows:
            md.append(f"## {titles[g]}\n\n{_md(rows)}\n")
    text = "\n".join(md)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench.md").write_text(text)
    allrows = [r for rows in groups.values() for r in rows]
    keys = list(dict.fromkeys(k for r in allrows for k in r))
    with open(out / "bench.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        w.writerows(allrows)
    print(text)
    return groups


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m harness.bench", description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="reports/bench")
    ap.add_argument("--lengths", default=None, help="comma-separated, default 1024,8192,65536 (plus 262144 with --long)")
    ap.add_argument("--long", action="store_true", help="add L=262144 to the comparisons (peers where they fit)")
    ap.add_argument("--quick", action="store_true", help="tiny lengths, one repetition (for tests)")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1)")
    ap.add_argument("--no-tests", action="store_true", help="skip timing the test suite (serial and -n 2)")
    a = ap.parse_args(argv)
    if a.quick:
        lengths, case_lengths, reps = [64, 128], [64], 1
        extra = dict(step_length=128, step_batches=(1, 4), jit=False)
    else:
        lengths, case_lengths, reps, extra = [1024, 8192, 65536], [1024, 8192], 3, dict(test_runs=not a.no_tests)
    if a.lengths:
        lengths = [int(x) for x in a.lengths.split(",")]
    if a.long:
        lengths.append(262144)
    run(Path(a.out), lengths, case_lengths, reps, threads=a.threads, **extra)
    return 0


if __name__ == "__main__":
    sys.exit(main())
