"""The interpreted Triton kernels (fla's retention registrations, accelerated_scan.scalar,
mamba_ssm.selective_state_update) over a small sweep, one Markdown row per kernel and dtype: forward verdicts over
L in {37, 70, 100} (no multiple of a chunk size) x every declared chunk size (retention; linear_scan: L in
{37, 300}; selective_scan: L in {37, 70} x (no options; D, delta_bias, softplus; the same grouped, G=2),
batch 2, dim 4, N 8), gradient verdicts at the first length, the largest max |error| and
cond error, and the median time of one interpreted kernel call (the float32 rows of ``fla.X`` against
``fla.X.ieee`` give TF32's share of the float32 error). Seed 11, B=1, H=2, dk=dv=16.

    PYTHONPATH=$PWD python scripts/triton_interpreted_sweep.py [KERNEL ...]
"""
import sys, time, statistics, collections
from harness.kernels.triton_interpreter import interpret_if_no_gpu
interpret_if_no_gpu()
from harness.kernels.registry import get, all_kernels
from harness.problems import Problem
from harness.runner import run_case, RunOptions
from harness.gradients import gradient_case
opts = RunOptions(timeout_s=None)
names = ([s.name for s in all_kernels() if s.name.startswith("fla.") and s.family.value == "retention"]
         + ["accelerated_scan.scalar", "mamba_ssm.selective_state_update"])
names = sys.argv[1:] or names  # or the kernels named on the command line
rows = []
for name in names:
    spec = get(name)
    r = spec.unavailable_reason()
    if r:
        print(f"| {name} | - | unavailable: {r[:120]} |"); continue
    caps = spec.capabilities
    chunks = caps.chunk_sizes or [None]
    fam = spec.family.value
    for dt in caps.dtypes:
        if caps.runs(dt, "cpu"): continue
        verdicts = collections.Counter(); gverdicts = collections.Counter(); times = []; worst = 0.0; maxabs = 0.0
        lengths = {"retention": (37, 70, 100), "selective_scan": (37, 70)}.get(fam, (37, 300))
        # selective_scan: without options, then (both layouts) with D, delta_bias and softplus
        variants = ([dict(), dict(has_D=True, has_delta_bias=True, delta_softplus=True),
                     dict(groups=2, has_D=True, has_delta_bias=True, delta_softplus=True)]
                    if fam == "selective_scan" else [dict()])
        for L, cs, extra in ((L, cs, extra) for L in lengths for cs in chunks for extra in variants):
                kw = dict(family=fam, length=L, dtype=dt, seed=11, chunk_size=cs, **extra)
                kw.update(dict(batch=1, heads=2, dk=16, dv=16) if fam == "retention" else
                          dict(batch=2, dim=4, state=8) if fam == "selective_scan" else dict(batch=2, dim=3))
                p = Problem(**kw)
                rec = run_case(spec, p, opts)
                verdicts[rec["verdict"]] += 1; times.append(rec.get("t_kernel") or 0)
                worst = max(worst, rec.get("cond_max") or 0); maxabs = max(maxabs, rec.get("max_abs") or 0)
                if caps.autograd and rec["verdict"] == "equivalent" and L == lengths[0]:
                    for g in gradient_case(spec, p, opts, forward=rec):
                        gverdicts[g["verdict"]] += 1
        prec = caps.precision(dt)
        print(f"| {name} | {dt} ({prec}) | {dict(verdicts)} | {dict(gverdicts) or '-'} | {maxabs:.3g} | {worst:.3g} | "
              f"{statistics.median(times):.2f} s |", flush=True)
