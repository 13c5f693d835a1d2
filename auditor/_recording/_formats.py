"""Pure functions from (shape, strides) to memory-format labels, physical order and bytes.

Nothing here touches a tensor: the recorder stores raw shapes and strides on its hot path and
the log labels them once, at the end. The contiguity rules are torch's own (size-1 dimensions
do not constrain strides, zero-size tensors are contiguous in every format), so the labels agree
with ``Tensor.is_contiguous(memory_format=...)``; the property test in ``tests/`` checks that.

Labels (the docs' "The words" page):

``contiguous``, ``channels_last``, ``channels_last_3d``
    dense, and contiguous in exactly that one format.
``ambiguous``
    contiguous in both (N1HW, NC11, N111, zero-size): no format is lost or gained.
``contiguous_view``, ``channels_last_view``, ``channels_last_3d_view``, ``ambiguous_view``
    not dense (a slice along C, an expand), labelled by the order of its strides.
``other``
    any other 4-D or 5-D layout.
``-``
    a tensor of another rank, or one without strides (sparse, nested, mkldnn: the recorder
    gives those no strides, ``()``).
"""

from __future__ import annotations

from functools import lru_cache

CONTIGUOUS = "contiguous"
CHANNELS_LAST = "channels_last"
CHANNELS_LAST_3D = "channels_last_3d"
AMBIGUOUS = "ambiguous"
OTHER = "other"
NOT_APPLICABLE = "-"
VIEW_SUFFIX = "_view"

#: Every label this module can return, in a stable order (used for categoricals).
LABELS = (
    CONTIGUOUS,
    CHANNELS_LAST,
    CHANNELS_LAST_3D,
    AMBIGUOUS,
    CONTIGUOUS + VIEW_SUFFIX,
    CHANNELS_LAST + VIEW_SUFFIX,
    CHANNELS_LAST_3D + VIEW_SUFFIX,
    AMBIGUOUS + VIEW_SUFFIX,
    OTHER,
    NOT_APPLICABLE,
)

#: Physical dimension order, outermost first, of each format for 4-D and 5-D tensors.
_ORDERS = {
    4: {CONTIGUOUS: (0, 1, 2, 3), CHANNELS_LAST: (0, 2, 3, 1)},
    5: {CONTIGUOUS: (0, 1, 2, 3, 4), CHANNELS_LAST_3D: (0, 2, 3, 4, 1)},
}


def _contiguous_in_order(shape: tuple[int, ...], strides: tuple[int, ...], order) -> bool:
    """torch's contiguity rule for one physical order (``order`` is outermost first).

    Mirrors c10's ``compute_contiguous`` / ``compute_channels_last_contiguous_2d``: size-1
    dimensions are skipped, every other stride must equal the product of the sizes inside it.
    """
    expected = 1
    for d in reversed(order):
        size = shape[d]
        if size == 1:
            continue
        if strides[d] != expected:
            return False
        expected *= size
    return True


def _order_consistent(shape, strides, order) -> bool:
    """Whether the strides never increase from the outermost to the innermost dim of ``order``.

    Dimensions of size 1 and broadcast (stride 0) dimensions say nothing about the order and
    are ignored, so an expanded NC11 is consistent with any order.
    """
    previous = None
    for d in order:
        if shape[d] == 1 or strides[d] == 0:
            continue
        if previous is not None and strides[d] > previous:
            return False
        previous = strides[d]
    return True


def has_strides(shape: tuple[int, ...], strides: tuple[int, ...]) -> bool:
    """Whether a recorded layout has strides: a tensor without them (sparse, nested, mkldnn) is
    recorded with none, ``()``, whatever its rank."""
    return len(strides) == len(shape)


@lru_cache(maxsize=65536)
def format_label(shape: tuple[int, ...], strides: tuple[int, ...]) -> str:
    """The memory-format label of a tensor with this shape and these strides."""
    ndim = len(shape)
    orders = _ORDERS.get(ndim)
    if orders is None or len(strides) != ndim:
        return NOT_APPLICABLE
    cl_name = CHANNELS_LAST if ndim == 4 else CHANNELS_LAST_3D
    if 0 in shape:
        # torch calls a zero-size tensor contiguous in every format: nothing can be lost.
        return AMBIGUOUS
    is_c = _contiguous_in_order(shape, strides, orders[CONTIGUOUS])
    is_cl = _contiguous_in_order(shape, strides, orders[cl_name])
    if is_c and is_cl:
        return AMBIGUOUS
    if is_c:
        return CONTIGUOUS
    if is_cl:
        return cl_name
    if is_dense(shape, strides):
        return OTHER
    c_order = _order_consistent(shape, strides, orders[CONTIGUOUS])
    cl_order = _order_consistent(shape, strides, orders[cl_name])
    if c_order and cl_order:
        return AMBIGUOUS + VIEW_SUFFIX
    if c_order:
        return CONTIGUOUS + VIEW_SUFFIX
    if cl_order:
        return cl_name + VIEW_SUFFIX
    return OTHER


