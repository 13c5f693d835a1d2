"""Measured layout plans: which convolutions to run channels_last, and where to convert.

Converting a whole model to channels_last does not always pay: some convolutions run faster
contiguous on a given device, dtype and shape, and every op without a channels_last kernel
costs a copy. :func:`plan_layout` measures instead of guessing:

1. it audits the model in channels_last to learn the data flow: which convolution feeds which,
   through which ops, and where an op forces a format (a loss, an explicit ``.contiguous()``);
2. it times every convolution alone, with its recorded input shape, dtype, groups, stride and
   padding, in both formats (median of several runs, forward, or forward + backward for
   training), the other ops from ``record_time`` audits in both formats, attributed to the
   convolution whose output they process, and each conversion the plan might need;
3. it picks a format per convolution minimising the sum of those times plus the conversions at
   the borders of same-format regions (an exact minimum cut: two formats, pairwise costs);
4. it times the whole model end to end for the plan, all contiguous and all channels_last,
   inputs converted inside the timed call, and keeps the fastest, so a cost model that misses
   something can never make the model slower than the better uniform format.

:func:`apply_plan` applies the result in place: weights with :mod:`auditor.fix`'s helpers and
input conversions with forward pre-hooks at region borders, so the model still takes a plain
contiguous batch. It then re-audits a copy and reports hotspot bytes before and after.
"""

from __future__ import annotations

import copy
import ctypes
import ctypes.util
import dataclasses
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import torch
import torch.nn as nn
from torch.utils import _pytree as pytree

from . import rules

try:
    import resource
except ImportError:  # not on Windows: no page-fault counts
    resource = None
from .api import _default_loss, audit
from .audit import Audit, _fmt_bytes
from .fix import (
    CHANNELS_LAST_OF_RANK,
    CONTIGUOUS,
    Flow,
    _conversion_frame,
    _convert_param,
    layout_name,
    remove_input_formats,
    set_conv_format,
    to_channels_last,
)
from .formats import base_format

_CONVS = (nn.Conv2d, nn.ConvTranspose2d, nn.Conv3d, nn.ConvTranspose3d)
_FORMAT_OF = {"contiguous": CONTIGUOUS, "channels_last": torch.channels_last,
              "channels_last_3d": torch.channels_last_3d}
_CL_NAME = {4: "channels_last", 5: "channels_last_3d"}
#: a source of data whose format no plan changes: ("fixed", format label)
_FIXED = "fixed"
#: a copy asked for one of these writes it whatever it reads
_EXPLICIT_FORMATS = ("contiguous_format", "channels_last", "channels_last_3d")

CONV_COLUMNS = [
    "module", "module_type", "calls", "input_shape", "weight_shape", "dtype", "groups", "stride",
    "conv_contiguous_us", "conv_channels_last_us", "ops_contiguous_us", "ops_channels_last_us",
    "total_contiguous_us", "total_channels_last_us", "speedup", "border_us", "proposed", "format", "region",
    "reason",
]
CONVERSION_COLUMNS = [
    "where", "kind", "from_module", "shape", "dtype", "bytes", "to_channels_last_us",
    "to_contiguous_us", "border",
]


# -- timing ---------------------------------------------------------------------------------------


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def steady_malloc() -> bool:
    """Keep glibc from handing freed memory back to the OS between steps (process-wide).

    By default glibc trims the top of the heap and maps large blocks afresh, so a model whose
    tensors land on the wrong side of those thresholds page-faults its activations anew every
    step. Measured here: one of three copies of convnext_tiny with identical layouts took 29,000
    minor page faults and 20-30% more CPU time per training step, in the same process, and
    which copy lost changed from run to run. Call this once before timing anything; returns
    False where the C library is not glibc. Not called by :func:`plan_layout` itself.
    """
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3
    return bool(mallopt(m_mmap_threshold, 32 * 1024 * 1024)) and bool(mallopt(m_trim_threshold, 1 << 30))


def _minor_faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt if resource is not None else 0


def default_clock(device: torch.device | str = "cpu") -> str:
    """``cpu`` (process CPU time) for a single-threaded CPU run, else ``wall``.

    With one thread, CPU time is the work done, and preemption by other processes on a shared
    machine does not inflate it the way it inflates wall time; with several threads it would
    also count the threads' spin-waiting, so wall time is the only honest clock.
    """
    return "cpu" if torch.device(device).type == "cpu" and torch.get_num_threads() == 1 else "wall"


