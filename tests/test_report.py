"""The report: tables, Markdown, CSV, JSON and PNG files built from synthetic records.

Records are written by hand with `RunStore` (no kernel runs), so every expected count, worst case and
fitted exponent below is known exactly.
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from harness.report import (append_step_summary, build_report, cell_table, fit_exponent, growth_table,
                            length_bucket, summary_markdown, summary_table)
from harness.store import RunStore

HEADER = {"harness_version": "0.1.0", "torch": "2.13.0", "python": "3.11.7", "device": "cpu (x86_64)",
          "git_commit": "abc1234", "profile": "ci", "started": "2025-01-01T00:00:00+00:00"}
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def make_record(kernel: str = "blelloch", *, family: str = "linear_scan", dtype: str = "float32", length: int = 64,
                regime: str = "trained", verdict: str = "equivalent", cond: float | None = 0.01,
                eps: float | None = None, chunk_size: int | None = None, seed: int = 0, **extra: Any) -> dict:
    """One synthetic record in the runner's shape (metrics derived from ``cond``)."""
    rec: dict[str, Any] = {
        "kernel": kernel, "family": family, "dtype": dtype, "length": length, "regime": regime, "seed": seed,
        "eps": eps, "chunk_size": chunk_size, "device": "cpu", "verdict": verdict, "why": f"synthetic {verdict}",
        "cause": {"equivalent": "rounding", "divergent": "kernel_bug"}.get(verdict, verdict),
        "case": f"{kernel}-{dtype}-{length}-{regime}-{eps}-{chunk_size}-{seed}",
        "replay": f"harness replay --kernel {kernel} --problem '{{\"length\": {length}, \"seed\": {seed}}}'",
        "outcome": "ok", "error": None, "t_kernel": 0.001 * (seed + 1),
    }
    if verdict == "kernel_error":
        rec.update(outcome="wrong_shape", error="output shape (1, 4) != (1, 4, 64)")
    elif cond is not None:
        rec.update(cond_max=cond, max_abs=cond * 1e-6, max_rel=cond * 1e-5, rms_ratio=cond * 1e-7, ulp_p99=cond * 10,
                   baseline_ratio=cond * 16, nonfinite_class="none", onset_t=None, growth_exponent=0.5)
    rec.update(extra)
    return rec


def sample_records() -> list[dict]:
    """Two linear-scan kernels over five lengths and two dtypes, a few failures, a normed-retention sweep."""
    recs = []
    for kernel in ("blelloch", "sequential"):
        for dtype in ("float32", "bfloat16"):
            for length in (8, 16, 64, 256, 1024):
                recs.append(make_record(kernel, dtype=dtype, length=length, cond=1e-3 * length**0.75))
    recs.append(make_record("blelloch", dtype="bfloat16", length=300, verdict="divergent", cond=7.5, onset_t=100,
                            nonfinite_class="kernel_nonfinite", first_nonfinite_t=300))
    recs.append(make_record("blelloch", dtype="bfloat16", length=300, regime="unstable", verdict="out_of_domain",
                            cond=math.nan, max_abs=math.inf, nonfinite_class="expected_overflow"))
    recs.append(make_record("sequential", dtype="float32", length=32, verdict="kernel_error", seed=3))
    for eps in (0.0, 1e-6, 1e-3):
        for length in (16, 64):
            recs.append(make_record("chunked_retention", family="retention_normed", length=length, eps=eps,
                                    chunk_size=16, cond=0.1 + 100 * eps))
    return recs


def write_run(run_dir: Path, records: list[dict], *, workers: int = 0) -> Path:
    """Write ``records`` as one run (split round-robin over ``workers`` worker files when > 0)."""
    if workers:
        with RunStore(run_dir, header=HEADER):  # the header of a run that ended (`RunStore.finish`)
            pass
        (run_dir / "records.jsonl").unlink()
        for w in range(workers):
            with RunStore(run_dir, worker=f"gw{w}") as store:
                for rec in records[w::workers]:
                    store.append(rec)
    else:
        with RunStore(run_dir, header=HEADER) as store:
            for rec in records:
                store.append(rec)
    return run_dir


