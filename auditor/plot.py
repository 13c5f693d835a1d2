"""Matplotlib figures built from the analysis DataFrames.

Every function returns a ``matplotlib.figure.Figure`` (an :class:`AuditFigure`) made without pyplot, so a notebook shows
it once (as the cell's value) and a script saves it (:func:`save`); nothing is drawn on import
and no global figure state is touched. The data behind each figure is available as a DataFrame
(:func:`heatmap_data`, :func:`timeline_data`) so that what is drawn can be tested and reused.
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from . import analysis
from .display.tables import shorten
from .display.units import format_bytes
from .recording import rules
from .result import Audit


class AuditFigure(Figure):
    """A plain matplotlib Figure that also renders itself as PNG in Jupyter, with or without
    pyplot and whatever the backend: the notebook shows it once, as the cell's value."""

    def _repr_png_(self) -> bytes:
        buffer = io.BytesIO()
        self.savefig(buffer, format="png", dpi=100)
        return buffer.getvalue()


KIND_COLUMNS = (rules.LOSES, rules.CONVERTS, rules.RESTORES)
PHASE_ORDER = ("forward", "backward", "other")
_MAX_LABEL = 28


def heatmap_data(audit: Audit, depth: int = 1, value: str = "bytes", columns: str = "kind") -> pd.DataFrame:
    """Hotspot bytes (or counts) per module at ``depth`` (rows, in execution order) and per
    phase × kind or per op (columns). Modules without hotspots keep a row of zeros."""
    if value not in ("bytes", "count"):
        raise ValueError(f"value must be 'bytes' or 'count', got {value!r}")
    if columns not in ("kind", "op"):
        raise ValueError(f"columns must be 'kind' or 'op', got {columns!r}")
    ops = audit.ops()
    module = analysis.module_at_depth(ops["module"], depth)
    order = pd.unique(module.to_numpy())
    hot = ops[ops["hotspot"]]
    frame = pd.DataFrame(
        {
            "module": module[hot.index].to_numpy(),
            "phase": hot["phase"].astype(str).to_numpy(),
            "kind": hot["kind"].astype(str).to_numpy(),
            "op": hot["op"].astype(str).to_numpy(),
            "bytes": hot["bytes"].to_numpy(),
            "count": 1,
        }
    )
    if columns == "kind":
        frame["column"] = frame["phase"] + " " + frame["kind"]
        cols = [f"{p} {k}" for p in PHASE_ORDER[:2] for k in KIND_COLUMNS]
    else:
        frame["column"] = frame["phase"].str[:3] + " " + frame["op"].str.removeprefix("aten.")
        cols = sorted(frame["column"].unique())
    table = frame.pivot_table(index="module", columns="column", values=value, aggfunc="sum", fill_value=0)
    table = table.reindex(index=order, columns=cols, fill_value=0).fillna(0).astype(np.int64)
    table.index.name = "module"
    table.columns.name = None
    return table


def heatmap(audit: Audit, depth: int = 1, value: str = "bytes", columns: str = "kind", max_rows: int = 60) -> Figure:
    """The format-loss heatmap: where (module) and what (phase × kind, or op) costs most.

    With more than ``max_rows`` modules, the rows without hotspots are dropped first, then the
    smallest; the title says how many were hidden.
    """
    data = heatmap_data(audit, depth, value, columns)
    hidden = 0
    if len(data) > max_rows:
        totals = data.sum(axis=1)
        keep = totals.sort_values(ascending=False, kind="stable").index[:max_rows]
        hidden = len(data) - len(keep)
        data = data.loc[[m for m in data.index if m in set(keep)]]
    rows, cols = data.shape
    width = max(6.0, 1.1 * cols + 3.2)
    height = max(2.5, 0.3 * rows + 1.8)
    fig = AuditFigure(figsize=(width, height), layout="constrained")
    ax = fig.add_subplot()
    values = data.to_numpy(dtype=float)
    shown = np.ma.masked_equal(values, 0)
    image = ax.imshow(shown, aspect="auto", cmap="Reds", interpolation="nearest",
                      vmin=0, vmax=max(1.0, float(values.max()) if values.size else 1.0))
    ax.set_xticks(range(cols), [shorten(c, 22) for c in data.columns], rotation=35, ha="right", fontsize=8)
    ax.set_yticks(range(rows), [shorten(str(m), _MAX_LABEL) for m in data.index], fontsize=8)
    ax.set_facecolor("#f4f4f4")
    peak = values.max() if values.size else 0
    for i in range(rows):
        for j in range(cols):
            v = values[i, j]
            if v:
                text = format_bytes(v) if value == "bytes" else f"{int(v)}"
                ax.text(j, i, text, ha="center", va="center", fontsize=7,
                        color="white" if v > 0.6 * peak else "black")
    unit = "bytes moved" if value == "bytes" else "hotspot ops"
    title = f"Format-loss heatmap: {unit} by module (depth {depth})"
    if hidden:
        title += f"\n{hidden} rows with the least hidden"
    if not values.any():
        title += "\nno hotspots: channels_last propagates"
    ax.set_title(title, fontsize=10)
    fig.colorbar(image, ax=ax, shrink=0.8, label=unit)
    return fig