def time_interleaved(fns: dict[str, Callable[[], object]], repeats: int = 7, *, min_sample_us: float = 1000.0,
                     device: torch.device | str = "cpu") -> pd.DataFrame:
    """Time each callable ``repeats`` times, interleaved (A B C A B C ...) so that load from
    other processes hits every candidate alike. A fast callable runs several times per sample so
    that one sample lasts at least ``min_sample_us``.

    Returns one row per callable: ``wall_us`` and ``cpu_us`` (medians per call, wall and
    process CPU time, both taken from the same samples), ``wall_spread``, ``cpu_spread``
    (interquartile range over median) and ``faults`` (median minor page faults per call: above
    zero, the allocator is returning memory to the OS between calls, see :func:`steady_malloc`).
    """
    device = torch.device(device)
    number = {}
    for name, fn in fns.items():
        fn()  # warm-up: allocator, kernels, lazy init
        _sync(device)
        t0 = time.perf_counter()
        fn()
        _sync(device)
        once = (time.perf_counter() - t0) * 1e6
        number[name] = max(1, math.ceil(min_sample_us / max(once, 1.0)))
    wall = {name: [] for name in fns}
    cpu = {name: [] for name in fns}
    faults = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            n = number[name]
            _sync(device)
            f0, t0, c0 = _minor_faults(), time.perf_counter(), time.process_time()
            for _ in range(n):
                fn()
            _sync(device)
            wall[name].append((time.perf_counter() - t0) * 1e6 / n)
            cpu[name].append((time.process_time() - c0) * 1e6 / n)
            faults[name].append((_minor_faults() - f0) / n)
    rows = []
    for name in fns:
        row = {"name": name, "faults": statistics.median(faults[name])}
        for clock, samples in (("wall", wall[name]), ("cpu", cpu[name])):
            med = statistics.median(samples)
            q1, q3 = np.percentile(samples, [25, 75])
            row[f"{clock}_us"] = med
            row[f"{clock}_spread"] = float((q3 - q1) / med) if med else 0.0
        rows.append(row)
    return pd.DataFrame(rows).set_index("name")


def median_times(fns: dict[str, Callable[[], object]], repeats: int = 7, *, min_sample_us: float = 1000.0,
                 device: torch.device | str = "cpu", clock: str | None = None) -> dict[str, float]:
    """Median time per call of each callable in µs, on ``clock`` (``wall`` or ``cpu``; default
    :func:`default_clock`), measured by :func:`time_interleaved`."""
    clock = clock or default_clock(device)
    t = time_interleaved(fns, repeats, min_sample_us=min_sample_us, device=device)
    return t[f"{clock}_us"].to_dict()


def _step_fn(model: nn.Module, inputs: tuple, train: bool, loss_fn: Callable) -> Callable[[], object]:
    """One inference call, or one forward + backward with gradients reset beforehand."""
    if not train:
        def infer():
            with torch.no_grad():
                return model(*inputs)
        return infer

    params = [p for p in model.parameters() if p.requires_grad]

    def step():
        for p in params:
            p.grad = None
        loss_fn(model(*inputs)).backward()
    return step


# -- the data flow the plan works on --------------------------------------------------------------


@dataclass
class _Call:
    """One call of a planned convolution, as recorded."""

    module: str
    seq: int
    input_shape: tuple
    dtype: torch.dtype
    input_label: str
    source: tuple  # ("conv", module) or (_FIXED, label)
    input_bytes: int
    from_model_input: bool  # reads the model's input: needs no input gradient


@dataclass
class _Edge:
    """Data that passes from one region to another: converted when their formats differ."""

    a: str  # a conv module, or None for a fixed source
    b: str
    fixed: str  # the fixed source's format when a is None
    where: str
    kind: str
    shape: tuple
    dtype: torch.dtype
    nbytes: int


def _sources(flow: Flow, planned: set[str], given_format: str) -> list:
    """For every event: where the format of its result comes from.

    A planned convolution is its own source; an op that writes one format whatever it reads
    (a loss, a copy with an explicit ``memory_format``, as seen in the channels_last audit) is a
    fixed source; any other op takes the source of its first activation input (the operand
    TensorIterator follows, so a ``cat`` or ``mul`` of mixed peers is not a source); the model's
    inputs are a fixed source in the format they are given.
    """
    n = len(flow.ops)
    src: list = [None] * n
    requested = flow.ops["requested_format"].astype(str).to_numpy()
    for e in range(n):
        if flow.is_conv[e] and flow.module[e] in planned:
            src[e] = ("conv", flow.module[e])
            continue
        forces = flow.kind[e] == rules.LOSES or (
            rules.op_packet(flow.op[e]) in rules.COPY_OPS and requested[e] in _EXPLICIT_FORMATS)
        if not flow.is_conv[e] and forces and flow.kind[e] in rules.COSTLY_KINDS:
            src[e] = (_FIXED, base_format(str(flow.ops.at[e, "to_format"])))
            continue
        prods = flow.input_producers(e)
        if prods:
            src[e] = src[prods[0]] if prods[0] >= 0 else (_FIXED, given_format)
    return src


def _owned_time_us(a: Audit, planned: set[str], given_format: str) -> dict[str, float]:
    """Time of the non-convolution ops of one timed audit, per planned convolution whose
    output they process (the convolution that decides the layout they run in)."""
    flow = Flow(a)
    src = _sources(flow, planned, given_format)
    dur = a.events["duration_us"].to_numpy()
    out: dict[str, float] = {}
    for e in range(len(src)):
        if flow.is_conv[e] and flow.module[e] in planned:
            continue
        prods = flow.input_producers(e)
        owner = src[prods[0]] if prods and prods[0] >= 0 else None
        if owner and owner[0] == "conv" and not math.isnan(dur[e]):
            out[owner[1]] = out.get(owner[1], 0.0) + float(dur[e])
    return out


