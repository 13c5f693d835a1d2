"""Slices of the channels: taken as one split, or skipped where a slice keeps them all."""

from __future__ import annotations

import libcst as cst

from .. import _syntax as syn
from .._changes import (
    EditSource,
)
from .._proposal import CauseView, Proposal
from .._registry import register_fix
from .._statements import (
    statement_edit,
    statements_edit,
)


@register_fix("split keeping the format")
def _format_keeping_split_fix(c: CauseView) -> Proposal | None:
    """A split of a map (``chunk``, ``split``) whose backward joins its parts' gradients
    contiguous: called as ``keep_format``'s, the same views, whose backward writes the gradient
    in the map's format."""
    from .._replace import SPLIT_OPS, ReplaceSplit

    if str(c.tracer.op[c.forward]) not in SPLIT_OPS:
        return None
    found = statement_edit(c, ReplaceSplit(), detail=(
        f"{c.what}: the split's backward joins its parts' gradients with one cat, contiguous where they come back "
        "in different orders or a part is not used; auditor.keep_format's split of the same views writes the "
        "gradient in the format of the tensor it split"))
    return found if found.automatic else None


@register_fix("slices as a split")
def _slice_fix(c: CauseView) -> Proposal:
    if c.tracer.op[c.forward].startswith(SPLITS):
        return Proposal(EditSource, c.row.fix, line=c.source_line(),
                        reason="the channels are split already: the contiguous zeros come from PyTorch's own backward "
                               "of a split or chunk, for the part that is not used, and no rewrite of the line keeps "
                               "the format")
    found = statement_edit(c, split_the_channels)
    if found.automatic or c.path is None or found.refused is not NotAPartition:
        return found  # the statement has no slices of one tensor to take together with others
    return statements_edit(c, split_the_channels, found, span=_SLICE_SPAN)


#: the most consecutive statements whose slices are taken together as one split
_SLICE_SPAN = 4


class NotAPartition(syn.Refused):
    """Slices of one tensor that, on their statement alone, do not cut all its channels: the
    statements around it may."""


#: ops whose backward writes zeros for the parts that are not used (PyTorch's own)
SPLITS = ("aten.split", "aten.chunk", "aten.unbind", "aten.split_with_sizes", "aten.tensor_split")


@register_fix("whole slice skipped")
def _whole_slice_fix(c: CauseView) -> Proposal | None:
    """A slice that keeps every channel, whose backward (this torch's ``slice_backward``) writes
    its gradient contiguous: skipped when it keeps them all."""
    forward = c.forward
    if not c.tracer.op[forward].startswith("aten.slice") or c.rank < 4:
        return None
    ins, outs = c.shapes(forward)
    if not ins or not outs or ins[0] != outs[0]:
        return None
    return statement_edit(c, skip_the_whole_slice, detail=(
        f"{c.what}: the slice keeps every channel, but its backward writes the gradient contiguous; skip it when "
        f"it keeps them all"))


def _channel_slice(node) -> bool:
    """``x[:, a:b]`` (more dimensions whole): a slice of dimension 1 alone, without a step."""
    if not isinstance(node, cst.Subscript) or len(node.slice) < 2:
        return False
    first, second = (e.slice for e in node.slice[:2])
    full = isinstance(first, cst.Slice) and first.lower is None and first.upper is None and first.step is None
    rest = all(isinstance(e.slice, cst.Slice) and e.slice.lower is None and e.slice.upper is None
               for e in node.slice[2:])
    return full and rest and isinstance(second, cst.Slice) and second.step is None


