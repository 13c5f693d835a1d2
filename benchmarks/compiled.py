"""What ``torch.compile`` does to a model's layout conversions, and what the compiled step costs.

    .venv/bin/python benchmarks/compiled.py [--rounds 15] [--batch 2] [--size 64] [--models LIB:NAME ...]

For each model (``torchvision:NAME`` or ``timm:NAME``, random weights, train mode, channels_last
model and input of ``--batch`` samples of ``--size`` x ``--size``), one compiled audit of the
training step (forward, the sum of the outputs, backward): ``auditor.audit(model, x,
compile=True)``. The row says how many causes the eager step has (``Audit.causes()``), how many
of them the compiler removes (``compare_compiled``: ``removed by the compiler``), and the
conversions left in the compiled step (``Audit.compiled.conversions()``: their count, total kernel time
and which kernels, forward or backward).

Then the step's time, compiled against eager: the model is compiled again (Dynamo reset) and
warmed up outside the timed region, and both steps are timed in interleaved rounds at one
thread, in process CPU time (``auditor._measure._harness.time_interleaved``); ``compiled / eager`` is the
median over rounds of the ratio within a round, with its distribution-free 98% interval
(``auditor._measure._decide.CONFIDENCE``).

Compiles are slow on a small machine: keep the input small (the default, 2 x 3 x 64 x 64, is audited and compiled
in 1-4 minutes per model on two cores). Inductor's cache goes to a fresh folder under /tmp
(``--cache-dir`` to choose one), so that every run lowers what it reports.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

DEFAULT_MODELS = ["torchvision:shufflenet_v2_x0_5", "torchvision:mobilenet_v3_small", "timm:convnext_atto"]
WARMUP_STEPS = 2
REMOVED = "removed by the compiler"


def parse(argv) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=DEFAULT_MODELS, metavar="LIB:NAME",
                        help=f"torchvision:NAME or timm:NAME (default: {' '.join(DEFAULT_MODELS)})")
    parser.add_argument("--batch", type=int, default=2, help="samples per step")
    parser.add_argument("--size", type=int, default=64, help="input height and width")
    parser.add_argument("--rounds", type=int, default=15, help="timed rounds per model (at least 4)")
    parser.add_argument("--cache-dir", help="TORCHINDUCTOR_CACHE_DIR (default: a fresh folder under /tmp)")
    args = parser.parse_args(argv)
    if args.rounds < 4:
        parser.error("--rounds must be at least 4")
    for spec in args.models:
        if spec.partition(":")[0] not in ("torchvision", "timm"):
            parser.error(f"--models takes torchvision:NAME or timm:NAME, got {spec!r}")
    return args


def make(spec: str, batch: int, size: int):
    """The model (train mode, channels_last) and its input, from ``torchvision:NAME`` or ``timm:NAME``."""
    import torch
    library, _, name = spec.partition(":")
    torch.manual_seed(0)
    if library == "timm":
        import timm
        model = timm.create_model(name, pretrained=False, num_classes=10)
    else:
        import torchvision
        model = getattr(torchvision.models, name)(num_classes=10)
    model = model.train().to(memory_format=torch.channels_last)
    x = torch.randn(batch, 3, size, size).to(memory_format=torch.channels_last)
    return model, x


def training_step(model, params, x):
    """One training step of ``model`` (eager or compiled), gradients of ``params`` reset first."""
    def run():
        for p in params:
            p.grad = None
        model(x).sum().backward()
    return run


def kernels_text(conv) -> str:
    """The conversion kernels, as ``phase kernel (from->to)``, at most four named."""
    names = [f"{r.phase} {r.kernel} ({r.from_format}->{r.to_format}{', weight' if r.weight else ''})"
             for r in conv.itertuples()]
    return "; ".join(names[:4]) + (f"; ... {len(names) - 4} more" if len(names) > 4 else "") if names else "-"


def audit_row(spec: str, model, x) -> dict:
    """The compiled audit's figures: eager causes, those removed, the conversions left."""
    import auditor
    t0 = time.perf_counter()
    a = auditor.audit(model, x, compile=True)
    seconds = time.perf_counter() - t0
    compared = auditor.compare_compiled(a, a)
    conv = a.compiled.conversions()
    return {"model": spec, "audit_s": seconds, "causes": len(a.causes()),
            "removed": int((compared["status"] == REMOVED).sum()),
            "conversions": len(conv), "conversion_us": float(conv["time_us"].sum()), "kernels": kernels_text(conv)}


def timing_row(model, x, rounds: int) -> dict:
    """The compiled step against the eager one, compiled and warmed up outside the timed rounds."""
    import torch

    from auditor._measure._harness import time_interleaved
    params = list(model.parameters())
    torch.compiler.reset()
    compiled = torch.compile(model)
    steps = {"eager": training_step(model, params, x), "compiled": training_step(compiled, params, x)}
    t0 = time.perf_counter()
    for _ in range(WARMUP_STEPS):
        for step in steps.values():
            step()
    compile_s = time.perf_counter() - t0
    table = time_interleaved(steps, repeats=rounds, threads=1, min_sample_us=20000)
    return {"compile_s": compile_s, "eager_us": table.at["eager", "us"], "compiled_us": table.at["compiled", "us"],
            "ratio": table.at["compiled", "ratio"], "low": table.at["compiled", "ratio_low"],
            "high": table.at["compiled", "ratio_high"], "clock": table.at["compiled", "clock"]}


HEADER = ("| model | input | eager causes | removed by the compiler | conversions left | their time µs "
          "| conversion kernels | eager step ms | compiled step ms | compiled / eager [interval] |\n"
          "|---|---|--:|--:|--:|--:|---|--:|--:|--:|")


def row_text(row: dict, shape: str) -> str:
    return (f"| {row['model']} | {shape} | {row['causes']} | {row['removed']} | {row['conversions']} "
            f"| {row['conversion_us']:.0f} | {row['kernels']} | {row['eager_us'] / 1e3:.2f} "
            f"| {row['compiled_us'] / 1e3:.2f} | {row['ratio']:.3f} [{row['low']:.3f}, {row['high']:.3f}] |")


def main(argv=None) -> int:
    args = parse(argv)
    # before torch is imported: Inductor reads its cache folder once
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = args.cache_dir or tempfile.mkdtemp(prefix="auditor_compiled_bench_")
    import torch
    try:
        import auditor  # noqa: F401
    except ImportError:  # run from a checkout without the editable install
        sys.path.insert(0, str(ROOT))
    torch.set_num_threads(1)  # lowered for, and timed at, one thread
    shape = f"{args.batch}x3x{args.size}x{args.size}"
    rows = []
    for spec in args.models:
        model, x = make(spec, args.batch, args.size)
        row = audit_row(spec, model, x)
        row.update(timing_row(model, x, args.rounds))
        print(f"{spec}: audit {row['audit_s']:.0f} s, compile and warm-up {row['compile_s']:.0f} s", file=sys.stderr)
        rows.append(row)
    print(f"torch {torch.__version__}, one thread, {rows[0]['clock'] if rows else 'cpu'} time, "
          f"{args.rounds} interleaved rounds, Inductor cache {os.environ['TORCHINDUCTOR_CACHE_DIR']}\n")
    print(HEADER)
    for row in rows:
        print(row_text(row, shape))
    return 0


if __name__ == "__main__":
    sys.exit(main())
