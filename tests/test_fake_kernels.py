"""Fake audits that log what the target's kernels write (auditor/_recording/_kernels.py): on CPU
asked of the real kernels (auditor/_recording/_probe.py) and checked against real CPU audits over
the op corpus; on CUDA the table of known kernels, entry by entry."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import auditor
import auditor._fake as fake_module
from auditor._recording import _kernels
from auditor._recording._kernels import CORRECTIONS, Correction, corrections_for
from auditor._recording._probe import KernelProbe, Like, all_channels_last
from auditor._recording._torch import _release
from tests.kernels import needs_fake_cuda
from tests.op_corpus import OPS, case, disagreement

CL3 = torch.channels_last_3d


def _audits(name: str, **fake_options):
    model, x = case(name)
    real = auditor.audit(model, x, record_time=False)
    model, x = case(name)  # a fresh model: the real step left gradients on the first
    return real, auditor.audit(model, x, fake=True, device="cpu", **fake_options)


@pytest.mark.parametrize("name", sorted(OPS))
def test_op_corpus_fake_cpu_audit_matches_the_real_one(name):
    real, fake = _audits(name)
    assert disagreement(real, fake) == []


def _only(entries):
    return lambda device_type, version=None: tuple(c for c in entries if c.device == device_type)


def _meta_only(monkeypatch):
    """Fake CPU audits with the meta kernels' strides, the real kernels not asked."""
    monkeypatch.setattr(_kernels, "restrider_for", lambda device_type: _kernels.Restrider())
    monkeypatch.setattr(fake_module, "restrider_for", lambda device_type: _kernels.Restrider())


#: cases whose fake audit disagrees with the real one when the real kernels are not asked, on
#: torch 2.14.1's CPU (the meta rules write contiguous where the CPU kernels keep channels_last)
MET_ON_2_14 = {"group_norm", "pad_reflect", "pad_replicate", "roll_h", "roll_w", "roll_hw", "channel_shuffle_op"}


def test_the_probe_is_what_makes_them_agree(monkeypatch):
    """Without asking the real kernels, fake and real CPU audits disagree on this torch: the
    agreement above is the probe's work, not the meta kernels'. Every case that disagrees then
    is one the probe made agree, and channel_shuffle (one aten op with a meta rule that writes
    contiguous) is among them, forward and backward."""
    _meta_only(monkeypatch)
    differ = {name: disagreement(*_audits(name)) for name in sorted(OPS)}
    differ = {name: lines for name, lines in differ.items() if lines}
    assert "channel_shuffle_op" in differ
    phases = {line.split(":", 1)[0] for line in differ["channel_shuffle_op"]}
    assert phases == {"forward", "backward"}, differ["channel_shuffle_op"]
    if _release(torch.__version__) == (2, 14):
        assert set(differ) == MET_ON_2_14, sorted(differ)


def test_channel_shuffle_keeps_channels_last_in_a_fake_cpu_audit():
    """F.channel_shuffle on a 2x8x6x6 channels_last map: the real CPU kernel's strides, which the
    fake audit logs, forward and backward (the gradient it sends back)."""
    x = torch.randn(2, 8, 6, 6).to(memory_format=torch.channels_last).requires_grad_()
    y = F.channel_shuffle(x, 2)
    (g,) = torch.autograd.grad(y, x, 2 * y)  # the gradient of (y * y).sum(): channels_last
    fake = auditor.audit(lambda t: F.channel_shuffle(t, 2), x, fake=True, device="cpu",
                         loss_fn=lambda y: (y * y).sum())
    out = fake.tensors[fake.tensors["role"] == "output"]
    ev = fake.events
    seqs = ev.loc[ev["op"].astype(str) == "aten.channel_shuffle.default", "seq"]
    strides = {s: out.loc[out["seq"] == s, "strides"].astype(str).tolist() for s in seqs}
    assert str(y.stride()) in [v[0] for v in strides.values()], strides
    assert len(seqs) == 2  # forward, and its backward (a channel_shuffle of the gradient)
    assert [v[0] for v in strides.values()] == [str(y.stride()), str(g.stride())]
    assert g.stride() == y.stride() == (288, 1, 48, 8)


