"""What `harness init` writes into a kernel repository: the ``[tool.harness]`` table and the CI workflow.

The table goes into the project's ``pyproject.toml`` (created when missing); an existing
``[tool.harness]`` table (with its ``[[tool.harness.kernels]]``) is replaced only with ``force``. The
workflow (`workflow_yaml`, the one docs/ci-workflow.md describes) is made from the table just written:
it runs `harness check` on the table's kernels, gates the run against the table's baseline, writes the
job summary and uploads the report; its paths are the table's, so a change of the table needs
``harness init --force`` (or an edit of the workflow) to follow.

The workflow installs the harness the way it is installed where ``init`` runs (`installed_requirement`, from the
distribution's PEP 610 ``direct_url.json``): a git URL at its commit, a wheel or folder inside the project by
its path from the root (it reaches the runner through ``actions/checkout``), ``==VERSION`` from a package
index; a file elsewhere on this machine is written as its ``file://`` URL with a warning, since no runner can
reach it. ``init`` also adds the runs folder (regenerated, and large) to the root's ``.gitignore``
(`ignore_runs`); the counterexamples and the baseline are meant to be committed and are not ignored.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.errors import InvalidArgument
from harness.project import KernelEntry, Project, init_table, load_project

#: Where the workflow is written, relative to the project's root.
WORKFLOW_PATH = Path(".github") / "workflows" / "harness.yml"
#: The run directory the workflow's check writes and gates (relative to the root; under the runs folder).
CI_RUN_NAME = "ci"
#: The harness's distribution name (what pip installs and `importlib.metadata` finds).
DISTRIBUTION = "seqkernel-harness"

_TABLE_HEADER = re.compile(r"^\s*\[\[?\s*tool\.harness(\.[A-Za-z0-9_.-]+)?\s*\]\]?\s*(#.*)?$")
_ANY_HEADER = re.compile(r"^\s*\[")


def without_table(text: str) -> str:
    """``text`` (a pyproject.toml) without its ``[tool.harness]`` table and sub-tables."""
    out, inside = [], False
    for line in text.splitlines(keepends=True):
        if _ANY_HEADER.match(line):
            inside = bool(_TABLE_HEADER.match(line))
        if not inside:
            out.append(line)
    return "".join(out).rstrip() + ("\n" if out else "")


def write_table(root: Path, kernels: list[KernelEntry], *, force: bool = False) -> Path:
    """Add the table to ``root/pyproject.toml`` (created when missing); never clobber one without ``force``."""
    pyproject = root / "pyproject.toml"
    text = pyproject.read_text(encoding="utf-8") if pyproject.is_file() else ""
    project = load_project(root) if text else None  # a broken existing table is reported, not overwritten
    if project is not None and project.configured:
        if not force:
            raise InvalidArgument(f"{pyproject} already has a [tool.harness] table; edit it, or pass --force to "
                                  "replace it (and the workflow) with a new one")
        text = without_table(text)
    body = text.rstrip() + "\n\n" if text.strip() else ""
    new = body + init_table(kernels)
    _refuse_unless_one_table(pyproject, new)  # checked before writing: the user's file is never left broken
    if pyproject.is_file() and b"\r\n" in pyproject.read_bytes():  # the file's own line endings kept
        new = new.replace("\r\n", "\n").replace("\n", "\r\n")
    pyproject.write_bytes(new.encode("utf-8"))
    load_project(root)  # what was written reads back (a target with odd characters is quoted by init_table)
    return pyproject


def _refuse_unless_one_table(pyproject: Path, new: str) -> None:
    """`InvalidArgument`, before anything is written, when ``new`` (the file init would write) is not TOML or
    holds another ``tool.harness`` beside the one init writes: a table written inline (``harness = {...}``
    under ``[tool]``) or as dotted keys (``tool.harness.runs = ...``) is not a ``[tool.harness]`` section,
    `without_table` leaves it, and ``init --force`` wrote a file declaring the table twice, which pip and
    every TOML reader then refuse (a blind hunt, session 27)."""
    import tomllib

    try:
        tomllib.loads(new)
    except tomllib.TOMLDecodeError as exc:
        raise InvalidArgument(f"{pyproject}: its [tool.harness] table is not written as a [tool.harness] section "
                              f"(inline, `harness = {{...}}` under [tool], or dotted keys, `tool.harness.KEY = ...`), "
                              f"which init cannot replace: the file it would write is not TOML ({exc}); nothing "
                              "was written. Remove that table by hand and rerun `harness init`") from None


def _relative(path: Path, root: Path) -> str:
    return Path(os.path.relpath(path, root)).as_posix()


# ---------------------------------------------------------------------------------- the workflow's HARNESS
@dataclass(frozen=True)
class Requirement:
    """How the workflow installs the harness (its ``HARNESS``), where that was read from, and a warning where a CI
    runner cannot install it."""

    text: str
    source: str
    warning: str | None = None


def installed_requirement(root: Path, explicit: str | None = None) -> Requirement:
    """The requirement that installs, on a CI runner with ``root`` checked out, the harness installed here.

    ``explicit`` (``--requirement``) always wins. Otherwise the installed distribution's origin (PEP 610
    ``direct_url.json``, `requirement_from_direct_url`); none (installed from a package index) gives
    ``seqkernel-harness==VERSION``."""
    import importlib.metadata

    if explicit is not None:
        if not explicit.strip():
            raise InvalidArgument(f"--requirement={explicit!r} is empty; expected a pip requirement, e.g. "
                                  f"'{DISTRIBUTION} @ git+https://github.com/OWNER/seqkernel-harness@v0.1.0'")
        return Requirement(explicit.strip(), "given by --requirement")
    try:
        dist = importlib.metadata.distribution(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        from harness import __version__

        return Requirement(f"{DISTRIBUTION}=={__version__}", "the harness's version (no installed distribution found)",
                           warning=f"no installed {DISTRIBUTION} distribution was found (the harness runs from its "
                                   f"sources?), so the workflow installs {DISTRIBUTION}=={__version__} from a package "
                                   "index; if none serves it, pass --requirement with a git URL or a wheel in this "
                                   "repository")
    text = dist.read_text("direct_url.json")
    if not text:
        return Requirement(f"{DISTRIBUTION}=={dist.version}", "installed from a package index")
    try:
        origin = json.loads(text)
    except json.JSONDecodeError:
        origin = None
    return requirement_from_direct_url(origin, Path(root), version=dist.version)


def requirement_from_direct_url(origin: Any, root: Path, *, version: str) -> Requirement:
    """The requirement of a distribution installed from ``origin`` (a decoded PEP 610 ``direct_url.json``), for a
    runner that has checked out ``root``: a VCS URL at its commit (``seqkernel-harness @ git+URL@COMMIT``); a
    local wheel, sdist or folder (an editable checkout too) inside ``root`` by its path from the root
    (``./wheels/x.whl``); a remote archive by its URL; a local one elsewhere by its ``file://`` URL, with a
    warning that says what to do instead."""
    from urllib.parse import urlparse
    from urllib.request import url2pathname

    url = origin.get("url") if isinstance(origin, dict) else None
    if not isinstance(url, str) or not url:
        return Requirement(f"{DISTRIBUTION}=={version}", "the installed version (its direct_url.json is unreadable)",
                           warning=f"the installed {DISTRIBUTION}'s direct_url.json does not say where it came from, "
                                   f"so the workflow installs {DISTRIBUTION}=={version} from a package index; if none "
                                   "serves it, pass --requirement")
    vcs = origin.get("vcs_info")
    parsed = urlparse(url)
    local = Path(url2pathname(parsed.path)) if parsed.scheme == "file" else None
    if isinstance(vcs, dict) and vcs.get("vcs"):
        ref = vcs.get("commit_id") or vcs.get("requested_revision")
        text = f"{DISTRIBUTION} @ {vcs['vcs']}+{url}" + (f"@{ref}" if ref else "")
        if origin.get("subdirectory"):
            text += f"#subdirectory={origin['subdirectory']}"
        source = f"a {vcs['vcs']} repository" + (f" at {ref}" if ref else "")
        if local is not None:
            return Requirement(text, f"{source}, {local} on this machine", warning=_unreachable(text, source, local))
        return Requirement(text, source)
    editable = isinstance(origin.get("dir_info"), dict) and origin["dir_info"].get("editable")
    kind = ("an editable checkout" if editable else "a folder" if "dir_info" in origin
            else "a wheel" if parsed.path.endswith(".whl") else "an archive")
    if local is None:
        return Requirement(f"{DISTRIBUTION} @ {url}", f"{kind} at a URL")
    inside = _inside(local, Path(root))
    if inside is not None:
        where = "./" + inside if inside != "." else "."
        return Requirement(where, f"{kind} inside the project: commit {where}, the workflow installs it from the "
                                  "checkout")
    text = f"{DISTRIBUTION} @ {url}"
    return Requirement(text, f"{kind}, {local} on this machine", warning=_unreachable(text, kind, local))


def _inside(path: Path, root: Path) -> str | None:
    """``path`` from ``root`` (posix), or None when it lies outside."""
    full, base = Path(os.path.abspath(path)), Path(os.path.abspath(root))
    try:
        return full.relative_to(base).as_posix()
    except ValueError:
        return None


def _unreachable(requirement: str, kind: str, path: Path) -> str:
    """The warning for a requirement that names ``path``, a file on this machine, which no CI runner can reach."""
    wheel = "the wheel" if path.suffix in (".whl", ".gz", ".zip") else \
        f"a wheel of it (python -m pip wheel --no-deps {path} -w wheels/)"
    return (f"HARNESS in {WORKFLOW_PATH.as_posix()} is {requirement!r}: {kind} on this machine, which a CI runner "
            f"cannot reach. Commit {wheel} into this repository and rerun `harness init --force --requirement "
            "./wheels/NAME.whl` (its path from the root), or publish the harness (a package index, a git URL) and "
            "pass that as --requirement; or edit HARNESS there")


def workflow_yaml(root: Path, harness_requirement: str | None = None) -> str:
    """The GitHub Actions workflow of docs/ci-workflow.md, with the paths of ``root``'s table; ``harness_requirement``
    installs the harness (default: as it is installed here, `installed_requirement`)."""
    project = load_project(root)
    if not project.kernels:
        raise InvalidArgument(f"{project.pyproject}: the [tool.harness] table lists no kernels; add "
                              "[[tool.harness.kernels]] target = \"file.py:attr\", family = \"...\" (or `harness init "
                              "--kernel TARGET --family FAMILY --force`) before writing the workflow")
    requirement = harness_requirement or installed_requirement(root).text
    run_dir = _relative(project.runs_dir / CI_RUN_NAME, root)
    baseline = _relative(project.baseline_dir, root)
    cases = _relative(project.counterexamples_dir, root)
    kernels = ", ".join(f"{k.target} ({k.family or '?'})" for k in project.kernels)
    return f"""# Written by `harness init` from [tool.harness] in pyproject.toml (kernels: {kernels}).
