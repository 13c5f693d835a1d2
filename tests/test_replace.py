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
    from auditor._fix import _syntax as rw

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
    from auditor._fix import _syntax as rw
    from auditor._fix._replace import ROI_ALIGN, ReplaceCall

    st = rw.Statement("f.py", 1, 1, "y = roi_align(x, b, 7)\n")
    new = rw.rewrite(st, [(ReplaceCall(ROI_ALIGN), rw.Facts(taken=frozenset({"keep_format"})))])
    assert new == "from auditor import keep_format as keep_format2\ny = keep_format2.roi_align(x, b, 7)\n"


def test_two_calls_on_a_line_are_refused():
    from auditor._fix import _syntax as rw
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
    fixes = fixes.verify(model, x)
    table = fixes.verification
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


# -- a product whose backward keeps each gradient in its input's order ---------------------------------


from auditor._fix._matmul import matmul  # noqa: E402


def _views(b=2, c=5, h=3, w=4):
    torch.manual_seed(1)
    f1 = torch.randn(b, c, h, w, dtype=torch.float64).to(memory_format=CL).requires_grad_()
    f2 = torch.randn(b, c, h, w, dtype=torch.float64).to(memory_format=CL).requires_grad_()
    return f1, f2


@pytest.mark.parametrize("form", ["correlation", "row_major", "both_column_major", "two_d"])
def test_matmul_matches_torch_and_keeps_each_gradient_in_its_input_s_order(form):
    f1, f2 = _views()
    b, c, h, w = f1.shape
    if form == "correlation":
        def operands(x, y):
            return x.view(b, c, h * w).transpose(1, 2), y.view(b, c, h * w)
    elif form == "row_major":
        def operands(x, y):
            return x.view(b, c, h * w).transpose(1, 2), y.view(b, c, h * w).transpose(1, 2).transpose(1, 2).contiguous()
    elif form == "both_column_major":
        def operands(x, y):
            return x.view(b, c, h * w), y.view(b, c, h * w).transpose(1, 2)
    else:
        def operands(x, y):
            return x[0].view(c, h * w).transpose(0, 1), y[0].view(c, h * w)
    want = torch.matmul(*operands(f1, f2))
    got = matmul(*operands(f1, f2))
    _close(got, want)
    g = torch.randn_like(want)
    want_grads = torch.autograd.grad(want, (f1, f2), g)
    got_grads = torch.autograd.grad(got, (f1, f2), g)
    for a, e in zip(got_grads, want_grads):
        _close(a, e)
    if form in ("correlation", "both_column_major"):
        assert all(x.is_contiguous(memory_format=CL) and not x.is_contiguous() for x in got_grads)
        assert not all(x.is_contiguous(memory_format=CL) for x in want_grads)  # what torch.matmul does


def test_matmul_of_broadcast_batches_is_torch_s():
    a = torch.randn(3, 4, 5, dtype=torch.float64, requires_grad=True)
    b = torch.randn(5, 2, dtype=torch.float64, requires_grad=True)
    _close(matmul(a, b), torch.matmul(a, b))


def test_keep_format_names_matmul():
    assert auditor.keep_format.matmul is matmul


@pytest.mark.parametrize("text, operands", [
    ("corr = torch.matmul(a.transpose(1, 2), b)\n", "a.transpose(1, 2), b"),
    ("corr = torch.bmm(a, b) / 2\n", "a, b"),
    ("corr = a.mT @ b\n", "a.mT, b"),
    ("corr = a.matmul(b)\n", "a, b"),
])
def test_the_product_becomes_keep_format_matmul(text, operands):
    from auditor._fix._replace import ReplaceProduct

    new = _rewrite(ReplaceProduct(), text)
    assert new.splitlines()[0] == "from auditor import keep_format"
    assert f"keep_format.matmul({operands})" in new.splitlines()[1]


