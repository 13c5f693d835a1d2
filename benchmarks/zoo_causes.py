"""The zoo's real models: the causes the auditor names, and what fixing them saves.

    .venv/bin/python benchmarks/zoo_causes.py [--rounds 15] [--batch 8] [--models NAME ...] [--quick]

One row per model of the zoo (tests/zoo_patches.py: timm, segmentation_models_pytorch,
diffusers and torchvision models, random weights, train mode, model and input in
channels_last): how many causes ``Audit.causes()`` reports, the top one (pattern and library
file:line, relative to site-packages), whether they are the lines tests/test_zoo.py pins, and
the hotspot groups of a training step before and after the fixes. The fixes are the in-memory
library edits that implement the suggested fixes (the same ones that confirm the causes in
tests/test_zoo.py). Audits use the zoo's small inputs.

Then the training step (forward, the sum of the outputs, backward; gradients reset outside the
timed region) is timed with and without the fixes, on the same model object, at ``--batch``
samples: every round runs both, in alternating order, so load from other processes hits both
alike. One thread (``torch.set_num_threads(1)``) and process CPU time, which preemption by
other processes does not inflate; ``auditor.steady_malloc()`` first, so no variant
page-faults its activations anew every step. ``after/before`` is the median over rounds of the
ratio within a round, with its interquartile range; the machine is shared, so ratios within
about 5% of 1 are noise.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # the zoo and its fixes are shared with the tests
try:
    import auditor
except ImportError:  # run from a checkout without the editable install
    sys.path.insert(0, str(ROOT))
    import auditor

from savings import QUICK_ROUNDS, WARMUP_ROUNDS, measure, step_seconds  # noqa: E402
from zoo_patches import ZOO, ZooModel, cause_keys, library_path, patched  # noqa: E402


def audit(model, inputs) -> auditor.Audit:
    model.zero_grad(set_to_none=True)
    torch.manual_seed(0)
    return auditor.audit(model, *inputs, record_source=True)


def top_cause(causes) -> str:
    if causes.empty:
        return "-"
    r = causes.iloc[0]
    path, _, line = r["source"].rpartition(":")
    return f"{r['pattern']} {library_path(path)}:{line}"


def model_row(z: ZooModel, batch: int, rounds: int) -> dict:
    model, inputs = z.make()
    before = audit(model, inputs)
    with patched(z.fixes, model):
        after = audit(model, inputs)
    causes = before.causes()
    timed = z.inputs(batch=batch)

    def version(fixes):
        def run():
            with patched(fixes, model):
                return step_seconds(model, timed)
        return run

    t = measure(version([]), version(z.fixes), rounds)
    q1, _, q3 = statistics.quantiles(t["ratios"], n=4)
    return {
        "causes": len(causes), "top": top_cause(causes),
        "pinned": cause_keys(causes) == {c.key for c in z.causes},
        "groups_before": len(before.hotspots()), "groups_after": len(after.hotspots()),
        "ms_before": t["before_us"] / 1e3, "ms_after": t["after_us"] / 1e3,
        "ratio": t["paired"], "q1": q1, "q3": q3,
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15, help="timed rounds per model (at least 4)")
    parser.add_argument("--batch", type=int, default=8, help="samples per timed step")
    parser.add_argument("--models", nargs="+", choices=[z.name for z in ZOO], help="only these models")
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_ROUNDS} rounds")
    args = parser.parse_args(argv)
    rounds = QUICK_ROUNDS if args.quick else args.rounds
    if rounds < 4:
        parser.error("--rounds must be at least 4")
    torch.set_num_threads(1)
    auditor.steady_malloc()
    zoo = [z for z in ZOO if not args.models or z.name in args.models]
    load = os.getloadavg()[0]
    start = time.perf_counter()
    print(f"torch {torch.__version__}, 1 thread, process CPU time; training step at batch {args.batch}, "
          f"{rounds} interleaved rounds after {WARMUP_ROUNDS} warm-up; load average {load:.2f}")
    print()
    print("| model | library | causes | as pinned | top cause | hotspot groups before -> after "
          "| step ms before | after | after/before | IQR |")
    print("|---|---|--:|---|---|--:|--:|--:|--:|---|")
    for z in zoo:
        m = model_row(z, args.batch, rounds)
        print(f"| {z.name} | {z.library} | {m['causes']} | {'yes' if m['pinned'] else 'no'} | {m['top']} "
              f"| {m['groups_before']} -> {m['groups_after']} | {m['ms_before']:.1f} | {m['ms_after']:.1f} "
              f"| {m['ratio']:.3f} | {m['q1']:.3f}-{m['q3']:.3f} |", flush=True)
    print()
    print(f"{time.perf_counter() - start:.0f} s; load average {load:.2f} before, {os.getloadavg()[0]:.2f} after. "
          "'as pinned': the causes are exactly the lines tests/test_zoo.py pins (no: a known auditor defect, "
          "listed there).")
    return 0


if __name__ == "__main__":
    sys.exit(main())
