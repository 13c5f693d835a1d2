"""A group norm of a (B, C, L) view of a channels_last map, run on its (B, C, 1, L) view.

Attention blocks flatten a map to tokens and norm them with ``group_norm(x.view(B, C, H*W))``
(or the tokens transposed back to (B, C, L)). Of a channels_last map that view has its channels
innermost (strides (L·C, 1, C)), a layout a 3-D tensor has no format for: torch's group norm
suggests the contiguous format for it and writes its output, and in backward the gradient of
its input, contiguous, which the convolution before it then converts. The same view with a
height of 1 inserted, ``x.unsqueeze(2)`` (strides (L·C, 1, L·C, C)), is a channels_last 4-D
map, which the norm computes and differentiates in channels_last; ``.squeeze(2)`` of its output
is the (B, C, L) result, the same values (the same elements per group), with its channels
innermost as its input's were. The rewrite branches on the input's own strides at run time
(``x.stride(1) == 1``: its channels innermost): any other input runs the call as it was, so a
model that runs contiguous computes exactly as before.

(A size-1 dimension inserted last, ``unsqueeze(-1)``, would not do: its stride of 1 makes the
map ambiguous, and torch then suggests the contiguous format.)
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from ..._analysis._activations import parse_tuple
from .. import _syntax as syn
from .._proposal import CauseView, Proposal
from .._registry import register_fix
from .._statements import statement_edit

#: methods of a tensor that change its view or copy it: not the norm's call
_TENSOR_METHODS = frozenset({"transpose", "permute", "view", "reshape", "contiguous", "flatten", "unflatten",
                             "unsqueeze", "squeeze", "to", "float", "half", "double", "type", "movedim", "mT"})


def _channels_innermost(shape: tuple[int, ...], strides: tuple[int, ...]) -> bool:
    """A (B, C, L) tensor whose channels are innermost and dense: strides (L·C, 1, C), with C
    and L above 1 (else the layout is both orders at once)."""
    if len(shape) != 3 or len(strides) != 3:
        return False
    b, ch, n = shape
    return ch > 1 and n > 1 and strides[1] == 1 and strides[2] == ch and (b == 1 or strides[0] == ch * n)


def _norm_input(tracer, e: int) -> int:
    """The row of the tensor the norm ``e`` was called with; -1 without one. Where the norm's
    own module copied its input first (some releases' ``group_norm`` calls ``.contiguous()``
    before the kernel), the row of the tensor that copy read."""
    rows = tracer.input_rows(e)
    if not rows:
        return -1
    made_by = int(tracer.graph.producer[rows[0]])
    if made_by >= 0 and tracer.copy[made_by] and tracer.module[made_by] == tracer.module[e]:
        copied = tracer.input_rows(made_by)
        return copied[0] if copied else rows[0]
    return rows[0]


@functools.cache  # one rewrite for one argument: two causes of one statement rewrite it once
def norm_on_4d_view() -> Callable:
    """The rewrite of the one norm call of a statement (``norm(x)``, ``F.group_norm(x, g, ..)``:
    the one call that is no tensor's view or copy method) into ``(norm(x.unsqueeze(2)).squeeze(2)
    if x.stride(1) == 1 else norm(x))``: where the input's channels are innermost (its own
    strides say so at run time), the norm of the (B, C, 1, L) view, the same values; otherwise
    the call as it was, so a run in another layout computes exactly as before. A statement
    rewrite (``rewrite(module, facts)``)."""
    def rewrite(module, facts):
        import libcst as cst


        def is_norm(node) -> bool:
            if not isinstance(node, cst.Call) or syn.callee(node) in _TENSOR_METHODS:
                return False
            args = [a for a in node.args if a.keyword is None]
            return bool(args) and not args[0].star

        call = syn.the_one(syn.find(module, is_norm), "call of a norm (norm(x))")
        first = next(a for a in call.args if a.keyword is None)
        x = first.value
        # the input read once: a name as it is, anything else named where the branch reads it
        name = syn.code(x) if syn.simple(x) else facts.new_name("_x")
        test = name if syn.simple(x) else f"({name} := {syn.code(x.with_changes(lpar=[], rpar=[]))})"

        def called(arg: str) -> str:
            return syn.code(call.with_changes(args=[a.with_changes(value=syn.expr(arg)) if a is first else a
                                                    for a in call.args]))

        text = f"({called(f'{name}.unsqueeze(2)')}.squeeze(2) if {test}.stride(1) == 1 else {called(name)})"
        return syn.replace_node(module, call, syn.expr(text))
    return rewrite


@register_fix("group norm on the (B, C, 1, L) view")
def _norm_view_fix(c: CauseView) -> Proposal | None:
    """A group norm (forward, or its backward) whose input was a (B, C, L) tensor with its
    channels innermost (a view of a channels_last map), as its recorded strides show: run on
    the (B, C, 1, L) view, a channels_last map, which the norm keeps in the format in forward
    and backward."""
    op = str(c.tracer.op[c.forward])
    if not op.startswith("aten.native_group_norm") or c.path is None:
        return None
    row = _norm_input(c.tracer, c.forward)
    if row < 0:
        return None
    t = c.view.tensors
    shape, strides = parse_tuple(c.tracer.shape[row]), parse_tuple(str(t["strides"].iat[row]))
    if not _channels_innermost(tuple(shape), tuple(strides)):
        return None
    made = "x".join(map(str, shape))
    found = statement_edit(c, norm_on_4d_view(), detail=(
        f"{c.what}: the group norm reads a ({made}) tensor with its channels innermost (a view of a "
        f"{c.cl_name} map), which has no format of its own rank, so torch writes its output and its input's "
        "gradient contiguous; on the (B, C, 1, L) view, a channels_last map, it computes the same values and keeps "
        "the format in forward and backward (contiguous where the tensor is)"))
    return found if found.automatic else None

