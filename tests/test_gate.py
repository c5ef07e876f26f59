"""The gate: a run compared with a baseline cell by cell, and the fail-on language.

Runs are synthetic records written with `RunStore`; each test changes one thing between the baseline
and the new run and checks that the gate says exactly that.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from harness.errors import InvalidArgument
from harness.gate import (FailOn, diff_runs, gate, gate_records, noise_floor, parse_fail_on, update_baseline)
from harness.store import RunStore, load_header, load_records

HEADER = {"harness_version": "0.1.0", "torch": "2.13.0", "git_commit": "base123", "profile": "ci"}


def make_record(kernel: str = "blelloch", *, dtype: str = "float32", length: int = 64, regime: str = "trained",
                verdict: str = "equivalent", cond: float = 0.2, seed: int = 0, **extra: Any) -> dict:
    rec: dict[str, Any] = {
        "kernel": kernel, "family": "linear_scan", "dtype": dtype, "length": length, "regime": regime,
        "seed": seed, "eps": None, "chunk_size": None, "verdict": verdict, "case": f"{kernel}-{dtype}-{length}-{seed}",
        "cond_max": cond, "max_abs": cond * 1e-4, "max_rel": cond * 1e-4, "ulp_p99": cond * 100,
        "rms_ratio": cond * 1e-5, "baseline_ratio": cond * 2,
    }
    rec.update(extra)
    return rec


def baseline_records() -> list[dict]:
    return [make_record(k, dtype=d, length=L) for k in ("blelloch", "sequential") for d in ("float32", "float16")
            for L in (16, 64, 256)]


def write_run(run_dir: Path, records: list[dict], header: dict | None = HEADER) -> Path:
    with RunStore(run_dir, header=header) as store:
        for rec in records:
            store.append(rec)
    return run_dir


def replace(records: list[dict], match: dict, **changes: Any) -> list[dict]:
    out = []
    for rec in records:
        rec = dict(rec)
        if all(rec.get(k) == v for k, v in match.items()):
            rec.update(changes)
        out.append(rec)
    return out


# ------------------------------------------------------------------------------------------- gate()
def test_unchanged_run_passes(tmp_path):
    base = write_run(tmp_path / "base", baseline_records())
    new = write_run(tmp_path / "new", baseline_records())
    result = gate(base, new, fail_on="cond:1.5x,rel:2x,ulp:4x,abs:10x")
    assert result.passed and bool(result)
    assert result.failures == [] and result.missing == [] and result.added == []
    assert set(result.table["status"]) == {"both"}
    assert (result.table["ratio_cond_max"] == 1.0).all()


def test_worse_run_fails_naming_the_cell_and_both_values(tmp_path):
    base = write_run(tmp_path / "base", baseline_records())
    worse = replace(baseline_records(), {"kernel": "sequential", "dtype": "float16", "length": 256}, cond_max=0.9)
    new = write_run(tmp_path / "new", worse)
    result = gate(base, new, fail_on="cond:1.5x")
    assert not result.passed
    assert len(result.failures) == 1
    message = result.failures[0]
    for part in ("kernel=sequential", "dtype=float16", "length=256-511", "regime=trained", "cond_max",
                 "0.2 -> 0.9", "x4.5", "1.5x"):
        assert part in message, (part, message)
    # worst first: the changed cell heads the diff table
    top = result.table.iloc[0]
    assert (top["kernel"], top["dtype"], top["length_bucket"]) == ("sequential", "float16", "256-511")
    assert top["ratio_cond_max"] == pytest.approx(4.5)


def test_growth_within_the_factor_passes(tmp_path):
    base = write_run(tmp_path / "base", baseline_records())
    new = write_run(tmp_path / "new", replace(baseline_records(), {"length": 64}, cond_max=0.29))
    assert gate(base, new, fail_on="cond:1.5x").passed
    assert not gate(base, new, fail_on="cond:1.4x").passed


def test_verdict_flip_from_equivalent_fails(tmp_path):
    base = write_run(tmp_path / "base", baseline_records())
    flipped = replace(baseline_records(), {"kernel": "blelloch", "dtype": "float32", "length": 16},
                      verdict="divergent")
    new = write_run(tmp_path / "new", flipped)
    result = gate(base, new, fail_on="")  # no metric terms: verdicts alone
    assert not result.passed
    assert result.failures == ["kernel=blelloch family=linear_scan dtype=float32 length=16-31 regime=trained: "
                               "verdict equivalent -> divergent (baseline 1 cases, now 1)"]
    assert result.table.iloc[0]["verdict_change"] == 1


def test_a_better_verdict_passes():
    base = replace(baseline_records(), {"length": 16}, verdict="divergent")
    assert gate_records(base, baseline_records()).passed


def test_tiny_values_below_the_noise_floor_do_not_fail():
    base = [make_record(cond=0.001)]
    new = [make_record(cond=0.04)]  # 40x, but both below the cond floor of 0.05
    assert gate_records(base, new, "cond:1.5x").passed
    assert not gate_records(base, [make_record(cond=0.06)], "cond:1.5x").passed
    assert noise_floor("cond_max", "float32") == 0.05
    assert noise_floor("max_abs", "float16") == pytest.approx(4 * 2.0**-11)


def test_growth_inside_the_rounding_bound_says_so_and_growth_past_it_does_not():
    """A switch between two correct algorithms moves cond_max by more than 1.5x, far inside the bound: the line
    says the error stayed within what rounding allows, and how to accept it. Growth past the bound has no such
    note."""
    inside = gate_records([make_record(cond=0.06)], [make_record(cond=0.3)], "cond:1.5x")
    assert not inside.passed
    assert inside.failures[0].endswith("cond_max grew 0.06 -> 0.3 (x5; allowed 1.5x by 'cond:1.5x'; both inside the "
                                       "rounding bound (cond <= 1): the error moved within what rounding allows, so "
                                       "an intended change is accepted with `harness update-baseline`)")
    past = gate_records([make_record(cond=0.6)], [make_record(cond=1.2)], "cond:1.5x")
    assert past.failures[0].endswith("cond_max grew 0.6 -> 1.2 (x2; allowed 1.5x by 'cond:1.5x')")
    rel = gate_records([make_record(max_rel=1e-3)], [make_record(max_rel=0.5)], "rel:2x")
    assert "inside the rounding bound" not in rel.failures[0]  # said of cond only: the other metrics have no bound


def test_grown_cells_are_listed_by_the_growth_they_print():
    """Two grown cells: one whose watched cond_max grew x40, one whose cond_max grew x2 while an unwatched
    metric grew x1000. The x40 cell comes first (it came second, ordered by the unwatched ratio)."""
    base = [make_record(length=16, cond=0.1), make_record(length=256, cond=0.1)]
    new = [make_record(length=16, cond=0.2, max_abs=10.0), make_record(length=256, cond=4.0)]
    table = diff_runs(base, new, "cond:1.5x")
    assert list(table["length_bucket"]) == ["256-511", "16-31"]
    assert list(table["grown_ratio"]) == pytest.approx([40.0, 2.0])
    assert table.iloc[1]["worst_ratio"] > table.iloc[0]["worst_ratio"]  # the order the unwatched metric set


def test_non_finite_new_value_fails():
    result = gate_records([make_record()], [make_record(cond_max=math.inf)], "cond:1.5x")
    assert not result.passed and "0.2 -> inf" in result.failures[0]


def test_growth_from_an_exact_zero_is_not_called_non_finite():
    """A float64 cell whose kernel matched the oracle bit for bit (cond 0) that now errs by 3e9: the ratio has
    no finite value, the new cond has ("to a non-finite value" read as if the kernel had returned Inf)."""
    result = gate_records([make_record(dtype="float64", cond=0.0)], [make_record(dtype="float64", cond=3e9)],
                          "cond:1.5x")
    assert not result.passed and "0 -> 3e+09 (from 0: no finite ratio;" in result.failures[0]
    inf = gate_records([make_record(dtype="float64", cond=0.0)], [make_record(dtype="float64", cond=math.inf)],
                       "cond:1.5x")
    assert "0 -> inf (to a non-finite value;" in inf.failures[0]


def test_a_cell_that_now_raises_is_not_measured_not_non_finite():
    """equivalent -> kernel_error: the raising cases hold no metric, and the message read "cond_max grew 0.2 -> -
    (to a non-finite value; ...)", as if the kernel had returned NaN (a blind hunt, session 24)."""
    raised = make_record(verdict="kernel_error", outcome="raised", error="RuntimeError: boom")
    for metric in ("cond_max", "max_abs", "max_rel", "ulp_p99", "rms_ratio", "baseline_ratio"):
        del raised[metric]
    result = gate_records([make_record()], [raised], "cond:1.5x")
    assert not result.passed
    assert result.failures == ["kernel=blelloch family=linear_scan dtype=float32 length=64-127 regime=trained: "
                               "verdict equivalent -> kernel_error (baseline 1 cases, now 1); cond_max 0.2 -> not "
                               "measured (the cell is kernel_error now and none of its cases holds a cond_max)"]
    nan = gate_records([make_record()], [make_record(verdict="divergent", cond_max=math.nan)], "cond:1.5x")
    assert "cond_max grew 0.2 -> nan (to a non-finite value;" in nan.failures[0]  # measured as NaN