def read_csv(path: Path) -> list[dict[str, str]]:
    with open(path, newline="", encoding="utf-8") as fh:
        return list(csv.DictReader(fh))


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    run = write_run(tmp_path_factory.mktemp("run"), sample_records())
    return build_report(run)


# --------------------------------------------------------------------------------------------- files
def test_build_report_writes_every_file(report):
    for path in report.files():
        assert path.is_file() and path.stat().st_size > 0, path
    assert report.index.name == "index.md"
    names = sorted(p.name for p in report.plots)
    assert names == ["plot_error_vs_eps.png", "plot_error_vs_length_linear_scan.png",
                     "plot_error_vs_length_retention_normed.png", "plot_onset.png"]


def test_index_starts_with_verdict_counts_and_header(report):
    text = report.index.read_text()
    lines = text.splitlines()
    assert lines[0] == "# Kernel equivalence report"
    assert "**29 cases**: 26 equivalent · 1 divergent · 1 out_of_domain · 1 kernel_error" in lines[2]
    # the header in one line under the counts; the full table folded at the end
    for value in ("2.13.0", "3.11.7", "cpu (x86_64)", "abc1234", "ci"):
        assert value in lines[2]
    assert lines[4] == "## Findings"
    assert "| profile" in text.split("<summary>Run header</summary>")[1]
    assert "| kernel " in text and "<summary>Failing cases (3), with figures and replay commands</summary>" in text
    assert "![plot_onset](plot_onset.png)" in text


# -------------------------------------------------------------------------------------------- tables
def test_summary_counts_and_worst_first(report):
    rows = read_csv(report.summary_csv)
    assert [(r["kernel"], r["dtype"]) for r in rows[:2]] == [("blelloch", "bfloat16"), ("sequential", "float32")]
    first = rows[0]
    assert (first["n"], first["equivalent"], first["divergent"], first["out_of_domain"]) == ("7", "5", "1", "1")
    assert first["worst_verdict"] == "divergent" and first["worst_cond_max"] == "7.5"
    assert first["worst_length"] == "300"
    assert rows[1]["worst_verdict"] == "kernel_error" and rows[1]["kernel_error"] == "1"
    equivalent = [r for r in rows if r["worst_verdict"] == "equivalent"]
    conds = [float(r["worst_cond_max"]) for r in equivalent]
    assert conds == sorted(conds, reverse=True)
    assert sum(int(r["n"]) for r in rows) == 29


def test_cells_take_the_worst_of_each_bucket(report):
    rows = read_csv(report.cells_csv)
    cell = [r for r in rows if r["kernel"] == "blelloch" and r["dtype"] == "bfloat16"
            and r["length_bucket"] == "256-511" and r["regime"] == "trained"]
    assert len(cell) == 1
    cell = cell[0]
    # the 256-long equivalent case and the 300-long divergent one share the bucket
    assert (cell["n"], cell["n_not_equivalent"], cell["worst_verdict"]) == ("2", "1", "divergent")
    assert float(cell["cond_max"]) == 7.5
    assert cell["nonfinite"] == "kernel_nonfinite" and cell["onset_t"] == "100"
    unstable = [r for r in rows if r["regime"] == "unstable"][0]
    assert unstable["max_abs"] == "inf" and unstable["cond_max"] == ""
    assert (cell["n_unmeasured"], unstable["n_unmeasured"]) == ("0", "1")

    normed = [r for r in rows if r["family"] == "retention_normed"]
    assert sorted({float(r["eps"]) for r in normed}) == [0.0, 1e-6, 1e-3]  # the eps the records were written with
    assert {r["chunk_size"] for r in normed} == {"16"}
    buckets = [r["length_bucket"] for r in rows if r["kernel"] == "sequential" and r["dtype"] == "float32"]
    assert buckets == ["8-15", "16-31", "32-63", "64-127", "256-511", "1024-2047"]


