"""Source edits applied in memory, and as a patch.

A :class:`SourceEdit` replaces some whole lines of a file (the statement a cause sits on) with
new ones. :func:`patch_functions` applies a set of edits to the running program: every live
function whose code covers an edited line is compiled again from the edited text, under its own
file name, with every line that was not edited keeping its number (so a re-audit still names
the file's real lines), and its ``__code__`` is swapped in place. Swapping the code object
rather than rebinding names reaches the function wherever it is held: a class attribute, a
module global, a name another module took with ``from x import f``, a bound method, a wrapper
that calls it. :meth:`CodePatch.undo` swaps the old code back.

The same edits make a unified diff (:func:`unified_diff`) that ``git apply`` and ``patch -p1``
accept for files under the user's project, and that is labelled as a diff against the installed
file for a library.
"""

from __future__ import annotations

import ast
import difflib
import gc
import linecache
import os
import sys
import types
from collections.abc import Iterable
from dataclasses import dataclass, field

#: How the wrapper that recreates a function's outer variables and class cell is named in the
#: code it compiles (never executed: only the function's code object is taken out of it).
_OUTER, _CLASS = "_auditor_outer_scope", "_auditor_class_scope"


class EditError(ValueError):
    """An edit that cannot be applied: the reason says why, in words for the user."""


@dataclass(frozen=True)
class SourceEdit:
    """Lines ``first`` .. ``last`` (1-based, inclusive) of ``path`` replaced by ``new``.

    ``path`` is the file as the audit recorded it (a notebook cell's temporary file included:
    its text is read through ``linecache``, where IPython keeps it). ``old`` is the text of
    those lines as they were when the edit was made; applying checks it still is."""

    path: str
    first: int
    last: int
    old: str
    new: str

    def __post_init__(self):
        if not 1 <= self.first <= self.last:
            raise ValueError(f"lines {self.first}..{self.last} are no range of lines")


def source_lines(path: str) -> list[str]:
    """The lines of ``path`` as Python reads them (``linecache``), newlines kept."""
    lines = linecache.getlines(path)
    if not lines:
        linecache.checkcache(path)
        lines = linecache.getlines(path)
    return lines


def edited_text(path: str, edits: Iterable[SourceEdit]) -> tuple[list[str], dict[int, int]]:
    """(the lines of ``path`` with ``edits`` applied, new line number -> the line it stands for
    in the file). Lines outside the edits map to themselves (shifted); the new lines of an edit
    map to its old lines, one for one, the extra ones to its last."""
    lines = source_lines(path)
    if not lines:
        raise EditError(f"the source of {path} cannot be read")
    edits = sorted(edits, key=lambda e: e.first)
    for a, b in zip(edits, edits[1:]):
        if b.first <= a.last:
            raise EditError(f"two edits overlap in {path} (lines {a.first}..{a.last} and {b.first}..{b.last})")
    out: list[str] = []
    origin: dict[int, int] = {}
    at = 1
    for e in edits:
        current = "".join(lines[e.first - 1:e.last])
        if current.rstrip("\n") != e.old.rstrip("\n"):
            raise EditError(f"{path}:{e.first} is not the text the fix was made for (the file changed since the audit)")
        for n in range(at, e.first):
            out.append(lines[n - 1])
            origin[len(out)] = n
        new = e.new.splitlines(keepends=True) or [""]
        for k, text in enumerate(new):
            out.append(text if text.endswith("\n") else text + "\n")
            origin[len(out)] = min(e.first + k, e.last)
        at = e.last + 1
    for n in range(at, len(lines) + 1):
        out.append(lines[n - 1])
        origin[len(out)] = n
    return out, origin


def _span(code: types.CodeType) -> tuple[int, int]:
    """(first, last) line of a code object and the code nested in it."""
    first = last = code.co_firstlineno
    todo = [code]
    while todo:
        c = todo.pop()
        for _, _, line in c.co_lines():
            if line is not None:
                last = max(last, line)
        todo.extend(k for k in c.co_consts if isinstance(k, types.CodeType))
    return first, last


