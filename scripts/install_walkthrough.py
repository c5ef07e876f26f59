"""A new kernel repository's first day with the harness, from `pip install` to a failing and a passing gate.

Builds the wheel from a copy of this checkout's sources (so the build writes nothing here), installs
it into a fresh virtual environment outside the checkout (``--system-site-packages``: torch and the
other dependencies come from the system, the wheel goes in with ``--no-deps``), and in a new project
with a small kernel package runs what docs/ci-workflow.md asks of a user:

    harness init --kernel mykernels/scan.py:scan --family linear_scan
    harness check --report-dir .harness/runs/main            # the correct kernel: exit 0
    harness update-baseline .harness/runs/main               # the first baseline (committed)
    (a bug is planted in mykernels/scan.py)
    harness check --report-dir .harness/runs/bug             # exit 1, the shrunk counterexample saved
    harness gate .harness/runs/bug                           # exit 1: the gate fails
    (the bug is fixed)
    harness check --report-dir .harness/runs/fix             # exit 0
    harness gate .harness/runs/fix                           # exit 0: the gate passes
    harness sweep --list; harness sweep default [--shard]    # the built-in sweeps, from the wheel
    python -m pytest tests                                   # the pytest route (harness_check fixture)

Every step is timed; the files each created in the project are listed; the checkout and the virtual
environment's site-packages are fingerprinted before and after, so a write outside the project shows.
`tests/test_install.py` runs it (``make test-install``); run it directly for the table::

    python scripts/install_walkthrough.py [--workdir DIR] [--max-examples N] [--shard K/N]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: What the wheel is built from (the packages and the files pyproject.toml reads).
SOURCES = ("harness", "reference_impls", "pyproject.toml", "README.md")
#: Folders of the checkout whose files must be the same after the walkthrough.
CHECKOUT_WATCHED = ("harness", "reference_impls", "cases", "reports/baseline", "scripts", "tests", "docs")

KERNEL = '''"""A user's linear-scan kernel: h[t] = a[t] * h[t-1] + b[t] along the last axis."""
import torch


def scan(a, b):
    h = torch.zeros_like(b[..., 0])
    out = []
    for t in range(b.shape[-1]):
        h = a[..., t] * h + b[..., t]
        out.append(h)
    return torch.stack(out, -1)
'''
CORRECT_LINE = "        h = a[..., t] * h + b[..., t]\n"
BUGGY_LINE = "        h = a[..., t] * h + (b[..., t] if t < 40 else 0.5 * b[..., t])  # planted: halves b from t=40\n"

USER_TEST = '''from mykernels.scan import scan


def test_scan_matches_the_oracle(harness_check):
    harness_check(scan, family="linear_scan", max_examples=MAX_EXAMPLES)
