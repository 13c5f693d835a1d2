"""The last resort: the convolutions around an op that cannot keep the format run contiguous."""

from __future__ import annotations

import numpy as np

from ..._analysis import _patterns as patterns
from ..._analysis._flow import FlowView
from .._changes import (
    KeepContiguous,
)
from .._proposal import CauseView, Proposal
from .._registry import register_fix, variants
from ._join_reach import row_in_format


@register_fix("region kept contiguous")
def _region_fix(c: CauseView) -> Proposal | None:
    own, _ = own_convolutions(c, through=True)
    region, added = (own, 0) if own else _region_around(c.view, c.members)
    if not region:
        return None
    names = ", ".join(repr(n) for n in region)
    merge = c.pattern == patterns.RESHAPE_MERGE.name
    why = "a reshape that merges C with another dimension must copy a channels_last tensor" if merge else c.row.fix
    # the chain that makes the copy, read in the map's memory order: an edit verify may prove instead
    candidates = [x for _, detect in variants(c.pattern) for x in detect(c, None) if x is not None] \
        if merge and c.path else []
    where = ("the convolutions that compute on this map, made from no image, run contiguous, as the map is made"
             if own else "run the convolutions around it contiguous so no copy is needed (or let auditor.plan_layout "
                         "measure whether that pays)")
    return Proposal(KeepContiguous, f"{why}: {c.what}; {where}",
                    suggestion=f"auditor.keep_contiguous(model, [{names}])", change=KeepContiguous(region, added),
                    candidates=tuple(candidates),
                    proved_detail=f"{why}: {c.what}; read the map in its memory order" if candidates else "")


def _region_around(view: FlowView, events: list[int]) -> tuple[tuple[str, ...], int]:
    """The convolutions on both sides of a cause's ``events`` (found in forward), and the bytes
    the region's edges would then convert, per phase."""
    convs: set[int] = set()
    for c in events:
        e = c
        if view.phase[c] != "forward":
            same = np.flatnonzero((view.phase == "forward") & (view.module == view.module[c])
                                  & (view.source == view.source[c]))
            if not len(same):
                continue
            e = int(same[0])
        convs |= view.upstream_convs(e) | view.downstream_convs(e)
        if view.is_conv[e]:
            convs |= {e}
    # the modules that ran the convolution ops; Fixes.apply keeps those that are convolution
    # modules (a subclass of nn.Conv2d by any name, not a module calling F.conv2d)
    names = sorted({view.module[x] for x in convs}, key=lambda n: min(x for x in convs if view.module[x] == n))
    if not names:
        return (), 0
    inside = set(names)
    nbytes = view.tensors["bytes"].to_numpy()
    added = 0
    for x in np.flatnonzero((view.phase == "forward") & view.is_conv):
        x = int(x)
        if view.module[x] not in inside:
            continue
        # its input comes from a convolution outside the region: converted at the edge
        if any(view.module[u] not in inside for u in view.upstream_convs(x)):
            added += int(nbytes[view.act_rows[x][0]])
        # its output feeds one outside: converted back at the edge
        if any(view.module[d] not in inside for d in view.downstream_convs(x)):
            added += _output_bytes(view, x)
    return tuple(names), added


def _output_bytes(view: FlowView, e: int) -> int:
    t = view.tensors
    sel = t[(t["seq"] == e) & (t["role"] == "output") & (t["position"] == 0)]
    return int(sel["bytes"].iloc[0]) if len(sel) else 0


#: the most ops the walk along a map made from no image follows
_MAP_WALK = 256


