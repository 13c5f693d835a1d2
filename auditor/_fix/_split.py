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

_DENSE = (torch.contiguous_format, torch.channels_last, torch.channels_last_3d)


def _format_of(x: Tensor) -> torch.memory_format:
    """The memory format ``x`` is dense in (contiguous where it is none, or more than one)."""
    if x.is_contiguous():
        return torch.contiguous_format
    rank = {torch.channels_last: 4, torch.channels_last_3d: 5}
    return next((f for f in _DENSE[1:] if x.dim() == rank[f] and x.is_contiguous(memory_format=f)),
                torch.contiguous_format)


#: a dense format -> the order of a tensor's dimensions in memory, outermost first
_MEMORY_ORDER = {torch.contiguous_format: None, torch.channels_last: (0, 2, 3, 1), torch.channels_last_3d: (0, 2, 3, 4, 1)}


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
        order = _MEMORY_ORDER[ctx.format] or tuple(range(len(ctx.shape)))
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