_LANES = ("channels_last", "channels_last_3d", "ambiguous", "contiguous", "other")


def timeline_data(audit: Audit) -> pd.DataFrame:
    """One row per op that writes a 4-D/5-D activation (views move no data and are left out):
    its execution position, phase, the format it wrote, and whether it is a convolution or a
    hotspot."""
    ops = audit.ops()
    lane = ops["out_format"].astype(str).str.replace("_view", "", regex=False)
    keep = lane.isin(_LANES) & (ops["kind"].astype(str) != rules.VIEW)
    return pd.DataFrame(
        {
            "seq": ops["seq"][keep].to_numpy(),
            "phase": ops["phase"][keep].astype(str).to_numpy(),
            "format": lane[keep].to_numpy(),
            "is_conv": ops["is_conv"][keep].to_numpy(),
            "hotspot": ops["hotspot"][keep].to_numpy(),
            "op": ops["op"][keep].astype(str).to_numpy(),
            "module": ops["module"][keep].astype(str).to_numpy(),
        }
    )


def format_timeline(audit: Audit) -> Figure:
    """The activation's memory format along the execution order, forward and backward, with
    convolutions marked and hotspots highlighted."""
    data = timeline_data(audit)
    phases = [p for p in ("forward", "backward") if (data["phase"] == p).any()] or ["forward"]
    lanes = [f for f in _LANES if (data["format"] == f).any()] or ["channels_last"]
    fig = AuditFigure(figsize=(11, 1.3 + 1.1 * len(lanes) * len(phases)), layout="constrained")
    axes = fig.subplots(len(phases), 1, squeeze=False)[:, 0]
    y_of = {f: i for i, f in enumerate(lanes)}
    for ax, phase in zip(axes, phases, strict=True):
        d = data[data["phase"] == phase]
        x = np.arange(len(d))
        y = d["format"].map(y_of).to_numpy()
        ax.step(x, y, where="mid", color="#9aa5b1", linewidth=0.8, zorder=1)
        ax.scatter(x, y, s=6, color="#52606d", zorder=2, label="op")
        conv = d["is_conv"].to_numpy()
        if conv.any():
            ax.vlines(x[conv], -0.4, len(lanes) - 0.6, color="#2f80ed", linewidth=0.5, alpha=0.5,
                      zorder=0, label="convolution")
        hot = d["hotspot"].to_numpy()
        if hot.any():
            ax.scatter(x[hot], y[hot], s=40, color="#d64545", marker="x", zorder=3, label="hotspot")
        ax.set_yticks(range(len(lanes)), lanes, fontsize=8)
        ax.set_ylim(-0.6, len(lanes) - 0.4)
        ax.set_xlim(-1, max(1, len(d)))
        ax.set_ylabel(phase, fontsize=9)
        ax.grid(axis="y", color="#e4e7eb", linewidth=0.5)
        ax.legend(loc="upper right", fontsize=7, ncol=3, frameon=False)
    axes[-1].set_xlabel("ops writing a 4-D/5-D activation, in execution order", fontsize=9)
    axes[0].set_title("Memory format of the activation along the model", fontsize=10)
    return fig


def top_hotspots(audit: Audit, n: int = 10) -> Figure:
    """A bar chart of the ``n`` hotspot groups that move the most bytes."""
    if n < 1:
        raise ValueError(f"n must be at least 1, got {n}")
    hot = audit.hotspots().head(n)
    fig = AuditFigure(figsize=(9, max(2.0, 0.4 * len(hot) + 1.2)), layout="constrained")
    ax = fig.add_subplot()
    if hot.empty:
        ax.text(0.5, 0.5, "no hotspots: channels_last propagates", ha="center", va="center")
        ax.set_axis_off()
        return fig
    labels = [
        f"{r.phase[:3]}  {shorten(r.module, 24)}  {shorten(r.op.removeprefix('aten.'), 30)}"
        for r in hot.itertuples()
    ]
    colors = {rules.LOSES: "#d64545", rules.CONVERTS: "#f0b429", rules.RESTORES: "#3ebd93"}
    y = np.arange(len(hot))[::-1]
    ax.barh(y, hot["bytes"], color=[colors.get(k, "#9aa5b1") for k in hot["kind"]])
    ax.set_yticks(y, labels, fontsize=8)
    for yi, b, k in zip(y, hot["bytes"], hot["kind"], strict=True):
        ax.text(b, yi, f" {format_bytes(b)} {k}", va="center", fontsize=7)
    ax.set_xlabel("bytes moved")
    ax.set_xlim(0, hot["bytes"].max() * 1.3)
    ax.set_title(f"Top {len(hot)} hotspots", fontsize=10)
    return fig


def save(fig: Figure, path, dpi: int = 100, format: str | None = None) -> None:
    """Write ``fig`` to ``path``; the format comes from the suffix unless given."""
    fig.savefig(path, dpi=dpi, format=format or (Path(path).suffix.lstrip(".") or "png"))