def _flow_graph(flow: Flow, planned: set[str], given_format: str) -> tuple[list[_Call], list[_Edge]]:
    """Calls of the planned convolutions and the edges between regions, from the forward
    phase of the channels_last audit."""
    src = _sources(flow, planned, given_format)
    t = flow.tensors
    shape, label = t["shape"].astype(str).to_numpy(), t["format"].astype(str).to_numpy()
    dtype, nbytes, ndim = t["dtype"].astype(str).to_numpy(), t["bytes"].to_numpy(), t["ndim"].to_numpy()
    calls, edges = [], []
    forward = np.flatnonzero(flow.phase == "forward")
    for e in forward:
        e = int(e)
        rows = flow.act_rows.get(e, [])
        if not rows:
            continue
        prods = flow.input_producers(e)
        if flow.is_conv[e] and flow.module[e] in planned:
            r, p = rows[0], prods[0]
            s = src[p] if p >= 0 else (_FIXED, given_format)
            call = _Call(flow.module[e], e, _shape(shape[r]), getattr(torch, dtype[r]), label[r], s,
                         int(nbytes[r]), p < 0)
            calls.append(call)
            if base_format(label[r]) == "ambiguous" or s is None:
                continue
            edges.append(_Edge(s[1] if s[0] == "conv" else None, call.module, s[1] if s[0] == _FIXED else "",
                               call.module, "conv input", call.input_shape, call.dtype, call.input_bytes))
            continue
        if flow.is_conv[e] or len(rows) < 2 or (src[e] is not None and src[e][0] == _FIXED):
            continue
        # peers (add, mul, cat): each operand in another format than the first is converted
        first = src[prods[0]] if prods[0] >= 0 else None
        if first is None or first[0] != "conv":
            continue
        for r, p in zip(rows[1:], prods[1:]):
            if p < 0 or ndim[r] not in (4, 5) or shape[r] != shape[rows[0]]:
                continue
            s = src[p]
            if s is None or s == first or base_format(label[r]) not in ("contiguous", "channels_last", "channels_last_3d"):
                continue
            a = s[1] if s[0] == "conv" else None
            edges.append(_Edge(a, first[1], s[1] if s[0] == _FIXED else "", f"{flow.module[e]}: {flow.op[e]}",
                               "peer operand", _shape(shape[r]), getattr(torch, dtype[r]), int(nbytes[r])))
    return calls, edges


def _shape(text: str) -> tuple:
    return tuple(int(x) for x in text.strip("()").split(",") if x.strip())


# -- measurements ----------------------------------------------------------------------------------


#: a standalone measurement's sample lasts at least this long (µs), so that preemption by
#: other processes averages out over both formats instead of hitting one sample in two
SAMPLE_US = 20_000.0
#: the same for a whole-model sample
MODEL_SAMPLE_US = 100_000.0


def _conv_signature(mod: nn.Module, c: _Call) -> tuple:
    """What a convolution's speed depends on: identical convolutions are measured once."""
    return (type(mod).__name__, c.input_shape, c.dtype, tuple(mod.weight.shape), mod.stride, mod.padding,
            mod.dilation, mod.groups, getattr(mod, "output_padding", None), mod.bias is not None,
            mod.padding_mode, str(mod.weight.device), c.from_model_input)


def _conv_times(model: nn.Module, calls: list[_Call], train: bool, repeats: int, device, clock) -> dict[tuple, dict[str, float]]:
    """Standalone time of each distinct convolution signature in both formats."""
    out = {}
    for c in calls:
        mod = model.get_submodule(c.module)
        key = _conv_signature(mod, c)
        if key in out:
            continue
        rank = len(c.input_shape)
        fns = {}
        for fmt_name in ("contiguous", _CL_NAME[rank]):
            fmt = _FORMAT_OF[fmt_name]
            m = copy.deepcopy(mod)
            m._forward_pre_hooks.clear()
            m._forward_hooks.clear()
            _convert_param(m.weight, fmt)
            x = torch.randn(c.input_shape, dtype=c.dtype, device=m.weight.device).contiguous(memory_format=fmt)
            fns[fmt_name] = _conv_step(m, x, train, needs_input_grad=not c.from_model_input)
        t = median_times(fns, repeats, min_sample_us=SAMPLE_US, device=device, clock=clock)
        out[key] = {"contiguous": t["contiguous"], "channels_last": t[_CL_NAME[rank]]}
    return out


def _conv_step(m: nn.Module, x: torch.Tensor, train: bool, needs_input_grad: bool) -> Callable[[], object]:
    if not train:
        def infer():
            with torch.no_grad():
                return m(x)
        return infer
    x = x.detach().requires_grad_(needs_input_grad)
    with torch.no_grad():
        grad = torch.randn_like(m(x))

    def step():
        x.grad = None
        for p in m.parameters():
            p.grad = None
        m(x).backward(grad)
    return step


def _conversion_times(edges: list[_Edge], repeats: int, device, clock) -> dict[tuple, dict[str, float]]:
    """Time of converting each distinct (shape, dtype) to each format."""
    out = {}
    for e in edges:
        key = (e.shape, e.dtype)
        if key in out or len(e.shape) not in (4, 5):
            continue
        cl = CHANNELS_LAST_OF_RANK[len(e.shape)]
        c_src = torch.randn(e.shape, dtype=e.dtype, device=device)
        cl_src = c_src.contiguous(memory_format=cl)
        t = median_times({"channels_last": lambda s=c_src, f=cl: s.contiguous(memory_format=f),
                          "contiguous": lambda s=cl_src: s.contiguous()}, repeats,
                         min_sample_us=SAMPLE_US, device=device, clock=clock)
        out[key] = t
    return out


