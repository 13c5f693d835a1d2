"""Summaries over the ops table: per module, per op (coverage), the naive checker's count,
and the difference between two hotspot tables."""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from .._recording import _rules as rules
from .._recording._formats import CHANNELS_LAST, CHANNELS_LAST_3D
from ._ops import HOTSPOT_KEYS, op_times


def module_at_depth(module: pd.Series, depth: int) -> pd.Series:
    """``layer1.0.conv2`` at depth 1 -> ``layer1``; ``<root>`` and ``<global>`` stay as they are."""
    if depth < 1:
        raise ValueError(f"depth must be >= 1, got {depth}")
    names = pd.Series(module.astype(str).to_numpy(), index=module.index)
    uniq = names.unique()
    short = {m: m if m.startswith("<") else ".".join(m.split(".")[:depth]) for m in uniq}
    return names.map(short)


#: The summary row of the copies that happen in any layout (not part of any module's hotspots).
LAYOUT_INDEPENDENT = "<layout-independent copies>"


def summary(ops: pd.DataFrame, depth: int = 1) -> pd.DataFrame:
    """Per module at ``depth``, in execution order: ops, views, losses, conversions, hotspots,
    hotspot bytes and their share of the total, and the hotspots' kernel time (``time_us``, NaN
    when untimed). When the ops table marks copies that would happen in any layout, a last row
    :data:`LAYOUT_INDEPENDENT` counts them (``ops`` and ``conversions``), their ``bytes`` and
    time, with ``share`` 0: they are not format costs."""
    df = pd.DataFrame(
        {
            "module": module_at_depth(ops["module"], depth),
            "seq": ops["seq"].to_numpy(),
            "view": (ops["kind"] == rules.VIEW).to_numpy(),
            "loss": (ops["kind"] == rules.LOSES).to_numpy(),
            "conversion": ops["kind"].isin([rules.CONVERTS, rules.RESTORES]).to_numpy(),
            "hotspot": ops["hotspot"].to_numpy(),
            "hot_bytes": np.where(ops["hotspot"].to_numpy(), ops["bytes"].to_numpy(), 0),
            "hot_time": np.where(ops["hotspot"].to_numpy(), op_times(ops), 0.0),
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
        time_us=("hot_time", "sum"),
    )
    total = g["bytes"].sum()
    g["share"] = g["bytes"] / total if total else 0.0
    g = g[["first_seq", "ops", "views", "losses", "conversions", "hotspots", "bytes", "share", "time_us"]]
    if np.isnan(op_times(ops)).all():
        g["time_us"] = np.nan
    g = g.sort_values("first_seq").drop(columns="first_seq").reset_index()
    if "layout_independent" in ops and ops["layout_independent"].any():
        copies = ops[ops["layout_independent"]]
        row = {"module": LAYOUT_INDEPENDENT, "ops": len(copies), "views": 0, "losses": 0, "conversions": len(copies),
               "hotspots": 0, "bytes": int(copies["bytes"].sum()), "share": 0.0,
               "time_us": float(np.nansum(op_times(copies))) if not np.isnan(op_times(copies)).all() else np.nan}
        g = pd.concat([g, pd.DataFrame([row]).astype(g.dtypes.to_dict())], ignore_index=True)
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
    m = _per_key(before[cols], keys).merge(_per_key(after[cols], keys), on=keys, how="outer",
                                          suffixes=("_before", "_after"), indicator=True)
    for c in ("module_type", "from_format", "to_format"):
        m[c] = m[f"{c}_after"].fillna(m[f"{c}_before"])
    m = _status(m, ("count", "bytes"), include_unchanged, keys)
    return m[
        ["status", *keys, "module_type", "from_format", "to_format",
         "count_before", "count_after", "bytes_before", "bytes_after", "bytes_delta"]
    ].reset_index(drop=True)


#: What identifies a cause across two audits (its number is a rank, not an identity).
CAUSE_KEYS = ["phase", "op", "source", "kind", "pattern"]


def diff_causes(before: pd.DataFrame, after: pd.DataFrame, include_unchanged: bool = False) -> pd.DataFrame:
    """Compare two cause tables (``Audit.causes()``): each cause ``appeared``, ``vanished``,
    ``changed`` (its hotspots or bytes differ) or ``unchanged``, matched by what and where it
    is (:data:`CAUSE_KEYS`, the module when no lines were recorded). Sorted by the size of the
    change in bytes."""
    keys = CAUSE_KEYS + ([] if (before["source"] != "").any() or (after["source"] != "").any() else ["module"])
    cols = [*keys, "module", "module_type", "fix", "hotspots", "bytes"]
    cols = list(dict.fromkeys(cols))
    m = before[cols].merge(after[cols], on=keys, how="outer", suffixes=("_before", "_after"), indicator=True)
    for c in ("module", "module_type", "fix"):
        if f"{c}_after" in m:
            m[c] = m[f"{c}_after"].fillna(m[f"{c}_before"])
    m = _status(m, ("hotspots", "bytes"), include_unchanged, keys)
    return m[["status", *dict.fromkeys([*CAUSE_KEYS, "module"]), "module_type", "fix", "hotspots_before",
              "hotspots_after", "bytes_before", "bytes_after", "bytes_delta"]].reset_index(drop=True)


def _per_key(frame: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """One row per key: a group split by cause in one audit is one group to compare."""
    if not frame.duplicated(keys).any():
        return frame
    agg = {c: "first" for c in frame.columns if c not in keys}
    agg.update({"count": "sum", "bytes": "sum"})
    return frame.groupby(keys, sort=False, dropna=False).agg(agg).reset_index()


def _status(m: pd.DataFrame, measures: tuple[str, str], include_unchanged: bool, keys: list[str]) -> pd.DataFrame:
    for c in measures:
        for side in ("before", "after"):
            m[f"{c}_{side}"] = m[f"{c}_{side}"].fillna(0).astype(np.int64)
    a, b = measures
    m["status"] = np.select(
        [
            m["_merge"] == "left_only",
            m["_merge"] == "right_only",
            (m[f"{a}_before"] != m[f"{a}_after"]) | (m[f"{b}_before"] != m[f"{b}_after"]),
        ],
        ["vanished", "appeared", "changed"],
        default="unchanged",
    )
    m["bytes_delta"] = m["bytes_after"] - m["bytes_before"]
    if not include_unchanged:
        m = m[m["status"] != "unchanged"]
    return m.assign(_abs=m["bytes_delta"].abs()).sort_values(["_abs"] + keys, ascending=[False] + [True] * len(keys))
