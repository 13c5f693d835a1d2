"""A new map that maps are written into (a canvas), made in the format of the tensor it is made
like (issue 38, item 4): the factory's call becomes ``torch.empty(.., memory_format=..)`` filled as
the factory fills, the same values, no copy, contiguous where that tensor is."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn

import auditor

pytest.importorskip("libcst")
torchvision = pytest.importorskip("torchvision")

CL = torch.channels_last


def _rewrite(text: str, like: str = "x") -> str:
    from auditor._fix import _syntax as rw
    from auditor._fix._generators._canvas import canvas_in_format_of

    return rw.rewrite(rw.Statement("f.py", 1, 1, text), [(canvas_in_format_of(like), rw.Facts())])


_FMT = "torch.channels_last if x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous() " \
       "else torch.contiguous_format"


@pytest.mark.parametrize("text, expected", [
    ("    out = torch.zeros((n, c) + size, dtype=dtype, device=device)\n",
     f"    out = torch.empty((n, c) + size, dtype=dtype, device=device, memory_format={_FMT}).zero_()\n"),
    ("out = torch.ones(n, c, h, w, device=x.device)  # the canvas\n",
     f"out = torch.empty(n, c, h, w, device=x.device, memory_format={_FMT}).fill_(1)  # the canvas\n"),
    ("out = torch.full((n, c, h, w), -1.0, dtype=x.dtype)\n",
     f"out = torch.empty((n, c, h, w), dtype=x.dtype, memory_format={_FMT}).fill_(-1.0)\n"),
    ("out = torch.empty(shape, device=x.device)\n",
     f"out = torch.empty(shape, device=x.device, memory_format={_FMT})\n"),
    ("out = x.new_zeros((n, c, h, w))\n",
     f"out = torch.empty((n, c, h, w), dtype=x.dtype, device=x.device, memory_format={_FMT}).zero_()\n"),
    ("out = x.new_zeros(shape, dtype=torch.float64)\n",
     f"out = torch.empty(shape, device=x.device, dtype=torch.float64, memory_format={_FMT}).zero_()\n"),
])
def test_the_factory_call_becomes_an_empty_map_in_the_format_of_the_tensor_it_is_made_like(text, expected):
    assert _rewrite(text) == expected


@pytest.mark.parametrize("text", [
    "out = torch.zeros(shape, requires_grad=True)\n",  # a leaf that asks for a gradient cannot be filled in place
    "out = torch.zeros(shape, memory_format=torch.channels_last)\n",
    "torch.zeros(shape, out=buffer)\n",
    "out = torch.zeros(shape) + torch.zeros(shape)\n",
    "out = torch.zeros(*shape)\n",
    "out = torch.cat([a, b])\n",
])
def test_a_statement_without_one_plain_factory_call_is_refused(text):
    from auditor._fix import _syntax as rw

    with pytest.raises(rw.Refused):
        _rewrite(text)


def test_the_tensor_it_is_made_like_is_read_from_the_statement_and_the_names_it_takes(tmp_path):
    from auditor._fix._generators._canvas import made_like

    path = tmp_path / "m.py"
    path.write_text(
        "def f(xs, y, n):\n"
        "    dtype, device = xs[0].dtype, xs[0].device\n"        # 2
        "    a = torch.zeros((n, 4), dtype=dtype, device=device)\n"  # 3: through the names
        "    b = y.new_zeros((n, 4))\n"                           # 4: the receiver
        "    c = torch.zeros(n, device=y.device)\n"                # 5: directly
        "    d = torch.zeros(n, dtype=torch.float32)\n"            # 6: nothing named
        "    e = torch.zeros(n, device=make().device)\n"           # 7: a call, not one tensor
    )
    assert [made_like(str(path), k) for k in range(3, 8)] == ["xs[0]", "y", "y", None, None]


# -- a model that gathers maps into a canvas, as a multi-scale RoI pooler writes it ------------------


def pool_levels(features, rois, levels, size):
    """Each region pooled from its level's map into one canvas, by index."""
    n = len(rois)
    channels = features[0].shape[1]
    dtype, device = features[0].dtype, features[0].device
    result = torch.zeros((n, channels) + size, dtype=dtype, device=device)
    for k, f in enumerate(features):
        idx = torch.where(levels == k)[0]
        result[idx] = torchvision.ops.roi_align(f, rois[idx], size, spatial_scale=0.5 ** k, sampling_ratio=2)
    return result