# -- the plan ---------------------------------------------------------------------------------------


@dataclass
class LayoutPlan:
    """The result of :func:`plan_layout`; apply it with :func:`apply_plan`.

    Attributes:
        formats: conv module name -> ``contiguous``, ``channels_last`` or ``channels_last_3d``.
        converted_inputs: conv module name -> the format its input is converted to before it
            runs (region borders, the model input).
        convs: the reasons, one row per convolution module (columns :data:`CONV_COLUMNS`):
            its standalone time in both formats, the time of the ops after it in both
            formats, the totals the choice compared, the chosen ``format`` and its ``region``.
        conversions: every conversion the plan weighed, and each hotspot of the
            channels_last audit, with its measured time in both directions.
        candidates: whole-model times, predicted and measured (median on ``clock``; ``spread``
            is the interquartile range over the median): ``planned`` (the minimum cut),
            ``all contiguous``, ``all channels_last``; ``chosen`` marks the one applied: the
            better uniform format unless the cut measured ``margin`` faster.
        clock: ``wall`` or ``cpu``, the clock of every measurement (:func:`default_clock`).
        train: planned for a training step (forward + backward) rather than inference.
        audit: the channels_last audit the plan was built from (``before`` in
            :func:`apply_plan`).
    """

    formats: dict[str, str]
    converted_inputs: dict[str, str]
    convs: pd.DataFrame
    conversions: pd.DataFrame
    candidates: pd.DataFrame
    train: bool
    audit: Audit
    inputs: tuple = field(repr=False, default=())
    reference: object = field(repr=False, default=None)
    loss_fn: Callable | None = field(repr=False, default=None)
    device: str = "cpu"
    clock: str = "wall"
    calls: list = field(repr=False, default_factory=list)

    def with_formats(self, **overrides: str) -> LayoutPlan:
        """A copy of the plan with some convolutions forced to a format (module names with
        dots spelled as keyword strings via ``**{"layer1.0.conv1": "contiguous"}``); the input
        conversions are recomputed from the recorded data flow."""
        formats = dict(self.formats)
        for name, fmt in overrides.items():
            if name not in formats:
                raise ValueError(f"{name!r} is not a planned convolution (plan.formats lists them)")
            rank = len(next(c.input_shape for c in self.calls if c.module == name))
            if fmt not in ("contiguous", _CL_NAME[rank]):
                raise ValueError(f"{name!r} takes 'contiguous' or {_CL_NAME[rank]!r}, got {fmt!r}")
            formats[name] = fmt
        convs = self.convs.copy()
        convs["format"] = [formats[n] for n in convs["module"]]
        convs["reason"] = [r if formats[n] == f else "set by hand" for n, f, r in
                           zip(self.convs["module"], self.convs["format"], self.convs["reason"])]
        cand = self.candidates.assign(chosen=False)
        return dataclasses.replace(self, formats=formats, converted_inputs=_converted_inputs(formats, self.calls),
                                   convs=convs, candidates=cand)

    @property
    def chosen(self) -> str:
        """The candidate applied: ``planned``, ``all contiguous``, ``all channels_last``, or
        ``by hand`` after :meth:`with_formats`."""
        c = self.candidates
        return str(c.loc[c["chosen"], "candidate"].iloc[0]) if c["chosen"].any() else "by hand"

    def __str__(self) -> str:
        mode = "training step" if self.train else "inference"
        counts = pd.Series(list(self.formats.values()), dtype="object").value_counts()
        lines = [
            f"Layout plan ({mode}, measured on {self.device}, {self.clock} time): {len(self.formats)} convolutions, "
            + ", ".join(f"{n} {f}" for f, n in counts.items())
            + (f" in {self.convs['region'].nunique()} regions" if len(self.convs) else "")
            + f"; {len(self.converted_inputs)} input conversions",
        ]
        for r in self.candidates.itertuples():
            mark = "  <- chosen" if r.chosen else ""
            lines.append(f"  {r.candidate:18} predicted {r.predicted_us / 1e3:9.2f} ms   "
                         f"measured {r.measured_us / 1e3:9.2f} ms (±{r.spread / 2:.0%}){mark}")
        if (self.candidates["faults"] > 0).any():
            lines.append("  note: page faults while timing (the allocator returns memory to the OS between steps);"
                         " call auditor.plan.steady_malloc() first for steadier numbers")
        if len(self.convs):
            show = self.convs.assign(_gain=(self.convs["total_contiguous_us"] - self.convs["total_channels_last_us"]).abs())
            show = show.sort_values("_gain", ascending=False).head(8)
            lines.append("")
            lines.append(f"  {'module':28} {'contiguous':>11} {'chan_last':>11}  format            reason")
            for r in show.itertuples():
                lines.append(f"  {r.module[-28:]:28} {r.total_contiguous_us:9.0f}us {r.total_channels_last_us:9.0f}us"
                             f"  {r.format:17} {r.reason}")
            if len(self.convs) > len(show):
                lines.append(f"  ... {len(self.convs) - len(show)} more in plan.convs")
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        return "<pre>" + str(self).replace("&", "&amp;").replace("<", "&lt;") + "</pre>"


