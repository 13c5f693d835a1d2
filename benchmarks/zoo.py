"""Audit the tutorial's Ice Lake CPU model list: forward + backward in channels_last.

Every model is built from torchvision with random weights, converted with
``model.to(memory_format=torch.channels_last)``, fed one channels_last image and run through
``auditor.audit`` (forward, ``output.sum().backward()``). One markdown row per model:

    python benchmarks/zoo.py                       # all 29 models, 64x64 where they allow it
    python benchmarks/zoo.py --models resnet18,googlenet --size 96 --details

Columns: aten ops recorded per phase, hotspot groups and hotspot ops (losses and conversions
between two convolutions), hotspot bytes per phase, and the tutorial's ``check_wrapper`` rule
(``auditor._analysis._summaries.naive_losses``) over the whole step and over forward only.
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings

import torch
import torchvision.models as tvm

import auditor
from auditor._analysis._summaries import naive_losses

#: The tutorial's list of models with full channels_last support on Ice Lake CPUs.
ICE_LAKE_MODELS = (
    "alexnet", "densenet121", "densenet161", "densenet169", "googlenet", "inception_v3",
    "mnasnet0_5", "mnasnet1_0", "resnet101", "resnet152", "resnet18", "resnet34", "resnet50",
    "resnext101_32x8d", "resnext50_32x4d", "shufflenet_v2_x0_5", "shufflenet_v2_x1_0",
    "squeezenet1_0", "squeezenet1_1", "vgg11", "vgg11_bn", "vgg13", "vgg13_bn", "vgg16",
    "vgg16_bn", "vgg19", "vgg19_bn", "wide_resnet101_2", "wide_resnet50_2",
)  # fmt: skip

#: Smallest square input a model accepts with batch 1, where it is above the default, in
#: training and in eval mode. inception_v3 needs 75x75 for its convolutions, but below 107x107
#: its last BatchNorms see one value per channel (a 1x1 map, batch 1): training mode rejects it.
MIN_SIZE_TRAIN = {"alexnet": 63, "inception_v3": 107}
MIN_SIZE_EVAL = {"alexnet": 63, "inception_v3": 75}

#: Constructor arguments beyond ``weights=None`` (no auxiliary heads, no slow init).
EXTRA_KWARGS = {
    "googlenet": {"aux_logits": False, "init_weights": False},
    "inception_v3": {"aux_logits": False, "init_weights": False},
}

HEADER = (
    "| model | input | ops fwd | ops bwd | hotspot groups | hotspot ops | hot bytes fwd "
    "| hot bytes bwd | naive | naive fwd | seconds |"
)


def build(name: str) -> torch.nn.Module:
    """A torchvision model with random weights, in channels_last."""
    model = getattr(tvm, name)(weights=None, **EXTRA_KWARGS.get(name, {}))
    return model.to(memory_format=torch.channels_last)


def input_size(name: str, size: int, train: bool = True) -> int:
    """``size``, raised to the smallest input ``name`` accepts."""
    return max(size, (MIN_SIZE_TRAIN if train else MIN_SIZE_EVAL).get(name, 0))


def audit_model(name: str, size: int, train: bool = True) -> tuple[auditor.Audit, int]:
    """Build ``name``, run one audited forward + backward step on a 1x3xSxS input."""
    torch.manual_seed(0)
    model = build(name).train(train)
    side = input_size(name, size, train)
    x = torch.randn(1, 3, side, side).contiguous(memory_format=torch.channels_last)
    return auditor.audit(model, x), side


def row(a: auditor.Audit) -> dict:
    """The numbers of one table row."""
    ops = a.ops()
    phase = ops["phase"].astype(str)
    hot = ops[ops["hotspot"]]
    hot_phase = hot["phase"].astype(str)
    fwd_seqs = a.events.loc[a.events["phase"] == "forward", "seq"]
    fwd_tensors = a.tensors[a.tensors["seq"].isin(fwd_seqs)]
    return {
        "ops_fwd": int((phase == "forward").sum()),
        "ops_bwd": int((phase == "backward").sum()),
        "groups": len(a.hotspots()),
        "hot_ops": len(hot),
        "bytes_fwd": int(hot.loc[hot_phase == "forward", "bytes"].sum()),
        "bytes_bwd": int(hot.loc[hot_phase == "backward", "bytes"].sum()),
        "naive": naive_losses(a.events, a.tensors),
        "naive_fwd": naive_losses(a.events, fwd_tensors),
    }


def details(a: auditor.Audit, top: int) -> str:
    """The largest hotspot groups of one audit, as an indented plain-text block."""
    hot = a.hotspots()
    if hot.empty:
        return "    (no hotspots)"
    lines = []
    for r in hot.head(top).itertuples():
        lines.append(
            f"    {r.phase:8} {r.module:32} {r.op:42} {r.kind:8} "
            f"{r.from_format} -> {r.to_format}  n={r.count} bytes={r.bytes}"
        )
    if len(hot) > top:
        lines.append(f"    ... {len(hot) - top} more groups")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--models",
        default=",".join(ICE_LAKE_MODELS),
        help="comma-separated torchvision model names (default: the tutorial's Ice Lake list)",
    )
    parser.add_argument(
        "--size",
        type=int,
        default=64,
        help="input height and width; raised to a model's minimum where it needs more",
    )
    parser.add_argument("--eval", action="store_true", help="run the models in eval mode")
    parser.add_argument(
        "--details", action="store_true", help="print each model's largest hotspot groups"
    )
    parser.add_argument("--top", type=int, default=8, help="hotspot groups shown by --details")
    args = parser.parse_args(argv)
    names = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = [m for m in names if not hasattr(tvm, m)]
    if unknown:
        parser.error(f"not torchvision models: {', '.join(unknown)}")

    warnings.filterwarnings("ignore", category=UserWarning)
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, batch 1, "
        f"{'eval' if args.eval else 'train'} mode, forward + sum().backward()\n"
    )
    print(HEADER)
    print("|" + "---|" * HEADER.count(" | ") + "---|")
    blocks = []
    failed = []
    for name in names:
        start = time.perf_counter()
        try:
            a, side = audit_model(name, args.size, train=not args.eval)
        except Exception as exc:  # one model that cannot run at this size must not stop the rest
            failed.append(name)
            side = input_size(name, args.size, not args.eval)
            print(f"| {name} | {side}x{side} | failed: {type(exc).__name__}: {str(exc)[:80]} |")
            continue
        r = row(a)
        seconds = time.perf_counter() - start
        print(
            f"| {name} | {side}x{side} | {r['ops_fwd']} | {r['ops_bwd']} | {r['groups']} "
            f"| {r['hot_ops']} | {r['bytes_fwd']:,} | {r['bytes_bwd']:,} | {r['naive']} "
            f"| {r['naive_fwd']} | {seconds:.1f} |",
            flush=True,
        )
        if args.details:
            blocks.append(f"{name}:\n{details(a, args.top)}")
        del a
    if blocks:
        print("\nLargest hotspot groups per model:\n")
        print("\n".join(blocks))
    if failed:
        print(f"\nfailed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
