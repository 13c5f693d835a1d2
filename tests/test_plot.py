"""The figures are drawn from the analysis DataFrames, and the pictures are not blank."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
import torch.nn as nn
import torchvision
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.image import imread
from matplotlib.text import Text
from matplotlib.ticker import EngFormatter
from planted import make

import auditor
from auditor import plot
from auditor._display._text import short_source
from auditor._display._units import QUANTITIES, format_bytes


@pytest.fixture(scope="module")
def softmax_audit():
    model, x = make("softmax")
    return auditor.audit(model, x)


def ink(path) -> float:
    """Share of pixels that are not the white background."""
    img = imread(path)[..., :3]
    return float((img < 0.97).any(axis=-1).mean())


def test_heatmap_data_rows_and_columns(softmax_audit):
    data = plot.heatmap_data(softmax_audit, depth=1, value="bytes")
    assert list(data.index) == ["conv1", "mid", "conv2", "<global>"]  # execution order
    assert list(data.columns) == [f"{p} {k}" for p in ("forward", "backward") for k in ("loses", "converts", "restores")]
    assert data.loc["mid", "forward loses"] == 2 * 8 * 8 * 8 * 4
    assert data.loc["mid", "backward loses"] == 2 * 8 * 8 * 8 * 4
    assert data.loc["conv2", "forward converts"] == 2 * 8 * 8 * 8 * 4
    assert data.to_numpy().sum() == softmax_audit.hotspots()["bytes"].sum()
    counts = plot.heatmap_data(softmax_audit, value="count")
    assert counts.to_numpy().sum() == softmax_audit.hotspots()["count"].sum()
    by_op = plot.heatmap_data(softmax_audit, columns="op")
    assert "for _softmax.default" in by_op.columns
    with pytest.raises(ValueError, match="value"):
        plot.heatmap_data(softmax_audit, value="time")
    with pytest.raises(ValueError, match="columns"):
        plot.heatmap_data(softmax_audit, columns="phase")


def test_figures_show_time_when_the_audit_has_it(softmax_audit):
    """Timed audits: the heatmap's cells and the top chart's bars are kernel time, ranked by it;
    untimed ones keep bytes."""
    hot = softmax_audit.hotspots()
    data = plot.heatmap_data(softmax_audit)
    assert data.dtypes.eq("float64").all()
    assert data.to_numpy().sum() == pytest.approx(hot["time_us"].sum())
    assert data.loc["mid", "forward loses"] == pytest.approx(
        hot.loc[(hot["module"] == "mid") & (hot["phase"] == "forward") & (hot["kind"] == "loses"), "time_us"].sum())
    fig = plot.heatmap(softmax_audit)
    draw(fig)
    assert all(t.get_text().endswith("s") for t in fig.axes[0].texts)
    assert "time" in fig.axes[0].get_title()
    bars = plot.top_hotspots_data(softmax_audit, by="group")
    assert bars["time_us"].is_monotonic_decreasing
    assert np.allclose(bars[["loses", "converts", "restores"]].sum(axis=1), bars["time_us"])
    by_cause = plot.top_hotspots(softmax_audit)
    draw(by_cause)
    ax = by_cause.axes[0]
    assert ax.get_xlabel() == QUANTITIES["time_us"].label
    assert all(t.get_text().endswith("s") for t in shown_ticks(ax.xaxis))
    assert any("fix saves" in t.get_text() for t in ax.texts)
    model, x = make("softmax")
    untimed = auditor.audit(model, x, record_time=False)
    assert plot.heatmap_data(untimed).dtypes.eq("int64").all()
    assert plot.top_hotspots(untimed).axes[0].get_xlabel() == QUANTITIES["bytes"].label
    with pytest.raises(ValueError, match="record_time=True"):
        plot.heatmap_data(untimed, value="time_us")
    with pytest.raises(ValueError, match="value must be"):
        plot.top_hotspots_data(softmax_audit, value="count")


def test_pngs_are_written_and_not_blank(softmax_audit, tmp_path):
    for name, fig in {
        "heatmap": plot.heatmap(softmax_audit),
        "timeline": plot.format_timeline(softmax_audit),
        "top": plot.top_hotspots(softmax_audit, n=5),
    }.items():
        assert isinstance(fig, Figure)
        path = tmp_path / f"{name}.png"
        plot.save(fig, path)
        width, height = fig.get_size_inches() * 100
        img = imread(path)
        assert img.shape[0] > 150 and img.shape[1] > 300
        assert abs(img.shape[1] - width) < 2 and abs(img.shape[0] - height) < 2
        assert ink(path) > 0.03, name
        assert fig._repr_png_().startswith(b"\x89PNG")


def test_timeline_data_marks_convs_and_hotspots(softmax_audit):
    data = plot.timeline_data(softmax_audit)
    assert set(data["phase"]) == {"forward", "backward"}
    fw = data[data["phase"] == "forward"]
    assert fw["is_conv"].sum() == 2
    assert fw[fw["hotspot"]]["op"].tolist() == ["aten._softmax.default", "aten.convolution.default"]
    assert fw[fw["op"] == "aten._softmax.default"]["format"].iloc[0] == "contiguous"


def test_clean_model_draws_an_empty_but_labelled_heatmap(tmp_path):
    model, x = make("clean")
    a = auditor.audit(model, x)
    assert plot.heatmap_data(a).to_numpy().sum() == 0
    plot.save(plot.heatmap(a), tmp_path / "h.png")
    plot.save(plot.top_hotspots(a), tmp_path / "t.png")
    assert ink(tmp_path / "h.png") > 0.03 and ink(tmp_path / "t.png") > 0.001


@pytest.mark.slow
@pytest.mark.parametrize("name, depth", [("resnet50", 2), ("densenet121", 3)])
def test_heatmap_stays_readable_on_big_models(tmp_path, name, depth):
    torch.manual_seed(0)
    model = getattr(torchvision.models, name)(weights=None).to(memory_format=torch.channels_last)
    a = auditor.audit(model, torch.randn(2, 3, 32, 32).to(memory_format=torch.channels_last), backward=False)
    fig = plot.heatmap(a, depth=depth, max_rows=60)
    fig.canvas.draw()
    ax = fig.axes[0]
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert len(labels) <= 60 and all(len(t) <= 28 for t in labels)
    boxes = [t.get_window_extent() for t in ax.get_yticklabels()]
    ys = sorted((b.y0, b.y1) for b in boxes)
    assert all(lo2 >= hi1 - 0.5 for (_, hi1), (lo2, _) in zip(ys, ys[1:])), "tick labels overlap"
    xboxes = [t.get_window_extent() for t in ax.get_xticklabels()]
    assert all(b.width > 0 for b in xboxes)
    assert np.isfinite(fig.get_size_inches()).all()


class TwoBreaks(nn.Module):
    """conv1 -> softmax (loses) -> conv2 -> .contiguous() (converts) -> conv3: hotspots from
    several source lines of this file."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1)
        self.conv3 = nn.Conv2d(8, 8, 3, padding=1)

    def forward(self, x):
        y = torch.softmax(self.conv1(x), dim=1)
        y = self.conv2(y)
        return self.conv3(y.contiguous())


