"""Fixes: conversion helpers, suggested fixes that remove the planted breaks, layout plans."""

from __future__ import annotations

import copy
import inspect
import itertools
import textwrap

import pandas as pd
import planted
import pytest
import torch
import torch.nn as nn
from planted import make, make_cause

import auditor
from auditor import _plan as plan
from auditor._api import TIMED_THREADS
from auditor._display._text import short_source
from auditor._fix import _convert, _hooks, _keep_format, _proposal, _suggest
from auditor._measure import _harness
from auditor._plan import _layout

CL, CL3 = torch.channels_last, torch.channels_last_3d


def forward_hotspots(a: auditor.Audit) -> pd.DataFrame:
    h = a.hotspots()
    return h[h["phase"] == "forward"]


class Nested(nn.Module):
    """Convolutions at several depths, a transposed one, and a Linear that must stay as it is."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.body = nn.Sequential(nn.ReLU(), nn.Sequential(nn.Conv2d(8, 8, 1), nn.ConvTranspose2d(8, 4, 2, stride=2)))
        self.head = nn.Linear(4, 2)

    def forward(self, x):
        return self.head(self.body(self.stem(x)).mean((2, 3)))


# -- conversion helpers --------------------------------------------------------------------------


def test_conv2d_helper_converts_nested_convs_in_place_and_reports():
    torch.manual_seed(0)
    m = Nested()
    params = {name: p for name, p in m.named_parameters()}
    values = {name: p.detach().clone() for name, p in params.items()}
    report = auditor.convert_conv2d_weight_memory_format(m, CL)
    assert list(report.columns) == _convert.WEIGHT_CONVERSION_COLUMNS
    assert list(report["module"]) == ["stem", "body.1.0", "body.1.1"]
    assert list(report["module_type"]) == ["Conv2d", "Conv2d", "ConvTranspose2d"]
    # the 1x1 kernel is contiguous in both formats, but its strides still pick the conv's layout
    assert list(report["from_format"]) == ["contiguous"] * 3
    assert list(report["to_format"]) == ["channels_last"] * 3
    assert report.loc[0, "bytes"] == 8 * 3 * 3 * 3 * 4
    for name, p in m.named_parameters():
        assert p is params[name], "same Parameter objects"
        assert torch.equal(p, values[name]), "same values"
    for mod in (m.stem, m.body[1][0], m.body[1][1]):
        assert mod.weight.stride() == torch.empty(mod.weight.shape, memory_format=CL).stride()
    assert m.head.weight.is_contiguous()


def test_conv_helpers_are_idempotent_and_undo_with_contiguous_format():
    m = Nested()
    assert len(auditor.convert_conv2d_weight_memory_format(m, CL)) == 3
    again = auditor.convert_conv2d_weight_memory_format(m, CL)
    assert again.empty and list(again.columns) == _convert.WEIGHT_CONVERSION_COLUMNS
    back = auditor.convert_conv2d_weight_memory_format(m, torch.contiguous_format)
    assert list(back["to_format"]) == ["contiguous"] * 3
    assert all(mod.weight.is_contiguous() for mod in (m.stem, m.body[1][0], m.body[1][1]))


def test_optimizer_created_before_conversion_keeps_training_the_same_parameters():
    torch.manual_seed(0)
    m = Nested()
    ref = copy.deepcopy(m)
    x = torch.randn(2, 3, 8, 8)
    opts = [torch.optim.SGD(mm.parameters(), lr=0.1, momentum=0.9) for mm in (m, ref)]
    for step in range(3):
        if step == 1:  # convert between two steps: momentum buffers exist already
            auditor.convert_conv2d_weight_memory_format(m, CL)
        for mm, opt, inp in ((m, opts[0], x.contiguous(memory_format=CL) if step else x), (ref, opts[1], x)):
            opt.zero_grad()
            mm(inp).sum().backward()
            opt.step()
    for (name, p), q in zip(m.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6, msg=name)
    assert m.stem.weight.is_contiguous(memory_format=CL) and not m.stem.weight.is_contiguous()
    assert m.stem.weight.grad.is_contiguous(memory_format=CL)


def test_conv3d_helper_covers_conv3d_and_conv_transpose3d_only():
    m = nn.Sequential(nn.Conv3d(2, 4, 3), nn.ConvTranspose3d(4, 2, 2), nn.Conv2d(2, 2, 3))
    report = auditor.convert_conv3d_weight_memory_format(m, CL3)
    assert list(report["module"]) == ["0", "1"]
    assert list(report["to_format"]) == ["channels_last_3d"] * 2
    assert m[0].weight.is_contiguous(memory_format=CL3) and m[2].weight.is_contiguous()
    assert auditor.convert_conv3d_weight_memory_format(m, CL3).empty


def test_helper_behaves_like_torch_on_the_weights():
    torch.manual_seed(0)
    ours, theirs = Nested(), Nested()
    theirs.load_state_dict(ours.state_dict())
    auditor.convert_conv2d_weight_memory_format(ours, CL)
    torch.nn.utils.convert_conv2d_weight_memory_format(theirs, CL)
    for p, q in zip(ours.parameters(), theirs.parameters()):
        assert p.stride() == q.stride() and torch.equal(p, q)


@pytest.mark.parametrize(
    "helper, fmt, error, words",
    [
        (auditor.convert_conv2d_weight_memory_format, CL3, ValueError, "convert_conv3d_weight_memory_format"),
        (auditor.convert_conv2d_weight_memory_format, torch.preserve_format, ValueError, "channels_last"),
        (auditor.convert_conv3d_weight_memory_format, CL, ValueError, "convert_conv2d_weight_memory_format"),
        (auditor.convert_conv2d_weight_memory_format, "channels_last", TypeError, "torch.memory_format"),
    ],
)
def test_helpers_reject_a_format_of_the_wrong_rank(helper, fmt, error, words):
    with pytest.raises(error, match=words):
        helper(Nested(), fmt)


def test_helpers_reject_what_is_not_a_module():
    with pytest.raises(TypeError, match="nn.Module"):
        auditor.convert_conv2d_weight_memory_format(torch.zeros(1), CL)
    with pytest.raises(TypeError, match="nn.Module"):
        auditor.to_channels_last(lambda x: x)


def test_to_channels_last_picks_the_format_by_rank():
    class Both(nn.Module):
        def __init__(self):
            super().__init__()
            self.c2 = nn.Conv2d(3, 4, 3)
            self.c3 = nn.Conv3d(3, 4, 3)
            self.register_buffer("grid", torch.zeros(1, 2, 3, 3))

        def forward(self, x2, x3):
            return self.c2(x2).sum() + self.c3(x3).sum()

    m = Both()
    ids = [id(p) for p in m.parameters()]
    x2, x3, v = torch.randn(1, 3, 5, 5), torch.randn(1, 3, 4, 5, 5), torch.randn(3)
    out = auditor.to_channels_last(m, x2, {"x3": x3, "other": [v, 7]})
    assert out[0] is m and len(out) == 3
    assert out[1].is_contiguous(memory_format=CL) and not out[1].is_contiguous()
    assert out[2]["x3"].is_contiguous(memory_format=CL3) and not out[2]["x3"].is_contiguous()
    assert out[2]["other"][0] is v and out[2]["other"][1] == 7
    assert m.c2.weight.is_contiguous(memory_format=CL) and m.c3.weight.is_contiguous(memory_format=CL3)
    assert m.grid.stride() == torch.empty(1, 2, 3, 3, memory_format=CL).stride()
    assert [id(p) for p in m.parameters()] == ids
    assert auditor.to_channels_last(m) is m  # no inputs: the model alone
    torch.testing.assert_close(m(out[1], out[2]["x3"]), Both.forward(m, x2, x3))


def test_keep_contiguous_runs_a_region_contiguous_with_the_same_values():
    model, x = make("softmax")
    ref = model(x)
    report = auditor.keep_contiguous(model, ["conv1", "conv2"])
    assert set(report["module"]) == {"conv1", "conv2"}
    a = auditor.audit(model, x)
    assert a.hotspots().empty
    torch.testing.assert_close(model(x), ref)
    assert _hooks.remove_input_formats(model) == 2
    with pytest.raises(ValueError, match="not a Conv2d"):
        auditor.keep_contiguous(model, ["mid"])
    with pytest.raises(ValueError, match="no module named"):
        auditor.keep_contiguous(model, ["nope"])


@pytest.mark.parametrize("dim", [1, 2, 3, -1])
def test_softmax_keep_format_same_values_and_format_both_ways(dim):
    x = torch.randn(2, 5, 4, 3).contiguous(memory_format=CL).requires_grad_()
    y = _keep_format.softmax_keep_format(x, dim)
    torch.testing.assert_close(y, torch.softmax(x, dim))
    assert y.is_contiguous(memory_format=CL)
    g = torch.randn_like(y)
    (gx,) = torch.autograd.grad(y, x, g)
    (gref,) = torch.autograd.grad(torch.softmax(x, dim), x, g)
    torch.testing.assert_close(gx, gref)
    assert gx.is_contiguous(memory_format=CL)


def test_format_keeping_layer_norm_and_instance_norm_swaps():
    torch.manual_seed(0)
    x = torch.randn(2, 4, 5, 5).contiguous(memory_format=CL)
    ln = nn.LayerNorm([4, 5, 5])
    nn.init.normal_(ln.weight)
    nn.init.normal_(ln.bias)
    swapped = auditor.keep_format(ln)
    assert swapped.weight is ln.weight
    torch.testing.assert_close(swapped(x), ln(x), rtol=1e-4, atol=1e-5)
    assert swapped(x).is_contiguous(memory_format=CL)
    inorm = nn.InstanceNorm2d(4, affine=True)
    gn = auditor.keep_format(inorm)
    torch.testing.assert_close(gn(x), inorm(x), rtol=1e-4, atol=1e-5)
    assert gn(x).is_contiguous(memory_format=CL)
    with pytest.raises(ValueError, match="running stats"):
        auditor.keep_format(nn.InstanceNorm2d(4, track_running_stats=True))


def test_keep_format_refuses_a_module_it_has_no_same_valued_replacement_for():
    with pytest.raises(ValueError, match="no format-keeping replacement for ReLU: one exists for .*Softmax"):
        auditor.keep_format(nn.ReLU())
    with pytest.raises(ValueError, match="more than one value per channel"):
        auditor.keep_format(nn.AdaptiveAvgPool2d(2))
    with pytest.raises(ValueError, match="spans both time and space"):
        auditor.keep_format(nn.Conv3d(2, 2, 3))
    up = auditor.keep_format(nn.Upsample(scale_factor=4))
    m = torch.randn(2, 3, 1, 1)
    assert torch.equal(up(m), nn.functional.interpolate(m, scale_factor=4)) and up(m).stride()[-2:] == (0, 0)


@pytest.mark.parametrize("kernel, stride, padding, swap", [
    ((3, 1, 1), (2, 1, 1), (1, 0, 0), "TemporalConv"), ((1, 1, 1), (1, 1, 1), (0, 0, 0), "TemporalConv"),
    ((1, 3, 3), (1, 2, 2), (0, 1, 1), "FrameConv"), ((1, 3, 5), (1, 2, 1), (0, 1, 2), "FrameConv"),
    ((1, 1, 1), (2, 2, 2), (0, 0, 0), "FrameConv"), ((1, 3, 3), (3, 2, 2), (0, 1, 1), "FrameConv")])
def test_keep_format_computes_a_conv3d_that_spans_time_only_or_space_only_as_a_conv2d(kernel, stride, padding, swap):
    """The same values and gradients, whether the frames a stride in time takes are a view (T a
    multiple of it, or one clip) or not; channels_last_3d out of a float32 clip batch, where the
    Conv2d has a channels_last kernel, and a contiguous run as before."""
    torch.manual_seed(0)
    conv = nn.Conv3d(4, 6, kernel, stride, padding, groups=2).double()
    new = auditor.keep_format(conv)
    assert type(new).__name__ == swap and new.conv.weight is conv.weight
    for fmt, (n, t) in itertools.product((CL3, torch.contiguous_format), [(2, 5), (2, 6), (1, 5)]):
        x = torch.randn(n, 4, t, 9, 11, dtype=torch.double).to(memory_format=fmt).requires_grad_()
        want, got = conv(x), new(x)
        torch.testing.assert_close(got, want)
        torch.testing.assert_close(torch.autograd.grad(got.square().sum(), (x, conv.weight)),
                                   torch.autograd.grad(want.square().sum(), (x, conv.weight)))
    new.float()
    for fmt in (CL3, torch.contiguous_format):
        got = new(torch.randn(2, 4, 6, 9, 11).to(memory_format=fmt))
        assert got.is_contiguous(memory_format=CL3) == (fmt == CL3) and got.is_contiguous() == (fmt != CL3)


@pytest.mark.parametrize("kernel, stride, padding, dilation, groups, bias", [
    (1, 1, 0, 1, 1, True), (3, 1, 1, 1, 1, False), (3, 2, 1, 1, 4, True), (5, 1, 4, 2, 2, True),
    (2, 3, 0, 1, 8, False)])
def test_keep_format_computes_a_conv1d_over_a_flattened_map_as_a_conv2d(kernel, stride, padding, dilation, groups,
                                                                         bias):
    """The same values and gradients as the Conv1d (float64) over its settings; fed a flattened
    channels_last map, the output keeps its channels innermost and the map's gradient is
    channels_last, where conv1d writes both contiguous; any other input, the Conv1d's own run."""
    torch.manual_seed(0)
    conv = nn.Conv1d(8, 16, kernel, stride, padding, dilation, groups, bias).double()
    new = auditor.keep_format(conv)
    assert type(new).__name__ == "PositionsConv" and new.conv.weight is conv.weight
    for fmt in (CL, torch.contiguous_format):
        m = torch.randn(2, 8, 5, 7, dtype=torch.double).to(memory_format=fmt).requires_grad_()
        want, got = conv(m.flatten(2)), new(m.flatten(2))
        torch.testing.assert_close(got, want)
        params = tuple(conv.parameters())
        gots = torch.autograd.grad(got.square().sum(), (m, *params))
        torch.testing.assert_close(gots, torch.autograd.grad(want.square().sum(), (m, *params)))
        assert (got.stride(1) == 1) == (fmt == CL) and gots[0].is_contiguous(memory_format=fmt)
        assert want.is_contiguous()  # what the replacement is for: conv1d writes contiguous
    plain = torch.randn(2, 8, 35, dtype=torch.double)
    torch.testing.assert_close(new(plain), conv(plain))
    with pytest.raises(ValueError, match="pads otherwise than with zeros"):
        auditor.keep_format(nn.Conv1d(8, 8, 3, padding="same"))
    with pytest.raises(ValueError, match="pads otherwise than with zeros"):
        auditor.keep_format(nn.Conv1d(8, 8, 3, padding=1, padding_mode="reflect"))


