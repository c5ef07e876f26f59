#!/usr/bin/env python3
"""Finish and check the device bundle (`make device-bundle`): the third-party kernel packages, pure Python,
in one folder that `scripts/gpu_check.sh` puts on ``PYTHONPATH`` on a GPU machine without network.

    python scripts/device_bundle.py FOLDER            # prune, write MANIFEST.json, check (size, imports)
    python scripts/device_bundle.py FOLDER --check    # check only

`make device-bundle` installs the pinned wheels (``--no-deps --only-binary=:all: --python-version 3.12``)
and mamba-ssm built without its CUDA extension into ``FOLDER``; this script then

- removes the top-level entries that are not one of `PACKAGES` or their ``.dist-info`` (torchscale's wheel
  carries a top-level ``examples`` package and yet-another-retnet ``doc`` and ``scripts`` folders, which
  would otherwise sit on the GPU machine's import path next to this checkout's ``scripts/``);
- writes ``MANIFEST.json`` (each distribution and its version, the folder's size);
- checks that the folder is at most `MAX_BYTES` (the device tool carries 64 MiB in all) and that, in a
  fresh interpreter with the folder first on ``sys.path``, each package imports *from the folder* (mamba-ssm's
  Triton kernel through `harness.kernels.contract.import_skipping_init`, as its adapter imports it).

Exit status 0 when the checks pass, 1 with the reasons otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: import name -> (distribution, the module the adapters import first)
PACKAGES: dict[str, tuple[str, str]] = {
    "mambapy": ("mambapy", "mambapy.pscan"),
    "torchscale": ("torchscale", "torchscale.component.multiscale_retention"),
    "yet_another_retnet": ("yet-another-retnet", "yet_another_retnet.retention"),
    "accelerated_scan": ("accelerated-scan", "accelerated_scan.ref"),
    "fla": ("fla-core", "fla.ops.retention"),
    "mamba_ssm": ("mamba-ssm", "mamba_ssm.ops.triton.selective_state_update"),
}
MAX_BYTES = 48 * 2**20  # of the device tool's 64 MiB for everything carried; the checkout needs the rest
MANIFEST = "MANIFEST.json"


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file() and not p.is_symlink())


def prune(folder: Path) -> list[str]:
    """Remove the top-level entries that are not a wanted package or its metadata; return their names."""
    removed = []
    for entry in sorted(folder.iterdir()):
        name = entry.name
        keep = name in PACKAGES or name == MANIFEST or (
            name.endswith(".dist-info") and name.split("-")[0].lower().replace("_", "-")
            in {dist for dist, _ in PACKAGES.values()})
        if not keep:
            shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
            removed.append(name)
    for cache in folder.rglob("__pycache__"):
        shutil.rmtree(cache, ignore_errors=True)
    return removed


def versions(folder: Path) -> dict[str, str]:
    out = {}
    for info in sorted(folder.glob("*.dist-info")):
        dist, _, version = info.name[: -len(".dist-info")].partition("-")
        out[dist] = version
    return out


IMPORT_PROBE = """
import json, sys
from harness.kernels.contract import import_skipping_init
folder, modules = sys.argv[1], json.loads(sys.argv[2])
result = {}
for top, module in modules.items():
    try:
        mod = import_skipping_init(module) if top == "mamba_ssm" else __import__(module, fromlist=["_"])
        where = getattr(mod, "__file__", "") or ""
        result[top] = "ok" if where.startswith(folder) else f"imported from {where}, not from the bundle"
    except Exception as exc:
        result[top] = f"{type(exc).__name__}: {exc}"
print(json.dumps(result))
"""


def check(folder: Path) -> list[str]:
    """The reasons the bundle is not fit to carry (empty when it is)."""
    problems = []
    size = folder_bytes(folder)
    if size > MAX_BYTES:
        problems.append(f"{folder} holds {size / 2**20:.1f} MiB, more than {MAX_BYTES / 2**20:.0f} MiB")
    missing = [top for top in PACKAGES if not (folder / top).is_dir()]
    if missing:
        problems.append(f"{folder} lacks {missing}")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(folder.resolve()), str(ROOT)]),
           "TRITON_INTERPRET": os.environ.get("TRITON_INTERPRET", "1")}
    modules = {top: module for top, (_, module) in PACKAGES.items() if top not in missing}
    proc = subprocess.run([sys.executable, "-c", IMPORT_PROBE, str(folder.resolve()), json.dumps(modules)],
                          capture_output=True, text=True, env=env, timeout=300, cwd=str(folder.resolve().parent))
    if proc.returncode != 0:
        problems.append(f"import probe failed: {proc.stderr.strip()[-500:]}")
    else:
        for top, status in json.loads(proc.stdout.strip().splitlines()[-1]).items():
            if status != "ok":
                problems.append(f"{top}: {status}")
    return problems


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folder", type=Path)
    ap.add_argument("--check", action="store_true", help="check only; change nothing")
    args = ap.parse_args(argv)
    folder: Path = args.folder
    if not folder.is_dir():
        print(f"device_bundle: folder={str(folder)!r} does not exist; run `make device-bundle`", file=sys.stderr)
        return 1
    if not args.check:
        removed = prune(folder)
        if removed:
            print(f"device_bundle: removed top-level {removed} (not a kernel package)")
        manifest = {"distributions": versions(folder), "bytes": folder_bytes(folder), "python": ">=3.10, pure"}
        (folder / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    problems = check(folder)
    size = folder_bytes(folder) / 2**20
    if problems:
        for p in problems:
            print(f"device_bundle: {p}", file=sys.stderr)
        return 1
    print(f"device_bundle: {folder} ok, {size:.1f} MiB: "
          + ", ".join(f"{d}=={v}" for d, v in versions(folder).items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
