"""One fast test per fix the engine declares (``auditor/_fix/_variants.py``): every generator of
``GENERATORS`` and every variant of ``VARIANTS``, each marked ``fix_variant("<its name>")``.

Each audits a small model written the way models write it (many are the recorded cases of
tests/test_joins.py, test_fix.py and test_replace.py), suggests its fixes, and checks three
things: the fix came from that generator (the candidate from that variant's detector), read off
the registry's own code while ``suggest_fixes`` runs (:func:`_traced`); the rewrite's text is
exact; and the model with the fix made in memory computes the same values and gradients
(a variant's candidate made as :meth:`Fixes.verify` makes it, when it proves it).

:func:`test_every_declared_fix_has_a_test_of_its_own` fails naming any declared fix without a
test here (or anywhere under tests/), and any mark that names no declared fix.
"""

from __future__ import annotations

import ast
import contextlib
import copy
import inspect
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import auditor
from auditor._analysis import _patterns as patterns
from auditor._display._text import short_source
from auditor._fix import _registry, _variants
from auditor._fix._changes import ConvertWeights, EditSource, KeepContiguous, SwapModules
from auditor._fix._proposal import Candidate, module_expr

pytest.importorskip("libcst")

# the recorded cases the other test files hold (each triggers the fix named where it is used)
from test_causes import OneContiguousWeight  # noqa: E402
from test_fix import Shuffle, TimeThenFrame, _at_audit_threads  # noqa: E402
from test_joins import (  # noqa: E402
    BadCandidate,
    CallsAHelper,
    CascadedHeads,
    Flow,
    FoldOverStatements,
    HeadsToMap,
    QueryPool,
    Windows,
)
from test_replace import _Correlation, _SpatialAttention  # noqa: E402

CL, CL3 = torch.channels_last, torch.channels_last_3d
TESTS = Path(__file__).resolve().parent
#: how a rewrite names the format of a weight in reach (``self.<path>.weight``)
FOLLOW = ("torch.channels_last if ((_w := {w}).stride(1) == 1 and (_w.shape[1] == 1 or _w.stride(-1) > 1)) "
          "else torch.contiguous_format")


@pytest.fixture(autouse=True)
def _seeded():
    torch.manual_seed(0)


# -- what made each fix: the registry's code, watched while suggest_fixes runs -----------------------


@dataclass
class Suggested:
    """A model audited in channels_last, its fixes, and which declared code made each: the
    generator that gave each cause's fix, the variant whose detector yielded each candidate."""

    model: nn.Module
    inputs: tuple[torch.Tensor, ...]
    fixes: auditor.Fixes
    made_by: dict[int, str] = field(default_factory=dict)  # cause -> generator
    yielded: list[tuple[str, Candidate]] = field(default_factory=list)  # (variant, candidate)

    def fixes_by(self, generator: str) -> list[int]:
        """The numbers of the fixes ``generator`` gave."""
        assert generator in {d.name for d in _variants.GENERATORS}
        return [int(r.fix) for r in self.fixes.frame.itertuples() if self.made_by.get(int(r.cause)) == generator]

    def the_fix_by(self, generator: str) -> int:
        found = self.fixes_by(generator)
        assert len(found) == 1, (generator, found, self.fixes.frame[["fix", "pattern", "line", "reason"]].to_string())
        return found[0]

    def candidates_of(self, variant: str) -> list[tuple[int, Candidate]]:
        """(fix, candidate) for each candidate of the fixes that ``variant``'s detector yielded."""
        assert variant in {d.name for d in _variants.VARIANTS}
        mine = [c for name, c in self.yielded if name == variant]
        return [(n, c) for n, p in self.fixes._proposals.items() for c in p.candidates if any(c is m for m in mine)]

    def variant_of(self, candidate: Candidate) -> str:
        return next(name for name, c in self.yielded if c is candidate)

    def row(self, n: int):
        return self.fixes.frame.set_index("fix").loc[n]


@contextlib.contextmanager
def _traced() -> Iterator[tuple[dict[int, str], list[tuple[str, Candidate]]]]:
    """Inside: each declared generator and variant detector runs as registered, and what it
    gave is recorded by name (the cause a generator gave a fix for, the candidates a detector
    yielded)."""
    _registry._load()
    made_by: dict[int, str] = {}
    yielded: list[tuple[str, Candidate]] = []
    generators = {d.name for d in _variants.GENERATORS}

    def generator(name, code):
        def watched(c):
            found = code(c)
            if found is not None:
                made_by[int(c.row.cause)] = name
            return found
        return watched

    def detector(name, code):
        def watched(c, weight):
            found = list(code(c, weight))
            yielded.extend((name, x) for x in found if x is not None)
            return found
        return watched

    saved = dict(_registry._CODE)
    _registry._CODE.update({k: generator(k, v) if k in generators else detector(k, v) for k, v in saved.items()})
    try:
        yield made_by, yielded
    finally:
        _registry._CODE.clear()
        _registry._CODE.update(saved)


def _suggested(model: nn.Module, *inputs: torch.Tensor, fmt=CL, timed: bool = False) -> Suggested:
    """``model`` and ``inputs`` in ``fmt`` (None: as they are) audited (``timed``: at the threads
    a timed audit runs at, which pick some kernels), and its fixes suggested."""
    if fmt is not None:
        model = model.to(memory_format=fmt)
        inputs = tuple(x.contiguous(memory_format=fmt) for x in inputs)
    audit = auditor.audit(model, *inputs, record_time=timed)
    with _traced() as (made_by, yielded):
        fixes = auditor.suggest_fixes(audit)
    return Suggested(model, inputs, fixes, made_by, yielded)


# -- the fixed model computes the same ---------------------------------------------------------------


