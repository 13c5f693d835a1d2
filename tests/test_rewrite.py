"""Rewrites of a cause's statement, generated from its syntax tree: each keeps the user's
formatting and comments, computes the same values (forward and gradients, exactly where the
rewrite is exact), and refuses a statement that does not have the shape it needs."""

from __future__ import annotations

import libcst as cst
import pytest
import torch
import torch.nn.functional as F

from auditor._fix._generators._copies import (
    flatten_in_memory_order,
    keep_format_in_copy,
    out_of_place,
)
from auditor._fix._generators._reductions import add_the_branches, broadcast_the_map, pool_by_sum
from auditor._fix._generators._shuffle import shuffle_by_torch, shuffle_temporaries
from auditor._fix._generators._slices import skip_the_whole_slice, split_the_channels
from auditor._fix._syntax import Facts, Refused, Statement, rewrite, statement_at

CL = torch.channels_last


def _new(text: str, fn, **facts) -> str:
    return rewrite(Statement("x.py", 1, text.count("\n"), text), [(fn, Facts(**facts))])


def _run(code: str, scope: dict) -> dict:
    scope = dict(scope)
    exec(compile(code.strip() if "\n" not in code.strip() else __import__("textwrap").dedent(code), "<rewrite>", "exec"),
         {"torch": torch, "F": F}, scope)
    return scope


def _same_math(old: str, new: str, inputs: dict, result: str, exact: bool):
    """Run both statements on the same inputs (leaf tensors that require grad): the result and
    every input's gradient agree, exactly where ``exact``."""
    outs = []
    for code in (old, new):
        leaves = {k: v.detach().clone().requires_grad_(v.is_floating_point()) if isinstance(v, torch.Tensor) else v
                  for k, v in inputs.items()}
        scope = _run(code, leaves)
        y = scope[result]
        y.backward(torch.ones_like(y))
        outs.append((y.detach(), {k: t.grad for k, t in leaves.items() if isinstance(t, torch.Tensor) and t.grad is not None},
                     y))
    (a, ga, _), (b, gb, y) = outs
    check = torch.equal if exact else lambda p, q: torch.allclose(p, q, rtol=1e-5, atol=1e-6)
    assert check(a, b) and ga.keys() == gb.keys() and all(check(ga[k], gb[k]) for k in ga)
    return y


def _image(*shape):
    return torch.randn(*shape).contiguous(memory_format=CL)


def test_a_mean_over_h_and_w_becomes_a_sum_divided_by_their_size_bit_for_bit():
    old = "        x_se = x.mean((2, 3), keepdim=True)  # squeeze\n"
    new = _new(old, pool_by_sum)
    assert new == "        x_se = x.sum((2, 3), keepdim=True) / (x.shape[2] * x.shape[3])  # squeeze\n"
    _same_math(old, new, {"x": _image(2, 8, 5, 5)}, "x_se", exact=True)
    assert _new("y = torch.mean(x, dim=[-2, -1])\n", pool_by_sum) == "y = x.sum([-2, -1]) / (x.shape[2] * x.shape[3])\n"
    assert _new("y = F.adaptive_avg_pool2d(t, 1)\n", pool_by_sum) == \
        "y = t.sum((2, 3), keepdim=True) / (t.shape[2] * t.shape[3])\n"


def test_a_mean_of_an_expression_reads_it_once():
    new = _new("        x = x.sum(1).mean((2, 3), keepdim=True)\n", pool_by_sum, taken=frozenset({"x", "_pooled"}))
    assert new == "        x = (_pooled2 := x.sum(1)).sum((2, 3), keepdim=True) / (_pooled2.shape[2] * _pooled2.shape[3])\n"