def _at_audit_threads():
    """The thread count a timed audit's step runs at, which picks a Conv3d's kernel (at one
    thread a small batch runs ``slow_conv3d``; with more, oneDNN may keep the format)."""
    return _harness.torch_threads(TIMED_THREADS)


class TimeThenFrame(nn.Module):
    """Two Conv3d and a pointwise head that run at one line: at a small batch the (k, 1, 1) and
    (1, 1, 1) ones have no channels_last_3d kernel here (they lose it), and the (1, 3, 3) one,
    fed contiguous, only converts: it is their symptom, not more of the cause."""

    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Conv3d(3, 8, (3, 1, 1), padding=(1, 0, 0)), nn.Conv3d(8, 8, (1, 3, 3), padding=(0, 1, 1)))
        self.head = nn.Conv3d(8, 4, 1)

    def forward(self, x):
        return self.head(torch.relu(self.body(x)))


def test_a_conv3d_swap_names_the_convolutions_that_lose_the_format_and_no_symptom_at_their_line():
    from kernels import convs_that_lose

    torch.manual_seed(0)
    model = TimeThenFrame().to(memory_format=CL3)
    x = torch.randn(2, 3, 4, 8, 8).to(memory_format=CL3)
    losing = convs_that_lose(model, (x,), _at_audit_threads)  # fed channels_last, wrote another format
    if "body.0" not in losing:
        pytest.skip("the first Conv3d has a channels_last_3d kernel on this machine: the second is fed its format")
    fixes = auditor.suggest_fixes(auditor.audit(model, x))
    swaps = [p for p in fixes._proposals.values() if p.action == _suggest.SWAP]
    assert len(swaps) == 1
    assert set(swaps[0].change.modules) == losing  # body.1, fed contiguous, only converted
    ref = model(x)
    done = fixes.apply(model, x)
    assert done["applied"].all(), done["detail"].tolist()
    torch.testing.assert_close(model(x), ref)


