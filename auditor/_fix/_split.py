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


class _FormatKeepingSplit(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, sizes: tuple[int, ...], dim: int):
        ctx.set_materialize_grads(False)
        ctx.shape, ctx.sizes, ctx.dim = x.shape, sizes, dim
        ctx.options = {"dtype": x.dtype, "device": x.device, "memory_format": _format_of(x)}
        return tuple(x.split(list(sizes), dim))

    @staticmethod
    def backward(ctx, *grads: Tensor | None):
        grad = torch.empty(ctx.shape, **ctx.options)
        start = 0
        for size, g in zip(ctx.sizes, grads):
            part = grad.narrow(ctx.dim, start, size)
            if g is None:
                part.zero_()
            else:
                part.copy_(g)
            start += size
        return grad, None, None


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
