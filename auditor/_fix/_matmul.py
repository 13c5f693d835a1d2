"""A matrix product whose backward writes each gradient in the memory order of its input.

``torch.matmul``'s backward writes ``grad @ b.mT`` and ``a.mT @ grad`` row-major, whatever order
``a`` and ``b`` are in. A map's (B, C, H·W) view of a channels_last (B, C, H, W) map is a
transposed matrix (its rows are the NHWC view's columns), so a product of two such views (a
correlation ``fmap1.mT @ fmap2``) gets one gradient in the wrong order, and the map's gradient is
contiguous. Written as the transpose of the transposed product, ``(grad.mT @ a).mT``, the same
products (the same FLOPs) write it in the input's order; the gradient of the map is channels_last.
"""

from __future__ import annotations

import torch
from torch import Tensor


def _transposed(x: Tensor) -> bool:
    """Whether ``x``'s last two dimensions are stored column-major (rows contiguous along dim -2)."""
    return x.dim() >= 2 and x.stride(-2) == 1 and x.stride(-1) != 1 and x.shape[-2] > 1


def _product_in_order_of(x: Tensor, y: Tensor, like: Tensor) -> Tensor:
    """``x @ y``, written column-major where ``like`` is stored so: the same product."""
    if _transposed(like):
        return torch.matmul(y.mT, x.mT).mT
    return torch.matmul(x, y)


class _OrderKeepingMatmul(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a: Tensor, b: Tensor) -> Tensor:
        ctx.save_for_backward(a, b)
        return torch.matmul(a, b)

    @staticmethod
    def backward(ctx, grad: Tensor):
        a, b = ctx.saved_tensors
        ga = _product_in_order_of(grad, b.mT, a) if ctx.needs_input_grad[0] else None
        gb = _product_in_order_of(a.mT, grad, b) if ctx.needs_input_grad[1] else None
        return ga, gb


def matmul(a: Tensor, b: Tensor) -> Tensor:
    """``torch.matmul(a, b)`` whose backward writes each gradient in the memory order of its
    input: a (B, C, H·W) view of a channels_last map gets its gradient in that order, so the
    map's gradient is channels_last, where ``torch.matmul`` writes one of them contiguous. The
    same values and the same products (forward and backward). Inputs of other ranks than 2 or
    3 alike, or whose batch dimensions broadcast, go to ``torch.matmul`` itself."""
    if a.dim() != b.dim() or a.dim() not in (2, 3) or a.shape[:-2] != b.shape[:-2] \
            or not (a.requires_grad or b.requires_grad) or not torch.is_grad_enabled():
        return torch.matmul(a, b)
    return _OrderKeepingMatmul.apply(a, b)