class _Correlation(torch.nn.Module):
    """Two images through one encoder, split, correlated and pooled as RAFT's CorrBlock does
    (the correlation is a (B·H·W, 1, H, W) map, both formats at once: no cause of its own)."""

    def __init__(self):
        super().__init__()
        self.stem = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.enc = torch.nn.Conv2d(8, 16, 3, padding=1, stride=2)
        self.head = torch.nn.Conv2d(16, 4, 1)

    def forward(self, img1, img2):
        fmaps = self.enc(self.stem(torch.cat([img1, img2], dim=0)))
        fmap1, fmap2 = torch.chunk(fmaps, chunks=2, dim=0)
        b, c, h, w = fmap1.shape
        corr = torch.matmul(fmap1.view(b, c, h * w).transpose(1, 2), fmap2.view(b, c, h * w))
        pooled = torch.nn.functional.avg_pool2d(corr.view(b * h * w, 1, h, w), 2)
        return self.head(pooled.view(b, h, w, -1).permute(0, 3, 1, 2))


def test_the_engine_makes_the_correlation_keep_both_gradients_and_verify_proves_it():
    torch.manual_seed(0)
    model = _Correlation().to(memory_format=CL)
    x = torch.randn(2, 3, 16, 16).to(memory_format=CL)
    y = torch.randn(2, 3, 16, 16).to(memory_format=CL)
    fixes = auditor.suggest_fixes(auditor.audit(model, x, y))
    rows = fixes.frame[fixes.frame["suggestion"].str.contains("keep_format.matmul", regex=False)]
    assert len(rows) == 1 and rows.iloc[0]["action"] == "edit source" and rows.iloc[0]["automatic"]
    assert "torch.matmul(fmap1" not in rows.iloc[0]["suggestion"]
    fixes = fixes.verify(model, x, y)
    table = fixes.verification
    fix = table[(table["kind"] == "fix") & (table["fix"] == rows.iloc[0]["fix"])].iloc[0]
    assert fix["applied"] and fix["same_outputs"], fix["reason"]
    assert fix["hotspots_after"] < fix["hotspots_before"]


# -- a map in both formats at once, re-strided into the convolutions' format ---------------------------


from auditor._fix._restride import Restride, restride  # noqa: E402


@pytest.mark.parametrize("shape", [(2, 1, 8, 8), (2, 6, 1, 1)])
@pytest.mark.parametrize("weight_format", [CL, torch.contiguous_format])
def test_restride_is_a_view_in_the_weight_s_format(shape, weight_format):
    w = torch.randn(4, 3, 3, 3).contiguous(memory_format=weight_format)
    x = torch.randn(*shape, dtype=torch.float64, requires_grad=True)
    y = restride(x, w)
    assert y.data_ptr() == x.data_ptr() and torch.equal(y, x)
    n, c, h, wd = shape
    cl_strides = (h * wd * c, 1, wd * c, c)
    assert y.stride() == (cl_strides if weight_format == CL else x.stride())
    (g,) = torch.autograd.grad(y.sum() * 2, x)
    assert torch.equal(g, torch.full_like(x, 2))


def test_restride_leaves_a_map_in_one_format():
    w = torch.randn(4, 3, 3, 3).contiguous(memory_format=CL)
    x = torch.randn(2, 3, 4, 4)
    assert restride(x, w) is x
    assert restride(None, w) is None


def test_the_names_a_call_takes_are_restrided():
    text = "        x = torch.cat([x_avg, x_max], dim=1)\n"
    assert _rewrite(Restride("self.conv.weight"), text) == (
        "        from auditor import keep_format\n"
        "        x = torch.cat([keep_format.restride(x_avg, self.conv.weight), "
        "keep_format.restride(x_max, self.conv.weight)], dim=1)\n")
    assert _rewrite(Restride("self.conv.weight"), "y = self.pad(x)\n").endswith(
        "y = self.pad(keep_format.restride(x, self.conv.weight))\n")


class _SpatialAttention(torch.nn.Module):
    """The mean and max over the channels (N×1×H×W maps, both formats at once) joined and
    convolved, as CBAM's and csatv2's spatial attention."""

    def __init__(self):
        super().__init__()
        self.stem = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.conv = torch.nn.Conv2d(2, 4, 7, padding=3)

    def forward(self, x):
        x = self.stem(x)
        x_avg = x.mean(dim=1, keepdim=True)
        x_max = x.amax(dim=1, keepdim=True)
        x = torch.cat([x_avg, x_max], dim=1)
        return self.conv(x)


