"""A chain of reshapes and permutes over statements, as one permutation of factors (issue 28:
tokens folded into a map over several statements). The rewrite is written in the source's own
size expressions, so it must hold at sizes other than the recorded ones."""

import math

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from auditor._fix import _chain


def mobilevit_fold(B, C, nph, npw, ph, pw):
    """MobileViT's fold, as steps with the recorded sizes and the sizes as written."""
    P, N = ph * pw, nph * npw
    return (B * P, N, C), [
        ("reshape", (B, P, N, C), ["B", "patch_area", "num_patches", None]),
        ("transpose", 1, 3),
        ("reshape", (B * C * nph, npw, ph, pw), ["B * C * num_patch_h", "num_patch_w", "patch_h", "patch_w"]),
        ("transpose", 1, 2),
        ("reshape", (B, C, nph * ph, npw * pw), ["B", "C", "num_patch_h * patch_h", "num_patch_w * patch_w"]),
    ]


def halo_fold(B, h, dv, nh, nw, bs):
    """HaloNet's fold of the product (B·heads, blocks, bs², dv), the last view's channels -1."""
    return (B * h, nh * nw, bs * bs, dv), [
        ("transpose", 1, 3),
        ("reshape", (B * h * dv, bs, bs, nh, nw), [None, "bs", "bs", "num_h_blocks", "num_w_blocks"]),
        ("permute", (0, 3, 1, 4, 2)),
        ("reshape", (B, h * dv, nh * bs, nw * bs), ["B", None, "H // stride", "W // stride"]),
    ]


def _run(x, steps):
    for s in steps:
        x = x.reshape(s[1]) if s[0] == "reshape" else x.permute(s[1]) if s[0] == "permute" else x.transpose(s[1], s[2])
    return x


@pytest.mark.parametrize("fold, built, others", [
    (mobilevit_fold, (2, 5, 4, 3, 2, 2), [(3, 7, 2, 5, 3, 2), (1, 4, 3, 3, 2, 4)]),
    (halo_fold, (2, 3, 7, 4, 5, 2), [(3, 2, 5, 3, 2, 4), (1, 4, 3, 2, 6, 3)]),
])
def test_the_fold_gathered_in_nhwc_order_is_the_same_map_at_every_size(fold, built, others):
    shape, steps = fold(*built)
    chain = _chain.build("x", shape, steps)
    assert _chain.gathers_the_same(shape, steps, chain)
    text = _chain.nhwc_text(chain)
    assert text.startswith("x.reshape(") and text.endswith(".permute(0, 3, 1, 2)")
    for sizes in others:  # the text names sizes, so it holds where they differ from the recorded ones
        shape, steps = fold(*sizes)
        if fold is mobilevit_fold:
            B, C, nph, npw, ph, pw = sizes
            names = dict(B=B, C=C, num_patch_h=nph, num_patch_w=npw, patch_h=ph, patch_w=pw,
                         patch_area=ph * pw, num_patches=nph * npw)
        else:
            B, h, dv, nh, nw, bs = sizes
            names = dict(B=B, bs=bs, num_h_blocks=nh, num_w_blocks=nw, H=2 * nh * bs, W=2 * nw * bs, stride=2)
        x = torch.randn(shape)
        got = eval(text, {}, {**names, "x": x})
        assert torch.equal(got, _run(x, steps))
        assert got.is_contiguous(memory_format=torch.channels_last)


def test_a_reshape_that_cuts_a_size_into_no_factors_of_it_is_no_permutation():
    with pytest.raises(_chain.NotAPermutation, match="no factors"):
        _chain.build("x", (2, 6, 4), [("reshape", (2, 4, 6), [None, None, None])])


def mobilevit_unfold(B, C, nph, npw, ph, pw):
    """MobileViT's unfold of a map (B, C, H, W) into patches of tokens (B·P, N, C)."""
    return (B, C, nph * ph, npw * pw), [
        ("reshape", (B * C * nph, ph, npw, pw), ["B * C * num_patch_h", "patch_h", "num_patch_w", "patch_w"]),
        ("transpose", 1, 2),
        ("reshape", (B, C, nph * npw, ph * pw), ["B", "C", "num_patches", "patch_area"]),
        ("transpose", 1, 3),
        ("reshape", (B * ph * pw, nph * npw, C), ["B * patch_area", "num_patches", None]),
    ]


def test_the_unfold_reads_a_channels_last_map_in_its_memory_order_at_every_size():
    """The text reads the map permuted to NHWC, a view of channels_last memory, and makes the
    tokens the chain made, at sizes other than the recorded ones."""
    shape, steps = mobilevit_unfold(2, 5, 4, 3, 2, 2)
    chain = _chain.build("x", shape, steps)
    assert _chain.splits_the_same(shape, steps, chain)
    text = _chain.split_text(chain, 4)
    assert text.startswith("x.permute(0, 2, 3, 1).reshape(B, ")
    for sizes in [(3, 7, 2, 5, 3, 2), (1, 4, 3, 3, 2, 4)]:
        B, C, nph, npw, ph, pw = sizes
        shape, steps = mobilevit_unfold(*sizes)
        x = torch.randn(shape).contiguous(memory_format=torch.channels_last)
        names = dict(B=B, C=C, num_patch_h=nph, num_patch_w=npw, patch_h=ph, patch_w=pw,
                     patch_area=ph * pw, num_patches=nph * npw, x=x)
        assert torch.equal(eval(text, {}, names), _run(x, steps))


