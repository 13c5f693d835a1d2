"""A map unfolded into overlapping windows (``x.unfold(2, k, s).unfold(3, k, s)``), unfolded on
its NHWC view.

``unfold``'s backward sums the windows' gradients into a new tensor of its input's shape, which
it makes contiguous: a channels_last map unfolded gets a contiguous gradient (and whatever the
map was made by, a ``pad`` of it, passes it on to the convolution before, which converts it).
Unfolded on the map's NHWC view (``x.permute(0, 2, 3, 1)``, a view of its memory), the same
windows come out, permuted back to the order they had; that new tensor is then made in NHWC
order, which is the map's channels_last order.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator

import libcst as cst

from ..._recording._formats import channels_last_order
from .. import _syntax as syn
from .._proposal import Candidate, CauseView, where
from .._registry import register_variant
from .._statements import candidate
from ._join_reach import in_format

_UNFOLD = "aten.unfold.default"


def _unfold_of(c: CauseView) -> int:
    """The forward ``unfold`` of a map in the format the cause comes from: its forward op, or
    an op its forward op's result goes to (the pad before the unfold); -1 without one."""
    e = c.forward
    if str(c.tracer.op[e]) == _UNFOLD:
        return e if in_format(c, e) else -1
    return next((u for u in c.view.consumers.get(e, []) if str(c.view.op[u]) == _UNFOLD and in_format(c, u)), -1)


@functools.cache  # one rewrite for one argument: two causes of one statement rewrite it once
def unfold_in_nhwc_order(rank: int) -> Callable[[cst.Module, syn.Facts], cst.Module]:
    """The rewrite of the statement's one chain of unfolds of a map ``x`` of ``rank``
    dimensions, ``x.unfold(d1, k1, s1).unfold(d2, k2, s2)``, each of a dimension of the map (a
    literal), into ``(x.permute(0, 2, 3, 1).unfold(p(d1), k1, s1).unfold(p(d2), k2, s2)
    .permute(...) if x.is_contiguous(memory_format=torch.channels_last) else <as it was>)``:
    the same windows, whose gradient the backward makes in NHWC order; a contiguous map keeps
    its unfolds."""
    def rewrite(module: cst.Module, facts: syn.Facts) -> cst.Module:
        def is_unfold(node) -> bool:
            return isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and syn.callee(node) == "unfold"

        calls = syn.find(module, is_unfold)
        # the last unfold of a chain: no unfold is called on its result
        outer = [u for u in calls if not any(isinstance(o.func, cst.Attribute) and o.func.value is u for o in calls)]
        last = syn.the_one(outer, "chain of unfolds of a map (x.unfold(2, k, s).unfold(3, k, s))")
        chain, node = [], last
        while is_unfold(node):
            chain.insert(0, node)
            node = node.func.value
        base = node
        order = channels_last_order(rank)
        steps = []
        for i, call in enumerate(chain):
            if len(call.args) != 3 or any(a.keyword is not None or a.star for a in call.args):
                raise syn.Refused("an unfold whose arguments are named or unpacked: unfold the NHWC view by hand")
            try:
                d = int(syn.code(call.args[0].value)) % (rank + i)
            except ValueError:
                raise syn.Refused("an unfold of a dimension that is no literal: unfold the NHWC view by hand") from None
            if d >= rank:
                raise syn.Refused("an unfold of a window's dimension: unfold the NHWC view by hand")
            steps.append(f".unfold({order.index(d)}, {syn.code(call.args[1].value)}, {syn.code(call.args[2].value)})")
        back = [order.index(d) for d in range(rank)] + list(range(rank, rank + len(chain)))
        ref = syn.code(base) if syn.simple(base) else facts.new_name("_map")
        first = syn.code(base) if syn.simple(base) else f"({ref} := {syn.code(base.with_changes(lpar=[], rpar=[]))})"
        plain = syn.code(last.with_changes(lpar=[], rpar=[]))
        if not syn.simple(base):
            plain = plain.replace(syn.code(base), ref, 1)
        text = (f"({ref}.permute({', '.join(map(str, order))}){''.join(steps)}.permute({', '.join(map(str, back))}) "
                f"if {first}.is_contiguous(memory_format={syn.memory_format(facts)}) else {plain})")
        return syn.replace_node(module, last, syn.expr(text))
    return rewrite


@register_variant("a map unfolded on its NHWC view")
def a_map_unfolded_on_its_nhwc_view(c: CauseView, weight: str | None) -> Iterator[Candidate | None]:
    u = _unfold_of(c)
    if u < 0:
        return
    path, line = where(str(c.view.source[u]))
    if path is not None:
        yield candidate(c, "the map unfolded on its NHWC view", unfold_in_nhwc_order(c.rank), at=(path, line))
