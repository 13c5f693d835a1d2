"""Reductions: a mean over H and W, a stack reduced along the stack, an op of a map that is both
formats at once."""

from __future__ import annotations

import libcst as cst

from .. import _syntax as syn
from .._changes import (
    EditSource,
)
from .._keep_format import BROADCAST_SWAPS, SWAPS
from .._proposal import CauseView, Proposal
from .._registry import register_fix
from .._statements import (
    statement_edit,
)
from ._swaps import and_more, article, swap, torch_module_type


@register_fix("mean by sum")
def _mean_fix(c: CauseView) -> Proposal:
    """A mean over H and W: in a torch pooling module (``nn.AdaptiveAvgPool2d(1)``), swap the
    module; written on the line, rewrite it as a sum divided by H·W."""
    typ = torch_module_type(str(c.view.ops.at[c.forward, "module_type"]), SWAPS)
    if typ is not None:
        modules = c.instances(typ.__name__)
        return swap(c, modules, typ, SWAPS,
                     f"{c.row.fix} (it runs inside {modules[0]}{and_more(modules)}, {article(typ.__name__)} "
                     f"{typ.__name__}); the replacement computes the same "
                     "values and its backward keeps the format")
    return statement_edit(c, pool_by_sum, detail=f"{c.row.fix.split(':')[0]}: a sum divided by H·W computes the "
                                                     "mean's values, and its backward broadcasts a view")


@register_fix("stack reduced")
def _stack_fix(c: CauseView) -> Proposal:
    ins, outs = c.shapes(c.forward)
    dims = ()
    if ins and outs and len(ins[0]) == len(outs[0]) + 1:
        a, b = ins[0], outs[0]
        dims = tuple(d for d in range(len(a)) if a[:d] + a[d + 1:] == b)  # more than one where sizes repeat
    return statement_edit(c, add_the_branches, dims=dims)


@register_fix("broadcast")
def _broadcast_fix(c: CauseView) -> Proposal:
    """An op whose input is both formats at once (N×C×1×1, or N×1×H×W) and that writes its
    output contiguous: an interpolation of a map is a broadcast (on the line, rewritten;
    an ``nn.Upsample``, swapped); a mean over the channels, whose backward writes the gradient
    full size, a sum divided by their number; anything else, by hand, with what it is."""
    op = str(c.tracer.op[c.forward])
    ins, outs = c.shapes(c.forward)
    if c.forward != c.e and op.startswith("aten.mean") and ins and outs and len(ins[0]) == len(outs[0]):
        dims = tuple(d for d in range(len(ins[0])) if ins[0][d] != outs[0][d])
        return statement_edit(c, pool_by_sum, dims=dims, detail=(
            f"PyTorch's backward of a mean over dimensions {dims} writes its gradient full size in contiguous order "
            f"({c.what}: the gradient it expands, {outs[0]}, is both formats at once); a sum divided by their size "
            "computes the mean's values, and its backward broadcasts a view"))
    if "upsample" in op or "interpolate" in op:
        typ = torch_module_type(str(c.view.ops.at[c.forward, "module_type"]), BROADCAST_SWAPS)
        if typ is not None and ins and all(s == 1 for s in ins[0][2:]):
            modules = c.instances(typ.__name__)
            return swap(c, modules, typ, BROADCAST_SWAPS, (
                f"{c.what}: {modules[0]}{and_more(modules)} ({article(typ.__name__)} {typ.__name__}) interpolates an "
                f"N×C×1×1 map, {ins[0]}, and writes it contiguous; the replacement broadcasts the one pixel per "
                "channel as a view, the same values, which what reads it reads in its own format"))
        return statement_edit(c, broadcast_the_map)
    shape = f"{ins[0]}: " if ins else ""
    return Proposal(EditSource, f"{c.what}: its input is both formats at once, and PyTorch writes the op's output "
                          "contiguous",
                    line=c.source_line(),
                    reason=_AMBIGUOUS_REASON.format(op=("the backward of " if c.forward != c.e else "")
                                                    + op.removeprefix("aten."), shape=shape, cl=c.cl_name))


