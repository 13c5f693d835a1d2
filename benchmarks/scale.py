"""Analysis time at 100k and 1M events: it must stay under 5 s at 1M and grow linearly.

A real audit (resnet50 forward + backward, small input) is tiled into a long log, as a training
loop of many steps would record it: every copy gets its own seqs and tensor ids. Then the full
analysis (classification, data flow, hotspots, summary, coverage) runs on it.

    python benchmarks/scale.py [--sizes 100000,1000000] [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import pandas as pd
import torch
import torchvision

import auditor
from auditor import Audit


def tile(a: Audit, n_events: int) -> Audit:
    """Repeat ``a`` until the log holds ``n_events`` events (seq and tid shifted per copy)."""
    copies = -(-n_events // len(a.events))
    ev, ts = a.events, a.tensors
    n_ev, n_tid = len(ev), int(ts["tid"].max()) + 1
    rep_ev = np.repeat(np.arange(copies), n_ev)
    rep_ts = np.repeat(np.arange(copies), len(ts))
    events = ev.iloc[np.tile(np.arange(n_ev), copies)].reset_index(drop=True)
    events["seq"] = events["seq"].to_numpy() + rep_ev * n_ev
    tensors = ts.iloc[np.tile(np.arange(len(ts)), copies)].reset_index(drop=True)
    tensors["seq"] = tensors["seq"].to_numpy() + rep_ts * n_ev
    tensors["tid"] = tensors["tid"].to_numpy() + rep_ts * n_tid
    events = events.iloc[:n_events]
    tensors = tensors[tensors["seq"] < n_events].reset_index(drop=True)
    return Audit(events, tensors)


def analyse(a: Audit) -> float:
    start = time.perf_counter()
    a._ops = None
    a.hotspots()
    a.summary(depth=2)
    a.coverage()
    return time.perf_counter() - start


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="100000,1000000")
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]

    torch.manual_seed(0)
    model = torchvision.models.resnet50(weights=None).to(memory_format=torch.channels_last)
    # a planted break, so that the hotspot path has work to do
    model.layer2[0].relu = torch.nn.Sequential(torch.nn.ReLU(), _Contiguous())
    x = torch.randn(2, 3, 64, 64).to(memory_format=torch.channels_last)
    base = auditor.audit(model, x)
    print(f"base audit: {len(base.events)} events, {len(base.tensors)} tensor rows, "
          f"{len(base.hotspots())} hotspot groups")

    rows = []
    for n in sizes:
        a = tile(base, n)
        times = [analyse(a) for _ in range(args.repeats)]
        hot = a.hotspots()
        rows.append((n, len(a.tensors), statistics.median(times), int(hot["count"].sum())))
    table = pd.DataFrame(rows, columns=["events", "tensor_rows", "median_s", "hotspot_ops"])
    table["us_per_event"] = table["median_s"] / table["events"] * 1e6
    print(table.to_markdown(index=False, floatfmt=".3f") if _has_tabulate() else table.to_string(index=False))
    if len(sizes) >= 2:
        ratio = table["median_s"].iloc[-1] / table["median_s"].iloc[0]
        size_ratio = sizes[-1] / sizes[0]
        print(f"\ntime ratio {sizes[-1]:,} / {sizes[0]:,} events: {ratio:.2f}x for {size_ratio:.0f}x the events")
    biggest = table.iloc[-1]
    if biggest["events"] >= 1_000_000:
        verdict = "PASS" if biggest["median_s"] <= 5.0 else "FAIL"
        print(f"target: 1M events analysed in <= 5 s: {biggest['median_s']:.2f} s  {verdict}")


class _Contiguous(torch.nn.Module):
    def forward(self, x):
        return x.contiguous()


def _has_tabulate() -> bool:
    try:
        import tabulate  # noqa: F401
    except ImportError:
        return False
    return True


if __name__ == "__main__":
    main()
