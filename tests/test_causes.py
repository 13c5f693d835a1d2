"""Causes: every hotspot traced to the op and line where its data left its format, one fix per
cause, and the same causes whatever mode the model runs in."""

from __future__ import annotations

import ast
import contextlib
import importlib.util
import inspect
import linecache
import re
import textwrap
from pathlib import Path

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
import torchvision
from aligned import hotspots_moving_in
from kernels import assert_causes_follow_the_kernels, convs_that_lose
from planted import CAUSE_MODELS, MODELS, absent_here, make, make_cause

import auditor
from auditor._fix import _suggest

CL = torch.channels_last


@pytest.fixture(scope="module")
def cause_audits():
    return {name: auditor.audit(*make_cause(name)) for name in CAUSE_MODELS}


def planted_here(name: str) -> str:
    """``name``, or a skip where this machine's kernels do not make the cause it plants."""
    reason = absent_here(name)
    if reason:
        pytest.skip(reason)
    return name


@pytest.fixture(scope="module")
def planted_audits():
    return {name: auditor.audit(*make(name)) for name in MODELS}


def _line(source: str) -> str:
    path, _, number = source.rpartition(":")
    return linecache.getline(path, int(number)).strip()


@pytest.mark.parametrize("name", sorted(CAUSE_MODELS))
def test_each_planted_cause_is_found_at_its_line(cause_audits, name):
    a = cause_audits[planted_here(name)]
    c = a.causes()
    assert set(zip(c["phase"], c["op"], c["kind"], c["pattern"], strict=True)) == CAUSE_MODELS[name][2]
    for row in c.itertuples():
        assert "planted" in _line(row.source), (row.source, _line(row.source))  # the line to change
        assert row.fix


def test_a_stack_is_no_loss_and_the_reduction_after_it_is(cause_audits):
    ops = cause_audits["stack_reduce"].ops()
    kinds = dict(zip(ops["op"].astype(str), ops["kind"].astype(str), strict=False))
    assert kinds["aten.stack.default"] == "preserves" and kinds["aten.sum.dim_IntList"] == "loses"


def test_a_convolution_that_writes_another_format_is_a_loss_not_all_clear(cause_audits):
    a = cause_audits[planted_here("conv3d_batch1")]
    conv = a.ops()[a.ops()["op"] == "aten.convolution.default"].iloc[0]
    assert (conv["kind"], conv["from_format"], conv["to_format"]) == ("loses", "channels_last_3d", "contiguous")
    assert "channels_last propagates" not in a.report()
    assert a.causes()["fix"].iloc[0].count("no channels_last_3d kernel") == 1


def test_a_rebuilt_weight_is_a_cause_with_its_bytes_per_step(cause_audits):
    a = cause_audits["weight_rebuilt"]
    cause = a.causes().iloc[0]
    weight = 8 * 8 * 3 * 3 * 4
    # the rebuilding copy, and the convolution permuting the result in forward and backward
    assert cause["bytes"] == 3 * weight and cause["hotspots"] == 2
    hot = a.hotspots()
    assert set(hot["op"]) == {"aten.convolution.default", "aten.convolution_backward.default"}


def test_backward_copies_of_an_inplace_op_on_a_view_name_that_line(cause_audits):
    a = cause_audits["inplace_view"]
    for row in a.hotspots().itertuples():
        assert _line(row.source) == "y += 1  # planted: in place on a view"


def test_attention_tensors_are_not_images_and_their_copies_happen_in_any_layout():
    model, x = make_cause("token_attention")
    a = auditor.audit(model, x)
    assert a.hotspots().empty and a.causes().empty
    copies = a.ops()[a.ops()["layout_independent"]]
    assert len(copies) >= 2 and (copies["bytes"] > 0).all()
    summary = a.summary()
    assert summary["module"].iloc[-1] == "<layout-independent copies>" and summary["bytes"].iloc[-1] > 0
    assert "layout-independent copies" in a.report()
    # the same copies, at the same lines, when the model runs all-contiguous
    plain = auditor.audit(model.to(memory_format=torch.contiguous_format), x.contiguous())
    plain_copies = plain.ops()[plain.ops()["layout_independent"]]
    assert set(zip(copies["op"], copies["source"])) == set(zip(plain_copies["op"], plain_copies["source"]))


@pytest.mark.parametrize("which", ["planted", "causes"])
def test_every_hotspot_belongs_to_exactly_one_cause(planted_audits, cause_audits, which):
    for name, a in (planted_audits if which == "planted" else cause_audits).items():
        ops = a.ops()
        hot = ops[ops["hotspot"]]
        assert (hot["cause"] > 0).all(), name
        assert (ops.loc[~ops["hotspot"], "cause"] == 0).all(), name
        causes = a.causes()
        assert causes["hotspots"].sum() == len(hot), name
        assert set(hot["cause"]) == set(causes["cause"]), name
        assert causes["bytes"].is_monotonic_decreasing, name
        assert (a.hotspots()["cause"] > 0).all(), name
        # a view is never a cause
        assert not ops.set_index("seq").loc[causes_events(a), "kind"].eq("view").any(), name