#: why an op of an input that is both formats at once, other than an interpolation, is by hand
_AMBIGUOUS_REASON = (
    "{op} takes an input whose memory order is both formats at once ({shape}its channels, or its height and width, "
    "are 1), so PyTorch writes its output contiguous: it is no interpolation of a map, to broadcast instead; "
    "write the output {cl} by hand where the model always runs {cl} (code that also runs contiguous would "
    "then convert)")


def _spatial(facts: syn.Facts) -> set[int]:
    return set(range(2, facts.rank))


def pool_by_sum(module: cst.Module, facts: syn.Facts) -> cst.Module:
    """A mean over all spatial dimensions, ``x.mean((2, 3), keepdim=True)`` (or
    ``torch.mean(x, ...)``, ``F.adaptive_avg_pool2d(x, 1)``), becomes ``x.sum((2, 3),
    keepdim=True) / (x.shape[2] * x.shape[3])``: the same sum and division as the mean, so the
    same values, but its backward broadcasts the gradient as a view instead of writing it
    contiguous (mean_backward). With ``facts.dims``, the mean over those dimensions instead (a
    mean over the channels, whose N×1×H×W gradient PyTorch's backward writes full size and
    contiguous)."""
    spatial = {d % facts.rank for d in facts.dims} if facts.dims else _spatial(facts)

    def is_mean(node) -> bool:
        if not isinstance(node, cst.Call):
            return False
        name = syn.callee(node)
        if name == "mean":
            method = syn.is_method(node, facts.torch)
            dims = syn.arg(node, 0 if method else 1, "dim")
            return dims is not None and syn.literal_ints(dims.value) is not None and syn.normal(syn.literal_ints(dims.value), facts.rank) == spatial
        if name in ("adaptive_avg_pool2d", "adaptive_avg_pool3d") and spatial == _spatial(facts):
            size = syn.arg(node, 1, "output_size")
            values = syn.literal_ints(size.value) if size is not None else None
            return values is not None and set(values) == {1}
        return False

    call = syn.the_one(syn.find(module, is_mean), "mean over the spatial dimensions" if not facts.dims else
                    f"mean over dimensions {tuple(sorted(spatial))}")
    method = syn.callee(call) == "mean" and syn.is_method(call, facts.torch)
    x = call.func.value if method else syn.arg(call, 0, "input").value
    if syn.callee(call) == "mean":
        dims_text = syn.code(syn.arg(call, 0 if method else 1, "dim").value)
        keep = syn.arg(call, 1 if method else 2, "keepdim")
        keepdim = syn.literal_bool(keep.value) if keep is not None else False
        if keepdim is None:
            raise syn.Refused("the mean's keepdim is not a literal True or False")
    else:
        dims_text, keepdim = repr(tuple(sorted(spatial))), True
    sizes = sorted(spatial)
    if syn.simple(x):
        ref, first = syn.code(x), syn.code(x)
    else:
        ref = facts.new_name("_pooled")
        first = f"({ref} := {syn.code(x)})"
    divisor = " * ".join(f"{ref}.shape[{d}]" for d in sizes)
    text = f"{first}.sum({dims_text}{', keepdim=True' if keepdim else ''}) / ({divisor})"
    return syn.replace_node(module, call, syn.expr(text))