def test_a_conv3d_swap_tries_the_convolutions_its_cause_fed_another_format_at_its_line():
    """At batch 1 none of the three has a channels_last_3d kernel here, but only the first one
    is fed channels_last_3d: the others, at its line, show only a conversion or nothing. The swap
    asks this torch whether they lose the format when fed it, and swaps them in the same round."""
    from kernels import convs_that_lose

    torch.manual_seed(0)
    model = TimeThenFrame().to(memory_format=CL3)
    x = torch.randn(1, 3, 4, 8, 8).to(memory_format=CL3)
    convs = {"body.0": model.body[0], "body.1": model.body[1], "head": model.head}
    alone = {name for name, conv in convs.items()
             if convs_that_lose(conv, (torch.randn(1, conv.in_channels, 4, 8, 8).to(memory_format=CL3),),
                                _at_audit_threads)}
    if alone != set(convs):
        pytest.skip(f"only {sorted(alone)} of the model's Conv3d have no channels_last_3d kernel at batch 1 here")
    ref = model(x)
    done = auditor.suggest_fixes(auditor.audit(model, x)).apply(model, x)
    assert list(done["round"]) == [1] and done["applied"].all(), done["detail"].tolist()
    assert "only lost the format once fed it" in done["detail"].iloc[0]
    assert [type(m).__name__ for m in (*model.body, model.head)] == ["TemporalConv", "FrameConv", "TemporalConv"]
    torch.testing.assert_close(model(x), ref)
    assert auditor.audit(model, x).hotspots().empty


