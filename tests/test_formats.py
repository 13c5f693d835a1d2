"""Format labels agree with torch's own contiguity checks, on the edge cases and at random."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from auditor._recording import _formats as formats
from auditor._recording._formats import format_label, is_dense, nbytes, physical_order

CL, CL3 = torch.channels_last, torch.channels_last_3d


def label(t: torch.Tensor) -> str:
    return format_label(tuple(t.shape), t.stride())


@pytest.mark.parametrize(
    "shape, expected",
    [
        ((2, 1, 4, 4), "ambiguous"),  # N1HW
        ((2, 3, 1, 1), "ambiguous"),  # NC11
        ((2, 1, 1, 1), "ambiguous"),  # N111
        ((1, 1, 1, 1), "ambiguous"),
        ((2, 3, 4, 4), "channels_last"),
        ((0, 3, 4, 4), "ambiguous"),  # zero-size: contiguous in every format for torch
        ((2, 0, 4, 4), "ambiguous"),
    ],
)
def test_channels_last_edge_cases(shape, expected):
    assert label(torch.empty(shape).to(memory_format=CL)) == expected


def test_contiguous_and_rank():
    assert label(torch.empty(2, 3, 4, 4)) == "contiguous"
    assert label(torch.empty(2, 3, 4)) == "-"
    assert label(torch.empty(())) == "-"
    assert label(torch.empty(2, 3, 4, 4, 4, 4)) == "-"


def test_5d():
    assert label(torch.empty(2, 3, 4, 4, 4).to(memory_format=CL3)) == "channels_last_3d"
    assert label(torch.empty(2, 3, 4, 4, 4)) == "contiguous"
    assert label(torch.empty(2, 1, 4, 4, 4).to(memory_format=CL3)) == "ambiguous"


def test_non_dense_views_say_so():
    x = torch.empty(2, 8, 4, 4).to(memory_format=CL)
    assert label(x[:, :3]) == "channels_last_view"  # slice along C
    assert label(torch.empty(2, 8, 4, 4)[:1]) == "contiguous"  # a slice along N stays dense
    assert label(torch.empty(2, 8, 4, 4)[:, :3]) == "contiguous_view"
    assert label(torch.empty(2, 8, 4, 4)[:, :, :2]) == "contiguous_view"
    assert label(torch.empty(2, 3, 4, 4, 4).to(memory_format=CL3)[:, :2]) == "channels_last_3d_view"
    expanded = torch.empty(2, 3, 1, 1).expand(2, 3, 4, 4)
    assert label(expanded) == "ambiguous_view"  # broadcast dims carry no order
    assert not is_dense(tuple(expanded.shape), expanded.stride())


def test_other_layouts():
    x = torch.empty(2, 3, 4, 5).permute(0, 1, 3, 2)  # dense, NCWH
    assert label(x) == "other"
    assert is_dense(tuple(x.shape), x.stride())


def test_physical_order_and_bytes():
    x = torch.empty(2, 3, 4, 5).to(memory_format=CL)
    assert physical_order(tuple(x.shape), x.stride()) == (0, 2, 3, 1)
    assert nbytes((2, 3, 4, 5), 4) == 480
    assert nbytes((0, 3), 4) == 0


dims = st.integers(min_value=0, max_value=4).map(lambda k: [1, 1, 2, 3, 5][k])


@settings(max_examples=400, deadline=None)
@given(
    shape=st.lists(dims, min_size=4, max_size=5),
    perm=st.permutations(range(5)),
    slice_c=st.booleans(),
)
def test_labels_agree_with_torch(shape, perm, slice_c):
    """Random shapes (size-1 dims included) under random stride permutations, optionally
    sliced along C: our label must follow torch's is_contiguous in every format."""
    ndim = len(shape)
    order = [p for p in perm if p < ndim]
    base = torch.empty([shape[d] for d in order]).permute(*[order.index(d) for d in range(ndim)])
    assert tuple(base.shape) == tuple(shape)
    t = base[:, : max(1, shape[1] - 1)] if slice_c else base
    got = label(t)
    cl_format = CL if ndim == 4 else CL3
    is_c = t.is_contiguous()
    is_cl = t.is_contiguous(memory_format=cl_format)
    cl_name = "channels_last" if ndim == 4 else "channels_last_3d"
    if is_c and is_cl:
        assert got == "ambiguous"
    elif is_c:
        assert got == "contiguous"
    elif is_cl:
        assert got == cl_name
    else:
        assert got not in ("contiguous", "ambiguous", cl_name)
        prims = torch._prims_common  # the helper was renamed after torch 2.8
        dense = getattr(prims, "is_non_overlapping_and_dense_or_false", None) or prims.is_non_overlapping_and_dense
        dense = dense(t)
        assert is_dense(tuple(t.shape), t.stride()) == dense
        if dense:
            assert got == "other"
        else:
            assert got.endswith("_view") or got == "other"


def _follow(x: torch.Tensor, y: torch.Tensor, cdim: int = 1) -> int | None:
    return formats.channel_dim(tuple(x.shape), x.stride(), cdim, tuple(y.shape), y.stride(), True)


@pytest.mark.parametrize("hw", [(1, 1), (4, 4), (1, 4)])
def test_channels_are_followed_through_views(hw):
    """A view keeps the channels where their stride and size went, including an N x C x 1 x 1
    image, whose size-1 dimensions share the channels' stride."""
    x = torch.randn(2, 8, *hw).contiguous(memory_format=torch.channels_last)
    assert _follow(x, x.permute(0, 2, 3, 1)) == 3
    assert _follow(x.permute(0, 2, 3, 1), x.permute(0, 2, 3, 1).permute(0, 3, 1, 2), cdim=3) == 1
    assert _follow(x, x.transpose(2, 3)) == 1
    assert _follow(x, x[:, 2:5]) == 1  # sliced along the channels
    assert _follow(x, x[:, :1]) == 1  # down to one channel
    assert _follow(x, x.expand(2, 8, *hw)) == 1


@pytest.mark.parametrize("memory_format", [torch.channels_last, torch.contiguous_format])
def test_a_view_that_retiles_the_image_holds_no_channels(memory_format):
    """A same-rank view keeps the image only if each of its other dimensions steps through a
    distinct dimension of the image (a permutation, a slice, a strided slice, an expand): one
    that folds H and W into (tokens, pixels in a patch), or batch with channel groups, holds
    tokens, however many patches the input size makes (one patch viewed back as (B, C, N, P)
    has the strides of the image)."""
    x = torch.randn(2, 8, 2, 2).contiguous(memory_format=memory_format)
    assert _follow(x, x.view(2, 8, 2, 2)) == 1
    assert _follow(x, x[:, :, ::2, :]) == 1  # strided slice
    assert _follow(x, x.permute(0, 2, 3, 1)) == 3
    if memory_format == torch.contiguous_format:
        assert _follow(x, x.view(2, 8, 1, 4)) is None  # one 2 x 2 patch: (B, C, N = 1, P = 4)
        assert _follow(x, x.view(4, 4, 2, 2)) is None  # batch merged with channel groups
    halo = torch.randn(2, 8, 8, 8)  # one 8 x 8 block: (B * heads, dim, pixels, blocks) by strides
    assert _follow(halo, halo.as_strided((2, 8, 64, 1), (512, 64, 1, 8))) is None