def test_the_engine_restrides_maps_in_both_formats_and_verify_proves_it():
    torch.manual_seed(0)
    model = _SpatialAttention().to(memory_format=CL)
    x = torch.randn(2, 3, 16, 16).to(memory_format=CL)
    audit = auditor.audit(model, x)
    fixes = auditor.suggest_fixes(audit)
    rows = fixes.frame[fixes.frame["suggestion"].str.contains("keep_format.restride", regex=False)]
    assert len(rows) == 1 and rows.iloc[0]["automatic"], fixes.frame[["pattern", "reason"]]
    fixes = fixes.verify(model, x)
    table = fixes.verification
    fix = table[(table["kind"] == "fix") & (table["fix"] == rows.iloc[0]["fix"])].iloc[0]
    assert fix["applied"] and fix["same_outputs"], fix["reason"]
    assert fix["hotspots_before"] > 0 and fix["hotspots_after"] == 0
    assert fix["contiguous_hotspots_after"] <= fix["contiguous_hotspots_before"]


def test_restride_finds_a_module_s_convolution():
    m = torch.nn.Sequential(torch.nn.ZeroPad2d((1, 0, 1, 0)), torch.nn.Conv2d(6, 4, 2)).to(memory_format=CL)
    x = torch.randn(2, 6, 1, 1)
    assert restride(x, m).stride() == (6, 1, 6, 6)
    assert restride(x, torch.nn.ReLU()) is x


class _PadThenConv(torch.nn.Module):
    """A layer whose convolution is padded asymmetrically first in one instance (a Sequential
    of a pad and a Conv2d) and is a plain Conv2d in another, fed N×C×1×1 maps."""

    def __init__(self, pad: bool):
        super().__init__()
        conv = torch.nn.Conv2d(6, 6, 2 if pad else 1)
        self.conv = torch.nn.Sequential(torch.nn.ZeroPad2d((1, 0, 1, 0)), conv) if pad else conv
        self.act = torch.nn.ReLU()

    def forward(self, x):
        x = self.conv(x)
        return self.act(x)


