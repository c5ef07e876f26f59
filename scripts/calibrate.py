"""Calibrate the verdict thresholds from data: correct kernels vs planted bugs, per dtype.

Draws problems with a seeded generator of its own over the same ranges as `harness.strategies.problems`
under a profile's limits (lengths: half from the strategy's special lengths, half log-uniform up to the
profile's longest; batch, dims, state, heads, head dims uniform up to the limits; grouped B/C, the
selective-scan options, eps and chunk sizes as the strategy draws them; the regimes of each family in
turn, so each regime gets the same share). Input values are generated from each problem's seed (the
strategy's explicit, hypothesis-drawn values are not used). Every problem is run on:

- the CORRECT kernels: the in-tree forms and the sequential baselines (``source == "intree"``), and
- the planted bugs of `tests.planted.bugs` and `tests.planted.tiling`,

each through `harness.runner.run_case` with the default `harness.verdict.Policy`. Per dtype it reports:
the cases run on correct kernels, their false-alarm rate (judged divergent or kernel_error), the
largest cond_max and baseline_ratio they reached, the detection rate of the planted bugs on the cases
that expose them, the smallest cond_max among the detected bug cases, and the margin
``COND_THRESHOLD / largest correct cond_max``. The table replaces the text between the markers of
docs/calibration.md.

    python scripts/calibrate.py --cases 24                # problems per (dtype, family); writes the doc
    python scripts/calibrate.py --cases 4 --print         # a quick look, nothing written
    python scripts/calibrate.py --cases 200 --profile nightly --records /tmp/calib.jsonl

``--grad`` also differentiates every judged case (`harness.gradients.forward_judged`) of a kernel that declares autograd, up to
`harness.gradients.GRADIENT_MAX_LENGTH` (as `harness check` does by default): one row per input's gradient
(kernel ``<name>:grad[<input>]``), counted with the forward runs of correct kernels (a false alarm in a
gradient is one too); a planted bug's gradient rows are not detection cases (their bugs are in the forward).

The inputs, the float64 oracle and the same-dtype baseline depend only on the problem, so the run passes
one `harness.oracle_cache.OracleCache` to `run_case` (`RunOptions.oracle_cache`): every kernel of a family
then shares one draw, one oracle run and one baseline per problem. Nothing else in `run_case` changes.
"""

from __future__ import annotations

import argparse
import math
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from docblock import write_between_markers  # noqa: E402  (scripts/ is on sys.path when run as a script)

BEGIN = "<!-- BEGIN calibration table (scripts/calibrate.py) -->"
END = "<!-- END calibration table -->"
DTYPES = ("float64", "float32", "float16", "bfloat16")
from harness.records import FAILING_VERDICTS as FAILING  # noqa: E402 - the one definition


