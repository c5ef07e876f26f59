"""Where the caller's state lives: the project the harness is run from, and its ``[tool.harness]`` table.

Installed in a kernel author's environment, the harness writes nothing into its own package. Every path
it reads or writes by default belongs to the caller's project: the nearest directory, from the working
directory up, that holds a ``pyproject.toml`` (else the working directory itself). Without a
``[tool.harness]`` table, state goes under ``<project>/.harness/`` (as hypothesis keeps ``.hypothesis/``
and pytest-benchmark ``.benchmarks/``)::

    .harness/runs/<name>-<stamp>/     reports of `harness check` and `harness sweep`
    .harness/counterexamples/         shrunk failing cases, replayed by `harness replay`
    .harness/baseline/                the gate's baseline (`harness update-baseline`)

A ``[tool.harness]`` table moves any of these and says what to check (this repository's own
``pyproject.toml`` uses it for ``reports/`` and ``cases/``)::

    [tool.harness]
    runs = "reports"                       # run directories go here
    counterexamples = "cases/counterexamples"
    baseline = "reports/baseline"
    sweeps = ["numerics/sweeps"]           # the project's sweeps, searched before the built-in ones
    profile = "ci"                         # dev | ci | nightly
    policy = "cond=1,baseline=2"           # `harness.verdict.Policy.parse`
    timeout = 60                           # seconds per kernel call
    [[tool.harness.kernels]]               # what `harness check` with no --kernel checks
    target = "my_kernels/scan.py:chunked_scan"
    family = "linear_scan"

Relative paths are taken from the project's root. Command-line flags override the table; an unknown
key or a value of the wrong type is an `InvalidArgument` naming the key, the value and what is expected.
The built-in sweeps (``default``, ``gpu``, ``mamba_seed``, ``retnet_seed``) ship inside the package
(`BUILTIN_SWEEPS`); a project sweep of the same name comes first.
"""

from __future__ import annotations

import itertools
import json
import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.errors import InvalidArgument

#: The folder for the caller's state when ``[tool.harness]`` does not say otherwise.
STATE_DIR = ".harness"
#: The sweeps shipped with the harness (package data), searched after the project's own.
BUILTIN_SWEEPS = Path(__file__).resolve().parent / "sweeps"

_PATH_KEYS = ("runs", "counterexamples", "baseline")
_KNOWN = {"runs": str, "counterexamples": str, "baseline": str, "sweeps": list, "profile": str, "policy": str,
          "timeout": (int, float), "kernels": list}
_PROFILES = ("dev", "ci", "nightly")


@dataclass(frozen=True)
class KernelEntry:
    """A kernel to check: a registered name or a ``module:attr`` / ``file.py:attr`` target, and its family."""

    target: str
    family: str | None = None


@dataclass(frozen=True)
class Project:
    """The caller's project: its root, where its state goes, and the defaults of its ``[tool.harness]``."""

    root: Path
    runs_dir: Path
    counterexamples_dir: Path
    baseline_dir: Path
    sweep_dirs: tuple[Path, ...]
    profile: str | None = None
    policy: str | None = None
    timeout: float | None = None
    kernels: tuple[KernelEntry, ...] = ()
    configured: bool = False  # True when a [tool.harness] table was read
    pyproject: Path | None = field(default=None, compare=False)


def find_root(start: str | os.PathLike | None = None) -> Path:
    """The nearest directory from ``start`` (default: the working directory) up that holds a
    ``pyproject.toml``; ``start`` itself when none does."""
    here = Path(start or os.getcwd()).resolve()
    for folder in (here, *here.parents):
        if (folder / "pyproject.toml").is_file():
            return folder
    return here