def add_the_branches(module: cst.Module, facts: syn.Facts) -> cst.Module:
    """A sum (or mean) over the dimension images were stacked along, ``torch.sum(x, dim=1)``,
    becomes the sum of the branches, ``sum(x.unbind(1))`` (``sum(branches)`` when the line
    stacks them itself): the same additions, and each keeps the images' format
    (stack_reduce)."""
    if not facts.dims:
        raise syn.Refused("the reduction is not over one stacked dimension")
    stacked_dims = {d % (facts.rank + 1) for d in facts.dims}  # those the op's shapes allow

    def is_reduction(node) -> bool:
        if not isinstance(node, cst.Call) or syn.callee(node) not in ("sum", "mean"):
            return False
        method = syn.is_method(node, facts.torch)
        if not method and not (isinstance(node.func, cst.Attribute) and syn.code(node.func.value) == facts.torch):
            return False  # the builtin sum
        dim = syn.arg(node, 0 if method else 1, "dim")
        values = syn.literal_ints(dim.value) if dim is not None else None
        return values is not None and len(values) == 1 and values[0] % (facts.rank + 1) in stacked_dims

    call = syn.the_one(syn.find(module, is_reduction), "reduction over the stacked dimension")
    method = syn.is_method(call, facts.torch)
    stacked = syn.literal_ints(syn.arg(call, 0 if method else 1, "dim").value)[0] % (facts.rank + 1)
    keep = syn.arg(call, 1 if method else 2, "keepdim")
    if keep is not None and syn.literal_bool(keep.value) is not False:
        raise syn.Refused("the reduction keeps the stacked dimension (keepdim)")
    if "sum" in facts.taken:
        raise syn.Refused("the name sum is taken where this line runs, so the builtin sum cannot add the branches")
    x = call.func.value if method else syn.arg(call, 0, "input").value
    mean = syn.callee(call) == "mean"
    if isinstance(x, cst.Call) and syn.callee(x) == "stack" and not syn.is_method(x, facts.torch):
        dim = syn.arg(x, 1, "dim")
        given = syn.literal_ints(dim.value) if dim is not None else (0,)
        if given is not None and given[0] % (facts.rank + 1) == stacked % (facts.rank + 1):
            branches = syn.code(syn.arg(x, 0, "tensors").value)
            text = f"sum({branches})" + (f" / len({branches})" if mean else "")
            return syn.replace_node(module, call, syn.expr(text))
    if syn.simple(x) or not mean:
        text = f"sum({syn.code(x)}.unbind({stacked}))" + (f" / {syn.code(x)}.shape[{stacked}]" if mean else "")
    else:
        ref = facts.new_name("_stacked")
        text = f"sum(({ref} := {syn.code(x)}).unbind({stacked})) / {ref}.shape[{stacked}]"
    return syn.replace_node(module, call, syn.expr(text))


def broadcast_the_map(module: cst.Module, facts: syn.Facts) -> cst.Module:
    """``F.interpolate(p, size=s, ...)`` of an N×C×1×1 map becomes
    ``p.expand(-1, -1, *s).contiguous(memory_format=...)``: every output pixel is the one input
    pixel, written once, in the format the map's strides show (channels_last where C is
    innermost, else contiguous), as the interpolation wrote it (nc11_broadcast)."""
    def is_resize(node) -> bool:
        return isinstance(node, cst.Call) and syn.callee(node) in ("interpolate", "upsample", "upsample_bilinear",
                                                                  "upsample_nearest")

    call = syn.the_one(syn.find(module, is_resize), "interpolation")
    x = syn.arg(call, 0, "input")
    size = syn.arg(call, 1, "size")
    if x is None or size is None or (isinstance(size.value, cst.Name) and size.value.value == "None"):
        raise syn.Refused("the interpolation is given no output size (a scale factor, say)")
    values = size.value
    if isinstance(values, (cst.Tuple, cst.List)):
        spatial = ", ".join(syn.code(e.value) for e in values.elements)
    else:
        spatial = f"*{syn.code(values)}"
    # the format follows the map's own strides, as the interpolation's output did: channels_last
    # where it is laid out so (C innermost), contiguous where a contiguous run made it
    cl = syn.memory_format(facts)
    if syn.simple(x.value):
        ref = first = syn.code(x.value)
    else:
        ref = facts.new_name("_map")
        first = f"({ref} := {syn.code(x.value)})"
    follow = f"{cl} if {ref}.stride(1) == 1 and ({ref}.shape[1] == 1 or {ref}.stride(-1) > 1) else {facts.torch}.contiguous_format"
    text = f"{first}.expand(-1, -1, {spatial}).contiguous(memory_format={follow})"
    return syn.replace_node(module, call, syn.expr(text))