class FrameThenTime(nn.Module):
    """A (1, 3, 3), a (3, 1, 1) and a (1, 1, 1) Conv3d, each on its own line: at batch 1 none has
    a channels_last_3d kernel here, but only the first is fed channels_last_3d; each swap feeds
    the next one its format, so each loses it in turn."""

    def __init__(self):
        super().__init__()
        self.frame = nn.Conv3d(3, 8, (1, 3, 3), padding=(0, 1, 1))
        self.time = nn.Conv3d(8, 8, (3, 1, 1), padding=(1, 0, 0))
        self.head = nn.Conv3d(8, 4, 1)

    def forward(self, x):
        y = self.frame(x)
        y = self.time(torch.relu(y))
        return self.head(y)


def test_conv3d_swaps_that_expose_the_next_convolution_are_made_round_after_round():
    from kernels import convs_that_lose

    torch.manual_seed(0)
    model = FrameThenTime().to(memory_format=CL3)
    x = torch.randn(1, 3, 4, 8, 8).to(memory_format=CL3)
    alone = {name for name, conv in model.named_children()
             if convs_that_lose(conv, (torch.randn(1, conv.in_channels, 4, 8, 8).to(memory_format=CL3),),
                                _at_audit_threads)}
    if alone != {"frame", "time", "head"}:
        pytest.skip(f"only {sorted(alone)} of the model's Conv3d have no channels_last_3d kernel at batch 1 here")
    ref = model(x)
    done = auditor.suggest_fixes(auditor.audit(model, x)).apply(model, x)
    assert done["applied"].all(), done["detail"].tolist()
    assert list(done["round"]) == [1, 2, 3]
    assert [type(m).__name__ for m in (model.frame, model.time, model.head)] == ["FrameConv", "TemporalConv",
                                                                                 "TemporalConv"]
    torch.testing.assert_close(model(x), ref)
    assert auditor.audit(model, x).hotspots().empty


# -- suggested fixes --------------------------------------------------------------------------------

EXPECTED_ACTIONS = {
    "explicit_contiguous": _suggest.EDIT,
    "mixed_cat": _suggest.EDIT,
    "channels_last_3d": _suggest.EDIT,
    "user_restore": _suggest.EDIT,
    "softmax": _suggest.SWAP,
    "reshape_copy": _suggest.REGION,
    "bicubic": _suggest.REGION,
}


@pytest.fixture(scope="module")
def fixes():
    out = {}
    for name in planted.MODELS:
        model, x = make(name)
        a = auditor.audit(model, x, record_source=True)
        out[name] = (a, auditor.suggest_fixes(a))
    return out


@pytest.mark.parametrize("name", sorted(EXPECTED_ACTIONS))
def test_one_fix_covers_every_hotspot_of_a_planted_break(fixes, name):
    a, f = fixes[name]
    assert list(f.frame["action"]) == [EXPECTED_ACTIONS[name]]
    assert list(f.frame.columns) == _suggest.FIX_COLUMNS
    assert len(f.hotspots()) == len(a.hotspots()) and (f.hotspots()["fix"] == 1).all()
    row = f.frame.iloc[0]
    assert row["hotspot_bytes"] == a.hotspots()["bytes"].sum()
    assert row["bytes"] == row["hotspot_bytes"] - row["added_bytes"] > 0
    assert row["forward_bytes"] + row["backward_bytes"] == row["hotspot_bytes"]


def test_clean_models_need_no_fix(fixes):
    for name in ("clean", "reshape_view", "gate"):
        f = fixes[name][1]
        assert f.frame.empty and "none" in str(f)


