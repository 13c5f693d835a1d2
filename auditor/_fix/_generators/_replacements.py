"""Ops without a channels_last kernel or whose backward loses the format: a format-keeping
replacement of the op's call (:mod:`.._replace`), a product whose backward keeps each
gradient's order, a map both formats at once passed re-strided (:mod:`.._restride`)."""

from __future__ import annotations

import numpy as np
import torch

from ..._analysis._activations import parse_tuple
from ..._display._text import short_source
from ..._recording._rules import VIEW
from .._proposal import CauseView, Proposal, where
from .._registry import register_fix
from .._statements import (
    functions_at,
    statement_edit,
)
from ._join_reach import (
    VIEWS,
    weight_in_reach,
)


@register_fix("re-stride")
def _restride_fix(c: CauseView) -> Proposal | None:
    """An op (in forward; not an interpolation or a mean, which :func:`_broadcast_fix` rewrites)
    whose input is a map in both formats at once and whose output comes out contiguous, where
    a convolution weight is in reach of the line: the map is passed re-strided, as a view, into
    that weight's format (:mod:`._restride`), so the op's output follows the convolutions."""
    import copy

    from .._restride import Restride

    op = str(c.tracer.op[c.forward])
    if c.forward != c.e or "upsample" in op or "interpolate" in op or op.startswith("aten.mean") or c.path is None:
        return None
    ins, _ = c.shapes(c.e)
    if not ins or len(ins[0]) != 4:
        return None
    fns = functions_at(c.path, c.lineno)
    weight = weight_in_reach(c, fns)
    name, types_ = str(c.module), c.view.ops["module_type"].astype(str).to_numpy()
    # the line runs in a module above the op's (a pool or a pad it calls): the nearest one whose
    # type holds the line's method, as recorded, or else as the method's own class, where its
    # convolution is reached by attribute (a Sequential's items are no attributes of that class)
    owner = fns[0].__qualname__.split(".<locals>")[-1].rpartition(".")[0].rpartition(".")[2] if fns else ""
    while weight is None and "." in name:
        name = name.rsplit(".", 1)[0]
        hits = np.flatnonzero(c.view.module == name)
        above = copy.copy(c)
        above.module, above.module_type = name, types_[int(hits[0])] if len(hits) else owner
        found = weight_in_reach(above, fns)
        # a module of the line's class found by its method alone: each instance may hold its
        # convolution elsewhere (a Conv2d in one, a Sequential's item in another), so the
        # convolution is found at run time, in the module's own (``self``)
        weight = found if found is None or len(hits) else "self"
    if weight is None:
        return None
    found = statement_edit(c, Restride(weight, op.split(".")[1].lstrip("_") if op.startswith("aten.") else ""), detail=(
        f"{c.what}: its input {ins[0]} is both formats at once, so PyTorch follows the strides it was made with and "
        f"writes the output contiguous; passed re-strided into the format of {weight} (a view of the same memory, "
        "the same values), the op follows the convolutions"))
    return found if found.automatic else None  # no edit: what the op is, by hand (_broadcast_fix)


@register_fix("product backward")
def _product_backward_fix(c: CauseView) -> Proposal | None:
    """A backward op that reads a gradient a product's backward wrote row-major for an input
    that was a column-major view (a (B, C, H·W) view of a channels_last map, as in a correlation
    ``fmap1.mT @ fmap2``): the product, on its own line, becomes ``keep_format.matmul``, whose
    backward writes each gradient in its input's order (same products). Found through the
    views between the two; offered only where the product's recorded inputs include such a view."""
    import copy

    from .._replace import PRODUCTS, ReplaceProduct

    view, fseq = c.view, c.tracer.forward_seq
    if view.phase[c.e] != "backward":
        return None
    todo, seen, product = [p for p in view.graph.input_producers(c.e) if p >= 0], set(), -1
    while todo and len(seen) < 64:
        p = todo.pop()
        if p in seen:
            continue
        seen.add(p)
        f = int(fseq[p])
        if view.op[p] in PRODUCTS and f >= 0 and view.op[f] in PRODUCTS:
            product = f
            break
        if view.kind[p] == VIEW or view.op[p] in VIEWS:
            todo += [q for q in view.graph.input_producers(p) if q >= 0]
    if product < 0:
        return None
    # a line with a forward cause of its own gets its own fix there (the joins' candidates, a
    # product computed transposed): two rewrites of one statement would clash
    hot = np.flatnonzero(view.ops["hotspot"].to_numpy()) if "hotspot" in view.ops else []
    if any(view.phase[e] == "forward" and view.source[e] == view.source[product]
           for e in {c.tracer.cause(int(h))[0] for h in hot}):
        return None
    t = view.tensors
    ins = t[(t["seq"] == product) & (t["role"] == "input")]
    column_major = False
    for shape, strides in zip(ins["shape"].astype(str), ins["strides"].astype(str)):
        sh, st = parse_tuple(shape), parse_tuple(strides)
        column_major |= len(st) >= 2 and st[-2] == 1 and st[-1] != 1 and sh[-2] > 1
    path, line = where(str(view.source[product]))
    if not column_major or path is None:
        return None
    at = copy.copy(c)
    at.path, at.lineno = path, line
    return statement_edit(at, ReplaceProduct(), detail=(
        f"{c.what}: it reads the gradient the product at {short_source(str(view.source[product]))} wrote row-major "
        "for an input that is a column-major view of a map (its channels_last NHWC order); "
        "auditor.keep_format.matmul computes the same products and writes each gradient in its input's order"))


@register_fix("format-keeping replacement")
def _replacement_fix(c: CauseView) -> Proposal | None:
    """An op with a format-keeping replacement (:mod:`._replace`), where the running torch says
    the op loses the format in the cause's phase on the cause's device and dtype: its call on
    the cause's line becomes the replacement's. Tried first: a replacement keeps channels_last
    around the op, where a region kept contiguous gives it up (the last resort)."""
    from .._replace import ReplaceCall, loses_here, replacement_of

    found = replacement_of(str(c.tracer.op[c.forward]))
    if found is None:
        return None
    t = c.view.tensors
    first = t[(t["seq"] == c.forward) & (t["role"] == "input")]
    if not len(first):
        return None
    device, dtype = str(first["device"].iloc[0]), getattr(torch, str(first["dtype"].iloc[0]), None)
    if not isinstance(dtype, torch.dtype):
        return None
    forward, backward = loses_here(found, device, dtype)
    lost = backward if c.view.phase[c.e] == "backward" else forward or backward
    if not lost:
        return None
    where = " and ".join(w for w, on in (("output", forward), ("input's gradient", backward)) if on)
    change = ReplaceCall(found)
    return statement_edit(c, change, detail=(
        f"{c.what}: {found.op} writes its {where} contiguous for a {c.cl_name} map on this torch ({device}, "
        f"{str(dtype).removeprefix('torch.')}; asked with one small map); {found.describe()} computes the same "
        "values on the NHWC view and keeps the format"))