def own_convolutions(c: CauseView, through: bool = False) -> tuple[tuple[str, ...], int]:
    """The convolutions that compute on the map the cause makes from no image before it meets
    one (an attention's scores mixed across heads by 1x1 convolutions), and the bytes the
    region's edges convert (0): the ops its result flows to in forward, followed until an op
    meets an image made elsewhere; the convolutions on the way to such an op. Only where every
    such op reads the map's path in another layout than the format (a product or a copy on the
    way wrote its own): then the region, run contiguous, changes nothing on the images' path.
    ((), 0) where no convolution lies on a way from the map to an image, where an op that meets
    an image reads the path in the format, or where the cause's op is not a forward op. A
    branch that never meets an image is the images' path itself, not the map's.

    With ``through``, the cause's op may also lie further along such a map (a copy of the map
    its convolutions wrote in the format): the walk starts where the map was made
    (:func:`_map_origins`), and the cause's op must be on it."""
    view = c.view
    f = c.forward
    if view.phase[f] != "forward":
        return (), 0
    region: set[int] = set()
    edges: set[int] = set()
    # the line runs in every block that has it: each run's map, walked on its own
    for run in np.flatnonzero((view.phase == "forward") & (view.op == view.op[f]) & (view.source == view.source[f])):
        starts = _map_origins(c, int(run)) if through else [int(run)]
        if not starts:
            return (), 0
        on_map = False
        for start in starts:
            convs, met, walked = _walk_to_images(c, start)
            region |= convs
            edges |= met
            on_map = on_map or int(run) in walked
        if not on_map:
            return (), 0
    names = sorted({view.module[x] for x in region}, key=lambda n: min(x for x in region if view.module[x] == n))
    if not names or edges:
        # an op on the images' path reads the region's result in the format: run contiguous, the
        # region would move the conversion there, and into a model that runs contiguous
        return (), 0
    return tuple(names), 0


def _map_origins(c: CauseView, e: int) -> list[int]:
    """The ops that made the map forward op ``e`` reads, from no image: walking back from ``e``
    through the ops of its module (and the modules inside it) whose outputs are images, the
    first ops whose output is a map of the images' rank that is not one (a product of tokens,
    as an attention's scores), none where the walk leaves the module first."""
    view, tracer = c.view, c.tracer
    own = str(view.module[e])
    prefix = "" if own in ("", "<root>") else own + "."
    origins, seen, todo = [], {e}, [e]
    while todo and len(seen) < _MAP_WALK:
        x = todo.pop()
        out = tracer.output_row(x)
        if out >= 0 and not tracer.image[out] and int(tracer.ndim[out]) == c.rank:
            origins.append(x)
            continue
        for r in view.act_rows.get(x, []):
            p = int(view.graph.producer[r])
            if p < 0 or p in seen or view.phase[p] != "forward":
                continue
            if str(view.module[p]) != own and not str(view.module[p]).startswith(prefix):
                return []  # the map comes from outside the module: the images' path
            seen.add(p)
            todo.append(p)
    return sorted(origins)


def _walk_to_images(c: CauseView, start: int) -> tuple[set[int], set[int], set[int]]:
    """From the op ``start``, in forward: (the convolutions on a way from it to an op that meets
    an image made elsewhere, the rows of the map's path such ops read in the format, the ops
    walked)."""
    view, image = c.view, c.tracer.image
    walked, todo = {start}, [start]
    after: dict[int, list[int]] = {}
    meets: set[int] = set()
    edges: set[int] = set()
    while todo and len(walked) < _MAP_WALK:
        x = todo.pop()
        for u in view.consumers.get(x, []):
            if view.phase[u] != "forward":
                continue
            after.setdefault(x, []).append(u)
            if u in walked or u in meets:
                continue
            rows = view.act_rows.get(u, [])
            if any(image[r] and int(view.graph.producer[r]) not in walked for r in rows):
                meets.add(u)  # the map meets an image here: what follows is the images' path
                edges |= {r for r in rows if int(view.graph.producer[r]) in walked and row_in_format(c, r)}
                continue
            walked.add(u)
            todo.append(u)
    # the ops from which an op that meets an image is reached
    reaches = set(meets)
    changed = True
    while changed:
        changed = False
        for x, nxt in after.items():
            if x not in reaches and any(u in reaches for u in nxt):
                reaches.add(x)
                changed = True
    return {x for x in walked if view.is_conv[x] and x in reaches}, edges, walked


@register_fix("the map's own convolutions kept contiguous")
def _own_convolutions_fix(c: CauseView) -> Proposal | None:
    """A map made from no image (no join variant rewrites it) that convolutions compute on
    before it meets an image: those convolutions run contiguous, as the map is, so it is not
    converted for them and back (the talking heads of an attention, 1x1 convolutions across
    its heads)."""
    region, added = own_convolutions(c)
    if not region:
        return None
    names = ", ".join(repr(n) for n in region)
    return Proposal(KeepContiguous, f"{c.row.fix}: {c.what}; the convolutions that compute on this map before it meets "
                                    "an image run contiguous, as the map is made",
                    suggestion=f"auditor.keep_contiguous(model, [{names}])", change=KeepContiguous(region, added))