def test_a_reduction_over_the_stacked_dimension_becomes_the_sum_of_the_branches():
    old = "        x = torch.sum(x, dim=1)\n"
    new = _new(old, add_the_branches, dims=(1,))
    assert new == "        x = sum(x.unbind(1))\n"
    y = _same_math(old, new, {"x": torch.stack([_image(2, 8, 5, 5), _image(2, 8, 5, 5)], dim=1)}, "x", exact=True)
    assert y.is_contiguous(memory_format=CL)
    assert _new("        output = torch.stack(x).sum(dim=0)\n", add_the_branches, dims=(0,)) == "        output = sum(x)\n"
    with pytest.raises(Refused, match="no reduction over the stacked dimension"):
        _new("y = x.sum(2)\n", add_the_branches, dims=(1,))
    with pytest.raises(Refused, match="name sum is taken"):
        _new("y = x.sum(1)\n", add_the_branches, dims=(1,), taken=frozenset({"sum"}))


def test_two_rewrites_of_one_statement_compose_in_either_order():
    text = "        x = x.sum(1).mean((2, 3), keepdim=True)\n"
    st = Statement("x.py", 1, 1, text)
    a = rewrite(st, [(add_the_branches, Facts(dims=(1,))), (pool_by_sum, Facts())])
    b = rewrite(st, [(pool_by_sum, Facts()), (add_the_branches, Facts(dims=(1,)))])
    assert a == b == "        x = (_pooled := sum(x.unbind(1))).sum((2, 3), keepdim=True) / (_pooled.shape[2] * _pooled.shape[3])\n"
    stacked = torch.stack([_image(2, 4, 3, 3), _image(2, 4, 3, 3), _image(2, 4, 3, 3)], dim=1)
    _same_math(text, a, {"x": stacked}, "x", exact=False)


def test_slices_that_cut_the_channels_become_one_split():
    old = "        x = torch.cat([x[:, 0:self.in_channels] + shortcut, x[:, self.in_channels:]], dim=1)  # mix\n"
    new = _new(old, split_the_channels)
    assert new == ("        x_0, x_1 = x.split([self.in_channels, x.shape[1] - self.in_channels], dim=1)\n"
                   "        x = torch.cat([x_0 + shortcut, x_1], dim=1)  # mix\n")

    class Self:
        in_channels = 3
    _same_math(old, new, {"x": _image(2, 8, 4, 4), "shortcut": _image(2, 3, 4, 4), "self": Self()}, "x", exact=True)
    with pytest.raises(Refused, match="PyTorch's own backward"):
        _new("left = a[:, :8]\n", split_the_channels)
    with pytest.raises(Refused, match="no slice of the channels"):
        _new("a, b = x.chunk(2, dim=1)\n", split_the_channels)


def test_slices_on_consecutive_statements_become_one_split_before_the_first():
    old = "        a = x[:, :k]\n        b = x[:, k:] * 2\n"
    new = _new(old, split_the_channels)
    assert new == ("        x_0, x_1 = x.split([k, x.shape[1] - k], dim=1)\n"
                   "        a = x_0\n        b = x_1 * 2\n")
    _same_math(old, new, {"x": _image(2, 8, 4, 4), "k": 3}, "b", exact=True)
    # a statement that rebinds what the slices read cannot have them taken before it
    with pytest.raises(Refused, match="assign k"):
        _new("        k = 3\n        a = x[:, :k]\n        b = x[:, k:]\n", split_the_channels)
    with pytest.raises(Refused, match="assign x"):
        _new("        x = x[:, :4]\n        b = x[:, 4:]\n", split_the_channels)


def test_a_slice_of_the_leading_channels_is_skipped_when_it_keeps_them_all():
    old = "        y = out[:, :self.out_chs, :, :] * 2\n"
    new = _new(old, skip_the_whole_slice)
    assert new == "        y = (out if out.shape[1] == self.out_chs else out[:, :self.out_chs, :, :]) * 2\n"

    class Self:
        out_chs = 8
    for chs in (8, 5):  # keeps them all; keeps some, as before
        Self.out_chs = chs
        y = _same_math(old, new, {"out": _image(2, 8, 4, 4), "self": Self()}, "y", exact=True)
        assert y.shape[1] == chs
    with pytest.raises(Refused, match="leading channels"):
        _new("y = out[:, 2:5]\n", skip_the_whole_slice)