@pytest.mark.parametrize(
    "name, line, suggestion",
    [
        ("explicit_contiguous",
         "return y.contiguous()  # planted: an explicit .contiguous() between two convolutions",
         "return y.contiguous(memory_format=torch.channels_last if y.is_contiguous(memory_format=torch.channels_last) else torch.contiguous_format)  # planted: an explicit .contiguous() between two convolutions"),
        ("mixed_cat", "return torch.cat([y, y.contiguous()], dim=1)",
         "return torch.cat([y, y.contiguous(memory_format=torch.channels_last if y.is_contiguous(memory_format=torch.channels_last) else torch.contiguous_format)], dim=1)"),
        ("channels_last_3d",
         "return y.contiguous()  # planted: 5-D channels_last_3d lost to an explicit .contiguous()",
         "return y.contiguous(memory_format=torch.channels_last_3d if y.is_contiguous(memory_format=torch.channels_last_3d) else torch.contiguous_format)  # planted: 5-D channels_last_3d lost to an explicit .contiguous()"),
        ("user_restore", "return y.contiguous().contiguous(memory_format=CL)",
         "return y.contiguous(memory_format=torch.channels_last if y.is_contiguous(memory_format=torch.channels_last) else torch.contiguous_format).contiguous(memory_format=CL)"),
    ],
)
def test_source_fix_names_the_line_and_what_to_write(fixes, name, line, suggestion):
    a, f = fixes[name]
    row = f.frame.iloc[0]
    assert row["source"].startswith(planted.__file__) and row["module"] == "<root>"
    assert row["line"].strip() == line and row["suggestion"].strip() == suggestion
    text = str(f)
    assert f"now:   {line}" in text and f"write: {suggestion}" in text and short_source(row["source"]) in text


def _apply_source_fix(name: str, row) -> nn.Module:
    """Build the planted model with its ``between`` line replaced as the fix says."""
    cls, shape = planted.MODELS[name]
    src = textwrap.dedent(inspect.getsource(cls.between))
    assert src.count(row["line"].strip()) == 1
    src = src.replace(row["line"].strip(), row["suggestion"].strip())
    namespace = dict(vars(planted))
    exec(compile(src, planted.__file__, "exec"), namespace)
    fixed_cls = type(f"Fixed{cls.__name__}", (cls,), {"between": namespace["between"]})
    torch.manual_seed(0)
    fmt = CL if len(shape) == 4 else CL3
    return fixed_cls().to(memory_format=fmt)


@pytest.mark.parametrize("name", ["explicit_contiguous", "mixed_cat", "channels_last_3d", "user_restore"])
def test_applying_the_source_fix_leaves_no_hotspot_and_the_same_output(fixes, name):
    before_model, x = make(name)
    fixed = _apply_source_fix(name, fixes[name][1].frame.iloc[0])
    torch.testing.assert_close(fixed(x), before_model(x))
    after = auditor.audit(fixed, x)
    assert forward_hotspots(after).empty
    assert after.hotspots().empty


@pytest.mark.parametrize("name", ["softmax", "reshape_copy"])
def test_applying_swap_and_region_fixes_in_place(fixes, name):
    model, x = make(name)
    ref = model(x)
    params = [id(p) for p in model.parameters()]
    done = fixes[name][1].apply(model)
    assert done["applied"].all()
    torch.testing.assert_close(model(x), ref)
    assert forward_hotspots(auditor.audit(model, x)).empty
    assert [id(p) for p in model.parameters()] == params


def test_swap_suggestion_is_code_for_the_module(fixes):
    row = fixes["softmax"][1].frame.iloc[0]
    assert row["module"] == "mid" and row["module_type"] == "Softmax"
    assert row["suggestion"] == "model.mid = auditor.keep_format(model.mid)"


def test_region_fix_names_the_convolutions_around_the_break(fixes):
    row = fixes["reshape_copy"][1].frame.iloc[0]
    assert row["region"] == ("conv1", "conv2")
    assert row["suggestion"] == "auditor.keep_contiguous(model, ['conv1', 'conv2'])"
    assert "reshape" in row["detail"]


def test_source_edit_without_record_source_says_how_to_get_the_line():
    model, x = make("explicit_contiguous")
    f = auditor.suggest_fixes(auditor.audit(model, x, record_source=False))
    row = f.frame.iloc[0]
    assert row["action"] == _suggest.EDIT and row["source"] == "" and "record_source=True" in row["detail"]


def test_a_source_fix_is_applied_in_memory_and_undone():
    """The edit recompiles the function that holds the line, under its own file and line
    numbers, so the re-audit names the real line; undo puts the original code back."""
    model, x = make("explicit_contiguous")
    ref = model(x)
    a = auditor.audit(model, x)
    f = auditor.suggest_fixes(a)
    assert f.frame["automatic"].all() and (f.frame["reason"] == "").all()
    done = f.apply(model)
    assert done["applied"].all() and "recompiled" in done.loc[0, "detail"]
    torch.testing.assert_close(model(x), ref)
    assert auditor.audit(model, x).hotspots().empty
    with f.restored():  # the unfixed code, for a moment: to time both
        assert len(auditor.audit(model, x).hotspots()) == len(a.hotspots())
    assert auditor.audit(model, x).hotspots().empty
    f.undo()
    assert len(auditor.audit(model, x).hotspots()) == len(a.hotspots())


def test_a_fix_that_cannot_be_made_says_so_with_its_reason(monkeypatch):
    from auditor._fix._generators import _norm_view

    # the group norm of tokens, with the strides that let it run on a channels_last view unseen
    monkeypatch.setattr(_norm_view, "_channels_innermost", lambda shape, strides: False)
    model, x = make_cause("token_group_norm")
    f = auditor.suggest_fixes(auditor.audit(model, x))
    row = f.frame.iloc[0]
    assert row["pattern"] == "joins" and not row["automatic"]
    assert row["reason"].startswith("native_group_norm makes a tensor (2x8x64) from tensors shaped 2x8x64, 8, 8, "
                                    "none of them an image of the convolutions, at ")
    done = f.apply(model)
    assert not done["applied"].any() and done.loc[0, "detail"].startswith("by hand: ")


