"""The correction table (auditor/_recording/_kernels.py): fake audits that log what the target's
kernels write, checked against real CPU runs over the op corpus, entry by entry."""

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


def test_every_disagreement_without_the_table_is_an_op_the_table_corrects(monkeypatch):
    """Without the table the fake audits differ from the real ones only in the ops of its CPU
    entries; a new disagreement (a new torch, a new corpus case) fails here until it has an entry."""
    monkeypatch.setattr(fake_module, "corrections_for", _only(()))
    corrected = {str(op) for c in corrections_for("cpu") for op in c.ops}
    uncorrected = []
    for name in sorted(OPS):
        for line in disagreement(*_audits(name)):
            op = line.split("('", 1)[1].split("'", 1)[0]
            if op not in corrected:
                uncorrected.append((name, line))
    assert uncorrected == []


#: CPU entry -> corpus cases whose ops it corrects
CPU_CASES = {"group_norm_cpu": ["group_norm"], "pad_cpu": ["pad_reflect", "pad_replicate"],
             "roll_cpu": ["roll_h", "roll_w", "roll_hw"]}


def test_every_cpu_entry_has_cases():
    assert set(CPU_CASES) == {c.name for c in CORRECTIONS if c.device == "cpu"}


@pytest.mark.parametrize("entry, name", [(e, n) for e, names in CPU_CASES.items() for n in names])
def test_each_cpu_entry_alone_makes_its_cases_agree(entry, name, monkeypatch):
    (c,) = [c for c in CORRECTIONS if c.name == entry]
    monkeypatch.setattr(fake_module, "corrections_for", _only((c,)))
    real, fake = _audits(name)
    assert disagreement(real, fake) == []
    assert {str(op) for op in c.ops} & set(fake.events["op"].astype(str)), "the case runs none of the entry's ops"


def test_the_probe_asks_the_real_kernel_on_a_shrunk_batch():
    """group_norm's probe rewrites N with the batch it shrinks, and answers what the real kernel
    writes for the full batch."""
    x = torch.randn(16, 8, 5, 5).to(memory_format=torch.channels_last)
    w, b = torch.ones(8), torch.zeros(8)
    real = torch.ops.aten.native_group_norm.default(x, w, b, 16, 8, 25, 2, 1e-5)
    assert _kernels.probe(torch.ops.aten.native_group_norm.default, (x, w, b, 16, 8, 25, 2, 1e-5), {})[0] == \
        _kernels._format_of(real[0])
    shrunk = _kernels._shrink_for(torch.ops.aten.native_group_norm.default, (x, w, b, 16, 8, 25, 2, 1e-5))
    assert shrunk[3] == 1 and shrunk[0][1] == (1, 8, 5, 5)


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
        mp.setattr(fake_module, "corrections_for", _only(entries))
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
    def refuse(func, args, kwargs):
        raise RuntimeError("no")
    monkeypatch.setattr(_kernels, "probe", refuse)
    model, x = case("group_norm")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        a = auditor.audit(model, x, fake=True, device="cpu")
    assert any("could not be asked" in str(w.message) for w in seen)
    assert a.complete
