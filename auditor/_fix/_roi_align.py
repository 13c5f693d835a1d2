"""``roi_align`` that keeps channels_last: torchvision's RoI Align written in plain PyTorch on the
NHWC view of its input, as one ``embedding_bag``.

torchvision's CPU and CUDA kernels copy their input to contiguous and write their output and
the input's gradient in NCHW. Each output value of RoI Align is a weighted sum of input pixels
(the four corners of each bilinear sample, averaged over the bin's samples), the same weights
for every channel. On the NHWC view the pixels are the rows of an (N·H·W, C) table, so the whole
op is ``F.embedding_bag`` over that table: one bag per output bin, the corners as indices, the
bilinear weights over the sample count as per-sample weights. Its output is (bins, C), the NHWC
order of a channels_last (K, C, PH, PW) map; its backward scatters into a (N·H·W, C) gradient,
channels_last again. The sample positions, their validity and the bilinear weights follow
torchvision's kernel (``roi_align_kernel.cpp``) step by step, so the values agree to rounding.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def _pair(size) -> tuple[int, int]:
    if isinstance(size, (tuple, list)):
        if len(size) == 1:
            return int(size[0]), int(size[0])
        return int(size[0]), int(size[1])
    return int(size), int(size)


def boxes_as_rois(boxes: Tensor | list[Tensor] | tuple[Tensor, ...]) -> Tensor:
    """``boxes`` as torchvision takes them (a Tensor[K, 5] of (batch index, x1, y1, x2, y2), or
    one Tensor[L, 4] per image) as a Tensor[K, 5]."""
    if isinstance(boxes, Tensor):
        if boxes.dim() != 2 or boxes.shape[1] != 5:
            raise ValueError(f"boxes as a Tensor must be [K, 5], not {list(boxes.shape)}")
        return boxes
    parts = list(boxes)
    for b in parts:
        if b.dim() != 2 or b.shape[1] != 4:
            raise ValueError(f"each image's boxes must be [L, 4], not {list(b.shape)}")
    if not parts:
        raise ValueError("boxes is an empty list")
    cat = torch.cat(parts, dim=0)
    index = torch.cat([torch.full_like(b[:, :1], i) for i, b in enumerate(parts)], dim=0)
    return torch.cat([index, cat], dim=1)


def _is_channels_last(x: Tensor) -> bool:
    """Strided channels_last and not also contiguous (a map in both formats is left to the op)."""
    return x.dim() == 4 and x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous()


def _native(input: Tensor, rois: Tensor, spatial_scale: float, ph: int, pw: int, sampling_ratio: int,
            aligned: bool) -> Tensor | None:
    """torchvision's own op, where it is loaded (None where it is not)."""
    try:
        op = torch.ops.torchvision.roi_align
    except (AttributeError, RuntimeError):
        return None
    return op(input, rois, spatial_scale, ph, pw, sampling_ratio, aligned)


def _axis(start: Tensor, bin_size: Tensor, grid: Tensor, bins: int, most: int, size: int):
    """Along one axis (height or width): for each RoI, bin and sample, the two pixels a bilinear
    sample reads and their weights, 0 for a sample outside the map or past the RoI's grid.
    Shapes [K, bins, most, 2]. As torchvision's ``pre_calc``: a sample below -1 or above
    ``size`` reads nothing, one below 0 reads pixel 0, one at or past the last pixel reads it
    alone."""
    dtype = start.dtype
    b = torch.arange(bins, device=start.device, dtype=dtype)
    s = torch.arange(most, device=start.device, dtype=dtype)
    g = grid.clamp(min=1).to(dtype)
    pos = (start[:, None, None] + b[None, :, None] * bin_size[:, None, None]
           + (s[None, None, :] + 0.5) * bin_size[:, None, None] / g[:, None, None])  # [K, bins, most]
    inside = (pos >= -1.0) & (pos <= size)
    inside &= (torch.arange(most, device=start.device)[None, None, :] < grid[:, None, None])
    pos = pos.clamp(min=0)
    low = pos.to(torch.long)
    last = low >= size - 1
    low = torch.where(last, torch.full_like(low, size - 1), low)
    high = torch.where(last, low, low + 1)
    pos = torch.where(last, low.to(dtype), pos)
    frac = pos - low.to(dtype)
    weights = torch.stack([1.0 - frac, frac], dim=-1) * inside[..., None].to(dtype)
    return torch.stack([low, high], dim=-1), weights


