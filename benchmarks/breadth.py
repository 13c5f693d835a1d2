"""The breadth corpus: the fix engine measured on models it was not built against (issue 28).

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/breadth.py            # the whole corpus
    .venv/bin/python benchmarks/breadth.py --resume                      # go on where it stopped
    .venv/bin/python benchmarks/breadth.py --models resnet18 timm/dla46x_c
    .venv/bin/python benchmarks/breadth.py --sample                      # the test suite's sample
    .venv/bin/python benchmarks/breadth.py --list                        # the corpus, not run
    .venv/bin/python benchmarks/breadth.py --summary                     # the Markdown again

The corpus: one model per architecture family of timm (each ``timm.models`` module that
registers models, its smallest by parameter count, counted on the meta device once and cached
in ``results/breadth_corpus.json``); every torchvision classification, segmentation,
detection, video and optical-flow builder (``weights=None, weights_backbone=None``); the
diffusers and segmentation-models-pytorch models of ``tests/zoo_patches.py``. Random weights,
nothing downloaded (the worker refuses every network connection).

Each model runs in a subprocess of its own, with a timeout, so a crash or a hang is one row:
the smallest input it accepts (tried from small to large, batch 2), train mode, model and input
channels_last; one training step audited (``auditor.audit(model, x, warmup=1)``);
``auditor.suggest_fixes``; ``Fixes.verify`` with a small timing budget; the patch
(``Fixes.patch()``, checked with ``git apply --check`` against a scratch git repository that
holds copies of the files it touches). Then the layout regression of issue 28 item 2, as
``Fixes.verify`` measures it: its row of every automatic fix together audited all-contiguous
(model and input) before and after (``contiguous_hotspots_before``/``_after``); a fix that adds
hotspot groups there makes code that runs contiguous worse. Where the audited step has a map a
convolution or pool made 1x1 from a larger one, or a tensor with no element (an FPN level that got
no region), the model is audited again at its default input size, and each cause says whether it
is there too (issue 38 item 5).

The user models (``benchmarks/user_models.py``, issue 38 item 6) run three ways: imported as a
module, as the script being run (``python user_models.py --worker ...``: ``__main__``) and in a
notebook cell executed by a Jupyter kernel (nbclient).

Only auditor's public facade is used: ``auditor.audit``, ``auditor.suggest_fixes`` and what the
returned ``Fixes`` and ``Audit`` offer.

Writes ``results/breadth.csv`` (a row per cause, per exposed cause and per model, appended as
each model finishes) and ``results/breadth.md`` (the summary).
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import copy
import csv
import dataclasses
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from collections import Counter
from collections.abc import Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
CSV_PATH = RESULTS / "breadth.csv"
MD_PATH = RESULTS / "breadth.md"
CORPUS_CACHE = RESULTS / "breadth_corpus.json"
sys.path.insert(0, str(ROOT))  # the auditor of this checkout, not another one installed

#: The verdict of a cause with no fix of its own that the automatic fixes remove (Fixes.verify's table).
REMOVED = "removed by the other fixes"

#: A fixed sample of fast, diverse models for the test suite (about 80 s of CPU): a
#: squeeze-excite network, a channel shuffle, a segmentation decoder, a conv/token hybrid, a
#: detection model (list inputs, targets, a loss dict), and a model with no convolution to skip.
SAMPLE = [
    "timm/test_efficientnet",
    "torchvision/shufflenet_v2_x0_5",
    "segmentation_models_pytorch/smp_fpn_resnet18",
    "timm/mobilevit_xxs",
    "torchvision/fasterrcnn_mobilenet_v3_large_320_fpn",
    "timm/test_vit",
]

#: The small models written as users write them (``benchmarks/user_models.py``), each run three
#: ways: imported as a module, as the script being run (``__main__``) and in a notebook's cells.
USER_FILE = ROOT / "benchmarks" / "user_models.py"
USER_SOURCES = {"user_module": "user/module", "user_script": "user/script (__main__)",
                "user_notebook": "user/notebook cell"}
#: name -> class of the user models, where the worker runs them (set by the script or the cell)
_USER_MODELS: dict[str, type] = {}

#: torchvision builders by task (quantized models are left out: they are not a training format)
TV_TASKS = {"classification": "", "segmentation": "segmentation", "detection": "detection",
            "video": "video", "optical_flow": "optical_flow"}

#: the columns of breadth.csv
COLUMNS = [
    "model", "source", "family", "row", "status", "error", "input", "params", "convs",
    # a cause (row "cause") or a cause the fixes exposed (row "exposed")
    "cause", "phase", "pattern", "location", "action", "automatic", "applied", "verdict", "verified",
    "reason", "hotspots_before", "hotspots_after", "same_outputs", "max_rel_diff", "changed_outputs",
    # the model (on every row of it)
    "causes", "automatic_verified", "by_hand", "exposed", "hotspot_groups", "all_hotspots", "all_verdict",
    "contiguous_hotspots_before", "contiguous_hotspots_after", "layout_regression",
    "patch_files", "patch_check", "seconds", "stages",
    # issue 38 item 5: a map that became 1x1, or a tensor with no element, at the audited size; the
    # model then audited at its default input size too (the model row), and whether each cause is there
    "small_maps", "default_input", "default_causes", "at_default",
]


def _setup_env() -> None:
    """Nothing may be fetched: hubs offline, torch's cache an empty folder of our own."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    if "BREADTH_TORCH_HOME" not in os.environ:  # made by the parent, shared by its workers
        os.environ["BREADTH_TORCH_HOME"] = tempfile.mkdtemp(prefix="breadth-torch-home-")
        atexit.register(shutil.rmtree, os.environ["BREADTH_TORCH_HOME"], True)
    os.environ["TORCH_HOME"] = os.environ["BREADTH_TORCH_HOME"]


# -- the corpus --------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Entry:
    """One model of the corpus: ``source/name`` is its id."""

    name: str
    source: str  # timm, torchvision, diffusers, segmentation_models_pytorch
    family: str  # the timm module, the torchvision task (and module), "zoo"
    params: int = 0  # 0: not known before building

    @property
    def id(self) -> str:
        return f"{self.source}/{self.name}"


def _timm_smallest() -> dict[str, tuple[str, int]]:
    """Per timm module that registers models: (its smallest model by parameters, the count),
    counted on the meta device (about 3 minutes for every timm model), cached per timm release."""
    import timm
    import torch

    if CORPUS_CACHE.exists():
        cached = json.loads(CORPUS_CACHE.read_text())
        if cached.get("timm_version") == timm.__version__:
            return {m: tuple(v) for m, v in cached["timm"].items()}
    best: dict[str, tuple[str, int]] = {}
    for module in timm.list_modules():
        for name in timm.list_models(module=module):
            try:
                with warnings.catch_warnings(), torch.device("meta"):
                    warnings.simplefilter("ignore")
                    m = timm.create_model(name, pretrained=False)
            except Exception:  # a model that cannot be built on meta is not a candidate
                continue
            n = sum(p.numel() for p in m.parameters())
            if module not in best or (n, name) < (best[module][1], best[module][0]):
                best[module] = (name, n)
    RESULTS.mkdir(parents=True, exist_ok=True)
    CORPUS_CACHE.write_text(json.dumps({"timm_version": timm.__version__, "timm": best}, indent=1, sort_keys=True) + "\n")
    return best


