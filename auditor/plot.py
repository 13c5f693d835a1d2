"""Matplotlib figures built from the analysis DataFrames.

Every function returns a ``matplotlib.figure.Figure`` (an :class:`AuditFigure`) made without pyplot, so a notebook shows
it once (as the cell's value) and a script saves it (:func:`save`); nothing is drawn on import
and no global figure state is touched. The data behind each figure is available as a DataFrame
(:func:`heatmap_data`, :func:`timeline_data`, :func:`top_hotspots_data`) so that what is drawn
can be tested and reused.

Numbers read as in the report: cells and bar ends through ``display.units``, axes and colourbars
in engineering units (``802.8 kB``, ticks in one prefix, ``0 kB`` … ``15 kB``, never a ``1e7`` offset). Each
figure is sized from the text it holds, so no label is clipped at any depth.
"""

from __future__ import annotations

import io
import math
from collections.abc import Callable, Iterable
from functools import lru_cache
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import RendererAgg
from matplotlib.figure import Figure
from matplotlib.font_manager import FontProperties

from ._analysis._ops import op_times
from ._analysis._summaries import module_at_depth
from ._display._text import short_source, shorten
from ._display._units import QUANTITIES
from ._recording import _rules as rules
from ._recording._csv import atomic_write
from ._recording._formats import base_format
from ._result import Audit

__all__ = ["heatmap", "format_timeline", "top_hotspots", "heatmap_data", "timeline_data", "top_hotspots_data", "save"]


class AuditFigure(Figure):
    """A plain matplotlib Figure that also renders itself as PNG in Jupyter, with or without
    pyplot and whatever the backend: the notebook shows it once, as the cell's value."""

    def _repr_png_(self) -> bytes:
        buffer = io.BytesIO()
        self.savefig(buffer, format="png", dpi=100)
        return buffer.getvalue()


KIND_COLUMNS = (rules.LOSES, rules.CONVERTS, rules.RESTORES)
KIND_COLORS = {rules.LOSES: "#d64545", rules.CONVERTS: "#f0b429", rules.RESTORES: "#3ebd93"}
PHASE_ORDER = ("forward", "backward", "other")
NO_HOTSPOTS = "no hotspots: channels_last propagates"
_MAX_LABEL = 28  # module names, shortened from the left past this
_MAX_OP = 34  # op names in labels, likewise; the phase before them is never shortened
_MAX_BAR_MODULE = 40  # module names on top_hotspots' bars, which have room for more
_MAX_SOURCE = 60  # source lines on the bars (display's short form), shortened from the left past this
_TICK_ROTATION = 40  # degrees, for the heatmap's column labels
#: Heatmap values: the names users pass, each a Quantity of ``display.units`` (which formats
#: it) and a column of the heatmap's cell frame.
_HEATMAP_VALUES = ("time_us", "bytes", "count")
#: Bar lengths of ``top_hotspots``: time when the audit has it, else bytes.
_BAR_VALUES = ("time_us", "bytes")


def _timed(audit: Audit) -> bool:
    """Whether the audit's hotspots have times (the profiler's, else wall times)."""
    return bool(audit.hotspots()["time_us"].notna().any())


def _value(audit: Audit, value: str | None, allowed) -> str:
    """The value a figure shows: ``value``, checked, or by default time when the audit has
    times and bytes otherwise."""
    if value is None:
        return "time_us" if _timed(audit) else "bytes"
    if value not in allowed:
        raise ValueError(f"value must be {' or '.join(map(repr, allowed))}, got {value!r}")
    if value == "time_us" and not _timed(audit):
        raise ValueError("value='time_us' needs times: audit with record_time=True")
    return value


@lru_cache(maxsize=4096)
def _text_size(text: str, fontsize: float) -> tuple[float, float]:
    """Width and height of ``text`` in inches, as Agg renders it (without drawing a figure)."""
    w, h, _ = _measurer().get_text_width_height_descent(text, FontProperties(size=fontsize), ismath=False)
    return w / 72.0, h / 72.0


@lru_cache(maxsize=1)
def _measurer() -> RendererAgg:
    return RendererAgg(8, 8, 72)  # 72 dpi: sizes come back in points


def _widest(texts: Iterable[str], fontsize: float) -> float:
    return max((_text_size(t, fontsize)[0] for t in texts), default=0.0)