def causes_events(a) -> list[int]:
    ops = a.ops()
    out = []
    for c in a.causes().itertuples():
        same = (ops["op"] == c.op) & (ops["phase"] == c.phase) & (ops["source"] == c.source)
        out.append(int(ops.loc[same, "seq"].iloc[0]))
    return out


@pytest.mark.parametrize("name", sorted(CAUSE_MODELS))
def test_the_fixed_model_loses_the_cause_and_keeps_its_outputs(cause_audits, name):
    model, x = make_cause(planted_here(name))
    fixed, fx = make_cause(name, fixed=True)
    torch.testing.assert_close(fixed(fx), model(x), rtol=1e-4, atol=1e-4)
    after = auditor.audit(fixed, fx)
    before = cause_audits[name]
    assert len(after.hotspots()) < len(before.hotspots()) or before.hotspots().empty
    assert not set(after.causes()["pattern"]) & set(before.causes()["pattern"])


@pytest.mark.parametrize("name", sorted(CAUSE_MODELS))
def test_strict_raises_exactly_where_the_analyzer_finds_a_loss(cause_audits, name):
    ops = cause_audits[name].ops()
    losses = ops[ops["kind"] == "loses"]
    model, x = make_cause(name)
    if losses.empty:
        auditor.audit(model, x, strict=True)
        return
    first = losses.iloc[0]
    with pytest.raises(auditor.FormatLossError, match=str(first["op"]).replace(".", r"\.")):
        auditor.audit(model, x, strict=True)


def test_report_leads_with_the_causes_and_folds_their_symptoms(planted_audits):
    text = planted_audits["softmax"].report()
    lines = text.splitlines()
    first_cause = next(i for i, line in enumerate(lines) if line.strip().startswith("1. "))
    assert "aten._softmax.default" in lines[first_cause] and "[no_cl_kernel]" in lines[first_cause]
    symptoms = [line for line in lines[first_cause:] if line.strip().startswith("- ")]
    assert any("convolution_backward" in line for line in symptoms)
    assert lines.index(next(line for line in lines if line.startswith("Modules"))) > first_cause


def test_diff_by_cause_names_the_vanished_cause():
    model, x = make_cause("stack_reduce")
    fixed, fx = make_cause("stack_reduce", fixed=True)
    d = auditor.diff(auditor.audit(model, x), auditor.audit(fixed, fx), by="cause")
    assert list(d["status"]) == ["vanished"] and d["pattern"].iloc[0] == "stack_reduce"
    assert d["bytes_delta"].iloc[0] < 0 and d["hotspots_after"].iloc[0] == 0
    with pytest.raises(ValueError, match="'group' or 'cause'"):
        auditor.diff(auditor.audit(model, x), auditor.audit(model, x), by="module")


# -- fixes --------------------------------------------------------------------------------------

#: pattern -> the action its fix takes
FIX_ACTIONS = {
    "stack_reduce": _suggest.EDIT, "nc11_broadcast": _suggest.EDIT, "mean_backward": _suggest.EDIT, "inplace_view": _suggest.EDIT,
    "channel_slice": _suggest.EDIT, "weight_rebuilt": _suggest.EDIT, "conv_no_kernel": _suggest.REGION, "joins": _suggest.EDIT,
    "mixed_join": _suggest.EDIT,
}
#: models whose cause's fix takes another action than its pattern's usual one, and why
MODEL_ACTIONS = {
    "adaptive_pool_head": _suggest.SWAP,  # its mean runs inside nn.AdaptiveAvgPool2d(1): the module is swapped
}


@pytest.mark.parametrize("name", sorted(n for n in CAUSE_MODELS if CAUSE_MODELS[n][2]))
def test_one_fix_per_cause_that_saves_bytes(cause_audits, name):
    a = cause_audits[planted_here(name)]
    f = auditor.suggest_fixes(a)
    causes = a.causes()
    assert len(f) == len(causes) and set(f.frame["cause"]) == set(causes["cause"])
    assert (f.frame["bytes"] > 0).all()
    row = f.frame.iloc[0]
    assert row["action"] == MODEL_ACTIONS.get(name, FIX_ACTIONS[row["pattern"]]), row.to_dict()
    # "write" is a real rewrite or nothing: a fix by hand (a join no rewrite is known for) has none
    assert row["detail"] and (row["suggestion"] or not row["automatic"])
    assert (f.hotspots()["fix"] > 0).all()


def test_region_fix_for_a_convolution_without_a_kernel_applies_and_keeps_outputs(cause_audits):
    model, x = make_cause(planted_here("conv3d_batch1"))
    ref = model(x)
    f = auditor.suggest_fixes(cause_audits["conv3d_batch1"])
    done = f.apply(model)
    assert done["applied"].all()
    torch.testing.assert_close(model(x), ref, rtol=1e-4, atol=1e-5)
    assert auditor.audit(model, x).hotspots().empty