def test_a_cell_says_how_many_of_its_cases_its_maxima_skip(tmp_path):
    """One NaN output (no comparable element: cond_max NaN) beside a finite case read ``cond_max 0`` with no word
    that a case was not in the maximum (a blind hunt, session 24)."""
    records = [make_record(length=1, cond=0.0, seed=1),
               make_record(length=1, verdict="divergent", cond=math.nan, nonfinite_class="kernel_nonfinite", seed=2),
               make_record(length=1, verdict="kernel_error", seed=3)]
    cell, = read_csv(build_report(write_run(tmp_path / "run", records)).cells_csv)
    assert (cell["cond_max"], cell["n"], cell["n_unmeasured"], cell["worst_verdict"]) == ("0", "3", "2", "divergent")


def test_growth_exponent_is_fitted_across_lengths(report):
    rows = {(r["kernel"], r["dtype"]): r for r in read_csv(report.growth_csv)}
    seq = rows[("sequential", "float32")]
    assert float(seq["exponent_cond_max"]) == pytest.approx(0.75, abs=1e-4)
    assert float(seq["exponent_max_abs"]) == pytest.approx(0.75, abs=1e-4)
    assert seq["n_lengths"] == "5"
    # two lengths only: no fit for the normed retention kernel
    assert ("chunked_retention", "float32") not in rows


def test_failures_list_each_failing_case_with_replay(report):
    rows = read_csv(report.failures_csv)
    assert [r["verdict"] for r in rows] == ["divergent", "kernel_error", "out_of_domain"]
    assert all(r["replay"].startswith("harness replay --kernel ") for r in rows)
    text = report.index.read_text()
    assert text.count("```sh") == 3
    assert "harness replay --kernel sequential --problem '{\"length\": 32, \"seed\": 3}'" in text


def test_report_json_holds_header_and_tables(report):
    doc = json.loads(report.report_json.read_text())
    assert doc["header"]["git_commit"] == "abc1234"
    assert doc["verdict_counts"] == {"equivalent": 26, "divergent": 1, "out_of_domain": 1, "kernel_error": 1}
    assert len(doc["summary"]) == 5 and len(doc["failures"]) == 3
    assert doc["summary"][0]["worst_cond_max"] == 7.5
    assert len(doc["cells"]) == len(read_csv(report.cells_csv))


def test_seeds_are_exact_and_missing_keys_empty_in_csv_and_null_in_json(tmp_path):
    """A 10-digit seed was written as 1.58561e+09 in failures.csv (the inputs of another case), and a key a
    record does not set (eps, chunk size) as the string "-" in CSV and JSON, where docs/reports.md promises
    empty and null (a blind hunt, session 24)."""
    seed = 1585613358
    records = [make_record(verdict="divergent", cond=3.0, seed=seed, max_abs=27586752.0),
               make_record(verdict="kernel_error", seed=2**62 + 1)]  # no metrics: a float column beside an int
    paths = build_report(write_run(tmp_path / "run", records))
    rows = read_csv(paths.failures_csv)
    assert [r["seed"] for r in rows] == [str(seed), str(2**62 + 1)]
    assert rows[0]["eps"] == rows[0]["chunk_size"] == rows[0]["error"] == "" and rows[0]["max_abs"] == "27586752"
    doc = json.loads(paths.report_json.read_text())
    assert [r["seed"] for r in doc["failures"]] == [seed, 2**62 + 1]
    assert doc["failures"][0]["eps"] is None and doc["failures"][0]["error"] is None
    assert {r["eps"] for r in read_csv(paths.cells_csv)} == {""} and {c["eps"] for c in doc["cells"]} == {None}
    assert {r["worst_chunk_size"] for r in read_csv(paths.summary_csv)} == {""}


@pytest.mark.parametrize("length, label", [(1, "1"), (2, "2-3"), (3, "2-3"), (4, "4-7"), (7, "4-7"),
                                           (64, "64-127"), (127, "64-127"), (128, "128-255"), (None, "?")])