def _short_module(name: str, width: int = _MAX_LABEL) -> str:
    """A long module name without its leading parents (``…denseblock1.denselayer2``): whole
    names are dropped from the left, characters only when the last name alone is too long."""
    parts = name.split(".")
    while len(name) > width and len(parts) > 1:
        parts = parts[1:]
        name = "…" + ".".join(parts)
    return shorten(name, width)


def _no_hotspots_figure(title: str, detail: str) -> Figure:
    """A figure that says there is nothing to fix, instead of an empty grid and a 0-1 scale."""
    fig = AuditFigure(figsize=(6.0, 2.5), layout="constrained")
    ax = fig.add_subplot()
    ax.set_xticks([])
    ax.set_yticks([])
    for spine in ax.spines.values():
        spine.set_visible(False)
    ax.set_facecolor("#e3f9e5")
    ax.text(0.5, 0.58, NO_HOTSPOTS, ha="center", va="center", fontsize=13, color="#0e5814",
            transform=ax.transAxes)
    ax.text(0.5, 0.3, detail, ha="center", va="center", fontsize=8, color="#3f4a55", wrap=True,
            transform=ax.transAxes)
    ax.set_title(title, fontsize=10)
    return fig


def _ops_line(audit: Audit) -> str:
    phases = audit.events["phase"].astype(str).value_counts()
    parts = ", ".join(f"{phases[p]} {p}" for p in PHASE_ORDER if phases.get(p, 0))
    return f"{len(audit.events)} aten ops recorded ({parts or 'none'})"


def _heatmap_table(audit: Audit, depth: int, value: str, columns: str) -> tuple[pd.DataFrame, list[str]]:
    """The heatmap's table and the tick label of each column, phase spelled out in full."""
    if columns not in ("kind", "op"):
        raise ValueError(f"columns must be 'kind' or 'op', got {columns!r}")
    ops = audit.ops()
    module = module_at_depth(ops["module"], depth)
    order = pd.unique(module.to_numpy())
    hot = ops[ops["hotspot"]]
    frame = pd.DataFrame(
        {
            "module": module[hot.index].to_numpy(),
            "phase": hot["phase"].astype(str).to_numpy(),
            "kind": hot["kind"].astype(str).to_numpy(),
            "op": hot["op"].astype(str).str.removeprefix("aten.").to_numpy(),
            "bytes": hot["bytes"].to_numpy(),
            "time_us": op_times(hot),
            "count": 1,
        }
    )
    if columns == "kind":
        frame["column"] = frame["phase"] + " " + frame["kind"]
        cols = [f"{p} {k}" for p in PHASE_ORDER[:2] for k in KIND_COLUMNS]
        labels = list(cols)
    else:
        # The column key keeps its short phase ("for _softmax.default"); the label does not.
        frame["column"] = frame["phase"].str[:3] + " " + frame["op"]
        heads = frame.drop_duplicates("column").copy()
        heads["rank"] = heads["phase"].map({p: i for i, p in enumerate(PHASE_ORDER)}).fillna(len(PHASE_ORDER))
        heads = heads.sort_values(["rank", "op"], kind="stable")
        cols = heads["column"].tolist()
        labels = [f"{p} {shorten(o, _MAX_OP)}" for p, o in zip(heads["phase"], heads["op"], strict=True)]
    table = frame.pivot_table(index="module", columns="column", values=value, aggfunc="sum", fill_value=0)
    table = table.reindex(index=order, columns=cols, fill_value=0).fillna(0)
    table = table.astype(np.float64 if value == "time_us" else np.int64)
    table.index.name = "module"
    table.columns.name = None
    return table, labels


#: the deepest module level :func:`hotspot_depth` looks at
MAX_AUTO_DEPTH = 6


def hotspot_depth(audit: Audit, rows: int = 2) -> int:
    """The shallowest module depth at which the hotspots fall in at least ``rows`` modules: the
    heatmap's and the timeline's default, so that a model whose whole body is one top-level
    module (mobilenet's, efficientnet's ``features``) is not drawn as a single cell. 1 without
    hotspots, or the depth that splits them most when none reaches ``rows``."""
    ops = audit.ops()
    hot = ops.loc[ops["hotspot"], "module"]
    if not len(hot):
        return 1
    best, most = 1, 0
    for depth in range(1, MAX_AUTO_DEPTH + 1):
        n = module_at_depth(hot, depth).nunique()
        if n >= rows:
            return depth
        if n > most:
            best, most = depth, n
    return best