class OneContiguousWeight(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Conv2d(3, 8, 3, padding=1)
        self.b = nn.Conv2d(8, 8, 3, padding=1)
        self.c = nn.Conv2d(8, 8, 3, padding=1)

    def forward(self, x):
        return self.c(torch.relu(self.b(torch.relu(self.a(x)))))


def test_a_weight_stored_in_the_other_format_gets_a_weight_fix_that_applies_once():
    torch.manual_seed(0)
    model = OneContiguousWeight().to(memory_format=CL)
    model.b.weight.data = model.b.weight.data.contiguous()  # the one weight not converted
    x = torch.randn(2, 3, 8, 8).to(memory_format=CL)
    a = auditor.audit(model, x)
    causes = a.causes()
    assert list(causes["pattern"]) == ["weight_format"] and causes["module"].iloc[0] == "b"
    f = auditor.suggest_fixes(a)
    assert list(f.frame["action"]) == [_suggest.WEIGHT]
    assert f.apply(model)["applied"].all() and model.b.weight.is_contiguous(memory_format=CL)
    again = f.apply(model)
    assert not again["applied"].any() and "already channels_last" in again["detail"].iloc[0]
    assert auditor.audit(model, x).hotspots().empty


def test_no_weight_fix_for_weights_already_in_the_format(planted_audits):
    for name, a in planted_audits.items():
        assert _suggest.WEIGHT not in set(auditor.suggest_fixes(a).frame["action"]), name


@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated")
def test_apply_refuses_torchscript_before_changing_anything():
    model, x = make("softmax")
    f = auditor.suggest_fixes(auditor.audit(model, x))
    scripted = torch.jit.script(model)
    with pytest.raises(TypeError, match="TorchScript"):
        f.apply(scripted)
    with pytest.raises(TypeError, match="nn.Module"):
        f.apply(lambda t: t)


def test_missing_kernel_claims_are_backed_by_coverage(planted_audits, cause_audits):
    for a in [*planted_audits.values(), *cause_audits.values()]:
        cov = a.coverage()
        for row in auditor.suggest_fixes(a).frame.itertuples():
            if "no channels_last" in row.detail or "no channels_last" in a.causes().set_index("cause").at[row.cause, "fix"]:
                support = set(cov.loc[cov["op"] == row.op, "support"])
                assert support & {"none", "partial"}, (row.op, support)


# -- execution modes ------------------------------------------------------------------------------


def _forward_causes(a) -> set[tuple]:
    c = a.causes()
    return _cause_keys(c[c["phase"] == "forward"])


def _cause_keys(c) -> set[tuple]:
    return set(zip(c["source"], c["kind"], c["pattern"], strict=True))


MODES = {
    "no_grad": torch.no_grad,
    "inference_mode": torch.inference_mode,
    "autocast_bf16": lambda: torch.autocast("cpu", dtype=torch.bfloat16),
}

#: Models whose causes are all in backward: forward-only modes have nothing to compare.
BACKWARD_ONLY = {"se_mean", "inplace_view", "channel_slice", "bicubic"}
@pytest.mark.parametrize("mode", sorted(MODES))
@pytest.mark.parametrize("name", sorted(set(MODELS) | set(CAUSE_MODELS)))
def test_the_same_causes_in_every_execution_mode(name, mode):
    """Forward causes of a training step equal those of the forward pass under no_grad,
    inference_mode (composite ops reach the recorder undecomposed) and bf16 autocast, wherever
    this machine runs the same convolution kernels in that mode; where a convolution has a
    channels_last kernel in one dtype only (a bfloat16 Conv3d at batch 1 on some CPUs), the
    causes follow the kernels the machine ran."""
    build = make_cause if name in CAUSE_MODELS else make
    model, x = build(name)
    trained = auditor.audit(model, x)
    step = _forward_causes(trained)
    model, x = build(name)
    here, there = convs_that_lose(model, (x,)), convs_that_lose(model, (x,), MODES[mode])
    with MODES[mode]():
        seen = auditor.audit(model, x, backward=False)
    if here != there:
        assert_causes_follow_the_kernels(seen, there, trained, _cause_keys)
        return
    assert _forward_causes(seen) == step
    if name in BACKWARD_ONLY:
        assert not step  # their cause is the backward of their line: nothing to see forward


def test_inference_mode_still_sees_convolutions_and_copies():
    torch.manual_seed(0)
    model = torchvision.models.shufflenet_v2_x0_5(weights=None).to(memory_format=CL).eval()
    x = torch.randn(1, 3, 32, 32).to(memory_format=CL)
    with torch.no_grad():
        plain = auditor.audit(model, x, backward=False)
    with torch.inference_mode():
        undecomposed = auditor.audit(model, x, backward=False)
    ops = set(undecomposed.events["op"].astype(str))
    assert {"aten.conv2d.default", "aten.contiguous.default"} <= ops  # composite ops, as they came
    assert len(undecomposed.hotspots()) > 20
    assert _forward_causes(undecomposed) == _forward_causes(plain)
    with contextlib.suppress(auditor.FormatLossError), torch.inference_mode():
        auditor.audit(model, x, backward=False, strict=True)


class PooledMapPaddedInNHWC(nn.Module):
    """Window attention's padding, as efficientvit writes it, on a map pooled to 1 x 1: the
    NHWC view of an N x C x 1 x 1 image is padded and permuted back into channels_last."""

    def __init__(self):
        super().__init__()
        self.a = nn.Conv2d(3, 8, 3, padding=1)
        self.b = nn.Conv2d(8, 8, 3, padding=1)

    def forward(self, x):
        p = self.a(x).mean((2, 3), keepdim=True).permute(0, 2, 3, 1)  # strides (C, 1, 1, 1): all 1 but N
        p = nn.functional.pad(p, (0, 0, 0, 3, 0, 3))  # (N, 4, 4, C), channels innermost
        return self.b(p.permute(0, 3, 1, 2))


def test_an_nhwc_view_of_a_pooled_map_keeps_its_channels():
    torch.manual_seed(0)
    model = PooledMapPaddedInNHWC().to(memory_format=CL)
    a = auditor.audit(model, torch.randn(2, 3, 8, 8).to(memory_format=CL), record_time=False)
    causes = a.causes()
    assert list(causes["pattern"]) == ["mean_backward"]  # the mean's own backward, not the padding
    pad = a.ops()[a.ops()["op"] == "aten.constant_pad_nd.default"]
    assert len(pad) == 2
    assert (pad["kind"] == "preserves").all()


class VideoConv(nn.Conv3d):
    """A convolution type whose name says nothing: a region is found by the ops its modules ran
    and applied to the modules that are convolutions."""


def test_region_fix_finds_convolutions_whatever_their_type_is_called():
    model, x = make_cause(planted_here("conv3d_batch1"))
    for name in ("a", "c"):
        old = getattr(model, name)
        new = VideoConv(old.in_channels, old.out_channels, 3, padding=1).to(memory_format=torch.channels_last_3d)
        new.load_state_dict(old.state_dict())
        setattr(model, name, new)
    ref = model(x)
    f = auditor.suggest_fixes(auditor.audit(model, x))
    assert list(f.frame["action"]) == [_suggest.REGION]
    done = f.apply(model)
    assert done["applied"].all()
    torch.testing.assert_close(model(x), ref, rtol=1e-4, atol=1e-5)
    assert auditor.audit(model, x).hotspots().empty


# -- the pattern registry -----------------------------------------------------------------------


def _emitted_patterns() -> tuple[set[str], list[str]]:
    """(the registry constants ``CauseTracer.pattern`` returns, the bare strings it returns)."""
    from auditor._analysis._causes import CauseTracer

    tree = ast.parse(textwrap.dedent(inspect.getsource(CauseTracer.pattern)))
    named = {node.value.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute) and node.attr == "name"
             and isinstance(node.value, ast.Attribute) and isinstance(node.value.value, ast.Name)
             and node.value.value.id == "patterns"}
    bare = [node.value.value for node in ast.walk(tree) if isinstance(node, ast.Return)
            and isinstance(node.value, ast.Constant)]
    return named, bare


