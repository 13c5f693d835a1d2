"""Audit a DistributedDataParallel training run: one log per rank, merged and compared on rank 0.

    torchrun --nproc_per_node=2 examples/ddp_train.py --out ddp_audit

Every rank trains a small channels_last CNN under DDP for a few steps inside a
``FormatAuditor``, writes ``DIR/audit.rank<N>.csv`` and checks its gradients' formats. Rank 0
then merges the files, prints the report and writes ``report.txt``, ``hotspots.csv``,
``differences.csv``, ``bucket_hotspots.csv`` and ``grads.csv`` beside them.

The model carries one break on purpose: a ShuffleNet-style channel shuffle
(``transpose(1, 2).contiguous()``), the same on every rank. ``--plant-rank R`` adds a
``.contiguous()`` between two convolutions on rank R only; ``--wrap-first`` wraps the model in
DDP before converting it to channels_last (DDP's bucket views then keep the old layout);
``--no-bucket-view`` turns ``gradient_as_bucket_view`` off. The backend is NCCL on GPUs and
gloo on CPUs; the auditor itself does not care. Without torchrun it runs as a group of one.
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

import auditor
from auditor.distributed import check_grad_formats, merge_rank_audits, save_rank_audit

CL = torch.channels_last


class ChannelShuffle(nn.Module):
    """torchvision's ShuffleNetV2 shuffle: writes NCHW (a known channels_last break)."""

    def __init__(self, groups: int):
        super().__init__()
        self.groups = groups

    def forward(self, x):
        n, c, h, w = x.shape
        x = x.view(n, self.groups, c // self.groups, h, w).transpose(1, 2).contiguous()
        return x.view(n, c, h, w)


class Contiguous(nn.Module):
    """The planted break: an explicit ``.contiguous()`` between two convolutions."""

    def forward(self, x):
        return x.contiguous()


class Net(nn.Module):
    def __init__(self, plant: bool = False, classes: int = 10):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(16)
        self.shuffle = ChannelShuffle(2)
        self.conv2 = nn.Conv2d(16, 16, 3, padding=1, groups=2)
        self.mid = Contiguous() if plant else nn.Identity()
        self.conv3 = nn.Conv2d(16, 16, 3, padding=1)
        self.fc = nn.Linear(16, classes)

    def forward(self, x):
        y = self.shuffle(F.relu(self.bn1(self.conv1(x))))
        y = self.conv3(self.mid(F.relu(self.conv2(y))))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(y, 1), 1))


def make_batch(rank: int, step: int, batch: int = 4, size: int = 16, device="cpu"):
    """Each rank's own data, reproducible from (rank, step)."""
    g = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(batch, 3, size, size, generator=g)
    y = torch.randint(0, 10, (batch,), generator=g)
    return x.to(device, memory_format=CL), y.to(device)


def build(rank: int, *, plant_rank: int | None = None, wrap_first: bool = False,
          bucket_view: bool = True, seed: int = 0, device="cpu"):
    """The DDP model of this rank; parameters are identical on every rank (same seed)."""
    torch.manual_seed(seed)
    model = Net(plant=rank == plant_rank).to(device)
    ids = [torch.device(device).index] if torch.device(device).type == "cuda" else None
    if wrap_first:  # the mistake: DDP sizes its bucket views before the conversion
        ddp = nn.parallel.DistributedDataParallel(model, device_ids=ids, gradient_as_bucket_view=bucket_view)
        model.to(memory_format=CL)
    else:
        model.to(memory_format=CL)
        ddp = nn.parallel.DistributedDataParallel(model, device_ids=ids, gradient_as_bucket_view=bucket_view)
    return ddp


def train(ddp, rank: int, steps: int, device="cpu") -> None:
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9)
    for step in range(steps):
        x, y = make_batch(rank, step, device=device)
        opt.zero_grad()
        F.cross_entropy(ddp(x), y).backward()
        opt.step()


def audit_run(out: str, *, steps: int = 3, device="cpu", **build_kw):
    """Build, train ``steps`` steps under a FormatAuditor and save this rank's audit.

    Returns (audit, ddp model, path written)."""
    rank = dist.get_rank()
    ddp = build(rank, device=device, **build_kw)
    with auditor.FormatAuditor(record_source=True) as fa:
        train(ddp, rank, steps, device)
    return fa.audit, ddp, save_rank_audit(fa.audit, out)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="ddp_audit", help="directory for the per-rank logs and the report")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--no-bucket-view", action="store_true", help="gradient_as_bucket_view=False")
    p.add_argument("--plant-rank", type=int, default=None, help="rank that adds a .contiguous()")
    p.add_argument("--wrap-first", action="store_true", help="wrap in DDP before channels_last")
    p.add_argument("--timeout", type=float, default=120, help="seconds for init and collectives")
    args = p.parse_args(argv)

    cuda = torch.cuda.is_available()
    local = int(os.environ.get("LOCAL_RANK", 0))
    device = f"cuda:{local}" if cuda else "cpu"
    if cuda:
        torch.cuda.set_device(local)
    backend, timeout = "nccl" if cuda else "gloo", datetime.timedelta(seconds=args.timeout)
    if "RANK" in os.environ:  # started by torchrun (or any launcher that sets the env:// variables)
        dist.init_process_group(backend, timeout=timeout)
    else:  # plain `python examples/ddp_train.py`: a process group of one
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout)
    try:
        rank = dist.get_rank()
        _, ddp, path = audit_run(
            args.out, steps=args.steps, device=device, plant_rank=args.plant_rank,
            wrap_first=args.wrap_first, bucket_view=not args.no_bucket_view,
        )
        grads = check_grad_formats(ddp).assign(rank=rank)
        gathered = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, grads)  # also the barrier: every file is written
        if rank == 0:
            import pandas as pd

            merged = merge_rank_audits(args.out)
            grads = pd.concat(gathered, ignore_index=True)
            report = merged.report()
            bad = grads[~grads["ok"]]
            report += "\n\nGradient formats: " + (
                f"all {len(grads)} gradients (every rank) have their parameter's format."
                if bad.empty
                else f"{len(bad)} gradients differ from their parameter's format:\n"
                + bad[["rank", "parameter", "param_format", "grad_format"]].to_string(index=False)
            )
            print(report)
            with open(os.path.join(args.out, "report.txt"), "w") as f:
                f.write(report + "\n")
            merged.hotspots().to_csv(os.path.join(args.out, "hotspots.csv"), index=False)
            merged.differences().to_csv(os.path.join(args.out, "differences.csv"), index=False)
            merged.bucket_hotspots().to_csv(os.path.join(args.out, "bucket_hotspots.csv"), index=False)
            grads.to_csv(os.path.join(args.out, "grads.csv"), index=False)
        print(f"rank {rank}: wrote {path}", file=sys.stderr)
        # Every rank leaves together. Gloo frees a finished collective's tensors on its own
        # threads, which need the GIL: a rank whose interpreter is already shutting down then
        # aborts ("terminate called without an active exception").
        dist.barrier()
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
