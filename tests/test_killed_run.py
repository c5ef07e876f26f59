"""A run killed where nothing could mark it (SIGKILL, the out-of-memory killer) is a partial run.

Its header was written at the start exactly as a finished run's, so a gate passed it with its untaken cases
"missing" and `update-baseline` made it a baseline (a blind hunt, session 27). The header now says partial
from the start until the run records its end (`RunStore.finish`).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from harness.errors import InvalidArgument
from harness.gate import gate, update_baseline
from harness.store import NO_END_STATUS, RunStore, load_header

pytestmark = pytest.mark.e2e  # end to end: `make test-all`


def _record(kernel: str, length: int, cond: float = 0.1) -> dict:
    return {"kernel": kernel, "family": "linear_scan", "dtype": "float32", "length": length, "regime": "trained",
            "verdict": "equivalent", "cause": "rounding", "cond_max": cond, "case": f"c{length}", "seed": 0}


def _run(path, records, *, end: bool) -> None:
    store = RunStore(path, header={"profile": "ci"})
    for record in records:
        store.append(record)
    if end:
        store.finish()
    store.close()


def test_a_run_that_records_its_end_is_complete_and_one_that_does_not_is_partial(tmp_path):
    records = [_record("k", n) for n in (8, 64, 512)]
    _run(tmp_path / "whole", records, end=True)
    _run(tmp_path / "killed", records[:1], end=False)
    assert not load_header(tmp_path / "whole").get("partial")
    header = load_header(tmp_path / "killed")
    assert header["partial"] and header["status"] == NO_END_STATUS and header["profile"] == "ci"
    with RunStore(tmp_path / "ctx", header={"profile": "ci"}) as store:  # a with block that ends records it
        store.append(records[0])
    assert not load_header(tmp_path / "ctx").get("partial")
    update_baseline(tmp_path / "whole", tmp_path / "baseline")
    result = gate(tmp_path / "baseline", tmp_path / "killed")
    assert not result.passed and any("recorded no end" in f for f in result.failures), result.failures
    assert gate(tmp_path / "baseline", tmp_path / "whole").passed
    with pytest.raises(InvalidArgument, match="is a partial run"):
        update_baseline(tmp_path / "killed", tmp_path / "baseline2")


def test_a_sweep_killed_by_sigkill_leaves_a_partial_run(tmp_path):
    """The real thing: `harness sweep` killed mid-run with SIGKILL; its header says partial."""
    run = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "harness", "sweep", "retnet_seed", "--report-dir", str(run)],
                            cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and not any(p.stat().st_size for p in run.glob("records*.jsonl")):
            time.sleep(0.2)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert (run / "run.json").is_file()
    assert load_header(run).get("partial") and load_header(run)["status"] == NO_END_STATUS
