"""What `harness init` writes into a kernel repository: the ``[tool.harness]`` table and the CI workflow.

The table goes into the project's ``pyproject.toml`` (created when missing); an existing
``[tool.harness]`` table (with its ``[[tool.harness.kernels]]``) is replaced only with ``force``. The
workflow (`workflow_yaml`, the one docs/ci-workflow.md describes) is made from the table just written:
it runs `harness check` on the table's kernels, gates the run against the table's baseline, writes the
job summary and uploads the report; its paths are the table's, so a change of the table needs
``harness init --force`` (or an edit of the workflow) to follow.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from harness.errors import InvalidArgument
from harness.project import KernelEntry, init_table, load_project

#: Where the workflow is written, relative to the project's root.
WORKFLOW_PATH = Path(".github") / "workflows" / "harness.yml"
#: The run directory the workflow's check writes and gates (relative to the root; under the runs folder).
CI_RUN_NAME = "ci"

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


def workflow_yaml(root: Path, harness_requirement: str | None = None) -> str:
    """The GitHub Actions workflow of docs/ci-workflow.md, with the paths of ``root``'s table."""
    from harness import __version__

    project = load_project(root)
    if not project.kernels:
        raise InvalidArgument(f"{project.pyproject}: the [tool.harness] table lists no kernels; add "
                              "[[tool.harness.kernels]] target = \"file.py:attr\", family = \"...\" (or `harness init "
                              "--kernel TARGET --family FAMILY --force`) before writing the workflow")
    requirement = harness_requirement or f"seqkernel-harness=={__version__}"
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
  HARNESS: "{requirement}"
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


def init_project(root: Path, kernels: list[KernelEntry], *, force: bool = False, workflow: bool = True,
                 harness_requirement: str | None = None) -> list[Path]:
    """`harness init`: write the table (and the workflow made from it) into ``root``; the paths written.

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
    written = [write_table(root, kernels, force=force)]
    if workflow:
        workflow_file.parent.mkdir(parents=True, exist_ok=True)
        workflow_file.write_text(workflow_yaml(root, harness_requirement), encoding="utf-8")
        written.append(workflow_file)
    return written
