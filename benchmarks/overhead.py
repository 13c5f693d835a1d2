"""What recording costs: one resnet50 training step under each recorder, interleaved.

    .venv/bin/python benchmarks/overhead.py [--runs 15] [--threads N] [--budget 150] [--against REV]

The step is torchvision's resnet50 (random weights) on one 1x3x64x64 input, model and input in
channels_last: forward, then ``out.sum().backward()``. Grads are set to None between runs,
outside the timed region. Variants:

* ``plain``: no recorder;
* ``bare mode``: a ``TorchDispatchMode`` whose ``__torch_dispatch__`` only calls the op, the
  floor for any tool built on a Python dispatch mode;
* ``FormatAuditor``: this library;
* ``+source``: the same with ``record_source=True``;
* ``+source+time``: and ``record_time=True``, kernel times from torch's profiler (what
  ``auditor.audit`` records by default);
* ``profiler+shapes``: ``torch.profiler.profile(record_shapes=True)``, CPU activity;
* ``DebugMode``: ``torch.utils._debug_mode.DebugMode()`` with its defaults;
* ``FormatAuditor @REV`` (with ``--against REV``): the recorder as it was at a git revision of
  this repository, extracted into a temporary package, to show side by side that a change did
  not make the hot path slower.

Every round runs every variant once, in an order rotated each round, so machine noise hits
all variants alike; a variant's time is the median over the rounds, after warm-up rounds.
Rounds stop early (never below 7) when the next one would pass ``--budget`` seconds.
Two times are kept per run: ``step`` (inside the ``with`` block: what the recorded code
feels) and ``total`` (including the context manager's exit, where FormatAuditor builds its
DataFrames and the profiler parses its events); ``cpu`` is the step's CPU time on the
process (the whole step's work with ``--threads 1``; time the machine gave to others is not
in it), and ``cpu total`` the same with the exit. The targets are judged on CPU time: on a
shared machine wall time counts the slices other processes ran.

Ratios between variants come two ways: the ratio of their medians, and the median over the
rounds of the ratio within each round ("paired"). Runs of one round ran back to back, so the
paired ratio cancels the slow drifts of a shared machine; the targets are judged on it, in
process CPU time: the recorder with its DataFrames (``cpu total``) at most 1.10x the bare mode.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import functools
import gc
import importlib
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import torch
import torchvision
from torch.utils._python_dispatch import TorchDispatchMode

# this checkout's package, whatever an editable install elsewhere points at
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from torch.utils._debug_mode import DebugMode

import auditor  # noqa: E402
from auditor._measure._decide import median_interval  # noqa: E402

MAX_RATIO_TO_BARE = 1.10
MAX_SOURCE_COST = 1.15  # recording source lines, against recording without them
MAX_BYTES_PER_EVENT = 200
MAX_TIME_DISAGREEMENT = 0.20  # summed kernel times of the timed audit against the plain step
MAX_SLOWDOWN_AGAINST_REVISION = 1.03  # FormatAuditor against itself at --against REV (paired step)
WARMUP_ROUNDS = 2
TIMED = "+source+time"  # the variant whose recorded kernel times are checked against plain steps
MIN_RUNS = 7
NOISY_IQR_PERCENT = 25


class BareMode(TorchDispatchMode):
    """The cheapest possible Python mode: it sees every op and does nothing with it."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


class CountMode(TorchDispatchMode):
    """Counts the aten ops of a step (the events a recorder sees)."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += 1
        return func(*args, **(kwargs or {}))


def profiler_with_shapes():
    return torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True
    )


VARIANTS = {
    "plain": contextlib.nullcontext,
    "bare mode": BareMode,
    "FormatAuditor": auditor.FormatAuditor,
    "+source": functools.partial(auditor.FormatAuditor, record_source=True),
    "+source+time": functools.partial(auditor.FormatAuditor, record_source=True, record_time=True),
    "profiler+shapes": profiler_with_shapes,
    "DebugMode": DebugMode,
}


def recorder_at(revision: str, into: Path):
    """``FormatAuditor`` as package ``auditor`` was at a git ``revision``, importable beside today's.

    ``git archive`` writes the old package under ``into``, renamed so both import at once; the
    package uses relative imports only, so the rename is all it needs.
    """
    root = Path(__file__).resolve().parent.parent
    archive = subprocess.run(
        ["git", "-C", str(root), "archive", "--format=tar", revision, "auditor"],
        check=True, capture_output=True,
    ).stdout
    tar_path = into / "auditor.tar"
    tar_path.write_bytes(archive)
    with tarfile.open(tar_path) as tar:
        tar.extractall(into, filter="data")
    name = "auditor_at_" + "".join(c if c.isalnum() else "_" for c in revision)
    (into / "auditor").rename(into / name)
    sys.path.insert(0, str(into))
    return importlib.import_module(name).FormatAuditor


def make_step():
    torch.manual_seed(0)
    model = torchvision.models.resnet50(weights=None).to(memory_format=torch.channels_last)
    x = torch.randn(1, 3, 64, 64).to(memory_format=torch.channels_last)

    def step():
        out = model(x)
        out.sum().backward()

    def reset():
        model.zero_grad(set_to_none=True)

    return step, reset


def timed(step, reset, factory) -> tuple[tuple[float, float, float, float], object]:
    """One run under ``factory()``: ((step ms, total ms, step CPU ms, total CPU ms), the context
    object); CPU time is the process's (with --threads 1, the step's work on one thread)."""
    reset()
    gc.collect()
    ctx = factory()
    t0 = time.perf_counter()
    c0 = time.process_time()
    with ctx:
        step()
        c1 = time.process_time()
        t1 = time.perf_counter()
    c2 = time.process_time()
    t2 = time.perf_counter()
    return ((t1 - t0) * 1e3, (t2 - t0) * 1e3, (c1 - c0) * 1e3, (c2 - c0) * 1e3), ctx


def paired(a: list[float], b: list[float]) -> float:
    """Median over rounds of a / b within each round."""
    return statistics.median(x / y for x, y in zip(a, b))


def iqr_percent(values: list[float]) -> float:
    """Interquartile range as a percentage of the median: how noisy a variant's runs were."""
    q1, _, q3 = statistics.quantiles(values, n=4)
    return 100.0 * (q3 - q1) / statistics.median(values)


