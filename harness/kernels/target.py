"""A kernel target, ``package.module:attr`` or ``path/to/file.py:attr``, read without importing anything:
the registry resolves it (`harness.kernels.registry.resolve_target`), and the command line checks the file
part before torch is imported, so that a mistyped path is answered at once."""

from __future__ import annotations

from pathlib import Path

from harness.errors import InvalidArgument


def target_file(target: str) -> Path | None:
    """The Python file ``target`` names (``path/to/file.py:attr``), None for a module or a registered name."""
    where, colon, _ = target.rpartition(":")
    if not colon:
        return None
    return Path(where) if where.endswith(".py") or "/" in where else None


def check_target_file(target: str) -> Path | None:
    """`target_file`, raising `InvalidArgument` naming the target when that file does not exist."""
    path = target_file(target)
    if path is not None and not path.is_file():
        raise InvalidArgument(f"kernel={target!r}: file {str(path)!r} does not exist")
    return path
