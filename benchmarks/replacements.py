"""What each format-keeping replacement of ``auditor.keep_format`` costs against the native op, forward and backward.

    flock /tmp/bench.lock env OMP_NUM_THREADS=1 .venv/bin/python benchmarks/replacements.py [--rounds 9] [--cases ...] [--sizes small realistic]

Each replacement and the op it replaces, on the same channels_last inputs (random, float32), at
a small size and a realistic one, timed interleaved in one process at one thread, process CPU
time (``auditor.steady_malloc()`` first): the forward alone (no gradients), and the backward
alone (``torch.autograd.grad`` of one recorded forward, its graph kept). Printed: each one's
median time, the replacement's paired ratio to the native op with the 95% interval of that
median, and the format of the output and of the input's gradient each writes.

- ``roi_align`` against ``torchvision.ops.roi_align``: small, a 2x256x16x16 map and 64 RoIs per
  image; realistic, the stride-4 FPN level of two 800x1088 images (2x256x200x272, spatial scale
  1/4) with 512 RoIs per image, 7x7 bins, sampling ratio 2 (torchvision's R-CNN box head).
- ``matmul`` against ``torch.matmul``, as RAFT's correlation ``fmap1.mT @ fmap2`` of two maps'
  (B, C, H·W) views: small, 2x64x16x16 maps; realistic, RAFT's 1/8 feature maps of a 440x1024
  frame pair (1x256x55x128).
- ``chunk`` against ``torch.chunk``, a map cut into 3 parts along its channels, the query, key
  and value of an attention's weights, whose gradients come back in different orders (the
  product's backward writes the key's row-major): small, 2x48x16x16; realistic, 4x768x16x16
  (256 channels each). Both compute the same product; the times differ by the split's
  backward alone, which writes the map's gradient contiguous (torch) or channels_last.
- ``conv1d`` (``auditor.keep_format`` of an ``nn.Conv1d``) against the ``nn.Conv1d``, a 1x1
  projection of a map's flattened positions (a (N, C, H·W) view, channels innermost) to 3C
  channels, made a map again for a channels_last depthwise 3x3 convolution (EfficientViM's
  state-space mixer): small, 2x64x16x16; realistic, 16x128x14x14. Both include the depthwise
  convolution, which converts the Conv1d's contiguous output to channels_last (and its
  gradient back) where the replacement's output is in the format already.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch

import auditor
from auditor._measure._harness import time_interleaved

CL = torch.channels_last
SIZES = ("small", "realistic")


def parse(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    p.add_argument("--sizes", nargs="+", default=list(SIZES), choices=SIZES)
    p.add_argument("--rounds", type=int, default=9, help="interleaved timed rounds (at least 4)")
    args = p.parse_args(argv)
    if args.rounds < 4:
        p.error("--rounds must be at least 4")
    return args


def _boxes(n: int, per_image: int, height: int, width: int) -> torch.Tensor:
    """``per_image`` boxes per image in image pixels, 16 to 400 pixels a side, some past the edge."""
    g = torch.Generator().manual_seed(0)
    k = n * per_image
    size = 16 + torch.rand(k, 2, generator=g) * 384
    corner = torch.rand(k, 2, generator=g) * torch.tensor([width, height]) - 8
    index = torch.arange(n).repeat_interleave(per_image)[:, None].float()
    return torch.cat([index, corner, corner + size], dim=1)


def roi_align_case(size: str):
    import torchvision

    if size == "small":
        n, c, h, w, per_image, scale = 2, 256, 16, 16, 64, 1.0
        image = (h, w)
    else:
        n, c, h, w, per_image, scale = 2, 256, 200, 272, 512, 0.25
        image = (800, 1088)
    torch.manual_seed(0)
    x = torch.randn(n, c, h, w).to(memory_format=CL)
    boxes = _boxes(n, per_image, *image)

    def native(t):
        return torchvision.ops.roi_align(t, boxes, 7, scale, 2)

    def replaced(t):
        return auditor.keep_format.roi_align(t, boxes, 7, scale, 2)

    return (f"{n}x{c}x{h}x{w}, {per_image} RoIs per image", x, (x,), native, replaced,
            "torchvision.ops.roi_align")


def matmul_case(size: str):
    b, c, h, w = (2, 64, 16, 16) if size == "small" else (1, 256, 55, 128)
    torch.manual_seed(0)
    f1 = torch.randn(b, c, h, w).to(memory_format=CL)
    f2 = torch.randn(b, c, h, w).to(memory_format=CL)

    def views(x, y):
        return x.view(b, c, h * w).transpose(1, 2), y.view(b, c, h * w)

    return (f"2 maps {b}x{c}x{h}x{w}", f1, (f1, f2), lambda x, y: torch.matmul(*views(x, y)),
            lambda x, y: auditor.keep_format.matmul(*views(x, y)), "torch.matmul")


def chunk_case(size: str):
    b, c, h, w = (2, 48, 16, 16) if size == "small" else (4, 768, 16, 16)
    torch.manual_seed(0)
    x = torch.randn(b, c, h, w).to(memory_format=CL)

    def used(q, k, v):  # an attention's weights: the product's backward writes q's and k's gradients row-major
        weights = torch.matmul(q.flatten(2).mT, k.flatten(2)).softmax(-1).mean(-1)
        return v * weights.view(b, 1, h, w)

    return (f"a {b}x{c}x{h}x{w} map in 3 parts", x, (x,), lambda t: used(*torch.chunk(t, 3, dim=1)),
            lambda t: used(*auditor.keep_format.chunk(t, 3, dim=1)), "torch.chunk")


def conv1d_case(size: str):
    b, c, h, w = (2, 64, 16, 16) if size == "small" else (16, 128, 14, 14)
    torch.manual_seed(0)
    x = torch.randn(b, c, h, w).to(memory_format=CL)
    proj = torch.nn.Conv1d(c, 3 * c, 1)
    dw = torch.nn.Conv2d(3 * c, 3 * c, 3, padding=1, groups=3 * c).to(memory_format=CL)
    swapped = auditor.keep_format(proj)

    def mixer(conv):  # a state-space mixer's projection, made a map again for a depthwise convolution
        return lambda t: dw(conv(t.flatten(2)).reshape(b, -1, h, w))

    return (f"a {b}x{c}x{h}x{w} map's positions", x, (x,), mixer(proj), mixer(swapped), "nn.Conv1d")


CASES = {"roi_align": roi_align_case, "matmul": matmul_case, "chunk": chunk_case, "conv1d": conv1d_case}


def _format(t: torch.Tensor) -> str:
    return auditor.format_label(tuple(t.shape), tuple(t.stride()))


def measure(name: str, size: str, rounds: int) -> list[dict]:
    what, _, inputs, native, replaced, native_name = CASES[name](size)
    rows = []
    with torch.no_grad():
        diff = float((replaced(*inputs) - native(*inputs)).abs().max())
        fwd = time_interleaved({native_name: lambda: native(*inputs), f"keep_format.{name}": lambda: replaced(*inputs)},
                               repeats=rounds)
    leaves = [t.detach().requires_grad_() for t in inputs]
    outs, grads = {}, {}
    for label, fn in ((native_name, native), (f"keep_format.{name}", replaced)):
        out = fn(*leaves)
        g = torch.randn_like(out)
        outs[label] = (out, g)
        grads[label] = torch.autograd.grad(out, leaves, g, retain_graph=True)

    def backward(label):
        out, g = outs[label]
        return lambda: torch.autograd.grad(out, leaves, g, retain_graph=True)

    bwd = time_interleaved({label: backward(label) for label in outs}, repeats=rounds)
    labels = list(outs)
    for phase, table in (("forward", fwd), ("backward", bwd)):
        for label in labels:
            row = table.loc[label]
            formats = (_format(outs[label][0]) if phase == "forward"
                       else ", ".join(dict.fromkeys(_format(x) for x in grads[label])))
            rows.append({"replacement": name, "size": size, "input": what, "phase": phase, "variant": label,
                         "ms": row["us"] / 1e3, "ratio": row["ratio"], "low": row["ratio_low"],
                         "high": row["ratio_high"], "writes": formats, "diff": diff})
    return rows


def main(argv=None) -> int:
    args = parse(argv)
    torch.set_num_threads(1)
    auditor.steady_malloc()
    load, start = os.getloadavg()[0], time.perf_counter()
    print(f"torch {torch.__version__}, 1 thread, process CPU time, {args.rounds} interleaved rounds; "
          f"load average {load:.2f}\n")
    print("| replacement | size | inputs | phase | variant | ms | ratio to native [95%] | writes |")
    print("|---|---|---|---|---|---|---|---|")
    for name in args.cases:
        for size in args.sizes:
            for r in measure(name, size, args.rounds):
                ratio = "1" if not r["variant"].startswith("keep_format") else \
                    f"{r['ratio']:.3f} [{r['low']:.3f}, {r['high']:.3f}]"
                print(f"| {r['replacement']} | {r['size']} | {r['input']} | {r['phase']} | {r['variant']} | "
                      f"{r['ms']:.2f} | {ratio} | {r['writes']} |", flush=True)
    print(f"\n{time.perf_counter() - start:.0f} s; load average {load:.2f} before, {os.getloadavg()[0]:.2f} after.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
