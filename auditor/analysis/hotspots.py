"""Hotspots: the losses and conversions on conv -> ... -> conv paths, per op and grouped.

:func:`ops_table` joins the classification and the data flow into one row per event, the table
every other analyzer reads; :func:`hotspots` groups its hotspot rows.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..recording import rules
from ..recording.formats import base_format
from .classify import classify
from .flow import FlowGraph

HOTSPOT_KEYS = ["phase", "module", "op", "source", "kind"]


def ops_table(events: pd.DataFrame, tensors: pd.DataFrame, graph: FlowGraph | None = None) -> pd.DataFrame:
    """``events`` plus the classification and data-flow columns the other analyzers use.

    Added columns: ``kind``, ``bytes``, ``from_format``, ``to_format``, ``is_conv``,
    ``cl_input``, ``after_conv`` (a convolution feeds it, in its phase), ``before_conv`` (it
    feeds a convolution, in its phase) and ``hotspot``.

    A loss or conversion is a hotspot when it lies on a conv -> ... -> conv path. A conversion
    inside a convolution is one when the operand it permutes came from such a path: from a
    convolution or an op after one. In backward that operand may be an activation saved in
    forward, so its producer is looked up across phases. ``graph`` is the audit's
    :class:`FlowGraph`, built here when not given.
    """
    cls = classify(events, tensors)
    graph = graph or FlowGraph(events, tensors)
    links = graph.links
    conv = cls["is_conv"].to_numpy()
    after = graph.downstream_of(conv)
    before = graph.upstream_of(conv)
    kind = cls["kind"].to_numpy()
    costly = np.isin(kind, rules.COSTLY_KINDS)
    hot = costly & after & before & ~conv
    # conversions inside convolutions: look at the producers of the permuted operands
    conv_conv = np.flatnonzero(costly & conv)
    if conv_conv.size:
        cand = links[np.isin(links["consumer"].to_numpy(), conv_conv)]
        fmt = tensors["format"].to_numpy()[cand["row"].to_numpy()]
        base = np.array([base_format(f) for f in fmt], dtype=object)
        target = cls["to_format"].to_numpy()[cand["consumer"].to_numpy()]
        permuted = (base != target) & np.isin(base, ["contiguous", "channels_last", "channels_last_3d", "other"])
        p = cand["producer"].to_numpy()
        fed = permuted & (after[p] | conv[p])
        hot[np.unique(cand["consumer"].to_numpy()[fed])] = True
    out = pd.concat([events, cls], axis=1)
    out["after_conv"] = after
    out["before_conv"] = before
    out["hotspot"] = hot
    return out


HOTSPOT_COLUMNS = [
    "phase", "module", "module_type", "op", "kind", "from_format", "to_format",
    "count", "bytes", "share", "source", "first_seq",
]


def hotspots(ops: pd.DataFrame) -> pd.DataFrame:
    """One row per hotspot group (phase, module, op, source, kind), largest ``bytes`` first."""
    hot = ops[ops["hotspot"]]
    timed = ops["duration_us"].notna().any()
    agg = {
        "module_type": ("module_type", "first"),
        "from_format": ("from_format", "first"),
        "to_format": ("to_format", "first"),
        "count": ("seq", "size"),
        "bytes": ("bytes", "sum"),
        "first_seq": ("seq", "min"),
    }
    if timed:
        agg["time_us"] = ("duration_us", "sum")
    cols = HOTSPOT_COLUMNS + (["time_us"] if timed else [])
    if hot.empty:
        numeric = {"count": "int64", "bytes": "int64", "share": "float64", "first_seq": "int64", "time_us": "float64"}
        return pd.DataFrame({c: pd.Series(dtype=numeric.get(c, "object")) for c in cols})
    g = hot.groupby(HOTSPOT_KEYS, observed=True, sort=False).agg(**agg).reset_index()
    total = g["bytes"].sum()
    g["share"] = g["bytes"] / total if total else 0.0
    g = g.sort_values(["bytes", "first_seq"], ascending=[False, True], ignore_index=True)
    for c in ("phase", "module", "module_type", "op", "kind", "from_format", "to_format", "source"):
        g[c] = g[c].astype(str)
    return g[cols]