@pytest.fixture(scope="module")
def two_breaks_audit():
    """Hotspots of 1.6 MB each: a plain axis would print them with a 1e6 offset."""
    torch.manual_seed(0)
    model = TwoBreaks().to(memory_format=torch.channels_last)
    x = torch.randn(2, 3, 160, 160).to(memory_format=torch.channels_last)
    return auditor.audit(model, x, record_source=True)


def draw(fig):
    """Lay the figure out and render it; returns the renderer that measured the text."""
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    return canvas.get_renderer()


def colorbars(fig) -> list:
    return [ax for ax in fig.axes if ax.get_label() == "<colorbar>"]


def texts(fig) -> list[str]:
    return [t.get_text() for t in fig.findobj(Text) if t.get_visible() and t.get_text()]


def x_labels(ax) -> list[str]:
    return [t.get_text() for which in ("major", "minor") for t in ax.get_xticklabels(which=which) if t.get_text()]


def shown_ticks(axis, which: str = "both") -> list[Text]:
    """The tick labels an x or y axis shows: visible, not empty, at a tick inside the view."""
    lo, hi = sorted(axis.get_view_interval())
    eps = 1e-9 * (hi - lo)
    i = 0 if axis.axis_name == "x" else 1
    return [t for t in axis.get_ticklabels(which=which)
            if t.get_visible() and t.get_text() and lo - eps <= t.get_position()[i] <= hi + eps]


