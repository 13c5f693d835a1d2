"""Format-keeping replacements of ops without a channels_last kernel: the same values and
gradients as the native op in float64 over the arguments' range, and the format kept."""

from __future__ import annotations

import pytest
import torch

import auditor
from auditor._fix._roi_align import roi_align, roi_align_loses_format

torchvision = pytest.importorskip("torchvision")

CL = torch.channels_last


def _boxes(dtype=torch.float64):
    # partly outside the map (negative corners, past the right and bottom edges), smaller than a
    # pixel, larger than a bin, and on both images
    return torch.tensor([[0, -3.0, 2.1, 9.7, 20.0],
                         [1, 1.2, 0.3, 4.4, 6.6],
                         [0, 10.0, 5.0, 25.0, 14.0],
                         [1, 0.1, 0.2, 0.3, 0.4],
                         [1, 15.5, 11.5, 16.9, 12.9],
                         [0, -8.0, -8.0, -1.5, -2.0]], dtype=dtype)


def _map(shape=(2, 5, 13, 17)):
    torch.manual_seed(0)
    return torch.randn(*shape, dtype=torch.float64).to(memory_format=CL).requires_grad_()


def _close(a, b):
    torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("aligned", [False, True])
@pytest.mark.parametrize("sampling_ratio", [2, 0, -1, 3])
@pytest.mark.parametrize("spatial_scale", [1.0, 0.5, 0.25])
@pytest.mark.parametrize("output_size", [7, (3, 5), [2, 1]])
def test_roi_align_matches_torchvision_forward_and_backward(aligned, sampling_ratio, spatial_scale, output_size):
    x = _map()
    boxes = _boxes()
    ref = torchvision.ops.roi_align(x, boxes, output_size, spatial_scale, sampling_ratio, aligned)
    out = roi_align(x, boxes, output_size, spatial_scale, sampling_ratio, aligned)
    _close(out, ref)
    assert out.is_contiguous(memory_format=CL) and not out.is_contiguous()
    g = torch.randn_like(ref)
    (want,) = torch.autograd.grad(ref, x, g)
    (got,) = torch.autograd.grad(out, x, g)
    _close(got, want)
    assert got.is_contiguous(memory_format=CL) and not got.is_contiguous()


@pytest.mark.parametrize("aligned", [False, True])
def test_roi_align_takes_boxes_per_image(aligned):
    x = _map()
    boxes = _boxes()
    per_image = [boxes[boxes[:, 0] == i, 1:] for i in range(2)]
    ref = torchvision.ops.roi_align(x, per_image, (4, 3), 0.5, 0, aligned)
    out = roi_align(x, per_image, (4, 3), 0.5, 0, aligned)
    _close(out, ref)
    (want,) = torch.autograd.grad(ref.square().sum(), x)
    (got,) = torch.autograd.grad(out.square().sum(), x)
    _close(got, want)
    assert got.is_contiguous(memory_format=CL)


def test_roi_align_without_boxes_gives_a_zero_gradient_in_the_format():
    """An FPN level that gets no RoI: the gradient of its map is zero, and channels_last."""
    x = _map()
    out = roi_align(x, _boxes()[:0], 7, 0.25, 2)
    assert out.shape == (0, 5, 7, 7)
    (got,) = torch.autograd.grad(out.sum(), x)
    assert got.is_contiguous(memory_format=CL) and not got.is_contiguous()
    assert got.abs().max() == 0


def test_roi_align_of_a_contiguous_map_is_torchvision_s():
    x = _map().detach().contiguous()
    boxes = _boxes()
    out = roi_align(x, boxes, 7, 1.0, 2)
    assert out.is_contiguous()
    assert torch.equal(out, torchvision.ops.roi_align(x, boxes, 7, 1.0, 2))


def test_roi_align_gives_no_gradient_to_the_boxes():
    x = _map()
    boxes = _boxes().requires_grad_()
    out = roi_align(x, boxes, 3)
    assert out.requires_grad
    (g,) = torch.autograd.grad(out.sum(), x)
    assert g.shape == x.shape


def test_roi_align_float32_follows_torchvision():
    x = _map().detach().float().requires_grad_()
    boxes = _boxes(torch.float32)
    ref = torchvision.ops.roi_align(x, boxes, 5, 0.5, -1, True)
    out = roi_align(x, boxes, 5, 0.5, -1, True)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


def test_the_probe_asks_the_running_torch():
    """What torchvision's kernel does with a channels_last map, asked, not assumed; the
    replacement keeps both where the probe says the op loses them."""
    forward, backward = roi_align_loses_format("cpu", torch.float64)
    x = _map()
    y = torchvision.ops.roi_align(x, _boxes(), 2, 1.0, 2)
    assert forward == (not y.is_contiguous(memory_format=CL) or y.is_contiguous())
    (g,) = torch.autograd.grad(y.sum(), x)
    assert backward == (not g.is_contiguous(memory_format=CL) or g.is_contiguous())