def test_length_buckets_are_powers_of_two(length, label):
    assert length_bucket(length)[1] == label


def test_fit_exponent_needs_three_lengths():
    assert math.isnan(fit_exponent([8, 8, 16], [1.0, 2.0, 3.0])[0])
    assert fit_exponent([8, 16, 32], [1.0, 4.0, 16.0])[0] == pytest.approx(2.0)
    # zero and non-finite errors are left out, not fitted as -inf
    assert fit_exponent([8, 16, 32, 64], [1.0, 2.0, 4.0, 0.0])[0] == pytest.approx(1.0)


def test_records_with_missing_fields_do_not_break_tables():
    recs = [{"kernel": "k", "verdict": "kernel_error"}, {"kernel": "k", "dtype": "float32", "length": 8},
            make_record("k", cond=None), make_record("k", length=16, max_rel=None)]
    # a record without family or dtype gets a row of its own ("-"), not an exception
    assert sorted(summary_table(recs)["dtype"]) == ["-", "float32", "float32"]
    assert len(cell_table(recs)) >= 2
    assert growth_table(recs).empty
    assert "k" in summary_markdown(recs)


# ---------------------------------------------------------------------------------------- determinism
def test_two_builds_are_byte_identical(tmp_path, report):
    records = sample_records()
    serial = build_report(write_run(tmp_path / "serial", records))
    # the same records, written in another order and split over two worker files
    shuffled = records[::-1]
    split = build_report(write_run(tmp_path / "split", shuffled, workers=2))
    for a, b in zip(serial.files(), split.files(), strict=True):
        assert a.name == b.name
        assert a.read_bytes() == b.read_bytes(), a.name
    for a, b in zip(serial.files(), report.files(), strict=True):
        assert a.read_bytes() == b.read_bytes(), a.name


def test_plots_are_valid_pngs(report):
    from matplotlib.image import imread

    for path in report.plots:
        assert path.read_bytes()[:8] == PNG_SIGNATURE, path
        image = imread(path)
        assert image.ndim == 3 and image.shape[0] > 200 and image.shape[1] > 300, (path, image.shape)


def test_plots_are_skipped_without_data(tmp_path):
    from harness.plots import write_plots

    recs = [make_record("k", verdict="kernel_error"), make_record("k", cond=None)]
    assert write_plots(recs, tmp_path) == []
    assert not list(tmp_path.glob("*.png"))


@pytest.mark.parametrize(("value", "base", "label"), [
    (1e-3, 10, "10\u207b\u00b3"), (1.0, 10, "1"), (1000.0, 10, "1000"), (1e4, 10, "10\u2074"), (1e15, 10, "10\u00b9\u2075"),
    (1024.0, 2, "1024"), (2.0 ** 30, 2, "2\u00b3\u2070"), (0.0, 10, "0"), (-100.0, 10, "\u2212100"), (3e-3, 10, ""),
])
def test_log_axis_labels_are_plain_text_powers(value, base, label):
    from harness.plots import _power_label

    assert _power_label(value, base) == label