'''


@dataclass
class Step:
    name: str
    command: list[str]
    expect: int | tuple[int, ...]  # the exit status expected (or those allowed)
    rc: int = -1
    seconds: float = 0.0
    output: str = ""
    created: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.rc in (self.expect if isinstance(self.expect, tuple) else (self.expect,))


@dataclass
class Walkthrough:
    workdir: Path
    steps: list[Step] = field(default_factory=list)
    outside_writes: list[str] = field(default_factory=list)
    harness_file: str = ""

    @property
    def ok(self) -> bool:
        return all(s.ok for s in self.steps) and not self.outside_writes

    def markdown(self) -> str:
        lines = ["| step | command | exit (expected) | seconds | files created in the project |",
                 "|---|---|---|---|---|"]
        for s in self.steps:
            shown = " ".join(Path(c).name if i == 0 else c for i, c in enumerate(s.command))
            runs: dict[str, int] = {}
            for f in s.created:  # a run directory is one entry with its file count
                if f.startswith(".harness/runs/"):
                    folder = "/".join(f.split("/")[:3]) + "/"
                    runs[folder] = runs.get(folder, 0) + 1
            created = ", ".join([f for f in s.created if not f.startswith(".harness/runs/")]
                                + [f"{d} ({n} files)" for d, n in runs.items()])
            expect = "/".join(map(str, s.expect)) if isinstance(s.expect, tuple) else s.expect
            lines.append(f"| {s.name} | `{shown}` | {s.rc} ({expect}) | {s.seconds:.1f} | {created or '-'} |")
        lines.append("")
        lines.append(f"harness imported from: {self.harness_file}")
        lines.append(f"writes outside the project: {self.outside_writes or 'none'}")
        return "\n".join(lines)


def fingerprint(folder: Path, skip: tuple[str, ...] = ("__pycache__",)) -> dict[str, tuple[int, int]]:
    """path -> (size, mtime in ns) of every file under ``folder`` (``skip``: folder names left out)."""
    out: dict[str, tuple[int, int]] = {}
    if not folder.exists():
        return out
    for dirpath, dirnames, filenames in os.walk(folder):
        dirnames[:] = [d for d in dirnames if d not in skip]
        for name in filenames:
            path = Path(dirpath) / name
            try:
                st = path.lstat()
            except OSError:
                continue
            out[str(path)] = (st.st_size, st.st_mtime_ns)
    return out


def _changed(before: dict, after: dict) -> list[str]:
    return sorted(p for p in set(before) | set(after) if before.get(p) != after.get(p))


def _env() -> dict[str, str]:
    """The environment of the user's commands: no PYTHONPATH (nothing of the checkout on the path)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "HARNESS_CASES_DIR", "GITHUB_STEP_SUMMARY")}
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def _run(step: Step, cwd: Path, project: Path | None, timeout: float) -> Step:
    before = fingerprint(project, skip=("__pycache__", ".hypothesis")) if project else {}
    t0 = time.perf_counter()
    proc = subprocess.run(step.command, cwd=cwd, env=_env(), capture_output=True, text=True, timeout=timeout)
    step.seconds = time.perf_counter() - t0
    step.rc, step.output = proc.returncode, proc.stdout + proc.stderr
    if project:
        after = fingerprint(project, skip=("__pycache__", ".hypothesis"))
        step.created = sorted(os.path.relpath(p, project) for p in set(after) - set(before))
    return step


def walkthrough(workdir: Path, *, max_examples: int = 10, shard: str | None = "1/8",
                timeout: float = 900.0) -> Walkthrough:
    """Run every step in ``workdir`` (created; must be outside the checkout); see the module docstring."""
    workdir = Path(workdir).resolve()
    if workdir == ROOT or ROOT in workdir.parents:
        raise ValueError(f"workdir={str(workdir)!r} lies inside the checkout {ROOT}; choose a folder outside it")
    workdir.mkdir(parents=True, exist_ok=True)
    result = Walkthrough(workdir)
    src, dist, venv, project = (workdir / n for n in ("src", "dist", "venv", "project"))
    checkout_before = {k: v for f in CHECKOUT_WATCHED for k, v in fingerprint(ROOT / f).items()}
    checkout_top = sorted(p.name for p in ROOT.iterdir())

    src.mkdir()
    for name in SOURCES:
        (shutil.copytree if (ROOT / name).is_dir() else shutil.copy2)(
            ROOT / name, src / name, **({"ignore": shutil.ignore_patterns("__pycache__")}
                                        if (ROOT / name).is_dir() else {}))
    py = sys.executable
    steps = [Step("build the wheel", [py, "-m", "pip", "wheel", str(src), "--no-deps", "--no-build-isolation",
                                      "-q", "-w", str(dist)], 0),
             Step("make a virtual environment", [py, "-m", "venv", "--system-site-packages", str(venv)], 0)]
    for step in steps:
        result.steps.append(_run(step, workdir, None, timeout))
        if not step.ok:
            return result
    wheel = next(dist.glob("*.whl"))
    vpy, harness = str(venv / "bin" / "python"), str(venv / "bin" / "harness")
    step = _run(Step("pip install the wheel", [vpy, "-m", "pip", "install", "--no-deps", "--force-reinstall", "-q",
                                               str(wheel)], 0), workdir, None, timeout)
    result.steps.append(step)
    if not step.ok:
        return result
    site = Path(subprocess.run([vpy, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, env=_env(), check=True).stdout.strip())
    result.harness_file = subprocess.run([vpy, "-c", "import harness; print(harness.__file__)"], cwd=workdir,
                                         capture_output=True, text=True, env=_env()).stdout.strip()
    site_before = fingerprint(site)

    (project / "mykernels").mkdir(parents=True)
    (project / "mykernels" / "__init__.py").write_text("")
    (project / "mykernels" / "scan.py").write_text(KERNEL)
    (project / "tests").mkdir()
    (project / "tests" / "test_scan.py").write_text(USER_TEST.replace("MAX_EXAMPLES", str(max_examples)))
    (project / "pyproject.toml").write_text('[project]\nname = "mykernels"\nversion = "0.0.1"\n')
    check = ["--max-examples", str(max_examples)]
    scan_py = project / "mykernels" / "scan.py"
    plan: list[tuple[Step, object]] = [
        (Step("harness init", [harness, "init", "--kernel", "mykernels/scan.py:scan", "--family", "linear_scan"], 0),
         None),
        (Step("check the correct kernel", [harness, "check", "--report-dir", ".harness/runs/main", *check], 0), None),
        (Step("make the first baseline", [harness, "update-baseline", ".harness/runs/main"], 0), None),
        (Step("check with a planted bug", [harness, "check", "--report-dir", ".harness/runs/bug", *check], 1),
         lambda: scan_py.write_text(KERNEL.replace(CORRECT_LINE, BUGGY_LINE))),
        (Step("gate the bug (fails)", [harness, "gate", ".harness/runs/bug"], 1), None),
        (Step("check the fixed kernel", [harness, "check", "--report-dir", ".harness/runs/fix", *check], 0),
         lambda: scan_py.write_text(KERNEL)),
        (Step("gate the fix (passes)", [harness, "gate", ".harness/runs/fix"], 0), None),
        (Step("list the sweeps", [harness, "sweep", "--list"], 0), None),
        # exit 1 is a finding of the sweep (the whole default sweep has torchscale's eps-effect cases), as
        # `make report` reads it; 2 or a crash is a failure
        (Step("harness sweep default", [harness, "sweep", "default", "--quiet", "--report-dir", ".harness/runs/sweep",
                                        *(["--shard", shard] if shard else [])], (0, 1)), None),
        (Step("pytest route: correct kernel", [vpy, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"], 0), None),
        (Step("pytest route: planted bug", [vpy, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"], 1),
         lambda: scan_py.write_text(KERNEL.replace(CORRECT_LINE, BUGGY_LINE))),
    ]
    for step, before in plan:
        if callable(before):
            before()
        result.steps.append(_run(step, project, project, timeout))
    scan_py.write_text(KERNEL)

    changed_site = _changed(site_before, fingerprint(site))
    changed_checkout = _changed(checkout_before, {k: v for f in CHECKOUT_WATCHED for k, v in fingerprint(ROOT / f).items()})
    new_top = sorted(set(p.name for p in ROOT.iterdir()) - set(checkout_top))
    beside = sorted(p.name for p in workdir.iterdir() if p.name not in ("src", "dist", "venv", "project"))
    result.outside_writes = changed_site + changed_checkout + [str(ROOT / n) for n in new_top] + [
        str(workdir / n) for n in beside]
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", default=None, help="an empty folder outside the checkout (default: a new temp one)")
    parser.add_argument("--max-examples", type=int, default=10)
    parser.add_argument("--shard", default=None, help="run only shard K/N of the default sweep (default: all of it)")
    args = parser.parse_args(argv)
    workdir = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="harness-walkthrough-"))
    result = walkthrough(workdir, max_examples=args.max_examples, shard=args.shard)
    print(result.markdown())
    for step in result.steps:
        if not step.ok:
            print(f"\n--- {step.name}: exit {step.rc}, expected {step.expect}\n{step.output[-6000:]}")
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