# Every pull request: the harness checks each kernel against the float64 oracles, then gates the run
# against the committed baseline ({baseline}/). Make the first baseline with
#   harness check --report-dir {run_dir} && harness update-baseline {run_dir}
# and commit {baseline}/. See docs/ci-workflow.md of the harness.
name: numerics

on:
  push:
    branches: [main]
  pull_request:
  workflow_dispatch:
    inputs:
      update_baseline:
        description: "Make this run the new baseline (uploaded as an artifact to commit)"
        type: boolean
        default: false

permissions:
  contents: read

concurrency:
  group: numerics-${{{{ github.ref }}}}
  cancel-in-progress: true

env:
  # how the runner installs the harness: as it was installed where `harness init` ran (edit to pin another)
  HARNESS: {json.dumps(requirement)}
  RUN_DIR: "{run_dir}"

jobs:
  numerics:
    runs-on: ubuntu-latest
    timeout-minutes: 30
    steps:
      - uses: actions/checkout@v4

      - uses: actions/setup-python@v5
        with:
          python-version: "3.11"
          cache: pip

      - name: Install (CPU torch, the harness, this package)
        run: |
          python -m pip install --upgrade pip
          python -m pip install torch --index-url https://download.pytorch.org/whl/cpu
          python -m pip install "$HARNESS" -e .

      - name: Check the kernels of [tool.harness] against the oracles
        id: check
        run: |
          rm -rf "$RUN_DIR"
          harness check --report-dir "$RUN_DIR"

      - name: Gate against the committed baseline ({baseline})
        id: gate
        if: always() && hashFiles('{baseline}/records*.jsonl') != ''
        run: harness gate "$RUN_DIR"

      - name: Upload the report and counterexamples
        if: always()
        uses: actions/upload-artifact@v4
        with:
          name: numerics-report
          path: |
            ${{{{ env.RUN_DIR }}}}
            {cases}
          if-no-files-found: warn

      - name: Prepare a new baseline
        if: github.event_name == 'workflow_dispatch' && inputs.update_baseline
        run: harness update-baseline "$RUN_DIR"

      - name: Upload the new baseline
        if: github.event_name == 'workflow_dispatch' && inputs.update_baseline
        uses: actions/upload-artifact@v4
        with:
          name: numerics-baseline
          path: {baseline}