def bytes_per_event(fa) -> float:
    a = fa.audit
    size = a.events.memory_usage(deep=True).sum() + a.tensors.memory_usage(deep=True).sum()
    return float(size) / max(1, len(a.events))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15, help="timed rounds (at least 7)")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    parser.add_argument(
        "--budget", type=float, default=150.0, help="seconds after which rounds stop (past 7)"
    )
    parser.add_argument(
        "--against", metavar="REV", action="append", default=[],
        help="also time FormatAuditor as it was at this git revision, side by side (repeatable)",
    )
    args = parser.parse_args(argv)
    if args.runs < MIN_RUNS:
        parser.error(f"--runs must be at least {MIN_RUNS}")
    if args.threads is not None:
        torch.set_num_threads(args.threads)

    variants = dict(VARIANTS)
    for revision in args.against:
        into = Path(tempfile.mkdtemp(prefix="auditor_at_"))
        atexit.register(shutil.rmtree, into, ignore_errors=True)
        variants[f"FormatAuditor @{revision}"] = recorder_at(revision, into)

    step, reset = make_step()
    names = list(variants)
    times: dict[str, tuple[list[float], ...]] = {n: ([], [], [], []) for n in names}
    last: dict[str, object] = {}
    kernel_sums: list[float] = []  # ms of kernel time the timed audit recorded, per round
    start = time.perf_counter()
    runs = 0
    for r in range(WARMUP_ROUNDS + args.runs):
        shift = r % len(names)
        for name in names[shift:] + names[:shift]:
            measured, ctx = timed(step, reset, variants[name])
            if r >= WARMUP_ROUNDS:
                for series, value in zip(times[name], measured):
                    series.append(value)
                if name == TIMED:
                    kernel_sums.append(float(ctx.audit.events["time_us"].sum()) / 1e3)
            last[name] = ctx
        runs = max(0, r + 1 - WARMUP_ROUNDS)
        elapsed = time.perf_counter() - start
        if runs >= MIN_RUNS and elapsed * (r + 2) / (r + 1) > args.budget:
            break

    reset()
    with CountMode() as counter:
        step()
    n_ops = counter.count
    fa = last["FormatAuditor"]
    n_events = len(fa.audit.events)
    bpe = bytes_per_event(fa)

    med = {n: tuple(statistics.median(series) for series in v) for n, v in times.items()}
    spread = {n: iqr_percent(s) for n, (s, *_) in times.items()}
    plain, bare = med["plain"][0], med["bare mode"][0]
    bare_steps = times["bare mode"][0]

    print(
        f"resnet50, 1x3x64x64 channels_last, forward + backward; torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads; median of {runs} interleaved runs "
        f"after {WARMUP_ROUNDS} warm-up rounds ({elapsed:.0f} s)"
    )
    print(f"aten ops per step: {n_ops} (FormatAuditor recorded {n_events} events)")
    print()
    print(
        "| variant | step ms | IQR | total ms | cpu ms | step / plain | step / bare | paired step / bare "
        "| paired total / bare | paired cpu / bare | paired cpu total / bare | µs/event (step) | µs/event (total) "
        "| bytes/event |"
    )
    print("|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
    for name in names:
        s, t, c, _ = med[name]
        steps, totals, cpus, cpu_totals = times[name]
        b = f"{bpe:.0f}" if name == "FormatAuditor" else ""
        print(
            f"| {name} | {s:.1f} | {spread[name]:.0f}% | {t:.1f} | {c:.1f} | {s / plain:.2f} | {s / bare:.2f} "
            f"| {paired(steps, bare_steps):.3f} | {paired(totals, bare_steps):.3f} "
            f"| {paired(cpus, times['bare mode'][2]):.3f} | {paired(cpu_totals, times['bare mode'][3]):.3f} "
            f"| {(s - plain) * 1e3 / n_ops:.1f} | {(t - plain) * 1e3 / n_ops:.1f} | {b} |"
        )
    print()
    print("step = inside the `with` block; total = including its exit (FormatAuditor's")
    print("DataFrames, the profiler's event parsing); cpu = the step's process CPU time, cpu total with the exit.")
    print("IQR = interquartile range of the step times / median. paired = median over rounds of")
    print("the ratio within a round. µs/event = (median - plain step) / aten ops.")
    noisy = [n for n in names if spread[n] > NOISY_IQR_PERCENT]
    if noisy:
        print(
            f"WARNING: noisy runs (IQR > {NOISY_IQR_PERCENT}% for {', '.join(noisy)}): the machine is "
            "busy. With as many intra-op threads as cores, a busy machine stalls every OpenMP "
            "region; rerun when idle, or with --threads 1 (or OMP_WAIT_POLICY=PASSIVE)."
        )
    print()

    timed_audit = last[TIMED].audit
    kernels_ms = statistics.median(kernel_sums)
    outside_ms = float(timed_audit.events["gap_us"].sum()) / 1e3
    agreement = paired(kernel_sums, times["plain"][2])  # each round's kernel sum / its plain step (CPU)
    timed_cost = paired(times[TIMED][3], times["plain"][2])
    print(f"Timed audit (+source+time): the step's ops took {kernels_ms:.1f} ms of kernel time by the profiler "
          f"(median), {agreement:.3f}x the plain step ({med['plain'][2]:.1f} ms CPU; paired); time outside ops (Python between "
          f"them, the recorder's own work) {outside_ms:.1f} ms. The timed audit costs {timed_cost:.2f}x a plain "
          f"step (paired, total incl. the profiler's parsing and DataFrames; "
          f"{paired(times[TIMED][0], times['plain'][0]):.2f}x inside the block).")
    print()

    fa_steps, fa_totals, fa_cpu, fa_cpu_totals = times["FormatAuditor"]
    fa_step_ratio = paired(fa_steps, bare_steps)
    # process CPU time, DataFrames included, against the bare mode's step
    fa_total_ratio = paired(fa_cpu_totals, times["bare mode"][3])
    fa_total_low, fa_total_high = median_interval(
        [a / b for a, b in zip(fa_cpu_totals, times["bare mode"][3], strict=True)])
    source_ratio = paired(times["+source"][2], fa_cpu)
    fa_vs_profiler = paired(fa_cpu_totals, times["profiler+shapes"][3])
    checks = [
        (
            f"FormatAuditor CPU time, DataFrames included, <= {MAX_RATIO_TO_BARE:.2f}x bare mode (paired)",
            fa_total_ratio <= MAX_RATIO_TO_BARE,
            f"{fa_total_ratio:.3f}x [{fa_total_low:.3f}, {fa_total_high:.3f}] (ratio of medians "
            f"{med['FormatAuditor'][3] / med['bare mode'][3]:.3f}x; wall time inside the block {fa_step_ratio:.3f}x)",
        ),
        (
            "FormatAuditor total <= profiler+shapes total (paired)",
            fa_vs_profiler <= 1.0,
            f"{fa_vs_profiler:.3f}x ({med['FormatAuditor'][3]:.1f} ms vs {med['profiler+shapes'][3]:.1f} ms "
            f"CPU medians; steps {med['FormatAuditor'][2]:.1f} vs {med['profiler+shapes'][2]:.1f})",
        ),
        (
            f"source lines cost <= {MAX_SOURCE_COST:.2f}x FormatAuditor without them (paired step)",
            source_ratio <= MAX_SOURCE_COST,
            f"{source_ratio:.3f}x",
        ),
        (
            f"summed kernel times within {MAX_TIME_DISAGREEMENT:.0%} of the plain step",
            abs(agreement - 1) <= MAX_TIME_DISAGREEMENT,
            f"{agreement:.3f}x paired ({kernels_ms:.1f} ms vs {med['plain'][2]:.1f} ms CPU medians)",
        ),
        (
            f"DataFrame memory <= {MAX_BYTES_PER_EVENT} bytes/event",
            bpe <= MAX_BYTES_PER_EVENT,
            f"{bpe:.0f} bytes/event",
        ),
    ]
    for revision in args.against:
        old_name = f"FormatAuditor @{revision}"
        against = paired(fa_cpu, times[old_name][2])
        checks.append((
            f"FormatAuditor step <= {MAX_SLOWDOWN_AGAINST_REVISION:.2f}x itself at {revision} (paired)",
            against <= MAX_SLOWDOWN_AGAINST_REVISION,
            f"{against:.3f}x (ratio of CPU medians {med['FormatAuditor'][2] / med[old_name][2]:.3f}x)",
        ))
    print("Targets:")
    for label, ok, detail in checks:
        print(f"  {'PASS' if ok else 'FAIL'}  {label}: {detail}")
    return 0 if all(ok for _, ok, _ in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