def test_missing_cells_are_reported_and_fail_unless_allowed(tmp_path):
    base = write_run(tmp_path / "base", baseline_records())
    fewer = [r for r in baseline_records() if r["kernel"] != "sequential"] + [make_record("new_kernel")]
    new = write_run(tmp_path / "new", fewer)
    result = gate(base, new)
    assert not result.passed
    assert [(s.kind, s.kernel, s.cells) for s in result.shortfalls] == [("kernel", "sequential", 6)]
    assert result.failures == [result.shortfalls[0].message]
    assert len(result.missing) == 6 and all("kernel=sequential" in m for m in result.missing)
    assert result.added == ["kernel=new_kernel family=linear_scan dtype=float32 length=64-127 regime=trained: "
                            "new in this run (1 cases, equivalent)"]
    assert not gate(base, new, fail_on_missing=True).passed  # the older flag says what is now the default
    for allowed in (gate(base, new, allow_missing=True), gate(base, new, fail_on_missing=False)):
        assert allowed.passed and allowed.failures == [] and allowed.allowed_less
        assert len(allowed.warnings) == 1 and result.shortfalls[0].message in allowed.warnings[0]
        assert f"- warning: {allowed.warnings[0]}" in allowed.summary_markdown().splitlines()
    with pytest.raises(InvalidArgument, match="allow_missing=True with fail_on_missing=True"):
        gate(base, new, allow_missing=True, fail_on_missing=True)