class Pooler(nn.Module):
    """Three levels of a map, regions pooled from the level their area picks (all from the
    first: a level that gets no region is common), then a convolution over the regions."""

    def __init__(self, c=8):
        super().__init__()
        self.stem = nn.Conv2d(3, c, 3, padding=1)
        self.down = nn.Conv2d(c, c, 3, stride=2, padding=1)
        self.down2 = nn.Conv2d(c, c, 3, stride=2, padding=1)
        self.head = nn.Conv2d(c, c, 3, padding=1)

    def forward(self, x, rois):
        a = self.stem(x)
        b = self.down(a)
        area = (rois[:, 3] - rois[:, 1]) * (rois[:, 4] - rois[:, 2])
        levels = (area > 64).long() + (area > 256).long()
        r = pool_levels([a, b, self.down2(b)], rois, levels, (4, 4))
        return self.head(r)


_ROIS = torch.tensor([[0, 1.0, 1.0, 7.0, 7.0], [1, 2.0, 0.0, 9.0, 7.0], [0, 0.0, 3.0, 5.0, 9.0],
                      [1, 4.0, 4.0, 8.0, 12.0]])
_CANVAS = "    result = torch.zeros((n, channels) + size, dtype=dtype, device=device)"


def _pooler():
    torch.manual_seed(0)
    model = Pooler().to(memory_format=CL)
    return model, torch.randn(2, 3, 16, 16).to(memory_format=CL)


def _values(model, x, rois):
    x = x.detach().clone().requires_grad_()
    out = model(x, rois)
    out.square().sum().backward()
    return out.detach(), x.grad, {n: p.grad for n, p in model.named_parameters()}


@pytest.mark.fix_variant("canvas in the format")
def test_the_canvas_is_made_in_the_format_of_the_maps_and_verify_proves_it():
    model, x = _pooler()
    fixes = auditor.suggest_fixes(auditor.audit(model, x, _ROIS))
    frame = fixes.frame
    canvas = frame[frame["op"] == "aten.zeros.default"]
    assert len(canvas) == 1 and canvas["pattern"].iloc[0] == "joins"
    row = canvas.iloc[0]
    assert row["automatic"] and row["line"] == _CANVAS
    assert row["suggestion"] == (
        "    result = torch.empty((n, channels) + size, dtype=dtype, device=device, memory_format=torch.channels_last "
        "if features[0].is_contiguous(memory_format=torch.channels_last) and not features[0].is_contiguous() "
        "else torch.contiguous_format).zero_()")
    n = int(row["fix"])
    fixes = fixes.verify(model, x, _ROIS, rounds=3, max_rounds=3, budget_s=2)
    table = fixes.verification
    fix = table[(table["kind"] == "fix") & (table["fix"] == n)].iloc[0]
    assert fix["applied"] and fix["same_outputs"], fix["reason"]
    assert fix["hotspots_before"] > 0 and fix["hotspots_after"] == 0
    assert fix["contiguous_hotspots_after"] <= fix["contiguous_hotspots_before"]

    # the same values and gradients in float64, channels_last and contiguous, and the canvas in the format
    for fmt in (CL, torch.contiguous_format):
        plain = copy.deepcopy(model).double().to(memory_format=fmt)
        fixed = copy.deepcopy(plain)
        xd = x.double().contiguous(memory_format=fmt)
        before = _values(plain, xd, _ROIS.double())
        fixes.apply(fixed, fixes=[n])
        try:
            after = _values(fixed, xd, _ROIS.double())
            level = torch.randn(2, 8, 16, 16, dtype=torch.float64).contiguous(memory_format=fmt)
            made = pool_levels([level], _ROIS.double(), torch.zeros(4, dtype=torch.long), (4, 4))
        finally:
            fixes.undo()
        torch.testing.assert_close(after[0], before[0], rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(after[1], before[1], rtol=1e-12, atol=1e-12)
        for name, g in before[2].items():
            torch.testing.assert_close(after[2][name], g, rtol=1e-12, atol=1e-12)
        assert made.is_contiguous(memory_format=fmt)

    # and the fixed model's audit has no cause at the canvas
    fixes.apply(model, fixes=[n])
    try:
        causes = auditor.audit(model, x, _ROIS).causes()
    finally:
        fixes.undo()
    assert not (causes["op"] == "aten.zeros.default").any()


def test_a_canvas_whose_statement_names_no_tensor_is_left_to_the_joins_fix(monkeypatch):
    """No tensor named by the statement (its dtype and device given as constants): no signal
    of the format, so no canvas fix; the cause keeps the joins fix's reason."""
    import auditor._fix._generators._canvas as canvas

    model, x = _pooler()
    audit = auditor.audit(model, x, _ROIS)
    monkeypatch.setattr(canvas, "made_like", lambda path, line: None)
    frame = auditor.suggest_fixes(audit).frame
    row = frame[frame["op"] == "aten.zeros.default"].iloc[0]
    assert not row["automatic"] and "from no tensor (a new one)" in row["reason"]
