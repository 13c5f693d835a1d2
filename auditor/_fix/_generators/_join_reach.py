"""What the join variants read of a cause's line: its recorded events, the format of its
tensors, and a convolution weight its code can reach (the format the model runs in)."""

from __future__ import annotations

import ast
import linecache
import types

import numpy as np
import torch

from ..._recording._formats import AMBIGUOUS
from .. import _syntax as syn
from .._proposal import CauseView, module_expr, where
from .._statements import functions_at


def line_events(c: CauseView) -> list[int]:
    """The forward events recorded at the cause's line (those of its forward op's line)."""
    view = c.view
    return [int(x) for x in np.flatnonzero((view.phase == "forward") & (view.source == view.source[c.forward]))]


#: the ops a reshape into a map is recorded as (a view, or the view after the copy it makes)
RESHAPES = ("aten.view.", "aten._unsafe_view.", "aten.reshape.")


#: the ops a reshape or view is recorded as (a reshape that copies: a clone, then this)
VIEWS = ("aten.view.default", "aten._unsafe_view.default")


def in_format(c: CauseView, x: int) -> bool:
    """Whether event ``x``'s first input is a map dense in the format (its channels innermost)."""
    rows = c.tracer.input_rows(x)
    return bool(rows) and row_in_format(c, rows[0])


def row_in_format(c: CauseView, row: int) -> bool:
    """Whether tensor ``row`` is a map of the images' rank dense in the format (its recorded
    label: contiguous in the format, alone or with the other one)."""
    return str(c.view.tensors["format"].iat[row]) in (c.cl_name, AMBIGUOUS)


def weight_in_reach(c: CauseView, fns: list[types.FunctionType], at: int | None = None) -> str | None:
    """A convolution weight the cause's line (or event ``at``'s line) can read as
    ``self.<path>.weight``: of a convolution that ran inside the module the line ran in (the
    one the map feeds first, else the one that made its input, else any), where the line is in
    a method of that module. Its layout is the format the model runs in."""
    e = c.forward if at is None else at
    view = c.view
    own, own_type = (c.module, c.module_type) if at is None else (view.module[e], view.ops["module_type"].iat[e])
    if not fns or not all(method_of(fn, str(own_type)) for fn in fns):
        return None
    own = str(own)
    prefix = "" if own in ("", "<root>") else own + "."
    inside = [int(x) for x in np.flatnonzero(view.is_conv & (view.phase == "forward"))
              if str(view.module[int(x)]).startswith(prefix) and str(view.module[int(x)]) not in ("", "<root>")]
    if not inside:
        return None
    down, up = view.downstream_convs(e), view.upstream_convs(e)
    chosen = next((x for x in inside if x in down), None) or next((x for x in reversed(inside) if x in up), None) \
        or inside[0]
    path = str(view.module[chosen])[len(prefix):]
    if not all(p.isidentifier() or p.isdigit() for p in path.split(".")):
        return None
    held = _held_by_every_instance(c, e, own, str(own_type), path)
    if held is None:
        return None
    return module_expr(path, root="self") + ".weight" if held else syn.optional_weight(module_expr(path, root="self"))


def _held_by_every_instance(c: CauseView, e: int, own: str, own_type: str, path: str) -> bool | None:
    """Whether every module of ``own_type`` that ran event ``e``'s line has a convolution at
    ``path`` (True), has a module there that is not one in some (False: MViT's pooling holds a
    convolution in some instances and a max pool in others), or lacks the module (None). The
    line runs in each, so the code it is rewritten to must hold in each."""
    view = c.view
    types = view.ops["module_type"].astype(str).to_numpy()
    ran = np.flatnonzero((view.source == view.source[e]) & (types == own_type) & (view.phase == "forward"))
    modules = set(view.module.astype(str))
    convs = {str(view.module[int(x)]) for x in np.flatnonzero(view.is_conv & (view.phase == "forward"))}
    held = True
    for m in dict.fromkeys(str(view.module[int(x)]) for x in ran):
        if m == own:
            continue
        at = path if m in ("", "<root>") else f"{m}.{path}"
        if at not in modules:
            return None
        held = held and at in convs
    return held


def method_of(fn: types.FunctionType, module_type: str) -> bool:
    """Whether ``fn`` is a method of the module class named ``module_type`` (or of a class it
    derives from), so that its ``self`` is the module the line's ops were recorded in: a line
    in a method of a plain object a module calls (RAFT's CorrBlock) has another ``self``."""
    if fn.__code__.co_varnames[:1] != ("self",):
        return False
    owner = fn.__globals__.get(fn.__qualname__.split(".<locals>")[-1].rpartition(".")[0])
    if not isinstance(owner, type) or not issubclass(owner, torch.nn.Module):
        return False
    seen, todo = set(), [owner]
    while todo:
        k = todo.pop()
        if k.__name__ == module_type:
            return True
        seen.add(k)
        todo += [s for s in k.__subclasses__() if s not in seen]
    return False


def method_ran(c: CauseView, module: str, module_type: str, alone: bool = False
               ) -> tuple[str, int, list[types.FunctionType], ast.FunctionDef | ast.AsyncFunctionDef] | None:
    """(file, line, the functions there, the method's syntax tree) of the method of ``module``
    (a ``module_type``) that its recorded forward ops ran in: the first recorded line held by
    methods of that class (with ``alone``, by one function only); None where none is."""
    view = c.view
    for x in np.flatnonzero((view.module == module) & (view.phase == "forward")):
        path, line = where(str(view.source[int(x)]))
        if path is None:
            continue
        fns = functions_at(path, line)
        if fns and (len(fns) == 1 or not alone) and all(method_of(fn, module_type) for fn in fns):
            break
    else:
        return None
    try:
        tree = ast.parse("".join(linecache.getlines(path)))
    except SyntaxError:
        return None
    method = next((n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
                   and n.lineno <= line <= (n.end_lineno or n.lineno) and n.name == fns[0].__name__), None)
    return None if method is None else (path, line, fns, method)
