"""The figures are drawn from the analysis DataFrames, and the pictures are not blank."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torchvision
from matplotlib.figure import Figure
from matplotlib.image import imread
from planted import make

import auditor
from auditor import plot


@pytest.fixture(scope="module")
def softmax_audit():
    model, x = make("softmax")
    return auditor.audit(model, x)


def ink(path) -> float:
    """Share of pixels that are not the white background."""
    img = imread(path)[..., :3]
    return float((img < 0.97).any(axis=-1).mean())


def test_heatmap_data_rows_and_columns(softmax_audit):
    data = plot.heatmap_data(softmax_audit, depth=1)
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
