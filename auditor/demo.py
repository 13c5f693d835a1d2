"""The whole loop on a real model: audit it, read the causes, verify the fixes (each applied to a
copy, re-audited, its outputs and gradients compared, the training step timed before and after),
hand over the patch, and apply the fixes.

    python -m auditor.demo [--model NAME] [--input N,C,H,W] [--rounds N] [--budget S] [--out DIR] [--force]

The default model is torchvision's ShuffleNetV2 (random weights), whose own code loses
channels_last: its channel shuffle is written ``view -> transpose -> .contiguous() -> view``,
which copies every block's activation into contiguous order, and every convolution after it
permutes it back. The fix rewrites the shuffle's statements in that function to
``torch.nn.functional.channel_shuffle``. The step is timed at one thread in process CPU time, in interleaved rounds, so the verdict holds
on a busy machine: a saving with its interval, or "within noise" when the load hides it. With
``--out`` the reports, the fixes, the verification, the patch, the heatmaps before and after and
the timing are written there (``make demo`` writes ``audit_out/``).
"""

from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path

import torch

import auditor
from auditor import plot
from auditor._display._fixes import applied_text, verification_text
from auditor._display._text import saving_text
from auditor._display._units import format_us
from auditor._recording._files import atomic_write

#: What ``--out`` receives.
DEMO_FILES = ("report_before.txt", "fixes.txt", "verify.csv", "fixes.patch", "report_after.txt",
              "heatmap_before.png", "heatmap_after.png", "timing.txt")
CL = torch.channels_last

__all__ = ["main"]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m auditor.demo", description=" ".join(__doc__.split("\n\n")[0].split()),
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--model", default="shufflenet_v2_x1_0", help="a torchvision classification model")
    p.add_argument("--input", default="8,3,128,128", help="the batch's shape N,C,H,W")
    p.add_argument("--rounds", type=int, default=7,
                   help="timed rounds first, before and after alternating (at least 3); more follow while the "
                        "interval of the saving straddles 0")
    p.add_argument("--budget", type=float, default=30.0, help="seconds of timing per verified fix, at most")
    p.add_argument("--out", default=None, help="folder for the reports, the patch, heatmaps and timings")
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
    if not args.budget > 0:
        build_parser().error("--budget must be a positive number of seconds")
    out = Path(args.out) if args.out else None
    if out is not None:
        existing = [f for f in DEMO_FILES if (out / f).exists()]
        if existing and not args.force:
            build_parser().error(f"--out {out} already holds a demo ({', '.join(existing)}); add --force")
        out.mkdir(parents=True, exist_ok=True)

    say = _Writer(out)
    say.section(f"1. Audit: {args.model}, input {'x'.join(map(str, dims))} channels_last, one training step")
    say("(building the model, then one warm-up step and one recorded step...)")

    import torchvision

    torch.manual_seed(0)
    model = torchvision.models.get_model(args.model, weights=None).train().to(memory_format=CL)
    x = torch.randn(*dims).to(memory_format=CL)
    before = auditor.audit(model, x, warmup=1)
    say(before.report(top=3), file="report_before.txt")

    say.section("2. The suggested fixes")
    fixes = auditor.suggest_fixes(before)
    say(str(fixes), file="fixes.txt")

    say.section("3. Verify them: each applied to a copy, re-audited, its outputs and gradients compared, and the "
                f"training step timed against the original's ({args.rounds}+ paired rounds, one thread, CPU time)")
    n = len(fixes)
    say(f"(each of the {n} fix{'es' if n != 1 else ''}{' and all together' if n > 1 else ''}: a copy audited twice, "
        f"its outputs compared, then up to {args.budget:g} s of timed rounds...)")
    fixes = fixes.verify(model, x, rounds=args.rounds, budget_s=args.budget)
    verified = fixes.verification
    say(verification_text(verified))
    say.write("verify.csv", lambda path: verified.to_csv(path, index=False))

    say.section("4. The patch: the source edits as a diff (apply it where it says)")
    patch = fixes.patch()
    say(patch or "(no source edits)", file="fixes.patch")

    say.section("5. Apply the fixes to a copy of the model and audit it")
    fixed = copy.deepcopy(model)
    say(applied_text(fixes.apply(fixed)) + "\n")
    with fixes.restored():
        expected = copy.deepcopy(model).eval()(x)
    got = copy.deepcopy(fixed).eval()(x)  # before its audit's steps move the batch-norm statistics
    after = auditor.audit(fixed, x, warmup=1)
    say(after.report(top=3), file="report_after.txt")
    say(f"outputs of the fixed copy equal the original's: {torch.allclose(got, expected, rtol=1e-4, atol=1e-5)}")
    fixes.undo()

    say.section("6. What the fixes save, measured")
    say(_timing_text(verified, before, after), file="timing.txt")

    if out is not None:
        for name, audit in (("heatmap_before.png", before), ("heatmap_after.png", after)):
            plot.save(plot.heatmap(audit), out / name)
        say.section(f"Files in {out}/: {', '.join(DEMO_FILES)}")
    return 0


def _timing_text(verified, before, after) -> str:
    """The step before and after every fix, the saving with its interval beside the audit's
    estimate, as a verdict."""
    together = verified[verified["kind"] == "all"]
    hot_b, hot_a = int(before.ops()["hotspot"].sum()), int(after.ops()["hotspot"].sum())
    if together.empty or not together["applied"].iloc[0]:
        return f"hotspot ops {hot_b} -> {hot_a}; no fix could be applied, so nothing was timed"
    r = together.iloc[0]
    return "\n".join([
        f"{'':24}{'before':>12}{'after':>12}",
        f"{'step (median)':24}{format_us(r['step_us_before']):>12}{format_us(r['step_us_after']):>12}",
        f"{'hotspot ops':24}{hot_b:>12}{hot_a:>12}",
        "",
        f"{saving_text(r)}",
        f"estimated by causes()['saving_us']: {format_us(r['estimated_us'])}; verdict: {r['verdict']}",
        f"(one thread, process CPU time, {int(r['rounds'])} rounds with before and after alternating: the ratio "
        "within each round is what load from other processes leaves alone)",
    ])


class _Writer:
    """Prints each part, and writes the ones named into ``out``."""

    def __init__(self, out: Path | None):
        self.out = out

    def section(self, title: str) -> None:
        print(f"\n== {title}\n", flush=True)

    def __call__(self, text: str, file: str | None = None) -> None:
        print(text, flush=True)
        if file is not None:
            self.write(file, lambda path: path.write_text(text + "\n"))

    def write(self, file: str, writer) -> None:
        if self.out is not None:
            atomic_write(self.out / file, writer)


if __name__ == "__main__":
    sys.exit(main())
