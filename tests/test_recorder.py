"""The recorder sees every aten op, attributes it, and leaves the user's run untouched."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import warnings

import pandas as pd
import pytest
import torch
import torch.nn as nn
import torchvision
from fault_models import CountingMode
from hypothesis import given, settings
from hypothesis import strategies as st
from pandas.testing import assert_frame_equal
from planted import make
from torch.utils._python_dispatch import _get_current_dispatch_mode

import auditor
from auditor._recording._log import EVENT_COLUMNS, TENSOR_COLUMNS

CL = torch.channels_last




def tv(name: str, size: int = 32, **kw):
    torch.manual_seed(0)
    model = getattr(torchvision.models, name)(weights=None, **kw).to(memory_format=CL)
    x = torch.randn(2, 3, size, size).to(memory_format=CL)
    return model, x


def train_step(model, x, opt=None):
    out = model(x)
    out.sum().backward()
    if opt is not None:
        opt.step()
        opt.zero_grad()
    return out


@pytest.mark.parametrize("options", [{}, {"record_source": True, "record_time": True}], ids=["plain", "extras"])
@pytest.mark.parametrize(
    "build",
    [
        lambda: tv("resnet18"),
        lambda: tv("mobilenet_v3_small"),
        lambda: tv("squeezenet1_1", size=48),
        lambda: make("mixed_cat"),
    ],
    ids=["resnet18", "mobilenet_v3_small", "squeezenet1_1", "mixed_cat"],
)
def test_sees_exactly_the_ops_a_bare_mode_sees(build, options):
    model, x = build()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    train_step(model, x, opt)  # momentum buffers exist from now on: both runs see the same ops
    counter = CountingMode()
    with counter:
        train_step(model, x, opt)
    with auditor.FormatAuditor(**options) as fa:
        train_step(model, x, opt)
    events = fa.audit.events
    assert len(events) == len(counter.ops)
    assert events["op"].astype(str).tolist() == counter.ops
    assert set(events["phase"]) == {"forward", "backward", "other"}


def test_schema_and_dtypes():
    model, x = make("clean")
    a = auditor.audit(model, x)
    assert list(a.events.columns) == list(EVENT_COLUMNS)
    assert list(a.tensors.columns) == list(TENSOR_COLUMNS)
    for col, dtype in {**EVENT_COLUMNS}.items():
        assert str(a.events[col].dtype) == dtype, col
    for col, dtype in TENSOR_COLUMNS.items():
        assert str(a.tensors[col].dtype) == dtype, col
    assert a.events["seq"].tolist() == list(range(len(a.events)))
    assert a.tensors["seq"].is_monotonic_increasing


def test_module_attribution_forward_and_backward():
    model, x = tv("resnet18")
    ev = auditor.audit(model, x).events
    convs = ev[ev["op"] == "aten.convolution.default"]
    assert convs["module"].iloc[0] == "conv1"
    assert "layer1.0.conv2" in set(convs["module"])
    assert set(convs["module_type"]) == {"Conv2d"}
    bw = ev[ev["op"] == "aten.convolution_backward.default"]
    assert len(bw) == len(convs)
    assert set(bw["phase"]) == {"backward"}
    assert set(bw["module"]) == set(convs["module"])
    fc = ev[(ev["module"] == "fc") & (ev["phase"] == "forward")]
    assert set(fc["module_type"]) == {"Linear"}
    # the loss is outside every module
    assert ev[ev["op"] == "aten.sum.default"]["module"].iloc[0] == "<global>"


def test_backward_attribution_skips_pass_through_modules():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.c1 = nn.Conv2d(3, 8, 3, padding=1)
            self.mid = nn.Identity()  # no op: its output is its input
            self.act = nn.ReLU(inplace=True)  # in place: same tensor, but an op ran
            self.c2 = nn.Conv2d(8, 8, 3, padding=1)

        def forward(self, x):
            return self.c2(self.act(self.mid(self.c1(x))))

    ev = auditor.audit(Net().to(memory_format=CL), torch.randn(2, 3, 8, 8).to(memory_format=CL)).events
    bw = ev[ev["phase"] == "backward"].set_index(ev[ev["phase"] == "backward"]["op"].astype(str))
    assert bw.loc["aten.threshold_backward.default", "module"] == "act"
    assert bw[bw.index == "aten.convolution_backward.default"]["module"].tolist() == ["c2", "c1"]


def test_backward_attribution_of_custom_functions_and_graphs_built_before_recording():
    class Double(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, g):
            return g.mul(2)

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)
            self.act = nn.Tanh()

        def forward(self, x):
            return Double.apply(self.act(self.lin(x)))

    class Holder(nn.Module):  # the Function runs inside a module of its own
        def __init__(self):
            super().__init__()
            self.net = Net()

    model = Holder()
    x = torch.randn(3, 4)
    with auditor.FormatAuditor() as fa:
        model.net(x).sum().backward()
    bw = fa.audit.events[fa.audit.events["phase"] == "backward"]
    assert set(bw.loc[bw["op"] == "aten.mul.Tensor", "module"]) == {"<root>"}  # Double's backward: net's op
    assert set(bw.loc[bw["op"] == "aten.tanh_backward.default", "module"]) == {"act"}
    assert set(bw.loc[bw["op"] == "aten.mm.default", "module"]) == {"lin"}

    # a graph built before the block: its backward ops belong to no recorded module
    y = model.net(x).sum()
    with auditor.FormatAuditor() as fa:
        model.net(x)  # a recorded forward whose nodes are newer than y's
        y.backward()
    ev = fa.audit.events
    assert set(ev.loc[ev["phase"] == "backward", "module"]) == {"<global>", "lin"}
    # only AccumulateGrad's sums into the .grad of the first step are lin's: the parameters
    # say whose they are
    acc = ev[(ev["phase"] == "backward") & (ev["module"] == "lin")]
    assert acc["op"].tolist() == ["aten.add_.Tensor"] * 2


def test_backward_of_a_backward_is_attributed_to_the_modules():
    """create_graph=True: the first backward builds nodes; their backward (a gradient penalty)
    belongs to the modules whose backward ops built them, not to <global>."""

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)
            self.act = nn.Tanh()
            self.head = nn.Linear(4, 1)

        def forward(self, x):
            return self.head(self.act(self.lin(x)))

    net, x = Net(), torch.randn(3, 4, requires_grad=True)
    with auditor.FormatAuditor() as fa:
        (g,) = torch.autograd.grad(net(x).sum(), x, create_graph=True)
        g.pow(2).sum().backward()
    ev = fa.audit.events
    second = ev[(ev["phase"] == "backward") & (ev["seq"] > ev.index[ev["op"] == "aten.pow.Tensor_Scalar"][0])]
    assert set(second.loc[second["op"] == "aten.mm.default", "module"]) == {"lin", "head"}
    assert set(second.loc[second["op"] == "aten.tanh_backward.default", "module"]) == {"act"}


def test_module_names_follow_torchs_module_tracker():
    from torch.utils.module_tracker import ModuleTracker

    from auditor._recording._modules import ForwardModuleTracker

    shared = nn.Conv2d(3, 3, 1)
    branch = nn.Sequential(shared, nn.ReLU())
    tied = nn.Sequential(nn.Conv2d(3, 3, 1), branch, nn.Sequential(shared))  # shared twice
    for model in (torchvision.models.resnet18(), tied):
        theirs, ours = ModuleTracker(), ForwardModuleTracker()
        first = branch if model is tied else model.layer1  # a submodule seen before its root
        for mod in (first, model):
            theirs._get_mod_name(mod)
            ours._fw_pre_hook(mod, ())
        for mod in model.modules():
            assert ours._labels[id(mod)][1] == (theirs._get_mod_name(mod), ""), mod


def test_wrapper_modules_do_not_prefix_names():
    from auditor._recording._modules import module_names

    names = module_names(
        ["Global", "DistributedDataParallel", "DistributedDataParallel.module",
         "DistributedDataParallel.module.conv1", "CrossEntropyLoss"],
        {"DistributedDataParallel": "DistributedDataParallel",
         "DistributedDataParallel.module": "Net", "DistributedDataParallel.module.conv1": "Conv2d"},
    )
    assert names["DistributedDataParallel.module.conv1"] == ("conv1", "Conv2d")
    assert names["DistributedDataParallel.module"] == ("<root>", "Net")
    assert names["DistributedDataParallel"] == ("<root>", "DistributedDataParallel")
    assert names["CrossEntropyLoss"][0] == "CrossEntropyLoss"
    assert names["Global"] == ("<global>", "")


class Kitchen(nn.Module):
    """In-place ops, views, factories, tensor lists and multi-output ops in one forward."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)

    def forward(self, x):
        y = self.bn(self.conv(x))
        y.relu_()
        z = torch.zeros_like(y)
        s = torch.stack([y, z])
        c = torch.cat([y, z, y], dim=1)
        return s.sum() + c.permute(0, 2, 3, 1).view(c.shape[0], -1).t().sum()


