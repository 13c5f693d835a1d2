"""The whole loop on a real model: audit it, read the causes, apply the fixes, audit again, and
time the training step before and after.

    python -m auditor.demo [--model NAME] [--input N,C,H,W] [--rounds N] [--out DIR] [--force]

The default model is torchvision's ShuffleNetV2 (random weights), whose own code loses
channels_last: its channel shuffle is written ``view -> transpose -> .contiguous() -> view``,
which copies every block's activation into contiguous order, and every convolution after it
permutes it back. The suggested fix swaps the function for ``torch.nn.functional.channel_shuffle``.
With ``--out`` the reports, the fixes, the heatmaps before and after and the timings are
written there (``make demo`` writes ``audit_out/``).
"""

from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path

import torch

import auditor
from auditor import plot
from auditor._step import Step
from auditor.plan import default_clock, time_interleaved
from auditor.recording._files import atomic_write

#: What ``--out`` receives.
DEMO_FILES = ("report_before.txt", "fixes.txt", "report_after.txt", "heatmap_before.png", "heatmap_after.png",
              "timing.txt")
CL = torch.channels_last


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m auditor.demo", description=" ".join(__doc__.split("\n\n")[0].split()),
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--model", default="shufflenet_v2_x1_0", help="a torchvision classification model")
    p.add_argument("--input", default="8,3,128,128", help="the batch's shape N,C,H,W")
    p.add_argument("--rounds", type=int, default=7, help="timed rounds, before and after alternating (at least 3)")
    p.add_argument("--out", default=None, help="folder for the reports, heatmaps and timings")
    p.add_argument("--force", action="store_true", help="overwrite an earlier demo's files in --out")
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        dims = tuple(int(d) for d in args.input.split(","))
    except ValueError:
        dims = ()
    if len(dims) != 4 or min(dims) < 1:
        build_parser().error(f"--input must be four positive integers N,C,H,W, got {args.input!r}")
    if args.rounds < 3:
        build_parser().error("--rounds must be at least 3")
    out = Path(args.out) if args.out else None
    if out is not None:
        existing = [f for f in DEMO_FILES if (out / f).exists()]
        if existing and not args.force:
            build_parser().error(f"--out {out} already holds a demo ({', '.join(existing)}); add --force")
        out.mkdir(parents=True, exist_ok=True)

    import torchvision

    torch.manual_seed(0)
    model = torchvision.models.get_model(args.model, weights=None).train().to(memory_format=CL)
    x = torch.randn(*dims).to(memory_format=CL)
    say = _Writer(out)

    say.section(f"1. Audit: {args.model}, input {'x'.join(map(str, dims))} channels_last, one training step")
    before = auditor.audit(model, x, warmup=1)
    say(before.report(top=3), file="report_before.txt")

    say.section("2. The suggested fixes")
    fixes = auditor.suggest_fixes(before)
    say(str(fixes), file="fixes.txt")

    say.section("3. Apply them to a copy of the model")
    fixed = copy.deepcopy(model)
    applied = fixes.apply(fixed)
    say(applied.to_string(index=False))

    say.section("4. Audit the fixed copy")
    after = auditor.audit(fixed, x, warmup=1)
    say(after.report(top=3), file="report_after.txt")
    with fixes.restored():
        expected = model(x)
    same = torch.allclose(fixed(x), expected, rtol=1e-4, atol=1e-5)
    say(f"outputs of the fixed copy equal the original's: {same}")

    say.section(f"5. Time the training step, before and after alternating ({args.rounds} rounds, medians)")
    timing = _time(model, fixed, x, fixes, args.rounds)
    estimated = float(before.causes()["saving_us"].sum())
    say(_timing_text(timing, estimated, before, after), file="timing.txt")

    if out is not None:
        for name, audit in (("heatmap_before.png", before), ("heatmap_after.png", after)):
            plot.save(plot.heatmap(audit), out / name)
        say.section(f"Files in {out}/: {', '.join(DEMO_FILES)}")
    return 0


def _time(model, fixed, x, fixes, rounds: int):
    before_step, after_step = (Step(m, (x,)).timed() for m in (model, fixed))

    def before():
        with fixes.restored():
            before_step()

    return time_interleaved({"before": before, "after": after_step}, repeats=rounds, min_sample_us=0.0)


def _timing_text(timing, estimated_us: float, before, after) -> str:
    b, a = timing.loc["before"], timing.loc["after"]
    clock = default_clock()
    tb, ta = b[f"{clock}_us"], a[f"{clock}_us"]
    hot_b, hot_a = before.ops()["hotspot"].sum(), after.ops()["hotspot"].sum()
    return "\n".join([
        f"{'':24}{'before':>12}{'after':>12}",
        f"{'step (median)':24}{auditor.display.format_us(tb):>12}{auditor.display.format_us(ta):>12}",
        f"{'spread (IQR / median)':24}{b[f'{clock}_spread']:>12.1%}{a[f'{clock}_spread']:>12.1%}",
        f"{'hotspot ops':24}{hot_b:>12}{hot_a:>12}",
        "",
        f"after / before: {ta / tb:.3f} ({(1 - ta / tb):.1%} faster); measured saving "
        f"{auditor.display.format_us(tb - ta)}, estimated by causes()['saving_us'] "
        f"{auditor.display.format_us(estimated_us)}",
        f"({torch.get_num_threads()} threads, {clock} clock; the machine's load moves single runs: "
        "compare within a run, not across runs)",
    ])


class _Writer:
    """Prints each part, and writes the ones named into ``out``."""

    def __init__(self, out: Path | None):
        self.out = out

    def section(self, title: str) -> None:
        print(f"\n== {title}\n", flush=True)

    def __call__(self, text: str, file: str | None = None) -> None:
        print(text, flush=True)
        if self.out is not None and file is not None:
            atomic_write(self.out / file, lambda tmp: tmp.write_text(text + "\n"))


if __name__ == "__main__":
    sys.exit(main())
