"""Smoke test of harness.bench in --quick mode (tiny L): the tables have the expected rows and ratios."""

from __future__ import annotations

import pytest

from harness import bench


def test_quick_bench_tables(tmp_path):
    groups = bench.run(tmp_path, lengths=[32], suite_lengths=[32], reps=1, mem=False,
                       step_length=32, step_batches=(1, 2))
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
    assert [r["function"] for r in groups["suite"]] == [
        "intree.blelloch_scan", "intree.blelloch_selective_scan",
        "intree.retention_chunkwise", "intree.retention_normed_parallel"]
    for r in groups["suite"]:
        assert r["cases_per_s"] > 0 and 0 <= r["harness_share"] <= 1
    assert all(r["us_per_step"] > 0 for r in groups["oracle_step"])
    md = (tmp_path / "bench.md").read_text()
    assert "oracle.selective_scan" in md and "speedup_vs_oracle" in md
    assert (tmp_path / "bench.csv").exists()


def test_peak_memory_in_fresh_process():
    mib = bench.peak_mib("oracle.selective_scan", 32)
    assert isinstance(mib, float) and mib >= 0