def test_records_inplace_views_factories_lists_and_multi_output():
    torch.manual_seed(0)
    model = Kitchen().to(memory_format=CL)
    x = torch.randn(2, 3, 6, 6).to(memory_format=CL)
    a = auditor.audit(model, x)
    ev, ts = a.events, a.tensors
    ops = set(ev["op"].astype(str))
    for op in [
        "aten.relu_.default",
        "aten.zeros_like.default",
        "aten.stack.default",
        "aten.cat.default",
        "aten.view.default",
        "aten.t.default",
        "aten.native_batch_norm.default",
        "aten.convolution_backward.default",
        "aten.native_batch_norm_backward.default",
    ]:
        assert op in ops, op
    # in-place: the output is the same tensor as the input
    relu = ev.index[ev["op"] == "aten.relu_.default"][0]
    rows = ts[ts["seq"] == relu]
    assert rows["tid"].nunique() == 1 and len(rows) == 2
    assert not rows["is_view"].any()
    # views are flagged on their outputs
    view = ev.index[ev["op"] == "aten.view.default"][0]
    assert ts[(ts["seq"] == view) & (ts["role"] == "output")]["is_view"].all()
    # tensor lists: every item recorded with its index
    cat = ts[(ts["seq"] == ev.index[ev["op"] == "aten.cat.default"][0]) & (ts["role"] == "input")]
    assert cat["item"].tolist() == [0, 1, 2] and set(cat["arg"]) == {"tensors"}
    assert cat["tid"].iloc[0] == cat["tid"].iloc[2]
    # several outputs
    bn = ts[(ts["seq"] == ev.index[ev["op"] == "aten.native_batch_norm.default"][0]) & (ts["role"] == "output")]
    assert bn["position"].tolist() == [0, 1, 2]
    cb = ev.index[ev["op"] == "aten.convolution_backward.default"][0]
    assert (ts[(ts["seq"] == cb) & (ts["role"] == "output")]["position"] >= 1).any()