def _tv_params(name: str) -> int:
    import torchvision.models as tm

    try:
        return int(next(iter(tm.get_model_weights(name))).meta["num_params"])
    except Exception:
        return 0


def corpus() -> list[Entry]:
    """Every model of the corpus, in the order they run: the smallest of each family first (so
    a partial run covers the most families), then the rest by parameter count."""
    import torchvision.models as tm

    sys.path.insert(0, str(ROOT / "tests"))
    from zoo_patches import ZOO

    entries = [Entry(name, "timm", module, n) for module, (name, n) in sorted(_timm_smallest().items())]
    for task, sub in TV_TASKS.items():
        module = getattr(tm, sub) if sub else tm
        for name in tm.list_models(module=module):
            family = task
            if task == "classification":
                family = f"classification/{tm.get_model_builder(name).__module__.rsplit('.', 1)[-1]}"
            entries.append(Entry(name, "torchvision", family, _tv_params(name)))
    for z in ZOO:
        if z.library in ("diffusers", "segmentation_models_pytorch"):
            entries.append(Entry(z.name, z.library, "zoo", 0))
    for name in _user_models():
        entries += [Entry(name, source, family, 0) for source, family in USER_SOURCES.items()]
    first, rest, seen = [], [], set()
    for e in sorted(entries, key=lambda e: (e.params or 1, e.id)):
        key = (e.source, e.family)
        (rest if key in seen else first).append(e)
        seen.add(key)
    return first + rest


def _user_models() -> dict[str, type]:
    """The user models by name: those the running script or cell handed over, else the file's."""
    if _USER_MODELS:
        return _USER_MODELS
    import importlib.util

    if "user_models" not in sys.modules:  # imported as a module, as from an installed package
        spec = importlib.util.spec_from_file_location("user_models", USER_FILE)
        module = importlib.util.module_from_spec(spec)
        sys.modules["user_models"] = module
        spec.loader.exec_module(module)
    return dict(sys.modules["user_models"].MODELS)


def select(entries: list[Entry], names: list[str]) -> list[Entry]:
    """The entries named by id (``timm/resnet18``) or bare name (every source's)."""
    out = []
    for n in names:
        hit = [e for e in entries if n in (e.id, e.name)]
        if not hit:
            raise SystemExit(f"no model {n!r} in the corpus (see --list)")
        out += [e for e in hit if e not in out]
    return out


# -- building a model and its inputs (in the worker) -------------------------------------------------


def _total(output):
    """The loss: the sum of every floating tensor in the output (tensors, sequences, mappings,
    dataclasses such as diffusers' outputs), those that require grad where any does."""
    found = []

    def walk(o):
        if isinstance(o, __import__("torch").Tensor):
            if o.is_floating_point():
                found.append(o)
        elif isinstance(o, Mapping):
            for v in o.values():
                walk(v)
        elif isinstance(o, (list, tuple)):
            for v in o:
                walk(v)
        elif dataclasses.is_dataclass(o) and not isinstance(o, type):
            for f in dataclasses.fields(o):
                walk(getattr(o, f.name))

    walk(output)
    grad = [t for t in found if t.requires_grad]
    parts = [t.sum() for t in (grad or found)]
    if not parts:
        raise TypeError(f"no floating tensor in the model's output ({type(output).__name__})")
    total = parts[0]
    for p in parts[1:]:
        total = total + p
    return total