def drawn_tick_labels(fig, axes=None) -> list[Text]:
    """The tick labels the figure (or those of its ``axes``) shows."""
    return [t for ax in (fig.axes if axes is None else axes) for axis in (ax.xaxis, ax.yaxis) for t in shown_ticks(axis)]


def assert_text_inside(fig, renderer) -> int:
    """Every text the figure shows (tick labels, titles, cells, legend) lies inside it; returns
    how many texts were checked."""
    tick_labels = {id(t) for ax in fig.axes for axis in (ax.xaxis, ax.yaxis)
                   for tick in [*axis.majorTicks, *axis.minorTicks] for t in (tick.label1, tick.label2)}
    shown = drawn_tick_labels(fig) + [t for t in fig.findobj(Text) if id(t) not in tick_labels
                                      and t.get_visible() and t.get_text()]
    box = fig.bbox
    for t in shown:
        b = t.get_window_extent(renderer)
        assert b.x0 >= box.x0 - 1 and b.x1 <= box.x1 + 1 and b.y0 >= box.y0 - 1 and b.y1 <= box.y1 + 1, (
            f"{t.get_text()!r} at {b} is outside the figure {box}")
    return len(shown)


def assert_no_overlap(labels: list[Text], renderer, what: str) -> None:
    """No two of ``labels`` cover each other (a figure squeezed too small overlaps its labels
    before it clips them)."""
    boxes = [(t.get_window_extent(renderer), t.get_text()) for t in labels]
    for i, (b1, t1) in enumerate(boxes):
        for b2, t2 in boxes[i + 1:]:
            w = min(b1.x1, b2.x1) - max(b1.x0, b2.x0)
            h = min(b1.y1, b2.y1) - max(b1.y0, b2.y0)
            assert w <= 0.5 or h <= 0.5, f"{what}: {t1!r} and {t2!r} overlap"


def top_down(ax) -> list[str]:
    """The y tick labels from the top of the axes down."""
    return [t.get_text() for t in sorted(ax.get_yticklabels(), key=lambda t: -t.get_position()[1])]


def test_heatmap_cells_and_colourbar_read_like_the_report(two_breaks_audit):
    a = two_breaks_audit
    data = plot.heatmap_data(a, value="bytes")
    fig = plot.heatmap(a, value="bytes")
    renderer = draw(fig)
    ax = fig.axes[0]
    cells = sorted(t.get_text() for t in ax.texts)
    assert cells == sorted(format_bytes(v) for v in data.to_numpy().ravel() if v)
    assert all(c.endswith("MB") for c in cells), cells  # 1.6 MB, as the report writes it
    assert all(c in a.report() for c in cells)
    [cbar] = colorbars(fig)
    assert isinstance(cbar.yaxis.get_major_formatter(), EngFormatter)
    ticks = [t.get_text() for t in shown_ticks(cbar.yaxis)]
    assert len(ticks) >= 2 and all(t.endswith("B") for t in ticks), ticks
    assert any(t.endswith(" MB") for t in ticks), ticks
    assert cbar.yaxis.get_offset_text().get_text() == ""  # no "1e6"
    assert assert_text_inside(fig, renderer) > len(cells)

    counts = plot.heatmap(a, value="count")
    draw(counts)
    assert sorted(t.get_text() for t in counts.axes[0].texts) == sorted(
        str(v) for v in plot.heatmap_data(a, value="count").to_numpy().ravel() if v)
    [cbar] = colorbars(counts)
    assert all(t.get_text().isdigit() for t in shown_ticks(cbar.yaxis))