"""


# ------------------------------------------------------------------------------------------- .gitignore
#: The ignore file `ignore_runs` writes, at the project's root.
GITIGNORE = ".gitignore"


def _pattern(rel: str) -> str:
    """``rel`` (a posix path from the root) as a literal .gitignore path: globs and trailing spaces escaped."""
    escaped = re.sub(r"([\\*?\[])", r"\\\1", rel)
    return re.sub(r" +$", lambda m: "\\ " * len(m.group()), escaped)


def runs_ignore_lines(project: Project) -> list[str]:
    """The .gitignore lines that ignore ``project``'s runs folder and nothing it commits: ``/RUNS/``; where the
    counterexamples or baseline folder lies inside the runs folder, ``/RUNS/*`` with each of them re-included (git
    re-includes nothing under an excluded folder, so each folder on the way is re-included and its other entries
    ignored). None when the runs folder is the root or lies outside it."""
    runs = _inside(project.runs_dir, project.root)
    if runs is None or runs == ".":
        return []
    keep = [k for k in (_inside(d, project.runs_dir) for d in (project.counterexamples_dir, project.baseline_dir))
            if k is not None]
    if "." in keep:  # the runs folder is itself a committed folder
        return []
    if not keep:
        return [f"/{_pattern(runs)}/"]
    lines = [f"/{_pattern(runs)}/*"]
    for folder in keep:
        parts = folder.split("/")
        for depth in range(1, len(parts) + 1):
            prefix = _pattern("/".join([runs, *parts[:depth]]))
            lines.append(f"!/{prefix}/")
            if depth < len(parts):
                lines.append(f"/{prefix}/*")
    return list(dict.fromkeys(lines))


def _same_line(line: str) -> str:
    """A .gitignore line as compared with another: stripped, its leading slash (after a ``!``) dropped."""
    line = line.strip()
    return "!" + line[1:].lstrip("/") if line.startswith("!") else line.lstrip("/")


def _ignores_folder(line: str, rel: str) -> bool:
    """Whether the .gitignore ``line`` ignores the folder ``rel`` (a posix path from the root) as a whole: a literal
    line naming it or a folder above it (a bare name matches at any depth); globs and negations are not read."""
    line = line.strip()
    if not line or line.startswith(("#", "!")) or any(c in line for c in "*?[\\"):
        return False
    core = line.strip("/")
    parts = rel.split("/")
    if "/" in core:  # anchored: a folder from the root
        return any(core == "/".join(parts[:depth]) for depth in range(1, len(parts) + 1))
    return core in parts if not line.startswith("/") else core == parts[0]


def ignore_runs(project: Project) -> tuple[Path | None, str]:
    """Add `runs_ignore_lines` to the root's .gitignore (created when missing): the file's other lines kept, a line it
    has already (or one that ignores the runs folder already) not added again. Returns the file when written, and
    the sentence `harness init` prints."""
    lines = runs_ignore_lines(project)
    runs = _inside(project.runs_dir, project.root)
    committed = ", ".join(f"{_inside(d, project.root) or d}/"
                          for d in (project.counterexamples_dir, project.baseline_dir))
    if not lines:
        where = ("the project root" if runs == "." else "outside the project" if runs is None
                 else "a folder the project commits")
        return None, f"{GITIGNORE}: nothing added: the runs folder ({project.runs_dir}) is {where}"
    path = project.root / GITIGNORE
    raw = path.read_bytes() if path.is_file() else b""
    text = raw.decode("utf-8", errors="surrogateescape")
    have = text.splitlines()
    if len(lines) == 1:
        covering = next((line for line in have if _ignores_folder(line, runs)), None)
        if covering is not None:
            return None, (f"{GITIGNORE} already ignores the runs folder {runs}/ ({covering.strip()!r}); "
                          f"commit {committed}")
    present = {_same_line(line) for line in have}
    missing = [line for line in lines if _same_line(line) not in present]
    if not missing:
        return None, f"{GITIGNORE} already ignores the runs folder {runs}/; commit {committed}"
    newline = "\r\n" if b"\r\n" in raw else "\n"
    block = ["# the harness's runs (reports of `harness check` and `harness sweep`): remade by every run", *missing]
    lead = "" if not text or text.endswith(("\n", "\r")) else newline
    path.write_bytes((text + lead + newline.join(block) + newline).encode("utf-8", errors="surrogateescape"))
    return path, f"{GITIGNORE}: ignores the runs folder {runs}/ ({', '.join(missing)}); commit {committed}"


# ----------------------------------------------------------------------------------------------- init
@dataclass
class InitResult:
    """What `init_project` wrote, and the lines `harness init` prints about it."""

    written: list[Path] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def init_project(root: Path, kernels: list[KernelEntry], *, force: bool = False, workflow: bool = True,
                 harness_requirement: str | None = None) -> InitResult:
    """`harness init`: write the table (and the workflow made from it) into ``root`` and ignore its runs folder
    (`ignore_runs`); the paths written and what to say of them. ``harness_requirement`` is the workflow's HARNESS
    (default: `installed_requirement`).

    Both files are checked before either is written: an existing workflow is replaced only with ``force``.
    """
    root = Path(root).resolve()
    workflow_file = root / WORKFLOW_PATH
    if workflow and workflow_file.exists() and not force:
        raise InvalidArgument(f"{workflow_file} exists; pass --force to replace it, or --no-workflow to write the "
                              "table only")
    existing = load_project(root) if (root / "pyproject.toml").is_file() else None
    if not kernels and existing is not None:
        kernels = list(existing.kernels)  # --force without --kernel keeps the table's kernels
    if workflow and not kernels:
        raise InvalidArgument("kernels=[]: the workflow checks the table's kernels; pass --kernel TARGET --family "
                              "FAMILY (repeat for several), or --no-workflow to write the table only")
    result = InitResult([write_table(root, kernels, force=force)])
    if workflow:
        workflow_file.parent.mkdir(parents=True, exist_ok=True)
        workflow_file.write_text(workflow_yaml(root, harness_requirement), encoding="utf-8")
        result.written.append(workflow_file)
    ignore_file, note = ignore_runs(load_project(root))
    if ignore_file is not None:
        result.written.append(ignore_file)
    result.notes.append(note)
    return result
