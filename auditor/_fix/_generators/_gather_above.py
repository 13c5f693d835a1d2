"""Windows gathered back into a map in NHWC order, in the format of the map the module above was
given: the format signal where no convolution weight is in reach.

A window (or grid) attention cuts a map into tokens, attends, and gathers the tokens back into a
map with ``x.permute(...).reshape(B, C, H, W)``: a copy, written contiguous. The joins fix
gathers them in NHWC order instead (the same one copy; a channels_last view), which is exact,
but is a fix only where it follows the model's format: a model that runs contiguous would get a
channels_last map. Where the line's method reaches a convolution weight, the gather is copied
into that weight's format; a module that only permutes tokens (its own class, called by the
attention layer) reaches none, and its tokens carry no format in their strides.

The module that calls it was given the map itself, before it was cut into tokens: its own
strides are the signal. The fix is three edits, one candidate that :meth:`Fixes.verify` proves:
the gather in NHWC order where it is; in the calling method, the format of the map it was given,
read first (``_format = torch.channels_last if x.is_contiguous(memory_format=...) and not
x.is_contiguous() else torch.contiguous_format``); and the call of the gathering module made
contiguous in that format (no copy where the map was channels_last; where it was contiguous,
the copy into contiguous order the gather no longer makes).
"""

from __future__ import annotations

import ast
import functools
import textwrap
from collections.abc import Callable, Iterator
from dataclasses import replace

import numpy as np

from ..._display._text import short_source
from .. import _syntax as syn
from .._changes import EditSource, StatementEdit
from .._proposal import Candidate, CauseView, where
from .._registry import register_variant
from .._statements import candidate, facts_for, functions_at
from ._join_maps import permuted_into_map, permuted_map_in_nhwc_order
from ._join_reach import method_ran, weight_in_reach


@functools.cache  # one rewrite for one argument: two causes of one statement rewrite it once
def format_read_before(name: str, parameter: str) -> Callable:
    """The rewrite that puts ``name = <the format of parameter>`` (channels_last where that map
    is channels_last and not also contiguous, else contiguous) before the statement."""
    def rewrite(module, facts):

        cl = syn.memory_format(facts)
        t = cl.rpartition(".")[0]
        return syn.insert_before(module, f"{name} = {cl} if {parameter}.is_contiguous(memory_format={cl}) and not "
                                         f"{parameter}.is_contiguous() else {t}.contiguous_format")
    return rewrite


@functools.cache  # one rewrite for one argument: two causes of one statement rewrite it once
def call_made_in(attribute: str, name: str) -> Callable:
    """The rewrite of the one call of ``self.<attribute>(...)`` of a statement into
    ``self.<attribute>(...).contiguous(memory_format=<name>)``."""
    def rewrite(module, facts):
        import libcst as cst


        def is_call(node) -> bool:
            return (isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute)
                    and node.func.attr.value == attribute and syn.code(node.func.value) == "self")

        call = syn.the_one(syn.find(module, is_call), f"call of self.{attribute}")
        return syn.replace_node(module, call, syn.expr(f"{syn.code(call)}.contiguous(memory_format={name})"))
    return rewrite


def _caller(c: CauseView):
    """(file, the calling method, its ast node, the attribute the cause's module is called by)
    of the module one above the cause's, where its method that the recorded ops ran in calls
    the cause's module once, as ``self.<attribute>(...)``; None where not."""
    parent, _, attribute = str(c.module).rpartition(".")
    if not parent or not attribute.isidentifier():
        return None
    view = c.view
    hits = np.flatnonzero((view.module == parent) & (view.phase == "forward"))
    if not len(hits):
        return None
    found = method_ran(c, parent, str(view.ops["module_type"].iat[int(hits[0])]), alone=True)
    if found is None:
        return None
    path, _, fns, method = found
    calls = [n for n in ast.walk(method) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
             and n.func.attr == attribute and isinstance(n.func.value, ast.Name) and n.func.value.id == "self"]
    if len(calls) != 1:
        return None
    return path, fns, method, calls[0].lineno, attribute, parent


def _first_statement(method: ast.FunctionDef) -> int | None:
    """The line of the method's first statement that is not its docstring."""
    body = list(method.body)
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
            and isinstance(body[0].value.value, str):
        body = body[1:]
    return body[0].lineno if body and not isinstance(body[0], (ast.If, ast.For, ast.While, ast.With, ast.Try,
                                                               ast.FunctionDef, ast.ClassDef)) else None