def _given_format(inputs) -> str:
    for t in pytree.tree_leaves(list(inputs)):
        if isinstance(t, torch.Tensor) and t.dim() in (4, 5):
            return base_format(layout_name(t))
    return "contiguous"


def _to_contiguous(model: nn.Module) -> nn.Module:
    for p in model.parameters():
        if p.dim() in (4, 5):
            _convert_param(p, CONTIGUOUS)
    for mod in model.modules():
        for name, buf in mod._buffers.items():
            if buf is not None and buf.dim() in (4, 5):
                mod._buffers[name] = buf.contiguous()
    return model


def _audit(model, inputs, train, loss_fn, record_time=False) -> Audit:
    if train:
        return audit(model, *inputs, backward=True, loss_fn=loss_fn, record_time=record_time)
    with torch.no_grad():
        return audit(model, *inputs, backward=False, record_time=record_time)


def _min_cut(names: list[str], unary: dict[str, dict[str, float]], pair: dict[tuple, dict[str, float]]) -> dict[str, str]:
    """Exact minimiser of sum(unary) + sum(pairwise border costs) over two labels.

    Graph cut: a node on the source side runs contiguous, on the sink side channels_last;
    ``pair[(a, b)]["cl_to_c"]`` is paid when a is channels_last and b contiguous, and
    ``["c_to_cl"]`` the other way round. All costs are non-negative, so the cut is exact.
    """
    import networkx as nx  # a dependency of torch

    g = nx.DiGraph()
    s, t = ("<source>",), ("<sink>",)
    for n in names:
        g.add_edge(s, n, capacity=unary[n]["channels_last"])
        g.add_edge(n, t, capacity=unary[n]["contiguous"])
    for (a, b), cost in pair.items():
        for u, v, c in ((a, b, cost["c_to_cl"]), (b, a, cost["cl_to_c"])):
            if c > 0:
                cap = g[u][v]["capacity"] + c if g.has_edge(u, v) else c
                g.add_edge(u, v, capacity=cap)
    _, (s_side, _) = nx.minimum_cut(g, s, t)
    return {n: "contiguous" if n in s_side else "channels_last" for n in names}


def _energy(labels: dict[str, str], unary, pair) -> float:
    total = sum(unary[n][labels[n]] for n in labels)
    for (a, b), cost in pair.items():
        if labels[a] != labels[b]:
            total += cost["c_to_cl"] if labels[a] == "contiguous" else cost["cl_to_c"]
    return total


def _rank_names(labels: dict[str, str], ranks: dict[str, int]) -> dict[str, str]:
    return {n: _CL_NAME[ranks[n]] if f == "channels_last" else "contiguous" for n, f in labels.items()}


def _converted_inputs(formats: dict[str, str], calls: list[_Call]) -> dict[str, str]:
    """The convolutions whose input arrives in another format than their own, per the flow."""
    out = {}
    for c in calls:
        want = base_format(formats[c.module])
        if base_format(c.input_label) == "ambiguous":
            continue
        have = formats.get(c.source[1]) if c.source[0] == "conv" else c.source[1]
        if have != want:
            out[c.module] = formats[c.module]
    return out


def _apply_formats(model: nn.Module, formats: dict[str, str], converted: dict[str, str]) -> pd.DataFrame:
    remove_input_formats(model)
    frames = [set_conv_format(model, name, _FORMAT_OF[fmt], convert_input=name in converted)
              for name, fmt in formats.items()]
    return pd.concat(frames, ignore_index=True) if frames else _conversion_frame([])