def test_the_probe_asks_each_signature_once():
    """The answer is cached per (overload, signature): a second audit of the same step asks
    nothing new, and the answers are the kernel's strides for those very arguments."""
    probe = _kernels.SHARED_PROBE
    model, x = case("channel_shuffle_op")
    auditor.audit(model, x, fake=True, device="cpu")
    asked = probe.asked
    model, x = case("channel_shuffle_op")
    auditor.audit(model, x, fake=True, device="cpu")
    assert probe.asked == asked
    fresh = KernelProbe()
    y = torch.randn(2, 8, 6, 6).to(memory_format=torch.channels_last)
    (got,) = fresh.results(torch.ops.aten.channel_shuffle.default, (y, 2))
    assert got.stride == F.channel_shuffle(y, 2).stride() == (288, 1, 48, 8)
    fresh.results(torch.ops.aten.channel_shuffle.default, (y.clone(), 2))
    assert fresh.asked == 1
    fresh.results(torch.ops.aten.channel_shuffle.default, (y.contiguous(), 2))
    assert fresh.asked == 2


def test_a_large_op_is_asked_at_a_cut_batch(monkeypatch):
    """Over the byte limit the batch is cut to two (group_norm's N with it) and the results'
    order of dimensions is laid over the full sizes: the full batch's real strides."""
    from auditor._recording import _probe

    monkeypatch.setattr(_probe, "EXACT_BYTES", 0)
    gn = torch.ops.aten.native_group_norm.default
    for func, args in [(torch.ops.aten.channel_shuffle.default,
                        (torch.randn(64, 8, 6, 6).to(memory_format=torch.channels_last), 2)),
                       (gn, (torch.randn(64, 8, 5, 5).to(memory_format=torch.channels_last), torch.ones(8),
                             torch.zeros(8), 64, 8, 25, 2, 1e-5)),
                       (torch.ops.aten.add.Tensor, (torch.randn(64, 8, 5, 5).to(memory_format=torch.channels_last),
                                                    torch.randn(64, 8, 1, 1)))]:
        real = func(*args)
        real = real if isinstance(real, tuple) else (real,)
        probe = KernelProbe()
        got = probe.results(func, args, out_shapes=[tuple(r.shape) for r in real])
        assert [g.stride for g in got] == [r.stride() for r in real], func


def test_keeps_channels_last_answers_from_layouts_alone():
    """The analysis's question, asked with layouts from a log (no tensors): does the op keep
    channels_last when its image inputs are channels_last, on this machine."""
    probe = KernelProbe()
    cl = Like((2, 8, 6, 6), (288, 1, 48, 8), torch.float32)
    for func, args in [(torch.ops.aten.channel_shuffle.default, (cl, 2)),
                       (torch.ops.aten.relu.default, (cl,)),
                       (torch.ops.aten.native_group_norm.default,
                        (cl, Like((8,), (1,), torch.float32), Like((8,), (1,), torch.float32), 2, 8, 36, 2, 1e-5))]:
        real = func(*[torch.randn(a.shape).as_strided(a.shape, a.stride) if isinstance(a, Like) else a for a in args])
        real = real[0] if isinstance(real, tuple) else real
        assert probe.keeps_channels_last(func, args) == real.is_contiguous(memory_format=torch.channels_last), func
    assert probe.keeps_channels_last(torch.ops.aten.mean.dim, (cl, [2, 3])) is None
    # a join of mixed formats: asked with every image input channels_last, the op keeps it
    mixed = (torch.empty(2, 8, 6, 6).to(memory_format=torch.channels_last), torch.empty(2, 8, 6, 6))
    cat = torch.ops.aten.cat.default
    assert probe.keeps_channels_last(cat, ([*mixed], 1)) is cat(list(mixed), 1).is_contiguous(
        memory_format=torch.channels_last)
    assert probe.keeps_channels_last(cat, all_channels_last([[*mixed], 1])) is True


def test_views_and_in_place_ops_are_never_asked():
    """A view's strides follow its input's and an in-place op writes its argument: only ops
    that write new tensors are asked."""
    x = torch.empty(2, 8, 6, 6).to(memory_format=torch.channels_last)
    assert not _kernels.worth_asking(torch.ops.aten.permute.default, (x, [0, 2, 3, 1]))
    assert not _kernels.worth_asking(torch.ops.aten.add_.Tensor, (x, x))
    assert _kernels.worth_asking(torch.ops.aten.add.Tensor, (x, x))
    assert not _kernels.worth_asking(torch.ops.aten.add.Tensor, (x.contiguous(), x.contiguous()))
    assert _kernels.worth_asking(torch.ops.aten.cat.default, ([x, x], 1))