def test_data_follows_tensor_identity():
    model, x = make("clean")
    a = auditor.audit(model, x, backward=False)
    ev, ts = a.events, a.tensors
    conv1 = ev.index[ev["op"] == "aten.convolution.default"][0]
    out = ts[(ts["seq"] == conv1) & (ts["role"] == "output")]["tid"].iloc[0]
    relu = ev.index[ev["op"] == "aten.relu.default"][0]
    assert ts[(ts["seq"] == relu) & (ts["role"] == "input")]["tid"].iloc[0] == out
    assert ts[(ts["seq"] == conv1) & (ts["role"] == "input") & (ts["arg"] == "input")]["format"].iloc[0] == "channels_last"


def test_identity_survives_id_reuse():
    ids = []
    with auditor.FormatAuditor() as fa:
        for i in range(200):
            t = torch.full((3,), float(i))
            ids.append(id(t))
            del t  # freed at once (reference counting): its id() is free for the next tensor
    assert len(set(ids)) < len(ids), "CPython did not reuse an id; the test proves nothing"
    ts = fa.audit.tensors
    full = fa.audit.events.index[fa.audit.events["op"] == "aten.full.default"]
    assert len(full) == 200
    assert ts[ts["seq"].isin(full)]["tid"].nunique() == 200


def test_optimizer_steps_are_phase_other():
    model, x = make("clean")
    opt = torch.optim.Adam(model.parameters())
    with auditor.FormatAuditor() as fa:
        train_step(model, x, opt)
    ev = fa.audit.events
    other = ev[ev["phase"] == "other"]
    assert len(other) > 0
    assert other["seq"].min() > ev[ev["phase"] == "backward"]["seq"].max()
    assert (other["module"] == "<global>").all()