def roi_align(input: Tensor, boxes: Tensor | list[Tensor], output_size, spatial_scale: float = 1.0,
              sampling_ratio: int = -1, aligned: bool = False) -> Tensor:
    """``torchvision.ops.roi_align`` that keeps channels_last: for a channels_last ``input`` the
    output (K, C, PH, PW) and the gradient of ``input`` are channels_last, where torchvision's
    kernels write both contiguous. Same arguments and values (to rounding; no gradient for the
    boxes, as torchvision). An input in another format (contiguous, or both formats at once)
    goes to torchvision's own op where it is loaded.

    Computed as one ``F.embedding_bag`` over the (N·H·W, C) NHWC view of ``input``: one bag per
    output bin holding the four pixels of each bilinear sample, weighted by the bilinear weights
    over the bin's sample count. Memory: 4 indices and weights per sample of the largest RoI's
    grid (``sampling_ratio`` squared, or the adaptive grid of the largest RoI), per bin."""
    rois = boxes_as_rois(boxes)
    ph, pw = _pair(output_size)
    if not _is_channels_last(input):
        done = _native(input, rois, spatial_scale, ph, pw, sampling_ratio, aligned)
        if done is not None:
            return done
    if input.dim() != 4:
        raise ValueError(f"roi_align takes an input [N, C, H, W], not {list(input.shape)}")
    n, c, h, w = input.shape
    dtype = input.dtype
    with torch.no_grad():
        r = rois.detach().to(dtype)
        offset = 0.5 if aligned else 0.0
        x1 = r[:, 1] * spatial_scale - offset
        y1 = r[:, 2] * spatial_scale - offset
        x2 = r[:, 3] * spatial_scale - offset
        y2 = r[:, 4] * spatial_scale - offset
        roi_w, roi_h = x2 - x1, y2 - y1
        if not aligned:
            roi_w, roi_h = roi_w.clamp(min=1.0), roi_h.clamp(min=1.0)
        bin_h, bin_w = roi_h / ph, roi_w / pw
        if sampling_ratio > 0:
            grid_h = torch.full_like(roi_h, sampling_ratio, dtype=torch.long)
            grid_w = torch.full_like(roi_w, sampling_ratio, dtype=torch.long)
        else:
            grid_h, grid_w = torch.ceil(roi_h / ph).to(torch.long), torch.ceil(roi_w / pw).to(torch.long)
        most_h = max(int(grid_h.max()), 1) if len(r) else 1
        most_w = max(int(grid_w.max()), 1) if len(r) else 1
        count = (grid_h * grid_w).clamp(min=1).to(dtype)
        rows, wy = _axis(y1, bin_h, grid_h, ph, most_h, h)  # [K, PH, GH, 2]
        cols, wx = _axis(x1, bin_w, grid_w, pw, most_w, w)  # [K, PW, GW, 2]
        image = r[:, 0].to(torch.long) * (h * w)
        # [K, PH, PW, GH, GW, 2 rows, 2 cols]
        index = (image[:, None, None, None, None, None, None]
                 + rows[:, :, None, :, None, :, None] * w + cols[:, None, :, None, :, None, :])
        weight = (wy[:, :, None, :, None, :, None] * wx[:, None, :, None, :, None, :]
                  / count[:, None, None, None, None, None, None])
        k = len(r)
        index = index.reshape(k * ph * pw, most_h * most_w * 4)
        weight = weight.reshape(k * ph * pw, most_h * most_w * 4)
    table = input.permute(0, 2, 3, 1).reshape(n * h * w, c)
    out = F.embedding_bag(index, table, per_sample_weights=weight, mode="sum")
    out = out.view(k, ph, pw, c).permute(0, 3, 1, 2)
    return out if _is_channels_last(input) or c == 1 else out.contiguous()


def roi_align_loses_format(device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32) -> tuple[bool, bool]:
    """(forward, backward): whether torchvision's loaded ``roi_align`` writes its output, and the
    gradient of its input, in another format than a channels_last input's, asked of the running
    torch on ``device`` in ``dtype`` with one tiny map and one box. (False, False) where the op
    is not loaded (nothing to replace)."""
    try:
        op = torch.ops.torchvision.roi_align
    except (AttributeError, RuntimeError):
        return False, False
    x = torch.rand(1, 3, 5, 5, device=device, dtype=dtype).to(memory_format=torch.channels_last)
    x.requires_grad_(True)
    rois = torch.tensor([[0.0, 0.5, 0.5, 3.5, 3.0]], device=device, dtype=dtype)
    y = op(x, rois, 1.0, 2, 2, 2, False)
    forward = not _is_channels_last(y)
    g = torch.ones_like(y).contiguous(memory_format=torch.channels_last)
    (grad,) = torch.autograd.grad(y, x, g)
    return forward, not _is_channels_last(grad)


__all__ = ["boxes_as_rois", "roi_align", "roi_align_loses_format"]
