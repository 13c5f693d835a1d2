"""A new map that images are written into (a canvas), made in the format of the tensor it is made
like.

A function that gathers maps into one tensor often makes it first, empty, with
``torch.zeros(size, dtype=x.dtype, device=x.device)`` (or ``x.new_zeros(size)``), then writes
the maps into it by index (``out[idx] = y``). A factory writes contiguous, whatever the maps it
is made for: in a model that runs channels_last, the canvas is a contiguous map that the next
convolution converts, and every map written into it is converted on the way in. The code that
makes the canvas already names the tensor it is made like (its dtype and device come from it):
:func:`canvas_in_format_of` makes the canvas with ``torch.empty(..., memory_format=<that
tensor's format>)``, then fills it as the factory did (``zero_()``, ``fill_(v)``): the same
values, no copy (a factory is an empty tensor filled, too), and contiguous where that tensor is
contiguous, so a model that runs contiguous keeps its layout.

The fix (:func:`_canvas_fix`) is offered for a ``joins`` cause made by a factory whose map is
then written in place with maps of its own channels and size (the recorded data flow), where
the statement names such a tensor (the source's data flow: ``x.new_zeros``, ``device=x.device``,
or a name assigned from ``x.device`` before it in the function).
"""

from __future__ import annotations

import ast
import functools
import linecache
from collections.abc import Callable

from ..._analysis._activations import parse_tuple
from .. import _syntax as syn
from .._proposal import CauseView, Proposal
from .._registry import register_fix
from .._statements import functions_at, statement_edit

#: factory -> how its values are written into an empty tensor (the argument after the size, for
#: a fill value); None: nothing to write
_FILLS = {"zeros": ".zero_()", "ones": ".fill_(1)", "empty": "", "full": ".fill_({value})"}


def _factory_of(op: str) -> str | None:
    """``zeros`` for ``aten.zeros.default`` or ``aten.new_zeros.default``; None for another op."""
    packet = op.removeprefix("aten.").split(".")[0].removeprefix("new_")
    return packet if packet in _FILLS else None


def _written_with_maps(c: CauseView) -> bool:
    """Whether the map the cause's factory made is written in place (``out[idx] = y``, a copy
    into a slice) with maps of its own channels and spatial size, as the recorded ops show."""
    tracer, view = c.tracer, c.view
    out = tracer.output_row(c.e)
    if out < 0:
        return False
    shape = parse_tuple(tracer.shape[out])
    if len(shape) != c.rank:
        return False
    todo, seen = [c.e], set()
    while todo:
        e = todo.pop()
        for k in view.consumers.get(e, []):
            if k in seen or view.phase[k] != "forward":
                continue
            seen.add(k)
            name = str(tracer.op[k]).removeprefix("aten.").split(".")[0]
            if name.endswith("_") and not name.startswith("_"):  # written in place
                for r in tracer.input_rows(k)[1:]:
                    other = parse_tuple(tracer.shape[r])
                    if len(other) == c.rank and tuple(other[1:]) == tuple(shape[1:]) and tracer.size[r] > 0:
                        return True
                todo.append(k)
            elif view.kind[k] == "view":  # a slice of it, written next
                todo.append(k)
    return False


def _simple_tensor(node: ast.AST) -> bool:
    """A name, an attribute of one, or an item of one by a literal index (``x``, ``self.x``,
    ``xs[0]``): read twice, it reads the same tensor and costs nothing."""
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        if isinstance(node, ast.Subscript) and not (isinstance(node.slice, ast.Constant)
                                                    and isinstance(node.slice.value, int)):
            return False
        node = node.value
    return isinstance(node, ast.Name)


def _owner_of(node: ast.AST, attributes: tuple[str, ...]) -> ast.AST | None:
    """``x`` of ``x.device`` (or ``x.dtype``), where ``x`` is a simple tensor expression."""
    if isinstance(node, ast.Attribute) and node.attr in attributes and _simple_tensor(node.value):
        return node.value
    return None


def _enclosing_function(tree: ast.AST, line: int) -> ast.AST | None:
    found = None
    for n in ast.walk(tree):
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.lineno <= line <= (n.end_lineno or n.lineno):
            if found is None or n.lineno > found.lineno:
                found = n
    return found


def _assigned_from(function: ast.AST, name: str, line: int) -> ast.AST | None:
    """The tensor ``x`` whose ``.device`` or ``.dtype`` the last assignment to ``name`` before
    ``line`` in ``function`` takes (``device = x.device``, ``dtype, device = x.dtype,
    x.device``); None where there is none."""
    last = None
    for n in ast.walk(function):
        if not isinstance(n, ast.Assign) or n.lineno >= line or len(n.targets) != 1:
            continue
        target, value = n.targets[0], n.value
        pairs = []
        if isinstance(target, ast.Name):
            pairs = [(target, value)]
        elif isinstance(target, ast.Tuple) and isinstance(value, ast.Tuple) and len(target.elts) == len(value.elts):
            pairs = list(zip(target.elts, value.elts))
        for t, v in pairs:
            if isinstance(t, ast.Name) and t.id == name and (last is None or n.lineno > last[0]):
                last = (n.lineno, _owner_of(v, ("device", "dtype")))
    return last[1] if last else None


