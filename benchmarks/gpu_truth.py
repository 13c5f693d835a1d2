"""The whole GPU check in one prepared run: what fake CUDA audits, the correction table and the
hidden-conversion reader claim, against a real GPU.

    python benchmarks/gpu_truth.py --out benchmarks/results/gpu     # on a machine with a GPU
    python benchmarks/gpu_truth.py --dry-run --out /tmp/gpu_truth    # the same code, on CPU

Writes Markdown (``gpu_truth.md``) and CSV tables to ``--out``:

1. ``corpus.csv``, ``models.csv``: a real audit on the device against a fake CUDA audit of the same
   step, output format by output format (tests/op_corpus.py's comparison), in float32 and under
   ``torch.autocast`` float16 and bfloat16, over the op corpus and a few torchvision models; for
   the models also cause by cause (phase, op, pattern).
2. ``amp_ratios.csv``: a training step in channels_last against the same in contiguous, under AMP,
   timed in interleaved pairs with CUDA events (per pair: channels_last / contiguous).
3. ``verify.csv``: ``Fixes.verify`` on the models with causes. Its timer is the wall clock with the
   device synchronized around each sample (``_measure._harness.sync``); it takes no CUDA-event
   timer, so the AMP ratios of 2 are the CUDA-event numbers.
4. ``compiled.csv``: a compiled audit (Triton kernels) of two models: the conversions Inductor's
   generated code makes (``Audit.compiled.conversions()``).
5. ``hidden.csv``: the conversions inside ops (``Audit.hidden``), CUDA's own kernels named and timed.

``--dry-run`` runs every part on CPU (the "real" audits are CPU audits, the fake ones fake cuda
where this torch allows, else fake cpu), on tiny inputs, so the script is exercised by the suite
(tests/test_gpu_truth.py); its numbers mean nothing about a GPU.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import os
import statistics
import sys
import time
import traceback
from pathlib import Path

import pandas as pd
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from op_corpus import OPS, case, disagreement  # noqa: E402

import auditor  # noqa: E402

MODELS = ("resnet18", "resnet50", "mobilenet_v3_small", "shufflenet_v2_x0_5", "efficientnet_b0", "densenet121")
DRY_MODELS = ("resnet18", "shufflenet_v2_x0_5")
COMPILED = ("resnet18", "mobilenet_v3_small")
PRECISIONS = {"float32": None, "autocast_fp16": torch.float16, "autocast_bf16": torch.bfloat16}


class Plan:
    def __init__(self, dry: bool, budget_s: float = 420.0):
        self.dry = dry
        self.deadline = time.perf_counter() + budget_s  # rows past it are skipped, and say so
        self.device = torch.device("cpu" if dry else "cuda")
        from auditor._recording._torch import fake_device_problem

        self.fake_device = "cuda" if fake_device_problem("cuda") is None or not dry else "cpu"
        self.models = DRY_MODELS if dry else MODELS
        self.batch, self.size = (2, 64) if dry else (32, 224)
        self.cases = sorted(OPS)[:6] if dry else sorted(OPS)
        self.precisions = ("float32", "autocast_bf16") if dry else tuple(PRECISIONS)


def autocast(device: torch.device, precision: str):
    dtype = PRECISIONS[precision]
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=dtype)


def _causes(a) -> set:
    c = a.causes()
    return set(zip(c["phase"].astype(str), c["op"].astype(str), c["pattern"].astype(str)))


def build(name: str, plan: Plan):
    import torchvision.models as tvm

    kwargs = {"aux_logits": False, "init_weights": False} if name in ("googlenet", "inception_v3") else {}
    torch.manual_seed(0)
    model = getattr(tvm, name)(weights=None, **kwargs).to(plan.device).to(memory_format=torch.channels_last)
    x = torch.randn(plan.batch, 3, plan.size, plan.size, device=plan.device).to(memory_format=torch.channels_last)
    return model, x


def compare(make, plan: Plan, precision: str) -> dict:
    """A real audit on the device against a fake one for the fake device, under ``precision``."""
    model, x = make()
    with autocast(plan.device, precision):
        real = auditor.audit(model, x, record_time=False)
    model, x = make()
    with autocast(torch.device(plan.fake_device), precision):
        fake = auditor.audit(model, x, fake=True, device=plan.fake_device)
    diffs = disagreement(real, fake)
    rc, fc = _causes(real), _causes(fake)
    return {"agree": not diffs, "differences": len(diffs), "first": diffs[0] if diffs else "",
            "causes_real": len(rc), "causes_fake": len(fc), "causes_equal": rc == fc,
            "causes_real_only": "; ".join(map(str, sorted(rc - fc)))[:300],
            "causes_fake_only": "; ".join(map(str, sorted(fc - rc)))[:300]}


_PLAN: list[Plan] = []


def guarded(row: dict, fn) -> dict:
    t0 = time.perf_counter()
    if _PLAN and t0 > _PLAN[0].deadline:
        row["skipped"] = "over the time budget (--budget-s)"
        return row
    try:
        row.update(fn())
    except Exception as exc:  # a row says what failed; the run goes on
        row["error"] = f"{type(exc).__name__}: {exc}"[:300]
        traceback.print_exc(limit=3)
    row["seconds"] = round(time.perf_counter() - t0, 2)
    return row


def part_corpus(plan: Plan) -> pd.DataFrame:
    rows = []
    for name in plan.cases:
        for precision in plan.precisions:
            def make(name=name):
                model, x = case(name)
                return model.to(plan.device), x.to(plan.device)
            rows.append(guarded({"case": name, "precision": precision},
                                lambda make=make, precision=precision: compare(make, plan, precision)))
    return pd.DataFrame(rows)


def part_models(plan: Plan) -> pd.DataFrame:
    rows = []
    for name in plan.models:
        for precision in plan.precisions:
            rows.append(guarded({"model": name, "precision": precision},
                                lambda name=name, precision=precision: compare(lambda: build(name, plan), plan,
                                                                               precision)))
    return pd.DataFrame(rows)


def _step(model, x, precision, device):
    with autocast(device, precision):
        loss = model(x).float().sum()
    loss.backward()
    model.zero_grad(set_to_none=True)


def _timer(device: torch.device):
    if device.type == "cuda":
        def timed(fn, n):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(n):
                fn()
            end.record()
            torch.cuda.synchronize()
            return start.elapsed_time(end) * 1e3 / n  # us
    else:
        def timed(fn, n):
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            return (time.perf_counter() - t0) * 1e6 / n
    return timed


def part_amp(plan: Plan) -> pd.DataFrame:
    rows = []
    rounds, per = (2, 1) if plan.dry else (7, 5)
    timed = _timer(plan.device)
    for name in plan.models:
        for precision in plan.precisions[1:]:
            def run(name=name, precision=precision):
                cl, x = build(name, plan)
                nchw = copy.deepcopy(cl).to(memory_format=torch.contiguous_format)
                xc = x.contiguous()
                for _ in range(2):  # warm up both (cuDNN's autotuning, allocator)
                    _step(cl, x, precision, plan.device)
                    _step(nchw, xc, precision, plan.device)
                ratios, cl_us, nchw_us = [], [], []
                for r in range(rounds):
                    pair = [("cl", cl, x), ("nchw", nchw, xc)]
                    if r % 2:
                        pair.reverse()
                    got = {k: timed(lambda m=m, i=i: _step(m, i, precision, plan.device), per) for k, m, i in pair}
                    ratios.append(got["cl"] / got["nchw"])
                    cl_us.append(got["cl"])
                    nchw_us.append(got["nchw"])
                return {"channels_last_us": statistics.median(cl_us), "contiguous_us": statistics.median(nchw_us),
                        "ratio_median": statistics.median(ratios), "ratio_min": min(ratios),
                        "ratio_max": max(ratios), "rounds": rounds,
                        "timer": "cuda events" if plan.device.type == "cuda" else "perf_counter"}
            rows.append(guarded({"model": name, "precision": precision}, run))
    return pd.DataFrame(rows)


def part_verify(plan: Plan) -> pd.DataFrame:
    rows = []
    for name in plan.models[:2] if plan.dry else plan.models[:3]:
        def run(name=name):
            model, x = build(name, plan)
            a = auditor.audit(model, x)
            if a.causes().empty:
                return {"causes": 0, "note": "no causes: nothing to verify"}
            fixes = auditor.suggest_fixes(a)
            table = fixes.verify(model, x, budget_s=2.0 if plan.dry else 12.0, rounds=3 if plan.dry else 7,
                                 max_rounds=3 if plan.dry else 21).verification
            keep = [c for c in table.columns if table[c].dtype.kind in "biufO"][:12]
            return {"causes": len(a.causes()), "verify": table[keep].to_string(max_colwidth=40)[:1500],
                    "timer": "wall clock, device synchronized (Fixes.verify takes no CUDA-event timer)"}
        rows.append(guarded({"model": name}, run))
    return pd.DataFrame(rows)


def part_compiled(plan: Plan) -> pd.DataFrame:
    rows = []
    names = ("relu", "group_norm") if plan.dry else COMPILED
    for name in names:
        def run(name=name):
            if plan.dry:
                model, x = case(name)
            else:
                model, x = build(name, plan)
            a = auditor.audit(model, x, compile=True)
            conv = a.compiled.conversions()
            cmp = auditor.compare_compiled(a, a)
            return {"conversions": len(conv), "conversion_us": float(conv["time_us"].sum()) if len(conv) else 0.0,
                    "kernels": ", ".join(conv["kernel"].astype(str).head(8)) if len(conv) else "",
                    "eager_causes": len(a.causes()), "compare": cmp.to_string(max_colwidth=40)[:800]}
        rows.append(guarded({"model": name}, run))
    return pd.DataFrame(rows)


def part_hidden(plan: Plan) -> pd.DataFrame:
    rows = []
    targets = [("case", n) for n in (("group_norm", "adaptive_max_pool2d", "grid_sample") if plan.dry else
                                      ("group_norm", "adaptive_max_pool2d", "grid_sample", "depthwise_conv",
                                       "conv_transpose", "interpolate_bilinear"))]
    targets += [("model", n) for n in plan.models]
    for kind, name in targets:
        for precision in plan.precisions:
            def run(kind=kind, name=name, precision=precision):
                if kind == "case":
                    model, x = case(name)
                    model, x = model.to(plan.device), x.to(plan.device)
                else:
                    model, x = build(name, plan)
                with autocast(plan.device, precision):
                    a = auditor.audit(model, x)
                h = a.hidden
                ops = a.events["op"].astype(str)
                fmt = h[h["kind"].astype(str) == "format"]
                device = fmt[fmt["via"].astype(str).str.contains("Kernel|kernel|transpose")]
                return {"hidden": len(h), "format": len(fmt), "device_kernels": len(device),
                        "format_us": float(fmt["time_us"].sum()),
                        "kernels": "; ".join(sorted({f"{ops[int(s)]}: {v.rsplit(' > ', 1)[-1][:60]}"
                                                     for s, v in zip(fmt["seq"], fmt["via"].astype(str))}))[:600]}
            rows.append(guarded({"kind": kind, "name": name, "precision": precision}, run))
    return pd.DataFrame(rows)


#: in the order they run: the cheapest and most wanted first, so a run cut short by its budget
#: still brings back the comparisons
PARTS = {"corpus": part_corpus, "models": part_models, "hidden": part_hidden, "amp_ratios": part_amp,
         "verify": part_verify, "compiled": part_compiled}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "gpu"))
    p.add_argument("--dry-run", action="store_true", help="every part on CPU, tiny inputs (the suite runs this)")
    p.add_argument("--parts", default=",".join(PARTS), help="comma-separated subset of " + ",".join(PARTS))
    p.add_argument("--budget-s", type=float, default=420.0,
                   help="seconds for all parts; rows past it are skipped and marked (default 420: a lent GPU's "
                        "8 minutes, with the machine's start and Python's imports)")
    args = p.parse_args(argv)
    if not args.dry_run and not torch.cuda.is_available():
        p.error("no GPU here: pass --dry-run")
    plan = Plan(args.dry_run, args.budget_s)
    _PLAN[:] = [plan]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    env = {"torch": torch.__version__, "device": torch.cuda.get_device_name() if not plan.dry else "cpu (dry run)",
           "cudnn": torch.backends.cudnn.version(), "fake_device": plan.fake_device,
           "auditor": os.path.dirname(auditor.__file__)}
    md = ["# GPU truth" + (" (dry run: CPU, numbers say nothing about a GPU)" if plan.dry else ""), "",
          "| | |", "| --- | --- |", *[f"| {k} | {v} |" for k, v in env.items()], ""]
    t_all = time.perf_counter()
    for part in args.parts.split(","):
        t0 = time.perf_counter()
        frame = PARTS[part](plan)
        frame.to_csv(out / f"{part}.csv", index=False)
        took = time.perf_counter() - t0
        print(f"{part}: {len(frame)} rows in {took:.1f} s", flush=True)
        md += [f"## {part} ({took:.0f} s)", ""]
        if "agree" in frame:
            md += [f"agree: {int(frame['agree'].fillna(False).sum())} of {len(frame)}", ""]
        show = frame.drop(columns=[c for c in ("verify", "compare") if c in frame])
        md += [show.to_markdown(index=False) if _has_tabulate() else show.to_string(index=False), ""]
    md += [f"total: {time.perf_counter() - t_all:.0f} s"]
    (out / "gpu_truth.md").write_text("\n".join(md) + "\n")
    print(f"wrote {out}/gpu_truth.md", flush=True)
    return 0


def _has_tabulate() -> bool:
    try:
        import tabulate  # noqa: F401
    except ImportError:
        return False
    return True


if __name__ == "__main__":
    sys.exit(main())