class Shuffle(nn.Module):
    """A channel shuffle written the classic way, between two convolutions."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1)

    def forward(self, x):
        y = self.conv1(x)
        n, c, h, w = y.shape
        y = torch.transpose(y.view(n, 2, c // 2, h, w), 1, 2).contiguous().view(n, c, h, w)
        return self.conv2(y)


def test_a_channel_shuffle_in_user_code_gets_one_fix_for_every_hotspot():
    torch.manual_seed(0)
    model, x = auditor.to_channels_last(Shuffle(), torch.randn(2, 3, 6, 6))
    a = auditor.audit(model, x, record_source=True)
    f = auditor.suggest_fixes(a)
    assert len(f) == 1 and len(f.hotspots()) == len(a.hotspots()) >= 3
    row = f.frame.iloc[0]
    assert row["action"] == _suggest.EDIT and "channel_shuffle" in row["suggestion"]
    assert "transpose" in row["line"] and row["bytes"] == a.hotspots()["bytes"].sum()


def test_torchvision_channel_shuffle_function_becomes_torchs_and_removes_every_hotspot():
    """The shuffle function's body is rewritten to F.channel_shuffle: the code of the function
    object changes, so every name it was imported under, shufflenetv2's own included, runs it."""
    import torchvision
    from torchvision.models import shufflenetv2

    torch.manual_seed(0)
    model, x = auditor.to_channels_last(torchvision.models.shufflenet_v2_x0_5().eval(), torch.randn(1, 3, 32, 32))
    a = auditor.audit(model, x, record_source=True)
    f = auditor.suggest_fixes(a)
    assert len(f) == 1 and len(f.hotspots()) == len(a.hotspots()) > 20
    row = f.frame.iloc[0]
    assert row["action"] == _suggest.EDIT and row["automatic"]
    assert row["suggestion"].strip() == "return torch.nn.functional.channel_shuffle(x, groups)"
    assert "torch.transpose(x, 1, 2).contiguous()" in row["line"]
    ref = model(x)
    original = shufflenetv2.channel_shuffle
    try:
        applied = f.apply(model)
        assert applied["applied"].all() and "channel_shuffle recompiled" in applied["detail"].iloc[0]
        assert shufflenetv2.channel_shuffle is original  # the same function, with new code
        torch.testing.assert_close(model(x), ref)
        assert auditor.audit(model, x).hotspots().empty
        with f.restored():  # the unfixed model, for a moment: to time both
            assert not auditor.audit(model, x).hotspots().empty
        assert auditor.audit(model, x).hotspots().empty
    finally:
        f.undo()
    assert len(auditor.audit(model, x).hotspots()) == len(a.hotspots())


