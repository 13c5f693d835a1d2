"""Ops of an input that is both formats at once (an N×C×1×1 map, an N×1×H×W one), found as
nc11_broadcast: each fixed the way its op allows, or by hand with a reason that is true."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
from planted import CatOfMaps, ChannelMeanNorm, UpsampleOnePixel

import auditor
from auditor._fix import _suggest
from auditor._fix._keep_format import BroadcastUpsample

CL = torch.channels_last
QUICK = {"rounds": 3, "max_rounds": 3, "budget_s": 2.0}


def _made(cls, *args):
    torch.manual_seed(0)
    model = cls(*args).to(memory_format=CL)
    torch.manual_seed(1)
    return model, torch.randn(2, 3, 8, 8).to(memory_format=CL)


@pytest.mark.parametrize("mode", ["nearest", "bilinear", "bicubic"])
def test_an_upsample_of_a_one_pixel_map_is_swapped_for_a_broadcast(mode):
    model, x = _made(UpsampleOnePixel, mode)
    f = auditor.suggest_fixes(auditor.audit(model, x))
    [row] = f.frame.itertuples()
    assert row.pattern == "nc11_broadcast" and row.action == _suggest.SWAP and row.automatic
    assert "model.up = auditor.keep_format(model.up)" in row.suggestion
    f = f.verify(model, x, **QUICK)
    v = f.verification
    assert v["applied"].all() and v["same_outputs"].all() and (v["hotspots_after"] == 0).all()


def test_the_broadcast_is_a_view_with_the_values_of_every_mode():
    m = torch.randn(2, 4, 1, 1)
    for mode in ("nearest", "bilinear", "bicubic", "area"):
        up = nn.Upsample(size=(5, 3), mode=mode)
        out = BroadcastUpsample.from_module(up)(m)
        assert out.shape == (2, 4, 5, 3) and out.stride() == (4, 1, 0, 0)  # a view: no format named
        assert torch.allclose(out, up(m), atol=1e-6)
    up = nn.Upsample(scale_factor=2.5, mode="nearest")
    assert BroadcastUpsample.from_module(up)(m).shape == up(m).shape
    bigger = torch.randn(2, 4, 2, 2).contiguous(memory_format=CL)
    assert torch.equal(BroadcastUpsample.from_module(up)(bigger), up(bigger))
    with pytest.raises(ValueError, match="no Upsample"):
        BroadcastUpsample.from_module(nn.ReLU())


def test_a_mean_over_the_channels_is_written_as_a_sum_whose_backward_is_a_view():
    model, x = _made(ChannelMeanNorm)
    f = auditor.suggest_fixes(auditor.audit(model, x))
    [row] = f.frame.itertuples()
    assert row.pattern == "nc11_broadcast" and row.automatic
    assert "PyTorch's backward of a mean over dimensions (1,)" in row.detail
    assert row.suggestion.strip().startswith("v = (_pooled := x.pow(2)).sum(1, keepdim=True) / (_pooled.shape[1])")
    f = f.verify(model, x, **QUICK)
    v = f.verification
    assert v["applied"].all() and v["same_outputs"].all() and (v["hotspots_after"] == 0).all()


def test_another_op_of_a_map_that_is_both_formats_is_restrided_into_the_convolution_s_format():
    """The cat of two N×1×H×W maps, with a convolution weight in reach of its line: each map is
    passed as a view in that weight's format, and the cat follows it."""
    model, x = _made(CatOfMaps)
    f = auditor.suggest_fixes(auditor.audit(model, x))
    rows = f.frame[(f.frame["pattern"] == "nc11_broadcast") & f.frame["op"].str.startswith("aten.cat")]
    assert len(rows) == 1 and rows["automatic"].iloc[0]
    assert "keep_format.restride(x.mean(dim=1, keepdim=True), self.c.weight)" in rows["suggestion"].iloc[0]
    f = f.verify(model, x, **QUICK)
    v = f.verification
    row = v[(v["kind"] == "fix") & (v["fix"] == rows["fix"].iloc[0])].iloc[0]
    assert row["applied"] and row["same_outputs"] and row["hotspots_after"] < row["hotspots_before"]


def _mean_and_max(x):
    return torch.cat([x.mean(dim=1, keepdim=True), x.amax(dim=1, keepdim=True)], dim=1)  # planted


class CatInAHelper(nn.Module):
    """CatOfMaps with the cat in a plain function: no convolution weight is in reach of its line."""

    def __init__(self):
        super().__init__()
        self.a = nn.Conv2d(3, 8, 3, padding=1)
        self.c = nn.Conv2d(2, 8, 3, padding=1)

    def forward(self, x):
        return self.c(_mean_and_max(self.a(x)))


def test_another_op_of_a_map_that_is_both_formats_is_by_hand_and_its_reason_holds():
    model, x = _made(CatInAHelper)
    f = auditor.suggest_fixes(auditor.audit(model, x))
    rows = f.frame[(f.frame["pattern"] == "nc11_broadcast") & f.frame["op"].str.startswith("aten.cat")]
    assert len(rows) == 1 and not rows["automatic"].iloc[0]  # (the channel mean's backward is the other cause)
    reason = rows["reason"].iloc[0]
    assert reason.startswith("cat.default takes an input whose memory order is both formats at once ((2, 1, 8, 8): ")
    # the claim: the maps are dense in both formats, and the cat of them comes out contiguous
    a = torch.randn(2, 1, 8, 8).contiguous(memory_format=CL)
    assert a.is_contiguous() and a.is_contiguous(memory_format=CL)
    out = torch.cat([a, a], dim=1)
    assert out.is_contiguous() and not out.is_contiguous(memory_format=CL)
