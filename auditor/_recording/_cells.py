"""Source lines as people know them: a notebook cell's line named as IPython's tracebacks name
it (``Cell In[3], line 17``), not by the temporary file the cell was compiled under
(``/tmp/ipykernel_4711/2690816514.py:17``).

IPython's compiler keeps the map from those file names to execution counts and formats the name
itself (``CachingCompiler.format_code_name``); this asks it, once per distinct line of a log.
Outside IPython nothing is imported and every source stays as recorded.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable

#: name -> the ``path:line`` it was recorded as, for the lines named here: the cell's text
#: stays in ``linecache`` under that path (how the fixes read a line).
_RECORDED: dict[str, str] = {}


def readable(sources: Iterable[str]) -> list[str]:
    """Each ``path:line``, with the lines of notebook cells named as IPython names them."""
    sources = list(sources)
    compiler = _ipython_compiler()
    if compiler is None:
        return sources
    return [_cell_name(compiler, s) or s for s in sources]


def recorded(source: str) -> str:
    """The ``path:line`` a source was recorded as: a cell's compiled file name and line (where
    ``linecache`` has its text), else ``source`` itself."""
    return _RECORDED.get(source, source)


def _ipython_compiler():
    """The running IPython shell's compiler, if IPython is imported and running."""
    ipython = sys.modules.get("IPython")
    get = getattr(ipython, "get_ipython", None)
    shell = get() if get is not None else None
    return getattr(shell, "compile", None)


def _cell_name(compiler, source: str) -> str | None:
    path, sep, line = source.rpartition(":")
    if not sep or not line.isdigit():
        return None
    formatted = getattr(compiler, "format_code_name", None)
    if formatted is not None:  # IPython 8 and later: ("Cell", "In[3]"), as in its tracebacks
        label_name = formatted(path)
        if label_name is None:
            return None
        name = f"{' '.join(label_name)}, line {line}"
    else:  # older IPython keeps the map without formatting it
        count = getattr(compiler, "_filename_map", {}).get(path)
        if count is None:
            return None
        name = f"In [{count}], line {line}"
    _RECORDED[name] = source
    return name
