"""Join variants of a copy: a copy of a channels_last view dropped, or made in the format; the
copy made at the caller."""

from __future__ import annotations

import ast
import functools
import textwrap
import types
from collections.abc import Callable, Iterator

import libcst as cst
import torch

from ..._analysis._activations import parse_tuple
from ..._display._text import short_source
from .. import _syntax as syn
from .._changes import (
    EditSource,
    StatementEdit,
)
from .._proposal import Candidate, CauseView
from .._registry import register_variant
from .._statements import (
    candidate,
    facts_for,
    functions_at,
)
from ._copies import keep_format_in_copy
from ._join_reach import method_ran, weight_in_reach


def copied_map(c: CauseView) -> str | None:
    """How the cause's line copies (clone) a map of the images' rank, as the recorded strides of
    the copy's input show: ``"dense"`` where each sample is a dense map in the format already (a
    permuted view of NHWC data; the samples may lie apart, as the tokens of a sample with a class
    token do), so the copy only changes the format; ``"channels innermost"`` where its channels
    lie innermost but the map is not dense (tokens taken out of a larger row), so a copy into the
    format is a copy like the one it replaces; None where the line copies no such map."""
    t = c.view.tensors
    strides = t["strides"].to_numpy()
    found = None
    for x in c.members[:1] + [c.forward]:
        if not c.tracer.op[x].startswith("aten.clone"):
            continue
        rows = c.tracer.input_rows(x)
        if not rows:
            continue
        shape, stride = parse_tuple(c.tracer.shape[rows[0]]), parse_tuple(strides[rows[0]])
        if len(shape) != c.rank or len(stride) != len(shape):
            continue
        meta = torch.empty_strided(shape, stride, device="meta")[0]
        if meta.movedim(0, -1).is_contiguous() and not meta.is_contiguous():
            return "dense"
        if meta.shape[0] > 1 and meta.stride(0) == 1 and all(s > 1 or n == 1 for s, n in zip(meta.stride()[1:], meta.shape[1:])):
            found = "channels innermost"
    return found


def copy_at_the_call(c: CauseView) -> Candidate | None:
    """Where the line that copies a channels_last view is in a function no weight is in reach
    of (a method of a plain object the module calls: RAFT's CorrBlock), the copy dropped there
    and made where the module's own method calls that function, in the format of a weight in
    reach there: two edits, one candidate. None where the call is not one statement of one
    method of the module."""

    fns = functions_at(c.path, c.lineno)
    if len(fns) != 1:
        return None
    site = _call_site(c, fns[0].__name__)
    if site is None:
        return None
    path, line, callers = site
    weight = weight_in_reach(c, callers)
    if weight is None:
        return None
    label = (f"the copy of the channels_last view dropped, and made where {short_source(f'{path}:{line}')} "
             f"calls {fns[0].__name__}, in the format of {weight}")
    here = candidate(c, label, drop_copy_of_permuted)
    if here is None:
        return None
    try:
        statement = syn.statement_at(path, line)
        facts = facts_for(c, callers)
        rewrite = call_in_format_of(fns[0].__name__, weight)
        new = syn.rewrite(statement, [(rewrite, facts)])
    except syn.Refused:
        return None
    # each statement from the first column, as the display shows one alone (it dedents code)
    shown = (f"{textwrap.dedent(here.suggestion)}\n# and at {short_source(f'{path}:{statement.first}')}:\n"
             f"{textwrap.dedent(new).rstrip()}")
    both = EditSource((*here.change.statements, StatementEdit(statement, rewrite, facts)))
    return Candidate(label, both, here.line, shown)


def _call_site(c: CauseView, name: str) -> tuple[str, int, list[types.FunctionType]] | None:
    """(file, line, the functions there) of the one call of ``name`` in the method of the
    cause's module that its recorded ops ran in, as the recorded lines of the module's own ops
    show."""
    found = method_ran(c, str(c.module), str(c.module_type))
    if found is None:
        return None
    path, _, fns, method = found
    calls = [n.lineno for n in ast.walk(method) if isinstance(n, ast.Call)
             and ((isinstance(n.func, ast.Attribute) and n.func.attr == name)
                  or (isinstance(n.func, ast.Name) and n.func.id == name))]
    return (path, calls[0], fns) if len(calls) == 1 else None


