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
import contextlib
import difflib
import gc
import inspect
import linecache
import os
import sys
import types
from collections.abc import Iterable, Iterator
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


#: file -> its live functions, while :func:`one_scan` holds one scan of the heap for many lookups
_SCAN: dict[str, list[types.FunctionType]] | None = None


@contextlib.contextmanager
def one_scan() -> Iterator[None]:
    """Look the live functions up once for the block (suggesting fixes for many causes asks for
    those of many lines)."""
    global _SCAN
    outer = _SCAN
    if outer is None:
        _SCAN = {}
        for obj in gc.get_objects():
            if type(obj) is types.FunctionType:
                _SCAN.setdefault(obj.__code__.co_filename, []).append(obj)
    try:
        yield
    finally:
        _SCAN = outer


def live_functions(path: str, lines: Iterable[int]) -> list[types.FunctionType]:
    """Every function object alive in this process whose code was compiled from ``path`` and
    covers one of ``lines`` (a method, a module-level function, a closure made by a call)."""
    wanted = sorted(set(lines))
    if _SCAN is not None:
        candidates = _SCAN.get(path, [])
    else:
        candidates = [o for o in gc.get_objects() if type(o) is types.FunctionType and o.__code__.co_filename == path]
    found = []
    for obj in candidates:
        if not _is_def(_ORIGINAL.get(obj, obj.__code__)):
            continue
        first, last = _span(_ORIGINAL.get(obj, obj.__code__))
        if any(first <= n <= last for n in wanted):
            found.append(obj)
    return found


def _is_def(code: types.CodeType) -> bool:
    """Whether ``code`` is a ``def``'s, the only code an edit recompiles. The code of a module
    or a class body being run is held by a function object too while it runs (CPython 3.11 and
    later make one for ``python train.py``'s ``__main__`` and for a notebook cell): it covers
    every line, yet no edit recompiles it; its own functions are. Lambdas and comprehensions
    (``<lambda>``, ``<listcomp>``) have no ``def`` to find either."""
    return not code.co_name.startswith("<") and bool(code.co_flags & inspect.CO_OPTIMIZED)


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


def compile_function(fn: types.FunctionType, lines: list[str], origin: dict[int, int],
                     old: types.CodeType | None = None) -> types.CodeType:
    """``fn``'s code (``old``: its code before any edit, by default its own) compiled again from
    the edited ``lines`` of its file, under the file's name, each statement numbered as the
    line of the file it stands for. The function is compiled where it had its outer variables
    and its class (``super()``), so its closure still fits; it is never run here."""
    old = fn.__code__ if old is None else old
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


#: The edits in force in this process, per file, in the order they were made: a function is
#: always compiled from its file with all of them, so edits made apart (two fixes, two audits)
#: never undo each other, and taking one back leaves the others.
_ACTIVE: dict[str, list[SourceEdit]] = {}
#: function -> its code before any edit, for the functions an edit in force reaches
_ORIGINAL: dict[types.FunctionType, types.CodeType] = {}


#: (file, the edits in force on it) -> the functions they reach, with their code before and
#: after: compiled once, so taking a patch back and making it again (as timing before and after
#: does, round by round) only assigns code objects
_COMPILED: dict[tuple[str, tuple[SourceEdit, ...]], list[tuple[types.FunctionType, types.CodeType, types.CodeType]]] = {}


def _swaps(path: str) -> list[tuple[types.FunctionType, types.CodeType, types.CodeType]]:
    """(function, its code before any edit, its code with the edits in force on ``path``) for
    every live function of ``path`` those edits reach."""
    edits = tuple(_ACTIVE.get(path, []))
    if not edits:
        return []
    known = _COMPILED.get((path, edits))
    if known is not None:
        return known
    lines, origin = edited_text(path, edits)
    touched = [n for e in edits for n in range(e.first, e.last + 1)]
    swaps = []
    for fn in live_functions(path, touched):
        old = _ORIGINAL.get(fn, fn.__code__)
        swaps.append((fn, old, compile_function(fn, lines, origin, old)))
    if len(_COMPILED) > 256:  # a long session's states: keep the memory they hold bounded
        _COMPILED.clear()
    _COMPILED[(path, edits)] = swaps
    return swaps


def _recompile(paths: Iterable[str]) -> None:
    """Every live function of ``paths`` that an edit in force reaches compiled from its file
    with those edits; every function no edit reaches any more given its own code back. All
    compile before any is swapped, so a failure changes nothing."""
    swaps = {path: _swaps(path) for path in paths}
    for path, mine in swaps.items():
        reached = {fn for fn, _, _ in mine}
        for fn in [f for f, code in _ORIGINAL.items() if code.co_filename == path and f not in reached]:
            fn.__code__ = _ORIGINAL.pop(fn)
        for fn, old, new in mine:
            _ORIGINAL.setdefault(fn, old)
            fn.__code__ = new


@dataclass
class CodePatch:
    """Edits in force in this process, or taken back: :meth:`undo` and :meth:`redo` take them
    back and make them again (the other edits in force stay)."""

    edits: tuple[SourceEdit, ...]
    active: bool = False
    functions: list[str] = field(default_factory=list)  #: the functions the edits reached, by qualified name

    def redo(self) -> None:
        if self.active:
            return
        paths = {e.path for e in self.edits}
        for e in self.edits:
            _ACTIVE.setdefault(e.path, []).append(e)
        try:
            _recompile(paths)
        except Exception:
            self._forget()
            raise
        self.active = True

    def undo(self) -> None:
        if not self.active:
            return
        self._forget()
        _recompile({e.path for e in self.edits})
        self.active = False

    def _forget(self) -> None:
        for e in self.edits:
            mine = _ACTIVE.get(e.path, [])
            if e in mine:
                mine.remove(e)
            if not mine:
                _ACTIVE.pop(e.path, None)


def patch_functions(edits: Iterable[SourceEdit]) -> CodePatch:
    """Apply ``edits`` to the live functions that hold their lines (see the module docstring),
    with every edit already in force; raises :class:`EditError` before changing anything when an
    edit cannot be applied: the file changed since the audit, it overlaps an edit in force, the
    edited text does not compile, no live function holds the lines, or a function's closure
    would not fit its new code."""
    patch = CodePatch(tuple(edits))
    for e in patch.edits:
        if not live_functions(e.path, range(e.first, e.last + 1)):
            raise EditError(f"no function of the running program holds {e.path}:{e.first}")
    patch.redo()
    touched = {(e.path, n) for e in patch.edits for n in range(e.first, e.last + 1)}
    patch.functions = list(dict.fromkeys(
        fn.__qualname__ for fn, old in _ORIGINAL.items()
        if any(p == old.co_filename and _span(old)[0] <= n <= _span(old)[1] for p, n in touched)))
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
    if not os.path.exists(real):  # a notebook cell's code: IPython keeps its text, no file holds it
        from .._recording._cells import readable

        cell = readable([f"{path}:1"])[0].removesuffix(", line 1")
        where = cell if cell != f"{path}:1" else path
        return path, (f"{where} is no file on disk (a notebook cell, say): the fix is applied and verified in memory; "
                      "edit the cell by hand as the diff shows")
    root = project_root(real)
    if root is not None:
        return os.path.relpath(real, root), f"project file under {root} (apply there with git apply or patch -p1)"
    folder = os.path.dirname(real)
    return os.path.basename(real), f"file {real}, in no project (apply in {folder} with patch -p1 -d {folder})"


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
