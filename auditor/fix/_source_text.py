"""Reading the user's source: the line a cause sits on, the function around it, and how to
write a submodule or a format-keeping version of a line in code."""

from __future__ import annotations

import ast
import functools
import io
import linecache
import os
import re
import sys
import tokenize

from ..recording._cells import recorded

_CONTIGUOUS_CALL = re.compile(r"\.contiguous\(\s*\)")
_CONTIGUOUS_FORMAT = re.compile(r"(?:torch\.)?contiguous_format")


def module_expr(name: str, root: str = "model") -> str:
    """``layer1.0.conv2`` -> ``model.layer1[0].conv2``: how to write a submodule in code."""
    if name in ("", "<root>"):
        return root
    out = root
    for part in name.split("."):
        out += f"[{part}]" if part.isdigit() else (f".{part}" if part.isidentifier() else f".get_submodule({part!r})")
    return out


def source_line(source: str) -> str:
    """The text of a ``path:line`` source (or a notebook cell's line), without its newline;
    empty when unreadable."""
    path, _, line = recorded(source).rpartition(":")
    if not path or not line.isdigit():
        return ""
    return linecache.getline(path, int(line)).rstrip("\n")


def keep_format_in_line(line: str, cl_name: str) -> str:
    """``line`` with its ``.contiguous()`` (or ``contiguous_format``) asking for ``cl_name``
    instead; comments are left alone. Empty when the line has neither."""
    code, comment = split_comment(line)
    for pattern, repl in ((_CONTIGUOUS_CALL, f".contiguous(memory_format=torch.{cl_name})"),
                          (_CONTIGUOUS_FORMAT, f"torch.{cl_name}")):
        if pattern.search(code):
            return pattern.sub(repl, code) + comment
    return ""


def split_comment(line: str) -> tuple[str, str]:
    """(code, comment) of one source line, the comment with the spaces before it."""
    try:
        for tok in tokenize.generate_tokens(io.StringIO(line + "\n").readline):
            if tok.type == tokenize.COMMENT:
                cut = tok.start[1]
                while cut > 0 and line[cut - 1] == " ":
                    cut -= 1
                return line[:cut], line[cut:]
    except (tokenize.TokenError, SyntaxError):
        pass  # a line of a multi-line statement: no comment detection
    return line, ""


@functools.lru_cache(maxsize=4096)
def enclosing_function(source: str) -> tuple[str | None, str | None]:
    """(importable module, function name) of the module-level function holding ``source``;
    the module is None when the file is not an imported module (a script, a notebook)."""
    path, _, line = recorded(source).rpartition(":")
    if not path or not line.isdigit():
        return None, None
    try:
        tree = ast.parse(open(path).read())
    except (OSError, SyntaxError, ValueError):
        return None, None
    func = next((node.name for node in tree.body if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
                 and node.lineno <= int(line) <= (node.end_lineno or node.lineno)), None)
    real = os.path.realpath(path)
    module_name = next((name for name, mod in list(sys.modules.items())
                        if getattr(mod, "__file__", None) and os.path.realpath(mod.__file__) == real
                        and name != "__main__"), None)
    return module_name, func
