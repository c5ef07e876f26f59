"""The harness installed from its wheel, in a new project outside this checkout (`make test-install`).

`scripts/install_walkthrough.py` builds the wheel from a copy of the sources, installs it into a fresh
``--system-site-packages`` virtual environment with ``--no-deps``, and in a temporary project with a
small kernel package runs `harness init`, `harness check` (correct kernel, planted bug, fixed), the
first baseline, `harness gate` (failing, then passing), `harness sweep --list`, `harness sweep default`
(one shard: the built-in sweep comes from the wheel's package data) and the pytest route (the
``harness_check`` fixture, correct and planted). Nothing may be written outside the project: the
checkout and the environment's site-packages are fingerprinted before and after. Minutes: ``slow``.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.slow


def _walkthrough_module():
    spec = importlib.util.spec_from_file_location("install_walkthrough", ROOT / "scripts" / "install_walkthrough.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return module


def test_a_new_project_from_pip_install_to_a_failing_then_passing_gate(tmp_path):
    module = _walkthrough_module()
    result = module.walkthrough(tmp_path / "walk", max_examples=10, shard="1/8")
    print("\n" + result.markdown())
    steps = {s.name: s for s in result.steps}
    failed = [f"{s.name}: exit {s.rc}, expected {s.expect}\n{s.output[-6000:]}" for s in result.steps if not s.ok]
    assert not failed, "\n\n".join(failed)
    assert len(result.steps) == 14
    # the installed package, not this checkout (nor the editable install that points at it)
    assert result.harness_file.startswith(str(tmp_path / "walk" / "venv"))
    assert result.outside_writes == []
    project = tmp_path / "walk" / "project"
    table = (project / "pyproject.toml").read_text()
    assert "[tool.harness]" in table and 'target = "mykernels/scan.py:scan"' in table
    assert (project / ".github" / "workflows" / "harness.yml").is_file()
    assert (project / "numerics" / "baseline" / "records.jsonl").is_file()
    saved = sorted(p.name for p in (project / "numerics" / "counterexamples").glob("*.json"))
    # `harness check`: one per dtype its search failed in (the bug halves b from t=40: every dtype); the pytest
    # route: one (its fixture's single search)
    assert len(saved) >= 2, saved
    assert all(name.split("--")[2] in ("float64", "float32", "float16", "bfloat16") for name in saved), saved
    assert "Gate FAILED" in steps["gate the bug (fails)"].output
    assert "Gate passed" in steps["gate the fix (passes)"].output
    assert steps["harness sweep default"].rc in (0, 1)  # 1: a finding of the sweep, as `make report` reads it
    assert "built-in" in steps["list the sweeps"].output and "site-packages" in steps["list the sweeps"].output
    header = json.loads((project / ".harness" / "runs" / "sweep" / "run.json").read_text())
    assert header["profile"] == "sweep:default" and header["shard"]
    assert "DivergenceError" in steps["pytest route: planted bug"].output
