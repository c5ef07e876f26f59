"""A kernel target, ``package.module:attr`` or ``path/to/file.py:attr``, read without importing anything:
the registry resolves it (`harness.kernels.registry.resolve_target`), and the command line checks the file
part before torch is imported, so that a mistyped path is answered at once."""

from __future__ import annotations

import os
from pathlib import Path

from harness.errors import InvalidArgument


def file_part(target: str) -> Path | None:
    """The path part of a ``path/to/file.py:attr`` target as written, None for a module or a registered name."""
    where, colon, _ = target.rpartition(":")
    if not colon:
        return None
    return Path(where) if where.endswith(".py") or "/" in where else None


def target_file(target: str) -> Path | None:
    """The Python file ``target`` names (``path/to/file.py:attr``), None for a module or a registered name.

    A relative path is the working directory's, else the project root's (`canonical_target` names a file of
    the project from its root, so that a counterexample saved there replays from any of its folders)."""
    path = file_part(target)
    if path is None or path.is_absolute() or path.is_file():
        return path
    from harness.project import find_root

    rooted = find_root() / path
    return rooted if rooted.is_file() else path


def canonical_target(target: str, cwd: str | os.PathLike | None = None) -> str:
    """``target`` as the kernel is named by: a file inside the project (the nearest folder up from ``cwd``
    holding a pyproject.toml, else ``cwd``) spelled from the project's root, whichever way it was typed.

    A user kernel's name seeds its search, keys its gate cells and names its counterexample: typed from a
    subfolder, as ``./scan.py`` or as an absolute path, the same kernel had three names, and against a baseline
    made from the root its cells were all "missing", so the gate passed while it was divergent (blind hunt,
    session 23). Targets outside the project, modules and registered names are returned as written."""
    path = file_part(target)
    if path is None:
        return target
    from harness.project import find_root

    here = Path(cwd or os.getcwd()).resolve()
    root = find_root(here)
    full = (here / path).resolve() if not path.is_absolute() else path.resolve()
    if not full.is_file() and (root / path).is_file():  # spelled from the root already (`target_file`)
        full = (root / path).resolve()
    try:
        inside = full.relative_to(root)
    except ValueError:
        return target
    return f"{inside.as_posix()}:{target.rpartition(':')[2]}"


def check_target_file(target: str) -> Path | None:
    """`target_file`, raising `InvalidArgument` naming the target when that file does not exist."""
    path = target_file(target)
    if path is not None and not path.is_file():
        raise InvalidArgument(f"kernel={target!r}: file {str(path)!r} does not exist")
    return path