@st.composite
def chains(draw):
    """A map (B, C, H, W) or (B, C, T, H, W) and 1–5 random steps: permutes, transposes, and
    reshapes that merge two neighbouring dimensions or split one at a divisor, each size written
    as a literal or left to the chain (-1)."""
    rank = draw(st.sampled_from([4, 5]))
    shape = draw(st.lists(st.sampled_from([1, 2, 3, 4, 6]), min_size=rank, max_size=rank)
                 .filter(lambda s: math.prod(s) > 1))
    sizes, steps = list(shape), []
    for _ in range(draw(st.integers(1, 5))):
        kind = draw(st.sampled_from(["permute", "transpose", "merge", "split"] if len(sizes) >= 2 else ["split"]))
        if kind == "permute":
            order = draw(st.permutations(range(len(sizes))))
            steps.append(("permute", tuple(order)))
            sizes = [sizes[i] for i in order]
        elif kind == "transpose":
            a, b = draw(st.lists(st.integers(0, len(sizes) - 1), min_size=2, max_size=2, unique=True))
            steps.append(("transpose", a, b))
            sizes[a], sizes[b] = sizes[b], sizes[a]
        else:
            if kind == "merge" and len(sizes) >= 2:
                i = draw(st.integers(0, len(sizes) - 2))
                sizes[i:i + 2] = [sizes[i] * sizes[i + 1]]
            else:
                i = draw(st.integers(0, len(sizes) - 1))
                a = draw(st.sampled_from([d for d in range(1, sizes[i] + 1) if sizes[i] % d == 0]))
                sizes[i:i + 1] = [a, sizes[i] // a]
            exprs = [draw(st.sampled_from([str(v), None])) for v in sizes]
            steps.append(("reshape", tuple(sizes), exprs))
    return tuple(shape), steps


def _memory_format(rank):
    return {4: torch.channels_last, 5: torch.channels_last_3d}.get(rank)


@settings(max_examples=300, deadline=None)
@given(chains())
def test_every_chain_of_factors_is_gathered_and_read_in_nhwc_order_exactly(case):
    """The algebra over random chains, not only the folds the engine met: wherever a chain is
    one permutation of its input's factors, the one-copy gather in NHWC order puts every element
    where the steps put it, and so does the NHWC read of the input. Where the gather copies (a
    reshape that cannot view), its copy is written in NHWC order: a channels_last view of it."""
    shape, steps = case
    try:
        chain = _chain.build("x", shape, steps)
    except _chain.NotAPermutation:
        assume(False)
    x = torch.randn(shape)
    want = _run(x, steps)
    assert chain.shape() == tuple(want.shape)
    assume(want.dim() >= 3)
    assert _chain.gathers_the_same(shape, steps, chain)
    got = eval(_chain.nhwc_text(chain), {}, {"x": x})
    assert torch.equal(got, want)
    copied = got.untyped_storage().data_ptr() != x.untyped_storage().data_ptr()
    if copied and _memory_format(got.dim()) is not None:
        assert got.is_contiguous(memory_format=_memory_format(got.dim()))
    assert _chain.splits_the_same(shape, steps, chain)
    read = eval(_chain.split_text(chain, len(shape)), {}, {"x": x.contiguous(memory_format=_memory_format(len(shape)))})
    assert torch.equal(read, want)


@settings(max_examples=300, deadline=None)
@given(chains())
def test_every_chain_from_a_map_to_a_map_is_read_and_gathered_in_nhwc_order_exactly(case):
    """Where a chain makes a map of its input's rank (windows cut from a map, or put back), the
    input read in NHWC order and the result gathered in NHWC order put every element where the
    steps put it; from a channels_last input, a result that was copied is channels_last (its
    gradient's format is proved on a model: tests/test_variants.py)."""
    shape, steps = case
    try:
        chain = _chain.build("x", shape, steps)
    except _chain.NotAPermutation:
        assume(False)
    fmt = _memory_format(len(shape))
    x = torch.randn(shape).contiguous(memory_format=fmt)
    want = _run(x, steps)
    assume(want.dim() == len(shape))
    assert _chain.maps_the_same(shape, steps, chain)
    got = eval(_chain.map_to_map_text(chain), {}, {"x": x})
    assert torch.equal(got, want)
    if got.untyped_storage().data_ptr() != x.untyped_storage().data_ptr():
        assert got.is_contiguous(memory_format=fmt)
