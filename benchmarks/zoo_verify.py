"""The zoo's causes, each fixed by the tool itself and verified: the table of issue "prove every fix".

    .venv/bin/python benchmarks/zoo_verify.py [--rounds 7] [--max-rounds 21] [--budget 20] [--models NAME ...]

For each model of the zoo and of its conv and token hybrids (tests/zoo_patches.py: timm,
segmentation_models_pytorch, diffusers and torchvision models, random weights, train mode,
channels_last, the zoo's small inputs): one
audit (one warm-up step), ``auditor.suggest_fixes``, then ``Fixes.verify``, which applies each
fix to a copy of the model (source edits in memory), re-audits it, compares outputs and
gradients in float64, and times the training step against the original's in interleaved rounds
at one thread, in process CPU time, until the interval of the paired ratio lies on one side of 1
or the budget ends. One row per cause: its pattern, whether its fix is automatic, the cause's
hotspot groups before and after, same outputs, the audit's estimate, the measured saving with
its interval and the verdict; then one row per model for all its fixes together.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # the zoo is shared with the tests
try:
    import auditor
except ImportError:  # run from a checkout without the editable install
    sys.path.insert(0, str(ROOT))
    import auditor

from zoo_patches import HYBRIDS, ZOO, library_path  # noqa: E402

from auditor._display._units import format_us  # noqa: E402


def _saving(r) -> str:
    if pd.isna(r["saving_us"]):
        return "-"
    return f"{format_us(r['saving_us'])} [{format_us(r['saving_low_us'])}, {format_us(r['saving_high_us'])}]"


def _where(source: str) -> str:
    path, _, line = str(source).rpartition(":")
    return f"{library_path(path)}:{line}" if path else str(source)


def model_rows(z, timing: dict) -> list[dict]:
    """One row per cause of ``z``, and one for its fixes together."""
    model, inputs = z.make()
    with z.threads_set():
        a = auditor.audit(model, *inputs, warmup=1)
        f = auditor.suggest_fixes(a)
        f = f.verify(model, *inputs, **timing)
        v = f.verification
    automatic = dict(zip(f.frame["fix"], f.frame["automatic"]))
    rows = []
    for r in v.to_dict("records"):
        rows.append({
            "model": z.name, "kind": r["kind"], "pattern": r["pattern"] if r["kind"] != "all" else "(all)",
            "source": _where(r["source"]) if r["kind"] != "all" else "",
            "fix": ("automatic" if automatic.get(r["fix"], True) else "by hand") if r["kind"] != "all" else "",
            "hotspots": f"{r['hotspots_before']} -> {r['hotspots_after']}" if r["applied"] else f"{r['hotspots_before']}",
            "same_outputs": r["same_outputs"] if r["applied"] else "-",
            "rel_diff": f"{r['max_rel_diff']:.0e}" if r["applied"] and pd.notna(r["max_rel_diff"]) else "-",
            "estimated": format_us(r["estimated_us"]) if pd.notna(r["estimated_us"]) else "-",
            "measured": _saving(r), "ratio": f"{r['ratio']:.3f}" if pd.notna(r["ratio"]) else "-",
            "rounds": int(r["rounds"]) if pd.notna(r["rounds"]) else 0, "verdict": r["verdict"],
            "reason": r["reason"] or "",
        })
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--max-rounds", type=int, default=21)
    p.add_argument("--budget", type=float, default=20.0, help="seconds of timing per verification")
    p.add_argument("--models", nargs="*", help="zoo model names (default: all)")
    args = p.parse_args(argv)
    timing = {"rounds": args.rounds, "max_rounds": args.max_rounds, "budget_s": args.budget}
    chosen = [z for z in ZOO + HYBRIDS if not args.models or z.name in args.models]
    rows = []
    for z in chosen:
        try:
            __import__(z.library)
        except ImportError:
            print(f"{z.name}: {z.library} is not installed, skipped", file=sys.stderr)
            continue
        rows.extend(model_rows(z, timing))
        print(f"{z.name}: done", file=sys.stderr, flush=True)
    table = pd.DataFrame(rows)
    print(f"torch {torch.__version__}, one thread, process CPU time; rounds {args.rounds} to {args.max_rounds}, "
          f"budget {args.budget:g} s per verification")
    print(table.drop(columns=["reason"]).to_string(index=False))
    causes = table[table["kind"] != "all"]
    hybrid = causes["model"].isin([z.name for z in HYBRIDS])
    for name, part in (("the zoo", causes[~hybrid]), ("the conv and token hybrids", causes[hybrid]),
                       ("both", causes)):
        auto = int((part["fix"] == "automatic").sum())
        print(f"{name}: {auto} of {len(part)} causes fixed automatically ({auto / max(len(part), 1):.0%})")
    print("by hand:\n" + "\n".join(f"  {r.model} {r.pattern} at {r.source}: {r.reason.removeprefix('by hand: ')}"
                                     for r in causes.itertuples() if r.fix == "by hand"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