def plan_layout(model: nn.Module, *inputs, train: bool = False, loss_fn: Callable | None = None,
                repeats: int = 7, recordings: int = 3, margin: float = 0.02, clock: str | None = None) -> LayoutPlan:
    """Measure, on this device, which format each convolution of ``model`` should run in.

    ``inputs`` are what the model is called with, as it will be in use (a plain contiguous
    batch, say); converting them is part of the plan and of its measured time. ``train=True``
    plans a training step (forward, ``loss_fn(output).backward()``, default ``output.sum()``)
    instead of inference. ``repeats`` runs per measurement (medians); ``recordings`` timed
    audits per format for the ops between convolutions. A mixed plan is chosen only when it
    measures at least ``margin`` faster than the better uniform format: a mixed layout is more
    to maintain, and the smallest of three noisy medians is biased low. ``clock`` is ``wall`` or
    ``cpu`` (default: :func:`default_clock`). The model is not modified: all work happens on
    copies. Returns a :class:`LayoutPlan`; see the module docstring for the method.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"plan_layout expects an nn.Module, got {type(model).__name__}")
    if not inputs:
        raise ValueError("plan_layout needs the model's inputs (a batch as it will be fed)")
    if repeats < 1 or recordings < 1:
        raise ValueError("repeats and recordings must be at least 1")
    if not 0 <= margin < 1:
        raise ValueError(f"margin is a fraction in [0, 1), got {margin}")
    if clock not in (None, "wall", "cpu"):
        raise ValueError(f"clock is 'wall' or 'cpu', got {clock!r}")
    loss_fn = loss_fn or _default_loss
    given = _given_format(inputs)
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    clock = clock or default_clock(device)

    cl_model = copy.deepcopy(model)
    remove_input_formats(cl_model)
    cl_inputs = to_channels_last(cl_model, *inputs)[1:]
    c_model = _to_contiguous(copy.deepcopy(model))
    remove_input_formats(c_model)
    c_inputs = pytree.tree_map(lambda t: t.contiguous() if isinstance(t, torch.Tensor) else t, list(inputs))

    structure = _audit(cl_model, cl_inputs, train, loss_fn, record_time=True)
    if not structure.complete:
        raise RuntimeError(f"the model failed in channels_last: {structure.error}")
    flow = Flow(structure)
    planned = {n for n in set(flow.module[flow.is_conv & (flow.phase == "forward")])
               if n not in ("<root>", "<global>") and _is_conv_module(model, n)}
    calls, edges = _flow_graph(flow, planned, given)
    names = list(dict.fromkeys(c.module for c in calls))
    ranks = {n: model.get_submodule(n).weight.dim() for n in names}
    reference = _reference_output(model, inputs)

    ops_us = _ops_between_convs(structure, (cl_model, cl_inputs), (c_model, c_inputs), names, planned, given,
                                train, loss_fn, recordings)
    conv_us = _conv_times(model, calls, train, repeats, device, clock)
    conv_cost = {n: {"contiguous": 0.0, "channels_last": 0.0} for n in names}
    for c in calls:
        for f in conv_cost[c.module]:
            conv_cost[c.module][f] += conv_us[_conv_signature(model.get_submodule(c.module), c)][f]
    conversion_us = _conversion_times(edges + _hotspot_edges(structure), repeats, device, clock)
    fixed_cost, pair = _border_costs(edges, conversion_us, names, train)
    unary = {n: {f: conv_cost[n][f] + ops_us[f][n] + fixed_cost[n][f] for f in ("contiguous", "channels_last")}
             for n in names}

    cut = _min_cut(names, unary, pair) if names else {}
    options = {
        "planned": cut,
        "all contiguous": dict.fromkeys(names, "contiguous"),
        "all channels_last": dict.fromkeys(names, "channels_last"),
    }
    measured = _measure_candidates(model, inputs, options, ranks, calls, train, loss_fn, repeats, device, clock)
    cand = pd.DataFrame({
        "candidate": list(options),
        "predicted_us": [_energy(o, unary, pair) for o in options.values()],
        "measured_us": [measured[k][0] for k in options],
        "spread": [measured[k][1] for k in options],
        "faults": [measured[k][2] for k in options],
    })
    uniform = cand.iloc[1:]["measured_us"].idxmin()
    mixed_pays = cand.at[0, "measured_us"] <= (1 - margin) * cand.at[uniform, "measured_us"]
    is_uniform = options["planned"] in (options["all contiguous"], options["all channels_last"])
    best = 0 if mixed_pays and not is_uniform else uniform
    cand["chosen"] = cand.index == best
    labels = options[cand.at[best, "candidate"]]
    formats = _rank_names(labels, ranks)
    converted = _converted_inputs(formats, calls)
    convs = _reasons(model, names, calls, conv_cost, ops_us, unary, pair, labels, formats, cut,
                     str(cand.at[best, "candidate"]))
    convs["proposed"] = [_rank_names(cut, ranks)[n] for n in convs["module"]]
    conversions = _conversions_frame(edges, structure, conversion_us, formats)
    return LayoutPlan(
        formats=formats, converted_inputs=converted, convs=convs, conversions=conversions,
        candidates=cand, train=train, audit=structure, inputs=tuple(inputs), reference=reference,
        loss_fn=loss_fn, device=str(device), clock=clock, calls=calls,
    )


def _ops_between_convs(structure, cl_run, c_run, names, planned, given, train, loss_fn, recordings):
    """Median time of the ops each convolution's output goes through, in both uniform formats,
    over ``recordings`` timed audits each (the structure audit is the first channels_last one)."""
    owned = {"channels_last": [_owned_time_us(structure, planned, given)], "contiguous": []}
    for i in range(recordings):
        if i:
            owned["channels_last"].append(_owned_time_us(_audit(*cl_run, train, loss_fn, True), planned, given))
        owned["contiguous"].append(_owned_time_us(_audit(*c_run, train, loss_fn, True), planned, given))
    return {f: {n: statistics.median(d.get(n, 0.0) for d in owned[f]) for n in names} for f in owned}


def _border_costs(edges: list[_Edge], times: dict, names: list[str], train: bool):
    """Conversion costs: per convolution, what its input costs to convert when it arrives from
    a fixed source in the other format (``fixed[name][format]``), and per pair of
    convolutions, what a border between them costs in each direction (``pair[(a, b)]``)."""
    scale = 2.0 if train else 1.0  # a conversion in forward has its mirror in backward
    fixed = {n: {"contiguous": 0.0, "channels_last": 0.0} for n in names}
    pair: dict[tuple, dict[str, float]] = {}
    for e in edges:
        t = times.get((e.shape, e.dtype))
        if t is None or e.a == e.b:
            continue
        if e.a is None:
            src = "channels_last" if e.fixed.startswith("channels_last") else e.fixed
            if src in ("contiguous", "channels_last"):
                other = "channels_last" if src == "contiguous" else "contiguous"
                fixed[e.b][other] += scale * t[other]
            continue
        cost = pair.setdefault((e.a, e.b), {"c_to_cl": 0.0, "cl_to_c": 0.0})
        cost["c_to_cl"] += scale * t["channels_last"]
        cost["cl_to_c"] += scale * t["contiguous"]
    return fixed, pair


def _is_conv_module(model: nn.Module, name: str) -> bool:
    try:
        return isinstance(model.get_submodule(name), _CONVS)
    except AttributeError:
        return False


def _reference_output(model: nn.Module, inputs) -> object:
    """The model's output on ``inputs`` in eval mode (deterministic: no dropout, running
    statistics), computed on a copy so the caller's model keeps its state."""
    ref = copy.deepcopy(model).eval()
    with torch.no_grad():
        return pytree.tree_map(lambda t: t.detach().clone() if isinstance(t, torch.Tensor) else t, ref(*inputs))


