"""scripts/calibrate.py as a CI matrix: ``--shard K/N`` jobs draw every problem and run their share, and
``--from-records`` joins their records into the tables of the unsharded run."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
ARGS = ["--cases", "2", "--families", "linear_scan", "--dtypes", "float64,bfloat16", "--print", "--quiet"]


@pytest.fixture(scope="module")
def calibrate():
    sys.path.insert(0, str(ROOT / "scripts"))  # its sibling module docblock, as when run as a script
    try:
        spec = importlib.util.spec_from_file_location("calibrate_script", ROOT / "scripts" / "calibrate.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    return module


def _tables(text: str) -> str:
    return text.split("### Per dtype", 1)[1]  # past the command line and the time


def test_sharded_calibration_joins_to_the_unsharded_tables(calibrate, tmp_path, capsys):
    calibrate.main(ARGS + ["--records", str(tmp_path / "whole.jsonl")])
    whole = capsys.readouterr().out
    parts = []
    for k in (1, 2, 3):
        calibrate.main(ARGS + ["--shard", f"{k}/3", "--records", str(tmp_path / f"part{k}.jsonl")])
        capsys.readouterr()
        parts.append(tmp_path / f"part{k}.jsonl")
    sizes = [len(p.read_text().splitlines()) for p in parts]
    assert all(sizes) and sum(sizes) == len((tmp_path / "whole.jsonl").read_text().splitlines())
    calibrate.main(ARGS + ["--from-records", *map(str, parts)])
    joined = capsys.readouterr().out
    assert "joined from the jobs records" in joined and "false alarms" in joined
    assert _tables(joined) == _tables(whole)


def test_joining_refuses_overlapping_jobs_and_records_without_the_full_record(calibrate, tmp_path):
    part = tmp_path / "part.jsonl"
    calibrate.main(ARGS + ["--shard", "1/4", "--records", str(part)])
    with pytest.raises(SystemExit, match="overlap"):
        calibrate.load_rows([str(part), str(part)])
    old = tmp_path / "old.jsonl"
    old.write_text('{"kernel": "k", "case": "c", "position": 0}\n')
    with pytest.raises(SystemExit, match="no full record"):
        calibrate.load_rows([str(old)])
