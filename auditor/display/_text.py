"""Text renderings shared by the reports (HTML tables: :mod:`auditor.display._html`)."""

from __future__ import annotations


def shorten(name: str, width: int) -> str:
    """Shorten a long module or op name from the left, where it repeats its parents."""
    return name if len(name) <= width else "…" + name[-(width - 1):]