def test_entries_are_gated_by_release():
    c = Correction("x", "cuda", (), "contiguous", "test", since="2.9", until="2.15")
    assert not c.holds_for("2.8.0") and c.holds_for("2.9.1+cu128") and c.holds_for("2.14.1")
    assert not c.holds_for("2.15.0")
    assert all(c.source and c.writes for c in CORRECTIONS)


def test_entries_name_ops_never_models():
    for c in CORRECTIONS:
        assert c.ops and all(str(op).startswith("aten.") for op in c.ops), c.name


# -- CUDA entries, on fake cuda ------------------------------------------------------------------


class _Then(nn.Module):
    def __init__(self, op, dims=2, channels=4):
        super().__init__()
        conv = nn.Conv2d if dims == 2 else nn.Conv3d
        self.c = conv(channels, channels, 3, padding=1)
        self.op = op

    def forward(self, x):
        return self.op(self.c(x))


def _x(dims=2, dtype=torch.float32):
    shape = (2, 4, 8, 8) if dims == 2 else (2, 4, 4, 8, 8)
    return torch.randn(shape, dtype=dtype).to(memory_format=torch.channels_last if dims == 2 else CL3)


def _formats(model, x, entry: str | None, dtype=None):
    """op -> output formats in a fake cuda audit with only ``entry`` of the cuda table (None: none)."""
    entries = tuple(c for c in CORRECTIONS if c.name == entry)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(fake_module, "restrider_for", lambda device_type: _kernels.Restrider(_only(entries)(device_type)))
        a = auditor.audit(model, x, fake=True, device="cuda", dtype=dtype)
    out = {}
    for op, fmt in zip(a.events["op"].astype(str), a.events["out_format"].astype(str)):
        out.setdefault(op, []).append(fmt)
    return out


CUDA_CASES = {
    # entry: (model, input, op to look at, format the entry makes it write)
    "group_norm_cuda": (lambda: _Then(nn.GroupNorm(2, 4)), 2, "aten.native_group_norm_backward.default", "contiguous"),
    "grid_sample_cuda": (lambda: _Then(lambda x: F.grid_sample(x, torch.zeros(2, 8, 8, 2, device=x.device), align_corners=False)), 2,
                         "aten.grid_sampler_2d.default", "contiguous"),
    "grid_sample_backward_cuda": (lambda: _Then(lambda x: F.grid_sample(x, torch.zeros(2, 8, 8, 2, device=x.device), align_corners=False)),
                                  2, "aten.grid_sampler_2d_backward.default", "contiguous"),
    "adaptive_max_pool2d_cuda": (lambda: _Then(lambda x: F.adaptive_max_pool2d(x, 3)), 2,
                                 "aten.adaptive_max_pool2d.default", "channels_last"),
    "pools_3d_cuda": (lambda: _Then(lambda x: F.max_pool3d(x, 2), dims=3), 3,
                      "aten.max_pool3d_with_indices.default", "contiguous"),
    "instance_norm_cuda": (lambda: _Then(nn.InstanceNorm2d(4)), 2, "aten.clone.default", "contiguous"),
    "conv_float64_cuda": (lambda: _Then(nn.Identity()), 2, "aten.convolution.default", "contiguous"),
    "conv3d_cuda": (lambda: _Then(nn.Identity(), dims=3), 3, "aten.convolution.default", None),
}


def test_every_cuda_entry_has_a_case():
    assert set(CUDA_CASES) | {"group_norm_cuda_unknown"} == {c.name for c in CORRECTIONS if c.device == "cuda"}


def test_group_norm_on_cuda_is_contiguous_through_2_14_and_unknown_after():
    """#191945 adds NHWC GroupNorm on CUDA in a release not known here: up to 2.14 (whose CUDA
    library has no NHWC group-norm kernel) the table says contiguous, from 2.15 it says it
    cannot know."""
    def names(version):
        return {c.name: c.writes for c in corrections_for("cuda", version) if "group_norm" in c.name}
    assert names("2.8.0") == {"group_norm_cuda": "contiguous"}
    assert names("2.14.1+cu130") == {"group_norm_cuda": "contiguous"}
    assert names("2.15.0") == {"group_norm_cuda_unknown": "unknown"}