def test_an_in_place_op_on_a_name_goes_out_of_place():
    assert _new("        x += self.shortcut(s)  # residual\n", out_of_place) == "        x = x + self.shortcut(s)  # residual\n"
    assert _new("y.mul_(z)\n", out_of_place) == "y = y.mul(z)\n"
    with pytest.raises(Refused, match="not a name"):
        _new("x[:, :4] += y\n", out_of_place)


def test_a_copy_into_contiguous_order_asks_for_channels_last():
    assert _new("        xb = self.b(xb).contiguous()\n", keep_format_in_copy) == \
        "        xb = self.b(xb).contiguous(memory_format=torch.channels_last)\n"
    assert _new("y = x.to(memory_format=torch.contiguous_format)\n", keep_format_in_copy, cl="channels_last_3d",
                rank=5, torch="th") == "y = x.to(memory_format=th.channels_last_3d)\n"
    with pytest.raises(Refused, match="2 candidates for the copy"):
        _new("y = a.contiguous() + b.contiguous()\n", keep_format_in_copy)
    with pytest.raises(Refused, match="torch is not imported"):
        _new("y = a.contiguous()\n", keep_format_in_copy, torch=None)


def test_an_nc11_map_is_broadcast_instead_of_interpolated():
    old = '        return F.interpolate(x, size=size, mode="bilinear", align_corners=False)\n'
    new = _new(old, broadcast_the_map)
    follow = ("torch.channels_last if x.stride(1) == 1 and (x.shape[1] == 1 or x.stride(-1) > 1) "
              "else torch.contiguous_format")
    assert new == f"        return x.expand(-1, -1, *size).contiguous(memory_format={follow})\n"
    body = lambda code: code.strip().replace("return ", "y = ")  # noqa: E731
    # an N×C×1×1 map as a pool or convolution of a channels_last map lays it out: C innermost
    pooled = torch.randn(2, 1, 1, 8).permute(0, 3, 1, 2)
    y = _same_math(body(old), body(new), {"x": pooled, "size": (5, 6)}, "y", exact=False)
    assert y.is_contiguous(memory_format=CL) and not y.is_contiguous()
    # the same code run contiguous: the map's strides say so, and the broadcast stays contiguous, as
    # the interpolation's output was
    y = _same_math(body(old), body(new), {"x": torch.randn(2, 8, 1, 1), "size": (5, 6)}, "y", exact=False)
    assert y.is_contiguous() and not y.is_contiguous(memory_format=CL)
    assert _new("y = F.interpolate(p, (h, w))\n", broadcast_the_map) == \
        f"y = p.expand(-1, -1, h, w).contiguous(memory_format={follow.replace('x.', 'p.')})\n"
    with pytest.raises(Refused, match="no output size"):
        _new("y = F.interpolate(p, scale_factor=2)\n", broadcast_the_map)


def test_a_reshaped_weight_is_flattened_in_its_memory_order_and_keeps_its_comments():
    old = """        weight = F.batch_norm(
            self.weight.reshape(1, self.out_channels, -1),
            None,  # running_mean
            None,  # running_var
            training=True,
            momentum=0.,
            eps=1e-5,
        ).reshape_as(self.weight)
"""
    new = _new(old, flatten_in_memory_order)
    assert "(self.weight.permute(0, 2, 3, 1) if (_cl := self.weight.stride(1) == 1" in new
    assert "else self.weight).reshape(1, self.out_channels, -1)," in new
    assert "None,  # running_mean" in new and new.endswith(
        ").reshape(self.weight.permute(0, 2, 3, 1).shape if _cl else self.weight.shape)"
        ".permute((0, 3, 1, 2) if _cl else (0, 1, 2, 3))\n")

    for fmt, shape in ((CL, (6, 4, 3, 3)), (torch.contiguous_format, (6, 4, 3, 3)), (CL, (6, 4, 1, 1)),
                       (torch.contiguous_format, (6, 4, 1, 1)), (CL, (6, 1, 3, 3))):
        class Conv:
            out_channels = 6
            weight = torch.randn(*shape).contiguous(memory_format=fmt)
        scope = {"self": Conv()}
        a, b = (_run(code, scope)["weight"] for code in (old, new))
        torch.testing.assert_close(a, b)
        assert b.stride() == Conv.weight.stride(), (fmt, shape)  # its own layout kept: channels_last or contiguous


