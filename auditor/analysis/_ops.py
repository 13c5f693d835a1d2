"""Hotspots: the losses and conversions on conv -> ... -> conv paths, per op and grouped.

:func:`classified_ops` joins the classification and the data flow into one row per event, the
table the causes are traced over (:mod:`._pipeline` adds them and the final hotspot mask);
:func:`hotspots` groups the hotspot rows of the final table.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..recording import _rules as rules
from ..recording._formats import VIEW_SUFFIX, base_format
from ._activations import floating_rows, image_facts, op_flags
from ._classification import classify
from ._flow import FlowGraph

HOTSPOT_KEYS = ["phase", "module", "op", "source", "kind"]


def op_times(ops: pd.DataFrame) -> np.ndarray:
    """Per op, its kernel time (the profiler's, else the wall time around it; NaN when untimed)."""
    for col in ("time_us", "duration_us"):
        if col in ops and ops[col].notna().any():
            return ops[col].to_numpy(dtype=np.float64)
    return np.full(len(ops), np.nan)


def classified_ops(events: pd.DataFrame, tensors: pd.DataFrame, graph: FlowGraph | None = None,
                   facts: pd.DataFrame | None = None) -> pd.DataFrame:
    """``events`` plus the classification and data-flow columns the causes are traced over.

    Added columns: ``kind``, ``bytes``, ``from_format``, ``to_format``, ``is_conv``,
    ``cl_input``, ``after_conv`` (a convolution feeds it, in its phase), ``before_conv`` (it
    feeds a convolution, in its phase), ``weight_permuted`` (a convolution that permutes its
    weight), ``layout_independent`` (a copy that would happen in any layout) and ``hotspot``.

    A loss or conversion is a hotspot when it lies on a conv -> ... -> conv path. A conversion
    inside a convolution is one when the operand it permutes came from such a path (from a
    convolution or an op after one; in backward that operand may be an activation saved in
    forward, so its producer is looked up across phases), when it permutes its weight (every
    step), and a convolution that loses channels_last is one when it reads from or writes to
    such a path. A layout-independent copy is never one. This ``hotspot`` is a candidate: the
    final mask keeps those that have a cause (:class:`~._pipeline.Analysis`). ``graph`` and ``facts`` are the
    audit's :class:`FlowGraph` and :func:`~.activations.image_facts`, built here when not given.
    """
    facts = facts if facts is not None else image_facts(events, tensors)
    cls = classify(events, tensors, facts)
    graph = graph or FlowGraph(events, tensors)
    conv = cls["is_conv"].to_numpy()
    after = graph.downstream_of(conv)
    before = graph.upstream_of(conv)
    kind = cls["kind"].to_numpy()
    costly = np.isin(kind, rules.COSTLY_KINDS)
    independent, copied_bytes = _layout_independent_copies(events, tensors, facts, kind)
    weight = _weight_permuted(tensors, cls)
    hot = costly & after & before & ~conv & ~independent
    hot |= _conv_hotspots(tensors, graph, cls, after, before) | weight
    moved = cls["bytes"].to_numpy().copy()
    moved[independent] = copied_bytes[independent]
    out = pd.concat([events, cls.assign(bytes=moved)], axis=1)
    out["after_conv"] = after
    out["before_conv"] = before
    out["weight_permuted"] = weight
    out["layout_independent"] = independent
    out["hotspot"] = hot
    return out


def _conv_hotspots(tensors, graph: FlowGraph, cls: pd.DataFrame, after, before) -> np.ndarray:
    """Convolutions that permute an operand that came from a conv path, or that lose
    channels_last on such a path."""
    conv = cls["is_conv"].to_numpy()
    kind = cls["kind"].to_numpy()
    hot = np.zeros(len(conv), dtype=bool)
    conv_conv = np.flatnonzero(np.isin(kind, rules.COSTLY_KINDS) & conv)
    if not conv_conv.size:
        return hot
    links = graph.links
    cand = links[np.isin(links["consumer"].to_numpy(), conv_conv)]
    fmt = tensors["format"].to_numpy()[cand["row"].to_numpy()]
    base = np.array([base_format(f) for f in fmt], dtype=object)
    target = cls["to_format"].to_numpy()[cand["consumer"].to_numpy()]
    permuted = (base != target) & np.isin(base, ["contiguous", "channels_last", "channels_last_3d", "other"])
    p = cand["producer"].to_numpy()
    fed = permuted & (after[p] | conv[p])
    hot[np.unique(cand["consumer"].to_numpy()[fed])] = True
    loses = conv_conv[kind[conv_conv] == rules.LOSES]
    hot[loses[after[loses] | before[loses]]] = True
    return hot


def _weight_permuted(tensors: pd.DataFrame, cls: pd.DataFrame) -> np.ndarray:
    """Convolutions whose weight is stored in another definite format than they compute in:
    they permute it on every call."""
    n = len(cls)
    out = np.zeros(n, dtype=bool)
    if not n:
        return out
    is_conv = cls["is_conv"].to_numpy()
    w = tensors[(tensors["arg"] == "weight").to_numpy() & (tensors["role"] == "input").to_numpy()
                & is_conv[tensors["seq"].to_numpy()]]
    fmt = np.array([base_format(str(f)) for f in w["format"].to_numpy()], dtype=object)
    made = cls["to_format"].astype(str).to_numpy()[w["seq"].to_numpy()]
    definite = ("contiguous", "channels_last", "channels_last_3d")
    differs = np.isin(fmt, definite) & np.isin(made, definite) & (fmt != made)
    out[w["seq"].to_numpy()[differs]] = True
    return out & (cls["kind"].to_numpy() == rules.CONVERTS)


def _layout_independent_copies(events, tensors, facts, kind) -> tuple[np.ndarray, np.ndarray]:
    """Copies that would happen in any layout, and the bytes they copy: a copy of a 4-D/5-D
    tensor that is not an image (attention heads, tokens), or a copy that materialises an image
    view in no dense standard layout (a slice, a transposed channel shuffle) and keeps its
    format family. A copy into another family is a format cost, not one of these."""
    n = len(events)
    independent = np.zeros(n, dtype=bool)
    nbytes = np.zeros(n, dtype=np.int64)
    if not n or not len(tensors):
        return independent, nbytes
    copy_op = op_flags(events["op"], rules.is_copy)
    seq = tensors["seq"].to_numpy()
    arg = tensors["arg"].astype(str).to_numpy()
    is_in = (tensors["role"] == "input").to_numpy()
    # the copied tensor: copy_'s src, else the first argument
    has_src = np.zeros(n, dtype=bool)
    has_src[seq[is_in & (arg == "src")]] = True
    source = is_in & ((arg == "src") | ((tensors["position"].to_numpy() == 0) & ~has_src[seq]))
    rows = np.flatnonzero(source & copy_op[seq] & floating_rows(tensors) & (tensors["ndim"].to_numpy() >= 4))
    label, image, size = facts["label"].to_numpy(), facts["image"].to_numpy(), tensors["bytes"].to_numpy()
    for r in rows:
        e = int(seq[r])
        if kind[e] == rules.VIEW:
            continue
        odd = str(label[r]).endswith(VIEW_SUFFIX) or base_format(str(label[r])) == "other"
        independent[e] = not image[r] or (odd and kind[e] in (rules.PRESERVES, rules.AMBIGUOUS_KIND))
        nbytes[e] = int(size[r])
    return independent, nbytes


HOTSPOT_COLUMNS = [
    "phase", "module", "module_type", "op", "kind", "from_format", "to_format",
    "count", "bytes", "share", "source", "first_seq", "cause", "time_us",
]


def hotspots(ops: pd.DataFrame) -> pd.DataFrame:
    """One row per hotspot group (phase, module, op, source, kind, and cause when the ops
    table has causes): ``time_us`` is the groups' kernel time (the profiler's, else the wall
    time around each op, NaN when untimed), largest first when timed, else largest ``bytes``
    first."""
    hot = ops[ops["hotspot"]]
    if "cause" not in ops:
        hot = hot.assign(cause=0)
    times = op_times(ops)
    timed = not np.isnan(times).all()
    hot = hot.assign(_time=times[ops["hotspot"].to_numpy()])
    agg = {
        "module_type": ("module_type", "first"),
        "from_format": ("from_format", "first"),
        "to_format": ("to_format", "first"),
        "count": ("seq", "size"),
        "bytes": ("bytes", "sum"),
        "first_seq": ("seq", "min"),
        "time_us": ("_time", lambda t: t.sum(min_count=1)),
    }
    if hot.empty:
        numeric = {"count": "int64", "bytes": "int64", "share": "float64", "first_seq": "int64", "time_us": "float64",
                   "cause": "int64"}
        return pd.DataFrame({c: pd.Series(dtype=numeric.get(c, "object")) for c in HOTSPOT_COLUMNS})
    g = hot.groupby([*HOTSPOT_KEYS, "cause"], observed=True, sort=False).agg(**agg).reset_index()
    total = g["bytes"].sum()
    g["share"] = g["bytes"] / total if total else 0.0
    by = ["time_us", "bytes"] if timed else ["bytes"]
    g = g.sort_values([*by, "first_seq"], ascending=[False] * len(by) + [True], ignore_index=True)
    for c in ("phase", "module", "module_type", "op", "kind", "from_format", "to_format", "source"):
        g[c] = g[c].astype(str)
    return g[HOTSPOT_COLUMNS]
