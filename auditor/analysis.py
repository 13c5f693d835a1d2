"""Stateless analyzers over the event log: classification, data flow, hotspots, summaries.

Every function takes the ``events`` and ``tensors`` DataFrames of :mod:`auditor.log` and
returns a DataFrame. Per-op classification calls :func:`auditor.rules.classify` once per
distinct op signature (the same function ``strict=True`` uses), everything else is vectorised.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from . import rules
from .formats import CHANNELS_LAST, CHANNELS_LAST_3D, LABELS, VIEW_SUFFIX

_CL_LABELS = (CHANNELS_LAST, CHANNELS_LAST_3D, CHANNELS_LAST + VIEW_SUFFIX, CHANNELS_LAST_3D + VIEW_SUFFIX)
#: Signature width handled by the vectorised path; wider ops (foreach, long cats) go one by one.
_WIDE = 12

HOTSPOT_KEYS = ["phase", "module", "op", "source", "kind"]


# -- classification ---------------------------------------------------------------------------


def is_floating_dtype(dtype_name: str) -> bool:
    dt = getattr(torch, dtype_name, None)
    return isinstance(dt, torch.dtype) and (dt.is_floating_point or dt.is_complex)


def _tensor_signatures(tensors: pd.DataFrame, floating: np.ndarray) -> np.ndarray:
    """A code per distinct (role, position, arg, format, is_param, is_view, floating, bytes).

    The fields are packed into one int64 so that a single hash factorisation does the work.
    """
    if not len(tensors):
        return np.zeros(0, np.int64)
    fields = [
        (tensors["role"].cat.codes.to_numpy().astype(np.int64), 1),
        (tensors["position"].to_numpy().astype(np.int64) + 1, 10),
        (tensors["arg"].cat.codes.to_numpy().astype(np.int64) + 1, 12),
        (tensors["format"].cat.codes.to_numpy().astype(np.int64) + 1, 4),
        (tensors["is_param"].to_numpy().astype(np.int64), 1),
        (tensors["is_view"].to_numpy().astype(np.int64), 1),
        (floating.astype(np.int64), 1),
        (pd.factorize(tensors["bytes"].to_numpy())[0].astype(np.int64), 32),
    ]
    if all(int(v.max()) < (1 << bits) and int(v.min()) >= 0 for v, bits in fields):
        key = np.zeros(len(tensors), dtype=np.int64)
        for v, bits in fields:
            key = (key << bits) | v
        return pd.factorize(key)[0].astype(np.int64)
    return pd.factorize(pd.MultiIndex.from_arrays([v for v, _ in fields]))[0].astype(np.int64)



def classify(events: pd.DataFrame, tensors: pd.DataFrame) -> pd.DataFrame:
    """One row per event: ``kind`` (see :data:`auditor.rules.KINDS`), ``bytes`` moved into
    another layout, ``from_format``/``to_format``, ``is_conv`` and ``cl_input`` (the op read a
    channels_last activation)."""
    n = len(events)
    seq = tensors["seq"].to_numpy()
    ops = events["op"].cat.categories
    op_codes = events["op"].cat.codes.to_numpy()

    dtype_cats = tensors["dtype"].cat.categories
    floating_of_code = np.array([is_floating_dtype(d) for d in dtype_cats] + [False], dtype=bool)
    floating = floating_of_code[tensors["dtype"].cat.codes.to_numpy()]
    tsig = _tensor_signatures(tensors, floating)

    # rank of each tensor row inside its event (rows are grouped by seq, in recording order)
    counts = np.bincount(seq, minlength=n)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]]) if n else np.zeros(0, np.int64)
    rank = np.arange(len(tensors)) - starts[seq] if len(tensors) else np.zeros(0, np.int64)
    wide = counts > _WIDE
    grid = np.full((n, _WIDE + 1), -1, dtype=np.int64)
    grid[:, 0] = op_codes
    keep = rank < _WIDE
    grid[seq[keep], rank[keep] + 1] = tsig[keep]
    narrow = ~wide
    sig = np.full(n, -1, dtype=np.int64)
    if narrow.any():
        sig[narrow] = pd.DataFrame(grid[narrow]).groupby(list(range(_WIDE + 1)), sort=False).ngroup()
    n_sigs = int(sig.max()) + 1 if narrow.any() else 0

    role = tensors["role"].to_numpy()
    position = tensors["position"].to_numpy()
    arg = tensors["arg"].to_numpy()
    fmt = tensors["format"].to_numpy()
    is_param = tensors["is_param"].to_numpy()
    is_view = tensors["is_view"].to_numpy()
    nbytes = tensors["bytes"].to_numpy()

    def verdict_of(event: int) -> rules.Verdict:
        lo, hi = starts[event], starts[event] + counts[event]
        sigs = tuple(
            rules.TensorSig(role[i], int(position[i]), arg[i], fmt[i], bool(is_param[i]),
                            bool(is_view[i]), int(nbytes[i]), bool(floating[i]))
            for i in range(lo, hi)
        )
        return rules.classify(ops[op_codes[event]], sigs)

    kind = np.empty(n, dtype=object)
    moved = np.zeros(n, dtype=np.int64)
    src = np.empty(n, dtype=object)
    dst = np.empty(n, dtype=object)
    if n_sigs:
        rep = np.full(n_sigs, -1, dtype=np.int64)
        narrow_idx = np.flatnonzero(narrow)
        rep[sig[narrow_idx[::-1]]] = narrow_idx[::-1]  # first event of each signature
        table = [verdict_of(int(e)) for e in rep]
        k, b, f, t = (np.array(col, dtype=object) for col in zip(*table))
        kind[narrow], moved[narrow], src[narrow], dst[narrow] = (
            k[sig[narrow]], b[sig[narrow]].astype(np.int64), f[sig[narrow]], t[sig[narrow]]
        )
    for e in np.flatnonzero(wide):
        v = verdict_of(int(e))
        kind[e], moved[e], src[e], dst[e] = v.kind, v.nbytes, v.from_format, v.to_format

    is_activation_input = (
        (tensors["role"] == "input").to_numpy()
        & floating
        & ~is_param
        & ~tensors["arg"].isin(rules.WEIGHT_ARGS).to_numpy()
    )
    cl_in = np.zeros(n, dtype=bool)
    cl_in[seq[is_activation_input & tensors["format"].isin(_CL_LABELS).to_numpy()]] = True
    labels = ["", *LABELS]
    return pd.DataFrame(
        {
            "kind": pd.Categorical(kind, categories=list(rules.KINDS)),
            "bytes": moved,
            "from_format": pd.Categorical(src, categories=labels),
            "to_format": pd.Categorical(dst, categories=labels),
            "is_conv": np.array([rules.is_convolution(o) for o in ops], dtype=bool)[op_codes]
            if n
            else np.zeros(0, bool),
            "cl_input": cl_in,
        },
        index=events.index,
    )


# -- data flow --------------------------------------------------------------------------------


def flow_links(events: pd.DataFrame, tensors: pd.DataFrame) -> pd.DataFrame:
    """The producer of every tensor input: one row per input row of ``tensors`` that has one.

    Columns: ``row`` (index into ``tensors``), ``consumer`` and ``producer`` (event seqs) and
    ``same_phase``. A consumer links to the last earlier event that wrote the tensor or any
    alias of it (views are followed to their base, in-place ops count as writes), so neither
    views nor in-place ops break a chain.
    """
    is_out = (tensors["role"] == "output").to_numpy()
    tid = tensors["tid"].to_numpy()
    seq = tensors["seq"].to_numpy()
    # base tensor of every view output: the op's first tensor input
    roots = view_roots(tensors, len(events))
    root = roots[tid] if len(tid) else tid
    phase = events["phase"].cat.codes.to_numpy()

    rows = np.arange(len(tensors))
    writes = pd.DataFrame({"seq": seq[is_out], "root": root[is_out]})
    writes = writes.drop_duplicates().sort_values("seq", kind="stable")
    writes["producer"] = writes["seq"]
    reads = pd.DataFrame({"seq": seq[~is_out], "root": root[~is_out], "row": rows[~is_out]})
    reads = reads.sort_values("seq", kind="stable")
    linked = pd.merge_asof(reads, writes, on="seq", by="root", allow_exact_matches=False)
    linked = linked.dropna(subset=["producer"])
    producer = linked["producer"].astype(np.int64).to_numpy()
    consumer = linked["seq"].to_numpy()
    return pd.DataFrame(
        {
            "row": linked["row"].to_numpy(),
            "consumer": consumer,
            "producer": producer,
            "same_phase": phase[producer] == phase[consumer],
        }
    )


def view_roots(tensors: pd.DataFrame, n_events: int) -> np.ndarray:
    """For every tid, the tid it is a view of, followed to the end (views of views of ...).

    The base of a view result is its op's first tensor input; the first recorded base wins.
    In-place metadata ops (``as_strided_``) alias themselves and are no link.
    """
    tid = tensors["tid"].to_numpy()
    parent = np.arange(int(tid.max()) + 1 if len(tid) else 0, dtype=np.int64)
    if not len(tid):
        return parent
    seq = tensors["seq"].to_numpy()
    is_out = (tensors["role"] == "output").to_numpy()
    first_in = np.full(n_events, -1, dtype=np.int64)
    ins = np.flatnonzero(~is_out)
    first_in[seq[ins][::-1]] = ins[::-1]
    views = np.flatnonzero(is_out & tensors["is_view"].to_numpy())
    base = first_in[seq[views]]
    ok = base >= 0
    view_tid, base_tid = tid[views[ok]], tid[base[ok]]
    keep = view_tid != base_tid
    parent[view_tid[keep][::-1]] = base_tid[keep][::-1]
    root = parent.copy()
    for _ in range(256):
        nxt = parent[root]
        if np.array_equal(nxt, root):
            break
        root = nxt
    return root


def _reachable(n: int, sources: np.ndarray, frm: np.ndarray, to: np.ndarray) -> np.ndarray:
    """Events reachable from ``sources`` by one or more edges (a vectorised breadth-first search)."""
    reached = np.zeros(n, dtype=bool)
    if n == 0 or len(frm) == 0:
        return reached
    order = np.argsort(frm, kind="stable")
    to_sorted = to[order]
    indptr = np.concatenate([[0], np.cumsum(np.bincount(frm, minlength=n))])
    frontier = np.flatnonzero(sources)
    while frontier.size:
        lo, hi = indptr[frontier], indptr[frontier + 1]
        cnt = hi - lo
        total = int(cnt.sum())
        if total == 0:
            break
        idx = np.repeat(lo - np.concatenate([[0], np.cumsum(cnt)[:-1]]), cnt) + np.arange(total)
        nxt = to_sorted[idx]
        nxt = np.unique(nxt[~reached[nxt]])
        reached[nxt] = True
        frontier = nxt
    return reached


def ops_table(events: pd.DataFrame, tensors: pd.DataFrame) -> pd.DataFrame:
    """``events`` plus the classification and data-flow columns the other analyzers use.

    Added columns: ``kind``, ``bytes``, ``from_format``, ``to_format``, ``is_conv``,
    ``cl_input``, ``after_conv`` (a convolution feeds it, in its phase), ``before_conv`` (it
    feeds a convolution, in its phase) and ``hotspot``.

    A loss or conversion is a hotspot when it lies on a conv -> ... -> conv path. A conversion
    inside a convolution is one when the operand it permutes came from such a path: from a
    convolution or an op after one. In backward that operand may be an activation saved in
    forward, so its producer is looked up across phases.
    """
    cls = classify(events, tensors)
    links = flow_links(events, tensors)
    n = len(events)
    same = links[links["same_phase"]].drop_duplicates(["producer", "consumer"])
    frm, to = same["producer"].to_numpy(), same["consumer"].to_numpy()
    conv = cls["is_conv"].to_numpy()
    after = _reachable(n, conv, frm, to)
    before = _reachable(n, conv, to, frm)
    kind = cls["kind"].to_numpy()
    costly = np.isin(kind, rules.COSTLY_KINDS)
    hot = costly & after & before & ~conv
    # conversions inside convolutions: look at the producers of the permuted operands
    conv_conv = np.flatnonzero(costly & conv)
    if conv_conv.size:
        cand = links[np.isin(links["consumer"].to_numpy(), conv_conv)]
        fmt = tensors["format"].to_numpy()[cand["row"].to_numpy()]
        base = np.array([f[: -len(VIEW_SUFFIX)] if f.endswith(VIEW_SUFFIX) else f for f in fmt], dtype=object)
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


# -- reports as DataFrames ---------------------------------------------------------------------

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


def module_at_depth(module: pd.Series, depth: int) -> pd.Series:
    """``layer1.0.conv2`` at depth 1 -> ``layer1``; ``<root>`` and ``<global>`` stay as they are."""
    if depth < 1:
        raise ValueError(f"depth must be >= 1, got {depth}")
    names = pd.Series(module.astype(str).to_numpy(), index=module.index)
    uniq = names.unique()
    short = {m: m if m.startswith("<") else ".".join(m.split(".")[:depth]) for m in uniq}
    return names.map(short)


def summary(ops: pd.DataFrame, depth: int = 1) -> pd.DataFrame:
    """Per module at ``depth``, in execution order: ops, views, losses, conversions, hotspots,
    hotspot bytes and their share of the total."""
    df = pd.DataFrame(
        {
            "module": module_at_depth(ops["module"], depth),
            "seq": ops["seq"].to_numpy(),
            "view": (ops["kind"] == rules.VIEW).to_numpy(),
            "loss": (ops["kind"] == rules.LOSES).to_numpy(),
            "conversion": ops["kind"].isin([rules.CONVERTS, rules.RESTORES]).to_numpy(),
            "hotspot": ops["hotspot"].to_numpy(),
            "hot_bytes": np.where(ops["hotspot"].to_numpy(), ops["bytes"].to_numpy(), 0),
        }
    )
    g = df.groupby("module", sort=False).agg(
        first_seq=("seq", "min"),
        ops=("seq", "size"),
        views=("view", "sum"),
        losses=("loss", "sum"),
        conversions=("conversion", "sum"),
        hotspots=("hotspot", "sum"),
        bytes=("hot_bytes", "sum"),
    )
    total = g["bytes"].sum()
    g["share"] = g["bytes"] / total if total else 0.0
    g = g.sort_values("first_seq").drop(columns="first_seq").reset_index()
    return g


def coverage(ops: pd.DataFrame, tensors: pd.DataFrame) -> pd.DataFrame:
    """Per aten op, device and dtype: calls, calls that read a channels_last activation, and
    what they did with it. ``support`` is ``full`` (never lost it), ``none`` (always lost it),
    ``partial``, or ``untested`` (never saw one). Comparable across devices and versions."""
    seq = tensors["seq"].to_numpy()
    first_row = np.full(len(ops), -1, dtype=np.int64)
    first_row[seq[::-1]] = np.arange(len(tensors))[::-1]
    has = first_row >= 0
    dev_names = np.array([str(d).split(":")[0] for d in tensors["device"].cat.categories] + [""], dtype=object)
    dt_names = np.array([str(d) for d in tensors["dtype"].cat.categories] + [""], dtype=object)
    dev_codes = tensors["device"].cat.codes.to_numpy()
    dt_codes = tensors["dtype"].cat.codes.to_numpy()
    device = dev_names[np.where(has, dev_codes[np.maximum(first_row, 0)], -1)]
    dtype = dt_names[np.where(has, dt_codes[np.maximum(first_row, 0)], -1)]
    cl = ops["cl_input"].to_numpy()
    kind = ops["kind"].astype(str).to_numpy()
    df = pd.DataFrame(
        {
            "op": ops["op"].astype(str).to_numpy(),
            "device": device,
            "dtype": dtype,
            "calls": 1,
            "cl_calls": cl.astype(np.int64),
            **{k: (cl & (kind == k)).astype(np.int64) for k in ("preserves", "loses", "converts", "restores", "view", "ambiguous")},
        }
    )
    g = df.groupby(["op", "device", "dtype"], sort=True).sum().reset_index()
    support = np.where(
        g["cl_calls"] == 0, "untested",
        np.where(g["loses"] == 0, "full", np.where(g["loses"] == g["cl_calls"], "none", "partial")),
    )
    g["support"] = support
    g["torch_version"] = torch.__version__
    return g


def naive_losses(events: pd.DataFrame, tensors: pd.DataFrame) -> int:
    """What the tutorial's ``check_wrapper`` rule would flag at the aten level: an op with any
    channels_last input whose 4-D result is not channels_last-contiguous."""
    is_in = (tensors["role"] == "input").to_numpy()
    fmt = tensors["format"].astype(str).to_numpy()
    seq = tensors["seq"].to_numpy()
    cl_in = np.unique(seq[is_in & np.isin(fmt, [CHANNELS_LAST, CHANNELS_LAST_3D])])
    out0 = tensors[(~is_in) & (tensors["position"].to_numpy() == 0) & (tensors["ndim"].to_numpy() == 4)]
    bad = out0[~out0["format"].isin([CHANNELS_LAST, "ambiguous"])]["seq"].unique()
    return int(np.intersect1d(cl_in, bad).size)


def diff(before: pd.DataFrame, after: pd.DataFrame, include_unchanged: bool = False) -> pd.DataFrame:
    """Compare two hotspot tables: each group is ``appeared``, ``vanished``, ``changed`` (count or
    bytes differ) or ``unchanged``. Sorted by the size of the change in bytes."""
    keys = HOTSPOT_KEYS
    cols = keys + ["module_type", "from_format", "to_format", "count", "bytes"]
    m = before[cols].merge(after[cols], on=keys, how="outer", suffixes=("_before", "_after"), indicator=True)
    for c in ("module_type", "from_format", "to_format"):
        m[c] = m[f"{c}_after"].fillna(m[f"{c}_before"])
    for c in ("count_before", "count_after", "bytes_before", "bytes_after"):
        m[c] = m[c].fillna(0).astype(np.int64)
    m["status"] = np.select(
        [
            m["_merge"] == "left_only",
            m["_merge"] == "right_only",
            (m["count_before"] != m["count_after"]) | (m["bytes_before"] != m["bytes_after"]),
        ],
        ["vanished", "appeared", "changed"],
        default="unchanged",
    )
    m["bytes_delta"] = m["bytes_after"] - m["bytes_before"]
    if not include_unchanged:
        m = m[m["status"] != "unchanged"]
    m = m.assign(_abs=m["bytes_delta"].abs()).sort_values(["_abs"] + keys, ascending=[False] + [True] * len(keys))
    return m[
        ["status", *keys, "module_type", "from_format", "to_format",
         "count_before", "count_after", "bytes_before", "bytes_after", "bytes_delta"]
    ].reset_index(drop=True)
