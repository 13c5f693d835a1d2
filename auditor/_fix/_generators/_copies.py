"""Copies: an explicit copy into contiguous order, an in-place op on a view, a weight rebuilt in
another order."""

from __future__ import annotations

from dataclasses import replace

import libcst as cst
import numpy as np

from .. import _syntax as syn
from .._proposal import CauseView, Proposal
from .._registry import register_fix
from .._statements import (
    statement_edit,
)


@register_fix("explicit copy")
def _explicit_copy_fix(c: CauseView) -> Proposal:
    frm = str(c.view.ops.at[c.e, "from_format"])
    detail = (f"{c.what} copies the activation into contiguous order between two convolutions; keep it "
              f"{c.cl_name}" + (f" (or remove the call: its input is already dense {c.cl_name})" if frm == c.cl_name
                                else ""))
    # an input already in the format: ask for the format the input is in, which keeps a contiguous
    # run of the same code as it was; otherwise only a copy into the format helps
    return statement_edit(c, follow_format_in_copy if frm == c.cl_name else keep_format_in_copy, detail=detail)


@register_fix("out of place")
def _inplace_fix(c: CauseView) -> Proposal:
    reason = _base_read_after(c)
    found = statement_edit(c, out_of_place)
    if reason and found.automatic:
        found = replace(found, reason=reason, change=None)
    return found


def _base_read_after(c: CauseView) -> str:
    """Why writing ``c``'s in-place op out of place would change the program (its view's base,
    through another alias, is read after it), or ""."""
    t, e = c.tracer, c.forward
    ins = t.input_rows(e)
    if not ins:
        return ""
    tid = c.view.tensors["tid"].to_numpy()
    written = int(tid[ins[0]])
    root = c.view.graph.root
    base = int(root[written]) if written < len(root) else written
    seq = t.seq
    later = np.flatnonzero((seq > e) & ~t.is_out)
    for r in later:
        other = int(tid[r])
        if other != written and other < len(root) and int(root[other]) == base and not _descends(c, other, written):
            return (f"the tensor written in place is a view whose base is read afterwards ({t.op[int(seq[r])]}): "
                    "writing it out of place would change what that reads")
    return ""


def _descends(c: CauseView, tid: int, ancestor: int) -> bool:
    """Whether tensor ``tid`` is ``ancestor`` or a view made from it (after the write)."""
    t = c.view.tensors
    seqs, roles, tids, views = t["seq"].to_numpy(), t["role"].to_numpy(), t["tid"].to_numpy(), t["is_view"].to_numpy()
    frontier, seen = {ancestor}, {ancestor}
    while frontier:
        made = set()
        for e in np.unique(seqs[np.isin(tids, list(frontier)) & (roles == "input")]):
            outs = (seqs == e) & (roles == "output") & views
            made |= set(tids[outs].tolist())
        frontier = made - seen
        seen |= made
        if tid in seen:
            return True
    return tid in seen


@register_fix("weight flattened in memory order")
def _weight_rebuilt_fix(c: CauseView) -> Proposal:
    return statement_edit(c, flatten_in_memory_order, span=3)


def keep_format_in_copy(module: cst.Module, facts: syn.Facts) -> cst.Module:
    """``.contiguous()`` (or a copy ``.to``/``.contiguous`` into ``contiguous_format``) asks for
    the channels_last format instead (explicit_copy)."""
    call = syn.the_one(syn.find(module, syn.is_copy_into_contiguous), "copy into contiguous order (.contiguous())")
    return syn.replace_node(module, call, syn.with_memory_format(call, syn.expr(syn.memory_format(facts))))


def follow_format_in_copy(module: cst.Module, facts: syn.Facts) -> cst.Module:
    """``x.contiguous()`` (or a copy into ``contiguous_format``) whose input is already dense in
    the channels_last format asks for the format ``x`` is in: no copy where ``x`` is a dense
    channels_last map, the same copy as before where it is not, so code a contiguous model runs
    too is not made to write channels_last (explicit_copy)."""
    call = syn.the_one(syn.find(module, syn.is_copy_into_contiguous), "copy into contiguous order (.contiguous())")
    cl = syn.memory_format(facts)
    x = call.func.value
    if syn.simple(x):
        ref, receiver = syn.code(x), x
    else:
        ref = facts.new_name("_copied")
        receiver = syn.expr(f"({ref} := {syn.code(x)})")
    follow = syn.expr(f"{cl} if {ref}.is_contiguous(memory_format={cl}) else {facts.torch}.contiguous_format")
    new = syn.with_memory_format(call, follow)
    return syn.replace_node(module, call, new.with_changes(func=new.func.with_changes(value=receiver)))