def test_each_value_kind_has_one_formatter():
    """Text as the report writes it; axes in engineering units, a fresh formatter per axis;
    times are stored in µs and read in s."""
    q = QUANTITIES["bytes"]
    assert q.text(802_800) == format_bytes(802_800) == "802.8 kB"
    assert q.axis_formatter() is not q.axis_formatter()
    assert isinstance(q.axis_formatter(), EngFormatter) and q.axis_formatter()(14e6) == "14 MB"
    t = QUANTITIES["time_us"]
    assert t.text(404.7) == "404.7 µs" and t.text(float("nan")) == "-"
    assert isinstance(t.axis_formatter(), EngFormatter) and t.axis_formatter()(58_400) == "58.4 ms"
    assert QUANTITIES["count"].text(3.0) == "3"


def test_heatmap_labels_spell_out_the_phase(softmax_audit):
    for columns in ("kind", "op"):
        fig = plot.heatmap(softmax_audit, columns=columns)
        labels = [t.get_text() for t in fig.axes[0].get_xticklabels()]
        assert labels and all(t.split(" ")[0] in ("forward", "backward") for t in labels), labels
        phases = [t.split(" ")[0] for t in labels]
        assert phases == sorted(phases, key=("forward", "backward").index)  # forward first
    assert "forward _softmax.default" in labels
    assert "backward _softmax_backward_data.default" in labels
    assert "for _softmax.default" in plot.heatmap_data(softmax_audit, columns="op").columns  # the data keeps its key


def test_clean_model_says_there_is_nothing_to_fix():
    model, x = make("clean")
    a = auditor.audit(model, x)
    for fig in (plot.heatmap(a), plot.heatmap(a, depth=2, value="count", columns="op"), plot.top_hotspots(a)):
        assert_text_inside(fig, draw(fig))
        assert colorbars(fig) == []
        assert not any(ax.images for ax in fig.axes)  # no empty grid
        assert not any(ax.patches for ax in fig.axes)  # no bars
        assert "no hotspots: channels_last propagates" in texts(fig)
    assert plot.top_hotspots_data(a).empty and plot.top_hotspots_data(a, by="source").empty


def test_timeline_names_the_top_level_modules(softmax_audit, two_breaks_audit):
    fig = plot.format_timeline(softmax_audit)
    draw(fig)
    assert len(fig.axes) == 2  # forward and backward
    for ax in fig.axes:
        assert {"conv1", "mid", "conv2"} <= set(x_labels(ax)), x_labels(ax)
    backward = x_labels(fig.axes[1])
    assert backward.index("conv2") < backward.index("conv1")  # backward runs the model in reverse
    fig = plot.format_timeline(two_breaks_audit)
    draw(fig)
    for ax in fig.axes:
        assert {"conv1", "conv2", "conv3"} <= set(x_labels(ax))