def test_keep_format_names_the_replacements():
    assert auditor.keep_format.roi_align is roi_align
    assert "roi_align" in auditor.keep_format.__doc__


# -- the fix engine offers the replacement, and verify proves it --------------------------------------


def _rewrite(change, text):
    from auditor._fix import _rewrite as rw

    return rw.rewrite(rw.Statement("f.py", 1, 1, text), [(change, rw.Facts(taken=frozenset({"x", "rois"})))])


def test_the_op_call_becomes_the_replacement_s_call():
    from auditor._fix._replace import ROI_ALIGN, ReplaceCall

    text = "    return torch.ops.torchvision.roi_align(x, rois, 0.25, size[0], size[1], 2, False)  # pool\n"
    assert _rewrite(ReplaceCall(ROI_ALIGN), text) == (
        "    from auditor import keep_format\n"
        "    return keep_format.roi_align(x, rois, (size[0], size[1]), 0.25, 2, False)  # pool\n")


def test_a_call_of_the_public_function_keeps_its_arguments():
    from auditor._fix._replace import ROI_ALIGN, ReplaceCall

    text = "    y = torchvision.ops.roi_align(x, rois, output_size=7, aligned=True)\n"
    facts_taken = _rewrite(ReplaceCall(ROI_ALIGN), text)
    assert facts_taken == ("    from auditor import keep_format\n"
                           "    y = keep_format.roi_align(x, rois, output_size=7, aligned=True)\n")


def test_a_taken_name_is_not_shadowed():
    from auditor._fix import _rewrite as rw
    from auditor._fix._replace import ROI_ALIGN, ReplaceCall

    st = rw.Statement("f.py", 1, 1, "y = roi_align(x, b, 7)\n")
    new = rw.rewrite(st, [(ReplaceCall(ROI_ALIGN), rw.Facts(taken=frozenset({"keep_format"})))])
    assert new == "from auditor import keep_format as keep_format2\ny = keep_format2.roi_align(x, b, 7)\n"


def test_two_calls_on_a_line_are_refused():
    from auditor._fix import _rewrite as rw
    from auditor._fix._replace import ROI_ALIGN, ReplaceCall

    with pytest.raises(rw.Refused):
        _rewrite(ReplaceCall(ROI_ALIGN), "y = roi_align(a, b, 7) + roi_align(c, b, 7)\n")


class _Pooled(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.b = torch.nn.Conv2d(8, 4, 3, padding=1)
        self.register_buffer("boxes", torch.tensor([[0, 1.0, 1.0, 10.0, 12.0], [1, 3.0, 2.0, 14.0, 9.0],
                                                    [1, -2.0, 5.0, 30.0, 40.0]]))

    def forward(self, x):
        return self.b(torchvision.ops.roi_align(self.a(x), self.boxes, 7, 0.5, 2))


def _pooled():
    torch.manual_seed(0)
    model = _Pooled().to(memory_format=CL)
    return model, torch.randn(2, 3, 32, 32).to(memory_format=CL)


def test_the_engine_replaces_roi_align_where_it_loses_the_format_and_verify_proves_it():
    forward, backward = roi_align_loses_format("cpu", torch.float32)
    if not (forward or backward):
        pytest.skip("torchvision's roi_align keeps channels_last on this torch")
    model, x = _pooled()
    fixes = auditor.suggest_fixes(auditor.audit(model, x))
    row = fixes.frame[fixes.frame["op"].str.startswith("torchvision.roi_align")].iloc[0]
    assert row["action"] == "edit source" and row["automatic"]
    assert "keep_format.roi_align(" in row["suggestion"]
    table = fixes.verify(model, x)
    fix = table[table["kind"] == "fix"].iloc[0]
    assert fix["applied"] and fix["same_outputs"]
    assert fix["hotspots_before"] > 0 and fix["hotspots_after"] == 0
    assert fix["contiguous_hotspots_after"] <= fix["contiguous_hotspots_before"]


def test_the_engine_does_not_offer_it_where_the_op_keeps_the_format(monkeypatch):
    """Offered only where the running torch says the op loses the format: a torch whose op
    kept it gets no replacement."""
    from auditor._fix import _replace

    model, x = _pooled()
    audit = auditor.audit(model, x)
    monkeypatch.setattr(_replace, "loses_here", lambda *a: (False, False))
    fixes = auditor.suggest_fixes(audit)
    assert not fixes.frame["suggestion"].str.contains("keep_format.roi_align").any()