def _depth(audit: Audit, depth: int | None) -> int:
    return hotspot_depth(audit) if depth is None else depth


def heatmap_data(audit: Audit, depth: int | None = None, value: str | None = None, columns: str = "kind") -> pd.DataFrame:
    """Hotspot time in µs (``value="time_us"``, the default when the audit has times), bytes
    (the default otherwise) or counts per module at ``depth`` (rows, in execution order) and
    per phase × kind or per op (columns; op columns are keyed ``for``/``bac`` + op, forward
    first). Modules without hotspots keep a row of zeros. ``depth`` None: :func:`hotspot_depth`."""
    depth = _depth(audit, depth)
    return _heatmap_table(audit, depth, _value(audit, value, _HEATMAP_VALUES), columns)[0]


def heatmap(audit: Audit, depth: int | None = None, value: str | None = None, columns: str = "kind",
            max_rows: int = 60) -> Figure:
    """The format-loss heatmap: where (module) and what (phase × kind, or op) costs most, in
    time when the audit has times (else bytes; ``value`` picks, as in :func:`heatmap_data`).

    With more than ``max_rows`` modules, the rows without hotspots are dropped first, then the
    smallest; the title says how many were hidden. Without hotspots it says so instead of
    drawing an empty grid. ``depth`` None (the default): the shallowest depth that puts the
    hotspots in at least two modules (:func:`hotspot_depth`).
    """
    depth = _depth(audit, depth)
    value = _value(audit, value, _HEATMAP_VALUES)
    data, labels = _heatmap_table(audit, depth, value, columns)
    quantity = QUANTITIES[value]
    if not data.to_numpy().any():
        return _no_hotspots_figure(
            f"Format-loss heatmap (depth {depth})",
            f"{_ops_line(audit)}; none loses, converts or restores\n"
            f"the format between two convolutions ({len(data)} modules at depth {depth})",
        )
    data, labels, empty = _without_empty(data, labels)
    hidden = 0
    if len(data) > max_rows:
        totals = data.sum(axis=1)
        keep = set(totals.sort_values(ascending=False, kind="stable").index[:max_rows])
        hidden = len(data) - len(keep)
        data = data.loc[[m for m in data.index if m in keep]]
    rows, cols = data.shape
    values = data.to_numpy(dtype=float)
    texts = [[quantity.text(v) if v else "" for v in row] for row in values]
    ylabels = [_short_module(str(m)) for m in data.index]

    # Size the figure from its text: constrained layout then fits every label inside it.
    tick_font, cell_font = 8, 7
    angle = math.radians(_TICK_ROTATION)
    xlabel_w = _widest(labels, tick_font)
    cell_w = max(0.6, _widest((t for row in texts for t in row), cell_font) + 0.2)
    cell_h = 0.26
    left = max(_widest(ylabels, tick_font) + 0.55, xlabel_w * math.cos(angle) - cell_w / 2 + 0.2)
    bottom = xlabel_w * math.sin(angle) + 0.65
    title_lines = 2 if hidden or empty else 1
    width = max(6.0, left + cols * cell_w + 1.5)  # 1.5: colourbar, its ticks and label
    height = max(2.8, 0.35 + 0.25 * title_lines + rows * cell_h + bottom)
    fig = AuditFigure(figsize=(width, height), layout="constrained")
    ax = fig.add_subplot()
    image = ax.imshow(np.ma.masked_equal(values, 0), aspect="auto", cmap="Reds", interpolation="nearest",
                      vmin=0, vmax=float(values.max()))
    ax.set_xticks(range(cols), labels, rotation=_TICK_ROTATION, ha="right", rotation_mode="anchor",
                  fontsize=tick_font)
    ax.set_yticks(range(rows), ylabels, fontsize=tick_font)
    ax.set_xlabel("phase and op of the hotspots" if columns == "op" else "phase and kind of the hotspots", fontsize=9)
    ax.set_ylabel("module", fontsize=9)
    ax.set_facecolor("#f4f4f4")
    if columns == "op":  # a white rule between the forward and the backward columns
        phases = [label.split(" ", 1)[0] for label in labels]
        for j in range(1, cols):
            if phases[j] != phases[j - 1]:
                ax.axvline(j - 0.5, color="white", linewidth=3)
    peak = values.max()
    for i in range(rows):
        for j in range(cols):
            if texts[i][j]:
                ax.text(j, i, texts[i][j], ha="center", va="center", fontsize=cell_font,
                        color="white" if values[i, j] > 0.6 * peak else "black")
    title = f"Format-loss heatmap: {quantity.label} by module (depth {depth})"
    notes = [f"{empty} modules without hotspots"] * bool(empty) + [f"{hidden} with the least"] * bool(hidden)
    if notes:
        title += f"\nnot shown: {', '.join(notes)}"
    ax.set_title(title, fontsize=10)
    colorbar = fig.colorbar(image, ax=ax, shrink=min(0.9, 4.0 / (rows * cell_h)), anchor=(0.0, 1.0),
                            label=quantity.label)
    quantity.format_axis(colorbar.ax.yaxis)
    return fig