def out_of_place(module: cst.Module, facts: syn.Facts) -> cst.Module:
    """``y += z`` on a view becomes ``y = y + z`` (and ``y.add_(z)`` ``y = y.add(z)``): the same
    values, without the in-place write into a view whose gradient autograd copies into contiguous
    order (inplace_view). The caller checks that nothing reads the view's base afterwards."""
    aug = syn.find(module, lambda n: isinstance(n, cst.AugAssign))
    calls = syn.find(module, lambda n: isinstance(n, cst.Expr) and isinstance(n.value, cst.Call)
                  and isinstance(n.value.func, cst.Attribute) and n.value.func.attr.value.endswith("_")
                  and not n.value.func.attr.value.startswith("_"))
    node = syn.the_one(aug + calls, "in-place operation")
    if isinstance(node, cst.AugAssign):
        if not isinstance(node.target, cst.Name):
            raise syn.Refused(f"the in-place target ({syn.code(node.target)}) is not a name: writing it out of place would "
                          "change what it writes into")
        op = syn.code(node.operator).strip().rstrip("=")
        text = f"{node.target.value} = {node.target.value} {op} {syn.code(node.value)}"
        return syn.replace_node(module, node, cst.parse_statement(text).body[0])
    call = node.value
    if not isinstance(call.func.value, cst.Name):
        raise syn.Refused(f"the in-place target ({syn.code(call.func.value)}) is not a name")
    target = call.func.value.value
    text = f"{target} = {syn.code(call.with_deep_changes(call.func.attr, value=call.func.attr.value[:-1]))}"
    return syn.replace_node(module, node, cst.parse_statement(text).body[0])


def flatten_in_memory_order(module: cst.Module, facts: syn.Facts) -> cst.Module:
    """A channels_last weight reshaped for a batch norm, ``F.batch_norm(w.reshape(1, O, -1),
    ...).reshape_as(w)``, is flattened in its memory order, ``w.permute(0, 2, 3, 1)`` (the
    reshape of which is a view), and permuted back after: the same statistics per output
    channel, no copy of the weight (weight_rebuilt). The order follows the weight's layout, so
    a contiguous weight is flattened as before and no copy is added there."""
    order = tuple([0, *range(2, facts.rank), 1])
    back = tuple([0, facts.rank - 1, *range(1, facts.rank - 1)])

    def is_norm(node) -> bool:
        return isinstance(node, cst.Call) and syn.callee(node) in ("batch_norm", "group_norm", "layer_norm",
                                                                  "instance_norm")

    def is_back(node) -> bool:
        return (isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute)
                and node.func.attr.value in ("reshape_as", "view_as") and is_norm(node.func.value))

    outer = syn.the_one(syn.find(module, is_back), "normalisation of a flattened weight shaped back (.reshape_as(w))")
    norm = outer.func.value
    w = outer.args[0].value if outer.args else None
    flat = syn.arg(norm, 0, "input")
    if w is None or flat is None or not syn.simple(w):
        raise syn.Refused("the weight is not a name or attribute")
    # the weight's own layout picks the order: channels_last is flattened in NHWC order, a
    # contiguous weight (a model run contiguous through the same code) as it was
    ws, flag = syn.code(w), facts.new_name("_cl")
    is_cl = f"{ws}.stride(1) == 1 and ({ws}.shape[1] == 1 or {ws}.stride(-1) > 1)"
    permuted = f"({ws}.permute{order} if ({flag} := {is_cl}) else {ws})"

    def is_flattening(node) -> bool:
        return (isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute)
                and node.func.attr.value in ("reshape", "view") and syn.code(node.func.value) == syn.code(w))

    inner = flat.value
    if isinstance(inner, cst.Name):  # flattened into a name first: `flat = w.reshape(1, O, -1)`
        assigned = [n.value for n in syn.find(module, lambda n: isinstance(n, cst.Assign) and len(n.targets) == 1
                                           and syn.code(n.targets[0].target) == inner.value)]
        inner = assigned[-1] if assigned else None
    if inner is None or not is_flattening(inner):
        raise syn.Refused("the normalised tensor is not a reshape of the weight")
    new_inner = inner.with_changes(func=syn.expr(f"{permuted}.{inner.func.attr.value}"))
    identity = tuple(range(facts.rank))
    shaped_back = (f".reshape({ws}.permute{order}.shape if {flag} else {ws}.shape)"
                   f".permute({back} if {flag} else {identity})")
    new_outer = syn.expr(f"{syn.code(norm)}{shaped_back}")
    if flat.value is inner:
        new_outer = syn.expr(f"{syn.code(norm.with_deep_changes(flat, value=new_inner))}{shaped_back}")
        return syn.replace_node(module, outer, new_outer)
    return syn.replace_nodes(module, [(inner, new_inner), (outer, new_outer)])