def is_dense(shape: tuple[int, ...], strides: tuple[int, ...]) -> bool:
    """Non-overlapping and dense: the elements fill one block of memory with no gaps or repeats.

    Same rule as ``torch._prims_common.is_non_overlapping_and_dense``, on plain tuples.
    """
    if 0 in shape:
        return True
    expected = 1
    for stride, size in sorted((st, s) for s, st in zip(shape, strides) if s != 1):
        if stride != expected:
            return False
        expected *= size
    return True


def base_format(label: str) -> str:
    """The label without its ``_view`` suffix: the format a copy of this tensor would keep."""
    return label[: -len(VIEW_SUFFIX)] if label.endswith(VIEW_SUFFIX) else label


def channels_last_order(rank: int) -> tuple[int, ...]:
    """The dims of a 4-D or 5-D tensor in channels_last(_3d) memory order, outermost first:
    ``x.permute(*channels_last_order(x.dim()))`` of a channels_last tensor is contiguous."""
    return (0, *range(2, rank), 1)


def logical_order(rank: int) -> tuple[int, ...]:
    """The permutation that undoes :func:`channels_last_order`."""
    return (0, rank - 1, *range(1, rank - 1))


def physical_order(shape: tuple[int, ...], strides: tuple[int, ...]) -> tuple[int, ...]:
    """Dimensions from outermost to innermost in memory: largest stride first, ties by index."""
    return tuple(sorted(range(len(shape)), key=lambda d: (-strides[d], d)))


def nbytes(shape: tuple[int, ...], itemsize: int) -> int:
    """Bytes of the tensor's elements (numel × element size), the unit of every cost we report."""
    n = 1
    for s in shape:
        n *= s
    return n * itemsize


def channel_label(shape: tuple[int, ...], strides: tuple[int, ...], cdim: int, rank: int | None = None) -> str:
    """The format label of an image of ``rank`` dimensions (4 or 5; default: the tensor's
    own) whose channels now run along dimension ``cdim``: the label of its batch, channel and
    spatial dimensions (the last ``rank - 2`` others), any other dimension left out. An NHWC
    view of a channels_last image is channels_last; so is each image of a (N, branches, C, H,
    W) stack of them (as a view: the branches interleave), and a channels_last image whose H
    and W were swapped: what matters is whether the channels are innermost."""
    rank = rank or len(shape)
    if len(strides) != len(shape):
        return NOT_APPLICABLE
    if not 0 < cdim < len(shape) or len(shape) < rank:
        return OTHER
    spatial = [d for d in range(1, len(shape)) if d != cdim][-(rank - 2):]
    keep = [0, cdim, *spatial]
    sizes, steps = tuple(shape[d] for d in keep), tuple(strides[d] for d in keep)
    label = format_label(sizes, steps)
    if base_format(label) != OTHER:
        return label
    # channels innermost (or outermost) with the spatial dimensions in another order
    moving = [(steps[i], sizes[i]) for i in range(1, len(keep)) if sizes[i] != 1 and steps[i] != 0]
    if len(moving) < 2 or sizes[1] == 1:
        return label
    suffix = "" if is_dense(sizes, steps) else VIEW_SUFFIX
    if steps[1] == min(s for s, _ in moving):
        return (CHANNELS_LAST if rank == 4 else CHANNELS_LAST_3D) + suffix
    if steps[1] == max(s for s, _ in moving):
        return CONTIGUOUS + suffix
    return label