@pytest.mark.parametrize(("low", "high", "labelled_minor"), [(1e-3, 1e15, False), (0.2, 0.5, True)])
def test_a_log_axis_draws_no_mathtext_and_two_minor_ticks_a_decade(low, high, labelled_minor):
    """The labels a log axis draws are plain text (matplotlib's default, mathtext, is parsed per label) and
    its minor ticks are two a decade, not eight: what made a case figure take about 1 s. A narrow view
    labels its minor ticks, where the powers alone would leave the axis nearly bare."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from harness.plots import _log_scale

    fig = Figure()
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    ax.plot([0, 1], [low, high])
    _log_scale(ax, "y")
    ax.set_ylim(low, high)
    fig.canvas.draw()
    labels = [t.get_text() for t in ax.get_yticklabels(minor=False) + ax.get_yticklabels(minor=True)]
    assert labels and not [text for text in labels if "$" in text], labels
    decades = math.log10(high / low)
    assert len(ax.yaxis.get_minorticklocs()) <= 2 * (decades + 1)
    minor = [t.get_text() for t in ax.get_yticklabels(minor=True) if t.get_text()]
    assert bool(minor) == labelled_minor, minor


# -------------------------------------------------------------------------------------------- summary
def test_summary_markdown_is_a_github_table_worst_first():
    text = summary_markdown(sample_records())
    lines = text.splitlines()
    assert lines[0].startswith("**29 cases**")
    table = [line for line in lines if line.startswith("|")]
    assert table[0].startswith("| kernel") and set(table[1]) <= {"|", "-", " "}
    assert "| blelloch " in table[2] and "divergent" in table[2]
    assert lines[-1].startswith("_n: the records of the row, the shrink phase's cases included")
    assert "worst_*: each row's worst case, by verdict first" in lines[-1]
    assert summary_markdown([]) == "_No harness records._"


@pytest.mark.e2e
def test_a_partial_run_says_so_first_in_the_index_and_the_printed_summary(tmp_path, capsys):
    """An interrupted run (`mark_partial`) was marked only by a ``partial | True`` row of the folded run table:
    its headline read "**29 cases**: ..." like a complete run's (a blind hunt, session 24)."""
    from harness.cli import EXIT_OK, main
    from harness.report import run_summary_markdown
    from harness.store import load_header, mark_partial

    run = write_run(tmp_path / "run", sample_records())
    mark_partial(run, "terminated (SIGTERM)")
    status = "**PARTIAL: terminated (SIGTERM) after 29 records**: the cases the run did not reach"
    lines = build_report(run).index.read_text().splitlines()
    assert lines[2].startswith(status) and lines[4].startswith("**29 cases**: 26 equivalent"), lines[:5]
    assert run_summary_markdown(sample_records(), load_header(run)).startswith(status)
    assert main(["report", str(run), "--out", str(tmp_path / "out")]) == EXIT_OK
    assert capsys.readouterr().out.startswith(status)
    complete = write_run(tmp_path / "complete", sample_records())  # a complete run: nothing added
    assert build_report(complete).index.read_text().splitlines()[2].startswith("**29 cases**")
    assert summary_markdown(sample_records(), load_header(complete)).startswith("**29 cases**")


def test_the_run_table_shows_the_harness_commit_beside_its_version():
    from harness.report import header_markdown

    rows = header_markdown({**HEADER, "harness_commit": "f00ba12+dirty"}).splitlines()[2:]
    assert [r.split("|")[1].strip() for r in rows[:3]] == ["harness_version", "harness_commit", "torch"]
    assert "f00ba12+dirty" in rows[1]


def test_step_summary_is_appended_when_the_variable_is_set(tmp_path):
    target = tmp_path / "step_summary.md"
    target.write_text("earlier step\n")
    assert append_step_summary("| a |\n|---|", {"GITHUB_STEP_SUMMARY": str(target)}) == target
    assert target.read_text() == "earlier step\n| a |\n|---|\n\n"
    assert append_step_summary("x", {}) is None


def test_the_summary_shows_a_wrong_final_state_not_the_right_output_beside_it():
    """A gated case divergent on its final state: the worst case and its cond are the final state's (the
    summary showed the output's 0.118 beside a final state at 1.8e15)."""
    base = {"kernel": "k", "family": "simple_gla", "dtype": "float64", "length": 64, "regime": "trained"}
    records = [dict(base, case="a", verdict="divergent", cond_max=0.118, final_state_cond_max=1.76e15),
               dict(base, case="b", verdict="divergent", cond_max=40.0, final_state_cond_max=0.5),
               dict(base, case="c", verdict="equivalent", cond_max=0.2)]
    row = summary_table(records).iloc[0]
    assert row["worst_case"] == "a" and row["worst_cond_max"] == pytest.approx(1.76e15)