@needs_fake_cuda
@pytest.mark.parametrize("entry", sorted(CUDA_CASES))
def test_each_cuda_entry_writes_what_its_source_says(entry):
    make, dims, op, writes = CUDA_CASES[entry]
    dtype = torch.float64 if entry == "conv_float64_cuda" else None
    torch.manual_seed(0)
    model = make()
    x = _x(dims)
    if dims == 3:
        model = model.to(memory_format=CL3)
    if writes is None:  # conv3d: what the local build's cuDNN gives
        writes = {"channels_last": "channels_last_3d"}.get(
            _kernels._conv3d_cuda_writes((x, model.c.weight), {}), "contiguous")
    elif dims == 3 and writes == "channels_last":
        writes = "channels_last_3d"
    got = _formats(model, x, entry, dtype)
    assert op in got, sorted(got)
    assert set(got[op]) == {writes}, (got[op], _formats(model, x, None, dtype).get(op))


def test_conv3d_on_cuda_follows_the_cudnn_version():
    x = torch.empty(1, 4, 4, 4, 4, dtype=torch.float16).to(memory_format=CL3)
    w3 = torch.empty(4, 4, 3, 3, 3, dtype=torch.float16).to(memory_format=CL3)
    w1 = torch.empty(4, 4, 1, 1, 1, dtype=torch.float16).to(memory_format=CL3)
    writes = _kernels._conv3d_cuda_writes
    assert writes((x, w3), {}, cudnn=8004) == "contiguous"
    assert writes((x, w3), {}, cudnn=90100) == "channels_last"
    assert writes((x, w3), {}, cudnn=91500) == "channels_last"
    if _release(torch.__version__) >= (2, 9):
        assert writes((x, w3), {}, cudnn=90800) == "contiguous"  # #163581
        assert writes((x, w1), {}, cudnn=90800) == "channels_last"
    assert writes((x.float(), w3.float()), {}, cudnn=90800) == "channels_last"


@needs_fake_cuda
def test_an_unknown_cudnn_is_said_not_guessed(monkeypatch):
    monkeypatch.setattr(_kernels, "_cudnn_version", lambda: None)
    model = _Then(nn.Identity(), dims=3).to(memory_format=CL3)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        auditor.audit(model, _x(3), fake=True, device="cuda")
    assert any("conv3d_cuda" in str(w.message) and "cannot be known" in str(w.message) for w in seen)


def test_a_probe_that_cannot_run_leaves_the_meta_format_and_warns(monkeypatch):
    def refuse(func, args, kwargs=None):
        raise RuntimeError("no")
    monkeypatch.setattr(_kernels.SHARED_PROBE, "results", refuse)
    model, x = case("group_norm")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        a = auditor.audit(model, x, fake=True, device="cpu")
    assert any("could not be asked" in str(w.message) for w in seen)
    assert a.complete


@needs_fake_cuda
def test_a_fake_cuda_audit_names_the_ops_it_could_not_check():
    """No GPU here: the table's ops are laid out by it, and every other op the CPU audit would
    have asked is listed as not checked, in Audit.kernels and in the report's head."""
    model = _Then(nn.GroupNorm(2, 4))
    a = auditor.audit(model, _x(), fake=True, device="cuda")
    checked = dict(zip(a.kernels["op"], a.kernels["checked"]))
    assert checked["aten.native_group_norm.default"] == "table"
    assert checked["aten.convolution.default"] == "not checked"
    assert "kernel" not in checked.values()
    head = a.report().split("Hotspots:")[0]
    assert "not checked" in head and "aten.convolution.default" in head, head


def test_a_fake_cpu_audit_says_it_asked_the_kernels():
    model, x = case("channel_shuffle_op")
    a = auditor.audit(model, x, fake=True, device="cpu")
    assert set(a.kernels["checked"]) == {"kernel"}
    assert a.kernels.set_index("op").at["aten.channel_shuffle.default", "relaid"] == 2
    assert "asked of this machine's kernels" in a.report()
    real = auditor.audit(*case("channel_shuffle_op"), record_time=False)
    assert real.kernels is None
