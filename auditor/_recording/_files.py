"""Writing files: every file the package writes goes through :func:`atomic_write`, so an
interrupted write never leaves a half-written file where a finished one was."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path


def atomic_write(path: str | os.PathLike, write: Callable[[Path], object]) -> None:
    """Call ``write(tmp)`` on a temporary name beside ``path``, then rename it to ``path``; on
    failure the temporary file is removed and ``path`` is left as it was."""
    path = Path(path)
    tmp = path.with_name(path.name + ".partial")
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