def test_source_lines_forward_and_backward():
    model, x = make("explicit_contiguous")
    a = auditor.audit(model, x, record_source=True)
    ev = a.events
    clone = ev[ev["op"] == "aten.clone.default"].iloc[0]
    assert clone["source"].endswith("planted.py:" + str(_line_of("y.contiguous()  # planted: an explicit")))
    conv_fw = ev[(ev["op"] == "aten.convolution.default") & (ev["module"] == "conv2")].iloc[0]
    conv_bw = ev[(ev["op"] == "aten.convolution_backward.default") & (ev["module"] == "conv2")].iloc[0]
    assert conv_fw["source"] and conv_bw["source"] == conv_fw["source"]
    assert "torch" not in conv_fw["source"].split(":")[0].split("/")[-3:-1]
    # on by default in audit() (causes name their line), off when asked and in a plain FormatAuditor
    default = auditor.audit(model, x).events
    forward = default[default["phase"] == "forward"]
    in_model = forward["module"] != "<global>"
    assert in_model.any() and (forward.loc[in_model, "source"] != "").all()
    # the loss the audit's step takes of the outputs runs in the auditor: no line of the user's
    assert (~in_model).any() and (forward.loc[~in_model, "source"] == "").all()
    assert (auditor.audit(model, x, record_source=False).events["source"] == "").all()
    with auditor.FormatAuditor() as fa:
        model(x)
    assert (fa.audit.events["source"] == "").all()


def test_ops_that_only_torchs_modules_run_have_no_source_line():
    """An nn.Sequential of torch's layers runs no line of the user's: the first frame outside
    torch is the auditor's step, and the lines above it are the call of the audit (here this
    file; in a notebook its cell, on the command line its own script), which is not where the op
    is. A model whose own forward runs the layers keeps that forward's line."""
    torch.manual_seed(0)
    seq = nn.Sequential(nn.Conv2d(3, 8, 3), nn.Softmax(dim=1), nn.Conv2d(8, 4, 1))
    x = torch.randn(2, 3, 8, 8)
    ev = auditor.audit(seq, x, record_source=True).events
    assert not ev["source"].str.contains("test_recorder.py").any()
    assert (ev.loc[ev["phase"] == "forward", "source"] == "").all()
    model, x = make("explicit_contiguous")
    ev = auditor.audit(model, x, record_source=True).events
    forward = ev[(ev["phase"] == "forward") & (ev["module"] != "<global>")]
    assert len(forward) and forward["source"].str.contains("planted.py").all()


def _line_of(text: str) -> int:
    import planted

    with open(planted.__file__) as f:
        for number, line in enumerate(f, start=1):
            if text in line:
                return number
    raise AssertionError(text)