def _measure_candidates(model, inputs, options, ranks, calls, train, loss_fn, repeats, device, clock):
    fns, seen = {}, {}
    for name, labels in options.items():
        key = tuple(sorted(labels.items()))
        if key in seen:
            continue
        seen[key] = name
        m = copy.deepcopy(model)
        formats = _rank_names(labels, ranks)
        _apply_formats(m, formats, _converted_inputs(formats, calls))
        fns[name] = _step_fn(m, inputs, train, loss_fn)
    t = time_interleaved(fns, repeats, min_sample_us=MODEL_SAMPLE_US, device=device)
    return {name: (float(t.at[seen[key], f"{clock}_us"]), float(t.at[seen[key], f"{clock}_spread"]),
                   float(t.at[seen[key], "faults"]))
            for name, key in ((n, tuple(sorted(lab.items()))) for n, lab in options.items())}


def _hotspot_edges(a: Audit) -> list[_Edge]:
    """One edge per costly op of the channels_last audit, so each gets a measured time."""
    ops = a.ops()
    t = a.tensors
    first_in = t[t["role"] == "input"].drop_duplicates("seq").set_index("seq")
    out = []
    for e in np.flatnonzero(ops["hotspot"].to_numpy()):
        if e not in first_in.index:
            continue
        r = first_in.loc[e]
        shape = _shape(str(r["shape"]))
        if len(shape) not in (4, 5):
            continue
        out.append(_Edge(None, str(ops.at[e, "module"]), "", f"{ops.at[e, 'module']}: {ops.at[e, 'op']}",
                         f"hotspot ({ops.at[e, 'phase']})", shape, getattr(torch, str(r["dtype"])),
                         int(ops.at[e, "bytes"])))
    return out


def _regions(names: list[str], labels: dict[str, str], pair) -> dict[str, int]:
    """Connected groups of same-format convolutions, numbered in execution order."""
    parent = {n: n for n in names}

    def find(n):
        while parent[n] != n:
            parent[n] = parent[parent[n]]
            n = parent[n]
        return n
    for a, b in pair:
        if labels[a] == labels[b]:
            parent[find(a)] = find(b)
    number, out = {}, {}
    for n in names:
        out[n] = number.setdefault(find(n), len(number))
    return out


def _reasons(model, names, calls, conv_cost, ops_us, unary, pair, labels, formats, cut, chosen_name) -> pd.DataFrame:
    regions = _regions(names, labels, pair)
    border = dict.fromkeys(names, 0.0)
    for (a, b), cost in pair.items():
        if labels[a] != labels[b]:
            c = cost["c_to_cl"] if labels[a] == "contiguous" else cost["cl_to_c"]
            border[b] += c
    rows = []
    first_call = {}
    for c in calls:
        first_call.setdefault(c.module, c)
    for n in names:
        mod = model.get_submodule(n)
        c = first_call[n]
        tc, tl = unary[n]["contiguous"], unary[n]["channels_last"]
        alone = "channels_last" if tl < tc else "contiguous"
        fast, slow = (tl, tc) if alone == "channels_last" else (tc, tl)
        ratio = slow / fast if fast > 0 else float("inf")
        chosen = labels[n]
        what = "with the ops after it" if ops_us["contiguous"][n] or ops_us["channels_last"][n] else "alone"
        if cut[n] == alone:
            reason = f"{alone} {ratio:.2f}x faster {what}"
        else:
            reason = (f"{cut[n]} although {ratio:.2f}x slower {what}: a region border here would cost "
                      f"more than the {slow - fast:.0f} us")
        if chosen_name != "planned" and chosen != cut[n]:
            reason = f"{chosen_name} measured fastest end to end (cut: {reason})"
        rows.append({
            "module": n, "module_type": type(mod).__name__, "calls": sum(1 for x in calls if x.module == n),
            "input_shape": c.input_shape, "weight_shape": tuple(mod.weight.shape), "dtype": str(c.dtype).replace("torch.", ""),
            "groups": mod.groups, "stride": tuple(mod.stride),
            "conv_contiguous_us": conv_cost[n]["contiguous"], "conv_channels_last_us": conv_cost[n]["channels_last"],
            "ops_contiguous_us": ops_us["contiguous"][n], "ops_channels_last_us": ops_us["channels_last"][n],
            "total_contiguous_us": tc, "total_channels_last_us": tl,
            "speedup": tc / tl if tl > 0 else float("nan"), "border_us": border[n],
            "format": formats[n], "region": regions[n], "reason": reason,
        })
    return pd.DataFrame(rows, columns=CONV_COLUMNS)