def live_functions(path: str, lines: Iterable[int]) -> list[types.FunctionType]:
    """Every function object alive in this process whose code was compiled from ``path`` and
    covers one of ``lines`` (a method, a module-level function, a closure made by a call)."""
    wanted = sorted(set(lines))
    found = []
    for obj in gc.get_objects():
        if type(obj) is types.FunctionType and obj.__code__.co_filename == path:
            first, last = _span(obj.__code__)
            if any(first <= n <= last for n in wanted):
                found.append(obj)
    return found


def _renumber(node: ast.AST, origin: dict[int, int]) -> None:
    for n in ast.walk(node):
        for attr in ("lineno", "end_lineno"):
            line = getattr(n, attr, None)
            if line is not None:
                setattr(n, attr, origin.get(line, line))


def _function_node(tree: ast.Module, code: types.CodeType, origin: dict[int, int]) -> ast.AST:
    """The ``def`` in the edited module ``tree`` that compiled to ``code`` (matched by name and
    first line, the first decorator's when decorated, as CPython numbers a code object)."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == code.co_name:
            first = node.decorator_list[0].lineno if node.decorator_list else node.lineno
            if origin.get(first, first) == code.co_firstlineno:
                return node
    raise EditError(f"{code.co_name} at {code.co_filename}:{code.co_firstlineno} is not found in its edited source")


def _find_code(code: types.CodeType, name: str, first: int) -> types.CodeType | None:
    todo = [code]
    while todo:
        c = todo.pop()
        if c.co_name == name and c.co_firstlineno == first and c is not code:
            return c
        todo.extend(k for k in c.co_consts if isinstance(k, types.CodeType))
    return None


def compile_function(fn: types.FunctionType, lines: list[str], origin: dict[int, int]) -> types.CodeType:
    """``fn``'s code compiled again from the edited ``lines`` of its file, under the file's
    name, each statement numbered as the line of the file it stands for. The function is
    compiled where it had its outer variables and its class (``super()``), so its closure
    still fits; it is never run here."""
    old = fn.__code__
    try:
        tree = ast.parse("".join(lines), filename=old.co_filename)
    except SyntaxError as exc:
        raise EditError(f"the edited {old.co_filename} does not parse: {exc.msg} (line {exc.lineno})") from exc
    node = _function_node(tree, old, origin)
    _renumber(node, origin)
    node.decorator_list = []  # the decorators ran when the function was made; only its code is needed
    node.lineno = old.co_firstlineno
    body: list[ast.stmt] = [node]
    free = [v for v in old.co_freevars if v != "__class__"]
    if "__class__" in old.co_freevars:  # super() without arguments: the class cell
        body = [ast.parse(f"class {_CLASS}:\n    pass").body[0]]
        body[0].body = [node]
    if free:  # the outer variables, as cells of an enclosing function
        outer = ast.parse(f"def {_OUTER}():\n" + "".join(f"    {v} = None\n" for v in free)).body[0]
        outer.body.extend(body)
        body = [outer]
    module = ast.Module(body=body, type_ignores=[])
    ast.fix_missing_locations(module)  # the wrappers' own lines do not matter: they never run
    new = _find_code(compile(module, old.co_filename, "exec"), old.co_name, old.co_firstlineno)
    if new is None:
        raise EditError(f"{fn.__qualname__}: the edited function did not compile to one code object")
    if new.co_freevars != old.co_freevars:
        raise EditError(f"{fn.__qualname__}: the edit changes which outer variables the function uses "
                        f"({', '.join(old.co_freevars) or 'none'} -> {', '.join(new.co_freevars) or 'none'})")
    if sys.version_info >= (3, 11):
        new = new.replace(co_qualname=old.co_qualname)
    return new


@dataclass
class CodePatch:
    """Edits applied to live functions: (function, old code, new code) each; :meth:`undo` and
    :meth:`redo` swap them back and forth."""

    edits: tuple[SourceEdit, ...]
    swaps: list[tuple[types.FunctionType, types.CodeType, types.CodeType]] = field(default_factory=list)
    active: bool = False

    def redo(self) -> None:
        for fn, _, new in self.swaps:
            fn.__code__ = new
        self.active = True

    def undo(self) -> None:
        for fn, old, _ in reversed(self.swaps):
            fn.__code__ = old
        self.active = False

    @property
    def functions(self) -> list[str]:
        """The functions the edits reached, by qualified name."""
        return list(dict.fromkeys(fn.__qualname__ for fn, _, _ in self.swaps))


def patch_functions(edits: Iterable[SourceEdit]) -> CodePatch:
    """Apply ``edits`` to the live functions that hold their lines (see the module docstring);
    raises :class:`EditError` before changing anything when an edit cannot be applied: the file
    changed since the audit, the edited text does not compile, no live function holds the
    lines, or a function's closure would not fit its new code."""
    edits = tuple(edits)
    by_path: dict[str, list[SourceEdit]] = {}
    for e in edits:
        by_path.setdefault(e.path, []).append(e)
    patch = CodePatch(edits)
    for path, mine in by_path.items():
        lines, origin = edited_text(path, mine)
        touched = [n for e in mine for n in range(e.first, e.last + 1)]
        functions = live_functions(path, touched)
        if not functions:
            raise EditError(f"no function of the running program holds {path}:{mine[0].first}")
        for fn in functions:
            patch.swaps.append((fn, fn.__code__, compile_function(fn, lines, origin)))
    patch.redo()
    return patch