@functools.cache  # one rewrite for one argument: two causes of one statement rewrite it once
def copy_in_format_of(weight: str) -> Callable[[cst.Module, syn.Facts], cst.Module]:
    """``.contiguous()`` (or a copy into ``contiguous_format``) of a map, made in the format of
    ``weight`` (a convolution's weight, as code; :func:`format_of_weight`) instead: no copy where
    the map is a dense view in the format already and the model runs channels_last, the same one
    copy into the format where its channels lie innermost but it is not dense, the copy it always
    made where the model runs contiguous (joins)."""
    def rewrite(module: cst.Module, facts: syn.Facts) -> cst.Module:
        call = syn.the_one(syn.find(module, syn.is_copy_into_contiguous), "copy into contiguous order (.contiguous())")
        return syn.replace_node(module, call, syn.with_memory_format(call, syn.expr(syn.format_of_weight(weight, facts))))
    return rewrite


@functools.cache
def call_in_format_of(name: str, weight: str) -> Callable[[cst.Module, syn.Facts], cst.Module]:
    """The one call of ``name`` in the statement, its result made contiguous in the format of
    ``weight`` (:func:`format_of_weight`): the copy a function no longer makes, made where the
    caller, which knows the format, calls it (joins)."""
    def rewrite(module: cst.Module, facts: syn.Facts) -> cst.Module:
        call = syn.the_one(syn.find(module, lambda n: isinstance(n, cst.Call) and syn.callee(n) == name), f"call of {name}")
        return syn.replace_node(module, call, syn.expr(f"{syn.code(call)}.contiguous(memory_format={syn.format_of_weight(weight, facts)})"))
    return rewrite


def drop_copy_of_permuted(module: cst.Module, facts: syn.Facts) -> cst.Module:
    """``x.permute(...).contiguous()`` (or ``.transpose``) written as the permuted view alone:
    the copy dropped, where the recorded strides show the view is already a dense map in the
    format (joins)."""
    def is_copy(node) -> bool:
        if not (isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute)
                and node.func.attr.value == "contiguous" and not node.args):
            return False
        inner = node.func.value
        return isinstance(inner, cst.Call) and isinstance(inner.func, cst.Attribute) and inner.func.attr.value in (
            "permute", "transpose")

    call = syn.the_one(syn.find(module, is_copy), ".contiguous() of a permuted view")
    return syn.replace_node(module, call, call.func.value)


@register_variant("a copy of a channels_last view")
def a_copy_of_a_channels_last_view(c: CauseView, weight: str | None) -> Iterator[Candidate | None]:
    if copied_map(c) != "dense":
        return
    yield candidate(c, "the copy of the channels_last view dropped", drop_copy_of_permuted)
    if weight:
        yield candidate(c, f"the copy of the channels_last view made in the format of {weight}",
                        copy_in_format_of(weight))


@register_variant("the copy made at the caller")
def the_copy_made_at_the_caller(c: CauseView, weight: str | None) -> Iterator[Candidate | None]:
    if copied_map(c) == "dense" and not weight and c.path:
        yield copy_at_the_call(c)


@register_variant("a copy of channels-innermost tokens")
def a_copy_of_channels_innermost_tokens(c: CauseView, weight: str | None) -> Iterator[Candidate | None]:
    if copied_map(c) != "channels innermost":
        return
    if weight:
        yield candidate(c, f"the copy made in the format of {weight}", copy_in_format_of(weight))
    yield candidate(c, f"the copy made in torch.{c.cl_name}, a format-specific edit (code that runs contiguous "
                       f"copies into {c.cl_name} too)", keep_format_in_copy)