def _conversions_frame(edges, structure, times, formats) -> pd.DataFrame:
    rows = []
    for e in edges + _hotspot_edges(structure):
        t = times.get((e.shape, e.dtype), {})
        if e.kind.startswith("hotspot"):
            is_border = False
        elif e.a is None:
            is_border = base_format(formats.get(e.b, "")) != e.fixed and e.fixed != "ambiguous"
        else:
            is_border = formats.get(e.a) != formats.get(e.b)
        rows.append({
            "where": e.where, "kind": e.kind, "from_module": e.a or f"({e.fixed or 'op'})",
            "shape": e.shape, "dtype": str(e.dtype).replace("torch.", ""), "bytes": e.nbytes,
            "to_channels_last_us": t.get("channels_last", float("nan")),
            "to_contiguous_us": t.get("contiguous", float("nan")), "border": is_border,
        })
    return pd.DataFrame(rows, columns=CONVERSION_COLUMNS)


# -- applying a plan -----------------------------------------------------------------------------------


@dataclass
class AppliedPlan:
    """What :func:`apply_plan` did, and the re-audit that checks it.

    Attributes:
        changes: the weights converted (the helpers' report).
        converted_inputs: the convolutions that now convert their input first.
        hotspots: per phase, hotspot groups and bytes in the channels_last audit
            (``before``) and in the planned model's audit (``after``).
        max_abs_diff, allclose: the planned model's eval-mode output against the original's.
        before, after: the two audits (``auditor.diff(before, after)`` lists the groups).
    """

    changes: pd.DataFrame
    converted_inputs: dict[str, str]
    hotspots: pd.DataFrame
    max_abs_diff: float
    allclose: bool
    before: Audit
    after: Audit | None

    def __str__(self) -> str:
        lines = [f"Plan applied: {len(self.changes)} weights converted, "
                 f"{len(self.converted_inputs)} input conversions installed"]
        if self.after is not None:
            lines.append(f"  outputs {'allclose to' if self.allclose else 'DIFFER from'} the original "
                         f"(max abs diff {self.max_abs_diff:.2e})")
            for r in self.hotspots.itertuples():
                lines.append(f"  {r.phase:9} hotspot bytes {_fmt_bytes(r.bytes_before):>9} (all channels_last) "
                             f"-> {_fmt_bytes(r.bytes_after):>9} (planned)")
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        return "<pre>" + str(self).replace("&", "&amp;").replace("<", "&lt;") + "</pre>"


def _hotspot_totals(a: Audit) -> pd.DataFrame:
    hot = a.hotspots()
    rows = []
    for phase in ("forward", "backward", "total"):
        sel = hot if phase == "total" else hot[hot["phase"] == phase]
        rows.append({"phase": phase, "groups": len(sel), "bytes": int(sel["bytes"].sum())})
    return pd.DataFrame(rows)


def apply_plan(model: nn.Module, plan: LayoutPlan, *, check: bool = True) -> AppliedPlan:
    """Apply ``plan`` to ``model`` in place: each convolution's weight in its planned format,
    and an input conversion (a forward pre-hook) before every convolution whose input arrives
    in another format. Earlier input conversions are removed first, so applying twice is safe.

    The model keeps taking the same inputs (the plan converts them where needed) and keeps its
    ``Parameter`` objects. With ``check=True`` a copy is re-audited on the plan's inputs and
    its eval-mode output compared with the original's; the model itself is not run.
    """
    if not isinstance(plan, LayoutPlan):
        raise TypeError(f"apply_plan expects a LayoutPlan from plan_layout, got {type(plan).__name__}")
    for name in plan.formats:
        if not _is_conv_module(model, name):
            raise ValueError(f"the plan names {name!r}, which is not a convolution of this model")
    changes = _apply_formats(model, plan.formats, plan.converted_inputs)
    before = _hotspot_totals(plan.audit)
    after_audit, diff, close = None, float("nan"), False
    if check:
        probe = copy.deepcopy(model)
        after_audit = _audit(probe, plan.inputs, plan.train, plan.loss_fn)
        after = _hotspot_totals(after_audit)
        before = before.merge(after, on="phase", suffixes=("_before", "_after"))
        out = _reference_output(model, plan.inputs)
        diff, close = _compare(plan.reference, out)
    else:
        before = before.rename(columns={"groups": "groups_before", "bytes": "bytes_before"})
        before["groups_after"] = pd.NA
        before["bytes_after"] = pd.NA
    return AppliedPlan(changes, dict(plan.converted_inputs), before, diff, close, plan.audit, after_audit)


def _compare(a, b) -> tuple[float, bool]:
    la = [t for t in pytree.tree_leaves(a) if isinstance(t, torch.Tensor)]
    lb = [t for t in pytree.tree_leaves(b) if isinstance(t, torch.Tensor)]
    if len(la) != len(lb):
        return float("inf"), False
    diff, close = 0.0, True
    for x, y in zip(la, lb):
        if x.shape != y.shape:
            return float("inf"), False
        if x.is_floating_point():
            diff = max(diff, float((x.float() - y.float()).abs().max()) if x.numel() else 0.0)
            tol = 1e-2 if x.dtype in (torch.float16, torch.bfloat16) else 1e-4
            close &= bool(torch.allclose(x.float(), y.float(), rtol=tol, atol=tol))
        else:
            close &= bool(torch.equal(x, y))
    return diff, close