def _gather_in_the_caller_s_format(c: CauseView) -> Candidate | None:

    found = _caller(c)
    if found is None:
        return None
    path, callers, method, call_line, attribute, parent = found
    args = method.args
    if len(args.args) < 2 or args.args[0].arg != "self":
        return None
    parameter = args.args[1].arg  # the map the calling module was given
    first = _first_statement(method)
    if first is None or first > call_line:
        return None
    here = None
    for before in (0, 1):  # the permute on the line, else on the statement before it
        here = candidate(c, "", permuted_map_in_nhwc_order(c.rank), before=before)
        if here is not None:
            break
    if here is None:
        return None
    try:
        facts = facts_for(c, callers)
        name = facts.new_name("_format")
        read = syn.statement_at(path, first)
        called = syn.statement_at(path, call_line)
        if read.first == called.first:
            return None
        edits = [(read, format_read_before(name, parameter), facts), (called, call_made_in(attribute, name), facts)]
        shown = [syn.rewrite(st, [(fn, f)]) for st, fn, f in edits]
    except syn.Refused:
        return None
    label = (f"the map gathered in NHWC order, and made where {short_source(f'{path}:{call_line}')} calls "
             f"self.{attribute}, in the format of {parameter}, the map {parent or 'the model'} was given")
    text = "\n".join([textwrap.dedent(here.suggestion)]
                     + [f"# and at {short_source(f'{path}:{st.first}')}:\n{textwrap.dedent(new).rstrip()}"
                        for (st, _, _), new in zip(edits, shown)])
    both = EditSource((*here.change.statements, *(StatementEdit(*e) for e in edits)))
    return Candidate(label, both, here.line, text)


@register_variant("windows gathered in the caller's format")
def windows_gathered_in_the_caller_s_format(c: CauseView, weight: str | None) -> Iterator[Candidate | None]:
    """Tokens gathered back into a map (a permute, then a reshape into the map) in a method that
    reaches no convolution weight: the gather in NHWC order made in the format of the map the
    calling module was given, tried before the other variants (it follows the model's format
    where they cannot)."""
    if c.view.phase[c.e] != "forward" or c.e != c.forward or c.path is None or weight is not None:
        return
    if permuted_into_map(c):
        yield _gather_in_the_caller_s_format(c)




#: how many ops back from a cause its map may have been gathered (a view or two between)
_STEPS = 4


def _gathered_before(c: CauseView) -> CauseView | None:
    """The cause seen at the op that gathered the map it reads: following the first input of
    the cause's op back through views, the first op whose line makes tokens into a map by a
    permute and a reshape (:func:`._generators._permuted_into_map`); None where there is none."""
    import copy

    view, tracer = c.view, c.tracer
    e = c.forward
    for _ in range(_STEPS):
        rows = tracer.input_rows(e)
        if not rows:
            return None
        p = int(tracer.graph.producer[rows[0]])
        if p < 0 or view.phase[p] != "forward":
            return None
        at = copy.copy(c)
        at.e = at.forward = p
        at.source = str(view.source[p])
        at.path, at.lineno = where(at.source)
        at.module, at.module_type = str(view.module[p]), str(view.ops["module_type"].iat[p])
        if at.path is not None and (at.path, at.lineno) != (c.path, c.lineno) and permuted_into_map(at):
            return at
        if not (view.kind[p] == "view" or str(view.op[p]).startswith(("aten._unsafe_view", "aten.view"))):
            return None
        e = p
    return None


@register_variant("gathered upstream")
def gathered_upstream(c: CauseView, weight: str | None) -> Iterator[Candidate | None]:
    """An op that reads a map tokens were gathered into on another line, in a method that
    reaches no convolution weight (the next block's norm or pool reads a window attention's
    map): the candidate of :func:`windows_gathered_in_the_caller_s_format` for that line, which
    makes the map this op reads one in the format of the map the attention was given."""
    if c.view.phase[c.e] != "forward" or c.e != c.forward or c.path is None:
        return
    at = _gathered_before(c)
    if at is None:
        return
    fns = functions_at(at.path, at.lineno)
    if not fns or weight_in_reach(at, fns) is not None:
        return
    found = _gather_in_the_caller_s_format(at)
    if found is not None:
        yield replace(found, label=f"where the map it reads was gathered, at {short_source(at.source)}: {found.label}")