def _list_model(model, targets: list[dict]):
    """A torchvision detection model (images as a list of 3-d tensors, and targets in training)
    behind a forward that takes one 4-d batch: the targets are buffers, so ``.double()`` and
    ``.to()`` convert them with the model."""
    import torch.nn as nn

    class ListInput(nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model
            self.keys = [list(t) for t in targets]
            for i, t in enumerate(targets):
                for k, v in t.items():
                    self.register_buffer(f"target{i}_{k}", v)

        def forward(self, x):
            images = list(x.unbind(0))
            if not self.training:
                return self.model(images)
            targets = [{k: getattr(self, f"target{i}_{k}") for k in keys} for i, keys in enumerate(self.keys)]
            return self.model(images, targets)

    return ListInput()


def _targets(name: str, size: int, batch: int) -> list[dict]:
    import torch

    out = []
    for i in range(batch):
        boxes = torch.tensor([[0.1, 0.1, 0.6, 0.7], [0.3, 0.2, 0.9, 0.8]]) * size
        t = {"boxes": boxes + i, "labels": torch.tensor([1, 1])}  # class 1 exists in every head (keypoint R-CNN has 2)
        if "maskrcnn" in name:
            masks = torch.zeros(2, size, size, dtype=torch.uint8)
            for j, b in enumerate(boxes.long()):
                masks[j, b[1]:b[3], b[0]:b[2]] = 1
            t["masks"] = masks
        if "keypointrcnn" in name:
            kp = torch.rand(2, 17, 3, generator=torch.Generator().manual_seed(i))
            kp[..., :2] = boxes[:, None, :2] + kp[..., :2] * (boxes[:, None, 2:] - boxes[:, None, :2])
            kp[..., 2] = 1
            t["keypoints"] = kp
        out.append(t)
    return out


class Built:
    """A model of the corpus made for one input size: ``make()`` gives (model, inputs, kwargs)."""

    BATCH = 2

    def __init__(self, e: Entry):
        self.e = e

    # the sizes tried, smallest first; each a tuple (C, T?, H, W) without the batch
    def sizes(self, model) -> list[tuple[int, ...]]:
        e = self.e
        if e.source == "torchvision" and e.family == "video":
            return sorted({(3, t, s, s) for t in (4, 8, 16) for s in (32, 64, 112, 224)},
                          key=lambda c: (c[1] * c[2] * c[3], c[2]))
        if e.source == "torchvision" and e.family == "optical_flow":
            return [(3, s, s) for s in (64, 96, 128, 192, 256)]
        if e.source == "torchvision" and e.family == "detection":
            return [(3, s, s) for s in (64, 96, 128, 192, 256, 300, 320)]  # 300: ssd300's own
        if e.source in ("diffusers", "segmentation_models_pytorch"):
            return [tuple(self._zoo().shape[1:])]
        if e.source in USER_SOURCES:
            return [(3, 32, 32)]
        sizes = [32, 64, 96, 128, 160, 192, 224, 256, 299]
        cfg = getattr(model, "pretrained_cfg", None) or {}
        top = max(cfg.get("input_size", (3, 224, 224))[-1], 299)  # torchvision's inception_v3 needs 299
        low = (cfg.get("min_input_size") or (3, 0, 0))[-1]
        chosen = [s for s in sizes if low <= s <= top]
        if top not in chosen:
            chosen.append(top)
        return [(3, s, s) for s in chosen]

    def default_size(self, audited: tuple[int, ...]) -> tuple[int, ...]:
        """The input size the model is made for, without the batch: a timm model's
        ``pretrained_cfg``; torchvision's classifiers 224 (inception_v3 299), its video models
        16 frames of 112, its detection and optical-flow models the largest size tried here (their
        own defaults, 800 pixels and more, are too large for a CPU's training step); the zoo's and
        the user models' their one size (``audited``)."""
        e = self.e
        if e.source == "timm":
            cfg = getattr(self.build(meta=True), "pretrained_cfg", None) or {}
            return tuple(cfg.get("input_size", (3, 224, 224)))
        if e.source == "torchvision":
            if e.family == "video":
                return (3, 16, 112, 112)
            if e.family in ("detection", "optical_flow", "segmentation"):
                return self.sizes(None)[-1] if e.family != "segmentation" else (3, 224, 224)
            return (3, 299, 299) if e.name == "inception_v3" else (3, 224, 224)
        return audited

    def _zoo(self):
        sys.path.insert(0, str(ROOT / "tests"))
        from zoo_patches import ZOO

        return next(z for z in ZOO if z.name == self.e.name)

    def build(self, size: tuple[int, ...] | None = None, img_size: int | None = None, meta: bool = False):
        """The model, random weights, seeded; ``size`` (C, H, W) sets a detection model's
        transform; ``img_size`` is passed to a timm model that takes one."""
        import torch

        torch.manual_seed(0)
        ctx = torch.device("meta") if meta else contextlib.nullcontext()
        e = self.e
        with ctx, warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if e.source == "timm":
                import timm

                extra = {"img_size": img_size} if img_size else {}
                return timm.create_model(e.name, pretrained=False, **extra)
            if e.source == "torchvision":
                import torchvision.models as tm

                kwargs = {"weights": None}
                if e.family in ("segmentation", "detection"):
                    kwargs["weights_backbone"] = None
                if e.name in ("googlenet", "inception_v3"):
                    kwargs["init_weights"] = True  # the old initialisation; the new one warns
                model = tm.get_model(e.name, **kwargs)
                if e.family == "detection" and size is not None and not meta:
                    t = model.transform
                    t.min_size, t.max_size = (size[-1],), size[-1]
                    if getattr(t, "fixed_size", None) is not None:
                        t.fixed_size = (size[-2], size[-1])
                    model = _list_model(model, _targets(e.name, size[-1], self.BATCH))
                return model
            if e.source in USER_SOURCES:
                cls = _user_models()[e.name]
                where = "user_models" if e.source == "user_module" else "__main__"  # a cell's classes too
                if cls.__module__ != where:
                    raise RuntimeError(f"{e.id} is defined in {cls.__module__}, not in {where}")
                return cls()
            return self._zoo().build()

    def inputs(self, size: tuple[int, ...], memory_format) -> tuple[tuple, dict]:
        import torch

        e = self.e
        g = torch.Generator().manual_seed(1)
        shape = (self.BATCH, *size)
        x = torch.rand(shape, generator=g) if e.family == "detection" else torch.randn(shape, generator=g)
        x = x.contiguous(memory_format=memory_format)
        if e.source == "torchvision" and e.family == "optical_flow":
            y = torch.randn(shape, generator=g).contiguous(memory_format=memory_format)
            return (x, y), {"num_flow_updates": 2}
        if e.source in ("diffusers", "segmentation_models_pytorch"):
            return (x, *self._zoo().extra()), {}
        return (x,), {}


def _fmt(size, rank: int):
    import torch

    if rank == 5:
        return torch.channels_last_3d
    return torch.channels_last


def _convs(model) -> tuple[int, int]:
    """(2-d and 3-d convolution modules, those that are not patch embeddings: kernel == stride)."""
    import torch.nn as nn

    convs = [m for m in model.modules() if isinstance(m, (nn.Conv2d, nn.Conv3d, nn.ConvTranspose2d, nn.ConvTranspose3d))]
    real = [m for m in convs if tuple(m.kernel_size) != tuple(m.stride) or all(k == 1 for k in m.kernel_size)]
    return len(convs), len(real)


def _runs(b: Built, model, size) -> bool:
    import torch

    args, kwargs = b.inputs(size, torch.contiguous_format)
    try:
        with torch.no_grad():
            _total(model.train()(*args, **kwargs))
        return True
    except Exception:
        return False


def _smallest_input(b: Built) -> tuple[object, tuple[int, ...]]:
    """(the model, the smallest input size it runs at), or raise: sizes tried from small to
    large; a timm model that only runs at its large default is built again with a smaller
    ``img_size`` where it takes one."""
    sizes = b.sizes(None if b.e.source != "timm" else b.build(meta=True))
    model = None
    for size in sizes:
        if model is None or b.e.family == "detection":
            model = b.build(size)
        if _runs(b, model, size):
            break
    else:
        raise RuntimeError(f"the model runs at none of the input sizes {[s[-1] for s in sizes]}")
    if b.e.source == "timm" and size[-1] > 128:
        for s in (64, 96, 128):
            if s >= size[-1]:
                break
            try:
                smaller = b.build(img_size=s)
            except TypeError:
                break
            except Exception:
                continue
            if _runs(b, smaller, (3, s, s)):
                return smaller, (3, s, s)
    return model, size


# -- one model (the worker) --------------------------------------------------------------------------


def _no_network() -> None:
    """Every connection refused in the worker: a model that tries to fetch weights fails loudly."""
    import socket

    def refuse(*args, **kwargs):
        raise ConnectionRefusedError("breadth.py: no network (random weights only)")

    socket.socket.connect = refuse
    socket.socket.connect_ex = refuse
    socket.create_connection = refuse


def _where(source) -> str:
    path, _, line = str(source).rpartition(":")
    if not path:
        return str(source)
    short = re.split(r"[\\/](?:site|dist)-packages[\\/]", path)[-1]
    if short == path and path.startswith(str(ROOT)):
        short = os.path.relpath(path, ROOT)
    return f"{short}:{line}"


def _exception_line(exc: BaseException) -> str:
    """``Type: message`` (first line), and the innermost frame in auditor's code, if any."""
    msg = str(exc).strip().splitlines()
    text = f"{type(exc).__name__}: {msg[0] if msg else ''}"[:300]
    frames = traceback.extract_tb(exc.__traceback__)
    mine = [f for f in frames if f"{os.sep}auditor{os.sep}" in f.filename]
    if mine:
        text += f" (at {_where(f'{mine[-1].filename}:{mine[-1].lineno}')})"
    return text


def check_patch(text: str) -> tuple[int, str]:
    """(files the patch touches, ``ok`` / ``failed: ...`` / ``no edits`` / ``not checked: ...``):
    each touched file copied into a scratch git repository at the path the diff names, then
    ``git apply --check``."""
    names = re.findall(r"^diff --git a/(\S+) b/", text, flags=re.M)
    if not names:
        return 0, "no edits"
    origins = {}
    for note, name in re.findall(r"^# (.*)\ndiff --git a/(\S+) b/", text, flags=re.M):
        m = re.match(r"installed library file: a diff against (.+?) \(apply with", note)
        if m:
            origins[name] = m.group(1)
            continue
        m = re.match(r"project file under (.+?) \(apply there", note)
        if m:
            origins[name] = os.path.join(m.group(1), name)
        m = re.match(r"file (.+?), in no project \(apply in", note)
        if m:
            origins[name] = m.group(1)
        if re.search(r" is no file on disk \(a notebook cell, say\)", note):
            return len(names), "no file: a notebook cell, fixed and verified in memory"
    missing = [n for n in names if n not in origins or not os.path.isfile(origins[n])]
    if missing:
        return len(names), f"not checked: no file on disk for {missing[0]}"
    with tempfile.TemporaryDirectory(prefix="breadth-patch-") as tmp:
        subprocess.run(["git", "init", "-q", tmp], check=True)
        for n in names:
            dest = Path(tmp, n)
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(origins[n], dest)
        Path(tmp, "fixes.patch").write_text(text)
        r = subprocess.run(["git", "apply", "--check", "fixes.patch"], cwd=tmp, capture_output=True, text=True)
    if r.returncode == 0:
        return len(names), "ok"
    return len(names), "failed: " + " ".join(r.stderr.split())[:200]


class Stages:
    """Seconds per stage, and the stage running (on stderr, for the parent to name on a hang)."""

    def __init__(self):
        self.seconds: dict[str, float] = {}
        self.current = ""

    @contextlib.contextmanager
    def __call__(self, name: str):
        self.current = name
        print(f"STAGE {name}", file=sys.stderr, flush=True)
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start

    def text(self) -> str:
        return " ".join(f"{k}={v:.1f}" for k, v in self.seconds.items())


def _hotspot_groups(a) -> int:
    return int(len(a.hotspots()))


#: ops that shrink a map by their window and stride: one whose output is 1x1 from a larger input
#: (or through a window larger than 1) made that map 1x1 because the input is small, not by design
#: as a global pool or a squeeze-excite's 1x1 convolutions on a pooled map are
_SHRINKING = ("aten.convolution.", "aten.max_pool2d_with_indices.", "aten.max_pool3d_with_indices.",
              "aten.avg_pool2d.", "aten.avg_pool3d.", "aten.mkldnn_convolution.")


def _shape(text: str) -> tuple[int, ...]:
    return tuple(int(v) for v in re.findall(r"-?\d+", str(text)))


def small_maps(a) -> str:
    """What at the audited size exists only because the input is small, from the recorded shapes:
    convolutions and pools (forward) that make a 1x1 map from a larger one or through a larger
    window, and tensors with no element (an FPN level that got no region); "" when none."""
    ev, t = a.events, a.tensors
    forward = set(ev.loc[ev["phase"] == "forward", "seq"].tolist())
    ops = dict(zip(ev["seq"], ev["op"].astype(str)))
    shrunk = set()
    images = t[t["ndim"].isin([4, 5]) & (t["seq"].isin(forward))]
    for seq, rows in images.groupby("seq", observed=True):
        if not ops.get(seq, "").startswith(_SHRINKING):
            continue
        outs = [_shape(s) for s in rows.loc[rows["role"] == "output", "shape"]]
        ins = [_shape(s) for s, p in zip(rows.loc[rows["role"] == "input", "shape"],
                                         rows.loc[rows["role"] == "input", "position"]) if p in (0, 1)]
        if outs and all(d == 1 for d in outs[0][2:]) and any(any(d > 1 for d in i[2:]) for i in ins):
            shrunk.add(seq)
    empty = t[(t["ndim"] >= 2) & (t["bytes"] == 0) & ~t["is_param"]]
    empty_ops = len(set(empty["seq"].tolist()))
    parts = []
    if shrunk:
        parts.append(f"{len(shrunk)} convolution or pool call{'s' * (len(shrunk) > 1)} make a 1x1 map")
    if empty_ops:
        parts.append(f"{empty_ops} op call{'s' * (empty_ops > 1)} read or write a tensor with no element")
    return "; ".join(parts)


def _cause_key(pattern, phase, op, source) -> tuple:
    """A cause, recognised at another input size: its pattern, phase, op and line."""
    return (str(pattern), str(phase), str(op), _where(source))


def run_model(e: Entry, rounds: int, budget: float, max_params: float) -> list[dict]:
    """Every row of one model: its causes, the causes its fixes exposed, and the model row."""
    import pandas as pd
    import torch

    import auditor

    start = time.perf_counter()
    stages = Stages()
    model_row: dict = {"model": e.name, "source": e.source, "family": e.family, "row": "model"}
    rows: list[dict] = []

    def done(status: str, error: str = "") -> list[dict]:
        if "can't allocate memory" in error or "MemoryError" in error:
            status = "out of memory"  # the harness's --memory-gb limit, not the auditor's fault
        model_row.update(status=status, error=error, seconds=round(time.perf_counter() - start, 1),
                         stages=stages.text())
        for r in rows:
            for k in ("causes", "automatic_verified", "by_hand", "exposed", "hotspot_groups", "all_hotspots", "all_verdict",
                      "contiguous_hotspots_before", "contiguous_hotspots_after", "layout_regression",
                      "patch_files", "patch_check", "seconds", "input", "params", "convs",
                      "small_maps", "default_input", "default_causes"):
                r.setdefault(k, model_row.get(k, ""))
            r.setdefault("status", status)
        return [*rows, model_row]

    b = Built(e)
    # -- is it convolutional, and small enough: decided on the meta device where it builds there
    with stages("check"):
        try:
            probe = b.build(meta=True)
        except Exception:
            try:
                probe = b.build()
            except Exception as exc:
                return done("model error", _exception_line(exc))
        n_params = sum(p.numel() for p in probe.parameters())
        convs, real = _convs(probe)
        model_row.update(params=n_params, convs=convs)
        del probe
    if convs == 0:
        return done("skipped: no convolution")
    if real == 0:
        return done(f"skipped: no convolution but {convs} patch embedding{'s' * (convs > 1)} (kernel = stride)")
    if n_params > max_params:
        return done(f"skipped: {n_params / 1e6:.0f}M parameters, over --max-params {max_params / 1e6:.0f}M")

    with stages("input"):
        try:
            model, size = _smallest_input(b)
        except Exception as exc:
            return done("model error", _exception_line(exc))
    rank = len(size) + 1
    cl = _fmt(size, rank)
    model_row["input"] = "x".join(str(s) for s in (Built.BATCH, *size))
    model = model.train().to(memory_format=cl)
    args, kwargs = b.inputs(size, cl)
    step = {"kwargs": kwargs, "loss_fn": _total}

    try:
        with stages("audit"):
            a = auditor.audit(model, *args, warmup=1, **step)
        if not a.complete:
            return done("auditor crash", f"the step raised under the audit: {a.error}"[:300])
        with stages("suggest"):
            fixes = auditor.suggest_fixes(a)
            frame = fixes.frame
            causes = a.causes()
        model_row["hotspot_groups"] = _hotspot_groups(a)
        with stages("verify"):
            fixes = fixes.verify(model, *args, rounds=rounds, max_rounds=rounds, budget_s=budget, **step)
            v = fixes.verification
        with stages("patch"):
            files, check = check_patch(fixes.patch())
            model_row.update(patch_files=files, patch_check=check)
        # -- the layout regression: verify's own all-contiguous audit of every automatic fix together
        together = v[v["kind"] == "all"]
        if len(together):
            cb, ca = together["contiguous_hotspots_before"].iloc[0], together["contiguous_hotspots_after"].iloc[0]
        else:  # no cause, so no fix and no row: the contiguous run is the model's own, audited once
            with stages("contiguous"):
                plain = copy.deepcopy(model).to(memory_format=torch.contiguous_format)
                cargs, _ = b.inputs(size, torch.contiguous_format)
                own = auditor.audit(plain, *cargs, warmup=1, record_time=False, **step)
                cb = ca = _hotspot_groups(own) if own.complete else pd.NA
        if pd.isna(ca):  # nothing applied: the contiguous run is the model's own
            ca = cb
        if not pd.isna(cb):
            model_row.update(contiguous_hotspots_before=int(cb), contiguous_hotspots_after=int(ca),
                             layout_regression=int(ca) > int(cb))
        frame = fixes.frame  # verify proves candidates and takes fixes that hurt contiguous off the automatic ones
        model_row["small_maps"] = small_maps(a)
        at_default = None
        default = b.default_size(size)
        if model_row["small_maps"] and len(causes) and default != size:
            with stages("default size"):
                at_default = _causes_at(b, default, step)
            model_row["default_input"] = "x".join(str(s) for s in (Built.BATCH, *default))
            model_row["default_causes"] = len(at_default) if at_default is not None else "failed"
    except Exception as exc:
        if stages.current == "audit":  # does the model itself fail in channels_last, unaudited?
            try:
                _total(copy.deepcopy(model)(*args, **kwargs)).backward()
            except Exception as own:
                return done("model error", f"fails in channels_last without the auditor: {_exception_line(own)}")
        return done("auditor crash", f"{stages.current}: {_exception_line(exc)}")

    phase = dict(zip(causes["cause"], causes["phase"])) if len(causes) else {}
    keys = {int(c.cause): _cause_key(c.pattern, c.phase, c.op, c.source) for c in causes.itertuples()}
    by_fix = {int(r["fix"]): r for r in v.to_dict("records") if r["kind"] == "fix"}
    n_verified = n_hand = 0
    for f in frame.to_dict("records"):
        r = by_fix.get(int(f["fix"]), {})
        applied = bool(r.get("applied", False))
        same = r.get("same_outputs") if applied else None
        after = r.get("hotspots_after") if applied else None
        automatic = bool(f["automatic"])
        # a cause left by hand that the automatic fixes, made together, remove with the same values
        removed = r.get("verdict") == REMOVED
        if removed:
            same, after = r.get("same_outputs"), r.get("hotspots_after")
        verified = bool((automatic and applied or removed) and same is True and after is not None and int(after) == 0)
        reason = "" if automatic else str(f["reason"] or "")
        if automatic and not applied:
            reason = str(r.get("reason") or "not applied")
        n_verified += verified
        n_hand += not automatic and not removed
        rows.append({
            "model": e.name, "source": e.source, "family": e.family, "row": "cause", "cause": int(f["cause"]),
            "phase": phase.get(f["cause"], ""), "pattern": f["pattern"], "location": _where(f["source"] or f["module"]),
            "action": f["action"], "automatic": automatic, "applied": applied, "verdict": r.get("verdict", ""),
            "verified": verified, "reason": reason.removeprefix("by hand: "),
            "hotspots_before": r.get("hotspots_before", f["hotspots"]),
            "hotspots_after": "" if after is None else int(after),
            "same_outputs": "" if same is None else bool(same),
            "max_rel_diff": "" if not applied or r.get("max_rel_diff") is None else f"{float(r['max_rel_diff']):.1e}",
            "changed_outputs": same is False,
            "at_default": "" if at_default is None else keys.get(int(f["cause"])) in at_default,
        })
    exposed = [r for r in v.to_dict("records") if r["kind"] == "exposed"]
    for r in exposed:
        rows.append({
            "model": e.name, "source": e.source, "family": e.family, "row": "exposed", "cause": int(r["cause"]),
            "pattern": r["pattern"], "location": _where(r["source"]), "automatic": bool(r["applied"]),
            "reason": str(r["reason"] or "").removeprefix("by hand: "), "hotspots_before": r["hotspots_before"],
        })
    together = [r for r in v.to_dict("records") if r["kind"] == "all"]
    all_changed = any(r["applied"] and r["same_outputs"] is False for r in together)
    model_row.update(
        causes=len(frame), automatic_verified=n_verified, by_hand=n_hand, exposed=len(exposed),
        all_verdict=together[0]["verdict"] if together else "",
        all_hotspots=(f"{together[0]['hotspots_before']} -> "
                      f"{together[0]['hotspots_after'] if together[0]['applied'] else '-'}") if together else "",
        changed_outputs=any(r.get("changed_outputs") for r in rows) or all_changed)
    return done("ok")


def _causes_at(b: Built, size: tuple[int, ...], step: dict) -> set[tuple] | None:
    """The causes (:func:`_cause_key`) of one audited step at input ``size``, the model built for
    it; None where the model does not run there."""

    import auditor

    rank = len(size) + 1
    cl = _fmt(size, rank)
    try:
        model = (b.build() if b.e.source == "timm" else b.build(size)).train().to(memory_format=cl)
        args, kwargs = b.inputs(size, cl)
        a = auditor.audit(model, *args, warmup=1, record_time=False, kwargs=kwargs, loss_fn=step["loss_fn"])
    except Exception:
        return None
    if not a.complete:
        return None
    return {_cause_key(c.pattern, c.phase, c.op, c.source) for c in a.causes().itertuples()}


def worker(argv: list[str], user_models: Mapping[str, type] | None = None) -> int:
    """One model's rows into a JSON file (``user_models``: the user models, where the running
    script or notebook cell defined them)."""
    if user_models:
        _USER_MODELS.update(user_models)
    p = argparse.ArgumentParser()
    p.add_argument("id")
    p.add_argument("out")
    p.add_argument("--rounds", type=int, required=True)
    p.add_argument("--budget", type=float, required=True)
    p.add_argument("--max-params", type=float, required=True)
    p.add_argument("--memory-gb", type=float, default=0)
    args = p.parse_args(argv)
    if args.memory_gb:
        import resource

        limit = int(args.memory_gb * 2**30)
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    source, _, name = args.id.partition("/")
    if source != "user_notebook":  # a kernel's own connections stay (the user models fetch nothing)
        _no_network()
    warnings.filterwarnings("ignore")
    e = Entry(name, source, _family(source, name))
    rows = run_model(e, args.rounds, args.budget, args.max_params)
    home = Path(os.environ["TORCH_HOME"])
    fetched = [str(p.relative_to(home)) for p in home.rglob("*") if p.is_file()]
    if fetched:  # something wrote torch's cache: a download slipped through
        rows[-1]["error"] = (rows[-1].get("error", "") + f" fetched into TORCH_HOME: {fetched[:3]}").strip()
    Path(args.out).write_text(json.dumps(rows, default=str))
    return 0


def notebook_worker(argv: list[str]) -> int:
    """The user models' file as a notebook's first cell (the classes defined in the cell), then a
    cell that runs :func:`worker` with them, executed headless by a Jupyter kernel (nbclient)."""
    import nbformat
    from nbclient import NotebookClient

    text = USER_FILE.read_text()
    models = text[:text.index('\nif __name__ == "__main__":')]
    run = (f"import sys\nsys.path.insert(0, {str(ROOT / 'benchmarks')!r})\nimport breadth\n"
           f"assert breadth.worker({argv!r}, user_models=MODELS) == 0\n")
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(models), nbformat.v4.new_code_cell(run)])
    NotebookClient(nb, timeout=None, kernel_name="python3", resources={"metadata": {"path": str(ROOT)}}).execute()
    return 0