def test_record_time():
    model, x = make("clean")
    a = auditor.audit(model, x)  # timed by default
    assert a.events["duration_us"].notna().all()
    assert (a.events["duration_us"] >= 0).all()
    assert auditor.audit(model, x, record_time=False).events["duration_us"].isna().all()


@pytest.mark.parametrize("options", [{}, {"record_source": True, "record_time": True}])
def test_csv_round_trip_is_exact(tmp_path, options):
    model, x = tv("resnet18")
    a = auditor.audit(model, x, **options)
    path = tmp_path / "audit.csv"
    a.to_csv(path)
    b = auditor.Audit.read_csv(path)
    assert_frame_equal(a.events, b.events)
    assert_frame_equal(a.tensors, b.tensors)
    assert b.complete
    # and through a buffer
    buf = io.StringIO()
    a.to_csv(buf)
    buf.seek(0)
    assert_frame_equal(auditor.Audit.read_csv(buf).tensors, a.tensors)


def test_csv_keeps_tensorless_events_and_incomplete_flag(tmp_path):
    def boom():
        torch.ops.profiler._record_function_enter_new("x", None)  # an op without tensors
        torch.ones(2) + 1
        raise KeyError("stop")

    fa = auditor.FormatAuditor()
    with pytest.raises(KeyError), fa:
        boom()
    a = fa.audit
    assert not a.complete
    path = tmp_path / "a.csv"
    a.to_csv(path)
    b = auditor.Audit.read_csv(path)
    assert not b.complete
    assert_frame_equal(a.events, b.events)
    assert_frame_equal(a.tensors, b.tensors)


def test_read_csv_names_a_missing_column(tmp_path):
    model, x = make("clean")
    path = tmp_path / "a.csv"
    auditor.audit(model, x).to_csv(path)
    df = pd.read_csv(path, keep_default_na=False).rename(columns={"strides": "stride"})
    df.to_csv(path, index=False)
    with pytest.raises(ValueError, match="'strides'"):
        auditor.Audit.read_csv(path)


def test_read_csv_rejects_values_outside_the_schema(tmp_path):
    model, x = make("clean")
    path = tmp_path / "a.csv"
    auditor.audit(model, x).to_csv(path)
    df = pd.read_csv(path, keep_default_na=False, dtype=str)
    row = df.index[df["record"] == "tensor"][0]
    df.loc[row, "phase"] = "sideways"
    df.to_csv(path, index=False)
    with pytest.raises(ValueError, match="'phase'.*'sideways'"):
        auditor.Audit.read_csv(path)
    df.loc[row, "phase"] = "forward"
    df.loc[row, "tid"] = "x"
    df.to_csv(path, index=False)
    with pytest.raises(ValueError, match="'tid'"):
        auditor.Audit.read_csv(path)


def test_strict_raises_at_a_loss_with_op_module_and_strides():
    model, x = make("softmax")
    with pytest.raises(auditor.FormatLossError) as info:
        auditor.audit(model, x, strict=True)
    msg = str(info.value)
    assert "aten._softmax.default" in msg and "'mid'" in msg and "(forward)" in msg
    assert "self: shape (2, 8, 8, 8) strides (512, 1, 64, 8) (channels_last)" in msg


def test_strict_raises_in_backward_too():
    model, x = make("bicubic")
    with pytest.raises(auditor.FormatLossError, match=r"upsample_bicubic2d_backward.*\(backward\)"):
        auditor.audit(model, x, strict=True)


@pytest.mark.parametrize(
    "name", ["clean", "gate", "explicit_contiguous", "reshape_copy", "user_restore", "mixed_cat"]
)
def test_strict_is_silent_where_nothing_is_lost(name):
    model, x = make(name)
    auditor.audit(model, x, strict=True)  # views, N1HW gates and asked-for copies never raise


