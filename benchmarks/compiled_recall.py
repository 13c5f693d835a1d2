"""How many of the conversion kernels in Inductor's generated code a compiled audit lists (recall),
and how many rows it lists that are none (false rows), against conversions read by hand.

    .venv/bin/python benchmarks/compiled_recall.py [--models LIB:NAME ...] [--batch 2] [--size 64]
        [--truth benchmarks/compiled_truth.json] [--show]

For each model (``torchvision:NAME`` or ``timm:NAME``, random weights, train mode, channels_last
model and input), one untimed compiled audit of the training step (``auditor.audit(model, x,
compile=True, record_time=False)``); its ``Audit.compiled.conversions()`` are compared, per phase,
with the kernels listed for the model, this torch release and input in ``--truth``.

The truth file holds what a person read in the generated code (``TORCH_LOGS=output_code``, or
the files ``Audit.compiled.graphs()["output_code"]`` names): per model, the kernels that read an
image (an activation or gradient with as many elements as a convolution's input or output) in
one physical order and store it in another, whatever rank or sizes the stored buffer is declared
with, and the kernels that move only statistics or other non-image tensors (listed under
``not``, to say they were looked at). ``--show`` prints every C++ kernel call of each graph with
its buffers' sizes, strides and formats (following ``reinterpret_tensor`` aliases and reuses), const
(read) or written, which is how the truth was read:
a kernel whose store covers an image in an order of strides its load does not is a conversion.
Kernel names are Inductor's, so a truth holds for one torch release (the key says which).
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_MODELS = ["timm:convnext_atto", "timm:cspresnet50", "torchvision:shufflenet_v2_x0_5",
                  "torchvision:squeezenet1_1"]


def parse(argv) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=DEFAULT_MODELS, metavar="LIB:NAME")
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--truth", default=str(ROOT / "benchmarks" / "compiled_truth.json"))
    parser.add_argument("--show", action="store_true", help="print each graph's kernel calls with their buffers")
    return parser.parse_args(argv)


_VIEW = re.compile(r"^\s*(\w+) = reinterpret_tensor\(\w+, (\([^()]*\)), (\([^()]*\)), [^)]*\)")
_REUSE = re.compile(r"^\s*(\w+) = (\w+); del \w+\s+# reuse")


def show(path: str) -> None:
    """Every C++ kernel call of one output file, with each pointer argument's layout."""
    from auditor import format_label
    from tests.test_compiled import _BINDING, _CALL, _ints, _layouts

    code = open(path).read()
    layouts = _layouts(code)
    # a buffer made as a view of another (reinterpret_tensor ... # alias, or # reuse), and a plain
    # reuse of one, in the order the code makes them, so that chains of reuses resolve
    for line in code.splitlines():
        view, plain = _VIEW.match(line), _REUSE.match(line)
        if view:
            layouts[view[1]] = (_ints(view[2]), _ints(view[3]))
        elif plain and plain[2] in layouts:
            layouts[plain[1]] = layouts[plain[2]]
    kinds = {k: [(t, p.split()[-1]) for t, p in zip(ast.literal_eval(v), params.split(","))]
             for k, v, params in _BINDING.findall(code)}
    for kernel, args in _CALL.findall(code):
        print(f"  {kernel}")
        for name, (kind, _) in zip([a.strip() for a in args.split(",")], kinds[kernel]):
            if kind.endswith("*"):
                lay = layouts.get(name)
                print(f"      {'R' if kind.startswith('const') else 'W'} {name} {lay} {format_label(*lay) if lay else '?'}")


def main(argv=None) -> int:
    args = parse(argv)
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", tempfile.mkdtemp(prefix="auditor_recall_"))
    sys.path.insert(0, str(ROOT))
    import torch

    import auditor
    from benchmarks.compiled import make

    torch.set_num_threads(1)
    release = ".".join(torch.__version__.split("+")[0].split(".")[:2])
    shape = f"{args.batch}x3x{args.size}x{args.size}"
    truth = json.loads(Path(args.truth).read_text()) if Path(args.truth).exists() else {}
    print(f"torch {torch.__version__}, input {shape}, truth {args.truth}\n")
    print("| model | phase | conversions in the code (read by hand) | listed | found | missed | false rows |")
    print("|---|---|--:|--:|--:|--:|--:|")
    totals = [0, 0, 0]
    for spec in args.models:
        model, x = make(spec, args.batch, args.size)
        a = auditor.audit(model, x, compile=True, record_time=False)
        conv = a.compiled.conversions()
        if args.show:
            for g in a.compiled.graphs().to_dict("records"):
                print(f"{spec} graph {g['graph']} {g['phase']}: {g['output_code']}")
                show(g["output_code"])
        known = truth.get(f"{spec}@{shape}@torch{release}", {})
        for phase in ("forward", "backward"):
            listed = set(conv.loc[conv["phase"] == phase, "kernel"])
            if phase not in known:
                print(f"| {spec} | {phase} | (no truth read) | {len(listed)} | | | |")
                print(f"  listed: {sorted(listed)}", file=sys.stderr)
                continue
            want = set(known[phase])
            found, missed, false = len(listed & want), sorted(want - listed), sorted(listed - want)
            totals[0] += len(want)
            totals[1] += found
            totals[2] += len(false)
            print(f"| {spec} | {phase} | {len(want)} | {len(listed)} | {found} | {len(missed)} | {len(false)} |")
            for name, rows in (("missed", missed), ("false", false)):
                if rows:
                    print(f"  {name}: {rows}", file=sys.stderr)
    if totals[0]:
        print(f"\nrecall {totals[1]}/{totals[0]} = {totals[1] / totals[0]:.3f}; false rows {totals[2]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
