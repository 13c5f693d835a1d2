"""Pure functions from (shape, strides) to memory-format labels, physical order and bytes.

Nothing here touches a tensor: the recorder stores raw shapes and strides on its hot path and
the log labels them once, at the end. The contiguity rules are torch's own (size-1 dimensions
do not constrain strides, zero-size tensors are contiguous in every format), so the labels agree
with ``Tensor.is_contiguous(memory_format=...)``; the property test in ``tests/`` checks that.

Labels (see ``../shared/design.md`` and the README):

``contiguous``, ``channels_last``, ``channels_last_3d``
    dense, and contiguous in exactly that one format.
``ambiguous``
    contiguous in both (N1HW, NC11, N111, zero-size): no format is lost or gained.
``contiguous_view``, ``channels_last_view``, ``channels_last_3d_view``, ``ambiguous_view``
    not dense (a slice along C, an expand), labelled by the order of its strides.
``other``
    any other 4-D or 5-D layout.
``-``
    a tensor of another rank.
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


@lru_cache(maxsize=65536)
def format_label(shape: tuple[int, ...], strides: tuple[int, ...]) -> str:
    """The memory-format label of a tensor with this shape and these strides."""
    ndim = len(shape)
    orders = _ORDERS.get(ndim)
    if orders is None:
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


def physical_order(shape: tuple[int, ...], strides: tuple[int, ...]) -> tuple[int, ...]:
    """Dimensions from outermost to innermost in memory: largest stride first, ties by index."""
    return tuple(sorted(range(len(shape)), key=lambda d: (-strides[d], d)))


def nbytes(shape: tuple[int, ...], itemsize: int) -> int:
    """Bytes of the tensor's elements (numel × element size), the unit of every cost we report."""
    n = 1
    for s in shape:
        n *= s
    return n * itemsize