def _without_empty(data: pd.DataFrame, labels: list[str]) -> tuple[pd.DataFrame, list[str], int]:
    """The heatmap without its rows and columns of zeros (modules without hotspots, kinds no
    hotspot has), the labels of the columns kept, and how many rows were dropped."""
    rows = data.to_numpy().any(axis=1)
    cols = data.to_numpy().any(axis=0)
    return data.loc[rows, cols], [t for t, keep in zip(labels, cols, strict=True) if keep], int((~rows).sum())


#: The timeline's caption for its ``ambiguous`` lane.
AMBIGUOUS_NOTE = ("ambiguous: an activation with one channel or a 1×1 image (N×1×H×W, N×C×1×1), "
                  "whose strides fit both formats")
_LANES = ("channels_last", "channels_last_3d", "ambiguous", "contiguous", "other")


def timeline_data(audit: Audit) -> pd.DataFrame:
    """One row per op that writes a 4-D/5-D activation (views move no data and are left out):
    its execution position, phase, the format it wrote, and whether it is a convolution or a
    hotspot."""
    ops = audit.ops()
    lane = ops["out_format"].astype(str).map(base_format)
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


def _module_spans(modules: pd.Series, hotspot: np.ndarray, depth: int = 1) -> pd.DataFrame:
    """Runs of consecutive positions in one module at ``depth``: ``module``, ``start``,
    ``stop`` (exclusive), ``hot`` (holds a hotspot), in order. A module entered twice gets two
    runs."""
    names = module_at_depth(modules.reset_index(drop=True), depth).to_numpy()
    starts = np.flatnonzero(np.r_[True, names[1:] != names[:-1]]) if len(names) else np.zeros(0, np.int64)
    stops = np.r_[starts[1:], len(names)].astype(np.int64)
    hot = np.add.reduceat(np.asarray(hotspot, dtype=np.int64), starts) > 0 if len(names) else np.zeros(0, bool)
    return pd.DataFrame({"module": names[starts], "start": starts, "stop": stops, "hot": hot})


def _mark_modules(ax, spans: pd.DataFrame, n: int, axes_width: float, fontsize: float = 7) -> None:
    """Shade every other module run and name the runs at their centres below the x axis, in two
    staggered rows, runs with hotspots first, then the widest; a name that would overlap another
    in both rows is left out (its band is still shaded)."""
    lo, hi = -1.0, float(max(1, n))
    per_inch = (hi - lo) / axes_width
    for i, r in enumerate(spans.itertuples()):
        if i % 2:
            ax.axvspan(r.start - 0.5, r.stop - 0.5, color="#e9eef5", linewidth=0, zorder=0)
    rows: tuple[dict[float, str], dict[float, str]] = ({}, {})
    extents: tuple[list, list] = ([], [])
    sizes = (spans["stop"] - spans["start"]).to_numpy()
    for k in np.lexsort((-sizes, ~spans["hot"].to_numpy())):
        name = _short_module(spans["module"].iat[k])
        centre = (spans["start"].iat[k] + spans["stop"].iat[k] - 1) / 2
        half = (_text_size(name, fontsize)[0] / 2 + 0.06) * per_inch
        if 2 * half > hi - lo:
            continue
        centre = min(max(centre, lo + half), hi - half)  # a run at an edge: its name moves inward
        a, b = centre - half, centre + half
        for row, taken in zip(rows, extents, strict=True):
            if all(b <= s or a >= e for s, e in taken):
                taken.append((a, b))
                row[centre] = name
                break
    for row, minor in zip(rows, (False, True), strict=True):
        ax.set_xticks(sorted(row), [row[c] for c in sorted(row)], minor=minor, fontsize=fontsize)
    ax.tick_params(axis="x", which="both", length=0)
    ax.tick_params(axis="x", which="minor", pad=3.5 + 1.4 * fontsize)