# ------------------------------------------------------------------------------------------ problems
def draw_problem(rng: random.Random, family, regime: str, dtype: str, *, chunked: bool, profile: str,
                 max_length: int | None = None):
    """One problem of ``family`` in ``regime`` and ``dtype``, over `harness.strategies.problems`' ranges
    (lengths up to ``max_length`` when given, else the profile's)."""
    from harness.kernels.contract import Family
    from harness.problems import Problem
    from harness.settings import limits
    from harness.strategies import EPS_ZERO_AND_RANGE, SPECIAL_LENGTHS

    lim = limits(profile)
    top = min(lim.max_length, max_length or lim.max_length)
    if rng.random() < 0.5:
        length = rng.choice([n for n in SPECIAL_LENGTHS if n <= top])
    else:
        length = max(1, min(top, int(round(math.exp(rng.uniform(0.0, math.log(top)))))))
    fields = dict(family=family, length=length, dtype=dtype, regime=regime, batch=rng.randint(1, lim.max_batch),
                  seed=rng.randrange(2**31))

    def size(top: int) -> int:
        """A head dim or state size: 1 .. top, or one time in four a tile edge beyond it (as the strategies'
        `harness.families.base.draw_size`)."""
        edges = [e for e in lim.tile_edges if e > top]
        return rng.choice(edges) if edges and rng.random() < 0.25 else rng.randint(1, top)

    if chunked:
        fields["chunk_size"] = rng.choice(sorted({1, 2, 3, 4, 5, 7, 8, 16, 64, length, length + 1,
                                                  max(1, length // 2), rng.randint(1, length + 2)}))
    if family in (Family.LINEAR_SCAN, Family.SELECTIVE_SCAN):
        fields["dim"] = rng.randint(1, lim.max_dim)
    if family is Family.SELECTIVE_SCAN:
        fields["state"] = rng.randint(1, lim.max_state)  # no tile edges (harness.families.selective_scan)
        if rng.random() < 0.5:
            fields["groups"] = rng.choice([g for g in range(1, fields["dim"] + 1) if fields["dim"] % g == 0])
        for flag in ("has_D", "has_z", "has_delta_bias", "delta_softplus"):
            fields[flag] = rng.random() < 0.5
        if regime == "unstable":
            fields["delta_softplus"] = False
    if family in (Family.RETENTION, Family.RETENTION_NORMED):
        fields["heads"] = rng.randint(1, lim.max_heads)
        fields["dk"] = size(lim.max_head_dim)
        fields["dv"] = size(lim.max_head_dim)
    if family in (Family.SIMPLE_GLA, Family.GLA, Family.SSD):
        fields["heads"] = rng.randint(1, lim.max_heads)
        fields["dv"] = size(lim.max_head_dim)
        if family is Family.SSD:  # heads a multiple of the B/C groups; the state size N
            fields["groups"] = rng.choice([g for g in range(1, fields["heads"] + 1) if fields["heads"] % g == 0])
            fields["state"] = size(lim.max_state)
        else:
            fields["dk"] = size(lim.max_head_dim)
    if family is Family.RETENTION_NORMED:
        lo, hi = math.log10(EPS_ZERO_AND_RANGE[1]), math.log10(EPS_ZERO_AND_RANGE[2])
        fields["eps"] = 0.0 if rng.random() < 0.5 else float(f"{10.0 ** rng.uniform(lo, hi):.3g}")
    return Problem(**fields)


def draw_states(problem, *, chunk_grid: int | None = None):
    """``problem`` with an initial state, a final state and packed rows drawn where its family takes them (the
    gated families), each half the time, as `harness.families.simple_gla.draw_state_options` draws them for
    `harness check`: a packed batch is one row cut at 1 to 3 points, half the time on the chunk grid (the
    problem's chunk, else 64). Drawn from the problem's own seed, so the run's other draws (and a run without
    ``--states``) stay what they were; `_fit` takes away what a kernel does not declare."""
    from harness.families.simple_gla import VARLEN_GRID

    if problem.definition.state_keywords is None:
        return problem
    rng = random.Random(f"states:{problem.seed}")
    fields = {"has_initial_state": rng.random() < 0.5, "final_state": rng.random() < 0.5}
    length = problem.length
    if length > 1 and rng.random() < 0.5:
        grid = chunk_grid or VARLEN_GRID
        if rng.random() < 0.5 and length > grid:
            steps = (length - 1) // grid
            cuts = [grid * j for j in rng.sample(range(1, steps + 1), rng.randint(1, min(3, steps)))]
        else:
            cuts = rng.sample(range(1, length), rng.randint(1, min(3, length - 1)))
        fields.update(cu_seqlens=(0, *sorted(cuts), length), batch=1)
    return problem.replace(**fields)


def _fit(problem, spec):
    """``problem`` inside a kernel's declared capabilities (selective-scan options it does not take, its
    length limit, its head dims, grouped B/C, the chunk or length a form square in it can hold
    (`Capabilities.square_scores`), the range its large/tiny regimes scale to (`Capabilities.range_dtype`)),
    changing only what the kernel cannot take."""
    caps = spec.capabilities
    changes = {}
    if problem.family.value == "selective_scan":
        if not caps.selective_options:
            changes.update(has_z=False, has_delta_bias=False, delta_softplus=False)
        if not caps.grouped_bc and problem.groups:
            changes["groups"] = 0
        if caps.max_state is not None and problem.state > caps.max_state:
            changes["state"] = caps.max_state
    from harness.kernels.contract import Lengths

    length, chunk = problem.length, problem.chunk_size
    if caps.takes_chunk and caps.chunk_sizes and chunk not in caps.chunk_sizes:
        chunk = min(caps.chunk_sizes, key=lambda c: abs(c - (chunk or 1)))
    range_dtype = caps.range_dtype(problem.dtype)  # large/tiny at the kernel's declared range
    if range_dtype != problem.range_dtype:
        changes["range_dtype"] = range_dtype
    square = caps.largest_square(problem.batch * problem.heads, length)  # memory square in the chunk, or the length
    if square is not None and caps.takes_chunk and chunk is not None:
        chunk = min(chunk, square)
    elif square is not None:
        length = min(length, square)
    if caps.lengths is Lengths.CHUNK_MULTIPLE:
        chunk = chunk or (caps.chunk_sizes[0] if caps.chunk_sizes else 64)
    if caps.takes_chunk and chunk is not None:  # every chunk's state (or scores) at once: chunks x length
        rows, elements = problem.batch * problem.heads, problem.definition.state_elements(problem)
        if caps.lengths is Lengths.CHUNK_MULTIPLE:
            length = min(length, caps.longest_at_chunk(rows, chunk, elements) or length)
        elif chunk < (least := caps.smallest_chunk(rows, length, elements)):  # the smallest that fits
            if caps.chunk_sizes:
                chunk = min((c for c in caps.chunk_sizes if c >= least), default=max(caps.chunk_sizes))
            else:
                chunk = min(least, square) if square else least
    if caps.lengths is Lengths.CHUNK_MULTIPLE:
        length = max(chunk, length // chunk * chunk)
    if caps.max_length is not None and length > caps.max_length:
        if caps.lengths is Lengths.CHUNK_MULTIPLE:  # a chunk past the longest length is one chunk of it
            chunk = min(chunk, caps.max_length)
            length = caps.max_length // chunk * chunk
        else:
            length = caps.max_length
    if caps.lengths is Lengths.POW2:
        length = 1 << (length.bit_length() - 1)
    length = max(length, caps.min_length)
    if length != problem.length:
        changes["length"] = length
    cuts = problem.cu_seqlens
    if cuts is not None:  # packed rows: only for a kernel that takes them, cut where the fitted row still is
        kept = [c for c in cuts[1:-1] if c < length] if caps.varlen else []
        changes["cu_seqlens"] = (0, *kept, length) if kept else None
    if problem.has_initial_state and not caps.initial_state:
        changes["has_initial_state"] = False
    if problem.final_state and not caps.final_state:
        changes["final_state"] = False
    if caps.takes_chunk and chunk != problem.chunk_size:
        changes["chunk_size"] = chunk
    if problem.definition.draws_head_dims:
        for name in ("dk", "dv"):
            if (fitted := caps.fit_head_dim(getattr(problem, name))) != getattr(problem, name):
                changes[name] = fitted
    if caps.eps_values and problem.eps is not None and problem.eps not in caps.eps_values:
        changes["eps"] = caps.eps_values[0]
    return problem.replace(**changes) if changes else problem


# ------------------------------------------------------------------------------------------- running
def kernels(third_party: bool = False, planted_bugs: bool = True, interpreted: bool = False):
    """The correct kernels (in-tree; with ``third_party`` also every available third-party adapter that
    is not an interpreted Triton kernel; with ``interpreted`` those alone, `Capabilities.slow`) and the
    planted bugs."""
    from harness.kernels import registry
    from harness.kernels.gated_forms import DIVERGENT_BY_DESIGN
    from tests.planted.bugs import PLANTED as SCAN_AND_RETENTION
    from tests.planted.tiling import TILING_PLANTED

    # not tests.planted.gated's: their `exposes` are approximate (a chunk overflow needs a long enough
    # chunk of strong decay in float32), and the table counts a case they call exposing as a miss
    PLANTED = [*SCAN_AND_RETENTION, *TILING_PLANTED]

    def taken(spec) -> bool:
        if interpreted:
            return spec.capabilities.slow and spec.source not in ("intree", "user")
        return spec.source == "intree" or (third_party and spec.source != "user" and not spec.capabilities.slow)

    correct = [(spec, None) for spec in registry.all_kernels() if spec.name not in DIVERGENT_BY_DESIGN
               and taken(spec) and spec.unavailable_reason() is None]
    planted = [(bug.spec, bug) for bug in PLANTED] if planted_bugs else []
    return correct, planted


def run(cases: int, seed: int, profile: str, dtypes: tuple[str, ...], records_path: Path | None,
        progress: bool, *, third_party: bool = False, planted_bugs: bool = True, max_seconds: float | None = None,
        families: tuple[str, ...] | None = None, max_length: int | None = None, shard=None,
        max_workers: int | None = None, timeout_s: float | None = None, grad: bool = False,
        interpreted: bool = False, states: bool = False) -> list[dict]:
    """Run ``cases`` problems per (dtype, family). Without a time limit the problems are drawn dtype by
    dtype and family by family (the order of the committed tables, so a rerun with the same seed draws
    the same problems); with one (``max_seconds``, checked between problems) round-robin over both, so
    that every (dtype, family) gets its share. ``shard`` (`harness.shard.Shard`): every problem is drawn,
    so the draws are the unsharded run's, and this job runs every N-th from the K-th (`--from-records`
    joins the jobs' records into the unsharded run's tables). ``interpreted``: the interpreted Triton
    kernels alone (`kernels`), at the profile's lengths for them (``slow_max_length``) unless ``max_length``.
    ``states``: the gated families' problems carry initial states, final states and packed rows (`draw_states`)."""
    from harness.gradients import forward_judged, gradient_case, gradients_checked
    from harness.kernels.contract import Family
    from harness.problems import REGIMES
    from harness.kernels import isolation
    from harness.oracle_cache import OracleCache
    from harness.runner import RunOptions, run_case
    from harness.store import dumps

    from harness.settings import limits

    rng = random.Random(seed)
    correct, planted = kernels(third_party, planted_bugs, interpreted)
    if interpreted:
        max_length = max_length or limits(profile).slow_max_length
    # every problem cycles through its family's kernels: one live worker each (41% of a nightly run's
    # time went to restarting them, with the default limit)
    kept = isolation.workers_kept(len(correct) + len(planted), limit=max_workers)
    options = RunOptions(oracle_cache=OracleCache(max_entries=4),
                         **({} if timeout_s is None else {"timeout_s": timeout_s}))
    out: list[dict] = []
    fh = open(records_path, "w") if records_path else None
    start = time.perf_counter()
    fams = [f for f in Family if f in REGIMES and (families is None or f.value in families)]  # wired families
    with kept:
        try:
            if max_seconds is None:
                order = [[(i, d, f)] for d in dtypes for f in fams for i in range(cases)]
            else:
                order = [[(i, d, f) for d in dtypes for f in fams] for i in range(cases)]
            position = -1
            for step, batch in enumerate(order):
                if max_seconds is not None and time.perf_counter() - start > max_seconds:
                    if progress:
                        print(f"  time limit: stopped after {step} problems per (dtype, family)", file=sys.stderr)
                    break
                for i, dtype, family in batch:
                    regimes = REGIMES[family]
                    regime = regimes[i % len(regimes)]
                    fam_kernels = [(s, b) for s, b in correct + planted if s.family is family
                                   and s.capabilities.runs(dtype, "cpu") is None
                                   and regime not in s.capabilities.skip_regimes]
                    base = draw_problem(rng, family, regime, dtype, chunked=True, profile=profile,
                                        max_length=max_length)
                    if states:
                        base = draw_states(base, chunk_grid=base.chunk_size)
                    position += 1
                    if shard is not None and position % shard.count != shard.index - 1:
                        continue  # drawn (the draws stay the unsharded run's), run by another job
                    for spec, bug in fam_kernels:
                        problem = base if spec.capabilities.takes_chunk else base.replace(chunk_size=None)
                        problem = _fit(problem, spec)
                        rec = run_case(spec, problem, options)
                        taken = [rec]
                        if (grad and forward_judged(rec) and spec.capabilities.autograd
                                and gradients_checked(problem)):
                            taken += gradient_case(spec, problem, options, forward=rec)
                        for rec in taken:
                            row = {
                                "kind": "planted" if bug else "correct", "position": position,
                                "kernel": rec.get("kernel", spec.name), "family": family.value, "dtype": dtype,
                                "regime": regime, "length": problem.length, "case": problem.key, "problem": base.key,
                                "verdict": rec["verdict"], "cause": rec.get("cause"),
                                "cond_max": rec.get("cond_max"), "baseline_ratio": rec.get("baseline_ratio"),
                                "baseline_cond_max": rec.get("baseline_cond_max"),
                                "exposes": (bool(bug.exposes(problem)) and rec.get("mode") != "grad") if bug else None,
                                "why": rec.get("why"),
                            }
                            if fh:  # the full record too, so that `--from-records` rebuilds every table
                                fh.write(dumps(dict(row, problem_fields=problem.to_dict(), record=rec)) + "\n")
                            row["record"] = rec  # the full record, to re-judge under other policies
                            out.append(row)
                if progress and (step + 1) % max(1, len(order) // 20) == 0:
                    print(f"  {step + 1} of {len(order)} steps, {len(out)} runs, "
                          f"{time.perf_counter() - start:.0f} s", file=sys.stderr, flush=True)
        finally:
            if fh:
                fh.close()
    return out


def load_rows(paths: list[str]) -> list[dict]:
    """The runs of one or more ``--records`` files (the jobs of a sharded run), as `run` returns them, in
    the order of the draws.
    A run recorded twice (the same kernel on the same case, in two files) is refused: the jobs overlap."""
    from harness.store import loads

    rows, seen = [], {}
    for path in paths:
        with open(path) as fh:
            for number, line in enumerate(fh, 1):
                row = loads(line)
                if "record" not in row:
                    raise SystemExit(f"--from-records: {path}:{number} has no full record (written before records "
                                     "kept it); rerun that calibration with --records")
                key = (row["kernel"], row["case"])
                if key in seen:
                    raise SystemExit(f"--from-records: {row['kernel']} on case {row['case']} is in both {seen[key]} "
                                     f"and {path}: the jobs overlap")
                seen[key] = path
                row.pop("problem_fields", None)
                rows.append(row)
    return sorted(rows, key=lambda r: r["position"])  # the draw order (stable: kernels in their order)


# ------------------------------------------------------------------------------------------ summary
def _finite(values) -> list[float]:
    return [float(v) for v in values if isinstance(v, (int, float)) and math.isfinite(v)]


def summarize(rows: list[dict], dtypes: tuple[str, ...]) -> tuple[list[dict], list[dict], list[dict]]:
    from harness.verdict import COND_THRESHOLD

    per_dtype, false_alarms, missed = [], [], []
    for dtype in dtypes:
        mine = [r for r in rows if r["dtype"] == dtype]
        good = [r for r in mine if r["kind"] == "correct"]
        bad = [r for r in mine if r["kind"] == "planted" and r["exposes"]]
        alarms = [r for r in good if r["verdict"] in FAILING]
        false_alarms += alarms
        detected = [r for r in bad if r["verdict"] in FAILING]
        missed += [r for r in bad if r["verdict"] not in FAILING]
        conds = _finite(r["cond_max"] for r in good)
        ratios = _finite(r["baseline_ratio"] for r in good)
        over = _finite(r["baseline_ratio"] for r in good if _finite([r["cond_max"]])
                       and r["cond_max"] > COND_THRESHOLD)
        bug_conds = _finite(r["cond_max"] for r in detected)
        largest = max(conds) if conds else math.nan
        per_dtype.append({
            "dtype": dtype,
            "problems": len({r["problem"] for r in mine}),
            "correct runs": len(good),
            "out_of_domain": sum(r["verdict"] == "out_of_domain" for r in good),
            "false alarms": f"{len(alarms)} ({_pct(len(alarms), len(good))})",
            "max cond_max (correct)": largest,
            "max baseline_ratio (correct)": max(ratios) if ratios else math.nan,
            "margin thr/max cond": COND_THRESHOLD / largest if largest and largest > 0 else math.inf,
            "correct runs cond > thr": len(over),
            "their max ratio": max(over) if over else math.nan,
            "bug runs exposing": len(bad),
            "detected": f"{len(detected)} ({_pct(len(detected), len(bad))})",
            "min cond_max (detected bugs)": min(bug_conds) if bug_conds else math.nan,
        })
    per_bug = []
    for name in sorted({r["kernel"] for r in rows if r["kind"] == "planted"}):
        for dtype in dtypes:
            sel = [r for r in rows if r["kernel"] == name and r["dtype"] == dtype and r["exposes"]]
            if not sel:
                continue
            det = [r for r in sel if r["verdict"] in FAILING]
            per_bug.append({"bug": name.removeprefix("planted."), "dtype": dtype, "exposing cases": len(sel),
                            "detected": len(det), "rate": len(det) / len(sel),
                            "min cond_max detected": min(_finite(r["cond_max"] for r in det), default=math.nan),
                            "verdicts of missed": ", ".join(sorted({f"{r['verdict']}" for r in sel
                                                                    if r["verdict"] not in FAILING})) or "-"})
    return per_dtype, per_bug, false_alarms + missed


def _pct(k: int, n: int) -> str:
    return f"{100.0 * k / n:.1f}%" if n else "-"


#: Policies the stored records are re-judged under (`harness.verdict.judge`, no kernel is rerun).
WHAT_IF = ("default", "cond=0.5", "cond=2", "cond=4", "baseline=1.5", "baseline=4")


def what_if(rows: list[dict], dtypes: tuple[str, ...]) -> tuple[list[dict], int]:
    """False alarms and detections per dtype under other policies, and how many default re-judgements
    differ from the verdicts `run_case` gave (0: judging from records reproduces the run)."""
    from harness.verdict import Policy, judge

    def verdict(row: dict, policy) -> str:
        rec = row["record"]
        if rec.get("outcome") not in (None, "ok"):
            return "kernel_error"
        return judge(rec, policy).verdict.value

    mismatches = sum(verdict(r, Policy()) != r["verdict"] for r in rows)
    out = []
    for spec in WHAT_IF:
        policy = Policy.parse(spec)
        row = {"policy": policy.spec().rsplit(",min_compared", 1)[0]}
        for dtype in dtypes:
            good = [r for r in rows if r["dtype"] == dtype and r["kind"] == "correct"]
            bad = [r for r in rows if r["dtype"] == dtype and r["kind"] == "planted" and r["exposes"]]
            alarms = sum(verdict(r, policy) in FAILING for r in good)
            found = sum(verdict(r, policy) in FAILING for r in bad)
            row[f"{dtype}: false alarms"] = alarms
            row[f"{dtype}: detected"] = f"{found}/{len(bad)}"
        out.append(row)
    return out, mismatches


def per_family_regime(rows: list[dict], dtypes: tuple[str, ...]) -> list[dict]:
    """False alarms and the out_of_domain share of the correct kernels per family x dtype x regime."""
    out = []
    for family in sorted({r["family"] for r in rows}):
        for dtype in dtypes:
            for regime in sorted({r["regime"] for r in rows if r["family"] == family}):
                good = [r for r in rows if r["kind"] == "correct" and r["family"] == family and r["dtype"] == dtype
                        and r["regime"] == regime]
                if not good:
                    continue
                ood = [r for r in good if r["verdict"] == "out_of_domain"]
                out.append({"family": family, "dtype": dtype, "regime": regime, "correct runs": len(good),
                            "divergent": sum(r["verdict"] == "divergent" for r in good),
                            "kernel_error": sum(r["verdict"] == "kernel_error" for r in good),
                            "out_of_domain": f"{len(ood)} ({_pct(len(ood), len(good))})",
                            "of them precision_exhausted": sum(r.get("cause") == "precision_exhausted" for r in ood),
                            "max cond_max": max(_finite(r["cond_max"] for r in good), default=math.nan)})
    return out


def per_kernel(rows: list[dict]) -> list[dict]:
    """Correct runs, false alarms and out_of_domain per correct kernel and dtype."""
    out = []
    for name in sorted({r["kernel"] for r in rows if r["kind"] == "correct"}):
        for dtype in DTYPES:
            good = [r for r in rows if r["kernel"] == name and r["dtype"] == dtype]
            if not good:
                continue
            out.append({"kernel": name, "dtype": dtype, "runs": len(good),
                        "divergent": sum(r["verdict"] == "divergent" for r in good),
                        "kernel_error": sum(r["verdict"] == "kernel_error" for r in good),
                        "out_of_domain": sum(r["verdict"] == "out_of_domain" for r in good),
                        "precision_loss (divergent)": sum(r.get("cause") == "precision_loss" for r in good),
                        "max cond_max": max(_finite(r["cond_max"] for r in good), default=math.nan)})
    return out


def per_regime(rows: list[dict], dtypes: tuple[str, ...]) -> list[dict]:
    out = []
    for dtype in dtypes:
        for regime in sorted({r["regime"] for r in rows}):
            good = [r for r in rows if r["dtype"] == dtype and r["regime"] == regime and r["kind"] == "correct"]
            if not good:
                continue
            conds = _finite(r["cond_max"] for r in good)
            out.append({"dtype": dtype, "regime": regime, "correct cases": len(good),
                        "false alarms": sum(r["verdict"] in FAILING for r in good),
                        "out_of_domain": sum(r["verdict"] == "out_of_domain" for r in good),
                        "max cond_max": max(conds) if conds else math.nan,
                        "max baseline_ratio": max(_finite(r["baseline_ratio"] for r in good), default=math.nan)})
    return out


def _fmt(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        if math.isnan(value):
            return "-"
        if math.isinf(value):
            return "inf"
        if value == 0:
            return "0"
        if abs(value) >= 1e4 or abs(value) < 1e-2:
            return f"{value:.2e}"
        return f"{value:.3g}"
    return str(value)


def _table(rows: list[dict]) -> str:
    from tabulate import tabulate

    if not rows:
        return "(none)"
    headers = list(rows[0])
    return tabulate([[_fmt(r.get(h)) for h in headers] for r in rows], headers=headers, tablefmt="github",
                    disable_numparse=True)


def markdown(rows, dtypes, *, cases: int, seed: int, profile: str, seconds: float | None, command: str = "") -> str:
    """The tables of ``rows``; ``seconds`` None: rows joined from record files (no one run's time)."""
    import torch

    from harness.verdict import BASELINE_FACTOR, COND_THRESHOLD

    per_dtype, per_bug, odd = summarize(rows, dtypes)
    alternatives, mismatches = what_if(rows, dtypes)
    begin, end = markers(profile)
    done = len({r["problem"] for r in rows}) // max(1, len({(r["dtype"], r["family"]) for r in rows}))
    lines = [
        begin,
        "",
        f"`python scripts/calibrate.py {command}`: {done} of {cases} problems per (dtype, family) "
        f"run{' (time limit)' if done < cases else ''}, {len(rows)} kernel runs "
        f"{f'in {seconds:.0f} s' if seconds is not None else 'joined from the jobs records'}; "
        f"torch {torch.__version__}, CPU. Policy: cond_threshold = {COND_THRESHOLD:g}, "
        f"baseline_factor = {BASELINE_FACTOR:g}.",
        "",
        "### Per dtype",
        "",
        _table(per_dtype),
        "",
        "### The same records judged under other policies",
        "",
        f"Re-judged with `harness.verdict.judge` from the stored records (no kernel rerun); under the default "
        f"policy {mismatches} of {len(rows)} re-judgements differ from the run's verdicts.",
        "",
        _table(alternatives),
        "",
        "### Correct kernels per dtype and regime",
        "",
        _table(per_regime(rows, dtypes)),
        "",
        "### Correct kernels per family, dtype and regime (false alarms, out_of_domain share)",
        "",
        _table(per_family_regime(rows, dtypes)),
        "",
        "### Per correct kernel",
        "",
        _table(per_kernel(rows)),
        "",
        "### Planted bugs per dtype (cases that expose the bug)",
        "",
        _table(per_bug),
        "",
        "### False alarms and missed bugs",
        "",
    ]
    if odd:
        lines.append(_table([{"kind": r["kind"], "kernel": r["kernel"], "dtype": r["dtype"], "regime": r["regime"],
                              "L": r["length"], "verdict": r["verdict"], "cond_max": r["cond_max"],
                              "baseline_ratio": r["baseline_ratio"], "why": (r["why"] or "")[:160]}
                             for r in odd[:60]]))
        if len(odd) > 60:
            lines.append(f"\n... and {len(odd) - 60} more (see --records).")
    else:
        lines.append("None.")
    lines += ["", end]
    return "\n".join(lines)


def markers(profile: str) -> tuple[str, str]:
    """The doc markers of a profile's table: the ci table keeps the original ones."""
    if profile == "ci":
        return BEGIN, END
    return (f"<!-- BEGIN calibration table {profile} (scripts/calibrate.py) -->",
            f"<!-- END calibration table {profile} -->")





def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=24, help="problems per (dtype, family) (default 24)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--profile", default="ci", choices=("dev", "ci", "nightly"),
                        help="whose limits (longest length, dims) the problems are drawn within")
    parser.add_argument("--dtypes", default=",".join(DTYPES))
    parser.add_argument("--out", default=str(ROOT / "docs" / "calibration.md"))
    parser.add_argument("--records", default=None, help="also write every run as JSON lines here")
    parser.add_argument("--print", action="store_true", help="print the tables instead of writing the doc")
    parser.add_argument("--quiet", action="store_true")
    parser.add_argument("--third-party", action="store_true",
                        help="also the available third-party kernels (not the interpreted Triton ones)")
    parser.add_argument("--no-planted", action="store_true", help="correct kernels only")
    parser.add_argument("--families", default=None, help="comma-separated families (default: all)")
    parser.add_argument("--max-length", type=int, default=None,
                        help="cap the drawn lengths below the profile's (parallel retention forms hold L x L "
                             "matrices: 8.6 GB per head in float64 at L=32768)")
    parser.add_argument("--max-seconds", type=float, default=None,
                        help="stop drawing problems after this long; the table says how many were run")
    parser.add_argument("--shard", default=None, metavar="K/N",
                        help="run job K of N: every N-th problem from the K-th (all are drawn, so the problems are "
                             "the unsharded run's); join the jobs' --records with --from-records")
    parser.add_argument("--timeout", type=float, default=None,
                        help="per-call kernel timeout in seconds (default the harness's, 120; the nightly profile's "
                             "largest half-precision cases take minutes on a CPU: make calibrate-nightly passes 900)")
    parser.add_argument("--max-workers", type=int, default=None,
                        help="kernel workers kept alive (default: one per kernel of the run; a worker holds "
                             "~15 MB of its own, ~190 MB for one that imported fla)")
    parser.add_argument("--grad", action="store_true",
                        help="also check the gradients of every judged case of an autograd kernel (as `harness "
                             "check` does), each input's gradient a row of its own (kernel NAME:grad[INPUT])")
    parser.add_argument("--interpreted", action="store_true",
                        help="the third-party kernels run by the Triton interpreter on this CPU, alone (fla's, "
                             "mamba-ssm's, accelerated-scan's), at the profile's lengths for them; no planted bugs")
    parser.add_argument("--states", action="store_true",
                        help="the gated families' problems also carry initial states, final states and packed rows "
                             "(cu_seqlens / seq_idx), each half the time, for the kernels that declare them")
    parser.add_argument("--from-records", nargs="+", default=None, metavar="FILE",
                        help="build the tables from these --records files (the jobs of a sharded run) instead of "
                             "running; give the run's own --cases, --profile and --dtypes")
    args = parser.parse_args(argv)
    if args.cases < 1:
        parser.error(f"--cases={args.cases} must be at least 1")
    dtypes = tuple(args.dtypes.split(","))
    bad = [d for d in dtypes if d not in DTYPES]
    if bad:
        parser.error(f"--dtypes={args.dtypes!r} contains {bad}; expected a subset of {','.join(DTYPES)}")

    from harness.shard import Shard

    shard = Shard.parse(args.shard) if args.shard else None
    start = time.perf_counter()
    families = tuple(args.families.split(",")) if args.families else None
    if args.from_records:
        rows = [r for r in load_rows(args.from_records) if r["dtype"] in dtypes]
    else:
        rows = run(args.cases, args.seed, args.profile, dtypes, Path(args.records) if args.records else None,
                   progress=not args.quiet, third_party=args.third_party, planted_bugs=not (args.no_planted or args.interpreted),
                   max_seconds=args.max_seconds, families=families, max_length=args.max_length, shard=shard,
                   max_workers=args.max_workers, timeout_s=args.timeout, grad=args.grad,
                   interpreted=args.interpreted, states=args.states)
    given = list(argv if argv is not None else sys.argv[1:])
    for flag in ("--records", "--out"):  # where this run wrote things is not part of what it measured
        if flag in given:
            i = given.index(flag)
            del given[i:i + 2]
    if "--from-records" in given:
        i = given.index("--from-records")
        del given[i:i + 1 + len(args.from_records)]
    command = " ".join(a for a in given if not a.startswith(("--records=", "--out=", "--from-records=")))
    block = markdown(rows, dtypes, cases=args.cases, seed=args.seed, profile=args.profile,
                     seconds=None if args.from_records else time.perf_counter() - start, command=command)
    if args.print:
        print(block)
    else:
        begin, end = markers(args.profile)
        write_between_markers(Path(args.out), block, begin=begin, end=end, title="Calibration of the verdict thresholds")
        print(f"wrote {args.out}", file=sys.stderr)
    per_dtype, _, _ = summarize(rows, dtypes)
    return 0 if all(r["false alarms"].startswith("0 ") for r in per_dtype) else 1


if __name__ == "__main__":
    sys.exit(main())