def test_a_kernel_only_in_one_run_is_one_line_per_kernel(tmp_path, capsys):
    """A kernel added to a run was listed as 150 "new in this run" lines (50 shown, "... 100 more") and a removed
    one as 150 "missing" lines (a blind hunt, session 24): one line per kernel says it. A new cell of a kernel on
    both sides (a length not drawn before) keeps its own line; `GateResult.added` / ``missing`` stay per cell."""
    from harness.cli import main

    base = write_run(tmp_path / "base", baseline_records())
    fresh = [make_record("fresh", dtype=d, length=L, verdict="out_of_domain" if L == 256 else "equivalent")
             for d in ("float32", "bfloat16") for L in (16, 64, 256)]
    new_recs = [r for r in baseline_records() if r["kernel"] != "sequential"] + fresh + [
        make_record("blelloch", length=1024)]
    new = write_run(tmp_path / "new", new_recs)
    result = gate(base, new, allow_missing=True)
    assert result.passed and len(result.added) == 7 and len(result.missing) == 6
    lines = result.summary_markdown().splitlines()
    assert lines[lines.index("**New cells (only in this run)** (7)") + 1:] == [
        "",
        "- kernel fresh: new in this run (6 cells, 6 cases, 2 dtypes: bfloat16, float32; worst verdict "
        "out_of_domain)",
        "- kernel=blelloch family=linear_scan dtype=float32 length=1024-2047 regime=trained: new in this run "
        "(1 cases, equivalent)",
        "",
        "**Missing cells (only in the baseline)** (6)",
        "",
        "- kernel sequential: in the baseline (6 cells, 6 cases, 2 dtypes: float16, float32; worst verdict "
        "equivalent), not in this run",
    ]
    assert main(["diff", str(base), str(new)]) == 0
    out = capsys.readouterr().out
    assert "- kernel fresh: new in this run (6 cells" in out and "kernel=fresh" not in out


def test_runs_with_no_cell_in_common_fail():
    result = gate_records(baseline_records(), [make_record("other_kernel")])
    assert not result.passed
    assert result.failures == ["no cell of this run matches the baseline (12 baseline cells, 1 new cells): "
                               "nothing was compared; is it the baseline of these kernels?"]


def test_gate_without_a_baseline_says_how_to_make_one(tmp_path):
    new = write_run(tmp_path / "new", baseline_records())
    with pytest.raises(InvalidArgument, match="update-baseline"):
        gate(tmp_path / "nowhere", new)


# ------------------------------------------------------------------------------------------ diff_runs
def test_diff_matches_cells_by_the_full_key():
    base = [make_record(regime="trained"), make_record(regime="long_memory", cond=0.5)]
    new = [make_record(regime="trained", cond=0.4), make_record(regime="long_memory", cond=0.5)]
    table = diff_runs(base, new)
    assert list(table["regime"]) == ["trained", "long_memory"]  # the doubled cell first
    assert list(table["ratio_cond_max"]) == pytest.approx([2.0, 1.0])


# ------------------------------------------------------------------------------------- parse_fail_on
def test_parse_fail_on_reads_aliases_and_factors():
    terms = parse_fail_on("cond:1.5x, rel:2x,ulp:4,abs:10x,rms:50%,baseline_ratio:3x")
    assert [(t.metric, t.factor) for t in terms] == [("cond_max", 1.5), ("max_rel", 2.0), ("ulp_p99", 4.0),
                                                     ("max_abs", 10.0), ("rms_ratio", 1.5), ("baseline_ratio", 3.0)]
    assert terms[0] == FailOn("cond_max", 1.5, "cond:1.5x")
    assert parse_fail_on("") == () and parse_fail_on(None) == ()


@pytest.mark.parametrize("spec, term", [
    ("cond", "cond"),
    ("cond:1.5x,speed:2x", "speed:2x"),
    ("cond:fast", "cond:fast"),
    ("cond:0.5x", "cond:0.5x"),
    ("cond:2x,cond:3x", "cond:3x"),
    (":2x", ":2x"),
])
def test_parse_fail_on_rejects_bad_terms_naming_them(spec, term):
    with pytest.raises(InvalidArgument) as info:
        parse_fail_on(spec)
    message = str(info.value)
    assert repr(term) in message
    assert "metric:factor" in message or "at least 1" in message or "once" in message


# ----------------------------------------------------------------------------------- update_baseline
def test_update_baseline_copies_records_and_header(tmp_path):
    run = tmp_path / "run"
    write_run(run, baseline_records()[:6])
    with RunStore(run, worker="gw1") as store:
        for rec in baseline_records()[6:]:
            store.append(rec)
    baseline = tmp_path / "reports" / "baseline"
    baseline.mkdir(parents=True)
    (baseline / "records-gw9.jsonl").write_text("{}\n")  # a stale file of an older baseline
    assert update_baseline(run, baseline) == baseline
    assert sorted(p.name for p in baseline.iterdir()) == ["records.jsonl", "run.json"]
    assert len(load_records(baseline)) == 12
    assert load_header(baseline)["git_commit"] == "base123"
    assert gate(baseline, run).passed
    with pytest.raises(InvalidArgument, match="no records"):
        update_baseline(tmp_path / "empty", baseline)