def format_timeline(audit: Audit, depth: int | None = None) -> Figure:
    """The activation's memory format along the execution order, forward and backward, with
    convolutions marked, hotspots highlighted, and the modules at ``depth`` shaded and named
    along the x axis (so the reader sees where ``layer3`` starts); None: :func:`hotspot_depth`."""
    depth = _depth(audit, depth)
    data = timeline_data(audit)
    phases = [p for p in ("forward", "backward") if (data["phase"] == p).any()] or ["forward"]
    lanes = [f for f in _LANES if (data["format"] == f).any()] or ["channels_last"]
    width = 11.0
    axes_width = width - _widest(lanes, 8) - 0.9  # y tick labels, y label, pads
    fig = AuditFigure(figsize=(width, 1.5 + 1.3 * len(lanes) * len(phases)), layout="constrained")
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
            ax.vlines(x[conv], -0.4, len(lanes) - 0.6, color="#2f80ed", linewidth=0.6, alpha=0.6,
                      zorder=0.5, label="convolution")  # above the module bands (zorder 0)
        hot = d["hotspot"].to_numpy()
        if hot.any():
            ax.scatter(x[hot], y[hot], s=40, color="#d64545", marker="x", zorder=3, label="hotspot")
        ax.set_yticks(range(len(lanes)), lanes, fontsize=8)
        ax.set_ylim(-0.6, len(lanes) - 0.4)
        ax.set_xlim(-1, max(1, len(d)))
        _mark_modules(ax, _module_spans(d["module"], hot, depth), len(d), axes_width)
        ax.set_ylabel(phase, fontsize=9)
        ax.grid(axis="y", color="#e4e7eb", linewidth=0.5)
        ax.legend(loc="lower right", bbox_to_anchor=(1.0, 1.0), fontsize=7, ncol=3, frameon=False)
    note = "\n" + AMBIGUOUS_NOTE if "ambiguous" in lanes else ""
    axes[-1].set_xlabel(f"ops writing a 4-D/5-D activation, in execution order; shaded: modules at depth {depth}"
                        + note, fontsize=9)
    axes[0].set_title(f"Memory format of each activation written in the whole step ({' then '.join(phases)})",
                      fontsize=10, loc="left")
    return fig


def _short_source(source: str) -> str:
    """A source line in a label: as the report and the HTML show it
    (``tests/models.py:95``, ``torchvision/models/shufflenetv2.py:95``), from the left past
    :data:`_MAX_SOURCE` so a path outside every known folder cannot widen the figure."""
    return shorten(short_source(source), _MAX_SOURCE)


def _per_kind(frame: pd.DataFrame, keys: list[str], value: str) -> pd.DataFrame:
    """``value`` summed per kind (one column per kind) for each group of ``keys``."""
    wide = frame.pivot_table(index=keys, columns="kind", values=value, aggfunc="sum", fill_value=0)
    wide = wide.reindex(columns=list(KIND_COLUMNS), fill_value=0)
    return wide.astype(np.float64 if value == "time_us" else np.int64)


