"""``plan_layout``: the plan, its reasons, and how it is chosen (see the package docstring)."""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field

import pandas as pd
import torch
import torch.nn as nn
from torch.utils import _pytree as pytree

from ..analysis import FlowView
from ..display.tables import preformatted_html
from ..fix.convert import layout_name, to_channels_last, to_contiguous
from ..fix.hooks import remove_input_formats
from ..recording.formats import base_format
from ..result import Audit
from ..session import default_loss
from .assign import CL_NAME, converted_inputs, is_conv_module, rank_names
from .check import record, reference_output
from .cut import energy, min_cut, regions
from .graph import hotspot_edges, plan_graph
from .measure import (
    border_costs,
    conv_signature,
    conv_times,
    conversion_times,
    measure_candidates,
    ops_between_convs,
)
from .timing import default_clock

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
            if fmt not in ("contiguous", CL_NAME[rank]):
                raise ValueError(f"{name!r} takes 'contiguous' or {CL_NAME[rank]!r}, got {fmt!r}")
            formats[name] = fmt
        convs = self.convs.copy()
        convs["format"] = [formats[n] for n in convs["module"]]
        convs["reason"] = [r if formats[n] == f else "set by hand" for n, f, r in
                           zip(self.convs["module"], self.convs["format"], self.convs["reason"])]
        cand = self.candidates.assign(chosen=False)
        return dataclasses.replace(self, formats=formats, converted_inputs=converted_inputs(formats, self.calls),
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
        return preformatted_html(str(self))


def _given_format(inputs) -> str:
    for t in pytree.tree_leaves(list(inputs)):
        if isinstance(t, torch.Tensor) and t.dim() in (4, 5):
            return base_format(layout_name(t))
    return "contiguous"


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
    copies. Returns a :class:`LayoutPlan`; see the package docstring for the method.
    """
    _check_arguments(model, inputs, repeats, recordings, margin, clock)
    loss_fn = loss_fn or default_loss
    given = _given_format(inputs)
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    clock = clock or default_clock(device)
    cl_run, c_run = _uniform_copies(model, inputs)

    structure = record(*cl_run, train, loss_fn, record_time=True)
    if not structure.complete:
        raise RuntimeError(f"the model failed in channels_last: {structure.error}")
    flow = FlowView(structure.ops(), structure.flow())
    planned = {n for n in set(flow.module[flow.is_conv & (flow.phase == "forward")])
               if n not in ("<root>", "<global>") and is_conv_module(model, n)}
    calls, edges = plan_graph(flow, planned, given)
    names = list(dict.fromkeys(c.module for c in calls))
    ranks = {n: model.get_submodule(n).weight.dim() for n in names}
    reference = reference_output(model, inputs)

    ops_us = ops_between_convs(structure, cl_run, c_run, names, planned, given, train, loss_fn, recordings)
    conv_cost = _conv_costs(model, calls, names, train, repeats, device, clock)
    conversion_us = conversion_times(edges + hotspot_edges(structure), repeats, device, clock)
    fixed_cost, pair = border_costs(edges, conversion_us, names, train)
    unary = {n: {f: conv_cost[n][f] + ops_us[f][n] + fixed_cost[n][f] for f in ("contiguous", "channels_last")}
             for n in names}

    cut = min_cut(names, unary, pair) if names else {}
    options = {
        "planned": cut,
        "all contiguous": dict.fromkeys(names, "contiguous"),
        "all channels_last": dict.fromkeys(names, "channels_last"),
    }
    measured = measure_candidates(model, inputs, options, ranks, calls, train, loss_fn, repeats, device, clock)
    cand = _choose(options, measured, unary, pair, margin)
    chosen = str(cand.loc[cand["chosen"], "candidate"].iloc[0])
    labels = options[chosen]
    formats = rank_names(labels, ranks)
    convs = _reasons(model, names, calls, conv_cost, ops_us, unary, pair, labels, formats, cut, chosen)
    convs["proposed"] = [rank_names(cut, ranks)[n] for n in convs["module"]]
    return LayoutPlan(
        formats=formats, converted_inputs=converted_inputs(formats, calls), convs=convs,
        conversions=_conversions_frame(edges, structure, conversion_us, formats),
        candidates=cand, train=train, audit=structure, inputs=tuple(inputs), reference=reference,
        loss_fn=loss_fn, device=str(device), clock=clock, calls=calls,
    )


def _check_arguments(model, inputs, repeats, recordings, margin, clock) -> None:
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


def _uniform_copies(model: nn.Module, inputs: tuple) -> tuple[tuple, tuple]:
    """(model, inputs) copies all channels_last and all contiguous, without input hooks."""
    cl_model = copy.deepcopy(model)
    remove_input_formats(cl_model)
    cl_inputs = to_channels_last(cl_model, *inputs)[1:]
    c_model = to_contiguous(copy.deepcopy(model))
    remove_input_formats(c_model)
    c_inputs = pytree.tree_map(lambda t: t.contiguous() if isinstance(t, torch.Tensor) else t, list(inputs))
    return (cl_model, cl_inputs), (c_model, c_inputs)


def _conv_costs(model, calls, names, train, repeats, device, clock) -> dict[str, dict[str, float]]:
    """Per convolution module, its calls' standalone time in each format, summed."""
    conv_us = conv_times(model, calls, train, repeats, device, clock)
    cost = {n: {"contiguous": 0.0, "channels_last": 0.0} for n in names}
    for c in calls:
        for f in cost[c.module]:
            cost[c.module][f] += conv_us[conv_signature(model.get_submodule(c.module), c)][f]
    return cost


def _choose(options: dict, measured: dict, unary, pair, margin: float) -> pd.DataFrame:
    """The candidates table, with ``chosen`` marking the better uniform format unless the cut
    measured ``margin`` faster."""
    cand = pd.DataFrame({
        "candidate": list(options),
        "predicted_us": [energy(o, unary, pair) for o in options.values()],
        "measured_us": [measured[k][0] for k in options],
        "spread": [measured[k][1] for k in options],
        "faults": [measured[k][2] for k in options],
    })
    uniform = cand.iloc[1:]["measured_us"].idxmin()
    mixed_pays = cand.at[0, "measured_us"] <= (1 - margin) * cand.at[uniform, "measured_us"]
    is_uniform = options["planned"] in (options["all contiguous"], options["all channels_last"])
    best = 0 if mixed_pays and not is_uniform else uniform
    cand["chosen"] = cand.index == best
    return cand


def _reasons(model, names, calls, conv_cost, ops_us, unary, pair, labels, formats, cut, chosen_name) -> pd.DataFrame:
    region_of = regions(names, labels, pair)
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
            "format": formats[n], "region": region_of[n], "reason": reason,
        })
    return pd.DataFrame(rows, columns=CONV_COLUMNS)


def _conversions_frame(edges, structure, times, formats) -> pd.DataFrame:
    rows = []
    for e in edges + hotspot_edges(structure):
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