def test_top_hotspots_name_phase_module_op_and_line(two_breaks_audit):
    a = two_breaks_audit
    hot = a.hotspots()
    bars = plot.top_hotspots_data(a, n=20, by="group")
    assert len(bars) == len(hot) and bars["time_us"].tolist() == hot["time_us"].tolist()
    assert bars["label"].is_unique
    for label, r in zip(bars["label"], hot.itertuples(), strict=True):
        line = r.source.rsplit(":", 1)[1]
        where = short_source(r.source)  # as the report and the HTML show it
        assert where.endswith(f"test_plot.py:{line}") and len(where) < len(r.source)
        assert label.split("  ") == [r.phase, r.module, r.op.removeprefix("aten."), where]
    fig = plot.top_hotspots(a, n=20, by="group", value="bytes")
    renderer = draw(fig)
    ax = fig.axes[0]
    by_bytes = plot.top_hotspots_data(a, n=20, by="group", value="bytes")
    assert by_bytes["bytes"].is_monotonic_decreasing
    assert top_down(ax) == by_bytes["label"].tolist()  # first on top
    assert isinstance(ax.xaxis.get_major_formatter(), EngFormatter)
    assert all(t.get_text().endswith("B") for t in shown_ticks(ax.xaxis))
    assert ax.xaxis.get_offset_text().get_text() == ""
    assert assert_text_inside(fig, renderer) > len(bars)

    by_line = plot.top_hotspots_data(a, by="source", value="bytes")
    expected = hot.groupby("source")["bytes"].sum()
    assert by_line["source"].is_unique and len(by_line) == hot["source"].nunique() >= 3
    assert dict(zip(by_line["source"], by_line["bytes"], strict=True)) == expected.to_dict()
    assert by_line["bytes"].is_monotonic_decreasing
    assert (by_line[["loses", "converts", "restores"]].sum(axis=1) == by_line["bytes"]).all()
    assert by_line["groups"].sum() == len(hot)
    assert all(label.startswith(short_source(source) + "  ") and short_source(source).endswith(
        f"test_plot.py:{source.rsplit(':', 1)[1]}") for label, source in zip(by_line["label"], by_line["source"]))
    fig = plot.top_hotspots(a, by="source", value="bytes")
    draw(fig)
    assert top_down(fig.axes[0]) == by_line["label"].tolist()
    by_time = plot.top_hotspots_data(a, by="source")
    assert by_time["time_us"].is_monotonic_decreasing
    assert np.allclose(by_time[["loses", "converts", "restores"]].sum(axis=1), by_time["time_us"])
    assert len(plot.top_hotspots_data(a, n=2, by="source")) == 2
    with pytest.raises(ValueError, match="by must be one of 'cause', 'group', 'source'"):
        plot.top_hotspots(a, by="module")
    with pytest.raises(ValueError, match="n must be"):
        plot.top_hotspots_data(a, n=0)


def test_top_hotspots_by_source_needs_source_lines():
    model, x = make("softmax")
    without = auditor.audit(model, x, record_source=False)
    with pytest.raises(ValueError, match="record_source=True"):
        plot.top_hotspots(without, by="source")
    labels = plot.top_hotspots_data(without, by="group")["label"]
    assert labels.str.split("  ").str.len().eq(3).all()  # phase, module, op: no empty source