def _step(model: nn.Module, inputs: tuple[torch.Tensor, ...]):
    """The outputs, the inputs' gradients and the parameters' (by identity) of one step."""
    xs = [x.detach().clone().requires_grad_() for x in inputs]
    model.zero_grad(set_to_none=True)
    out = model(*xs)
    out.backward(torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(out.dtype))
    grads = {id(p): p.grad.clone() for p in model.parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return out.detach(), [x.grad for x in xs], grads


def _same_values_and_gradients(s: Suggested, numbers: list[int], fixes: auditor.Fixes | None = None) -> None:
    """Fixes ``numbers`` (of ``fixes``, else ``s.fixes``) made in memory: the model computes the
    same outputs and gradients (in float64, where a rewrite that adds in another order differs
    from the original only in float32's last bits); undone, it is the model it was."""
    fixes = fixes or s.fixes
    inputs = tuple(x.double() for x in s.inputs)
    s.model.double()  # its parameters stay the same objects, in their layouts
    try:
        before = _step(s.model, inputs)
        done = fixes.apply(s.model, fixes=numbers, exposed=False)
        try:
            assert done["applied"].all(), done["detail"].tolist()
            after = _step(s.model, inputs)
        finally:
            fixes.undo()
        again = _step(s.model, inputs)
    finally:
        s.model.float()
    for got in (after, again):
        torch.testing.assert_close(got[0], before[0])
        for a, b in zip(got[1], before[1]):
            torch.testing.assert_close(a, b)
        assert got[2].keys() == before[2].keys()
        for k in before[2]:
            torch.testing.assert_close(got[2][k], before[2][k])


def _with_candidate(fixes: auditor.Fixes, n: int, candidate: Candidate) -> auditor.Fixes:
    """``fixes`` with fix ``n`` made by ``candidate``, as :meth:`Fixes.verify` makes the one it
    proves (an edit of the source, automatic)."""
    p = fixes._proposals[n]
    proved = replace(p, kind=EditSource, change=candidate.change, reason="", line=candidate.line,
                     suggestion=candidate.suggestion, candidates=())
    return type(fixes)(fixes.frame, fixes.hotspots(), fixes.audit, {**fixes._proposals, n: proved})


def _candidate_is_exact(s: Suggested, n: int, candidate: Candidate) -> None:
    _same_values_and_gradients(s, [n], _with_candidate(s.fixes, n, candidate))


class TextDiffers(AssertionError):
    """A rewrite's text is not the expected text (the one failure a known bug may make)."""


def _exact(got: str, want: str) -> None:
    if got != want:
        raise TextDiffers(f"\n got: {got!r}\nwant: {want!r}")


def _at(obj, text: str) -> str:
    """``path:line`` of the one line of ``obj``'s source that holds ``text``, as fixes show it."""
    lines, first = inspect.getsourcelines(obj)
    found = [first + k for k, line in enumerate(lines) if text in line]
    assert len(found) == 1, (text, found)
    return short_source(f"{inspect.getsourcefile(obj)}:{found[0]}")


# -- small models, written the way models write them -------------------------------------------------


class CopyBetween(nn.Module):
    """A ``.contiguous()`` of a convolution's output before the next."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1)

    def forward(self, x):
        y = self.conv1(x)
        y = y.contiguous()
        return self.conv2(y)


class SqueezeExcite(nn.Module):
    """A squeeze-excite gate pooled by a mean over H and W."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.fc = nn.Conv2d(8, 8, 1)
        self.head = nn.Conv2d(8, 8, 3, padding=1)

    def forward(self, x):
        x = self.conv(x)
        s = x.mean((2, 3), keepdim=True)
        return self.head(x * torch.sigmoid(self.fc(s)))


class StackedBranches(nn.Module):
    """Two branches stacked on a new dimension and summed over it."""

    def __init__(self):
        super().__init__()
        self.a = nn.Conv2d(3, 8, 3, padding=1)
        self.b = nn.Conv2d(3, 8, 3, padding=1)
        self.c = nn.Conv2d(8, 8, 3, padding=1)

    def forward(self, x):
        y = torch.stack([self.a(x), self.b(x)], dim=1).sum(dim=1)
        return self.c(y)


class ImagePool(nn.Module):
    """ASPP's image-pooling branch: an N×C×1×1 map interpolated to the image's size."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.proj = nn.Conv2d(8, 8, 1)
        self.bn = nn.BatchNorm2d(8)
        self.head = nn.Conv2d(16, 8, 3, padding=1)

    def forward(self, x):
        x = self.conv(x)
        p = torch.relu(self.bn(self.proj(F.avg_pool2d(x, x.shape[-2:]))))
        p = F.interpolate(p, size=x.shape[-2:], mode="bilinear", align_corners=False)
        return self.head(torch.cat([x, p], dim=1))


class SlicedBranches(nn.Module):
    """The channels sliced for two branches."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 16, 3, padding=1)
        self.c = nn.Conv2d(8, 8, 3, padding=1)
        self.d = nn.Conv2d(8, 8, 3, padding=1)

    def forward(self, x):
        x = self.conv(x)
        left, right = x[:, :8], x[:, 8:]
        return self.c(left) + self.d(right)


class InPlaceOnView(nn.Module):
    """An in-place add on a transposed view."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.head = nn.Conv2d(8, 8, 3, padding=1)

    def forward(self, x):
        y = self.conv(x).transpose(2, 3)
        y += 1
        return self.head(y.transpose(2, 3))


class StdConv2d(nn.Conv2d):
    """Weight standardisation through a reshape and a batch norm (timm's StdConv2d)."""

    def forward(self, x):
        weight = F.batch_norm(self.weight.reshape(1, self.out_channels, -1), None, None,
                              training=True, momentum=0.0, eps=1e-5).reshape_as(self.weight)
        return F.conv2d(x, weight, self.bias, self.stride, self.padding)


class Standardized(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.std = StdConv2d(8, 8, 3, padding=1)

    def forward(self, x):
        return self.std(torch.relu(self.conv(x)))


class SoftmaxOverChannels(nn.Module):
    """An ``nn.Softmax`` over the channels between two convolutions."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.mid = nn.Softmax(dim=1)
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1)

    def forward(self, x):
        return self.conv2(self.mid(self.conv1(x)))


class GhostSlice(nn.Module):
    """GhostNet's module: the primary and cheap maps concatenated, then cut to ``out_chs``
    channels, all of them here."""

    def __init__(self):
        super().__init__()
        self.out_chs = 8
        self.primary = nn.Conv2d(3, 4, 1)
        self.cheap = nn.Conv2d(4, 4, 3, padding=1, groups=4)
        self.head = nn.Conv2d(8, 8, 3, padding=1)

    def forward(self, x):
        x1 = self.primary(x)
        out = torch.cat([x1, self.cheap(x1)], dim=1)
        out = out[:, :self.out_chs, :, :]
        return self.head(out)


class FlowJoin(nn.Module):
    """A map concatenated with a 2-channel flow made off the path, contiguous (RAFT's)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.scale = nn.Parameter(torch.rand(2, 1, 1) + 0.5)
        self.head = nn.Conv2d(10, 8, 3, padding=1)

    def forward(self, x):
        a = self.conv(x)
        n, _, h, w = a.shape
        flow = torch.linspace(-1, 1, w).expand(n, 2, h, w) * self.scale
        return self.head(torch.cat([a, flow], dim=1))


class MergeCH(nn.Module):
    """A reshape that merges C and H of a channels_last map, which must copy it."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1)

    def forward(self, x):
        y = self.conv1(x)
        n, c, h, w = y.shape
        y = y.reshape(n, c * h, w).reshape(n, c, h, w)
        return self.conv2(y)


class InstanceNormed(nn.Module):
    """An ``nn.InstanceNorm2d`` between two convolutions (RAFT's encoder)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.norm = nn.InstanceNorm2d(8)
        self.head = nn.Conv2d(8, 8, 3, padding=1)

    def forward(self, x):
        return self.head(torch.relu(self.norm(self.conv(x))))


class RoiPool(nn.Module):
    """RoIAlign over a feature map, through torchvision's op (as its ``roi_align`` calls it)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.head = nn.Conv2d(8, 4, 3, padding=1)
        self.register_buffer("boxes", torch.tensor([[0, 1.0, 1.0, 10.0, 12.0], [1, 3.0, 2.0, 14.0, 9.0]]))

    def forward(self, x):
        f = self.conv(x)
        r = torch.ops.torchvision.roi_align(f, self.boxes, 0.5, 4, 4, 2, False)
        return self.head(r)


# -- the generators ----------------------------------------------------------------------------------


@pytest.mark.fix_variant("re-stride")
def test_re_stride():
    s = _suggested(_SpatialAttention(), torch.randn(2, 3, 8, 8))
    n = s.the_fix_by("re-stride")
    row = s.row(n)
    assert row["pattern"] == "nc11_broadcast" and row["automatic"], row["reason"]
    _exact(row["line"], "        x = torch.cat([x_avg, x_max], dim=1)")
    _exact(row["suggestion"], "        from auditor import keep_format\n"
                              "        x = torch.cat([keep_format.restride(x_avg, self.conv.weight), "
                              "keep_format.restride(x_max, self.conv.weight)], dim=1)")
    _same_values_and_gradients(s, [n])


@pytest.mark.fix_variant("product backward")
def test_product_backward():
    s = _suggested(_Correlation(), torch.randn(2, 3, 16, 16), torch.randn(2, 3, 16, 16))
    n = s.the_fix_by("product backward")
    row = s.row(n)
    assert row["pattern"] == "joins" and row["automatic"], row["reason"]
    _exact(row["line"], "        corr = torch.matmul(fmap1.view(b, c, h * w).transpose(1, 2), fmap2.view(b, c, h * w))")
    _exact(row["suggestion"], "        from auditor import keep_format\n"
                              "        corr = keep_format.matmul(fmap1.view(b, c, h * w).transpose(1, 2), "
                              "fmap2.view(b, c, h * w))")
    _same_values_and_gradients(s, [n])


@pytest.mark.fix_variant("format-keeping replacement")
def test_format_keeping_replacement():
    pytest.importorskip("torchvision")
    from auditor._fix._roi_align import roi_align_loses_format

    if not any(roi_align_loses_format("cpu", torch.float32)):
        pytest.skip("torchvision's roi_align keeps channels_last on this torch: no cause to replace it for")
    s = _suggested(RoiPool(), torch.randn(2, 3, 16, 16))
    n = s.the_fix_by("format-keeping replacement")
    row = s.row(n)
    assert row["pattern"] == "no_cl_kernel" and row["automatic"], row["reason"]
    _exact(row["line"], "        r = torch.ops.torchvision.roi_align(f, self.boxes, 0.5, 4, 4, 2, False)")
    _exact(row["suggestion"], "        from auditor import keep_format\n"
                              "        r = keep_format.roi_align(f, self.boxes, (4, 4), 0.5, 2, False)")
    _same_values_and_gradients(s, [n])


@pytest.mark.fix_variant("torch module's own copy")
def test_torch_modules_own_copy():
    from kernels import support_here

    if support_here(nn.InstanceNorm2d(4), (2, 4, 5, 5)) == "full":
        pytest.skip("InstanceNorm2d keeps channels_last on this torch: its own copy is no cause")
    s = _suggested(InstanceNormed(), torch.randn(2, 3, 8, 8))
    n = s.the_fix_by("torch module's own copy")
    row = s.row(n)
    assert row["action"] == SwapModules.action and row["automatic"] and row["line"] == ""
    assert s.fixes._proposals[n].change.modules == ("norm",)
    _exact(row["suggestion"], "model.norm = auditor.keep_format(model.norm)")
    _same_values_and_gradients(s, [n])


@pytest.mark.fix_variant("explicit copy")
def test_explicit_copy():
    s = _suggested(CopyBetween(), torch.randn(2, 3, 8, 8))
    n = s.the_fix_by("explicit copy")
    row = s.row(n)
    assert row["pattern"] == "explicit_copy" and row["automatic"]
    _exact(row["line"], "        y = y.contiguous()")
    _exact(row["suggestion"], "        y = y.contiguous(memory_format=torch.channels_last if "
                              "y.is_contiguous(memory_format=torch.channels_last) else torch.contiguous_format)")
    _same_values_and_gradients(s, [n])


@pytest.mark.fix_variant("mean by sum")
def test_mean_by_sum():
    s = _suggested(SqueezeExcite(), torch.randn(2, 3, 8, 8))
    n = s.the_fix_by("mean by sum")
    row = s.row(n)
    assert row["pattern"] == "mean_backward" and row["automatic"]
    _exact(row["line"], "        s = x.mean((2, 3), keepdim=True)")
    _exact(row["suggestion"], "        s = x.sum((2, 3), keepdim=True) / (x.shape[2] * x.shape[3])")
    _same_values_and_gradients(s, [n])


@pytest.mark.fix_variant("stack reduced")
def test_stack_reduced():
    s = _suggested(StackedBranches(), torch.randn(2, 3, 8, 8))
    n = s.the_fix_by("stack reduced")
    row = s.row(n)
    assert row["pattern"] == "stack_reduce" and row["automatic"]
    _exact(row["line"], "        y = torch.stack([self.a(x), self.b(x)], dim=1).sum(dim=1)")
    _exact(row["suggestion"], "        y = sum([self.a(x), self.b(x)])")
    _same_values_and_gradients(s, [n])


@pytest.mark.fix_variant("broadcast")
def test_broadcast():
    s = _suggested(ImagePool(), torch.randn(2, 3, 8, 8))
    n = s.the_fix_by("broadcast")
    row = s.row(n)
    assert row["pattern"] == "nc11_broadcast" and row["automatic"]
    _exact(row["line"], '        p = F.interpolate(p, size=x.shape[-2:], mode="bilinear", align_corners=False)')
    _exact(row["suggestion"], "        p = p.expand(-1, -1, *x.shape[-2:]).contiguous(memory_format=torch.channels_last "
                              "if p.stride(1) == 1 and (p.shape[1] == 1 or p.stride(-1) > 1) else torch.contiguous_format)")
    _same_values_and_gradients(s, [n])


class ChunkedAttention(nn.Module):
    """Query, key and value chunked from one channels_last map and used in different orders."""

    def __init__(self, c=8):
        super().__init__()
        self.qkv = nn.Conv2d(3, 3 * c, 3, padding=1)
        self.head = nn.Conv2d(c, 4, 1)

    def forward(self, x):
        q, k, v = self.qkv(x).chunk(3, dim=1)
        n, c, h, w = q.shape
        q, k, v = q.reshape(n, c, h * w), k.reshape(n, c, h * w), v.reshape(n, c, h * w)
        attn = torch.softmax(q.transpose(1, 2) @ k, dim=-1)
        return self.head((v @ attn.transpose(1, 2)).reshape(n, c, h, w))


@pytest.mark.fix_variant("split keeping the format")
def test_split_keeping_the_format():
    s = _suggested(ChunkedAttention(), torch.randn(2, 3, 8, 8))
    n = s.the_fix_by("split keeping the format")
    row = s.row(n)
    assert row["pattern"] == "channel_slice" and row["automatic"]
    _exact(row["line"], "        q, k, v = self.qkv(x).chunk(3, dim=1)")
    _exact(row["suggestion"], "        from auditor import keep_format\n"
                              "        q, k, v = keep_format.chunk(self.qkv(x), 3, dim=1)")
    _same_values_and_gradients(s, [n])


@pytest.mark.fix_variant("slices as a split")
def test_slices_as_a_split():
    s = _suggested(SlicedBranches(), torch.randn(2, 3, 8, 8))
    n = s.the_fix_by("slices as a split")
    row = s.row(n)
    assert row["pattern"] == "channel_slice" and row["automatic"]
    _exact(row["line"], "        left, right = x[:, :8], x[:, 8:]")
    _exact(row["suggestion"], "        x_0, x_1 = x.split([8, x.shape[1] - 8], dim=1)\n"
                              "        left, right = x_0, x_1")
    _same_values_and_gradients(s, [n])


@pytest.mark.fix_variant("out of place")
def test_out_of_place():
    s = _suggested(InPlaceOnView(), torch.randn(2, 3, 8, 8))
    n = s.the_fix_by("out of place")
    row = s.row(n)
    assert row["pattern"] == "inplace_view" and row["automatic"]
    _exact(row["line"], "        y += 1")
    _exact(row["suggestion"], "        y = y + 1")
    _same_values_and_gradients(s, [n])


@pytest.mark.fix_variant("weight flattened in memory order")
def test_weight_flattened_in_memory_order():
    s = _suggested(Standardized(), torch.randn(2, 3, 8, 8))
    n = s.the_fix_by("weight flattened in memory order")
    row = s.row(n)
    assert row["pattern"] == "weight_rebuilt" and row["automatic"]
    _exact(row["line"], "        weight = F.batch_norm(self.weight.reshape(1, self.out_channels, -1), None, None,\n"
                        "                              training=True, momentum=0.0, eps=1e-5).reshape_as(self.weight)")
    _exact(row["suggestion"],
           "        weight = F.batch_norm((self.weight.permute(0, 2, 3, 1) if (_cl := self.weight.stride(1) == 1 and "
           "(self.weight.shape[1] == 1 or self.weight.stride(-1) > 1)) else self.weight)"
           ".reshape(1, self.out_channels, -1), None, None,\n"
           "                              training=True, momentum=0.0, eps=1e-5)"
           ".reshape(self.weight.permute(0, 2, 3, 1).shape if _cl else self.weight.shape)"
           ".permute((0, 3, 1, 2) if _cl else (0, 1, 2, 3))")
    _same_values_and_gradients(s, [n])


@pytest.mark.fix_variant("channel shuffle")
def test_channel_shuffle():
    s = _suggested(Shuffle(), torch.randn(2, 3, 6, 6))
    n = s.the_fix_by("channel shuffle")
    row = s.row(n)
    assert row["pattern"] == "channel_shuffle" and row["automatic"]
    _exact(row["line"], "        y = torch.transpose(y.view(n, 2, c // 2, h, w), 1, 2).contiguous().view(n, c, h, w)")
    _exact(row["suggestion"], "        y = torch.nn.functional.channel_shuffle(y, 2)")
    _same_values_and_gradients(s, [n])


@pytest.mark.fix_variant("module swap")
def test_module_swap():
    s = _suggested(SoftmaxOverChannels(), torch.randn(2, 3, 8, 8))
    n = s.the_fix_by("module swap")
    row = s.row(n)
    assert row["pattern"] == "no_cl_kernel" and row["action"] == SwapModules.action and row["automatic"]
    _exact(row["suggestion"], "model.mid = auditor.keep_format(model.mid)")
    _same_values_and_gradients(s, [n])


def _full_slice_backward_writes_contiguous() -> bool:
    """Whether this torch's backward of a slice that keeps every channel writes its gradient
    contiguous (a slice_backward into zeros, as torch 2.8 runs it) instead of passing the
    channels_last gradient through (an alias)."""
    x = torch.randn(2, 4, 3, 3).to(memory_format=CL).requires_grad_() * 1
    seen = []
    x.register_hook(seen.append)
    y = x[:, :4, :, :]
    y.backward(torch.ones_like(y))
    return not seen[0].is_contiguous(memory_format=CL)


@pytest.mark.fix_variant("whole slice skipped")
def test_whole_slice_skipped():
    if not _full_slice_backward_writes_contiguous():
        pytest.skip("this torch's backward of a slice that keeps every channel passes the gradient through: "
                    "no cause to skip the slice for")
    s = _suggested(GhostSlice(), torch.randn(2, 3, 8, 8))
    n = s.the_fix_by("whole slice skipped")
    row = s.row(n)
    assert row["pattern"] == "no_cl_kernel" and row["automatic"]
    _exact(row["line"], "        out = out[:, :self.out_chs, :, :]")
    _exact(row["suggestion"], "        out = (out if out.shape[1] == self.out_chs else out[:, :self.out_chs, :, :])")
    _same_values_and_gradients(s, [n])


@pytest.mark.fix_variant("convolution as a Conv2d")
def test_convolution_as_a_conv2d():
    from kernels import convs_that_lose

    torch.manual_seed(0)
    model, x = TimeThenFrame().to(memory_format=CL3), torch.randn(2, 3, 4, 8, 8).to(memory_format=CL3)
    losing = convs_that_lose(model, (x,), _at_audit_threads)
    if "body.0" not in losing:
        pytest.skip("the (3, 1, 1) Conv3d has a channels_last_3d kernel at this batch here: no cause")
    s = _suggested(model, x, fmt=CL3, timed=True)
    n = s.the_fix_by("convolution as a Conv2d")
    row = s.row(n)
    assert row["pattern"] == "conv_no_kernel" and row["action"] == SwapModules.action and row["automatic"]
    swapped = s.fixes._proposals[n].change.modules
    assert set(swapped) == losing and swapped[0] == "body.0"
    more = f"  # and {len(swapped) - 1} more like it" if len(swapped) > 1 else ""
    _exact(row["suggestion"], f"{module_expr('body.0')} = auditor.keep_format({module_expr('body.0')}){more}")
    _same_values_and_gradients(s, [n])


class PositionsMixer(nn.Module):
    """A state-space mixer's projection (EfficientViM's): a Conv1d over the map's flattened
    positions, its output made a map again for a depthwise convolution."""

    def __init__(self, c=8):
        super().__init__()
        self.stem = nn.Conv2d(3, c, 3, padding=1)
        self.proj = nn.Conv1d(c, 3 * c, 1)
        self.dw = nn.Conv2d(3 * c, 3 * c, 3, padding=1, groups=3 * c)

    def forward(self, x):
        x = self.stem(x)
        B, _, H, W = x.shape
        return self.dw(self.proj(x.flatten(2)).reshape(B, -1, H, W))


@pytest.mark.fix_variant("a Conv1d over a map's positions as a Conv2d")
def test_a_conv1d_over_a_map_s_positions_as_a_conv2d():
    s = _suggested(PositionsMixer(), torch.randn(2, 3, 6, 6))
    n = s.the_fix_by("a Conv1d over a map's positions as a Conv2d")
    row = s.row(n)
    assert row["pattern"] == "conv_no_kernel" and row["action"] == SwapModules.action and row["automatic"]
    _exact(row["suggestion"], "model.proj = auditor.keep_format(model.proj)")
    _same_values_and_gradients(s, [n])
    verified = s.fixes.verify(s.model, *s.inputs, rounds=3, max_rounds=3, budget_s=1)
    proved = verified.verification.set_index("fix").loc[n]
    assert proved["applied"] and proved["same_outputs"] and proved["hotspots_after"] == 0, proved["reason"]


@pytest.mark.fix_variant("weight converted")
def test_weight_converted():
    torch.manual_seed(0)
    model = OneContiguousWeight().to(memory_format=CL)
    model.b.weight.data = model.b.weight.data.contiguous()  # the one weight not converted
    x = torch.randn(2, 3, 8, 8).to(memory_format=CL)
    s = _suggested(model, x, fmt=None)
    n = s.the_fix_by("weight converted")
    row = s.row(n)
    assert row["pattern"] == "weight_format" and row["action"] == ConvertWeights.action and row["automatic"]
    _exact(row["suggestion"], "auditor.convert_conv2d_weight_memory_format(model.b, torch.channels_last)")
    _same_values_and_gradients(s, [n])


@pytest.mark.fix_variant("joins")
def test_joins():
    """The family's fix: the candidates of its variants' detectors, in the declared order, by
    hand until verify proves one; verify proves the first that passes and returns it as the fix."""
    s = _suggested(CallsAHelper(), torch.randn(2, 3, 8, 8))
    n = s.the_fix_by("joins")
    p = s.fixes._proposals[n]
    order = [d.name for d in _variants.VARIANTS]
    found = [s.variant_of(c) for c in p.candidates]
    assert found == ["a copy of a channels_last view", "the copy made at the caller"]
    assert [order.index(v) for v in found] == sorted(order.index(v) for v in found)
    row = s.row(n)
    assert p.kind is EditSource and not row["automatic"] and row["suggestion"] == ""
    labels = "; ".join(c.label for c in p.candidates)
    _exact(row["reason"], f"2 candidate rewrites ({labels}) exact only for some shapes: Fixes.verify(model, *inputs) "
                          "proves one on this model or drops them")
    proved = s.fixes.verify(s.model, *s.inputs, rounds=2, max_rounds=2, budget_s=0.5, warmup=0, exposed=False)
    table = proved.verification
    check = table[(table["kind"] == "fix") & (table["fix"] == n)].iloc[0]
    assert check["applied"] and check["same_outputs"] and check["hotspots_after"] == 0, check["reason"]
    assert check["reason"].startswith(f"candidate {p.candidates[1].label} proved"), check["reason"]
    fixed = proved.frame.set_index("fix").loc[n]
    assert fixed["automatic"] and fixed["suggestion"] == p.candidates[1].suggestion
    _same_values_and_gradients(s, [n], proved)


@pytest.mark.fix_variant("odd tensor converted")
def test_odd_tensor_converted():
    s = _suggested(FlowJoin(), torch.randn(2, 3, 8, 8))
    n = s.the_fix_by("odd tensor converted")
    row = s.row(n)
    assert row["pattern"] == "mixed_join" and row["automatic"], row["reason"]
    _exact(row["line"], "        return self.head(torch.cat([a, flow], dim=1))")
    _exact(row["suggestion"], "        return self.head(torch.cat([a, flow.contiguous(memory_format=torch.channels_last "
                              "if a.is_contiguous(memory_format=torch.channels_last) else torch.contiguous_format)], "
                              "dim=1))")
    _same_values_and_gradients(s, [n])


@pytest.mark.fix_variant("region kept contiguous")
def test_region_kept_contiguous():
    s = _suggested(MergeCH(), torch.randn(2, 3, 8, 8))
    n = s.the_fix_by("region kept contiguous")
    row = s.row(n)
    assert row["pattern"] == "reshape_merge" and row["action"] == KeepContiguous.action and row["automatic"]
    assert row["region"] == ("conv1", "conv2")
    _exact(row["suggestion"], "auditor.keep_contiguous(model, ['conv1', 'conv2'])")
    _same_values_and_gradients(s, [n])


# -- the variants of the joins family, and of the region fix of a reshape that merges C ---------------


def _the_candidates(s: Suggested, variant: str) -> tuple[int, list[Candidate]]:
    """The one fix whose candidates ``variant`` yielded, and those candidates."""
    found = s.candidates_of(variant)
    assert found, (variant, s.fixes.frame[["fix", "pattern", "line", "reason"]].to_string())
    numbers = {n for n, _ in found}
    assert len(numbers) == 1, (variant, numbers)
    return numbers.pop(), [c for _, c in found]


@pytest.mark.fix_variant("tokens to a map")
def test_tokens_to_a_map():
    s = _suggested(HeadsToMap(), torch.randn(2, 3, 8, 8))
    n, (candidate,) = _the_candidates(s, "tokens to a map")
    assert candidate.label == "the map written in NHWC order (reshape then permute)"
    _exact(candidate.line, "        x = x.permute(0, 1, 3, 2).reshape(B, -1, H, W)")
    _exact(candidate.suggestion, "        x = x.permute(0, 2, 1, 3).reshape(B, H, W, -1).permute(0, 3, 1, 2)")
    _candidate_is_exact(s, n, candidate)


@pytest.mark.fix_variant("a map split into windows")
def test_a_map_split_into_windows():
    s = _suggested(Windows(), torch.randn(2, 3, 8, 8))
    n, (candidate,) = _the_candidates(s, "a map split into windows")
    assert candidate.label == "the map split in NHWC order (permute, reshape, permute back)"
    line = ("        t = x.reshape(B, C, H // P, P, W // P, P).permute(0, 2, 4, 3, 5, 1)"
            ".reshape(B, (H // P) * (W // P), P * P, C)")
    _exact(candidate.line, line)
    _exact(candidate.suggestion, "        t = (x.permute(0, 2, 3, 1).reshape(B, H // P, P, W // P, P, C).permute(0, 5, 1, 2, 3, 4) "
                                 "if x.is_contiguous(memory_format=torch.channels_last) else "
                                 "x.reshape(B, C, H // P, P, W // P, P)).permute(0, 2, 4, 3, 5, 1)"
                                 ".reshape(B, (H // P) * (W // P), P * P, C)")
    _candidate_is_exact(s, n, candidate)


@pytest.mark.fix_variant("windows gathered into a map")
def test_windows_gathered_into_a_map():
    s = _suggested(Windows(), torch.randn(2, 3, 8, 8))
    n, (plain, following) = _the_candidates(s, "windows gathered into a map")
    assert plain.label == "the map gathered in NHWC order (channels permuted last)"
    assert following.label == "the map gathered in NHWC order, in the format of self.conv2.weight"
    line = "        x = t.reshape(B, H // P, W // P, P, P, C).permute(0, 5, 1, 3, 2, 4).reshape(B, C, H, W)"
    gathered = "x = t.reshape(B, H // P, W // P, P, P, C).permute(0, 1, 3, 2, 4, 5).reshape(B, H, W, C).permute(0, 3, 1, 2)"
    _exact(plain.line, line)
    _exact(plain.suggestion, f"        {gathered}")
    _exact(following.suggestion, f"        {gathered}.contiguous(memory_format={FOLLOW.format(w='self.conv2.weight')})")
    for candidate in (plain, following):
        _candidate_is_exact(s, n, candidate)


@pytest.mark.fix_variant("a copy of a channels_last view")
def test_a_copy_of_a_channels_last_view():
    s = _suggested(CallsAHelper(), torch.randn(2, 3, 8, 8))
    n, (candidate,) = _the_candidates(s, "a copy of a channels_last view")
    assert candidate.label == "the copy of the channels_last view dropped"
    _exact(candidate.line, "        return torch.cat([rows, rows * 2], dim=-1).permute(0, 3, 1, 2).contiguous()")
    _exact(candidate.suggestion, "        return torch.cat([rows, rows * 2], dim=-1).permute(0, 3, 1, 2)")
    _candidate_is_exact(s, n, candidate)


@pytest.mark.fix_variant("the copy made at the caller")
def test_the_copy_made_at_the_caller():
    s = _suggested(CallsAHelper(), torch.randn(2, 3, 8, 8))
    n, (candidate,) = _the_candidates(s, "the copy made at the caller")
    call = _at(CallsAHelper.forward, "feats = self.helper.features(rows)")
    assert candidate.label == ("the copy of the channels_last view dropped, and made where "
                               f"{call} calls features, in the format of self.head.weight")
    _exact(candidate.line, "        return torch.cat([rows, rows * 2], dim=-1).permute(0, 3, 1, 2).contiguous()")
    _exact(candidate.suggestion, "return torch.cat([rows, rows * 2], dim=-1).permute(0, 3, 1, 2)\n"
                                 f"# and at {call}:\n"
                                 "feats = self.helper.features(rows).contiguous(memory_format="
                                 f"{FOLLOW.format(w='self.head.weight')})")
    _candidate_is_exact(s, n, candidate)


@pytest.mark.fix_variant("a copy of channels-innermost tokens")
def test_a_copy_of_channels_innermost_tokens():
    s = _suggested(QueryPool(), torch.randn(2, 3, 8, 8))
    n, (following, named) = _the_candidates(s, "a copy of channels-innermost tokens")
    assert following.label == "the copy made in the format of self.pool.weight"
    assert named.label.startswith("the copy made in torch.channels_last, a format-specific edit")
    copy = "            q = q.reshape(B, H, W, C).permute(0, 3, 1, 2).contiguous("
    _exact(following.line, f"{copy})")
    _exact(following.suggestion, f"{copy}memory_format={FOLLOW.format(w='self.pool.weight')})")
    _exact(named.suggestion, f"{copy}memory_format=torch.channels_last)")
    for candidate in (following, named):
        _candidate_is_exact(s, n, candidate)


@pytest.mark.fix_variant("the product transposed")
def test_the_product_transposed():
    s = _suggested(CascadedHeads(), torch.randn(2, 3, 8, 8))
    n, (plain, following) = _the_candidates(s, "the product transposed")
    assert plain.label == "the product computed transposed"
    assert following.label == "the product computed transposed where self.qkvs[1].weight is channels_last"
    _exact(plain.line, "            feat = v @ attn.transpose(-2, -1)")
    _exact(plain.suggestion, "            feat = (attn @ v.transpose(-2, -1)).transpose(-2, -1)")
    _exact(following.suggestion, "            feat = ((attn @ v.transpose(-2, -1)).transpose(-2, -1) if "
                                 "((_w := self.qkvs[1].weight).stride(1) == 1 and (_w.shape[1] == 1 or _w.stride(-1) > 1)) "
                                 "else v @ attn.transpose(-2, -1))")
    for candidate in (plain, following):
        _candidate_is_exact(s, n, candidate)


@pytest.mark.fix_variant("a chain of reshapes")
def test_a_chain_of_reshapes():
    """Tokens folded into a map: no other variant has a candidate here."""
    s = _suggested(BadCandidate(), torch.randn(2, 3, 4, 4))
    n, (candidate,) = _the_candidates(s, "a chain of reshapes")
    assert [s.variant_of(c) for c in s.fixes._proposals[n].candidates] == ["a chain of reshapes"]
    assert candidate.label == ("the statement's reshapes and permutes gathered in NHWC order in one copy, "
                               "where self.conv2.weight is channels_last")
    _exact(candidate.line, "        x = t.transpose(1, 2).reshape(B, C // 2, 2 * H, W)")
    _candidate_is_exact(s, n, candidate)
    _exact(candidate.suggestion,
           "        if ((_w := self.conv2.weight).stride(1) == 1 and (_w.shape[1] == 1 or _w.stride(-1) > 1)):\n"
           "            x = t.reshape(B, t.shape[1] // W, W, C // 2, t.shape[2] // (C // 2)).permute(0, 4, 1, 2, 3)"
           ".reshape(B, 2 * H, W, C // 2).permute(0, 3, 1, 2)\n"
           "        else:\n"
           "            x = t.transpose(1, 2).reshape(B, C // 2, 2 * H, W)")


class ConvOnWindows(nn.Module):
    """A convolution run on windows: the map cut into ws x ws windows and put back."""

    def __init__(self, c=8, ws=2):
        super().__init__()
        self.ws = ws
        self.stem = nn.Conv2d(3, c, 3, padding=1)
        self.local = nn.Conv2d(c, c, 3, padding=1)
        self.head = nn.Conv2d(c, 4, 1)

    def forward(self, x):
        f = self.stem(x)
        n, c, h, w = f.shape
        ws = self.ws
        win = f.view(n, c, h // ws, ws, w // ws, ws).permute(0, 2, 4, 1, 3, 5).reshape(-1, c, ws, ws)
        win = self.local(win)
        f = win.view(n, h // ws, w // ws, c, ws, ws).permute(0, 3, 1, 4, 2, 5).reshape(n, c, h, w)
        return self.head(f)


@pytest.mark.fix_variant("a chain of reshapes")
def test_a_map_cut_into_windows_is_read_and_gathered_in_nhwc_order_and_its_two_causes_proved_by_one_rewrite():
    """The windows cut from a channels_last map: the map read in its memory order and the
    windows gathered in NHWC order, so the forward copy and the backward merge both keep the
    format. The line's forward and backward copies are two causes; verify proves both with the
    same rewrite (a candidate that agrees with a fix proved before is tried first), so the fixes
    are made together."""
    s = _suggested(ConvOnWindows(), torch.randn(2, 3, 8, 8))
    cut = "        win = f.view(n, c, h // ws, ws, w // ws, ws).permute(0, 2, 4, 1, 3, 5).reshape(-1, c, ws, ws)"
    found = [(n, c) for n, c in s.candidates_of("a chain of reshapes") if c.line == cut]
    assert len({n for n, _ in found}) == 2  # its forward and its backward copy
    n, candidate = found[0]
    assert candidate.label == ("the statement's reshapes and permutes read and gathered in NHWC order in one copy, "
                               "where self.local.weight is channels_last")
    _exact(candidate.suggestion,
           "        if ((_w := self.local.weight).stride(1) == 1 and (_w.shape[1] == 1 or _w.stride(-1) > 1)):\n"
           "            win = f.permute(0, 2, 3, 1).reshape(n, h // ws, ws, w // ws, ws, c).permute(0, 1, 3, 2, 4, 5)"
           ".reshape(n * (h // ws) * (w // ws), ws, ws, c).permute(0, 3, 1, 2)\n"
           "        else:\n"
           f"    {cut}")
    _candidate_is_exact(s, n, candidate)
    verified = s.fixes.verify(s.model, *s.inputs)
    table = verified.verification
    fixes = table[table["kind"] == "fix"]
    assert fixes["applied"].all() and (fixes["hotspots_after"] == 0).all(), fixes.to_string()
    together = table[table["kind"] == "all"].iloc[0]
    assert together["applied"] and together["same_outputs"] and together["hotspots_after"] == 0, together
    model = copy.deepcopy(s.model)
    verified.apply(model, *s.inputs)
    try:
        assert auditor.audit(model, *s.inputs).causes().empty
    finally:
        verified.undo()


class Unfolded(nn.Module):
    """A padded map unfolded into overlapping windows (a halo attention's keys and values)."""

    def __init__(self, c=8):
        super().__init__()
        self.kv = nn.Conv2d(3, c, 3, padding=1)
        self.head = nn.Conv2d(c, 4, 1)

    def forward(self, x):
        kv = F.pad(self.kv(x), [1, 1, 1, 1])
        win = kv.unfold(2, 4, 2).unfold(-2, 4, 2)
        return self.head(win[..., 1, 1] * win[..., 2, 2])


@pytest.mark.fix_variant("a map unfolded on its NHWC view")
def test_a_map_unfolded_on_its_nhwc_view():
    """The cause is the pad's backward, which passes on the gradient the unfold's backward made
    contiguous; the candidate rewrites the unfold's statement, the line after."""
    s = _suggested(Unfolded(), torch.randn(2, 3, 8, 8))
    n, (candidate,) = _the_candidates(s, "a map unfolded on its NHWC view")
    assert s.row(n)["op"] == "aten.constant_pad_nd.default"
    assert candidate.label == "the map unfolded on its NHWC view"
    _exact(candidate.line, "        win = kv.unfold(2, 4, 2).unfold(-2, 4, 2)")
    _exact(candidate.suggestion, "        win = (kv.permute(0, 2, 3, 1).unfold(1, 4, 2).unfold(2, 4, 2).permute(0, 3, 1, 2, 4, 5) "
                                 "if kv.is_contiguous(memory_format=torch.channels_last) else "
                                 "kv.unfold(2, 4, 2).unfold(-2, 4, 2))")
    _candidate_is_exact(s, n, candidate)
    verified = s.fixes.verify(s.model, *s.inputs)
    row = verified.verification.set_index("fix").loc[n]
    assert row["applied"] and row["same_outputs"] and row["hotspots_after"] == 0, row["reason"]


@pytest.mark.parametrize("text", ["w = x.unfold(d, 4, 2)\n", "w = x.unfold(4, 2, 2).unfold(4, 2, 2)\n",
                                  "w = x.unfold(2, 4, 2) + y.unfold(2, 4, 2)\n"])
def test_an_unfold_that_is_not_of_a_map_s_own_literal_dimensions_is_refused(text):
    from auditor._fix import _syntax as rw
    from auditor._fix._generators._join_unfold import unfold_in_nhwc_order

    with pytest.raises(rw.Refused):
        rw.rewrite(rw.Statement("f.py", 1, 1, text), [(unfold_in_nhwc_order(4), rw.Facts(taken=frozenset()))])


class TalkingHeads(nn.Module):
    """An attention whose scores (made from no image) are mixed across heads by 1x1
    convolutions, as EfficientFormerV2's talking heads do, before they meet the values."""

    def __init__(self, c=8, heads=4, n=16):
        super().__init__()
        self.heads = heads
        self.q = nn.Conv2d(3, c, 1)
        self.k = nn.Conv2d(3, c, 1)
        self.v = nn.Conv2d(3, c, 1)
        self.talking1 = nn.Conv2d(heads, heads, 1)
        self.talking2 = nn.Conv2d(heads, heads, 1)
        self.proj = nn.Conv2d(c, 4, 1)
        self.bias = nn.Parameter(torch.zeros(heads, n, n))

    def forward(self, x):
        B, _, H, W = x.shape
        q = self.q(x).reshape(B, self.heads, -1, H * W).transpose(-2, -1)
        k = self.k(x).reshape(B, self.heads, -1, H * W)
        v = self.v(x)
        attn = (q @ k) * 0.5
        attn = attn + self.bias
        attn = self.talking2(self.talking1(attn).softmax(-1))
        out = (attn @ v.reshape(B, self.heads, -1, H * W).transpose(-2, -1)).transpose(-2, -1)
        return self.proj(out.reshape(B, -1, H, W) + v)


@pytest.mark.fix_variant("the map's own convolutions kept contiguous")
def test_the_map_s_own_convolutions_kept_contiguous():
    """The scores plus a bias (a map made from no image, which no join variant rewrites) reach
    two convolutions before they meet the values: those two run contiguous, as the scores are
    made; the product between them and the values writes its own layout, so no edge converts."""
    s = _suggested(TalkingHeads(), torch.randn(2, 3, 4, 4))
    n = s.the_fix_by("the map's own convolutions kept contiguous")
    row = s.row(n)
    assert row["pattern"] == "joins" and row["op"] == "aten.add.Tensor" and row["automatic"]
    assert row["region"] == ("talking1", "talking2") and row["added_bytes"] == 0
    _exact(row["suggestion"], "auditor.keep_contiguous(model, ['talking1', 'talking2'])")
    _same_values_and_gradients(s, [n])
    verified = s.fixes.verify(s.model, *s.inputs)
    proved = verified.verification.set_index("fix").loc[n]
    assert proved["applied"] and proved["same_outputs"] and proved["hotspots_after"] == 0, proved["reason"]


def test_a_copy_further_along_the_map_keeps_the_map_s_own_convolutions_contiguous():
    """The scores' copies that a product of them makes (forward: of the second convolution's
    output; backward: of the gradient the first one writes) are reshapes that merge the heads
    with another dimension, further along the map than the op that made it: the walk back to
    where the map was made (from no image) finds the same two convolutions, with no edge to
    convert, rather than the convolutions on both sides (one of them the projection on the
    images' path, whose edges cost more than they remove)."""
    s = _suggested(TalkingHeads(), torch.randn(2, 3, 4, 4))
    merges = s.fixes.frame[s.fixes.frame["pattern"] == "reshape_merge"]
    assert sorted(s.fixes.audit.causes().set_index("cause").loc[merges["cause"], "phase"]) == ["backward", "forward"]
    for n in merges["fix"]:
        row = s.row(n)
        assert s.made_by[int(row["cause"])] == "region kept contiguous"
        assert row["automatic"] and row["region"] == ("talking1", "talking2") and row["added_bytes"] == 0
        assert "made from no image, run contiguous" in row["detail"]
    verified = s.fixes.verify(s.model, *s.inputs, rounds=3, max_rounds=3, budget_s=1)
    table = verified.verification.set_index("fix")
    for n in merges["fix"]:
        proved = table.loc[n]
        assert proved["applied"] and proved["same_outputs"] and proved["hotspots_after"] == 0, proved["reason"]
        assert proved["contiguous_hotspots_after"] <= proved["contiguous_hotspots_before"]


@pytest.mark.fix_variant("the new tensor meets an image")
def test_the_new_tensor_meets_an_image():
    s = _suggested(Flow(meet="add"), torch.randn(2, 3, 8, 8))
    n, (candidate,) = _the_candidates(s, "the new tensor meets an image")
    line = "y = self.grid(B, H, W) + self.conv1(x)"
    assert candidate.label == f"the new tensor copied into the format of the image it meets in the add at {_at(Flow.forward, line)}"
    _exact(candidate.line, f"            {line}")
    _exact(candidate.suggestion, "            y = self.grid(B, H, W).contiguous(memory_format=torch.channels_last if "
                                 "(_image := self.conv1(x)).is_contiguous(memory_format=torch.channels_last) else "
                                 "torch.contiguous_format) + _image")
    _candidate_is_exact(s, n, candidate)


@pytest.mark.fix_variant("a chain read in memory order")
def test_a_chain_read_in_memory_order():
    """A candidate of the region fix of a reshape that merges C (pattern reshape_merge)."""
    s = _suggested(FoldOverStatements(), torch.randn(2, 3, 8, 12))
    n, (candidate,) = _the_candidates(s, "a chain read in memory order")
    assert s.row(n)["pattern"] == "reshape_merge" and s.made_by[int(s.row(n)["cause"])] == "region kept contiguous"
    assert candidate.label == "the 2 statements' reshapes and permutes reading the map in its memory order (NHWC)"
    _exact(candidate.line, "        x = x.reshape(B * C * nh, ph, nw, pw).transpose(1, 2)\n"
                           "        x = x.reshape(B, C, nh * nw, ph * pw).transpose(1, 3).reshape(B * ph * pw, nh * nw, -1)")
    _candidate_is_exact(s, n, candidate)
    _exact(candidate.suggestion,
           "        if x.is_contiguous(memory_format=torch.channels_last):\n"
           "            x = x.permute(0, 2, 3, 1).reshape(B, x.shape[2] // ph, ph, nw, pw, C)"
           ".permute(0, 2, 4, 1, 3, 5).reshape(B * ph * pw, nh * nw, C)\n"
           "        else:\n"
           "            x = x.reshape(B * C * nh, ph, nw, pw).transpose(1, 2)\n"
           "            x = x.reshape(B, C, nh * nw, ph * pw).transpose(1, 3).reshape(B * ph * pw, nh * nw, -1)")


# -- every declared fix has a test of its own; the registry binds them in the declared order ----------


def fix_variant_marks(source: str) -> dict[str, list[str]]:
    """Each test function of a module's ``source`` -> the names its ``fix_variant`` marks give."""
    marks: dict[str, list[str]] = {}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names = [call.args[0].value for d in node.decorator_list for call in ast.walk(d)
                     if isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
                     and call.func.attr == "fix_variant" and call.args and isinstance(call.args[0], ast.Constant)]
            if names:
                marks[node.name] = names
    return marks


def missing_and_unknown(declared: list[str], marks: dict[str, list[str]]) -> tuple[list[str], list[str], list[str]]:
    """(declared names no test is marked with, marks that name nothing declared, tests marked
    with more than one name: no test of their own)."""
    named = [name for names in marks.values() for name in names]
    return ([d for d in declared if d not in named], sorted({n for n in named if n not in declared}),
            sorted(test for test, names in marks.items() if len(names) > 1))


def test_every_declared_fix_has_a_test_of_its_own():
    declared = [d.name for d in _variants.GENERATORS + _variants.VARIANTS]
    assert len(declared) == len(set(declared)), "a name is declared twice"
    marks: dict[str, list[str]] = {}
    for path in sorted(TESTS.glob("test_*.py")):
        marks.update({f"{path.name}::{test}": names for test, names in fix_variant_marks(path.read_text()).items()})
    missing, unknown, shared = missing_and_unknown(declared, marks)
    assert not missing, f"declared fixes without a fast test of their own (mark one fix_variant(name)): {missing}"
    assert not unknown, f"fix_variant marks that name no declared fix: {unknown}"
    assert not shared, f"tests marked with more than one declared fix: {shared}"
    # the check itself: a module missing a name, and one naming what is not declared, are caught
    sample = ('@pytest.mark.fix_variant("explicit copy")\ndef test_a(): pass\n'
              '@pytest.mark.fix_variant("no such fix")\ndef test_b(): pass\n')
    assert missing_and_unknown(["explicit copy", "joins"], fix_variant_marks(sample))[:2] == (["joins"], ["no such fix"])


def test_the_registry_binds_every_declared_fix_in_the_declared_order(monkeypatch):
    _registry._load()  # raises naming any declared fix without code
    declared = _variants.GENERATORS + _variants.VARIANTS
    assert set(_registry._CODE) == {d.name for d in declared}
    name_of = {code: name for name, code in _registry._CODE.items()}
    for d in declared:
        assert _registry._CODE[d.name].__module__ == f"auditor._fix._generators.{d.family}", d
        for p in d.patterns:
            patterns.pattern(p)  # a pattern the analysis knows
    order = [d.name for d in _variants.GENERATORS]
    for p in patterns.PATTERNS:
        names = [name_of[code] for code in _registry.fix_generators(p)]
        assert names == [d.name for d in _variants.GENERATORS if p in d.patterns], p
        assert [order.index(x) for x in names] == sorted(order.index(x) for x in names)
    families = {p for d in _variants.VARIANTS for p in d.patterns}
    for family in families:
        found = [(d.name, name_of[code]) for d, code in _registry.variants(family)]
        assert found == [(d.name, d.name) for d in _variants.VARIANTS if family in d.patterns], family
    # a name declared without code, code under no declared name, or in another family, is refused
    with pytest.raises(KeyError, match="no fix is declared as 'undeclared'"):
        _registry.register_fix("undeclared")
    with pytest.raises(ValueError, match="is declared in _copies, not test_variants"):
        _registry.register_fix("explicit copy")(lambda c: None)
    extra = _variants.Declared("declared only", "_copies", ("explicit_copy",), "nothing")
    monkeypatch.setattr(_variants, "GENERATORS", _variants.GENERATORS + (extra,))
    with pytest.raises(RuntimeError, match="declared fixes without code: declared only"):
        _registry._load()


def test_the_docs_list_every_declared_fix_in_the_declared_order():
    """The cause patterns page holds the generated table of the fixes (docs/hooks.py), one row
    per declared fix, in the declared order."""
    import importlib.util

    root = TESTS.parent
    assert "<!-- generated: fixes -->" in (root / "docs" / "concepts" / "patterns.md").read_text()
    spec = importlib.util.spec_from_file_location("_docs_hooks", root / "docs" / "hooks.py")
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    rows = [line.split(" | ")[0].removeprefix("| ") for line in hooks.fixes_table().splitlines()[2:]]
    assert rows == [d.name for d in _variants.GENERATORS + _variants.VARIANTS]