def test_a_case_figure_says_what_the_domain_cause_says():
    """Every out-of-domain onset was titled "the inputs leave the dtype's range", a precision_exhausted one
    too (no value leaves any range there: no digit is guaranteed; a blind hunt, session 24)."""
    from harness.plots import _case_message

    exhausted = _case_message({"domain_onset_t": 234, "domain_cause": "precision_exhausted", "cond_max": 0.5})
    assert exhausted.startswith("out of domain from t=234: no digit is guaranteed") and "range" not in exhausted
    state = _case_message({"domain_onset_t": 5, "domain_cause": "state"})
    assert state == "out of domain from t=5: the float64 state exceeds the dtype's max"


def test_the_error_vs_length_title_counts_the_verdicts_of_every_case():
    """46 divergent cases whose cond over their finite elements stayed below 1 (NaN elsewhere) were titled
    "every kernel x dtype within the rounding bound" (a blind hunt, session 24)."""
    from harness.plots import _by_series, _length_title

    drawn = [make_record(length=L, cond=0.2) for L in (8, 64)] + [
        make_record(length=128, verdict="divergent", cond=0.7),
        make_record(length=512, regime="unstable", verdict="out_of_domain", cond=0.1)]
    every = drawn + [make_record(length=1, verdict="divergent", cond=math.nan)]
    title = _length_title("linear_scan", every, drawn, _by_series(drawn))
    assert "within the rounding bound" not in title and title.startswith("linear_scan: 2 divergent of 5 cases"), title
    assert "1 out of domain" in title and "1 not drawn" in title, title
    clean = _length_title("linear_scan", drawn[:2], drawn[:2], _by_series(drawn[:2]))
    assert clean.startswith("linear_scan: every kernel x dtype within the rounding bound"), clean


def test_the_terminal_and_report_json_show_names_as_written_and_index_md_escapes_them(tmp_path, capsys):
    """A gradient's record is named ``k:grad[a]``: the terminal showed ``grad\\[a\\]`` (the Markdown escape of
    the step summary) and report.json's findings were Markdown strings (a blind hunt, session 24)."""
    from harness.cli import EXIT_OK, main

    name = "mine.<lambda>:grad[a]"
    records = [make_record(name, verdict="divergent", cond=3.0), make_record("other")]
    run = write_run(tmp_path / "run", records)
    paths = build_report(run)
    assert "mine.&lt;lambda&gt;:grad\\[a\\]" in paths.index.read_text()  # rendered Markdown: escaped
    findings = json.loads(paths.report_json.read_text())["findings"]
    assert findings[0].startswith(f"{name} (float32), regime trained: divergent, kernel_bug"), findings
    assert not any("**" in line or "\\[" in line for line in findings)
    assert main(["report", str(run), "--out", str(tmp_path / "out")]) == EXIT_OK
    out = capsys.readouterr().out
    assert name in out and "\\[" not in out and "&lt;" not in out


@given(st.text(alphabet=st.sampled_from("ab\\`[]|<>&;lgtmp"), max_size=30))
def test_terminal_text_undoes_the_markdown_escape(text):
    from harness.report import markdown_escape, terminal_text

    assert terminal_text(markdown_escape(text)) == text


def test_the_onset_figure_shows_no_negative_position(tmp_path, monkeypatch):
    """onset_t is a position: the symlog axis's margin below t = 0 drew ticks at -1 and -10 (a blind hunt,
    session 24)."""
    import harness.plots
    from harness.plots import plot_onset

    figures = []
    monkeypatch.setattr(harness.plots, "_save", lambda fig, path: figures.append(fig) or path)
    records = [make_record(length=L, verdict="divergent", cond=3.0, onset_t=t, seed=L)
               for L, t in ((2, 0), (8, 1), (64, 3), (476, 1))]
    plot_onset(records, tmp_path / "onset.png")
    ax, = figures[0].axes
    low, high = ax.get_ylim()
    shown = [t for t in ax.get_yticks() if low <= t <= high]
    assert low == 0 and min(shown) == 0, (low, shown)