def test_a_shuffle_with_its_groups_fixed_becomes_torchs_in_its_own_statements(tmp_path, monkeypatch):
    """A shuffle function with one parameter (its groups written in): only the shuffle's own
    statements are rewritten (the shape line stays), with the groups as written."""
    path = tmp_path / "shuffles.py"
    path.write_text(
        "import torch\n\n\n"
        "def shuffle_in_two(x):  # a shuffle with its groups fixed: one argument, not two\n"
        "    n, c, h, w = x.shape\n"
        "    x = x.view(n, 2, c // 2, h, w)\n"
        "    x = torch.transpose(x, 1, 2).contiguous()\n"
        "    return x.view(n, c, h, w)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import shuffles

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Conv2d(3, 8, 1), nn.Conv2d(8, 8, 1)

        def forward(self, x):
            return self.b(shuffles.shuffle_in_two(self.a(x)))

    model, x = auditor.to_channels_last(Net(), torch.randn(1, 3, 6, 6))
    fixes = auditor.suggest_fixes(auditor.audit(model, x))
    row = fixes.frame.iloc[0]
    assert row["pattern"] == "channel_shuffle" and row["automatic"], row["reason"]
    assert row["suggestion"] == "    return torch.nn.functional.channel_shuffle(x, 2)"
    assert row["line"].splitlines()[0] == "    x = x.view(n, 2, c // 2, h, w)"
    fixes = fixes.verify(model, x, rounds=2, max_rounds=2, budget_s=1.0)
    checked = fixes.verification
    assert checked.iloc[0]["applied"] and checked.iloc[0]["same_outputs"] and checked.iloc[0]["hotspots_after"] == 0


def test_a_shuffle_whose_steps_are_read_after_it_is_left_by_hand(tmp_path, monkeypatch):
    path = tmp_path / "shuffles_read.py"
    path.write_text(
        "import torch\n\n\n"
        "def shuffle_and_keep(x, groups):\n"
        "    n, c, h, w = x.shape\n"
        "    split = x.view(n, groups, c // groups, h, w)\n"
        "    y = split.transpose(1, 2).contiguous()\n"
        "    y = y.view(n, c, h, w)\n"
        "    return y + split.sum()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import shuffles_read

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Conv2d(3, 8, 1), nn.Conv2d(8, 8, 1)

        def forward(self, x):
            return self.b(shuffles_read.shuffle_and_keep(self.a(x), 2))

    model, x = auditor.to_channels_last(Net(), torch.randn(1, 3, 6, 6))
    rows = auditor.suggest_fixes(auditor.audit(model, x)).frame
    row = rows[rows["pattern"] == "channel_shuffle"].iloc[0]
    assert not row["automatic"] and "split, bound on the way by the shuffle, is read after it" in row["reason"]


def test_suggest_fixes_rejects_what_is_not_an_audit():
    with pytest.raises(TypeError, match="Audit"):
        auditor.suggest_fixes(pd.DataFrame())


def test_module_expr_spells_sequential_indices():
    assert _proposal.module_expr("layer1.0.conv2") == "model.layer1[0].conv2"
    assert _proposal.module_expr("<root>") == "model"


# -- layout plans --------------------------------------------------------------------------------


class Small(nn.Module):
    """A stem, a grouped convolution, a softmax break and a residual add: every plan edge kind."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 16, 3, padding=1)
        self.bn = nn.BatchNorm2d(16)
        self.grouped = nn.Conv2d(16, 16, 3, padding=1, groups=4)
        self.mid = nn.Softmax(dim=1)
        self.conv = nn.Conv2d(16, 16, 1)
        self.head = nn.Conv2d(16, 4, 1)

    def forward(self, x):
        y = torch.relu(self.bn(self.stem(x)))
        z = self.conv(self.mid(self.grouped(y)))
        return self.head(z + y).mean((2, 3))


@pytest.fixture
def fast_measurements(monkeypatch):
    monkeypatch.setattr(plan._measure, "SAMPLE_US", 500.0)
    monkeypatch.setattr(plan._measure, "MODEL_SAMPLE_US", 1000.0)


@pytest.mark.parametrize("train", [False, True])
def test_plan_layout_reasons_and_apply_plan_keep_outputs_and_inputs(fast_measurements, train):
    torch.manual_seed(0)
    model = Small()
    x = torch.randn(2, 3, 12, 12)  # a plain contiguous batch
    ref = model.eval()(x) if not train else None
    model.train(train)
    state = copy.deepcopy(model.state_dict())
    p = auditor.plan_layout(model, x, backward=train, repeats=2, recordings=1)
    for k, v in model.state_dict().items():  # planning runs on copies
        assert torch.equal(v, state[k]), k
    assert set(p.formats) == {"stem", "grouped", "conv", "head"}
    assert set(p.formats.values()) <= {"contiguous", "channels_last"}
    c = p.convs.set_index("module")
    assert list(p.convs.columns) == _layout.CONV_COLUMNS
    assert c.at["grouped", "groups"] == 4 and c.at["grouped", "input_shape"] == (2, 16, 12, 12)
    assert (p.convs[["conv_contiguous_us", "conv_channels_last_us"]] > 0).all().all()
    assert list(p.candidates["candidate"]) == ["planned", "all contiguous", "all channels_last"]
    assert p.candidates["chosen"].sum() == 1 and p.chosen in set(p.candidates["candidate"])
    assert {"conv input", "peer operand"} <= set(p.conversions["kind"])
    assert "Layout plan" in str(p)

    params = [id(p) for p in model.parameters()]
    applied = auditor.apply_plan(model, p)
    assert [id(p) for p in model.parameters()] == params
    assert applied.allclose and applied.max_abs_diff < 1e-4
    hs = applied.hotspots.set_index("phase")
    assert list(hs.columns) == ["groups_before", "bytes_before", "groups_after", "bytes_after"]
    assert hs.at["forward", "bytes_before"] > 0  # the softmax break in channels_last
    assert "hotspot bytes" in str(applied)
    if ref is not None:
        torch.testing.assert_close(model.eval()(x), ref, rtol=1e-4, atol=1e-5)


def test_a_forced_mixed_plan_converts_at_region_borders(fast_measurements):
    torch.manual_seed(0)
    model = Small().eval()
    x = torch.randn(2, 3, 12, 12)
    ref = model(x)
    p = auditor.plan_layout(model, x, repeats=1, recordings=1)
    mixed = p.with_formats(stem="channels_last", grouped="contiguous", conv="channels_last", head="channels_last")
    assert mixed.chosen == "by hand"
    # the input arrives contiguous, grouped reads the stem's channels_last output, and conv reads
    # the softmax's contiguous output: three conversions; head follows conv (its first operand)
    assert mixed.converted_inputs == {"stem": "channels_last", "grouped": "contiguous", "conv": "channels_last"}
    applied = auditor.apply_plan(model, mixed)
    assert applied.allclose
    torch.testing.assert_close(model(x), ref, rtol=1e-4, atol=1e-5)
    assert model.grouped.weight.is_contiguous() and model.stem.weight.is_contiguous(memory_format=CL)
    # applying again replaces the hooks instead of stacking them
    auditor.apply_plan(model, mixed, check=False)
    assert sum(isinstance(h, _hooks.InputFormat) for m in model.modules() for h in m._forward_pre_hooks.values()) == 3
    with pytest.raises(ValueError, match="takes 'contiguous' or 'channels_last'"):
        p.with_formats(stem="channels_last_3d")
    with pytest.raises(ValueError, match="not a planned convolution"):
        p.with_formats(mid="contiguous")


@pytest.mark.filterwarnings("ignore::auditor.NoisyPlanWarning")  # a tiny model, timed for its plan only
def test_a_region_whose_edges_cost_more_is_a_measured_plan_layout_candidate(fast_measurements):
    torch.manual_seed(0)
    model = planted.CostlyRegion().to(memory_format=CL)
    x = torch.randn(2, 3, 16, 16).to(memory_format=CL)
    a = auditor.audit(model, x)
    f = auditor.suggest_fixes(a)
    [row] = f.frame.itertuples()
    assert row.action == _suggest.REGION and set(row.region) == {"b", "c"} and not row.automatic
    assert row.added_bytes > row.hotspot_bytes and row.bytes < 0
    name = _suggest.region_candidate_name(row.region)
    assert f"its candidate '{name}'" in row.reason
    # the claim: kept contiguous, the region's edges convert more bytes than the copy it removes
    kept = copy.deepcopy(model)
    auditor.keep_contiguous(kept, list(row.region))
    after = auditor.audit(kept, x)
    assert after.hotspots()["bytes"].sum() > a.hotspots()["bytes"].sum()
    # and plan_layout times it end to end against the better uniform layout
    p = auditor.plan_layout(model, x, backward=True, repeats=2, max_repeats=2, recordings=1)
    c = p.candidates.set_index("candidate")
    assert name in c.index and c.at[name, "measured_us"] > 0
    assert c.at[name, "vs"] in ("all contiguous", "all channels_last") and c.at[name, "ratio"] > 0
    if p.chosen == name:  # taken only where it measured faster than the better uniform layout
        assert p.formats["b"] == p.formats["c"] == "contiguous" and p.formats["a"] == "channels_last"
        assert c.at[name, "ratio_high"] < 1


def test_plan_layout_and_apply_plan_reject_bad_input(fast_measurements):
    with pytest.raises(TypeError, match="nn.Module"):
        auditor.plan_layout(lambda x: x, torch.randn(1, 3, 4, 4))
    with pytest.raises(ValueError, match="inputs"):
        auditor.plan_layout(Small())
    with pytest.raises(TypeError, match="LayoutPlan"):
        auditor.apply_plan(Small(), {"stem": "channels_last"})
    p = auditor.plan_layout(Small().eval(), torch.randn(1, 3, 6, 6), repeats=1, recordings=1)
    with pytest.raises(ValueError, match="not a convolution of this model"):
        auditor.apply_plan(nn.Sequential(nn.Conv2d(3, 3, 1)), p)


def test_time_interleaved_reports_both_clocks_spread_and_page_faults():
    t = _harness.time_interleaved({"a": lambda: sum(range(100)), "b": lambda: sum(range(200))}, 3, min_sample_us=100)
    assert list(t.index) == ["a", "b"]
    assert {"wall_us", "cpu_us", "wall_spread", "cpu_spread", "faults"} <= set(t.columns)
    assert (t[["wall_us", "cpu_us"]] > 0).all().all()
    assert isinstance(auditor.steady_malloc(), bool)
    assert _harness.default_clock("cpu") in ("cpu", "wall")


def test_time_interleaved_times_one_thread_in_cpu_time_with_paired_ratios(monkeypatch):
    """By default one thread, process CPU time, and each callable's paired ratio to the first
    with its interval and a verdict: load from elsewhere cannot turn noise into a saving."""
    from auditor._measure import _harness

    seen = []

    def fake(name, fn, number, device):  # b takes twice a's time in every round; c the same as a
        seen.append(torch.get_num_threads())
        return {"a": 100.0, "b": 200.0, "c": 100.0}[name], {"a": 10.0, "b": 20.0, "c": 10.0}[name], 0.0

    monkeypatch.setattr(_harness, "sample", fake)
    threads = torch.get_num_threads()
    t = _harness.time_interleaved({"a": lambda: None, "b": lambda: None, "c": lambda: None}, 7)
    assert set(seen) == {1} and torch.get_num_threads() == threads
    assert (t["clock"] == "cpu").all() and list(t["us"]) == [10.0, 20.0, 10.0]
    assert list(t["verdict"]) == ["baseline", "slower", "within noise"]
    assert t.at["b", "ratio"] == 2.0 and t.at["b", "ratio_low"] == 2.0 and (t["rounds"] == 7).all()
    few = _harness.time_interleaved({"a": lambda: None, "b": lambda: None}, 3)
    assert few.at["b", "verdict"] == "within noise"  # too few rounds for an interval
    if threads > 1:
        seen.clear()
        assert (_harness.time_interleaved({"a": lambda: None}, 1, threads=None)["clock"] == "wall").all()
        assert set(seen) == {threads}


class Softmax(nn.Softmax):
    """A subclass of torch's Softmax that keeps its name, as libraries' own layers do."""


def test_swaps_apply_to_subclasses_of_the_torch_module():
    model, x = make("softmax")
    model.mid = Softmax(dim=model.mid.dim)
    ref = model(x)
    f = auditor.suggest_fixes(auditor.audit(model, x))
    assert list(f.frame["action"]) == [_suggest.SWAP]
    done = f.apply(model)
    assert done["applied"].all()
    torch.testing.assert_close(model(x), ref)
    assert forward_hotspots(auditor.audit(model, x)).empty


class TemperedSoftmax(nn.Softmax):
    """A subclass that computes something else: its own forward."""

    def forward(self, x):
        return super().forward(x / 2)


def test_a_subclass_with_its_own_forward_is_not_swapped():
    model = nn.Sequential(nn.Conv2d(3, 4, 1), TemperedSoftmax(dim=1))
    with pytest.raises(ValueError, match="forward of its own"):
        _keep_format.swap_module(model, "1")
    assert type(model[1]) is TemperedSoftmax


class GatedBlocks(nn.Module):
    """Three identical squeeze-excite blocks, each pooling with its own nn.AdaptiveAvgPool2d:
    one line, run in three instances of one module class."""

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(8, 8, 3, padding=1)
            self.pool = nn.AdaptiveAvgPool2d(1)
            self.fc = nn.Conv2d(8, 8, 1)

        def forward(self, x):
            y = self.conv(x)
            return y * torch.sigmoid(self.fc(self.pool(y)))

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.blocks = nn.Sequential(*(self.Block() for _ in range(3)))
        self.head = nn.Conv2d(8, 8, 1)

    def forward(self, x):
        return self.head(self.blocks(self.stem(x)))


def test_a_module_swap_covers_every_instance_that_shows_the_cause():
    torch.manual_seed(0)
    model, x = auditor.to_channels_last(GatedBlocks(), torch.randn(2, 3, 8, 8))
    a = auditor.audit(model, x, record_time=False)
    f = auditor.suggest_fixes(a)
    swaps = f.frame[f.frame["action"] == _suggest.SWAP]
    if swaps.empty:
        pytest.skip("this machine's kernels make no cause of the pool's backward")
    modules = swaps.iloc[0]["suggestion"]
    assert ".pool = auditor.keep_format(" in modules and "# and 2 more like it" in modules, modules
    f.apply(model)
    try:
        assert auditor.audit(model, x, record_time=False).hotspots().empty
        assert all(isinstance(b.pool, _keep_format.GlobalAvgPool) for b in model.blocks)
    finally:
        f.undo()
