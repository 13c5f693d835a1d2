"""Does ``saving_us`` predict what a fix saves? Estimate against measurement, model by model.

    .venv/bin/python benchmarks/savings.py [--rounds 15] [--audits 3] [--batch 2 8] [--models NAME ...] [--quick]

Cases: every planted-cause model of tests/planted.py (its input scaled up: 16 samples of
64x64, a batch-1 video of 8x32x32), against the same model with its cause rewritten away; and
every model of the zoo (tests/zoo_patches.py) that has fixes, at each of ``--batch`` samples
(2, the zoo's own input and the size an audit runs at, and 8), against the same model object
with the fixes applied in memory.

Estimate: ``Audit.causes()["saving_us"]`` summed over the causes the fix removes (those of the
audit before that the audit after no longer reports), from an audit of a training step at the
timed size (``auditor.audit`` defaults: profiler kernel times); the median over ``--audits``
audits, each after one warm-up step, and their range; ``trusted`` says whether every removed
cause's estimate is (``causes()["saving_trusted"]``; the notes of those that are not follow the
table).

Measured: the training step (forward, the sum of the outputs, backward; gradients reset outside
the timed region) before and after, alternating within every round, so that load from other
processes hits both alike; one thread, process CPU time (``auditor.steady_malloc()``
first). ``paired`` is the median over rounds of after/before within a round, and the measured
saving is median(before) x (1 - paired): the ratio within a round cancels the machine's drifts.
Its interval is the distribution-free 95% interval of that median (``auditor._measure``).

``--verified MODEL ...`` (``demo``: the demo's shufflenet_v2_x1_0 at 8x3x128x128; any other name:
the torchvision model at 8x3x224x224, random weights: at 2x3x128x128 mobilenet_v3_small's saving,
about 2% of its step, was within the noise at every setting, its interval crossing 0) judges the estimate as a user meets it: an
``auditor.audit`` at the process's thread count (``--threads``, default torch's own), then
``Fixes.verify``, one line per model: the ops' total against the step, the estimate of all fixes
(trusted or why not), the measured saving of all of them with its interval. Run it quiet and beside
busy processes (issue 29).

Target: estimate / measured within 0.5-2x, or the estimate inside the measured interval, for
every case whose measured saving is above 2% of its step and whose interval excludes 0 (others
are within this machine's noise and are shown, not judged; an untrusted estimate is shown as
such, not judged).
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
sys.path.insert(0, str(ROOT / "tests"))  # the planted models and the zoo are shared with the tests
sys.path.insert(0, str(ROOT))  # this checkout's package, whatever an editable install points at
from planted import CAUSE_MODELS, make_cause  # noqa: E402
from zoo_patches import ZOO, patched  # noqa: E402

import auditor  # noqa: E402
from auditor._measure._decide import median_interval, ratios  # noqa: E402
from auditor._step import Step  # noqa: E402

WARMUP_ROUNDS = 2
QUICK_ROUNDS = 5
JUDGED_ABOVE = 0.02  # of the step: smaller measured savings are not judged
LOW, HIGH = 0.5, 2.0
#: --verified's input for a torchvision model: ImageNet's size at batch 8, where a saving of 2% of
#: the step is measured apart from 0 (at 2x3x128x128 mobilenet_v3_small's never was)
VERIFIED_INPUT = (8, 3, 224, 224)


def scaled(shape: tuple[int, ...]) -> tuple[int, ...]:
    """A planted model's test input made big enough to time: 16 samples (a batch of 1 stays 1,
    it is the cause) and 8x the height and width (4x for a video, whose frames stay)."""
    batch = 1 if shape[0] == 1 else 16
    grow = 8 if len(shape) == 4 else 4
    return (batch, shape[1], *shape[2:-2], shape[-2] * grow, shape[-1] * grow)


def step_seconds(model, inputs) -> float:
    """CPU seconds of one training step; gradients reset beforehand, untimed."""
    step = Step(model, inputs).timed()  # the gradients reset before the clock starts
    model.zero_grad(set_to_none=True)
    t0 = time.process_time()
    step()
    return time.process_time() - t0


def estimate_us(before, after, audits: int) -> dict:
    """The saving_us of the causes that ``after`` removes: the median over audits, the range,
    their count, and the notes of those whose estimate is not trusted.

    ``before`` and ``after`` are callables that run a recorded audit of each version."""
    sums, count, notes = [], 0, set()
    for _ in range(audits):
        causes = before().causes()
        remaining = {(p, ph, s) for p, ph, s in after().causes()[["pattern", "phase", "source"]].itertuples(index=False)}
        removed = causes[[(r.pattern, r.phase, r.source) not in remaining for r in causes.itertuples()]]
        sums.append(float(removed["saving_us"].sum()))
        count = len(removed)
        notes |= set(removed.loc[~removed["saving_trusted"].astype(bool), "saving_note"])
    return {"estimate_us": statistics.median(sums), "estimate_low_us": min(sums), "estimate_high_us": max(sums),
            "causes": count, "untrusted": sorted(notes)}


def measure(run_before, run_after, rounds: int) -> dict:
    """Interleaved step times of both versions: each callable applies its version, then returns
    the seconds of one step taken inside it (so that applying a fix stays out of the time, which
    is why this is not :class:`auditor._measure._harness.Rounds`)."""
    times: dict[str, list[float]] = {"before": [], "after": []}
    for r in range(WARMUP_ROUNDS + rounds):
        for name in (("before", "after") if r % 2 else ("after", "before")):
            t = (run_before if name == "before" else run_after)()
            if r >= WARMUP_ROUNDS:
                times[name].append(t)
    before, after = statistics.median(times["before"]), statistics.median(times["after"])
    per_round = ratios(times["after"], times["before"])
    paired = statistics.median(per_round)
    low, high = median_interval(per_round)
    return {"before_us": before * 1e6, "after_us": after * 1e6, "saving_us": before * (1 - paired) * 1e6,
            "saving_low_us": before * (1 - high) * 1e6, "saving_high_us": before * (1 - low) * 1e6,
            "paired": paired, "ratios": per_round}


def planted_case(name: str, rounds: int, audits: int) -> dict:
    shape = CAUSE_MODELS[name][1]
    big = scaled(shape)
    versions = {fixed: make_cause(name, fixed=fixed, shape=big) for fixed in (False, True)}

    def audit(fixed):
        model, x = versions[fixed]
        return lambda: auditor.audit(model, x, warmup=1)

    est = estimate_us(audit(False), audit(True), audits)
    m = measure(lambda: step_seconds(*_unpack(versions[False])), lambda: step_seconds(*_unpack(versions[True])), rounds)
    return {"case": f"planted {name}", "input": "x".join(map(str, big)), **est, **m}


def zoo_case(z, batch: int, rounds: int, audits: int) -> dict:
    model, _ = z.make()
    inputs = z.inputs(batch=batch)

    def audit(fixes):
        def run():
            with patched(fixes, model):
                return auditor.audit(model, *inputs, warmup=1)
        return run

    with z.threads_set():
        est = estimate_us(audit([]), audit(z.fixes), audits)

    def step(fixes):
        def run():
            with patched(fixes, model):
                return step_seconds(model, inputs)
        return run

    m = measure(step([]), step(z.fixes), rounds)
    shape = "x".join(map(str, inputs[0].shape))
    return {"case": f"{z.library} {z.name}", "input": shape, **est, **m}


def _unpack(version):
    model, x = version
    return model, (x,)


def verdict(row: dict) -> str:
    if row["untrusted"]:
        return "untrusted"
    share = row["saving_us"] / row["before_us"]
    if share <= JUDGED_ABOVE or row["saving_low_us"] <= 0:
        return "not judged"
    ratio = row["estimate_us"] / row["saving_us"]
    inside = row["saving_low_us"] <= row["estimate_us"] <= row["saving_high_us"]
    return "PASS" if LOW <= ratio <= HIGH or inside else "FAIL"


HEADER = ("| case | input | causes fixed | step ms before | after | paired after/before | measured saving µs "
          "[95% interval] | % of step | estimated µs (audits' range) | estimated / measured | trusted | verdict |\n"
          "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|---|---|")


def row_text(row: dict) -> str:
    """One table row: the measured saving with its interval beside the estimate with its range."""
    ratio = row["estimate_us"] / row["saving_us"] if row["saving_us"] > 0 else float("nan")
    trusted = "yes" if not row["untrusted"] else f"no ({len(row['untrusted'])} note(s))"
    return (f"| {row['case']} | {row['input']} | {row['causes']} | {row['before_us'] / 1e3:.2f} "
            f"| {row['after_us'] / 1e3:.2f} | {row['paired']:.3f} | {row['saving_us']:.0f} "
            f"[{row['saving_low_us']:.0f}, {row['saving_high_us']:.0f}] "
            f"| {100 * row['saving_us'] / row['before_us']:.1f} | {row['estimate_us']:.0f} "
            f"({row['estimate_low_us']:.0f}-{row['estimate_high_us']:.0f}) | {ratio:.2f} | {trusted} "
            f"| {row['verdict']} |")


def parse(argv, names: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15, help="timed rounds per case (at least 4)")
    parser.add_argument("--audits", type=int, default=3, help="audits per estimate")
    parser.add_argument("--batch", type=int, nargs="+", default=[2, 8],
                        help="samples per zoo step, one table each (2: the audit's own size)")
    parser.add_argument("--models", nargs="+", choices=names, metavar="NAME", help=f"only these: {', '.join(names)}")
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_ROUNDS} rounds, 1 audit")
    parser.add_argument("--verified", nargs="+", metavar="MODEL",
                        help="judge audit + Fixes.verify on these (demo, or torchvision names) instead")
    parser.add_argument("--threads", type=int, default=None, help="with --verified: torch's thread count")
    args = parser.parse_args(argv)
    args.rounds = QUICK_ROUNDS if args.quick else args.rounds
    args.audits = 1 if args.quick else args.audits
    if args.rounds < 4:
        parser.error("--rounds must be at least 4")
    if args.audits < 1:
        parser.error("--audits must be at least 1")
    if min(args.batch) < 1:
        parser.error("--batch must be at least 1")
    return args


def table(args, names: list[str], zoo: list, batch: int, planted: bool) -> list[dict]:
    """One table: the zoo's cases at ``batch`` samples (and, with ``planted``, the planted ones,
    whose size is their own), printed as they are measured."""
    print(f"\nZoo at batch {batch}" + (" (planted models at their scaled size):\n" if planted else ":\n"))
    print(HEADER)
    rows = []
    for name in (args.models or names):
        if name in CAUSE_MODELS and not planted:
            continue
        if name in CAUSE_MODELS:
            row = planted_case(name, args.rounds, args.audits)
        else:
            row = zoo_case(next(z for z in zoo if z.name == name), batch, args.rounds, args.audits)
        row["verdict"] = verdict(row)
        rows.append(row)
        print(row_text(row), flush=True)
    notes = sorted({n for r in rows for n in r["untrusted"]})
    for n in notes:
        print(f"\nuntrusted: {n}")
    return rows


def verified_case(name: str) -> dict:
    """One model audited at the process's thread count, its fixes verified: the estimate of all
    of them against what Fixes.verify measured (as a user of the demo or the CLI meets them)."""
    import torchvision

    from auditor._analysis._costs import step_us, times_note

    torch.manual_seed(0)
    arch, dims = ("shufflenet_v2_x1_0", (8, 3, 128, 128)) if name == "demo" else (name, VERIFIED_INPUT)
    model = torchvision.models.get_model(arch, weights=None).train().to(memory_format=torch.channels_last)
    x = torch.randn(*dims).to(memory_format=torch.channels_last)
    a = auditor.audit(model, x)
    causes = a.causes()
    fixes = auditor.suggest_fixes(a)
    fixes = fixes.verify(model, x, rounds=7, budget_s=40)
    v = fixes.verification
    every = v[v["kind"] == "all"].iloc[0]
    fixed = set(v.loc[v["kind"] == "fix", "cause"].astype(int))
    mine = causes[causes["cause"].isin(fixed)]
    ops = a.ops()
    return {"case": name, "input": "x".join(map(str, dims)), "threads": torch.get_num_threads(),
            "audit_threads": a.threads, "ops_ms": ops["time_us"].sum() / 1e3, "span_ms": step_us(ops) / 1e3,
            "sane": not times_note(ops), "estimate_us": float(mine["saving_us"].sum()),
            "trusted": bool(mine["saving_trusted"].all()), "notes": sorted(set(mine["saving_note"]) - {""}),
            "measured_us": float(every["saving_us"]), "low_us": float(every["saving_low_us"]),
            "high_us": float(every["saving_high_us"]), "step_us": float(every["step_us_before"]),
            "verdict_fix": str(every["verdict"])}


def verified_main(args) -> int:
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; load average {os.getloadavg()[0]:.2f}")
    failed = 0
    for name in args.verified:
        r = verified_case(name)
        ratio = r["estimate_us"] / r["measured_us"] if r["measured_us"] > 0 else float("nan")
        inside = r["low_us"] <= r["estimate_us"] <= r["high_us"]
        noise = r["low_us"] <= 0 or r["measured_us"] < JUDGED_ABOVE * r["step_us"]
        ok = r["trusted"] and r["sane"] and (LOW <= ratio <= HIGH or inside)
        failed += not ok and not noise
        print(f"{r['case']:<20} {r['input']:<12} audit at {r['audit_threads']} thread(s): ops {r['ops_ms']:.1f} ms "
              f"of a {r['span_ms']:.1f} ms step{'' if r['sane'] else ' (MORE THAN THE STEP)'}; estimate "
              f"{r['estimate_us'] / 1e3:.2f} ms{'' if r['trusted'] else ' (not trusted)'}; measured "
              f"{r['measured_us'] / 1e3:.2f} ms [{r['low_us'] / 1e3:.2f}, {r['high_us'] / 1e3:.2f}] of a "
              f"{r['step_us'] / 1e3:.1f} ms step ({r['verdict_fix']}); estimate/measured {ratio:.2f} "
              f"{'within noise: shown, not judged' if noise else 'PASS' if ok else 'FAIL'}")
        for note in r["notes"]:
            print(f"    not trusted: {note}")
    print(f"load average {os.getloadavg()[0]:.2f} after")
    return 1 if failed else 0


def main(argv=None) -> int:
    planted = [n for n, (_, _, causes) in CAUSE_MODELS.items() if causes]
    zoo = [z for z in ZOO if z.causes]
    names = planted + [z.name for z in zoo]
    args = parse(argv, names)
    if args.verified:
        return verified_main(args)
    torch.set_num_threads(1)
    auditor.steady_malloc()
    load = os.getloadavg()[0]
    start = time.perf_counter()
    print(f"torch {torch.__version__}, 1 thread, process CPU time; {args.rounds} interleaved rounds after "
          f"{WARMUP_ROUNDS} warm-up, estimates the median of {args.audits} audit(s); load average {load:.2f}")
    rows = []
    for i, batch in enumerate(args.batch):
        rows += table(args, names, zoo, batch, planted=i == 0)
    judged = [r for r in rows if r["verdict"] in ("PASS", "FAIL")]
    failed = [f"{r['case']} {r['input']}" for r in judged if r["verdict"] == "FAIL"]
    print()
    print(f"{time.perf_counter() - start:.0f} s; load average {load:.2f} before, {os.getloadavg()[0]:.2f} after.")
    print(f"Target: estimate within {LOW}-{HIGH}x of the measured saving, or inside its interval, where it is above "
          f"{100 * JUDGED_ABOVE:.0f}% of the step and its interval excludes 0: {len(judged) - len(failed)} of "
          f"{len(judged)} judged cases" + (f"; outside: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