@pytest.mark.parametrize("name", ["softmax", "bicubic"])
def test_strict_agrees_with_the_analyzer(name):
    model, x = make(name)
    ops = auditor.audit(model, x).ops()
    first_loss = ops.index[ops["kind"] == "loses"][0]
    model.zero_grad(set_to_none=True)  # as the audit's recorded step found them (its warm-up gives them back)
    fa = auditor.FormatAuditor(strict=True)
    with pytest.raises(auditor.FormatLossError), fa:
        train_step(model, x)
    partial = fa.audit
    assert not partial.complete
    assert len(partial.events) == first_loss + 1
    assert partial.ops()["kind"].iloc[-1] == "loses"


def _step_results(model, x, ctx):
    model.zero_grad(set_to_none=True)
    x = x.detach().requires_grad_(True)
    torch.manual_seed(1)  # same dropout masks in every run
    with ctx:
        out = model(x)
        out.sum().backward()
    return [out.detach()] + [p.grad for p in model.parameters()] + [x.grad]


def _bitwise_equal(a, b):
    return all(torch.equal(u, v) for u, v in zip(a, b, strict=True))


@pytest.mark.slow
@pytest.mark.parametrize("name, size", [("resnet18", 32), ("mobilenet_v2", 64), ("densenet121", 32)])
def test_audit_is_bitwise_transparent(name, size):
    model, x = tv(name, size=size)
    plain = _step_results(model, x, contextlib.nullcontext())
    audited = _step_results(model, x, auditor.FormatAuditor())
    assert _bitwise_equal(plain, audited)


@pytest.mark.slow
def test_where_any_python_mode_changes_the_last_bits_the_auditor_adds_nothing():
    """Under any dispatch mode the autograd engine sums gradients out of place
    (README, "What a Python mode changes"). mobilenet_v2 at 32x32 reaches 1x1 feature maps,
    where the out-of-place sum of two NC11 gradients gets other (equally valid) strides, batch
    norm backward takes its other layout path and rounds differently. The auditor must match
    the bare mode bit for bit."""
    model, x = tv("mobilenet_v2", size=32)
    plain = _step_results(model, x, contextlib.nullcontext())
    bare = _step_results(model, x, CountingMode())
    audited = _step_results(model, x, auditor.FormatAuditor())
    assert torch.equal(plain[0], audited[0])  # outputs are identical
    assert not _bitwise_equal(plain, bare), "torch changed: update the README and this test"
    assert _bitwise_equal(bare, audited)
    # rounding of large sums that cancel: small against the largest gradient, not elementwise
    scale = max(float(u.abs().max()) for u in plain)
    assert max(float((u - v).abs().max()) for u, v in zip(plain, audited)) < 1e-5 * scale


def test_exception_leaves_nothing_behind():
    pre_hooks = dict(torch.nn.modules.module._global_forward_pre_hooks)
    fwd_hooks = dict(torch.nn.modules.module._global_forward_hooks)
    from torch.optim import optimizer as optim_mod

    opt_hooks = dict(optim_mod._global_optimizer_pre_hooks)

    class Broken(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 4, 3)

        def forward(self, x):
            self.conv(x)
            raise ValueError("broken model")

    fa = auditor.FormatAuditor()
    with pytest.raises(ValueError, match="broken model"), fa:
        Broken()(torch.randn(1, 3, 8, 8))
    assert _get_current_dispatch_mode() is None
    assert dict(torch.nn.modules.module._global_forward_pre_hooks) == pre_hooks
    assert dict(torch.nn.modules.module._global_forward_hooks) == fwd_hooks
    assert dict(optim_mod._global_optimizer_pre_hooks) == opt_hooks
    a = fa.audit
    assert not a.complete and "ValueError: broken model" in a.error
    assert "aten.convolution.default" in set(a.events["op"])
    assert "INCOMPLETE" in a.report()
    # and the mode is really gone: a later op is not recorded anywhere
    torch.ones(1) + 1
    assert len(fa.audit.events) == len(a.events)


