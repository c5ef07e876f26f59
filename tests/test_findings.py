"""The findings (the first lines of every report) and the sweeps' declared answer tables.

The seed sweeps and a run with one planted bug are run for real, and their findings are asserted line
by line: each line is one conclusion, worst first, with the cause and the number that supports it. The
README's seed tables must be exactly what the seed sweeps print (`scripts/seed_tables.py` rewrites
them). A failing case of the planted-bug run gets a figure along the sequence, linked from its line in
the failing-cases table.
"""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest

from harness.answers import AnswerTable, answer_markdown, block_markers, generated_block, render_value
from harness.errors import InvalidArgument
from harness.findings import findings, findings_markdown, kernel_list

ROOT = Path(__file__).resolve().parent.parent
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _seed_tables():
    spec = importlib.util.spec_from_file_location("seed_tables", ROOT / "scripts" / "seed_tables.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def seed_records() -> dict[str, list[dict]]:
    from harness.kernels.registry import get

    for name in ("mambapy.selective_scan", "torchscale.parallel"):
        reason = get(name).unavailable_reason()
        if reason:
            pytest.skip(f"{name} unavailable here: {reason}")
    module = _seed_tables()
    return {name: module.sweep_records(name) for name in module.SEED_SWEEPS}


# ------------------------------------------------------------------------------------ the seed sweeps
# The findings of real runs are asserted as facts: verdict, cause, kernels, dtypes, counts, positions the float64
# oracle fixes, and numbers on the right side of a threshold with a margin. Their digits are rounding and differ
# between CPUs (vector widths, MKL's code paths); the wording of a line is tested on synthetic records below.
def _facts(found) -> list[tuple]:
    return [(f.verdict, f.cause, f.kernels, f.dtypes, f.regimes, f.n) for f in found]


def test_mamba_seed_findings(seed_records):
    records = seed_records["mamba_seed"]
    found = findings(records)
    forms = ("intree.blelloch_selective_scan", "intree.sequential_selective_scan", "mambapy.selective_scan",
             "mambapy.selective_scan_seq")
    pair = ("mambapy.selective_scan vs mambapy.selective_scan_seq",)
    assert _facts(found[:2]) == [("out_of_domain", "input_overflow", forms, ("float32",), ("unstable",), 12),
                                 ("out_of_domain", "input_overflow", pair, ("float32",), ("unstable",), 3)]
    # the overflow's positions are the float64 oracle's, from t=143 (L=1024) to t=234 (L=256)
    assert "from t=143 to t=234" in found[0].evidence
    rest = found[2]
    assert rest.everything_else and (rest.verdict, rest.cause, rest.n) == ("equivalent", "rounding", 35)
    assert set(rest.kernels) == set(forms) | set(pair)
    assert rest.worst < 1  # within the rounding bound, with room: a digit of it is this CPU's rounding


def test_retnet_seed_findings(seed_records):
    records = seed_records["retnet_seed"]
    found = findings(records)
    forms = ("torchscale.chunkwise", "torchscale.parallel", "torchscale.recurrent")
    pairs = ("torchscale.parallel vs torchscale.chunkwise", "torchscale.parallel vs torchscale.recurrent",
             "torchscale.recurrent vs torchscale.chunkwise")
    both = ("float64", "float32")
    assert _facts(found[:2]) == [("divergent", "eps_effect", forms, both, ("ramp",), 18),
                                 ("divergent", "eps_effect", pairs, both, ("ramp",), 18)]
    assert "first mismatch at t=1" in found[0].evidence
    # the forms against the oracle: far beyond the bound at every eps > 0, and within it at eps = 0
    divergent = [r for r in records if r["kernel"] in forms and r["verdict"] == "divergent"]
    assert len(divergent) == 18 and all(r["eps"] > 0 for r in divergent)
    assert min(r["cond_max"] for r in divergent) > 1e3
    assert max(r["eps0_cond_max"] for r in divergent) < 0.5
    # the forms against each other: their difference shrinks with eps (the seed thread's question)
    worst_ab = {eps: max(r["ab_max_abs"] for r in records if " vs " in r["kernel"] and r["eps"] == eps)
                for eps in (1e-5, 1e-6, 1e-8)}
    assert worst_ab[1e-5] > worst_ab[1e-6] > 10 * worst_ab[1e-8] > 1e-4
    rest = found[2]
    assert rest.everything_else and (rest.verdict, rest.cause, rest.n) == ("equivalent", "rounding", 20)
    assert rest.worst < 1


def test_readme_seed_tables_are_the_sweeps_output(seed_records):
    from harness.cases import load_sweep

    readme = (ROOT / "README.md").read_text()
    for name, records in seed_records.items():
        block = generated_block(name, load_sweep(name).answers, records)
        begin, end = block_markers(name)
        assert begin in readme and end in readme, f"README has no generated block for {name}"
        current = begin + readme.split(begin, 1)[1].split(end, 1)[0] + end
        assert current == block, f"README's {name} table is stale: run `python scripts/seed_tables.py`"


def test_seed_answer_tables_answer_the_question(seed_records):
    from harness.answers import answer_cells
    from harness.cases import load_sweep

    (retnet,) = load_sweep("retnet_seed").answers
    rows, columns, cells = answer_cells(retnet, seed_records["retnet_seed"])
    assert columns == [1e-5, 1e-6, 1e-8, 0.0]  # the sweep's grid order, not sorted
    key = ("float32", "torchscale.parallel vs torchscale.chunkwise")
    assert rows[0] == key
    diffs = {eps: cells[(key, eps)]["ab_max_abs"] for eps in columns}
    assert diffs[0.0] < 1e-6 < diffs[1e-8] < diffs[1e-6] < diffs[1e-5]
    assert render_value(retnet.value, cells[(key, 1e-5)], retnet.floor).endswith(" divergent (eps_effect)")
    # a difference at rounding level is shown as below the table's floor, not by its CPU-dependent digits
    assert retnet.floor is not None and diffs[0.0] < retnet.floor <= 0.1 * diffs[1e-8]
    assert render_value(retnet.value, cells[(key, 0.0)], retnet.floor) == \
        f"< {retnet.floor:g} equivalent (rounding)"

    (mamba,) = load_sweep("mamba_seed").answers
    rows, columns, cells = answer_cells(mamba, seed_records["mamba_seed"])
    assert columns == [64, 128, 256, 512, 1024]
    assert [r[0] for r in rows] == ["unstable"] * 4 + ["trained"] * 4
    assert render_value(mamba.value, cells[(("unstable", "mambapy.selective_scan"), 512)]) == \
        "out_of_domain from t=197"
    assert render_value(mamba.value, cells[(("trained", "mambapy.selective_scan"), 512)]) == "equivalent"


# --------------------------------------------------------------------------------- a planted bug
@pytest.fixture(scope="module")
def planted_run(tmp_path_factory):
    """The carry-dropping blocked scan (wrong from t=512) beside the correct Blelloch scan, reported."""
    from harness.kernels.registry import get
    from harness.problems import Problem
    from harness.report import write_report
    from harness.runner import run_case
    from tests.planted.bugs import by_name

    records = [run_case(spec, Problem("linear_scan", length, dtype=dtype, batch=2, dim=4, seed=3))
               for spec in (by_name("scan_drops_carry_after_block_8").spec, get("intree.blelloch_scan"))
               for dtype in ("float64", "float32") for length in (256, 1024)]
    out = tmp_path_factory.mktemp("planted")
    return records, write_report(records, {"profile": "test"}, out)


def test_planted_bug_findings(planted_run):
    records, paths = planted_run
    found = findings(records)
    assert _facts(found) == [
        ("divergent", "kernel_bug", ("planted.scan_drops_carry_after_block_8",), ("float64", "float32"),
         ("trained",), 2),
        ("equivalent", "rounding", ("intree.blelloch_scan", "planted.scan_drops_carry_after_block_8"),
         ("float64", "float32"), ("trained",), 6)]
    assert "first mismatch at t=512" in found[0].evidence and found[0].worst > 1e6
    assert found[1].everything_else and found[1].worst < 1
    index = paths.index.read_text().splitlines()
    assert index[4] == "## Findings"
    assert index[6] == findings_markdown(records).splitlines()[0]


def test_failing_case_figure_is_drawn_and_linked(planted_run):
    from matplotlib.image import imread

    from harness.plots import case_figure_name

    records, paths = planted_run
    failing = [r for r in records if r["verdict"] != "equivalent"]
    assert len(failing) == 2 and all(r["onset_t"] == 512 for r in failing)
    names = sorted(p.name for p in paths.case_figures)
    assert names == sorted(case_figure_name(r) for r in failing)
    for path in paths.case_figures:
        assert path.read_bytes()[:8] == PNG_SIGNATURE
        image = imread(path)
        assert image.ndim == 3 and image.shape[0] > 400 and image.shape[1] > 500
    text = paths.index.read_text()
    for r in failing:  # each figure is linked from its case's row of the failing-cases table
        row = next(line for line in text.splitlines() if f"[figure]({case_figure_name(r)})" in line)
        assert "planted.scan_drops_carry_after_block_8" in row and r["dtype"] in row and "divergent" in row
    assert not any(p.name.startswith("case_intree") for p in paths.out_dir.iterdir())


def test_one_figure_per_kind_of_failure_not_one_per_shrinking_step(planted_run, tmp_path):
    """A failing search's records are one case and the shrinker's copies of it: each got a figure (12 a
    report, about 7 s, one picture repeated). Now the worst record of each kernel x dtype x verdict x cause."""
    from harness.plots import case_figure_name, write_case_figures

    records, _ = planted_run
    worst = [r for r in records if r["verdict"] != "equivalent"]
    copies = [dict(r, case=f"{r['case']}-shrunk{i}", cond_max=r["cond_max"] / (i + 2)) for r in worst for i in range(5)]
    drawn = write_case_figures(worst + copies, tmp_path)
    assert sorted(drawn) == sorted(case_figure_name(r) for r in worst)
    assert len({(r["kernel"], r["dtype"]) for r in worst}) == len(worst) == 2  # two kinds: two figures
    one_kind = [dict(r, dtype=worst[0]["dtype"]) for r in copies]
    assert len(write_case_figures(one_kind, tmp_path / "one")) == 1


def test_case_figures_are_byte_identical_from_the_same_records(planted_run, tmp_path):
    from harness.report import write_report

    records, paths = planted_run
    stale = tmp_path / "case_gone_kernel_0123456789ab.png"  # an earlier report's case: removed
    stale.write_bytes(PNG_SIGNATURE)
    again = write_report(records[::-1], {"profile": "test"}, tmp_path)
    assert not stale.exists()
    assert [p.name for p in again.case_figures] == [p.name for p in paths.case_figures]
    for a, b in zip(again.case_figures, paths.case_figures):
        assert a.read_bytes() == b.read_bytes(), a.name
    assert write_report(records, {}, tmp_path / "none", case_figures=0).case_figures == ()


@pytest.mark.parametrize("errors", [[1.5e308, 3.0], [5e-324, 2.0], [1.7976931348623157e308, 5e-324, math.inf, math.nan]],
                         ids=["near-max", "subnormal", "both-and-nonfinite"])
def test_figures_draw_errors_at_the_ends_of_float64(planted_run, tmp_path, errors):
    """A kernel's error can be 1e308 (a CI run's wrong loop): matplotlib's log axes fail near float64's
    limits, so the figures draw such values at the edge of `LOG_AXIS_RANGE` instead of raising."""
    import warnings

    from harness.plots import plot_case, write_plots

    records, _ = planted_run
    record = next(r for r in records if r["verdict"] == "divergent" and r["dtype"] == "float32")
    huge = dict(record, error_by_position=[[t, e] for t, e in enumerate(errors)],
                cond_max=max(e for e in errors if e == e))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no figure may be dropped here: each must draw
        assert plot_case(huge, tmp_path / "case.png").read_bytes()[:8] == PNG_SIGNATURE
        drawn = write_plots([huge, dict(huge, length=2 * huge["length"], cond_max=1.7e308)], tmp_path)
    assert [p.name for p in drawn] == ["plot_error_vs_length_linear_scan.png", "plot_onset.png"]


def test_a_figure_that_fails_to_draw_leaves_the_report(planted_run, tmp_path, monkeypatch):
    """A plotting failure costs its figure, with a warning naming it, never the report's tables."""
    import harness.plots
    from harness.report import write_report

    def broken(*args):
        raise ValueError("Axis limits cannot be NaN or Inf")

    monkeypatch.setattr(harness.plots, "plot_case", broken)
    monkeypatch.setattr(harness.plots, "plot_error_vs_length", broken)
    records, _ = planted_run
    with pytest.warns(harness.plots.FigureNotDrawn, match="not drawn: ValueError: Axis limits") as caught:
        paths = write_report(records, {"profile": "test"}, tmp_path)
    names = {str(w.message).split()[0] for w in caught}
    assert "plot_error_vs_length_linear_scan.png" in names and any(n.startswith("case_") for n in names)
    assert paths.case_figures == () and not list(tmp_path.glob("plot_error_vs_length*"))
    assert "planted.scan_drops_carry_after_block_8" in paths.index.read_text()
    assert paths.failures_csv.read_text().count("divergent") == 2


def test_oracle_state_series_replays_the_case(planted_run):
    from harness.plots import oracle_state_series

    records, _ = planted_run
    record = next(r for r in records if r["verdict"] == "divergent" and r["dtype"] == "float32")
    state, decay = oracle_state_series(record)
    assert len(state) == record["length"] == len(decay)
    assert float(state.max()) == pytest.approx(record["state_peak_max"], rel=1e-12)
    assert all(state[1:] >= state[:-1])  # a running peak
    assert "explicit input values" in oracle_state_series({**record, "explicit_values": True})
    assert "does not reproduce" in oracle_state_series({**record, "seed": record["seed"] + 1})


# ------------------------------------------------------------------------------- data-driven lines
def _record(kernel: str, verdict: str, cause: str, **extra) -> dict:
    rec = {"kernel": kernel, "family": "linear_scan", "dtype": "float32", "length": 64, "regime": "trained",
           "verdict": verdict, "cause": cause, "cond_max": 0.1, "case": f"{kernel}-{verdict}-{cause}"}
    rec.update(extra)
    return rec


def test_every_cause_the_runner_names_reads_as_a_phrase():
    import re
    from pathlib import Path

    import harness.runner as runner
    from harness.findings import CAUSE_PHRASES

    named = set(re.findall(r'"(precision_loss|kernel_bug|eps_effect|rounding|tf32|chunk_rounding)"', Path(runner.__file__).read_text()))
    assert named and named <= set(CAUSE_PHRASES)
    assert {"precision_exhausted", "input_overflow", "near_overflow"} <= set(CAUSE_PHRASES)  # the domain kinds


def test_a_new_cause_gets_its_own_line_without_code_changes():
    records = [_record("k.a", "divergent", "kernel_bug", cond_max=50.0, onset_t=3),
               _record("k.b", "divergent", "a_cause_named_later", cond_max=3.0, onset_t=40),
               _record("k.c", "out_of_domain", "input_overflow", domain_onset_t=7, domain_cause="state"),
               _record("k.d", "kernel_error", "raised", cond_max=None, error="RuntimeError: boom"),
               _record("k.e", "equivalent", "rounding")]
    lines = [f.line() for f in findings(records)]
    assert lines == [
        "k.a (float32), regime trained: **divergent, kernel_bug (beyond the rounding bound and the same-dtype "
        "loop: a kernel bug)**: worst cond 50 (float32 L=64 trained); first mismatch at t=3 (1 case)",
        "k.b (float32), regime trained: **divergent, a_cause_named_later**: worst cond 3 (float32 L=64 trained); "
        "first mismatch at t=40 (1 case)",
        "k.d (float32), regime trained: **kernel_error, raised (the kernel raised)**: `RuntimeError: boom` (1 case)",
        "k.c (float32), regime trained: **out_of_domain, input_overflow (the inputs overflow the dtype)**: out of "
        "domain at t=7: the float64 state exceeds the dtype's max; no kernel at fault (1 case)",
        "Everything else (1 kernel; float32): **equivalent, rounding (within the rounding bound)**: worst cond "
        "0.1 (float32 L=64 trained) (1 case)",
    ]


def test_a_kernel_s_gradients_are_counted_as_gradients_not_kernels():
    """`harness check` on one kernel said "Every kernel (6 kernels; float32)": its forward and its five
    gradients (records NAME:grad[INPUT]) counted as six kernels."""
    records = [_record(name, "equivalent", "rounding") for name in
               ("user.my.py:ssd", *(f"user.my.py:ssd:grad[{x}]" for x in ("x", "dt", "A", "B", "C")))]
    assert findings(records)[0].line().startswith("Every kernel (1 kernel, 5 gradients; float32)")
    records.append(_record("k.a", "divergent", "kernel_bug", cond_max=50.0, onset_t=3))
    assert findings(records)[-1].line().startswith("Everything else (1 kernel, 5 gradients; float32)")

def test_a_divergent_final_state_is_the_worst_cond_its_line_quotes():
    """A kernel whose output is right and whose final state is wrong read "worst cond 0.265" (the output's) while
    the final state was at 6e14 (blind hunt, session 23): the line quotes the worse of the two."""
    records = [_record("k.a", "divergent", "kernel_bug", cond_max=0.265, final_state_cond_max=6.05e14, onset_t=3),
               _record("k.a", "divergent", "kernel_bug", cond_max=0.5, final_state_cond_max=2.0, onset_t=3)]
    assert "worst cond 6.05e+14 (float32 L=64 trained)" in findings(records)[0].line()


def test_eps_drawn_at_random_is_not_listed_one_by_one():
    """A property-based run draws eps at random: seven values are no axis to read; the domain is the story."""
    drawn = [_record("k", "divergent", "eps_effect", family="retention_normed", eps=10.0 ** -e, cond_max=2.0 + e,
                     eps0_cond_max=0.3) for e in range(3, 10)]
    assert findings(drawn)[0].evidence == "worst cond 11 (float32 L=64 trained), 0.3 at eps 0 (the same cases rerun)"
    grid = drawn[:2]
    assert findings(grid)[0].evidence == "cond 5 at eps 0.001, 6 at 0.0001, 0.3 at eps 0 (the same cases rerun)"
    overflow = [{**r, "verdict": "out_of_domain", "cause": "input_overflow", "domain_onset_t": 4,
                 "domain_cause": "state"} for r in grid]
    assert findings(overflow)[0].evidence == "out of domain at t=4: the float64 state exceeds the dtype's max"


def test_kernel_list_folds_package_prefixes():
    names = ["torchscale.chunkwise", "torchscale.parallel", "intree.blelloch_scan", "my_kernel", "a.x vs a.y"]
    assert kernel_list(names) == "torchscale.{chunkwise, parallel}, intree.blelloch_scan, my_kernel, a.x vs a.y"


# ------------------------------------------------------------------------------- answer tables
def test_answer_value_drops_bracketed_parts_with_missing_fields():
    assert render_value("{verdict}[ from t={domain_onset_t}]", {"verdict": "equivalent"}) == "equivalent"
    assert render_value("{verdict}[ from t={domain_onset_t}]", {"verdict": "x", "domain_onset_t": 5}) == "x from t=5"
    assert render_value("{ab_max_abs:.1e}", {"ab_max_abs": None}) == "-"
    assert render_value("{ab_max_abs:.1e}", {"ab_max_abs": math.nan}) == "-"


def test_answer_table_filters_orders_and_takes_the_worst():
    table = AnswerTable.from_dict({"question": "Q?", "rows": "kernel", "columns": "length", "value": "{verdict}",
                                   "where": {"dtype": ["float32"]}}, orders={"length": [64, 16]})
    records = [_record("k", "equivalent", "rounding", length=16), _record("k", "divergent", "kernel_bug", length=16),
               _record("k", "equivalent", "rounding", length=64), _record("k", "divergent", "x", dtype="float64")]
    assert answer_markdown(table, records).splitlines() == [
        "**Q?**", "", "| kernel \\ length   | 64         | 16        |",
        "|-------------------|------------|-----------|", "| k                 | equivalent | divergent |"]


def test_an_answer_question_is_shown_as_written_never_rendered():
    """A sweep's question went into index.md as raw Markdown: ``<img src=x onerror=...>``, a link, or a blank line
    and a "# Gate passed" heading rendered as the report's own (a blind hunt, session 27). It is escaped and on
    one line; the terminal shows it as written."""
    from harness.report import terminal_text

    question = "Is <b>it</b> [safe](http://x)?\n\n# Gate passed | max |A - B|"
    table = AnswerTable.from_dict({"question": question, "rows": "kernel", "columns": "length", "value": "{verdict}"})
    head = answer_markdown(table, [_record("k", "equivalent", "rounding", length=16)]).splitlines()[0]
    assert head == "**Is &lt;b&gt;it&lt;/b&gt; \\[safe\\](http://x)? # Gate passed \\| max \\|A - B\\|**"
    assert terminal_text(head) == "**Is <b>it</b> [safe](http://x)? # Gate passed | max |A - B|**"


@pytest.mark.parametrize("data, match", [
    ({"rows": "kernel", "columns": "eps", "value": "{verdict}"}, "no 'question'"),
    ({"question": "q", "rows": [], "columns": "eps", "value": "{verdict}"}, "rows=\\[\\]"),
    ({"question": "q", "rows": "kernel", "columns": ["eps"], "value": "{verdict}"}, "columns=\\['eps'\\]"),
    ({"question": "q", "rows": "kernel", "columns": "eps", "value": "no field"}, "value='no field'"),
    ({"question": "q", "rows": "kernel", "columns": "eps", "value": "{v}", "colour": 1}, "unknown keys"),
    ({"question": "q", "rows": "kernel", "columns": "eps", "value": "{verdict"}, "is not a format string"),
    ({"question": "q", "rows": 5, "columns": "eps", "value": "{verdict}"}, "rows=5 must be"),  # a traceback before
    ({"question": "q", "rows": True, "columns": "eps", "value": "{verdict}"}, "rows=True must be"),
    ({"question": "q", "rows": {"a": "kernel"}, "columns": "eps", "value": "{verdict}"}, "rows=\\{'a'"),
])
def test_bad_answer_declarations_name_the_key(data, match):
    with pytest.raises(InvalidArgument, match=match):
        AnswerTable.from_dict(data, "sweep x.toml: answer 0")


def test_a_kernel_s_nan_or_inf_is_said_beside_the_worst_cond():
    """A float16 SSD loop returned inf at 147 elements where the oracle is 0.51; its line read "worst cond 0.188"
    (the finite elements') and another kernel's "worst cond -" (blind hunt 26a)."""
    records = [_record("k.a", "divergent", "precision_loss", cond_max=0.188, n_kernel_nonfinite_in_domain=147,
                       onset_t=240),
               _record("k.a", "divergent", "precision_loss", cond_max=1.5, n_kernel_nonfinite_in_domain=0, onset_t=3),
               _record("k.b", "divergent", "kernel_bug", cond_max=float("nan"), n_kernel_nonfinite_in_domain=4,
                       onset_t=1)]
    lines = [f.line() for f in findings(records)]
    assert "worst cond 1.5 (float32 L=64 trained); NaN/Inf where the oracle is finite in 1 case;" in lines[1], lines
    assert "worst cond - (float32 L=64 trained); NaN/Inf where the oracle is finite in 1 case;" in lines[0], lines
    assert "NaN/Inf" not in findings([_record("k.c", "divergent", "kernel_bug", cond_max=3.0)])[0].line()