def test_every_pattern_the_tracer_can_emit_is_complete():
    """A pattern is one registry record: what happened, the remedy, the fix text, what the
    timing model replaces, and at least one fix generator; the tracer emits registry constants
    only (a typo fails at once), every registered pattern can be emitted, and the docs'
    table is the registry."""
    from auditor._analysis import _patterns
    from auditor._analysis._patterns import PATTERNS, pattern
    from auditor._fix._registry import fix_generators

    named, bare = _emitted_patterns()
    assert not bare, f"CauseTracer.pattern returns bare strings {bare}: return a registered pattern's name"
    emitted = {getattr(_patterns, constant).name for constant in named}
    assert emitted == set(PATTERNS)
    for p in PATTERNS.values():
        assert p.happened and p.remedy and p.fix, p
        assert p.replaces in (None, _patterns.WRITE, _patterns.COPY_AFTER), p
        assert fix_generators(p.name), f"no fix generator is registered for {p.name}"
    with pytest.raises(KeyError, match="no cause pattern 'mean_backwards'"):
        pattern("mean_backwards")
    docs = Path(__file__).resolve().parent.parent / "docs"
    assert "<!-- generated: patterns -->" in (docs / "concepts" / "patterns.md").read_text()
    spec = importlib.util.spec_from_file_location("docs_hooks", docs / "hooks.py")
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    block = hooks.patterns_table()  # the docs' table, as the site's build makes it
    table = {m[0]: (m[1], m[2]) for m in re.findall(r"^\| `([a-z0-9_]+)` \| (.+?) \| (.+?) \|$", block, flags=re.M)}
    assert table == {p.name: (p.happened, p.remedy) for p in PATTERNS.values()}


# -- conv and token hybrids: hotspots that are format problems, the same in every mode ----------


def _trained_and_contiguous(cls, shape=(2, 3, 8, 8)) -> tuple[auditor.Audit, auditor.Audit]:
    """Audits of one training step of ``cls()``, channels_last and all-contiguous."""
    out = []
    for fmt in (CL, torch.contiguous_format):
        torch.manual_seed(0)
        model = cls().to(memory_format=fmt)
        x = torch.randn(*shape).contiguous(memory_format=fmt)
        out.append(auditor.audit(model, x, record_source=True, record_time=False))
    return out[0], out[1]


def _lines(a, phase: str | None = "forward") -> set[tuple[str, str]]:
    """(pattern, the line's text) of each cause of ``a`` (in ``phase``)."""
    c = a.causes()
    if phase:
        c = c[c["phase"] == phase]
    return {(p, _line(s)) for p, s in zip(c["pattern"], c["source"], strict=True)}


def _forward_only(cls, mode, shape=(2, 3, 8, 8)) -> auditor.Audit:
    torch.manual_seed(0)
    model = cls().to(memory_format=CL)
    x = torch.randn(*shape).contiguous(memory_format=CL)
    with MODES[mode]():
        return auditor.audit(model, x, backward=False, record_source=True, record_time=False)


