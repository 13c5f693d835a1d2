"""A group norm of a (B, C, L) view of a channels_last map, run on its (B, C, 1, L) view where the
input's own strides put its channels innermost (issue 38, item 8): torch writes the norm's output
and its input's gradient contiguous for the 3-D view, and channels_last for the 4-D one."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn

import auditor

pytest.importorskip("libcst")

CL = torch.channels_last


def _rewrite(text: str, taken=frozenset()) -> str:
    from auditor._fix import _syntax as rw
    from auditor._fix._generators._norm_view import norm_on_4d_view

    return rw.rewrite(rw.Statement("f.py", 1, 1, text), [(norm_on_4d_view(), rw.Facts(taken=taken))])


@pytest.mark.parametrize("text, expected", [
    ("    h = attn.group_norm(h.transpose(1, 2)).transpose(1, 2)\n",
     "    h = (attn.group_norm(_x.unsqueeze(2)).squeeze(2) if (_x := h.transpose(1, 2)).stride(1) == 1 "
     "else attn.group_norm(_x)).transpose(1, 2)\n"),
    ("y = self.norm(x)  # tokens\n",
     "y = (self.norm(x.unsqueeze(2)).squeeze(2) if x.stride(1) == 1 else self.norm(x))  # tokens\n"),
    ("y = F.group_norm(x.view(b, c, -1), 4, w, eps=1e-6)\n",
     "y = (F.group_norm(_x.unsqueeze(2), 4, w, eps=1e-6).squeeze(2) if (_x := x.view(b, c, -1)).stride(1) == 1 "
     "else F.group_norm(_x, 4, w, eps=1e-6))\n"),
])
def test_the_norm_call_runs_on_the_4d_view_where_the_channels_are_innermost(text, expected):
    assert _rewrite(text) == expected


def test_a_taken_name_is_not_shadowed():
    assert "(_x2 := a + b)" in _rewrite("y = norm(a + b)\n", taken=frozenset({"_x"}))


@pytest.mark.parametrize("text", ["y = x.transpose(1, 2)\n", "y = norm(a) + norm(b)\n", "y = norm(*xs)\n"])
def test_a_statement_without_one_norm_call_is_refused(text):
    from auditor._fix import _syntax as rw

    with pytest.raises(rw.Refused):
        _rewrite(text)


# -- a model that norms the tokens of a map, as an attention block writes it --------------------------


class Attention(nn.Module):
    def __init__(self, c=8):
        super().__init__()
        self.group_norm = nn.GroupNorm(4, c)
        self.to_q = nn.Linear(c, c)

    def forward(self, hidden_states):
        batch_size, channel, height, width = hidden_states.shape
        hidden_states = hidden_states.view(batch_size, channel, height * width).transpose(1, 2)
        hidden_states = self.group_norm(hidden_states.transpose(1, 2)).transpose(1, 2)
        hidden_states = self.to_q(hidden_states)
        return hidden_states.transpose(-1, -2).reshape(batch_size, channel, height, width)


class Net(nn.Module):
    def __init__(self, c=8):
        super().__init__()
        self.a = nn.Conv2d(3, c, 3, padding=1)
        self.attn = Attention(c)
        self.b = nn.Conv2d(c, c, 3, padding=1)

    def forward(self, x):
        return self.b(self.attn(self.a(x)))


_LINE = "        hidden_states = self.group_norm(hidden_states.transpose(1, 2)).transpose(1, 2)"


def _values(model, x):
    x = x.detach().clone().requires_grad_()
    out = model(x)
    out.square().sum().backward()
    return out.detach(), x.grad, {n: p.grad for n, p in model.named_parameters()}


@pytest.mark.fix_variant("group norm on the (B, C, 1, L) view")
def test_the_engine_runs_the_norm_on_the_4d_view_and_verify_proves_it():
    torch.manual_seed(0)
    model = Net().to(memory_format=CL)
    x = torch.randn(2, 3, 8, 8).to(memory_format=CL)
    audit = auditor.audit(model, x)
    causes = audit.causes()
    assert list(causes["op"]) == ["aten.native_group_norm_backward.default"]
    fixes = auditor.suggest_fixes(audit)
    row = fixes.frame.iloc[0]
    assert row["automatic"] and row["line"] == _LINE
    assert row["suggestion"] == (
        "        hidden_states = (self.group_norm(_x.unsqueeze(2)).squeeze(2) if (_x := hidden_states.transpose(1, 2))"
        ".stride(1) == 1 else self.group_norm(_x)).transpose(1, 2)")
    n = int(row["fix"])
    fixes = fixes.verify(model, x, rounds=3, max_rounds=3, budget_s=2)
    table = fixes.verification
    fix = table[(table["kind"] == "fix") & (table["fix"] == n)].iloc[0]
    assert fix["applied"] and fix["same_outputs"], fix["reason"]
    assert fix["hotspots_before"] > 0 and fix["hotspots_after"] == 0
    assert fix["contiguous_hotspots_after"] <= fix["contiguous_hotspots_before"]

    # the same values and gradients in float64, channels_last and contiguous; the input's
    # gradient in the format of the input
    for fmt in (CL, torch.contiguous_format):
        plain = copy.deepcopy(model).double().to(memory_format=fmt)
        fixed = copy.deepcopy(plain)
        xd = x.double().contiguous(memory_format=fmt)
        before = _values(plain, xd)
        fixes.apply(fixed, fixes=[n])
        try:
            after = _values(fixed, xd)
            h = torch.randn(2, 8, 4, 4, dtype=torch.float64).contiguous(memory_format=fmt).requires_grad_()
            g, = torch.autograd.grad(fixed.attn(h).sum(), h)
        finally:
            fixes.undo()
        torch.testing.assert_close(after[0], before[0], rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(after[1], before[1], rtol=1e-12, atol=1e-12)
        for name, grad in before[2].items():
            torch.testing.assert_close(after[2][name], grad, rtol=1e-12, atol=1e-12)
        assert g.is_contiguous(memory_format=fmt)


def test_a_norm_of_tokens_laid_out_contiguous_gets_no_fix():
    """The same norm of a (B, C, L) tensor whose positions are innermost (a contiguous map's
    view) in a model that runs channels_last elsewhere: its strides give no channels_last view,
    so the fix is not offered for it."""
    from auditor._fix._generators._norm_view import _channels_innermost

    assert _channels_innermost((2, 8, 16), (128, 1, 8))
    assert not _channels_innermost((2, 8, 16), (128, 16, 1))  # contiguous
    assert not _channels_innermost((2, 1, 16), (16, 16, 1))  # one channel: both orders
    assert not _channels_innermost((2, 8, 1), (8, 1, 8))  # one position: both orders
    assert not _channels_innermost((2, 8, 4, 4), (128, 1, 32, 8))  # a map has its own format
