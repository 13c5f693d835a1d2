"""Whether an audit's times describe the step the user runs: "ops" plus "time outside ops"
against the same step without the auditor.

    flock /tmp/bench.lock env OMP_NUM_THREADS=1 .venv/bin/python benchmarks/time_breakdown.py [--rounds 7]

Each model (torchvision, random weights; model and input in channels_last) is audited with
``auditor.audit``'s defaults (one thread, process CPU time) in rounds that alternate with plain
steps (no auditor: one thread, process CPU time; the order flips each round). Per round, the
audit's ops plus its time outside ops over the median of that round's plain steps; the table
gives the median of those ratios with its 95% interval, and the recorder's own cost, which the
audit measures and shows on its own line, over the plain step. Target: 0.85-1.15x.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
import torchvision

# this checkout's package, whatever an editable install elsewhere points at
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import auditor  # noqa: E402
from auditor._measure._decide import median_interval
from auditor._step import Step

MODELS = {  # name: input shape (the sizes)
    "shufflenet_v2_x1_0": (8, 3, 128, 128),
    "mobilenet_v3_small": (4, 3, 96, 96),
    "regnet_y_400mf": (2, 3, 64, 64),
}
LOW, HIGH = 0.85, 1.15
PLAIN_PER_ROUND = 3


def plain_cpu_ms(step) -> float:
    c0 = time.process_time()
    step()
    return (time.process_time() - c0) * 1e3


def measure(name: str, shape: tuple[int, ...], rounds: int) -> dict:
    torch.manual_seed(0)
    model = getattr(torchvision.models, name)(weights=None).to(memory_format=torch.channels_last)
    x = torch.randn(*shape).to(memory_format=torch.channels_last)
    plain_step = Step(model, (x,)).timed()
    before = torch.get_num_threads()
    ratios, recorder, ops_ms, outside_ms, plain_ms = [], [], [], [], []
    for r in range(rounds + 1):
        audit_first = r % 2 == 1
        if audit_first:
            a = auditor.audit(model, x)
        torch.set_num_threads(1)
        try:
            plain_step()  # after the audit (or the round before), one unmeasured step
            plain = statistics.median(plain_cpu_ms(plain_step) for _ in range(PLAIN_PER_ROUND))
        finally:
            torch.set_num_threads(before)
        if not audit_first:
            a = auditor.audit(model, x)
        model.zero_grad(set_to_none=True)
        if r == 0:  # the first round warms the process up
            continue
        ops = float(a.events["time_us"].sum()) / 1e3
        outside = float(a.events["gap_us"].sum()) / 1e3
        cost = a._step_time.recorder_us / 1e3 if a._step_time is not None else float("nan")
        ratios.append((ops + outside) / plain)
        recorder.append(cost / plain)
        ops_ms.append(ops)
        outside_ms.append(outside)
        plain_ms.append(plain)
    low, high = median_interval(ratios)
    return {
        "model": name, "input": "x".join(map(str, shape)), "plain": statistics.median(plain_ms),
        "ops": statistics.median(ops_ms), "outside": statistics.median(outside_ms),
        "ratio": statistics.median(ratios), "low": low, "high": high,
        "recorder": statistics.median(recorder), "rounds": len(ratios),
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7, help="paired rounds per model (after one warm-up round)")
    parser.add_argument("--models", nargs="*", default=list(MODELS), choices=list(MODELS))
    args = parser.parse_args(argv)
    rows = [measure(name, MODELS[name], args.rounds) for name in args.models]
    print(f"torch {torch.__version__}; audit() defaults (1 thread, process CPU time); plain step: 1 thread, "
          f"process CPU time, median of {PLAIN_PER_ROUND} per round; {args.rounds} interleaved rounds")
    print()
    print("| model | input | plain step | ops | time outside ops | (ops + outside) / plain [95%] "
          "| recorder's own cost / plain |")
    print("| --- | --- | --: | --: | --: | --: | --: |")
    ok = True
    for row in rows:
        ok &= LOW <= row["ratio"] <= HIGH
        print(f"| {row['model']} | {row['input']} | {row['plain']:.1f} ms | {row['ops']:.1f} ms | "
              f"{row['outside']:.1f} ms | {row['ratio']:.3f} [{row['low']:.3f}, {row['high']:.3f}] | "
              f"{row['recorder']:.2f} |")
    print()
    print(f"{'PASS' if ok else 'FAIL'}: (ops + time outside ops) / plain step within {LOW}-{HIGH}x (median of the "
          "paired rounds)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