def test_short_source_names_tell_files_apart(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # sources are shown relative to the working directory
    sources = [f"{tmp_path}/x/model.py:3", f"{tmp_path}/y/model.py:3", f"{tmp_path}/y/net.py:12", ""]
    bars = {s: plot._short_source(s) for s in sources}
    assert bars == {sources[0]: "x/model.py:3", sources[1]: "y/model.py:3", sources[2]: "y/net.py:12", "": ""}


@pytest.fixture(scope="module")
def broken_densenet_audit():
    """densenet121 with a `.contiguous()` planted in two dense layers: long module names at every
    depth and about 60 rows at depth 3."""

    class Contiguous(nn.Module):
        def forward(self, x):
            return x.contiguous()

    torch.manual_seed(0)
    model = torchvision.models.densenet121(weights=None)
    for name in ("denseblock1.denselayer2", "denseblock3.denselayer20"):
        layer = model.features.get_submodule(name)
        layer.relu2 = nn.Sequential(nn.ReLU(), Contiguous())
    model = model.to(memory_format=torch.channels_last)
    x = torch.randn(2, 3, 32, 32).to(memory_format=torch.channels_last)
    return auditor.audit(model, x, record_source=True)


@pytest.mark.slow
@pytest.mark.parametrize("depth", [1, 2, 3])
def test_every_label_fits_inside_the_figure(broken_densenet_audit, depth):
    a = broken_densenet_audit
    assert len(a.hotspots()) >= 4
    figures = {
        "heatmap": plot.heatmap(a, depth=depth),
        "heatmap by op": plot.heatmap(a, depth=depth, columns="op"),
        "timeline": plot.format_timeline(a, depth=depth),
    }
    if depth == 1:
        figures |= {"top": plot.top_hotspots(a, by="group"), "top by source": plot.top_hotspots(a, by="source"),
                    "top by cause": plot.top_hotspots(a)}
        bars = plot.top_hotspots_data(a, n=20, by="group")["label"]
        assert bars.is_unique and len(bars) == len(a.hotspots())
        assert {"denseblock1.denselayer2", "denseblock3.denselayer20"} <= {
            ".".join(label.split("  ")[1].split(".")[1:3]) for label in bars}  # the block is kept
    for name, fig in figures.items():
        renderer = draw(fig)
        ticks = drawn_tick_labels(fig)
        assert ticks, name
        assert assert_text_inside(fig, renderer) >= len(ticks), name
        for ax in fig.axes:
            assert_no_overlap(shown_ticks(ax.yaxis), renderer, name)
            if name == "timeline":  # module names, in two rows
                assert_no_overlap(shown_ticks(ax.xaxis, "major"), renderer, name)
                assert_no_overlap(shown_ticks(ax.xaxis, "minor"), renderer, name)
    heat = figures["heatmap by op"].axes[0]
    assert all(t.get_text().split(" ")[0] in ("forward", "backward") for t in heat.get_xticklabels())
    rows = [t.get_text() for t in heat.get_yticklabels()]
    assert all(len(t) <= 28 for t in rows)
    if depth == 3:  # only the modules with hotspots get a row
        assert set(rows) == {"…denseblock1.denselayer2", "…denseblock3.denselayer20"}
    timeline = figures["timeline"]
    names = {  # the modules holding the hotspots are named, even at the edges of the axis
        1: {"features"},
        2: {"features.denseblock1", "features.denseblock3"},
        3: {"…denseblock1.denselayer2", "…denseblock3.denselayer20"},
    }
    for ax in timeline.axes:
        assert names[depth] <= set(x_labels(ax)), x_labels(ax)


@pytest.mark.slow
def test_top_hotspots_on_shufflenet_tell_groups_of_one_line_apart():
    torch.manual_seed(0)
    model = torchvision.models.shufflenet_v2_x0_5(weights=None).to(memory_format=torch.channels_last)
    a = auditor.audit(model, torch.randn(2, 3, 32, 32).to(memory_format=torch.channels_last), record_source=True)
    fig = plot.top_hotspots(a, by="group")
    draw(fig)
    labels = [t.get_text() for t in fig.axes[0].get_yticklabels()]
    assert len(labels) == 10 and len(set(labels)) == 10
    # the source as the report shows it: relative to site-packages
    assert all(re.search(r"  torchvision[/\\]models[/\\]shufflenetv2\.py:\d+$", t) for t in labels), labels
    by_line = plot.top_hotspots_data(a, n=100, by="source")
    assert len(by_line) == a.hotspots()["source"].nunique() and by_line["bytes"].sum() == a.hotspots()["bytes"].sum()


def test_top_chart_groups_by_cause_by_default():
    """One bar per cause, its symptoms summed: shufflenet's one channel-shuffle line is one bar."""
    torch.manual_seed(0)
    model = torchvision.models.shufflenet_v2_x0_5(weights=None).to(memory_format=torch.channels_last)
    a = auditor.audit(model, torch.randn(2, 3, 32, 32).to(memory_format=torch.channels_last))
    causes = a.causes()
    bars = plot.top_hotspots_data(a)
    assert len(bars) == len(causes) >= 1
    assert bars["bytes"].tolist() == causes["bytes"].tolist()
    assert bars["groups"].sum() == len(a.hotspots())
    assert bars["label"].iloc[0].startswith(f"1. {causes['pattern'].iloc[0]}")
    fig = plot.top_hotspots(a)
    draw(fig)
    title = "Top cause" if len(bars) == 1 else f"Top {len(bars)} causes"  # never "Top 1 causes"
    assert fig.axes[0].get_title(loc="left") == title


def test_heatmap_has_axis_labels_and_no_empty_rows_or_columns(two_breaks_audit):
    """Only modules and kinds with hotspots are drawn, the axes say what they hold, the title
    how many modules were left out, and the colourbar's zero reads in the unit of its other ticks."""
    a = two_breaks_audit
    data = plot.heatmap_data(a)
    assert (~data.to_numpy().any(axis=1)).any()  # the data keeps its rows of zeros ...
    fig = plot.heatmap(a)
    draw(fig)
    ax = fig.axes[0]
    rows = [t.get_text() for t in ax.get_yticklabels()]
    cols = [t.get_text() for t in ax.get_xticklabels()]
    assert rows == [m for m in data.index if data.loc[m].any()]  # ... the figure does not
    assert cols == [c for c in data.columns if data[c].any()]
    assert ax.get_xlabel() == "phase and kind of the hotspots" and ax.get_ylabel() == "module"
    empty = int((~data.to_numpy().any(axis=1)).sum())
    assert (f"{empty} modules without hotspots" in ax.get_title()) == bool(empty)
    [cbar] = colorbars(fig)
    ticks = [t.get_text() for t in shown_ticks(cbar.yaxis)]
    units = {t.split(" ")[-1] for t in ticks}
    assert ticks[0].startswith("0 ") and len(units) == 1, ticks


def test_timeline_draws_convolutions_above_the_module_bands_and_explains_its_lanes(two_breaks_audit):
    fig = plot.format_timeline(two_breaks_audit)
    ax = fig.axes[0]
    bands = [p.get_zorder() for p in ax.patches]
    convs = [c for c in ax.collections if c.get_label() == "convolution"]
    assert convs and bands and all(c.get_zorder() > max(bands) for c in convs)
    assert "whole step" in ax.get_title(loc="left") and "along the model" not in ax.get_title(loc="left")
    lanes = [t.get_text() for t in ax.get_yticklabels()]
    assert ("ambiguous" in lanes) == ("ambiguous:" in fig.axes[-1].get_xlabel())


def test_timeline_explains_the_ambiguous_lane():
    """A 1-channel gate writes ambiguous activations: the caption says what the lane means."""
    model = nn.Sequential(nn.Conv2d(3, 1, 3, padding=1), nn.Sigmoid(), nn.Conv2d(1, 4, 3, padding=1))
    x = torch.randn(2, 3, 8, 8).to(memory_format=torch.channels_last)
    a = auditor.audit(model.to(memory_format=torch.channels_last), x, record_time=False)
    fig = plot.format_timeline(a)
    assert "ambiguous" in [t.get_text() for t in fig.axes[0].get_yticklabels()]
    assert plot.AMBIGUOUS_NOTE in fig.axes[-1].get_xlabel()


def test_top_chart_shows_the_saving_as_a_bar_and_fits_its_texts(softmax_audit):
    fig = plot.top_hotspots(softmax_audit)
    renderer = draw(fig)
    ax = fig.axes[0]
    assert any(p.get_hatch() for p in ax.patches)  # the part a fix saves, drawn over the bar
    assert all(t.get_fontsize() >= 8 for t in ax.texts)
    for t in ax.texts:  # each bar's text ends inside the axes: the scale leaves room, no more
        assert t.get_window_extent(renderer).x1 <= ax.get_window_extent(renderer).x1 + 1
    ends = [p.get_x() + p.get_width() for p in ax.patches if not p.get_hatch()]
    assert max(ends) >= 0.4 * ax.get_xlim()[1]  # the longest bar is not squeezed by its label


def test_the_default_depth_shows_where_the_hotspots_are():
    """Issue 29: mobilenet's whole body is ``features``, so at depth 1 its heatmap was one cell.
    The default depth is the shallowest that puts the hotspots in two or more modules, for the
    heatmap and the timeline alike; a depth given is honoured by both."""
    import torchvision

    torch.manual_seed(0)
    model = torchvision.models.mobilenet_v3_small(weights=None).to(memory_format=torch.channels_last)
    a = auditor.audit(model, torch.randn(1, 3, 64, 64).to(memory_format=torch.channels_last), record_time=False)
    depth = plot.hotspot_depth(a)
    assert depth >= 2
    assert (plot.heatmap_data(a).sum(axis=1) > 0).sum() >= 2
    assert (plot.heatmap_data(a, depth=1).sum(axis=1) > 0).sum() == 1
    assert f"depth {depth}" in plot.format_timeline(a).axes[-1].get_xlabel()
    assert "depth 3" in plot.format_timeline(a, depth=3).axes[-1].get_xlabel()
