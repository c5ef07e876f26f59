"""Replace the generated block of a Markdown file between two marker lines (or append it)."""

from __future__ import annotations

from pathlib import Path


def write_between_markers(path: Path, block: str, *, begin: str, end: str, title: str) -> None:
    """Put ``block`` (which starts with ``begin`` and ends with ``end``) into ``path``; the rest is kept."""
    text = path.read_text() if path.is_file() else ""
    if begin in text and end in text:
        head, _, rest = text.partition(begin)
        _, _, tail = rest.partition(end)
        text = head + block + tail
    else:
        text = (text.rstrip() + "\n\n" if text else f"# {title}\n\n") + block + "\n"
    path.write_text(text)
