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


@register_fix("region kept contiguous")
def _region_fix(c: CauseView) -> Proposal | None:
    region, added = _region_around(c.view, c.members)
    if not region:
        return None
    names = ", ".join(repr(n) for n in region)
    merge = c.pattern == patterns.RESHAPE_MERGE.name
    why = "a reshape that merges C with another dimension must copy a channels_last tensor" if merge else c.row.fix
    # the chain that makes the copy, read in the map's memory order: an edit verify may prove instead
    candidates = [x for _, detect in variants(c.pattern) for x in detect(c, None) if x is not None] \
        if merge and c.path else []
    return Proposal(KeepContiguous, f"{why}: {c.what}; run the convolutions around it contiguous so no copy is "
                                  "needed (or let auditor.plan_layout measure whether that pays)",
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