# -- the patch file ------------------------------------------------------------------------------


def _site_folders() -> list[str]:
    import site
    import sysconfig

    paths = sysconfig.get_paths()
    found = [paths.get("purelib", ""), paths.get("platlib", "")]
    try:
        found += site.getsitepackages()
    except AttributeError:
        pass
    return sorted({os.path.normpath(p) for p in found if p}, key=len, reverse=True)


def project_root(path: str) -> str | None:
    """The folder of the git repository (or, failing that, of the ``pyproject.toml`` or
    ``setup.py``) that holds ``path``; None for a path in no project."""
    here = os.path.dirname(os.path.abspath(path))
    while True:
        if any(os.path.exists(os.path.join(here, m)) for m in (".git", "pyproject.toml", "setup.py", "setup.cfg")):
            return here
        parent = os.path.dirname(here)
        if parent == here:
            return None
        here = parent


def patch_target(path: str) -> tuple[str, str]:
    """(how the diff names ``path``, a note for its header): relative to the site-packages
    folder for an installed library (apply with ``patch -p1 -d <site-packages>``), relative to
    the project root for a file of the user's project (``git apply`` there), else as is."""
    real = os.path.normpath(os.path.abspath(path))
    for site_dir in _site_folders():
        if real.startswith(site_dir + os.sep):
            rel = os.path.relpath(real, site_dir)
            return rel, f"installed library file: a diff against {real} (apply with patch -p1 -d {site_dir})"
    root = project_root(real) if os.path.exists(real) else None
    if root is not None:
        return os.path.relpath(real, root), f"project file under {root} (apply there with git apply or patch -p1)"
    return path, "not a file on disk (a notebook cell, say): edit it by hand"


def unified_diff(edits: Iterable[SourceEdit], context: int = 3) -> str:
    """One unified diff of every file ``edits`` change, each with a header line (``# ...``)
    saying what kind of file it is and how to apply it; ``git apply`` and ``patch`` skip those
    lines."""
    by_path: dict[str, list[SourceEdit]] = {}
    for e in edits:
        by_path.setdefault(e.path, []).append(e)
    parts = []
    for path, mine in by_path.items():
        old = source_lines(path)
        new, _ = edited_text(path, mine)
        name, note = patch_target(path)
        diff = difflib.unified_diff(old, new, f"a/{name}", f"b/{name}", n=context)
        text = "".join(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n" for line in diff)
        if text:
            parts.append(f"# {note}\ndiff --git a/{name} b/{name}\n{text}")
    return "".join(parts)