def test_nested_inside_profiler_and_around_flop_counter():
    from torch.utils.flop_counter import FlopCounterMode

    model, x = tv("resnet18")
    counter = CountingMode()
    model.zero_grad(set_to_none=True)  # each step a first backward (some releases detach twice in it)
    with counter:
        train_step(model, x)
    model.zero_grad(set_to_none=True)
    with torch.profiler.profile(record_shapes=True) as prof:
        with auditor.FormatAuditor() as fa:
            train_step(model, x)
    assert len(fa.audit.events) == len(counter.ops)
    assert any(e.key == "aten::convolution" for e in prof.key_averages())

    flops_plain = FlopCounterMode(display=False)
    with flops_plain:
        train_step(model, x)
    flops_inner = FlopCounterMode(display=False)
    model.zero_grad(set_to_none=True)
    with auditor.FormatAuditor() as fa2:
        with flops_inner:
            train_step(model, x)
    assert flops_inner.get_total_flops() == flops_plain.get_total_flops() > 0
    # what a mode under the flop counter sees (some releases' counter decomposes ops on the way)
    under_flops = CountingMode()
    model.zero_grad(set_to_none=True)
    with under_flops, FlopCounterMode(display=False):
        train_step(model, x)
    assert len(fa2.audit.events) == len(under_flops.ops)


def test_audit_rejects_bad_input():
    with pytest.raises(TypeError, match="callable"):
        auditor.audit("resnet50", torch.randn(1))
    conv = nn.Conv2d(3, 3, 1).requires_grad_(False)
    with pytest.raises(ValueError, match="requires grad"):
        auditor.audit(conv, torch.randn(1, 3, 4, 4))
    fa = auditor.FormatAuditor()
    with pytest.raises(RuntimeError, match="with"):
        _ = fa.audit


def test_results_that_keep_their_inputs_layout_are_logged_as_if_read(monkeypatch):
    """detach, alias and in-place pointwise results reuse argument 0's layout number instead
    of reading their own sizes and strides: the log must be the same as when they are read."""
    from auditor._recording import _mode as recorder

    model, x = tv("resnet18")
    kept = auditor.audit(model, x, record_source=False, record_time=False)
    ops = set(kept.events["op"].astype(str))
    assert {"aten.detach.default", "aten.relu_.default", "aten.add_.Tensor"} <= ops
    monkeypatch.setattr(recorder, "_OP_INFO", {})
    original = recorder._op_info

    def never_kept(func):
        info = dataclasses.replace(original(func), keeps_layout=False)
        recorder._OP_INFO[id(func)] = info
        return info

    monkeypatch.setattr(recorder, "_op_info", never_kept)
    model.zero_grad(set_to_none=True)
    read = auditor.audit(model, x, record_source=False, record_time=False)
    assert all(not i.keeps_layout for i in recorder._OP_INFO.values())
    assert_frame_equal(kept.tensors, read.tensors)
    assert_frame_equal(kept.events.drop(columns="duration_us"), read.events.drop(columns="duration_us"))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(-3, 40), max_size=60), st.lists(st.integers(0, 40), max_size=8))
def test_the_logs_hashing_helpers_match_numpys_sorting_definitions(keys, members):
    """The event log numbers tensors, ops and labels by first appearance with pd.factorize, and
    tests membership with lookup tables: the same answers as np.unique's and np.isin's."""
    import numpy as np

    from auditor._recording._log import _first_seen, _member

    ids = np.array(keys, dtype=np.int64)
    first, codes = _first_seen(ids)
    if len(ids):
        _, ref_first, inverse = np.unique(ids, return_index=True, return_inverse=True)
        order = np.argsort(ref_first)
        rank = np.empty_like(order)
        rank[order] = np.arange(len(order))
        assert first.tolist() == ref_first[order].tolist()
        assert codes.tolist() == rank[inverse.ravel()].tolist()
    else:
        assert len(first) == len(codes) == 0
    values = np.array([k for k in keys if k >= 0], dtype=np.int64)
    size = int(max([*values.tolist(), *members, 0])) + 1
    assert _member(values, members, size).tolist() == np.isin(values, members).tolist()