def split_the_channels(module: cst.Module, facts: syn.Facts) -> cst.Module:
    """Slices that cut one tensor's channels into consecutive parts, ``x[:, :k]`` and
    ``x[:, k:]``, become the parts of ``x.split([k, x.shape[1] - k], dim=1)``, taken once
    before the line: split's backward is a cat, which keeps the format, where a slice's writes
    its zeros contiguous (channel_slice). The slices may lie on consecutive statements of one
    block (``a = x[:, :k]`` then ``b = x[:, k:]``), rewritten together, where none of them
    assigns a name the slices read."""
    found = syn.find(module, _channel_slice)
    bases: dict[str, list] = {}
    for node in found:
        bases.setdefault(syn.code(node.value), []).append(node)
    where = "these statements" if _statement_count(module) > 1 else "this line"
    if len(bases) != 1:
        raise syn.Refused(f"the slices of {where} are not of one tensor's channels" if bases else
                      f"{where} has no slice of the channels (x[:, a:b])")
    (base, parts), = bases.items()
    if not syn.simple(parts[0].value):
        raise syn.Refused(f"the sliced tensor ({base}) is an expression, not a name: split it by hand")
    bounds = [tuple(syn.code(b) if b is not None else None for b in (n.slice[1].slice.lower, n.slice[1].slice.upper))
              for n in parts]
    chain, left = [], list(range(len(parts)))
    start = next((i for i in left if bounds[i][0] in (None, "0")), None)
    while start is not None:
        chain.append(start)
        left.remove(start)
        upper = bounds[start][1]
        start = next((i for i in left if upper is not None and bounds[i][0] == upper), None)
    if not chain or left or bounds[chain[-1]][1] is not None:
        raise NotAPartition("the slices do not cut the channels into consecutive parts that cover them all: the part not "
                      "used would get contiguous zeros from PyTorch's own backward of a split too")
    if _statement_count(module) > 1:
        read = {n.value for p in parts for n in syn.find(p, lambda n: isinstance(n, cst.Name))}
        written = read & _assigned(module)
        if written:
            raise syn.Refused(f"these statements assign {sorted(written)[0]}, which the slices read: they cannot be taken "
                          "together before them")
    sizes = []
    for i in chain:
        lo, hi = bounds[i][0] or "0", bounds[i][1]
        if hi is None:
            sizes.append(f"{base}.shape[1] - {lo}" if lo != "0" else f"{base}.shape[1]")
        else:
            sizes.append(hi if lo == "0" else f"{hi} - ({lo})")
    names = [facts.new_name(f"{base.split('.')[-1]}_{k}") for k in range(len(chain))]
    module = syn.replace_nodes(module, [(parts[i], cst.Name(name)) for name, i in zip(names, chain)])
    return syn.insert_before(module, f"{', '.join(names)}{',' if len(names) == 1 else ''} = "
                                  f"{base}.split([{', '.join(sizes)}], dim=1)\n", first=True)


def _statement_count(module: cst.Module) -> int:
    body, index = syn.statement_of(module)
    return index + 1


def _assigned(module: cst.Module) -> set[str]:
    """The names the statements of ``module`` bind (assignment targets, augmented and
    annotated ones, and walrus targets)."""
    names: set[str] = set()
    for node in syn.find(module, lambda n: isinstance(n, (cst.AssignTarget, cst.AugAssign, cst.AnnAssign,
                                                        cst.NamedExpr))):
        target = node.target
        names |= {n.value for n in syn.find(target, lambda n: isinstance(n, cst.Name))} if not isinstance(
            target, cst.Name) else {target.value}
    return names


def skip_the_whole_slice(module: cst.Module, facts: syn.Facts) -> cst.Module:
    """A slice of the leading channels, ``x[:, :k]``, is skipped when it keeps them all
    (``x if x.shape[1] == k else x[:, :k]``): the same values in the same memory, without the
    slice whose backward writes the gradient contiguous, and without a view for a later
    in-place write to go through."""
    def leading_slice(node) -> bool:
        if not _channel_slice(node):
            return False
        second = node.slice[1].slice
        return second.upper is not None and (second.lower is None or syn.code(second.lower) == "0")

    node = syn.the_one(syn.find(module, leading_slice), "slice of the leading channels (x[:, :k])")
    if not syn.simple(node.value):
        raise syn.Refused(f"the sliced tensor ({syn.code(node.value)}) is an expression, not a name: skip the slice by hand")
    base, k = syn.code(node.value), syn.code(node.slice[1].slice.upper)
    return syn.replace_node(module, node, syn.expr(f"({base} if {base}.shape[1] == {k} else {syn.code(node)})"))
