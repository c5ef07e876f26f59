"""Smoke test of harness.bench in --quick mode (tiny L): the tables have the expected rows and ratios,
and the peak-memory probe sees a call's own allocations."""

from __future__ import annotations

import sys

import pytest

from harness import bench


def test_quick_bench_tables(tmp_path):
    groups = bench.run(tmp_path, lengths=[32], suite_lengths=[32], reps=1, mem=False,
                       step_length=32, step_batches=(1, 2), jit=False)
    sel = groups["selective_scan"]
    assert [r["function"] for r in sel] == list(bench.SEL_FNS)
    ret = groups["retention"]
    assert [r["function"] for r in ret] == list(bench.RET_FNS)
    for r in sel + ret:
        if r["time_s"] is None:  # an unavailable peer is listed with its reason
            assert str(r["vs_oracle"]).startswith("skipped")
            continue
        assert r["speedup_vs_oracle"] > 0
    assert sel[0]["speedup_vs_oracle"] == 1.0 and ret[0]["vs_oracle"] == "(reference)"
    summary = groups["summary"]
    assert [(r["family"], r["L"]) for r in summary] == [("selective_scan", 32), ("retention", 32)]
    for r in summary:
        if r["peer_s"] is not None:
            assert r["oracle_x_faster"] == pytest.approx(r["peer_s"] / r["oracle_s"], rel=0.01, abs=0.01)
        assert r[f"target_{bench.TARGET_RATIO:g}x"] == "-"  # the target applies at L >= 8192 only
    tech = groups["technique"]
    assert [r["technique"] for r in tech] == list(bench.TECHNIQUES) * 2
    for r in tech:  # every loop implementation gives the torch loop's bits (or says why it did not run)
        assert r["vs_torch_loop"] in ("(reference)", "bit-identical") or r["vs_torch_loop"].startswith("skipped")
    assert [r["function"] for r in groups["suite"]] == [
        "intree.blelloch_scan", "intree.blelloch_selective_scan",
        "intree.retention_chunkwise", "intree.retention_normed_parallel"]
    for r in groups["suite"]:
        assert r["cases_per_s"] > 0 and 0 <= r["harness_share"] <= 1 and r["harness_ms_per_case"] >= 0
    assert all(r["us_per_step"] > 0 for r in groups["oracle_step"])
    md = (tmp_path / "bench.md").read_text()
    assert "oracle.selective_scan" in md and "speedup_vs_oracle" in md and "oracle_x_faster" in md
    assert (tmp_path / "bench.csv").exists()


def test_peak_memory_in_fresh_process():
    mib = bench.peak_mib("oracle.selective_scan", 32)
    assert isinstance(mib, float) and mib >= 0


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
