"""Fake audits do not grow with the batch: resnet50, 224x224, channels_last, forward + backward.

A real step at batch 4096 would write hundreds of GB of activations; a fake audit
(``auditor.audit(..., fake=True)``) runs the meta kernels and records the same ops. Each
measurement runs in a fresh subprocess, so its peak RSS (``ru_maxrss``) is its own: the
import of torch, the model's real weights, the input (a meta tensor, so the batch is never
allocated) and the audit. In each subprocess the audit runs twice: the first call pays for
torch's lazy imports and fake-kernel caches, the second shows the steady cost.

    python benchmarks/fake_scale.py                  # batch 1 vs 4096, 5 runs each
    python benchmarks/fake_scale.py --runs 3 --batch 1024
    python benchmarks/fake_scale.py --device cuda      # the same for a cuda target
    python benchmarks/fake_scale.py --probe-cost resnet18,efficientnet_b0   # what asking the kernels costs

Targets: batch 4096 in under 3 s (first call, median), under 2 GB peak RSS (worst run), and
batch 4096 at most 1.5x the time of batch 1 (second calls, medians, measured in this run).

``--probe-cost``: what a fake CPU audit pays for asking the real kernels (``auditor/_recording/
_probe.py``), on zoo models (``tests/zoo_patches.py``: its inputs, channels_last) or torchvision
builders (1x3x224x224): the audit with the meta kernels' strides only (as before the probe),
with every signature asked afresh (a fresh probe each call: the first audit of a model in a
process), and with the answers cached (a second audit). One thread, process CPU time, rounds in
alternating order, paired ratios to the meta-only audit with their interval
(``auditor/_measure/_harness.time_interleaved``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

TIME_TARGET_S = 3.0
RSS_TARGET_BYTES = 2 * 1024**3
RATIO_TARGET = 1.5


def child(batch: int, size: int, repeats: int, device: str) -> None:
    """One measurement: print a JSON line with the audit times and the process's peak RSS."""
    import resource
    import warnings

    import torch
    import torchvision

    import auditor

    warnings.filterwarnings("ignore", category=UserWarning)
    cl = torch.channels_last
    model = torchvision.models.resnet50(weights=None).to(memory_format=cl)
    x = torch.empty(batch, 3, size, size, device="meta").to(memory_format=cl)
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        a = auditor.audit(model, x, fake=True, device=device)
        times.append(time.perf_counter() - start)
        events = len(a.events)
        # what a real step would write: the results of every op that is not a view
        written = a.tensors[(a.tensors["role"] == "output") & ~a.tensors["is_view"]]["bytes"].sum()
        del a
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(json.dumps({
        "batch": batch, "times": times, "events": events, "rss_before": rss_before,
        "peak_rss": peak, "written": int(written),
    }))


def measure(batch: int, size: int, repeats: int, device: str) -> dict:
    cmd = [sys.executable, __file__, "--child", "--batch", str(batch), "--size", str(size),
           "--repeats", str(repeats), "--device", device]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"measurement failed (batch {batch}):\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def probe_cost(names: list[str], repeats: int) -> None:
    """Paired ratios of fake CPU audits with and without asking the real kernels."""
    import warnings
    from pathlib import Path

    import torch

    warnings.filterwarnings("ignore", category=UserWarning)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from zoo_patches import HYBRIDS, ZOO

    zoo = {z.name: z for z in ZOO + HYBRIDS}
    print(f"torch {torch.__version__}; fake CPU audit, forward + backward; {repeats} rounds, one thread, "
          "process CPU time; ratio: paired, to the meta-only audit, [95% interval]\n")
    print("| model | input | ops | signatures asked | meta only | asked afresh | answers cached |")
    print("|---|---|---|---|---|---|---|")
    for name in names:
        print(_probe_row(name, zoo, repeats), flush=True)