def _bars_by_group(audit: Audit, value: str) -> pd.DataFrame:
    """One bar per hotspot group, named by phase, module, op and source line (a module name is
    shortened only where that leaves the labels apart), largest ``value`` first."""
    hot = audit.hotspots().sort_values([value, "first_seq"], ascending=[False, True], kind="stable")
    hot = hot.reset_index(drop=True)
    def labels(width: int | None) -> list[str]:
        return [
            "  ".join(x for x in (r.phase, _short_module(r.module, width) if width else r.module,
                                  shorten(r.op.removeprefix("aten."), _MAX_OP), _short_source(r.source)) if x)
            for r in hot.itertuples()
        ]

    short, full = labels(_MAX_BAR_MODULE), labels(None)
    repeated = pd.Series(short).duplicated(keep=False).to_numpy()
    hot["label"] = np.where(repeated, full, short) if len(hot) else []
    for k in KIND_COLUMNS:
        hot[k] = np.where(hot["kind"] == k, hot[value], 0).astype(hot[value].dtype)
    hot["groups"] = 1
    return hot


def _bars_by_source(audit: Audit, value: str) -> pd.DataFrame:
    """One bar per source line: the hotspot groups it causes, summed."""
    hot = audit.hotspots()
    if hot.empty:
        return _bars_by_group(audit, value)
    if not (hot["source"] != "").any():
        raise ValueError("by='source' needs source lines: audit with record_source=True")
    g = hot.groupby("source", sort=False).agg(
        groups=("bytes", "size"), count=("count", "sum"), bytes=("bytes", "sum"),
        time_us=("time_us", lambda t: t.sum(min_count=1)),
        modules=("module", "nunique"), phases=("phase", lambda p: ", ".join(dict.fromkeys(p))),
        first_seq=("first_seq", "min"),
    )
    g = g.join(_per_kind(hot, ["source"], value)).reset_index()
    total = g["bytes"].sum()
    g["share"] = g["bytes"] / total if total else 0.0
    g = g.sort_values([value, "first_seq"], ascending=[False, True], ignore_index=True)
    g["label"] = [
        f"{_short_source(r.source) or '(no source line)'}  {r.groups} groups in {r.modules} modules, {r.phases}"
        for r in g.itertuples()
    ]
    return g


def _bars_by_cause(audit: Audit, value: str) -> pd.DataFrame:
    """One bar per cause (``Audit.causes()``, in its order: most time saved first when timed):
    the hotspot groups it leads to, summed by kind."""
    hot = audit.hotspots()
    causes = audit.causes()
    if hot.empty or causes.empty:
        return _bars_by_group(audit, value)
    kinds = _per_kind(hot, ["cause"], value)
    bars = causes.set_index("cause").join(kinds).fillna({k: 0 for k in KIND_COLUMNS}).reset_index()
    for k in KIND_COLUMNS:
        bars[k] = bars[k].astype(kinds[k].dtype)
    # a weight's cost includes its rebuilding copy, which is no hotspot: show it as a conversion
    bars[rules.CONVERTS] += (bars[value].fillna(0) - bars[list(KIND_COLUMNS)].sum(axis=1)).clip(lower=0)
    groups = hot.groupby("cause").size()
    bars["groups"] = bars["cause"].map(groups).fillna(0).astype(np.int64)
    bars["label"] = [
        "  ".join(x for x in (f"{r.cause}. {r.pattern}", shorten(r.op.removeprefix("aten."), _MAX_OP),
                              _short_source(r.source) or _short_module(r.module, _MAX_BAR_MODULE)) if x)
        for r in bars.itertuples()
    ]
    return bars


#: ``top_hotspots(by=...)``: how hotspot groups are put together into bars. Each takes the audit
#: and the bar value (``time_us`` or ``bytes``) and returns the bars in rank order, with
#: ``label``, ``bytes``, ``time_us``, ``groups`` and the value per kind.
BAR_GROUPINGS: dict[str, Callable[[Audit, str], pd.DataFrame]] = {
    "cause": _bars_by_cause,
    "group": _bars_by_group,
    "source": _bars_by_source,
}


def top_hotspots_data(audit: Audit, n: int = 10, by: str = "cause", value: str | None = None) -> pd.DataFrame:
    """The first ``n`` bars of :func:`top_hotspots`: one per cause (``by="cause"``, the rows of
    ``Audit.causes()`` with their symptoms, in its order), per hotspot group (``by="group"``,
    the rows of ``Audit.hotspots()``) or per source line (``by="source"``), with the bar's
    ``label`` and its ``value`` per kind: ``time_us`` (the default when the audit has times,
    ranked by it) or ``bytes`` (the default otherwise)."""
    if n < 1:
        raise ValueError(f"n must be at least 1, got {n}")
    if by not in BAR_GROUPINGS:
        raise ValueError(f"by must be one of {', '.join(map(repr, BAR_GROUPINGS))}, got {by!r}")
    value = _value(audit, value, _BAR_VALUES)
    return BAR_GROUPINGS[by](audit, value).head(n).reset_index(drop=True)