def channel_dim(shape_in: tuple[int, ...], strides_in: tuple[int, ...], cdim: int,
                shape_out: tuple[int, ...], strides_out: tuple[int, ...], is_view: bool) -> int | None:
    """Where the channels of an image (along ``cdim``) run in a tensor computed or viewed from
    it, or None when the result no longer has them along one dimension (a reshape that merges
    them with H and W, a reduction over them).

    Same rank: a computed result keeps ``cdim`` (pooling, interpolation, a cat); a view keeps
    the dimension whose stride is still the channels' (a slice, an expand, a permutation), as
    long as it re-tiles none of the image's other dimensions (:func:`_tiles_image`): a view
    that folds H and W into (patches, pixels in a patch), or batch and channels into one
    dimension, holds tokens, not an image, however many tiles the input size makes.
    One dimension more or less: a dimension inserted or removed beside the channels
    (unsqueeze, stack, a reduction over a stacked dimension), or the channels split into
    (groups, channels) or merged back, as a channel shuffle does.
    """
    n_in, n_out = len(shape_in), len(shape_out)
    if not 0 <= cdim < n_in or len(strides_in) != n_in or len(strides_out) != n_out:
        return None  # no channels to follow into or out of a tensor without strides
    if n_out == n_in:
        if not is_view or shape_in[cdim] == 1:
            return cdim
        found = _same_rank_view(shape_in, strides_in, cdim, shape_out, strides_out)
        if found is None or not _tiles_image(shape_in, strides_in, cdim, shape_out, strides_out, found):
            return None
        return found
    if n_out == n_in + 1:
        for p in [p for p in range(n_out) if p != cdim] + [cdim]:  # prefer a dimension beside C
            if shape_out[:p] + shape_out[p + 1:] == shape_in:
                return cdim + (p <= cdim)
        d = cdim
        if (d + 1 < n_out and shape_out[d] * shape_out[d + 1] == shape_in[d]
                and shape_out[:d] + shape_out[d + 2:] == shape_in[:d] + shape_in[d + 1:]):
            # the channels split into (groups, channels per group): follow the inner part
            if is_view and strides_out[d] == strides_in[d]:
                return d
            return d + 1
        return None
    if n_out == n_in - 1:
        for p in [p for p in range(n_in) if p != cdim]:
            if shape_in[:p] + shape_in[p + 1:] == shape_out:
                return cdim - (p < cdim)
        for d in (cdim - 1, cdim):
            if (0 <= d and d + 1 < n_in and shape_in[d] * shape_in[d + 1] == shape_out[d]
                    and shape_in[:d] + shape_in[d + 2:] == shape_out[:d] + shape_out[d + 1:]):
                return d  # (groups, channels per group) merged back into the channels
        return None
    return None


def _same_rank_view(shape_in, strides_in, cdim, shape_out, strides_out) -> int | None:
    """Where a same-rank view of an image has its channels: the dimension with their stride."""
    kept = strides_out[cdim] == strides_in[cdim]
    if kept and (shape_out[cdim] == shape_in[cdim] or shape_out[cdim] > 1):
        return cdim  # in place, or sliced along the channels
    # the channels' stride and size elsewhere: moved by a permutation, even where a size-1
    # dimension that took their place has their stride too (an N x C x 1 x 1 image's NHWC view)
    moved = [d for d in range(len(shape_out)) if strides_out[d] == strides_in[cdim] and shape_out[d] == shape_in[cdim]]
    if moved:
        return moved[0]
    return cdim if kept else None  # sliced down to one channel


def _tiles_image(shape_in, strides_in, cdim_in, shape_out, strides_out, cdim_out) -> bool:
    """Whether a same-rank view keeps the image's dimensions: every dimension of the view other
    than the channels' (of size > 1, not broadcast) steps through a distinct non-channel
    dimension of the image, with its stride or a multiple of it, and stays inside it (a
    permutation, a slice, a strided slice, an expand). A view that folds H and W into
    (patches, pixels) or batch and channel groups into one dimension does not."""
    used = set()
    for j in range(len(shape_out)):
        if j == cdim_out or shape_out[j] == 1 or strides_out[j] == 0:
            continue
        # a dimension with the same stride first, then any whose stride divides it
        candidates = sorted(range(len(shape_in)), key=lambda d: strides_in[d] != strides_out[j])
        for d in candidates:
            if d == cdim_in or d in used or shape_in[d] == 1 or strides_in[d] <= 0:
                continue
            step, rest = divmod(strides_out[j], strides_in[d])
            if not rest and step > 0 and (shape_out[j] - 1) * step < shape_in[d]:
                used.add(d)
                break
        else:
            return False
    return True
