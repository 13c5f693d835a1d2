"""A join of maps in different formats: the odd tensor converted to the others' format."""

from __future__ import annotations

import functools
import linecache
from collections.abc import Callable

from .. import _syntax as syn
from .._changes import (
    EditSource,
)
from .._proposal import CauseView, Proposal
from .._registry import register_fix
from .._statements import (
    candidate,
)


@register_fix("odd tensor converted")
def _mixed_join_fix(c: CauseView) -> Proposal:
    """A ``cat`` (or ``stack``) of maps in the format and a tensor in another format: the odd
    tensor, as the recorded formats of every call at the line show it, converted to the format
    of one of the others before the join. The conversion follows that tensor's format (no copy
    where the model runs contiguous), so the edit is layout-neutral; it copies the odd tensor
    (usually the small one) instead of the join writing every map in the other format."""
    odd, ref = _odd_joined(c)
    detail = c.row.fix
    if not odd or ref is None:
        line = c.source_line()
        return Proposal(EditSource, detail, line=line,
                        reason="the calls at this line join tensors in different formats at different places, so no "
                               "one of them can be converted at the line")
    if c.path is None:
        return Proposal(EditSource, f"{detail} (audit with record_source=True for the line)",
                        reason="the audit has no source line (audit with record_source=True)")
    found = candidate(c, "the odd tensor converted to the others' format", _convert_joined(odd, ref))
    if found is None:
        line = linecache.getline(c.path, c.lineno).rstrip("\n")
        places = ", ".join(map(str, odd))
        if ref > min(odd):
            why = (f"the odd tensor (at index {places}) comes before the tensor in the format (at index {ref}) in the "
                   "list, which is no plain name, so its format cannot be read where the odd one is converted: name "
                   "that tensor in a statement before the join, then convert the odd one to its format")
        else:
            why = (f"this line has no one call of cat or stack with a list of {_count_joined(c)} tensors written out, "
                   f"whose odd one (at index {places}) could be converted")
        return Proposal(EditSource, detail, line=line, reason=why)
    return Proposal(EditSource, detail, line=found.line, suggestion=found.suggestion, change=found.change)


def _joined_rows(c: CauseView, e: int) -> list[int]:
    """The rows of the tensors event ``e`` joins, in the order of its list."""
    t = c.tracer
    return [r for r in t.input_rows(e) if t.arg[r] == "tensors"]


def _count_joined(c: CauseView) -> int:
    return len(_joined_rows(c, c.e))


def _odd_joined(c: CauseView) -> tuple[tuple[int, ...], int | None]:
    """(the places in the list of the tensors the join reads off the format, in every call of
    the cause at its line; the place of the largest tensor in the format in all of them, None
    where there is none)."""
    t = c.tracer
    odd: set[int] = set()
    kept: set[int] | None = None
    sizes: dict[int, int] = {}
    for e in c.members:
        rows = _joined_rows(c, e)
        if len(rows) != _count_joined(c):
            return (), None
        bad = set(t.mixed_join(e))
        odd |= {i for i, r in enumerate(rows) if r in bad}
        cl = {i for i, r in enumerate(rows) if t.label[r].startswith("channels_last") and t.size[r] > 0}
        kept = cl if kept is None else kept & cl
        for i, r in enumerate(rows):
            sizes[i] = max(sizes.get(i, 0), int(t.size[r]))
    kept = (kept or set()) - odd
    ref = max(sorted(kept), key=lambda i: sizes[i]) if kept else None
    return tuple(sorted(odd)), ref


@functools.cache  # one rewrite for one argument: two causes of one statement rewrite it once
def _convert_joined(odd: tuple[int, ...], ref: int) -> Callable:
    """The rewrite of a join whose tensors at places ``odd`` of its list are off the format:
    each written ``x.contiguous(memory_format=<cl> if ref.is_contiguous(memory_format=<cl>)
    else torch.contiguous_format)``, ``ref`` the tensor at place ``ref`` (named by a walrus
    where it is no plain name and comes first; refused where it comes after them)."""
    def rewrite(module, facts):
        import libcst as cst


        def is_join(node) -> bool:
            if not (isinstance(node, cst.Call) and syn.callee(node) in _JOIN_CALLS and node.args):
                return False
            first = node.args[0].value
            return isinstance(first, (cst.List, cst.Tuple)) and len(first.elements) > max(*odd, ref)

        call = syn.the_one(syn.find(module, is_join), "cat or stack of a list of tensors written out")
        items = list(call.args[0].value.elements)
        if any(isinstance(x, cst.StarredElement) for x in items):
            raise syn.Refused("the list of tensors has a starred element")
        cl = syn.memory_format(facts)
        ref_node = items[ref].value
        if syn.simple(ref_node):
            name = syn.code(ref_node)
        elif ref < min(odd):
            name = facts.new_name("_joined")
            items[ref] = items[ref].with_changes(value=syn.expr(f"({name} := {syn.code(ref_node)})"))
        else:
            raise syn.Refused("the tensor in the format comes after the odd one and is no plain name")
        for i in odd:
            x = items[i].value
            text = syn.code(x)
            atom = isinstance(x, (cst.Name, cst.Attribute, cst.Call, cst.Subscript)) or x.lpar
            items[i] = items[i].with_changes(value=syn.expr(
                f"{text if atom else f'({text})'}.contiguous(memory_format={cl} if {name}.is_contiguous("
                f"memory_format={cl}) else {facts.torch}.contiguous_format)"))
        joined = call.args[0].value.with_changes(elements=items)
        new = call.with_changes(args=[call.args[0].with_changes(value=joined), *call.args[1:]])
        return syn.replace_node(module, call, new)
    return rewrite


#: the calls that join a list of tensors along a dimension
_JOIN_CALLS = ("cat", "concat", "concatenate", "stack")