_RECORDS = st.lists(st.fixed_dictionaries({
    "kernel": st.sampled_from(["k.a", "k.b"]), "family": st.just("linear_scan"),
    "dtype": st.sampled_from(["float32", "bfloat16"]), "length": st.sampled_from([1, 8, None]),
    "regime": st.just("standard"), "case": st.sampled_from(["c1", "c2"]),
    "mode": st.sampled_from([None, "grad"]), "cond_max": st.sampled_from([0.5, 2.0, float("nan")])}),
    max_size=12)


@given(_RECORDS, st.randoms(use_true_random=False))
def test_canonical_order_is_one_order_whatever_the_input_s(records, rnd):
    """The order names a case first and its whole text only among records that share that (a dozen
    orderings per report formed every record's text each time: over a second per 200 records)."""
    import harness.report as report
    from harness.store import dumps

    shuffled = records[:]
    rnd.shuffle(shuffled)
    ordered = report.canonical_order(records)
    assert [dumps(r) for r in ordered] == [dumps(r) for r in report.canonical_order(shuffled)]
    names = [(r["kernel"], r["dtype"], report._sortable(r["length"]), r["case"]) for r in ordered]
    assert names == sorted(names)


def test_canonical_order_forms_the_text_of_tied_records_only(monkeypatch):
    import harness.store as store
    from harness.report import canonical_order

    formed = []
    real = store.dumps
    monkeypatch.setattr(store, "dumps", lambda obj, *a, **k: formed.append(obj) or real(obj, *a, **k))
    records = [{"kernel": "k", "family": "linear_scan", "dtype": "float32", "length": n, "case": f"c{n}"}
               for n in range(50)]
    records += [dict(records[0], mode="grad", grad_of=name) for name in ("b", "a")]
    ordered = canonical_order(records[::-1])
    assert len(formed) == 3  # the three records of case c0
    assert [r.get("grad_of") for r in ordered[:3]] == ["a", "b", None]


# ------------------------------------------------------------------------------- folders not the harness's
HAND_WRITTEN = "# Our kernels\n\nWritten by hand.\n"


@pytest.mark.e2e
def test_a_report_is_not_written_over_a_folder_of_someone_else_s_files(tmp_path, capsys):
    """``harness report RUN --out docs`` replaced a hand-written docs/index.md, and ``--report-dir docs`` did the
    same after a whole run (a blind hunt, session 27): a folder whose index.md or CSVs no harness run or report
    wrote is refused before anything is written; a new folder, or an earlier report's, is written as before."""
    from harness.cli import EXIT_OK, EXIT_USAGE, main

    run = write_run(tmp_path / "run", sample_records())
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "index.md").write_text(HAND_WRITTEN)
    (docs / "summary.csv").write_text("a,b\n1,2\n")
    assert main(["report", str(run), "--out", str(docs)]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert f"--out={str(docs)!r} holds index.md, summary.csv, which no harness run or report wrote" in err, err
    assert (docs / "index.md").read_text() == HAND_WRITTEN and sorted(p.name for p in docs.iterdir()) == \
        ["index.md", "summary.csv"]
    assert main(["check", "--kernel", "intree.blelloch_scan", "--max-examples", "2", "--report-dir", str(docs),
                 "--cases-dir", str(tmp_path / "cases")]) == EXIT_USAGE
    assert f"--report-dir={str(docs)!r} holds index.md, summary.csv" in capsys.readouterr().err
    assert (docs / "index.md").read_text() == HAND_WRITTEN and not (docs / "run.json").exists()
    for out in (tmp_path / "new", tmp_path / "new"):  # a new folder, then the report it holds: both written
        assert main(["report", str(run), "--out", str(out)]) == EXIT_OK
        assert (out / "report.json").is_file() and (out / "index.md").read_text() != HAND_WRITTEN
    assert main(["report", str(run)]) == EXIT_OK  # the run's own folder
