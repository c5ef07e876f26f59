"""Smoke test of harness.bench in --quick mode (tiny L): the tables have the expected rows and ratios,
and the peak-memory probe sees a call's own allocations."""

from __future__ import annotations

import sys

import pytest
import torch

from harness import bench


def test_quick_bench_tables(tmp_path):
    groups = bench.run(tmp_path, lengths=[32], case_lengths=[32], reps=1, mem=False,
                       step_length=32, step_batches=(1, 2), jit=False)
    sel = groups["selective_scan"]
    assert [r["function"] for r in sel] == list(bench.SEL_FNS)
    ret = groups["retention"]
    assert [r["function"] for r in ret] == list(bench.RET_FNS)
    normed = groups["retention_normed"]
    assert [r["function"] for r in normed] == list(bench.NORMED_FNS)
    gated = groups["simple_gla"] + groups["gla"] + groups["ssd"]
    assert [r["function"] for r in gated] == list(bench.SIMPLE_GLA_FNS + bench.GLA_FNS + bench.SSD_FNS)
    for r in gated:  # the peers compute the oracle's outputs (fla's in float32)
        if r["time_s"] is not None and r["vs_oracle"] != "(reference)":
            diff = 0.0 if r["vs_oracle"] == "bit-identical" else float(r["vs_oracle"].removeprefix("max|diff|="))
            assert diff < (1e-4 if r["function"].startswith("fla.") else 1e-12), r
    for r in sel + ret + normed + gated:
        if r["time_s"] is None:  # an unavailable peer is listed with its reason
            assert str(r["vs_oracle"]).startswith("skipped")
            continue
        assert r["speedup_vs_oracle"] > 0
    assert sel[0]["speedup_vs_oracle"] == 1.0 and ret[0]["vs_oracle"] == "(reference)"
    summary = groups["summary"]
    assert [(r["family"], r["L"]) for r in summary] == [
        ("selective_scan", 32), ("retention", 32), ("retention_normed", 32), ("simple_gla", 32), ("gla", 32), ("ssd", 32)]
    for r in summary:
        if r["peer_s"] is not None:
            assert r["oracle_x_faster"] == pytest.approx(r["peer_s"] / r["oracle_s"], rel=0.01, abs=0.01)
        assert r[f"target_{bench.TARGET_RATIO:g}x"] == "-"  # the target applies at L >= 8192 only
    tech = groups["technique"]
    assert [r["technique"] for r in tech] == list(bench.TECHNIQUES) * 2
    for r in tech:  # every loop implementation gives the torch loop's bits (or says why it did not run)
        assert r["vs_torch_loop"] in ("(reference)", "bit-identical") or r["vs_torch_loop"].startswith("skipped")
    assert [r["function"] for r in groups["cases"]] == [name for name, _ in bench.CASE_KERNELS]
    for r in groups["cases"]:
        parts = ("inputs", "oracle", "kernel", "baseline", "measure", "records")
        assert sum(r[f"{p}_share"] for p in parts) == pytest.approx(1.0, abs=0.01)
        assert 0 <= r["harness_share"] <= 1 and r["harness_ms_per_case"] >= 0 and r["verdicts"] == "equivalent"
    assert "make_test" not in groups  # the test-suite runs are opt-in (minutes)
    assert all(r["us_per_step"] > 0 for r in groups["oracle_step"])
    md = (tmp_path / "bench.md").read_text()
    assert "oracle.selective_scan" in md and "speedup_vs_oracle" in md and "oracle_x_faster" in md
    assert (tmp_path / "bench.csv").exists()


@pytest.mark.e2e
def test_peak_memory_in_fresh_process(monkeypatch):
    """The selective-scan oracle's peak is its output plus bounded blocks, measured in a fresh process;
    a probe that read nothing (0), or the input builder's peak, would fail the lower or the upper end.
    One fresh process: `peak_mib` is the number of the record `peak_record` returns."""
    rec = bench.peak_record("oracle.selective_scan", 4096)
    mib, out_mib = rec.get("mib"), rec.get("out_mib")
    assert isinstance(mib, float) and out_mib > 1, rec
    assert 0.9 * out_mib <= mib < out_mib + 64, (mib, out_mib)
    monkeypatch.setattr(bench, "peak_record", lambda name, length, timeout=600: rec)
    assert bench.peak_mib("oracle.selective_scan", 4096) == mib