class NHWCGate(nn.Module):
    """Tokens reshaped back to an NHWC map gate the NHWC view of an image: both operands in the
    same physical order, the tokens' labelled as if H were their channels."""

    def __init__(self):
        super().__init__()
        self.a = nn.Conv2d(3, 8, 3, padding=1)
        self.w = nn.Parameter(torch.randn(8, 8) / 8)
        self.b = nn.Conv2d(8, 8, 3, padding=1)

    def forward(self, x):
        y = self.a(x)
        B, C, H, W = y.shape
        gate = (y.flatten(2).transpose(1, 2) @ self.w).view(B, H, W, C)
        return self.b((y.permute(0, 2, 3, 1) * gate).permute(0, 3, 1, 2))


def test_a_peer_of_an_nhwc_view_is_judged_with_its_channels_last():
    a, _ = _trained_and_contiguous(NHWCGate)
    assert a.hotspots().empty and a.causes().empty
    ops = a.ops()
    assert set(ops.loc[ops["op"] == "aten.mul.Tensor", "kind"]) == {"preserves"}


class NHWCLinear(nn.Module):
    """A Linear over the channels of an NHWC view (view, addmm, view when decomposed; one
    aten.linear under inference_mode), permuted back and copied contiguous."""

    def __init__(self):
        super().__init__()
        self.a = nn.Conv2d(3, 8, 3, padding=1)
        self.fc = nn.Linear(8, 8)
        self.b = nn.Conv2d(8, 8, 3, padding=1)

    def forward(self, x):
        y = self.fc(self.a(x).permute(0, 2, 3, 1))
        return self.b(y.permute(0, 3, 1, 2).contiguous())  # planted: the copy into contiguous


@pytest.mark.parametrize("mode", ["no_grad", "inference_mode"])
def test_a_linear_over_the_channels_keeps_the_image_in_every_mode(mode):
    a, _ = _trained_and_contiguous(NHWCLinear)
    planted = {("explicit_copy", "return self.b(y.permute(0, 3, 1, 2).contiguous())  # planted: the copy into "
                "contiguous")}
    assert _lines(a) == planted
    assert _lines(_forward_only(NHWCLinear, mode)) == planted
    # the Linear's result, reshaped back from the rows addmm wrote (by whichever view op this
    # torch's decomposition ends with), is the image, channels last
    ops, facts, t = a.ops(), a.facts(), a.tensors
    last = ops.index[(ops["module"] == "fc") & (ops["phase"] == "forward")].max()
    out = t.index[(t["seq"] == last) & (t["role"] == "output")]
    assert len(out) == 1 and facts.loc[out, "image"].all() and set(facts.loc[out, "cdim"]) == {3}


class SingleTileUnfold(nn.Module):
    """MobileViT's unfold and fold of a map that is one patch, a LayerNorm over its tokens."""

    def __init__(self):
        super().__init__()
        self.a = nn.Conv2d(3, 8, 3, padding=1)
        self.norm = nn.LayerNorm(8)
        self.b = nn.Conv2d(8, 8, 3, padding=1)

    def forward(self, x):
        y = self.a(x)
        B, C, H, W = y.shape  # one H x W patch
        t = y.reshape(B * C, 1, H, W).transpose(1, 2)
        t = t.reshape(B, C, 1, H * W).transpose(1, 3).reshape(B * H * W, 1, C)
        t = self.norm(t)
        t = t.contiguous().view(B, H * W, 1, C).transpose(1, 3).reshape(B * C, 1, H, W)  # planted: fold
        return self.b(t.transpose(1, 2).reshape(B, C, H, W))


def test_the_tokens_of_a_single_patch_are_not_an_image():
    """Viewed back as (B, C, N, P), the tokens of one patch have the strides of the image; their
    copies happen in any layout, as those of many patches do."""
    a, contiguous = _trained_and_contiguous(SingleTileUnfold)
    assert not hotspots_moving_in(a, contiguous)
    hot = a.hotspots()
    assert not any("planted: fold" in _line(s) for s in hot.loc[hot["kind"] == "restores", "source"])
    assert ("reshape_merge", "t = y.reshape(B * C, 1, H, W).transpose(1, 2)") in _lines(a)


class HeadsMatmul(nn.Module):
    """A product of a map with its transpose, batched over the channels (attention scores of
    one head per channel): the batch dimensions a channels_last map cannot merge by a view."""

    def __init__(self):
        super().__init__()
        self.a = nn.Conv2d(3, 8, 3, padding=1)
        self.b = nn.Conv2d(8, 8, 3, padding=1)

    def forward(self, x):
        y = self.a(x)
        attn = y @ y.transpose(-1, -2)  # planted: batched over the channels
        return self.b(attn.softmax(-1))


def test_a_matmul_under_inference_mode_is_classified_like_its_decomposition():
    a, _ = _trained_and_contiguous(HeadsMatmul)
    step = _lines(a)
    assert ("reshape_merge", "attn = y @ y.transpose(-1, -2)  # planted: batched over the channels") in step
    seen = _forward_only(HeadsMatmul, "inference_mode")
    assert _lines(seen) == step
    ops = seen.ops()
    assert set(ops.loc[ops["op"] == "aten.matmul.default", "kind"]) == {"converts"}