def test_event_log_is_the_same_whether_its_categorical_dtypes_are_new_or_reused():
    """Categorical dtypes are made once per distinct vocabulary and reused by later recordings:
    a recording that makes them and one that reuses them log the same frames."""
    from auditor._recording import _log as log

    model, x = tv("resnet18")
    log._DTYPES.clear()
    cold = auditor.audit(model, x, record_source=False, record_time=False)
    made = dict(log._DTYPES)
    assert made  # the first recording made them
    model.zero_grad(set_to_none=True)
    warm = auditor.audit(model, x, record_source=False, record_time=False)
    # reused, not remade: the cache holds the same objects (pandas < 2.1 copies a dtype into each
    # column, so the columns' dtypes are equal there, not the same object)
    assert log._DTYPES.keys() == made.keys()
    assert all(log._DTYPES[key] is dtype for key, dtype in made.items())
    assert_frame_equal(cold.tensors, warm.tensors)
    assert_frame_equal(cold.events.drop(columns="duration_us"), warm.events.drop(columns="duration_us"))
    for frame in (warm.events, warm.tensors):
        for name in frame.columns:
            if name in log.FIXED_CATEGORIES or not isinstance(frame[name].dtype, pd.CategoricalDtype):
                continue
            categories = list(frame[name].cat.categories)
            assert categories == sorted(set(categories)), name


def test_compiled_functions_run_inside_a_recording():
    """The mode clears Dynamo's frame hook itself rather than through torch's per-op wrapper:
    compiled code called inside the block must still run, be recorded, and compile after."""

    def f(x):
        return torch.relu(x) * 2 + 1

    compiled = torch.compile(f, backend="eager")
    x = torch.randn(2, 3, 4, 4).to(memory_format=CL)
    with warnings.catch_warnings(record=True) as caught, auditor.FormatAuditor() as fa:
        warnings.simplefilter("always")
        y = compiled(x)
    # the only word about Dynamo is the auditor's own: the ops ran eagerly
    about = [str(w.message) for w in caught if "Dynamo" in str(w.message) or "compile" in str(w.message)]
    assert len(about) == 1 and about[0].startswith("auditor: 3 recorded ops ran inside torch.compile'd code"), about
    assert fa.audit.events["compiled"].all()
    assert torch.equal(y, f(x))
    assert fa.audit.events["op"].astype(str).tolist() == ["aten.relu.default", "aten.mul.Tensor", "aten.add.Tensor"]
    assert torch.equal(compiled(x), f(x))  # and outside it


def test_dynamo_skip_mark_reports_failure_instead_of_raising():
    from auditor._recording import _mode as recorder

    assert recorder._SKIPPED_BY_DYNAMO  # torch 2.14: the mark is set, no per-op wrapper
    assert not recorder._skip_in_dynamo(object())  # not a code object: the wrapper would stay


def test_an_error_reading_an_op_is_raised_as_it_is(monkeypatch):
    """The recorder's own failure reaches the user unchanged, even while a compiled function
    runs (when the dispatch gives Dynamo's frame hook back on the way out)."""
    from auditor._recording import _mode

    def broken(func):
        raise RuntimeError(f"cannot read {func}")

    monkeypatch.setattr(_mode, "_OP_INFO", {})
    monkeypatch.setattr(_mode, "_op_info", broken)
    monkeypatch.setattr(_mode, "_set_eval_frame", lambda hook: "compiled frame hook" if hook is None else None)
    with pytest.raises(RuntimeError, match="cannot read aten"):
        with auditor.FormatAuditor(record_source=False, record_time=False):
            torch.ones(2) + 1