def made_like(path: str, line: int) -> str | None:
    """The tensor the factory call on ``path:line`` is made like, as source text: the receiver
    of ``x.new_zeros(...)``, or the tensor whose ``.device`` (else ``.dtype``) its ``device=``
    (``dtype=``) argument is, directly or through a name assigned from it earlier in the
    function. None where the statement names no such tensor (or more than one factory call)."""
    text = "".join(linecache.getlines(path))
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return None
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and n.lineno <= line <= (n.end_lineno or n.lineno)
             and isinstance(n.func, ast.Attribute) and _factory_of(n.func.attr) is not None]
    if len(calls) != 1:
        return None
    call = calls[0]
    owner = None
    if call.func.attr.startswith("new_"):
        owner = call.func.value if _simple_tensor(call.func.value) else None
    else:
        function = _enclosing_function(tree, line)
        for key in ("device", "dtype"):
            value = next((k.value for k in call.keywords if k.arg == key), None)
            if value is None:
                continue
            owner = _owner_of(value, (key,))
            if owner is None and isinstance(value, ast.Name) and function is not None:
                owner = _assigned_from(function, value.id, call.lineno)
            if owner is not None:
                break
    return ast.get_source_segment(text, owner) if owner is not None else None


@functools.cache  # one rewrite for one argument: two causes of one statement rewrite it once
def canvas_in_format_of(like: str) -> Callable:
    """The rewrite of the one factory call of a statement (``torch.zeros(size, dtype=..,
    device=..)``, ``torch.ones``, ``torch.full``, ``torch.empty``, or ``x.new_zeros(size)`` and
    its kin) into ``torch.empty(size, .., memory_format=<the format of like>)`` filled as the
    factory fills (``.zero_()``, ``.fill_(v)``): the same values, and the layout of ``like`` (a
    tensor, as code), channels_last where it is a channels_last map and not also contiguous,
    contiguous otherwise. A statement rewrite (``rewrite(module, facts)``)."""
    def rewrite(module, facts):
        import libcst as cst


        def is_factory(node) -> bool:
            return (isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute)
                    and _factory_of(node.func.attr.value) is not None)

        call = syn.the_one(syn.find(module, is_factory), "call of a tensor factory (torch.zeros(...))")
        name = call.func.attr.value
        kind = _factory_of(name)
        method = name.startswith("new_")
        if not method and syn.is_method(call, facts.torch):
            raise syn.Refused(f"{syn.code(call.func)} is no torch factory")
        if method and not syn.is_method(call, facts.torch):
            raise syn.Refused(f"{syn.code(call.func)} is no tensor's method")
        args = [a for a in call.args if a.keyword is None]
        keywords = {a.keyword.value: a for a in call.args if a.keyword is not None}
        if any(a.star for a in call.args) or "memory_format" in keywords or "out" in keywords \
                or "requires_grad" in keywords:
            raise syn.Refused("the factory call takes *args, out=, requires_grad= or a memory_format already")
        if kind == "full":
            value = keywords.pop("fill_value", None)
            if value is None:
                if len(args) != 2:
                    raise syn.Refused("the call of full has no size and fill value to read")
                value = args.pop()
            fill = _FILLS[kind].format(value=syn.code(value.value))
        else:
            fill = _FILLS[kind]
        if not args:
            raise syn.Refused("the factory call has no size")
        t = syn.memory_format(facts).rpartition(".")[0]
        size = ", ".join(syn.code(a.value) for a in args)
        rest = [f"{k}={syn.code(a.value)}" for k, a in keywords.items() if k != "fill_value"]
        if method:  # x.new_zeros(size): x's dtype and device, unless given
            owner = syn.code(call.func.value)
            rest = [*(f"{k}={owner}.{k}" for k in ("dtype", "device") if k not in keywords), *rest]
        cl = syn.memory_format(facts)
        fmt = f"{cl} if {like}.is_contiguous(memory_format={cl}) and not {like}.is_contiguous() else {t}.contiguous_format"
        text = f"{t}.empty({', '.join([size, *rest, f'memory_format={fmt}'])}){fill}"
        return syn.replace_node(module, call, syn.expr(text))
    return rewrite


@register_fix("canvas in the format")
def _canvas_fix(c: CauseView) -> Proposal | None:
    """A new map (made by a factory: ``torch.zeros``, ``x.new_zeros``) that joins the path in
    contiguous order, where the recorded ops write maps of its channels and size into it in place
    and its statement names the tensor it is made like: made in that tensor's format (no copy;
    contiguous where that tensor is)."""
    if c.view.phase[c.e] != "forward" or c.e != c.forward or c.path is None:
        return None
    kind = _factory_of(str(c.tracer.op[c.e]))
    if kind is None or c.tracer.input_rows(c.e) and not str(c.tracer.op[c.e]).startswith("aten.new_"):
        return None
    if not _written_with_maps(c) or not functions_at(c.path, c.lineno):
        return None
    like = made_like(c.path, c.lineno)
    if like is None:
        return None
    _, outs = c.shapes(c.e)
    made = "x".join(map(str, outs[0])) if outs else "?"
    found = statement_edit(c, canvas_in_format_of(like), detail=(
        f"{c.what}: the map ({made}) is made contiguous by {kind}, then maps are written into it in place; made "
        f"with torch.empty in the format of {like}, the tensor its statement makes it like, and filled as {kind} "
        "fills it, it is the same values in the format the maps written into it come in (contiguous where "
        f"{like} is)"))
    return found if found.automatic else None