def _table(pyproject: Path) -> dict[str, Any] | None:
    try:
        data = tomllib.loads(pyproject.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise InvalidArgument(f"{pyproject} cannot be read as TOML: {exc}") from None
    tool = data.get("tool", {})
    if not isinstance(tool, dict):
        raise InvalidArgument(f"{pyproject}: [tool] must be a table, got {type(tool).__name__}")
    table = tool.get("harness")
    if table is not None and not isinstance(table, dict):
        raise InvalidArgument(f"{pyproject}: [tool.harness] must be a table, got {type(table).__name__}")
    return table


def _validated(table: dict[str, Any], where: Path) -> dict[str, Any]:
    for key, value in table.items():
        if key not in _KNOWN:
            raise InvalidArgument(f"{where}: [tool.harness] has an unknown key {key!r}; expected one of "
                                  f"{sorted(_KNOWN)}")
        if not isinstance(value, _KNOWN[key]) or isinstance(value, bool):
            expected = _KNOWN[key].__name__ if isinstance(_KNOWN[key], type) else "a number"
            raise InvalidArgument(f"{where}: [tool.harness] {key}={value!r} must be {expected}")
    if "profile" in table and table["profile"] not in _PROFILES:
        raise InvalidArgument(f"{where}: [tool.harness] profile={table['profile']!r}; expected one of "
                              f"{list(_PROFILES)}")
    if "timeout" in table:
        from harness.kernels.isolation import validate_timeout

        try:
            validate_timeout(table["timeout"])
        except InvalidArgument as exc:
            raise InvalidArgument(f"{where}: [tool.harness] {exc}") from None
    if not all(isinstance(s, str) for s in table.get("sweeps", [])):
        raise InvalidArgument(f"{where}: [tool.harness] sweeps={table['sweeps']!r} must be a list of folders")
    for i, entry in enumerate(table.get("kernels", [])):
        if not isinstance(entry, dict) or not isinstance(entry.get("target"), str):
            raise InvalidArgument(f"{where}: [[tool.harness.kernels]] entry {i} is {entry!r}; expected a table "
                                  f"with target = \"file.py:attr\" (or a registered name) and family = \"...\"")
        unknown = set(entry) - {"target", "family"}
        if unknown:
            raise InvalidArgument(f"{where}: [[tool.harness.kernels]] entry {i} has unknown keys {sorted(unknown)}; "
                                  f"expected target and family")
    return table


def load_project(start: str | os.PathLike | None = None) -> Project:
    """The project around ``start`` (default: the working directory) and its ``[tool.harness]`` settings."""
    root = find_root(start)
    pyproject = root / "pyproject.toml"
    table = _table(pyproject) if pyproject.is_file() else None
    settings = _validated(table, pyproject) if table else {}
    state = root / STATE_DIR
    defaults = {"runs": state / "runs", "counterexamples": state / "counterexamples", "baseline": state / "baseline"}
    paths = {k: (root / settings[k]) if k in settings else defaults[k] for k in _PATH_KEYS}
    sweeps = tuple(root / s for s in settings.get("sweeps", ())) + (BUILTIN_SWEEPS,)
    kernels = tuple(KernelEntry(e["target"], e.get("family")) for e in settings.get("kernels", ()))
    return Project(root=root, runs_dir=paths["runs"], counterexamples_dir=paths["counterexamples"],
                   baseline_dir=paths["baseline"], sweep_dirs=sweeps, profile=settings.get("profile"),
                   policy=settings.get("policy"), timeout=settings.get("timeout"), kernels=kernels,
                   configured=table is not None, pyproject=pyproject if pyproject.is_file() else None)


def current() -> Project:
    """The project of the working directory (what every command-line default is taken from)."""
    return load_project()


def run_dir(name: str, project: Project | None = None) -> Path:
    """A fresh, stamped run directory ``<runs>/<name>-<YYYYmmdd-HHMMSS>`` of ``project`` (default: current),
    made here and empty. Two runs started in the same second (``make -j``, two CI jobs on one runner) each
    get their own: the directory is made atomically (``os.mkdir``), and one already made takes a suffix
    (``-2``, ``-3``, ...); a name that was free when looked at could otherwise be taken by both."""
    import datetime as _dt

    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    runs = (project or current()).runs_dir
    runs.mkdir(parents=True, exist_ok=True)
    for n in itertools.count(1):
        path = runs / (f"{name}-{stamp}" if n == 1 else f"{name}-{stamp}-{n}")
        try:
            os.mkdir(path)
        except FileExistsError:
            continue
        return path


def kernel_target(entry: KernelEntry, project: Project, cwd: str | os.PathLike | None = None) -> str:
    """``entry.target`` as the working directory must spell it: a ``file.py:attr`` target of the table is
    relative to the project's root (a registered name or ``module:attr`` is returned as it is)."""
    path, sep, attr = entry.target.rpartition(":")
    if not sep or not path.endswith(".py") or Path(path).is_absolute():
        return entry.target
    here = Path(cwd or os.getcwd()).resolve()
    return f"{os.path.relpath(project.root / path, here)}:{attr}"


def init_table(kernels: list[KernelEntry] | None = None) -> str:
    """A ``[tool.harness]`` table for a new project (what `harness init` appends to its pyproject.toml)."""
    lines = ["[tool.harness]", "# Written by `harness init`; keys: harness.project. Commit the baseline and the",
             "# counterexamples; .harness/ holds the runs (ignore it).", 'runs = ".harness/runs"',
             'counterexamples = "numerics/counterexamples"', 'baseline = "numerics/baseline"', 'profile = "ci"']
    for entry in kernels or []:
        lines += ["", "[[tool.harness.kernels]]", f"target = {json.dumps(entry.target)}"]
        if entry.family:
            lines.append(f"family = {json.dumps(entry.family)}")
    return "\n".join(lines) + "\n"
