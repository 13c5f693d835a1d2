"""A split whose backward writes the gradient in the format of the tensor it split.

``torch.split`` and ``torch.chunk`` return views; their backward joins the parts' gradients with
one ``cat``, which writes the format its inputs share, and contiguous where they differ, or where a
part got no gradient (torch fills its zeros contiguous). The parts of a channels_last map split
along its channels are used in different ways (the query, key and value of an attention), so
their gradients come back in different orders, and the map's gradient is contiguous: the
convolution that made the map converts it. Written into one gradient laid out as the map was,
each part's gradient lands where its part was: the same values, in the map's format.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from .._recording._formats import channels_last_order
from ._convert import CHANNELS_LAST_OF_RANK


def _format_of(x: Tensor) -> torch.memory_format:
    """The memory format ``x`` is dense in (contiguous where it is none, or both)."""
    cl = CHANNELS_LAST_OF_RANK.get(x.dim())
    return cl if cl is not None and not x.is_contiguous() and x.is_contiguous(memory_format=cl) \
        else torch.contiguous_format


class _FormatKeepingSplit(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, sizes: tuple[int, ...], dim: int):
        ctx.set_materialize_grads(False)
        ctx.shape, ctx.sizes, ctx.dim = x.shape, sizes, dim
        ctx.format, ctx.options = _format_of(x), {"dtype": x.dtype, "device": x.device}
        return tuple(x.split(list(sizes), dim))

    @staticmethod
    def backward(ctx, *grads: Tensor | None):
        # the parts' gradients joined by one cat in the split tensor's memory order: each read
        # permuted into that order, the cat written contiguous there, permuted back
        rank = len(ctx.shape)
        order = channels_last_order(rank) if ctx.format is not torch.contiguous_format else tuple(range(rank))
        at = order.index(ctx.dim)
        parts = []
        for size, g in zip(ctx.sizes, grads):
            if g is None:
                shape = [ctx.shape[d] if d != ctx.dim else size for d in order]
                parts.append(torch.zeros(shape, **ctx.options))
            else:
                parts.append(g.permute(order))
        grad = torch.cat(parts, at).permute([order.index(d) for d in range(len(order))])
        return grad.contiguous(memory_format=ctx.format), None, None


def split(x: Tensor, split_size_or_sections: int | Sequence[int], dim: int = 0) -> tuple[Tensor, ...]:
    """``torch.split(x, split_size_or_sections, dim)`` whose backward writes ``x``'s gradient in
    ``x``'s memory format (a channels_last map's stays channels_last), where torch's writes it
    contiguous once the parts' gradients differ in order or one part is not used. The same views
    forward, the same values backward. Without a gradient to take, ``torch.split`` itself."""
    parts = x.split(split_size_or_sections, dim)
    if not (x.requires_grad and torch.is_grad_enabled()):
        return parts
    return _FormatKeepingSplit.apply(x, tuple(p.shape[dim] for p in parts), dim % x.dim())


def chunk(x: Tensor, chunks: int, dim: int = 0) -> tuple[Tensor, ...]:
    """``torch.chunk(x, chunks, dim)`` whose backward writes ``x``'s gradient in ``x``'s memory
    format, as :func:`split`."""
    parts = x.chunk(chunks, dim)
    if not (x.requires_grad and torch.is_grad_enabled()):
        return parts
    return _FormatKeepingSplit.apply(x, tuple(p.shape[dim] for p in parts), dim % x.dim())