def _probe_row(name: str, zoo: dict, repeats: int) -> str:
    import torch
    import torchvision

    import auditor
    import auditor._fake as fake_module
    from auditor._measure._harness import time_interleaved
    from auditor._recording import _kernels
    from auditor._recording._probe import KernelProbe

    if name in zoo:
        model, inputs = zoo[name].make()
    else:
        model = getattr(torchvision.models, name)(weights=None).to(memory_format=torch.channels_last)
        inputs = (torch.randn(1, 3, 224, 224).contiguous(memory_format=torch.channels_last),)
    cached = KernelProbe()
    restriders = {
        "meta only": lambda device_type: _kernels.Restrider(),
        "asked afresh": lambda device_type: _kernels.Restrider(probe=KernelProbe()),
        "answers cached": lambda device_type: _kernels.Restrider(probe=cached),
    }
    counted = {}

    def audit(kind):
        def run():
            fake_module.restrider_for = restriders[kind]
            a = auditor.audit(model, *inputs, fake=True, device="cpu", record_source=False)
            counted["ops"] = len(a.events)
        return run

    try:
        frame = time_interleaved({k: audit(k) for k in restriders}, repeats=repeats)
    finally:
        fake_module.restrider_for = _kernels.restrider_for
    cells = [f"{frame.at[k, 'us'] / 1e6:.2f} s" + ("" if k == "meta only" else
             f" ({frame.at[k, 'ratio']:.2f}x [{frame.at[k, 'ratio_low']:.2f}, {frame.at[k, 'ratio_high']:.2f}])")
             for k in restriders]
    shape = "x".join(str(n) for n in inputs[0].shape)
    return f"| {name} | {shape} | {counted['ops']} | {len(cached)} | " + " | ".join(cells) + " |"


def gb(n: float) -> str:
    return f"{n / 1024**3:.2f} GB"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=4096, help="the large batch (default 4096)")
    parser.add_argument("--size", type=int, default=224, help="input height and width")
    parser.add_argument("--runs", type=int, default=5, help="subprocesses per batch size")
    parser.add_argument("--repeats", type=int, default=2, help="audits per subprocess")
    parser.add_argument("--device", default="cpu", help="the fake audit's target (cpu or cuda)")
    parser.add_argument("--probe-cost", default="", metavar="MODELS",
                        help="comma-separated zoo models or torchvision builders: time fake CPU audits with and "
                             "without asking the real kernels, and stop")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.probe_cost:
        probe_cost(args.probe_cost.split(","), max(args.runs, 7))
        return 0
    if args.child:
        child(args.batch, args.size, args.repeats, args.device)
        return 0
    if args.repeats < 2:
        parser.error("--repeats must be at least 2 (the first audit in a process is the cold one)")

    import torch

    print(f"torch {torch.__version__}, resnet50, {args.size}x{args.size}, channels_last, "
          f"fake {args.device}, forward + backward; {args.runs} subprocesses per batch, "
          f"{args.repeats} audits each\n")
    results: dict[int, list[dict]] = {1: [], args.batch: []}
    for _ in range(args.runs):  # interleaved, so both batch sizes see the same machine
        for batch in results:
            results[batch].append(measure(batch, args.size, args.repeats, args.device))

    def med(batch: int, which: int) -> float:
        return statistics.median(r["times"][which] for r in results[batch])

    big = args.batch
    cold_big, warm_big, warm_one = med(big, 0), med(big, 1), med(1, 1)
    peak_big = max(r["peak_rss"] for r in results[big])
    ratio = warm_big / warm_one
    print(f"| measure | batch 1 | batch {big} |")
    print("|---|---|---|")
    print(f"| audit time, first in process (median) | {med(1, 0):.2f} s | {cold_big:.2f} s |")
    print(f"| audit time, second in process (median) | {warm_one:.2f} s | {warm_big:.2f} s |")
    print(f"| peak RSS (worst run) | {gb(max(r['peak_rss'] for r in results[1]))} | {gb(peak_big)} |")
    print(f"| RSS before the audit (import + model) | {gb(results[1][0]['rss_before'])} "
          f"| {gb(results[big][0]['rss_before'])} |")
    print(f"| aten ops recorded | {results[1][0]['events']} | {results[big][0]['events']} |")
    print(f"| bytes a real step would write | {gb(results[1][0]['written'])} "
          f"| {gb(results[big][0]['written'])} |")
    print()
    print("| target | measured | result |")
    print("|---|---|---|")
    rows = [
        (f"batch {big} under {TIME_TARGET_S:.0f} s (first call)", f"{cold_big:.2f} s",
         cold_big < TIME_TARGET_S),
        (f"batch {big} under {gb(RSS_TARGET_BYTES)} peak RSS", gb(peak_big),
         peak_big < RSS_TARGET_BYTES),
        (f"batch {big} at most {RATIO_TARGET}x batch 1 (second calls)", f"{ratio:.2f}x",
         ratio <= RATIO_TARGET),
    ]
    for target, value, ok in rows:
        print(f"| {target} | {value} | {'PASS' if ok else 'FAIL'} |")
    return 0 if all(ok for *_, ok in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
