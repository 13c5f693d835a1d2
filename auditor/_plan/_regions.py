"""Regions the fixes would keep contiguous where their edges convert more bytes than they
remove: bytes do not say whether a region pays (a convolution may run faster contiguous, a
conversion costs less than its bytes), so :func:`auditor.plan_layout` times each such region
as a whole-model candidate of its own, beside the uniform layouts and the cut."""

from __future__ import annotations

from .._fix._suggest import REGION, region_candidate_name, suggest_fixes
from .._result import Audit

#: the most region candidates one plan times (each is one more whole-model function per round)
MAX_REGIONS = 3


def region_candidates(audit: Audit, names: list[str], limit: int = MAX_REGIONS) -> dict[str, dict[str, str]]:
    """Candidate name -> labelling (every planned convolution ``channels_last`` except the
    region's, ``contiguous``) for each region fix of ``audit`` whose edges would convert more
    bytes than it removes, the ones with most at stake first, at most ``limit``; labellings
    that repeat are offered once."""
    frame = suggest_fixes(audit).frame
    rows = frame[(frame["action"] == REGION) & (frame["bytes"] <= 0) & (frame["hotspot_bytes"] > 0)]
    rows = rows.sort_values("hotspot_bytes", ascending=False, kind="stable")
    out: dict[str, dict[str, str]] = {}
    planned = set(names)
    for r in rows.itertuples():
        region = [m for m in r.region if m in planned]
        if not region or len(region) == len(names):
            continue
        labels = dict.fromkeys(names, "channels_last")
        labels.update(dict.fromkeys(region, "contiguous"))
        if labels in out.values():
            continue
        out[region_candidate_name(r.region)] = labels
        if len(out) >= limit:
            break
    return out