def test_peak_memory_failure_is_a_reason_not_a_number():
    assert bench.peak_mib("no.such_kernel", 32).startswith("n/a")


@pytest.mark.e2e
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="VmHWM and clear_refs are Linux's")
def test_peak_memory_sees_the_call_not_the_input_builder():
    """Building the inputs peaks higher than the retention oracle's call; the probe still sees the call
    (it read 0 when it measured the growth of ru_maxrss)."""
    rec = bench.peak_record("oracle.retention", 4096)
    assert rec.get("method") == "VmHWM", rec
    assert rec["out_mib"] == pytest.approx(4096 * 4 * 64 * 8 / 2**20)
    assert rec["out_mib"] * 0.9 <= rec["mib"] < rec["out_mib"] + 64, rec  # the output, plus bounded blocks


def test_peers_that_do_not_fit_are_skipped(monkeypatch):
    monkeypatch.setattr(bench, "_available_bytes", lambda: 3 * 2**30)
    assert bench.fits("fla.naive_retention", 1024) == ""
    assert bench.fits("fla.naive_retention", 65536).startswith("skipped: needs ~")
    assert bench.fits("oracle.retention", 10**7) == ""  # no estimate: always runs


def test_shares_split_a_cases_time_into_its_parts():
    # two cases of 10 ms each: 1 ms inputs, 2 oracle, 4 kernel, 1 baseline, 1 measure; 1 ms unaccounted
    recs = [dict(t_inputs=0.001, t_oracle=0.002, t_kernel=0.004, t_baseline=0.001, t_measure=0.001)] * 2
    row = bench._shares(recs, 0.020)
    assert row["kernel_share"] == 0.4 and row["records_share"] == 0.1
    assert row["harness_share"] == 0.2 and row["harness_ms_per_case"] == 2.0  # measure + the rest


def test_records_carry_the_cases_own_time():
    from harness.kernels.registry import get
    from harness.problems import Problem
    from harness.runner import run_case

    rec = run_case(get("intree.blelloch_scan"), Problem(family="linear_scan", length=64))
    parts = sum(rec[k] for k in ("t_inputs", "t_oracle", "t_kernel", "t_baseline", "t_measure"))
    assert parts - 1e-5 <= rec["t_case"] < parts + 1.0  # (each timing is rounded to a microsecond)


def test_mamba_ssm_peer_says_how_to_build_it(monkeypatch, tmp_path):
    monkeypatch.setenv("BENCH_PEERS", str(tmp_path))
    with pytest.raises(RuntimeError, match="make bench-peers"):
        bench.load_fn("mamba_ssm.selective_scan_ref")


@pytest.mark.skipif(not (bench.Path(".bench-peers") / "mamba_ssm").is_dir(), reason="`make bench-peers` not run")
def test_mamba_ssm_peer_runs_and_leaves_no_module_behind():
    fn = bench.load_fn("mamba_ssm.selective_scan_ref")
    assert not [m for m in sys.modules if m.startswith("mamba_ssm") or m == "selective_scan_cuda"]
    args = bench.sel_inputs(32)
    from reference_impls.selective_scan import selective_scan

    out = fn(*args)  # float32 inside: agrees with the float64 oracle to float32's rounding
    assert out.dtype == args[0].dtype and (out - selective_scan(*args)).abs().max() < 1e-4


def test_thread_scaling_measures_every_contender_idle_and_busy(monkeypatch):
    """Each (family, threads, load) cell times the oracle and its peer under the same load; the busy cells
    run while a spinning process holds a core, and the thread setting is restored afterwards."""
    seen_busy = []
    real_busy = bench.busy_core

    @__import__("contextlib").contextmanager
    def spying_busy(core=0):
        with real_busy(core):
            seen_busy.append(core)
            yield

    monkeypatch.setattr(bench, "busy_core", spying_busy)
    before = torch.get_num_threads()
    rows = bench.thread_scaling(64, 1)
    assert torch.get_num_threads() == before
    ran = [r for r in rows if r["threads"] is not None]
    assert {r["family"] for r in ran} >= {"selective_scan", "retention"}
    assert {r["load"] for r in ran} == {"idle", "busy"} and seen_busy
    for r in ran:
        assert r["oracle_s"] > 0 and r["peer_s"] > 0
        assert r["oracle_x_faster"] == pytest.approx(r["peer_s"] / r["oracle_s"], rel=0.01, abs=0.01)