class _OneByOne(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = torch.nn.Conv2d(3, 6, 3, stride=8, padding=1)
        self.a = _PadThenConv(pad=True)
        self.b = _PadThenConv(pad=False)

    def forward(self, x):
        return self.b(self.a(self.stem(x).mean((2, 3), keepdim=True)))


def test_the_engine_restrides_through_the_layer_whose_method_holds_the_line():
    torch.manual_seed(0)
    model = _OneByOne().to(memory_format=CL)
    x = torch.randn(2, 3, 16, 16).to(memory_format=CL)
    fixes = auditor.suggest_fixes(auditor.audit(model, x))
    rows = fixes.frame[fixes.frame["suggestion"].str.contains("keep_format.restride(x, self)", regex=False)]
    assert len(rows) == 1 and rows.iloc[0]["automatic"], fixes.frame[["pattern", "suggestion", "reason"]]
    fixes = fixes.verify(model, x)
    table = fixes.verification
    fix = table[(table["kind"] == "fix") & (table["fix"] == rows.iloc[0]["fix"])].iloc[0]
    assert fix["applied"] and fix["same_outputs"], fix["reason"]
    assert fix["hotspots_after"] < fix["hotspots_before"]


# -- split and chunk whose backward writes the gradient in the split tensor's format --------------------


_SPLITS = [("chunk", (3,), 1), ("chunk", (2,), 1), ("chunk", (4,), -3), ("chunk", (5,), 1), ("chunk", (2,), 0),
           ("split", (2,), 1), ("split", ([1, 4, 1],), 1), ("split", ([6],), 1), ("split", (4,), 3),
           ("chunk", (3,), 2)]


@pytest.mark.parametrize("fmt", [CL, torch.contiguous_format])
@pytest.mark.parametrize("used", ["all", "first", "last"])
@pytest.mark.parametrize("fn, args, dim", _SPLITS)
def test_split_and_chunk_match_torch_and_write_the_gradient_in_the_split_tensor_s_format(fn, args, dim, used, fmt):
    """The same views forward, the same gradient in float64, over split sizes (even, uneven, one
    part, more parts than channels), dimensions (negative too), parts used in different memory
    orders or not used at all; the gradient is in the split tensor's format."""
    from auditor._fix import _split

    x = _map((2, 6, 3, 4)).detach().contiguous(memory_format=fmt).requires_grad_()
    got = getattr(_split, fn)(x, *args, dim=dim)
    want = getattr(torch, fn)(x, *args, dim=dim)
    assert len(got) == len(want)
    assert all(torch.equal(a, b) and a.stride() == b.stride() and a.data_ptr() == b.data_ptr() for a, b in zip(got, want))

    def loss(parts):
        pick = {"all": parts, "first": parts[:1], "last": parts[-1:]}[used]
        # every other part copied contiguous first, so its gradient comes back in another order
        return sum(((p.contiguous() if k % 2 else p) * (k + 1)).sin().sum() for k, p in enumerate(pick))

    (g,) = torch.autograd.grad(loss(got), x)
    (h,) = torch.autograd.grad(loss(want), x)
    _close(g, h)
    assert g.is_contiguous(memory_format=fmt)
    if fmt is CL and len(want) > 1:
        assert not h.is_contiguous(memory_format=CL)  # what torch's own writes


def test_split_is_torch_s_own_where_no_gradient_is_taken():
    from auditor._fix import _split

    x = _map((2, 6, 3, 4))
    with torch.no_grad():
        parts = _split.chunk(x, 3, dim=1)
    assert all(p.grad_fn is None for p in parts)
    parts = _split.split(x.detach(), 2, dim=1)
    assert all(p.grad_fn is None for p in parts)


def test_split_parts_are_views_that_refuse_an_in_place_write_as_torch_s_do():
    from auditor._fix import _split

    x = _map((2, 6, 3, 4)) * 1
    for fn in (_split.chunk, torch.chunk):
        a, _ = fn(x, 2, dim=1)
        with pytest.raises(RuntimeError, match="view"):
            a.mul_(2)


def test_split_has_a_second_derivative():
    from auditor._fix import _split

    x = _map((1, 4, 2, 3))
    assert torch.autograd.gradgradcheck(lambda t: _split.chunk(t, 2, dim=1), (x,))


def test_keep_format_names_split_and_chunk():
    from auditor._fix import _split

    assert auditor.keep_format.split is _split.split and auditor.keep_format.chunk is _split.chunk
    assert "keep_format.split" in auditor.keep_format.__doc__


@pytest.mark.parametrize("text, new", [
    ("q, k, v = self.qkv(f).chunk(3, dim=1)\n", "q, k, v = keep_format.chunk(self.qkv(f), 3, dim=1)\n"),
    ("a, b = x.split([c, c * 2], 1)  # parts\n", "a, b = keep_format.split(x, [c, c * 2], 1)  # parts\n"),
    ("a, b = torch.chunk(x, chunks=2, dim=1)\n", "a, b = keep_format.chunk(x, chunks=2, dim=1)\n"),
    ("y = torch.split(x + 1, 4, dim=1)[0] * 2\n", "y = keep_format.split(x + 1, 4, dim=1)[0] * 2\n"),
])
def test_the_split_becomes_keep_format_s(text, new):
    from auditor._fix._replace import ReplaceSplit

    assert _rewrite(ReplaceSplit(), text) == "from auditor import keep_format\n" + new


@pytest.mark.parametrize("text", ["a = x.view(2, -1)\n", "a, b = x.chunk(2, 1) + y.chunk(2, 1)\n",
                                  "a, b = x.chunk(*sizes)\n"])
def test_a_statement_without_one_split_is_refused(text):
    from auditor._fix import _syntax as rw
    from auditor._fix._replace import ReplaceSplit

    with pytest.raises(rw.Refused):
        _rewrite(ReplaceSplit(), text)
