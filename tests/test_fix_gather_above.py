"""Windows gathered back into a map in NHWC order, in the format of the map the calling module was
given (issue 38, item 4: a format signal where no convolution weight is in reach)."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn

import auditor

pytest.importorskip("libcst")

CL = torch.channels_last


def _rewrite(change, text: str) -> str:
    from auditor._fix import _syntax as rw

    return rw.rewrite(rw.Statement("f.py", 1, 1, text), [(change, rw.Facts())])


def test_the_format_of_the_map_is_read_before_the_first_statement():
    from auditor._fix._generators._gather_above import format_read_before

    assert _rewrite(format_read_before("_format", "x"), "        g = self.g  # grid\n") == (
        "        _format = torch.channels_last if x.is_contiguous(memory_format=torch.channels_last) and not "
        "x.is_contiguous() else torch.contiguous_format\n"
        "        g = self.g  # grid\n")


def test_the_call_of_the_gathering_module_is_made_in_that_format():
    from auditor._fix import _syntax as rw
    from auditor._fix._generators._gather_above import call_made_in

    assert _rewrite(call_made_in("departition", "_format"), "    x = self.departition(x, self.p, g, g)\n") == (
        "    x = self.departition(x, self.p, g, g).contiguous(memory_format=_format)\n")
    with pytest.raises(rw.Refused):  # another object's attribute is not the module's own
        _rewrite(call_made_in("departition", "_format"), "    x = other.departition(x)\n")


# -- a window attention, written as the model writes it ---------------------------------------------


class WindowPartition(nn.Module):
    def forward(self, x, p):
        B, C, H, W = x.shape
        P = p
        x = x.reshape(B, C, H // P, P, W // P, P)
        x = x.permute(0, 2, 4, 3, 5, 1)
        x = x.reshape(B, (H // P) * (W // P), P * P, C)
        return x


class WindowDepartition(nn.Module):
    def forward(self, x, p, h_partitions, w_partitions):
        B, G, PP, C = x.shape
        P = p
        HP, WP = h_partitions, w_partitions
        x = x.reshape(B, HP, WP, P, P, C)
        x = x.permute(0, 5, 1, 3, 2, 4)
        x = x.reshape(B, C, HP * P, WP * P)
        return x


class WindowAttention(nn.Module):
    def __init__(self, c, p, size):
        super().__init__()
        self.p, self.g = p, size // p
        self.partition_op = WindowPartition()
        self.departition_op = WindowDepartition()
        self.mlp = nn.Sequential(nn.LayerNorm(c), nn.Linear(c, c))

    def forward(self, x):
        """Windows of the map, an MLP over each token, and the map back."""
        g = self.g
        x = self.partition_op(x, self.p)
        x = x + self.mlp(x)
        x = self.departition_op(x, self.p, g, g)
        return x


class Net(nn.Module):
    """Convolutions and window attentions in Sequentials: no convolution weight is in reach of
    the gathering module's method, nor of the attention's."""

    def __init__(self, c=8, size=8):
        super().__init__()
        self.stem = nn.Conv2d(3, c, 3, padding=1)
        self.blocks = nn.Sequential(*(nn.Sequential(nn.Conv2d(c, c, 3, padding=1), nn.BatchNorm2d(c),
                                                    WindowAttention(c, 4, size)) for _ in range(2)))
        self.head = nn.Conv2d(c, c, 1)

    def forward(self, x):
        return self.head(self.blocks(self.stem(x)))


def _values(model, x):
    x = x.detach().clone().requires_grad_()
    out = model(x)
    out.square().sum().backward()
    return out.detach(), x.grad, {n: p.grad for n, p in model.named_parameters()}


@pytest.mark.fix_variant("windows gathered in the caller's format")
def test_the_gather_follows_the_map_the_caller_was_given_and_verify_proves_it():
    torch.manual_seed(0)
    model = Net().to(memory_format=CL)
    x = torch.randn(2, 3, 8, 8).to(memory_format=CL)
    fixes = auditor.suggest_fixes(auditor.audit(model, x))
    frame = fixes.frame
    assert len(frame) == 1 and frame["pattern"].iloc[0] == "joins" and not frame["automatic"].iloc[0]
    n = int(frame["fix"].iloc[0])
    candidates = fixes._proposals[n].candidates
    assert [c.label.split(",")[0] for c in candidates] == ["the map gathered in NHWC order",
                                                          "the map gathered in NHWC order (channels permuted last)"]
    assert "in the format of x, the map blocks.0.2 was given" in candidates[0].label
    assert candidates[0].line == "        x = x.permute(0, 5, 1, 3, 2, 4)\n        x = x.reshape(B, C, HP * P, WP * P)"
    assert candidates[0].suggestion.splitlines()[:2] == ["x = x.permute(0, 1, 3, 2, 4, 5)",
                                                         "x = x.reshape(B, HP * P, WP * P, C).permute(0, 3, 1, 2)"]
    assert candidates[0].suggestion.splitlines()[3:] == [
        "_format = torch.channels_last if x.is_contiguous(memory_format=torch.channels_last) and not "
        "x.is_contiguous() else torch.contiguous_format",
        "g = self.g", candidates[0].suggestion.splitlines()[5],
        "x = self.departition_op(x, self.p, g, g).contiguous(memory_format=_format)"]

    fixes = fixes.verify(model, x, rounds=3, max_rounds=3, budget_s=2)
    table = fixes.verification
    fix = table[(table["kind"] == "fix") & (table["fix"] == n)].iloc[0]
    assert fix["applied"] and fix["same_outputs"], fix["reason"]
    assert fix["hotspots_before"] > 0 and fix["hotspots_after"] == 0
    assert fix["contiguous_hotspots_after"] <= fix["contiguous_hotspots_before"]
    assert "proved" in fix["reason"] and candidates[0].label in fix["reason"]
    assert fixes.frame.set_index("fix").loc[n, "automatic"]

    # the same values and gradients in float64 in both formats; the attention's map out in the
    # format its map came in
    for fmt in (CL, torch.contiguous_format):
        plain = copy.deepcopy(model).double().to(memory_format=fmt)
        fixed = copy.deepcopy(plain)
        xd = x.double().contiguous(memory_format=fmt)
        before = _values(plain, xd)
        fixes.apply(fixed, fixes=[n])
        try:
            after = _values(fixed, xd)
            y = fixed.blocks[0][2](torch.randn(2, 8, 8, 8, dtype=torch.float64).contiguous(memory_format=fmt))
        finally:
            fixes.undo()
        torch.testing.assert_close(after[0], before[0], rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(after[1], before[1], rtol=1e-12, atol=1e-12)
        for name, grad in before[2].items():
            torch.testing.assert_close(after[2][name], grad, rtol=1e-12, atol=1e-12)
        assert y.is_contiguous(memory_format=fmt)


class NormFirst(nn.Module):
    """Blocks that norm their map first: the next block's batch norm reads the map the window
    attention gathered, and is where that map joins the path (its own cause)."""

    def __init__(self, c=8, size=8):
        super().__init__()
        self.stem = nn.Conv2d(3, c, 3, padding=1)
        self.blocks = nn.Sequential(*(nn.Sequential(nn.BatchNorm2d(c), nn.Conv2d(c, c, 3, padding=1),
                                                    WindowAttention(c, 4, size)) for _ in range(2)))
        self.head = nn.Conv2d(c, c, 1)

    def forward(self, x):
        return self.head(self.blocks(self.stem(x)))


@pytest.mark.fix_variant("gathered upstream")
def test_an_op_that_reads_the_gathered_map_gets_the_gather_s_candidate_and_verify_proves_it():
    torch.manual_seed(0)
    model = NormFirst().to(memory_format=CL)
    x = torch.randn(2, 3, 8, 8).to(memory_format=CL)
    fixes = auditor.suggest_fixes(auditor.audit(model, x))
    frame = fixes.frame
    norm = frame[frame["op"] == "aten.native_batch_norm.default"]
    assert len(norm) == 1 and norm["pattern"].iloc[0] == "joins"
    n = int(norm["fix"].iloc[0])
    gather = int(frame[(frame["op"] == "aten.clone.default")
                       & frame["line"].str.contains("permute(0, 5, 1, 3, 2, 4)", regex=False)]["fix"].iloc[0])
    (candidate,) = fixes._proposals[n].candidates
    assert candidate.label.endswith(f": {fixes._proposals[gather].candidates[0].label}")  # and says where
    assert "where the map it reads was gathered, at" in norm["reason"].iloc[0]
    fixes = fixes.verify(model, x, rounds=3, max_rounds=3, budget_s=2)
    table = fixes.verification
    rows = table[table["kind"] == "fix"].set_index("fix")
    for k in (n, gather):
        assert rows.loc[k, "applied"] and rows.loc[k, "same_outputs"], rows.loc[k, "reason"]
        assert rows.loc[k, "hotspots_before"] > 0 and rows.loc[k, "hotspots_after"] == 0
        assert rows.loc[k, "contiguous_hotspots_after"] <= rows.loc[k, "contiguous_hotspots_before"]
    every = table[table["kind"] == "all"].iloc[0]
    assert every["applied"] and every["same_outputs"] and every["hotspots_after"] == 0
    # both fixes make the same three edits: the patch has each once
    patch = fixes.patch([n, gather])
    assert patch.count("+        _format = ") == 1 and patch.count(".contiguous(memory_format=_format)") == 1