# ------------------------------------------------------------------------------- what changed first
def test_a_diff_with_one_regression_shows_it_first(tmp_path, capsys):
    """One cell of twelve gets worse: the gate and `harness diff` open with it; unchanged cells are counted."""
    from harness.cli import main

    base_recs = baseline_records()
    new_recs = replace(base_recs, {"kernel": "sequential", "dtype": "float16", "length": 256}, verdict="divergent",
                       cond_max=7.0)
    # a smaller error is counted as unchanged, not listed
    new_recs = replace(new_recs, {"kernel": "blelloch", "dtype": "float32", "length": 16}, cond_max=0.1)
    base = write_run(tmp_path / "base", base_recs)
    new = write_run(tmp_path / "new", new_recs)
    result = gate(base, new)
    regression = "kernel=sequential family=linear_scan dtype=float16 length=256-511 regime=trained"
    assert not result.passed
    assert result.failures == [f"{regression}: verdict equivalent -> divergent (baseline 1 cases, now 1); "
                               "cond_max grew 0.2 -> 7 (x35; allowed 1.5x by 'cond:1.5x')"]
    assert result.unchanged == 11 and result.better == []
    assert list(result.table["change"]) == ["worse"] + ["unchanged"] * 11
    assert result.summary_markdown().splitlines() == [
        "**Gate FAILED** (fail on: cond:1.5x; 1 failures)",
        "",
        "12 cells compared: 1 worse verdicts, 0 grew past the threshold (cond:1.5x), 0 better verdicts, "
        "11 unchanged (not listed); 0 new cells, 0 missing.",
        "",
        "Worse or grown, by kernel and dtype: sequential float16 (1 cells).",
        "",
        "**Verdicts that got worse** (1)",
        "",
        f"- {regression}: verdict equivalent -> divergent (baseline 1 cases, now 1); cond_max grew 0.2 -> 7 "
        "(x35; allowed 1.5x by 'cond:1.5x')",
    ]
    assert main(["diff", str(base), str(new)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("12 cells compared: 1 worse verdicts")
    assert out[4:6] == ["**Verdicts that got worse** (1)", ""]
    assert out[6].startswith(f"- {regression}: verdict equivalent -> divergent")
    assert not any("dtype=float32 length=64-127" in line for line in out)  # unchanged cells are not listed


def test_diff_sections_come_in_order_of_what_to_act_on():
    base = [make_record(length=16), make_record(length=64), make_record(length=256, verdict="divergent"),
            make_record("gone")]
    new = [make_record(length=16, cond=0.9), make_record(length=64), make_record(length=256),
           make_record("fresh")]
    table = diff_runs(base, new)
    assert list(table["change"]) == ["grew", "better", "added", "missing", "unchanged"]
    from harness.gate import diff_markdown

    titles = [line for line in diff_markdown(table).splitlines() if line.startswith("**")]
    assert titles == ["**Cells whose error grew past the threshold** (1)", "**Verdicts that got better** (1)",
                      "**New cells (only in this run)** (1)", "**Missing cells (only in the baseline)** (1)"]


# ------------------------------------------------------------------ changes between failing verdicts
@pytest.mark.parametrize("before, after", [("divergent", "kernel_error"), ("kernel_error", "divergent")])
def test_a_change_between_the_failing_verdicts_is_worse_either_way(before, after):
    """A blind hunt's verdicts-only gate passed a kernel that went from wrong numbers to raising on every L > 1
    ("5 better verdicts"): by severity alone, divergent -> kernel_error reads as an improvement."""
    cell = {"kernel": "blelloch", "dtype": "float32", "length": 16}
    base = replace(baseline_records(), cell, verdict=before)
    new = replace(baseline_records(), cell, verdict=after)
    result = gate_records(base, new, "")
    assert not result.passed and result.better == []
    assert result.failures == [f"kernel=blelloch family=linear_scan dtype=float32 length=16-31 regime=trained: "
                               f"verdict {before} -> {after} (baseline 1 cases, now 1)"]
    assert "1 worse verdicts, 0 grew past the threshold (no metric terms), 0 better verdicts" in \
        result.summary_markdown()
    assert gate_records(base, replace(baseline_records(), cell, verdict="out_of_domain"), "").passed


@pytest.mark.parametrize("side", ["baseline", "run"])
def test_a_gate_that_matches_no_cell_names_the_key_field_one_side_lacks(side):
    """A baseline without ``regime`` matched no cell and the gate said only "is it the baseline of these
    kernels?" (verification 23); a missing device reads as cpu, so it is not named."""
    lacking = [{k: v for k, v in r.items() if k not in ("regime", "device")} for r in baseline_records()]
    whole = [dict(r, device="cpu") for r in baseline_records()]
    base, new = (lacking, whole) if side == "baseline" else (whole, lacking)
    result = gate_records(base, new, "cond:1.5x")
    other = "run" if side == "baseline" else "baseline"
    assert not result.passed and any(f"nothing was compared; the {side}'s records carry no ['regime'] (the {other}'s "
                                     "do), so every cell differs in it" in f for f in result.failures), result.failures
    unrelated = gate_records(baseline_records(), replace(baseline_records(), {}, kernel="other"), "cond:1.5x")
    assert any("is it the baseline of these kernels?" in f for f in unrelated.failures), unrelated.failures


# ------------------------------------------------------------------------------ a damaged key field
@pytest.mark.parametrize("field, value", [("length", "long"), ("length", 0), ("regime", 7), ("eps", "small"),
                                          ("chunk_size", 2.5), ("tf32", "yes"), ("family", None)])
def test_a_record_with_a_key_field_of_the_wrong_type_is_refused_not_a_new_cell(tmp_path, field, value):
    """``"length": "long"`` alone was read: the record became a cell "length=?", the baseline's divergent cell
    turned "missing", and the gate passed (blind hunt 23b P4, verification 23)."""
    cell = {"kernel": "blelloch", "dtype": "float16", "length": 64}
    base = write_run(tmp_path / "base", replace(baseline_records(), cell, verdict="divergent"))
    new = write_run(tmp_path / "new", replace(baseline_records(), cell, verdict="divergent", **{field: value}))
    line = 1 + [(r["kernel"], r["dtype"], r["length"]) for r in baseline_records()].index(
        ("blelloch", "float16", 64))  # RunStore writes the records in the order appended
    with pytest.raises(InvalidArgument) as info:
        gate(base, new, fail_on="cond:1.5x")
    assert f"{str(new / 'records.jsonl')!r} line {line}: {field}={value!r} must be " in str(info.value)


@pytest.mark.parametrize("verdict", ["bogus", "Divergent", "passed"])
def test_a_baseline_record_with_an_unknown_verdict_is_refused_not_read_as_better(tmp_path, verdict):
    """A baseline whose divergent cell read ``"verdict": "bogus"`` ranked it as bad as kernel_error, so an
    equivalent cell in the new run read "1 better verdict" and an out_of_domain one passed (a blind hunt, session
    27): the file and line are named, and nothing is compared."""
    cell = {"kernel": "blelloch", "dtype": "float16", "length": 64}
    base = write_run(tmp_path / "base", replace(baseline_records(), cell, verdict=verdict))
    new = write_run(tmp_path / "new", baseline_records())
    line = 1 + [(r["kernel"], r["dtype"], r["length"]) for r in baseline_records()].index(
        ("blelloch", "float16", 64))
    with pytest.raises(InvalidArgument) as info:
        gate(base, new, fail_on="cond:1.5x")
    assert f"{str(base / 'records.jsonl')!r} line {line}: verdict={verdict!r}; expected one of ['equivalent', " \
        "'divergent', 'out_of_domain', 'kernel_error']" in str(info.value)


def test_a_baseline_gated_against_itself_is_refused(tmp_path, monkeypatch):
    """``harness gate reports/baseline`` (the run argument given the baseline's folder) passed with "N cells
    unchanged" whatever the kernels do (a blind hunt, session 27); a path spelt otherwise is the same folder."""
    base = write_run(tmp_path / "baseline", replace(baseline_records(), {"length": 64}, verdict="divergent"))
    monkeypatch.chdir(tmp_path)
    for run in (base, Path("baseline"), Path("baseline/../baseline")):
        with pytest.raises(InvalidArgument, match="is the baseline itself .*cannot fail; expected the run directory"):
            gate(base, run, fail_on="cond:1.5x")


# ---------------------------------------------------------------------- a metric no record holds
@pytest.mark.parametrize("value", [None, "garbage", "absent"])
def test_a_baseline_without_the_metric_fails_the_term_naming_it(value):
    """A baseline whose records lack cond_max (or hold text there) turned the cond term off without a word:
    the worse run passed with "0 grew past the threshold"."""
    base = [{k: v for k, v in r.items() if k != "cond_max"} if value == "absent" else dict(r, cond_max=value)
            for r in baseline_records()]
    new = replace(baseline_records(), {"length": 64}, cond_max=9.0)
    result = gate_records(base, new, "cond:1.5x,rel:2x")
    assert not result.passed
    assert result.failures == [
        "no baseline record of the 12 compared cells holds a number in 'cond_max' (missing or not a number in all "
        "12 records that measured something): the term 'cond:1.5x' cannot be checked; the baseline may be damaged "
        "or written by another harness version: remake it, or leave the term out of --fail-on"]
    assert result.failures[0] in result.summary_markdown()
    assert not gate_records(baseline_records(), base, "cond:1.5x").passed  # the run's side too
    assert gate_records(base, baseline_records(), "rel:2x").passed  # a term on another metric is checked


@pytest.mark.parametrize("value", [math.nan, math.inf, "nan"])
def test_a_baseline_whose_equivalent_cells_hold_a_non_finite_cond_fails_the_term(value):
    """A baseline with NaN (or Inf, or the text "nan") in the cond_max of its equivalent records read as
    "nothing to grow from": a run whose every cond grew 9x passed with "4 unchanged" (a blind hunt, session 27).
    An equivalent case's cond is a finite number; such a baseline is damaged."""
    base = replace(baseline_records(), {"kernel": "blelloch"}, cond_max=value)
    new = [dict(r, cond_max=0.9) for r in baseline_records()]
    result = gate_records(base, new, "cond:1.5x")
    assert not result.passed
    assert any("6 baseline record(s) judged equivalent hold cond_max" in f and "the baseline is damaged" in f
               for f in result.failures), result.failures
    assert gate_records(baseline_records(), baseline_records(), "cond:1.5x").passed


def test_a_few_missing_values_and_unmeasurable_ones_are_still_skipped():
    """Some records without the metric, kernel errors (no metric at all) and NaN (a value that could not be
    measured, e.g. baseline_ratio of float64) do not make a term uncheckable."""
    base = replace(baseline_records(), {"length": 16}, cond_max=None)
    assert gate_records(base, baseline_records(), "cond:1.5x").passed
    crashed = [{"kernel": "broken", "family": "linear_scan", "dtype": "float32", "length": 64, "regime": "trained",
                "verdict": "kernel_error", "case": "c1"}]
    assert gate_records(crashed, crashed, "cond:1.5x").passed
    nan = [dict(r, baseline_ratio=math.nan) for r in baseline_records()]
    assert gate_records(nan, nan, "baseline:1.5x").passed


# ------------------------------------------------------------------------------------ partial runs
def _partial(run_dir: Path) -> Path:
    from harness.store import mark_partial

    mark_partial(run_dir, "terminated (SIGTERM)")
    return run_dir


def test_a_partial_run_fails_the_gate_and_a_partial_baseline_warns(tmp_path):
    """An interrupted run cannot show that the kernel is no worse where it stopped; the gate never said that a
    side was partial."""
    base = write_run(tmp_path / "base", baseline_records())
    new = _partial(write_run(tmp_path / "new", baseline_records()))
    result = gate(base, new)
    status = "PARTIAL: terminated (SIGTERM) after 12 records"
    assert not result.passed and result.failures == result.run_failures
    assert result.failures[0].startswith(f"the run is partial ({status}): a run stopped early cannot show")
    assert result.failures[0] in result.summary_markdown()
    swapped = gate(new, base)
    assert swapped.passed and swapped.failures == []
    assert swapped.warnings[0].startswith(f"the baseline is partial ({status})")
    assert f"- warning: {swapped.warnings[0]}" in swapped.summary_markdown().splitlines()


def test_diff_warns_of_a_partial_side(tmp_path, capsys):
    from harness.cli import main

    base = _partial(write_run(tmp_path / "base", baseline_records()))
    new = write_run(tmp_path / "new", baseline_records())
    assert main(["diff", str(base), str(new)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("- warning: the baseline is partial (PARTIAL: terminated (SIGTERM)")
    assert out[2].startswith("12 cells compared")


def test_update_baseline_refuses_a_partial_run_unless_allowed(tmp_path, capsys):
    from harness.cli import EXIT_OK, EXIT_USAGE, main

    run = _partial(write_run(tmp_path / "run", baseline_records()))
    with pytest.raises(InvalidArgument, match=r"run_dir=.* is a partial run \(PARTIAL: terminated .*--allow-partial"):
        update_baseline(run, tmp_path / "baseline")
    assert not (tmp_path / "baseline").exists()
    assert main(["update-baseline", str(run), "--baseline", str(tmp_path / "baseline")]) == EXIT_USAGE
    assert "is a partial run" in capsys.readouterr().err
    assert main(["update-baseline", str(run), "--baseline", str(tmp_path / "baseline"), "--allow-partial"]) == EXIT_OK
    assert load_header(tmp_path / "baseline")["partial"] is True


def test_a_run_directory_that_is_not_there_is_named_so(tmp_path):
    """``harness gate /nonexistent`` said the run "holds no records" (blind hunt, session 23)."""
    with RunStore(tmp_path / "base", header={"profile": "ci"}) as store:
        store.append({"kernel": "k", "family": "linear_scan", "dtype": "float32", "verdict": "equivalent"})
    with pytest.raises(InvalidArgument, match="new_dir='.*nonexistent' is not a directory"):
        gate(tmp_path / "base", tmp_path / "nonexistent")


# ------------------------------------------------------------------------------ the verdict policy
def test_a_run_judged_under_another_policy_is_refused_naming_the_change(tmp_path):
    """A run checked with ``--policy cond=4`` passed the gate against a baseline judged at cond 1, better
    verdicts and all (a verification pass, session 23)."""
    from harness.gate import IncomparableRuns

    policy = {"cond_threshold": 1.0, "baseline_factor": 2.0, "min_compared_fraction": 1.0,
              "fail_on_out_of_domain": False}
    base = write_run(tmp_path / "base", baseline_records(), header=dict(HEADER, policy=policy))
    same = write_run(tmp_path / "same", baseline_records(), header=dict(HEADER, policy=dict(policy)))
    assert gate(base, same).passed
    loose = write_run(tmp_path / "loose", baseline_records(), header=dict(HEADER, policy=dict(policy, cond_threshold=4.0)))
    with pytest.raises(IncomparableRuns, match=r"another verdict policy than the baseline \(cond_threshold 1.0 -> 4.0\)"):
        gate(base, loose)
    forced = gate(base, loose, allow_mismatch=True)
    assert forced.passed and any("cond_threshold 1.0 -> 4.0" in note for note in forced.notes), forced.notes


def test_without_a_policy_in_the_headers_the_records_thresholds_are_compared(tmp_path):
    """Older runs and pytest runs have no policy in run.json; their records carry ``cond_threshold``."""
    from harness.gate import IncomparableRuns

    base = write_run(tmp_path / "base", [dict(r, cond_threshold=1.0) for r in baseline_records()])
    loose = write_run(tmp_path / "loose", [dict(r, cond_threshold=4.0) for r in baseline_records()])
    with pytest.raises(IncomparableRuns, match=r"judged with cond_threshold \[4.0\] and the baseline's with \[1.0\]"):
        gate(base, loose)
    unmarked = write_run(tmp_path / "unmarked", baseline_records())  # records without the field: nothing to compare
    assert gate(base, unmarked).passed


# ------------------------------------------------------------------------------ new failing cells
def test_a_new_failing_cell_fails_where_the_baseline_passes_that_kernel_and_dtype(tmp_path):
    """A kernel added divergent, or a dtype that crashes now, in cells the baseline never had, passed the gate
    (listed as new; a blind hunt, session 24)."""
    base = write_run(tmp_path / "base", baseline_records())
    added = baseline_records() + [make_record("buggy", verdict="divergent", cond=40.0),
                                  make_record("blelloch", dtype="float16", length=1024, verdict="kernel_error")]
    result = gate(base, write_run(tmp_path / "new", added))
    assert not result.passed and len(result.failures) == 2, result.failures
    assert any(f.startswith("kernel=buggy family=linear_scan dtype=float32 length=64-127 regime=trained: new in "
                            "this run and divergent") for f in result.failures), result.failures
    assert any("dtype=float16 length=1024-2047" in f and "kernel_error" in f for f in result.failures)
    passing = baseline_records() + [make_record("newcomer"), make_record("blelloch", length=1024)]
    assert gate(base, write_run(tmp_path / "passing", passing)).passed  # new cells that pass: listed only


def test_a_failure_the_baseline_knows_may_move_to_another_cell():
    """A kernel and dtype that fail in the baseline too: a failing cell new by its length (a shrunk case of
    another size) is the known failure, listed, not a new one."""
    base = replace(baseline_records(), {"kernel": "blelloch", "dtype": "float16", "length": 16}, verdict="divergent")
    new = base + [make_record("blelloch", dtype="float16", length=2, verdict="divergent")]
    result = gate_records(base, new)
    assert result.passed and any("length=2-3" in line for line in result.added), (result.failures, result.added)


# ---------------------------------------------------------------------- a run that checked less
def gradient_record(kernel: str = "blelloch", grad_of: str = "a", **fields: Any) -> dict:
    """A gradient's record: the forward case's fields, ``mode: grad``, kernel ``NAME:grad[INPUT]``."""
    return make_record(f"{kernel}:grad[{grad_of}]", mode="grad", grad_of=grad_of, **fields)


def with_gradients(records: list[dict]) -> list[dict]:
    """``records`` and, for each, the gradients of both inputs (what `harness check` writes by default)."""
    grads = [gradient_record(r["kernel"], name, dtype=r["dtype"], length=r["length"]) for r in records
             for name in ("a", "b")]
    return records + grads


def kinds(result) -> list[tuple[str, str | None, tuple[str, ...]]]:
    return [(s.kind, s.kernel, s.dtypes) for s in result.shortfalls]


def test_a_run_without_the_baselines_gradients_fails_naming_them_first(tmp_path):
    """`harness check --no-grad` against a baseline taken with gradients: the forward cells alone matched, the
    gradients' were listed as missing and the gate passed."""
    base = write_run(tmp_path / "base", with_gradients(baseline_records()))
    new = write_run(tmp_path / "new", baseline_records())
    result = gate(base, new)
    assert not result.passed
    assert kinds(result) == [("gradients", None, ("float16", "float32"))]  # the run as a whole: no gradient at all
    assert result.shortfalls[0].cells == 24  # 2 inputs x 12 forward cells
    assert result.failures[0] == result.shortfalls[0].message
    lines = result.summary_markdown().splitlines()
    said = lines.index(f"- {result.shortfalls[0].message}")
    assert said < min(i for i, line in enumerate(lines) if "cells compared" in line)  # before the diff
    assert gate(base, new, allow_missing=True).passed
    # one kernel's gradients skipped, the other's taken: that kernel is named
    one = with_gradients([r for r in baseline_records() if r["kernel"] == "blelloch"]) + \
        [r for r in baseline_records() if r["kernel"] == "sequential"]
    partly = gate(base, write_run(tmp_path / "partly", one))
    assert not partly.passed and kinds(partly) == [("gradients", "sequential", ("float16", "float32"))]
    assert partly.shortfalls[0].cells == 12


def test_a_kernel_or_dtype_the_run_did_not_check_fails_naming_it():
    fewer_dtypes = [r for r in baseline_records() if not (r["kernel"] == "sequential" and r["dtype"] == "float16")]
    result = gate_records(baseline_records(), fewer_dtypes)
    assert not result.passed
    assert kinds(result) == [("dtype", "sequential", ("float16",))] and result.shortfalls[0].cells == 3
    assert "float16" in result.failures[0] and "sequential" in result.failures[0]
    no_float16 = gate_records(baseline_records(), [r for r in baseline_records() if r["dtype"] != "float16"])
    assert kinds(no_float16) == [("dtype", None, ("float16",))]  # the run as a whole: one line
    assert no_float16.shortfalls[0].cells == 6
    no_kernel = gate_records(baseline_records(), [r for r in baseline_records() if r["kernel"] == "blelloch"])
    assert kinds(no_kernel) == [("kernel", "sequential", ("float16", "float32"))]
    assert no_kernel.shortfalls[0].cells == 6


def test_fewer_examples_or_fewer_cells_fail():
    """``--max-examples 3`` where the baseline ran 25: every cell may still be there, with fewer cases; and
    ``--max-length``: the long cells are gone."""
    base = baseline_records() + [dict(r, seed=1, case=r["case"] + "-1") for r in baseline_records()]
    fewer = gate_records(base, baseline_records())
    assert not fewer.passed
    assert kinds(fewer) == [("examples", k, (d,)) for k in ("blelloch", "sequential") for d in ("float16", "float32")]
    shorter = gate_records(baseline_records(), replace(baseline_records(), {"length": 256}, length=20))
    assert not shorter.passed
    assert kinds(shorter) == [("cells", k, (d,)) for k in ("blelloch", "sequential") for d in ("float16", "float32")]
    assert sum(s.cells for s in shorter.shortfalls) == 4 == len(shorter.missing)


@pytest.mark.parametrize("base_profile, run_profile, smaller", [
    ("ci", "dev", True), ("nightly", "ci", True), ("pytest:ci", "dev", True),
    ("ci", "ci", False), ("ci", "nightly", False), ("ci", "pytest:ci", False)])
def test_a_run_at_a_smaller_profile_fails(tmp_path, base_profile, run_profile, smaller):
    base = write_run(tmp_path / "base", baseline_records(), header=dict(HEADER, profile=base_profile))
    new = write_run(tmp_path / "new", baseline_records(), header=dict(HEADER, profile=run_profile))
    result = gate(base, new)
    assert result.passed is not smaller
    assert kinds(result) == ([("profile", None, ())] if smaller else [])
    if smaller:
        assert base_profile in result.failures[0] and run_profile in result.failures[0]


def test_a_run_that_checked_more_passes_listing_what_it_added():
    more = with_gradients(baseline_records()) + [make_record("blelloch", dtype="bfloat16"), make_record("fresh")]
    result = gate_records(baseline_records(), more)
    assert result.passed and result.shortfalls == [] and result.warnings == []
    assert len(result.added) == 24 + 2
    assert gate_records(baseline_records(), baseline_records()).passed


@pytest.mark.parametrize("profile, fails", [("ci", True), ("nightly", False), ("dev", False)])
def test_cells_a_randomized_profile_did_not_draw_are_a_note(tmp_path, profile, fails):
    """``nightly`` draws anew each run: a cell the baseline drew and this run did not says nothing about what
    was checked (the kernels, dtypes, gradients and examples are compared all the same). ``ci`` draws the
    same cases every run: a missing cell is a shortfall."""
    header = dict(HEADER, profile=profile)
    base = write_run(tmp_path / "base", baseline_records(), header=header)
    redrawn = replace(baseline_records(), {"length": 256}, length=1024)
    result = gate(base, write_run(tmp_path / "new", redrawn, header=header))
    assert result.passed is not fails and len(result.missing) == 4
    assert [s.kind for s in result.shortfalls] == (["cells"] * 4 if fails else [])
    assert fails or any("4 cells" in note for note in result.notes), result.notes
    fewer = [r for r in baseline_records() if r["dtype"] == "float32"]  # a dtype is compared all the same
    assert not gate(base, write_run(tmp_path / "fewer", fewer, header=header)).passed


@pytest.mark.parametrize("profile, fails", [("ci", False), ("sweep:default", True)])
def test_a_failing_search_may_leave_the_baselines_cells(tmp_path, profile, fails):
    """A search stops at its first failure and shrinks it, so a kernel and dtype failing in the baseline and
    the run may visit other cells each time: the failure is what the gate judges there, not the cells. A
    sweep's grid runs every case whatever it finds: its cells are compared."""
    header = dict(HEADER, profile=profile)
    cell = {"kernel": "blelloch", "dtype": "float16", "length": 16}
    base = write_run(tmp_path / "base", replace(baseline_records(), cell, verdict="divergent"), header=header)
    moved = replace(baseline_records(), cell, verdict="divergent", length=2)
    result = gate(base, write_run(tmp_path / "new", moved, header=header))
    assert result.passed is not fails, result.failures
    assert [(s.kind, s.kernel, s.dtypes) for s in result.shortfalls] == (
        [("cells", "blelloch", ("float16",))] if fails else [])


def test_the_gate_command_fails_a_run_that_checked_less_unless_allowed(tmp_path, capsys):
    from harness.cli import EXIT_FAIL, EXIT_OK, main

    base = write_run(tmp_path / "base", with_gradients(baseline_records()))
    new = write_run(tmp_path / "new", baseline_records())
    message = gate(base, new).shortfalls[0].message
    assert main(["gate", str(new), "--baseline", str(base)]) == EXIT_FAIL
    assert message in capsys.readouterr().out
    assert main(["gate", str(new), "--baseline", str(base), "--fail-on-missing"]) == EXIT_FAIL
    capsys.readouterr()
    assert main(["gate", str(new), "--baseline", str(base), "--allow-missing"]) == EXIT_OK
    warned = [line for line in capsys.readouterr().out.splitlines() if message in line]
    assert warned and all("warning" in line for line in warned)
    # the two flags contradict each other: a usage error, naming both
    assert main(["gate", str(new), "--baseline", str(base), "--allow-missing", "--fail-on-missing"]) == 2
    err = capsys.readouterr().err
    assert "allow_missing" in err and "fail_on_missing" in err
    assert main(["gate", str(base), "--baseline", str(new)]) == EXIT_OK  # more than the baseline: fine


def test_a_no_grad_check_against_a_check_with_gradients_fails(tmp_path, capsys):
    """The kernel author's route, for real: `harness check` with gradients made the baseline, the same check
    with ``--no-grad`` is gated against it."""
    from harness.cli import EXIT_FAIL, EXIT_OK, main
    from tests.test_check_cli import write_kernels

    kernel = write_kernels(tmp_path)
    runs = {"grad": tmp_path / "grad", "nograd": tmp_path / "nograd"}
    for name, flags in (("grad", ()), ("nograd", ("--no-grad",))):
        assert main(["check", "--family", "linear_scan", "--kernel", f"{kernel}:loop_scan", "--profile", "ci",
                     "--dtypes", "float64", "--max-length", "32", "--max-examples", "3", "--in-process",
                     "--report-dir", str(runs[name]), "--cases-dir", str(tmp_path / "cases"), *flags]) == EXIT_OK
    assert any(r.get("mode") == "grad" for r in load_records(runs["grad"]))  # the baseline took gradients
    result = gate(runs["grad"], runs["nograd"])
    assert not result.passed and kinds(result) == [("gradients", None, ("float64",))]
    assert result.shortfalls[0].cells == len(result.missing) > 0
    capsys.readouterr()
    assert main(["gate", str(runs["nograd"]), "--baseline", str(runs["grad"])]) == EXIT_FAIL
    assert result.shortfalls[0].message in capsys.readouterr().out
    assert main(["gate", str(runs["nograd"]), "--baseline", str(runs["grad"]), "--allow-missing"]) == EXIT_OK