def test_a_statement_is_found_whole_and_a_compound_header_is_refused(tmp_path):
    path = tmp_path / "m.py"
    path.write_text("def f(x):\n    y = g(\n        x,\n    )  # call\n    if x.mean() > 0:\n        return y\n")
    st = statement_at(str(path), 3)
    assert (st.first, st.last) == (2, 4) and st.text.endswith("# call\n")
    with pytest.raises(Refused, match="compound statement"):
        statement_at(str(path), 5)


def test_a_channel_shuffle_written_inline_becomes_torchs_in_its_own_statement_only():
    """The shuffle between two convolutions, in one statement: that statement alone becomes one
    call of channel_shuffle, on the tensor it shuffled, with the groups as written (not ``self``,
    not the whole body)."""
    old = "        f = f.view(n, 2, c // 2, h, w).transpose(1, 2).contiguous().view(n, c, h, w)  # shuffle\n"
    new = _new(old, shuffle_by_torch)
    assert new == "        f = torch.nn.functional.channel_shuffle(f, 2)  # shuffle\n"
    f = _image(2, 8, 3, 5)
    y = _same_math(old, new, {"f": f, "n": 2, "c": 8, "h": 3, "w": 5}, "f", exact=True)
    assert y.is_contiguous(memory_format=CL)
    assert _new("y = torch.flatten(x.reshape(b, g, c // g, h, w).permute(0, 2, 1, 3, 4), 1, 2)\n",
                shuffle_by_torch, torch="th") == "y = th.nn.functional.channel_shuffle(x, g)\n"


def test_a_channel_shuffle_over_several_statements_becomes_one_and_a_return_of_it_joins():
    old = ("    x = x.view(batchsize, groups, channels_per_group, height, width)\n"
           "    # swap the groups\n"
           "    x = torch.transpose(x, 1, 2).contiguous()\n"
           "    x = x.view(batchsize, -1, height, width)\n")
    new = _new(old, shuffle_by_torch)
    assert new == "    x = torch.nn.functional.channel_shuffle(x, groups)\n"
    scope = {"x": _image(2, 6, 4, 4), "groups": 3, "batchsize": 2, "channels_per_group": 2, "height": 4, "width": 4}
    _same_math(old, new, scope, "x", exact=True)
    assert _new(old + "    return x\n", shuffle_by_torch) == "    return torch.nn.functional.channel_shuffle(x, groups)\n"
    two = "    s = t.view(n, g, c // g, h, w)\n    out = s.transpose(1, 2).reshape(n, c, h, w)\n"
    assert _new(two, shuffle_by_torch) == "    out = torch.nn.functional.channel_shuffle(t, g)\n"
    assert shuffle_temporaries(cst.parse_module("if True:\n" + two)) == {"s"}


@pytest.mark.parametrize("text", [
    # a convolution before the shuffle, in the span: not the shuffle's, never dropped
    "    f = self.a(x)\n    f = f.view(n, 2, c // 2, h, w).transpose(1, 2).contiguous().view(n, c, h, w)\n",
    # a statement after it that is not the shuffle's
    "    f = f.view(n, 2, c // 2, h, w).transpose(1, 2).contiguous().view(n, c, h, w)\n    return self.b(f)\n",
    # the transpose of other dimensions: no shuffle
    "    f = f.view(n, 2, c // 2, h, w).transpose(2, 3).contiguous().view(n, c, h, w)\n",
    # not merged back
    "    f = f.view(n, 2, c // 2, h, w).transpose(1, 2).contiguous()\n",
    # merged into another rank
    "    f = f.view(n, 2, c // 2, h, w).transpose(1, 2).contiguous().view(n, c, h * w)\n",
    # a view of a contiguous-made copy that was not transposed
    "    f = f.view(n, 2, c // 2, h, w).contiguous().view(n, c, h, w)\n",
])
def test_statements_that_are_not_exactly_a_channel_shuffle_are_refused(text):
    with pytest.raises(Refused):
        _new(text, shuffle_by_torch)