class MergingReshape(nn.Module):
    """A 4-D to 4-D reshape that merges the batch with channel groups: a copy in channels_last."""

    def __init__(self):
        super().__init__()
        self.a = nn.Conv2d(3, 8, 3, padding=1)
        self.b = nn.Conv2d(8, 8, 3, padding=1)

    def forward(self, x):
        y = self.a(x)
        B, C, H, W = y.shape
        t = y.reshape(B * 2, C // 2, H, W)  # planted: merges B with channel groups
        return self.b(torch.relu(t).reshape(B, C, H, W))


@pytest.mark.parametrize("mode", ["no_grad", "inference_mode"])
def test_a_reshape_that_copies_is_a_reshape_merge_whatever_the_ranks(mode):
    a, _ = _trained_and_contiguous(MergingReshape)
    planted = ("reshape_merge", "t = y.reshape(B * 2, C // 2, H, W)  # planted: merges B with channel groups")
    assert planted in _lines(a)
    assert _lines(_forward_only(MergingReshape, mode)) == _lines(a)


class TokensThroughDropout(nn.Module):
    """Tokens written row-major, viewed as the map, through a dropout of probability 0 (which
    returns the very tensor it is given when it reaches the recorder, under inference_mode)."""

    def __init__(self):
        super().__init__()
        self.a = nn.Conv2d(3, 8, 3, padding=1)
        self.w = nn.Parameter(torch.randn(8, 8) / 8)
        self.drop = nn.Dropout(0.0)
        self.b = nn.Conv2d(8, 8, 3, padding=1)

    def forward(self, x):
        y = self.a(x)
        B, C, H, W = y.shape
        t = (self.w @ y.flatten(2)).view(B, C, H, W)  # planted: row-major tokens as the map
        return self.b(self.drop(t))


def test_an_op_that_returns_its_input_moves_no_data():
    a, _ = _trained_and_contiguous(TokensThroughDropout)
    planted = {("joins", "t = (self.w @ y.flatten(2)).view(B, C, H, W)  # planted: row-major tokens as the map")}
    assert _lines(a) == planted
    assert _lines(_forward_only(TokensThroughDropout, "inference_mode")) == planted


class PaddedWindow(nn.Module):
    """Window attention's padding of an NHWC view (it writes NHWC-contiguous whatever the model's
    format), and a row-major attention output added to it: both layouts are the code's."""

    def __init__(self):
        super().__init__()
        self.a = nn.Conv2d(3, 8, 3, padding=1)
        self.w = nn.Parameter(torch.randn(8, 8) / 8)
        self.b = nn.Conv2d(8, 8, 3, padding=1)

    def forward(self, x):
        y = self.a(x)
        p = F.pad(y.permute(0, 2, 3, 1), (0, 0, 0, 2, 0, 2)).permute(0, 3, 1, 2)
        B, C, H, W = p.shape
        q = self.tokens((self.w @ p.flatten(2)).view(B, C, H, W))
        return self.b(p + q)  # planted: the add

    def tokens(self, q):
        return q


class PaddedWindowRolled(PaddedWindow):
    """The same, the attention output rolled: an op whose layout policy the analyzer does not know."""

    def tokens(self, q):
        return torch.roll(q, 1, -1)


def test_a_conversion_of_layouts_the_code_pins_is_layout_independent():
    a, contiguous = _trained_and_contiguous(PaddedWindow)
    ops = a.ops()
    add = ops[(ops["op"] == "aten.add.Tensor") & (ops["phase"] == "forward")]
    assert len(add) == 1 and add["kind"].iloc[0] == "converts"
    assert add["layout_independent"].all() and not add["hotspot"].any() and (add["uncertain"] == "").all()
    theirs = contiguous.ops()
    assert set(theirs.loc[(theirs["op"] == "aten.add.Tensor") & (theirs["phase"] == "forward"), "kind"]) == {"converts"}
    assert not hotspots_moving_in(a, contiguous)
    assert "layout-independent copies" in a.report() and "uncertain" not in a.report()


def test_a_layout_decided_by_an_assumed_policy_is_reported_uncertain():
    a, _ = _trained_and_contiguous(PaddedWindowRolled)
    ops = a.ops()
    add = ops[(ops["op"] == "aten.add.Tensor") & (ops["phase"] == "forward")]
    assert add["layout_independent"].all()
    reason = "layout policy of aten.roll assumed to follow its inputs"
    assert list(add["uncertain"]) == [reason]
    assert (ops.loc[~ops["layout_independent"], "uncertain"] == "").all()
    assert reason in a.report() and "uncertain: 1 of them" in a.report()
    assert reason in a._repr_html_()


class TokensMeetTheMap(nn.Module):
    """Attention-like output (tokens written row-major, their transpose viewed as the map: channels
    last in any layout) added to the map it came from, then copied contiguous. An elementwise
    kernel orders its result as its first operand: tokens first, the sum is channels_last in
    any layout and so is the copy's conversion; the map first, the sum follows the model's format."""

    def __init__(self, tokens_first: bool = True):
        super().__init__()
        self.tokens_first = tokens_first
        self.a = nn.Conv2d(3, 8, 3, padding=1)
        self.w = nn.Parameter(torch.randn(8, 8) / 8)
        self.b = nn.Conv2d(8, 8, 3, padding=1)

    def forward(self, x):
        y = self.a(x)
        B, C, H, W = y.shape
        t = (y.flatten(2).transpose(1, 2) @ self.w).transpose(1, 2).view(B, C, H, W)
        s = t + y if self.tokens_first else y + t
        return self.b(s.contiguous())  # planted: the copy


@pytest.mark.parametrize("tokens_first", [True, False])
def test_an_elementwise_result_is_laid_out_as_its_first_operand(tokens_first):
    a, contiguous = _trained_and_contiguous(lambda: TokensMeetTheMap(tokens_first))

    def copies(audit):
        ops = audit.ops()
        return ops[(ops["op"] == "aten.clone.default") & ops["source"].map(lambda s: bool(s) and "planted: the copy" in _line(s))]

    copy, theirs = copies(a), copies(contiguous)
    assert list(copy["kind"]) == ["converts"]
    assert list(theirs["kind"]) == (["converts"] if tokens_first else [])  # a no-op on a contiguous sum
    assert bool(copy["layout_independent"].iloc[0]) == tokens_first
    assert bool(copy["hotspot"].iloc[0]) != tokens_first
    assert not hotspots_moving_in(a, contiguous)


@pytest.mark.parametrize("convert", ["to", "contiguous"])
def test_converting_in_code_to_channels_last_chooses_the_format_it_does_not_pin_it(convert):
    """A model and input converted inside the recorded code (a test under the pytest guard builds
    them there) give the hotspots of the same model converted before: the conversion is how the
    format under audit is chosen, so what follows it is no layout the code pins."""
    def build():
        torch.manual_seed(0)
        model, x = MODELS["softmax"][0](), torch.randn(2, 3, 16, 16)
        if convert == "to":
            return model.to(memory_format=torch.channels_last), x.to(memory_format=torch.channels_last)
        return model.to(memory_format=torch.channels_last), x.contiguous(memory_format=torch.channels_last)

    model, x = build()
    with auditor.FormatAuditor() as before:
        model(x)
    with auditor.FormatAuditor() as inside:
        model, x = build()
        model(x)
    keys = ["phase", "module", "op", "kind"]
    expected = sorted(before.audit.hotspots()[keys].values.tolist())
    assert ["forward", "mid", "aten._softmax.default", "loses"] in expected
    assert sorted(inside.audit.hotspots()[keys].values.tolist()) == expected


# -- a join of mixed formats, and what moves no bytes ------------------------------------------------


def test_a_join_of_mixed_formats_is_no_missing_kernel_and_its_fix_converts_the_odd_input(cause_audits):
    a = cause_audits["mixed_join"]
    ops = a.ops()
    cat = ops[ops["op"] == "aten.cat.default"].iloc[0]
    # the cat reorders the channels_last map to follow the contiguous flow: a conversion of it
    assert (cat["kind"], cat["bytes"]) == ("converts", 2 * 8 * 8 * 8 * 4)
    cov = a.coverage()
    assert set(cov.loc[cov["op"] == "aten.cat.default", "support"]) == {"full"}  # not "partial": no kernel is missing
    cause = a.causes().iloc[0]
    assert cause["pattern"] == "mixed_join" and "usually the small one" in cause["fix"]
    model, x = make_cause("mixed_join")
    fixes = auditor.suggest_fixes(a)
    row = fixes.frame.iloc[0]
    assert row["automatic"] and ".contiguous(memory_format=torch.channels_last if a.is_contiguous(" in row["suggestion"]
    assert "flow.contiguous(" in row["suggestion"] and "a.contiguous(" not in row["suggestion"]  # the odd one only
    fixes = fixes.verify(model, x, rounds=3, max_rounds=3, budget_s=1)
    v = fixes.verification
    fix = v[v["kind"] == "fix"].iloc[0]
    assert fix["applied"] and fix["hotspots_after"] == 0 and fix["same_outputs"] and fix["max_abs_diff"] == 0
    assert fix["contiguous_hotspots_after"] <= fix["contiguous_hotspots_before"]  # layout-neutral


class CoordinatesJoined(nn.Module):
    """Coordinate maps of one channel, expanded over the batch and W (stride 0), joined to a map in
    the format: either format by their channel count, neither by their strides."""

    def __init__(self):
        super().__init__()
        self.stem, self.conv = nn.Conv2d(3, 8, 3, padding=1), nn.Conv2d(10, 8, 3, padding=1)

    def forward(self, x):
        f = self.stem(x)
        n, _, h, w = f.shape
        ys = torch.linspace(-1, 1, h).view(1, 1, h, 1).expand(n, 1, h, w)
        xs = torch.linspace(-1, 1, w).view(1, 1, 1, w).expand(n, 1, h, w)
        f = torch.cat([f, ys, xs], dim=1)
        return self.conv(f)


def test_a_join_with_a_map_expanded_over_its_width_is_a_mixed_join_whose_fix_converts_it():
    """A map of one channel is labelled either format, but its strides are channels_last's only
    where it is dense: expanded (stride 0) it is neither, and ``cat`` writes contiguous for it.
    That is a join of mixed formats, fixed by converting the expanded maps, not a missing kernel
    (whose last resort was a region kept contiguous)."""
    model, x = CoordinatesJoined().to(memory_format=CL), torch.randn(2, 3, 8, 8).to(memory_format=CL)
    a = auditor.audit(model, x, record_time=False)
    assert list(a.causes()["pattern"]) == ["mixed_join"]
    fixes = auditor.suggest_fixes(a)
    row = fixes.frame.iloc[0]
    assert row["automatic"] and "f.contiguous(" not in row["suggestion"], row["reason"]
    assert "ys.contiguous(memory_format=torch.channels_last if f.is_contiguous(memory_format=torch.channels_last)" \
        in row["suggestion"] and "xs.contiguous(" in row["suggestion"]
    torch.manual_seed(0)
    expected = model(x)
    fixes.apply(model, exposed=False)
    try:
        assert torch.equal(model(x), expected)
        assert auditor.audit(model, x, record_time=False).causes().empty
    finally:
        fixes.undo()


def test_a_cat_whose_inputs_all_keep_the_format_keeps_it():
    class AllInFormat(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Conv2d(3, 8, 3, padding=1)
            self.b = nn.Conv2d(3, 2, 3, padding=1)
            self.c = nn.Conv2d(10, 8, 3, padding=1)

        def forward(self, x):
            return self.c(torch.cat([self.a(x), self.b(x)], dim=1))

    a = auditor.audit(AllInFormat().to(memory_format=CL), torch.randn(2, 3, 8, 8).to(memory_format=CL))
    assert a.causes().empty and set(a.ops().loc[a.ops()["op"] == "aten.cat.default", "kind"]) == {"preserves"}


def test_a_broadcast_read_of_a_map_in_both_formats_moves_no_bytes():
    from planted import ContiguousGate

    model = ContiguousGate().to(memory_format=CL)
    a = auditor.audit(model, torch.randn(2, 3, 8, 8).to(memory_format=CL))
    ops = a.ops()
    mul = ops[ops["op"].astype(str).str.startswith("aten.mul.")]
    # the N×1×H×W gate is one physical order in both formats: multiplying it in reorders nothing
    assert len(mul) and (mul["bytes"] == 0).all() and not mul["hotspot"].any()
    assert set(mul["kind"]) == {"preserves"}
    # the copy the gate is made from is the one cause, and the gate's reads are none of its symptoms
    assert set(a.causes()["op"]) == {"aten.clone.default"}
    assert not a.hotspots()["op"].str.startswith("aten.mul.").any()


def test_an_update_with_no_elements_moves_no_bytes():
    from planted import EmptyUpdate

    model = EmptyUpdate().to(memory_format=CL)
    a = auditor.audit(model, torch.randn(2, 3, 8, 8).to(memory_format=CL))
    ops = a.ops()
    puts = ops[ops["op"].astype(str).str.startswith("aten.index_put")]
    assert len(puts) == 2 and (puts["bytes"] == 0).all() and not puts["hotspot"].any()
    assert (puts["kind"] == "preserves").all()  # not a loss of the whole canvas
    # the canvas of zeros autograd makes contiguous is real, and is where the data joins the path
    causes = a.causes()
    assert list(causes["op"]) == ["aten.new_zeros.default"] and list(causes["pattern"]) == ["joins"]
    assert "no elements" not in causes["fix"].iloc[0]  # it happens whatever the update holds


def test_a_cause_from_a_level_with_no_element_says_so():
    from planted import EmptyLevel

    model = EmptyLevel().to(memory_format=CL)
    a = auditor.audit(model, torch.randn(2, 3, 8, 8).to(memory_format=CL), torch.zeros(0, 5))
    causes = a.causes()
    # the backward writes a map of zeros from the empty level's gradient: the data joins there,
    # not at the convolution that wrote the empty gradient
    assert list(causes["op"]) == ["torchvision._roi_align_backward.default"] and list(causes["kind"]) == ["joins"]
    assert "no elements (0x8x2x2, 0x5: a level no element fell in)" in causes["fix"].iloc[0]
    fixes = auditor.suggest_fixes(a)
    fix = fixes.frame.iloc[0]  # automatic where keep_format.roi_align replaces the op, else by hand
    assert "a level no element fell in" in (fix["detail"] if fix["automatic"] else fix["reason"])


def test_a_cause_from_a_map_the_input_size_made_1x1_says_so():
    from planted import OnePixelPad

    torch.manual_seed(0)
    model = OnePixelPad().to(memory_format=CL)
    small = auditor.audit(model, torch.randn(2, 3, 4, 4).to(memory_format=CL))
    (fix,) = small.causes()["fix"]
    assert "at the audited size the map here is 1x1 (2x8x1x1, made by the convolution at" in fix
    assert "planted.py" in fix
    reason = auditor.suggest_fixes(small).frame["reason"].iloc[0]
    assert not reason or "1x1" in reason
    # at a larger input the map is 4x4 and the cause is gone
    assert auditor.audit(model, torch.randn(2, 3, 16, 16).to(memory_format=CL)).causes().empty


def test_a_map_pooled_to_1x1_at_every_size_has_no_size_note(cause_audits):
    (fix,) = cause_audits["pool_branch"].causes()["fix"]
    assert "audited size" not in fix