def _family(source: str, name: str) -> str:
    if source in USER_SOURCES:
        return USER_SOURCES[source]
    if source == "timm":
        return next((m for m, (n, _) in _timm_smallest().items() if n == name), "")
    if source == "torchvision":
        import torchvision.models as tm

        for task, sub in TV_TASKS.items():
            if task != "classification" and name in tm.list_models(module=getattr(tm, sub)):
                return task
        return f"classification/{tm.get_model_builder(name).__module__.rsplit('.', 1)[-1]}"
    return "zoo"


# -- the run (the parent) ----------------------------------------------------------------------------


def _last_exception(stderr: str) -> str:
    lines = [ln for ln in stderr.splitlines() if ln.strip() and not ln.startswith("STAGE ")]
    for ln in reversed(lines):
        if re.match(r"^[\w.]+(Error|Exception|Interrupt|Exit)\b", ln) or "Error:" in ln:
            return ln.strip()[:300]
    return (lines[-1].strip() if lines else "")[:300]


def _last_stage(stderr: str) -> str:
    stages = re.findall(r"^STAGE (\S+)", stderr, flags=re.M)
    return stages[-1] if stages else "start"


def run_one(e: Entry, args) -> list[dict]:
    """The model in a subprocess; a crash, a kill or a timeout is its model row."""
    with tempfile.TemporaryDirectory(prefix="breadth-") as tmp:
        out = Path(tmp, "rows.json")
        options = ["--rounds", str(args.rounds), "--budget", str(args.budget),
                   "--max-params", str(args.max_params), "--memory-gb", str(args.memory_gb)]
        cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", e.id, str(out), *options]
        if e.source == "user_script":  # the models in the script being run: python user_models.py
            cmd[1] = str(USER_FILE)
        elif e.source == "user_notebook":  # the models in a notebook cell, run by a Jupyter kernel
            cmd[2] = "--notebook-worker"
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                start_new_session=True, cwd=ROOT)
        try:
            _, stderr = proc.communicate(timeout=args.timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            _, stderr = proc.communicate()
            return [{"model": e.name, "source": e.source, "family": e.family, "row": "model", "status": "timeout",
                     "error": f"over {args.timeout:g} s, in stage {_last_stage(stderr)}",
                     "seconds": round(time.perf_counter() - start, 1)}]
        if proc.returncode == 0 and out.exists():
            rows = json.loads(out.read_text())
            for r in rows:  # the whole process: imports, building, every stage
                r["seconds"] = round(time.perf_counter() - start, 1)
            return rows
        why = f"exit {proc.returncode}" if proc.returncode >= 0 else f"killed by {signal.Signals(-proc.returncode).name}"
        return [{"model": e.name, "source": e.source, "family": e.family, "row": "model", "status": "crash",
                 "error": f"{why} in stage {_last_stage(stderr)}: {_last_exception(stderr)}",
                 "seconds": round(time.perf_counter() - start, 1)}]


def read_rows(path: Path) -> list[dict]:
    if not path.exists():
        return []
    with path.open(newline="") as fh:
        return list(csv.DictReader(fh))


def append_rows(path: Path, rows: list[dict]) -> None:
    new = not path.exists() or path.stat().st_size == 0
    if not new:
        with path.open(newline="") as fh:
            header = next(csv.reader(fh), [])
        if header != COLUMNS:  # a table written before a column was added: its rows under today's header
            kept = read_rows(path)
            new = True
            path.write_text("")
            rows = [*kept, *rows]
    with path.open("a", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=COLUMNS, extrasaction="ignore")
        if new:
            w.writeheader()
        for r in rows:
            w.writerow({k: r.get(k, "") for k in COLUMNS})


# -- the summary -------------------------------------------------------------------------------------


def _true(v) -> bool:
    return str(v) == "True"


def _int(v) -> int:
    try:
        return int(float(v))
    except (TypeError, ValueError):
        return 0


def _table(header: list[str], rows: list[list]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(str(c).replace("|", "\\|").replace("\n", " ") for c in r) + " |" for r in rows]
    return "\n".join(out)


def _short_reason(reason: str) -> str:
    """A by-hand reason without its specifics (file lines, numbers, quoted code), to count
    reasons by class."""
    r = re.sub(r"[\w./-]+\.py:\d+", "<line>", reason)
    r = re.sub(r"`[^`]*`", "`…`", r)
    r = re.sub(r"'[^']*'", "'…'", r)
    r = re.sub(r"\d+(\.\d+)?", "N", r)
    return r.strip()[:160]


def _removed(cause: dict) -> bool:
    """A cause with no fix of its own that the automatic fixes removed, verified."""
    return cause["verdict"] == REMOVED and _true(cause["verified"])


#: the timing verdict of a fix that makes the step slower (Fixes.verify's table)
HURTS = "hurts"


def _hurts(cause: dict) -> bool:
    """A cause the engine's own fix removes, verified, but whose timing verdict is ``hurts``: the
    step is slower with it, so it is no fix the user came for."""
    return _true(cause["automatic"]) and _true(cause["verified"]) and cause["verdict"] == HURTS


def _strict(cause: dict) -> bool:
    """The headline count: the engine's own fix (automatic, not removed by the other fixes),
    verified, whose timing verdict is not ``hurts``."""
    return _true(cause["automatic"]) and _true(cause["verified"]) and not _removed(cause) and not _hurts(cause)


def totals(rows: list[dict]) -> dict:
    models = [r for r in rows if r["row"] == "model"]
    causes = [r for r in rows if r["row"] == "cause"]
    run = [m for m in models if m["status"] == "ok"]
    crashes = [m for m in models if m["status"] in ("auditor crash", "crash", "timeout", "out of memory")]
    return {
        "models": len(models), "ok": len(run), "crashes": len(crashes),
        "auditor_crashes": sum(m["status"] == "auditor crash" for m in models),
        "subprocess_crashes": sum(m["status"] == "crash" for m in models),
        "timeouts": sum(m["status"] == "timeout" for m in models),
        "out_of_memory": sum(m["status"] == "out of memory" for m in models),
        "skipped": sum(m["status"].startswith("skipped") for m in models),
        "model_errors": sum(m["status"] == "model error" for m in models),
        "causes": len(causes), "automatic": sum(_true(c["automatic"]) for c in causes),
        "verified": sum(_true(c["verified"]) for c in causes),
        "strict": sum(_strict(c) for c in causes),
        "hurts": sum(_hurts(c) for c in causes),
        "removed": sum(_removed(c) for c in causes),
        "by_hand": sum(not _true(c["automatic"]) and not _removed(c) for c in causes),
        "changed_outputs": sum(_true(m["changed_outputs"]) for m in run),
        "layout_regressions": sum(_true(m["layout_regression"]) for m in run),
        "contiguous_before": sum(_int(m["contiguous_hotspots_before"]) for m in run),
        "contiguous_after": sum(_int(m["contiguous_hotspots_after"]) for m in run),
        "regressed_before": sum(_int(m["contiguous_hotspots_before"]) for m in run if _true(m["layout_regression"])),
        "regressed_after": sum(_int(m["contiguous_hotspots_after"]) for m in run if _true(m["layout_regression"])),
        "exposed": sum(r["row"] == "exposed" for r in rows),
        "small_map_models": sum(bool(m.get("small_maps")) and m.get("default_input", "") != "" for m in run),
        "only_small": sum(c.get("at_default") == "False" for c in causes),
        "also_default": sum(c.get("at_default") == "True" for c in causes),
        "patch_failed": sum(m["patch_check"].startswith("failed") for m in run),
        "patch_ok": sum(m["patch_check"] == "ok" for m in run),
        "patch_unchecked": sum(m["patch_check"].startswith("not checked") for m in run),
    }


def summary(rows: list[dict], settings: str = "") -> str:
    import torch

    t = totals(rows)
    models = [r for r in rows if r["row"] == "model"]
    causes = [r for r in rows if r["row"] == "cause"]
    share = t["strict"] / t["causes"] if t["causes"] else float("nan")
    lines = ["# Breadth corpus: the fix engine on models it was not built against", "",
             "Made by `benchmarks/breadth.py` (issue 28). " + settings, ""]
    try:
        import timm
        import torchvision

        lines += [f"torch {torch.__version__}, torchvision {torchvision.__version__}, timm {timm.__version__}; "
                  "CPU, float32 (outputs compared in float64), train mode, model and input channels_last, batch 2, "
                  "random weights.", ""]
    except ImportError:
        pass
    lines += ["## Totals", "",
              f"- models: {t['models']} ({t['ok']} audited, {t['skipped']} skipped, {t['model_errors']} model errors, "
              f"{t['crashes']} crashes: {t['auditor_crashes']} auditor, {t['subprocess_crashes']} killed or exited, "
              f"{t['timeouts']} timeouts, {t['out_of_memory']} out of the --memory-gb limit)",
              f"- causes: {t['causes']}; **fixed by the engine's own fixes, verified, not `hurts`: {t['strict']} "
              f"({share:.1%})**; besides them: verified but `hurts` (slower with the fix) {t['hurts']}, removed by "
              f"the other fixes (no fix of their own) {t['removed']}; by hand {t['by_hand']}; automatic "
              f"{t['automatic']}, of them not verified {t['automatic'] - t['strict'] - t['hurts']}; exposed by the "
              f"fixes {t['exposed']}",
              f"- models whose applied fixes changed outputs: {t['changed_outputs']}",
              f"- layout regressions (contiguous hotspot groups up after the automatic fixes): {t['layout_regressions']} "
              f"models, their contiguous groups {t['regressed_before']} -> {t['regressed_after']}; "
              f"{t['contiguous_before']} -> {t['contiguous_after']} over every audited model",
              f"- patches: {t['patch_ok']} pass `git apply --check`, {t['patch_failed']} fail, "
              f"{t['patch_unchecked']} not checked"]
    if any("small_maps" in m for m in models):  # a CSV written before the check has no such column
        lines += [f"- a map made 1x1, or a tensor with no element, at the audited size: {t['small_map_models']} "
                  f"models audited at their default size too; of their causes {t['only_small']} exist only at the "
                  f"audited size, {t['also_default']} at the default size too"]
    lines += ["",
              "The headline share (strict): the cause's own fix is automatic, was applied, the outputs and "
              "gradients are the same, the cause's hotspot groups are all gone in the re-audit, and its timing "
              "verdict is not `hurts`. Counted apart: a fix verified so whose verdict is `hurts` (the step is "
              "slower with it), and a cause with no fix of its own that the model's automatic fixes, made "
              "together, remove with the same values, leaving no more groups than they and it account for "
              "(verdict `removed by the other fixes`).", ""]
    # per pattern
    pats: dict[str, Counter] = {}
    for c in causes:
        k = pats.setdefault(c["pattern"], Counter())
        k["causes"] += 1
        k["automatic"] += _true(c["automatic"])
        k["strict"] += _strict(c)
        k["hurts"] += _hurts(c)
        k["removed"] += _removed(c)
        k["by hand"] += not _true(c["automatic"]) and not _removed(c)
        k["changed"] += _true(c["changed_outputs"])
    pat_models = {p: len({c["source"] + c["model"] for c in causes if c["pattern"] == p}) for p in pats}
    lines += ["## Per pattern", "", _table(
        ["pattern", "causes", "models", "automatic", "own fix verified, not hurts", "share", "hurts",
         "removed by the other fixes", "by hand", "changed outputs"],
        [[p, k["causes"], pat_models[p], k["automatic"], k["strict"], f"{k['strict'] / k['causes']:.0%}",
          k["hurts"], k["removed"], k["by hand"], k["changed"]]
         for p, k in sorted(pats.items(), key=lambda kv: -kv[1]["causes"])]), ""]
    # by-hand reasons
    reasons: dict[str, list] = {}
    for c in causes:
        if _hurts(c):
            reasons.setdefault("verified, but its timing verdict is `hurts` (the step is slower with it)", []).append(c)
        elif _removed(c):
            reasons.setdefault(f"no fix of its own: {REMOVED}", []).append(c)
        elif not _true(c["verified"]):
            why = c["reason"]
            if _true(c["automatic"]) and _true(c["applied"]):
                why = ("automatic, but it changes outputs" if _true(c["changed_outputs"])
                       else "automatic, but some of the cause's hotspot groups are left after it")
            elif not why:
                why = "automatic, not verified: " + (c["verdict"] or "no verification row")
            reasons.setdefault(_short_reason(why), []).append(c)
    lines += ["## Why causes are not fixed by the engine's own verified fixes (the strict count)", "", _table(
        ["reason", "causes", "patterns", "example models"],
        [[r, len(cs), ", ".join(sorted({c["pattern"] for c in cs})),
          ", ".join(list(dict.fromkeys(c["model"] for c in cs))[:4])]
         for r, cs in sorted(reasons.items(), key=lambda kv: -len(kv[1]))]), ""]
    # layout regressions: which automatic fixes the model had
    regressed = [m for m in models if _true(m["layout_regression"])]
    if regressed:
        lines += ["## Layout regressions: the contiguous run after the automatic fixes", "",
                  "The automatic fixes applied in memory to a copy, the copy and its input made contiguous, "
                  "and audited; the same model contiguous without the fixes beside it.", "", _table(
                      ["model", "source", "contiguous groups before -> after", "its automatic fixes"],
                      [[m["model"], m["source"], f"{m['contiguous_hotspots_before']} -> {m['contiguous_hotspots_after']}",
                        "; ".join(f"{c['pattern']} at {c['location']} ({c['action']})"
                                  for c in causes if (c["source"], c["model"]) == (m["source"], m["model"])
                                  and _true(c["automatic"]))] for m in regressed]), ""]
    small = [m for m in models if m.get("small_maps") and m.get("default_input")]
    if small:
        lines += ["## Causes at the audited size and at the default size", "",
                  "Models whose audited step has a map a convolution or pool made 1x1 from a larger one, or a "
                  "tensor with no element (an FPN level that got no region), audited again at their default "
                  "input size (`Built.default_size`); each cause is looked for there by pattern, phase, op and "
                  "line.", "", _table(
                      ["model", "source", "at the audited size", "input", "causes", "default input", "causes there",
                       "causes only at the audited size"],
                      [[m["model"], m["source"], m["small_maps"], m["input"], m["causes"], m["default_input"],
                        m["default_causes"],
                        "; ".join(f"{c['pattern']} ({c['phase']}) at {c['location']}" for c in causes
                                  if (c["source"], c["model"]) == (m["source"], m["model"])
                                  and c.get("at_default") == "False")] for m in small]), ""]
    changed = [c for c in causes if _true(c["changed_outputs"])]
    if changed:
        lines += ["## Fixes that changed outputs", "", _table(
            ["model", "pattern", "location", "max relative difference"],
            [[c["model"], c["pattern"], c["location"], c["max_rel_diff"]] for c in changed]), ""]
    failed = [m for m in models if m["patch_check"].startswith(("failed", "not checked"))]
    if failed:
        lines += ["## Patches not applied cleanly or not checked", "", _table(
            ["model", "patch"], [[m["model"], m["patch_check"]] for m in failed]), ""]
    # crashes
    bad = [m for m in models if m["status"] in ("auditor crash", "crash", "timeout", "model error", "out of memory")]
    if bad:
        lines += ["## Crashes, timeouts and models that do not run", "", _table(
            ["model", "source", "status", "error"], [[m["model"], m["source"], m["status"], m["error"]] for m in bad]), ""]
    # slowest
    slow = sorted((m for m in models), key=lambda m: -float(m["seconds"] or 0))[:10]
    lines += ["## Slowest models", "", _table(
        ["model", "source", "status", "input", "seconds", "stages"],
        [[m["model"], m["source"], m["status"], m["input"], m["seconds"], m["stages"]] for m in slow]), ""]
    # per model
    by_model: dict[tuple, list] = {}
    for c in causes:
        by_model.setdefault((c["source"], c["model"]), []).append(c)
    table = []
    for m in models:
        mine = by_model.get((m["source"], m["model"]), [])
        hand = "; ".join(f"{c['pattern']}: {_short_reason(c['reason'])}" for c in mine
                         if not _true(c["automatic"]) and not _true(c["verified"]))
        unverified = [c for c in mine if _true(c["automatic"]) and not _true(c["verified"])]
        if unverified:
            hand = "; ".join(filter(None, [hand, *(f"{c['pattern']}: automatic, not verified ({c['verdict']}, "
                                                    f"{c['hotspots_before']} -> {c['hotspots_after'] or '-'} groups)"
                                                    for c in unverified)]))
        hand = "; ".join(filter(None, [hand, *(f"{c['pattern']}: verified, `hurts`" for c in mine if _hurts(c)),
                                       *(f"{c['pattern']}: {REMOVED}" for c in mine if _removed(c))]))
        contiguous = (f"{m['contiguous_hotspots_before']} -> {m['contiguous_hotspots_after']}"
                      if m["contiguous_hotspots_before"] != "" else "")
        table.append([m["model"], f"{m['source']} {m['family']}", m["status"] if m["status"] != "ok" else "",
                      m["input"], m["causes"], sum(_strict(c) for c in mine) if m["status"] == "ok" else "",
                      m["by_hand"], hand[:600],
                      "yes" if _true(m["changed_outputs"]) else "", contiguous + (" **regression**" if _true(m["layout_regression"]) else ""),
                      m["patch_check"], m["seconds"]])
    lines += ["## Per model", "", _table(
        ["model", "source", "status", "input", "causes", "own fix verified, not hurts", "by hand",
         "not in the strict count: why",
         "changed outputs", "contiguous groups before -> after", "patch", "seconds"], table), ""]
    return "\n".join(lines)


def main(argv=None, user_models: Mapping[str, type] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    _setup_env()
    if argv[:1] == ["--worker"]:
        return worker(argv[1:], user_models)
    if argv[:1] == ["--notebook-worker"]:
        return notebook_worker(argv[1:])
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", nargs="+", help="ids (timm/resnet18) or names; default: the whole corpus")
    p.add_argument("--sample", action="store_true", help=f"the fixed sample of the test suite: {', '.join(SAMPLE)}")
    p.add_argument("--resume", action="store_true", help="keep the CSV and skip the models it already has")
    p.add_argument("--list", action="store_true", help="print the corpus and stop")
    p.add_argument("--summary", action="store_true", help="write the Markdown from the CSV and stop")
    p.add_argument("--timeout", type=float, default=900, help="seconds per model (default 900)")
    p.add_argument("--rounds", type=int, default=7, help="timing rounds per verification (default 7)")
    p.add_argument("--budget", type=float, default=3.0, help="seconds of timing per verification (default 3)")
    p.add_argument("--max-params", type=float, default=200e6, help="skip larger models (default 200e6)")
    p.add_argument("--memory-gb", type=float, default=12, help="address-space limit per model (0: none)")
    p.add_argument("--csv", type=Path, default=CSV_PATH)
    p.add_argument("--md", type=Path, default=None, help="default: the CSV's name with .md")
    p.add_argument("--note", default="", help="a line for the summary's head (how the run deviated, say)")
    args = p.parse_args(argv)
    md = args.md or args.csv.with_suffix(".md")
    settings = (f"Each model in its own process, {os.environ.get('OMP_NUM_THREADS', 'default')} OpenMP thread(s); "
                f"verification timing {args.rounds} rounds, {args.budget:g} s budget, no more rounds (most "
                "timing verdicts are `within noise` at this budget: the table is about correctness); timeout "
                f"{args.timeout:g} s per model, address space {args.memory_gb:g} GiB per model. {args.note}").strip()
    if args.summary:
        md.write_text(summary(read_rows(args.csv), settings))
        return 0
    entries = corpus()
    if args.list:
        for e in entries:
            print(f"{e.id:60s} {e.family:40s} {e.params / 1e6:8.2f}M")
        print(f"{len(entries)} models", file=sys.stderr)
        return 0
    if args.sample:
        entries = select(entries, SAMPLE)
    elif args.models:
        entries = select(entries, args.models)
    args.csv.parent.mkdir(parents=True, exist_ok=True)
    if args.resume:
        done = {(r["source"], r["model"]) for r in read_rows(args.csv) if r["row"] == "model"}
        entries = [e for e in entries if (e.source, e.name) not in done]
    elif args.csv.exists():
        args.csv.unlink()
    for i, e in enumerate(entries, 1):
        rows = run_one(e, args)
        append_rows(args.csv, rows)
        m = rows[-1]
        print(f"[{i}/{len(entries)}] {e.id}: {m.get('status')} {m.get('error', '')[:120]} "
              f"causes={m.get('causes', '')} verified={m.get('automatic_verified', '')} "
              f"contiguous={m.get('contiguous_hotspots_before', '')}->{m.get('contiguous_hotspots_after', '')} "
              f"{m.get('seconds')}s", flush=True)
        md.write_text(summary(read_rows(args.csv), settings))
    md.write_text(summary(read_rows(args.csv), settings))
    return 0


if __name__ == "__main__":
    sys.exit(main())