def top_hotspots(audit: Audit, n: int = 10, by: str = "cause", value: str | None = None) -> Figure:
    """A bar chart of the first ``n`` causes (or hotspot groups, ``by="group"``; source lines,
    ``by="source"``): the time they cost (bytes they move, when the audit has no times, or
    ``value="bytes"``), each with its symptoms. Each bar names what and where; bars are
    coloured (stacked) by the kind of the hotspots, and a cause's bar says what fixing it saves."""
    value = _value(audit, value, _BAR_VALUES)
    bars = top_hotspots_data(audit, n, by, value)
    if bars.empty:
        return _no_hotspots_figure("Top hotspots", f"{_ops_line(audit)}; nothing to rank")
    quantity = QUANTITIES[value]
    kinds = [k for k in KIND_COLUMNS if bars[k].any()]
    savings = _savings(bars, value)
    ends = []  # the bar's total, its kind when it has one, and what a fix saves
    for (_, r), saved in zip(bars.iterrows(), savings, strict=True):
        present = [k for k in kinds if r[k]]
        text = quantity.text(r[value]) + (f" {present[0]}" if len(present) == 1 else "")
        ends.append(text + (f"; a fix saves ~{QUANTITIES['time_us'].text(saved)}" if saved == saved else ""))
    label_w, end_w = _widest(bars["label"], 8), _widest(ends, 8)
    plot_w = max(4.0, end_w + 2.5)
    fig = AuditFigure(figsize=(label_w + plot_w + 0.6, max(2.2, 0.34 * len(bars) + 1.5)), layout="constrained")
    ax = fig.add_subplot()
    y = np.arange(len(bars))[::-1]
    left = np.zeros(len(bars))
    for k in kinds:
        ax.barh(y, bars[k], left=left, color=KIND_COLORS[k], label=k, height=0.7)
        left += bars[k].to_numpy()
    if np.isfinite(savings).any():
        ax.barh(y, np.nan_to_num(savings), height=0.7, fill=False, hatch="////", edgecolor="#1f2933",
                linewidth=0.6, label="a fix saves")
    ax.set_yticks(y, bars["label"], fontsize=8)
    for yi, b, text in zip(y, left, ends, strict=True):
        ax.text(b, yi, " " + text, va="center", fontsize=8)
    ax.set_xlabel(quantity.label)
    quantity.format_axis(ax.xaxis)
    # room for each bar's text after its end, and no more: the longest bar does not set the scale alone
    axes_w = plot_w - 0.4
    widths = [_text_size(" " + t, 8)[0] for t in ends]
    ax.set_xlim(0, max(max(b / max(0.05, 1 - w / axes_w) for b, w in zip(left, widths, strict=True)), 1e-9) * 1.02)
    what = {"cause": ("cause", "causes"), "group": ("hotspot group", "hotspot groups"),
            "source": ("source line", "source lines")}.get(by, (f"hotspot by {by}", f"hotspots by {by}"))
    ax.set_title(f"Top {what[0]}" if len(bars) == 1 else f"Top {len(bars)} {what[1]}", fontsize=10, loc="left")
    ax.legend(loc="lower right", bbox_to_anchor=(1.0, 1.0), ncol=len(kinds) + 1, fontsize=7, frameon=False)
    return fig


def _savings(bars: pd.DataFrame, value: str) -> np.ndarray:
    """Per bar, what fixing it saves in µs (NaN where unknown, or where the bars are bytes)."""
    if value != "time_us" or "saving_us" not in bars:
        return np.full(len(bars), np.nan)
    return bars["saving_us"].to_numpy(dtype=float)


def save(fig: Figure, path, dpi: int = 100, format: str | None = None) -> None:
    """Write ``fig`` to ``path`` (whole or not at all); the format comes from the suffix unless given."""
    fmt = format or (Path(path).suffix.lstrip(".") or "png")
    atomic_write(path, lambda tmp: fig.savefig(tmp, dpi=dpi, format=fmt))
