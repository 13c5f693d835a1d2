"""``plan_layout``: the plan, its reasons, and how it is chosen (see the package docstring)."""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import pandas as pd
import torch
import torch.nn as nn

from .._analysis._flow import FlowView
from .._display._plans import (
    decisions_text,
    noise_note,
    plan_headline,
    plan_html,
    plan_notes,
    plan_text,
)
from .._display.progress import bar as progress_bar
from .._fix._convert import layout_name, to_channels_last, to_contiguous
from .._fix._hooks import is_conv_module, remove_input_formats
from .._measure._decide import Decision, agreeing, decide, ratios
from .._measure._harness import default_clock, intra_op_threads
from .._recording._formats import base_format
from .._recording._torch import pytree
from .._result import Audit
from .._step import Step, copy_model, default_loss
from ._assign import CL_NAME, converted_inputs, rank_names
from ._check import record, reference_output
from ._cut import energy, min_cut, regions
from ._graph import hotspot_edges, plan_graph
from ._measure import (
    border_costs,
    candidate_rounds,
    conv_groups,
    conv_medians,
    conv_rounds,
    conversion_times,
    decide_groups,
    ops_between_convs,
    other_format,
)
from ._regions import region_candidates

CONV_COLUMNS = [
    "module", "module_type", "calls", "input_shape", "weight_shape", "dtype", "groups", "stride",
    "conv_contiguous_us", "conv_channels_last_us", "ops_contiguous_us", "ops_channels_last_us",
    "total_contiguous_us", "total_channels_last_us", "speedup", "ratio", "ratio_low", "ratio_high", "repeats",
    "within_noise", "group", "border_us", "proposed", "format", "region", "reason",
]


PLAN_CONVERSION_COLUMNS = [
    "where", "kind", "from_module", "shape", "dtype", "bytes", "to_channels_last_us",
    "to_contiguous_us", "border",
]


CANDIDATE_COLUMNS = [
    "candidate", "predicted_us", "measured_us", "spread", "faults", "vs", "ratio", "ratio_low", "ratio_high",
    "repeats", "within_noise", "chosen",
]


class NoisyPlanWarning(UserWarning):
    """:func:`plan_layout` could not tell its candidates apart beyond the noise of the
    machine within its budget of rounds: it kept the simpler layout, but the choice is a guess."""


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
            Convolutions with the same signature (input shape, dtype, weight shape, stride,
            padding, dilation, groups) share one ``group``, one measurement and one decision:
            ``ratio`` is the group's channels_last time over its contiguous time (median of
            paired rounds; ops after it and conversions from fixed sources included),
            ``ratio_low``/``ratio_high`` its 98% interval, ``repeats`` the rounds taken and
            ``within_noise`` whether the interval still straddled the margin at the budget
            (the group then keeps ``default``).
        conversions: every conversion the plan weighed, and each hotspot of the
            channels_last audit, with its measured time in both directions.
        candidates: whole-model times, predicted and measured (median on ``clock``; ``spread``
            is the interquartile range over the median): ``planned`` (the minimum cut),
            ``all contiguous``, ``all channels_last``, and ``region <convolutions> contiguous`` for
            each region a fix would keep contiguous whose edges convert more bytes than it
            removes (:mod:`._regions`; all channels_last but that region); ``vs``, ``ratio``, ``ratio_low``,
            ``ratio_high``, ``repeats``, ``within_noise``: the decision that weighed the
            candidate against another (median of paired ratios and its 98% interval);
            ``chosen`` marks the one applied: the default uniform format unless the other one
            measured ``margin`` faster beyond the noise, and the cut or a region only if it
            measured ``margin`` faster than that beyond the noise (the fastest of those that did).
        default: the simpler uniform layout a decision within noise keeps: the format of the
            model's convolution weights as given (``contiguous`` for a freshly built model).
        margin: what an alternative must gain, as a fraction, for a decision to take it.
        clock: ``wall`` or ``cpu``, the clock of every measurement (:func:`default_clock`).
        step: the step planned for (its ``backward``: a training step rather than
            inference), on the inputs as given; ``train``, ``inputs``, ``kwargs`` and
            ``loss_fn`` read from it.
        audit: the channels_last audit the plan was built from (``before`` in
            :func:`apply_plan`).
    """

    formats: dict[str, str]
    converted_inputs: dict[str, str]
    convs: pd.DataFrame
    conversions: pd.DataFrame
    candidates: pd.DataFrame
    step: Step
    audit: Audit
    reference: object = field(repr=False, default=None)
    device: str = "cpu"
    clock: str = "wall"
    calls: list = field(repr=False, default_factory=list)
    default: str = "contiguous"
    margin: float = 0.02

    @property
    def train(self) -> bool:
        """Planned for a training step (``step.backward``)."""
        return self.step.backward

    @property
    def inputs(self) -> tuple:
        return self.step.inputs

    @property
    def kwargs(self) -> dict:
        return dict(self.step.kwargs)

    @property
    def loss_fn(self) -> Callable:
        return self.step.loss_fn or default_loss

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

    @property
    def within_noise(self) -> bool:
        """The plan's overall choice rests on a decision that stayed within noise."""
        c = self.candidates
        return bool(c["within_noise"].fillna(False).astype(bool).any())

    def noise_note(self) -> str:
        """What stayed within noise among the whole-model decisions ("" when nothing did)."""
        return noise_note(self.candidates, self.margin, self.chosen)

    def _shown(self) -> dict:
        """What its text and its HTML show (:mod:`auditor._display`)."""
        headline = plan_headline(
            backward=self.train, device=self.device, clock=self.clock, margin=self.margin, formats=self.formats,
            regions=self.convs["region"].nunique() if len(self.convs) else None,
            input_conversions=len(self.converted_inputs))
        return {"headline": headline, "candidates": self.candidates, "decisions": self.decisions(),
                "notes": plan_notes(self.candidates, self.margin, self.chosen)}

    def __str__(self) -> str:
        return plan_text(**self._shown())

    def decisions(self) -> pd.DataFrame:
        """One row per group of same-signature convolutions, the groups with most at stake first:
        ``convolutions`` (the first one's name and how many more), ``contiguous_us`` and
        ``channels_last_us`` (the group's totals), ``ratio`` channels_last / contiguous (median
        of paired rounds) with ``ratio_low``/``ratio_high`` (its 98% interval), ``repeats``,
        ``within_noise``, the ``format`` chosen and the ``reason``."""
        rows = []
        for _, g in self.convs.groupby("group", sort=False):
            first = g.iloc[0]
            tc, tl = float(g["total_contiguous_us"].sum()), float(g["total_channels_last_us"].sum())
            rows.append({
                "convolutions": first["module"] + (f" +{len(g) - 1}" if len(g) > 1 else ""),
                "contiguous_us": tc, "channels_last_us": tl, "ratio": first["ratio"],
                "ratio_low": first["ratio_low"], "ratio_high": first["ratio_high"], "repeats": first["repeats"],
                "within_noise": bool(first["within_noise"]), "format": "/".join(sorted(set(g["format"]))),
                "reason": first["reason"], "_stake": abs(tc - tl),
            })
        columns = ["convolutions", "contiguous_us", "channels_last_us", "ratio", "ratio_low", "ratio_high",
                   "repeats", "within_noise", "format", "reason"]
        if not rows:
            return pd.DataFrame(columns=columns)
        frame = pd.DataFrame(rows).sort_values("_stake", ascending=False, kind="stable")
        return frame[columns].reset_index(drop=True)

    def decisions_table(self, max_rows: int | None = None) -> str:
        """:meth:`decisions` as text, ``max_rows`` of them."""
        return decisions_text(self.decisions(), max_rows)

    def __repr__(self) -> str:
        return str(self)

    def _repr_html_(self) -> str:
        """The plan in a notebook: its headline and notes, the candidates, and the decisions."""
        return plan_html(**self._shown())


def _given_format(inputs) -> str:
    for t in pytree.tree_leaves(list(inputs)):
        if isinstance(t, torch.Tensor) and t.dim() in (4, 5):
            return base_format(layout_name(t))
    return "contiguous"


def _default_format(model: nn.Module, names: list[str]) -> str:
    """The format most of the planned convolutions' weights are in (``contiguous`` on a tie)."""
    votes = {"contiguous": 0, "channels_last": 0}
    for n in names:
        f = base_format(layout_name(model.get_submodule(n).weight))
        f = "channels_last" if f.startswith("channels_last") else f
        if f in votes:
            votes[f] += 1
    return "channels_last" if votes["channels_last"] > votes["contiguous"] else "contiguous"


def plan_layout(model: nn.Module, *inputs, kwargs: Mapping[str, object] | None = None, backward: bool | None = None,
                loss_fn: Callable | None = None, repeats: int = 7, max_repeats: int = 35, recordings: int = 3,
                margin: float = 0.02, clock: str | None = None, progress: bool | None = None,
                threads: int | None = 1) -> LayoutPlan:
    """Measure, on this device, which format each convolution of ``model`` should run in.

    ``inputs`` (and keyword arguments ``kwargs``, a mapping) are what the model is called with,
    as it will be in use (a plain contiguous batch, say); converting them is part of the plan
    and of its measured time. ``backward=True`` plans a training step (forward,
    ``loss_fn(output).backward()``, default ``output.sum()``) instead of inference, as it means
    in :func:`auditor.audit`.

    Every decision compares two candidates in interleaved rounds and looks at the median of the
    paired ratios and its 98% interval (:mod:`auditor._measure`): ``repeats`` rounds first,
    then ``repeats`` more at a time while the interval straddles ``1 - margin``, up to
    ``max_repeats``. A decision still within noise then keeps the simpler layout: the model's
    own uniform format (the format of its convolution weights, ``plan.default``), and a
    :class:`NoisyPlanWarning` is issued when the plan's overall choice is within noise.
    Convolutions with the same signature share one measurement and one decision. A mixed plan
    is chosen only when it measures ``margin`` faster than the better uniform format beyond the
    noise. ``recordings`` timed audits per format time the ops between convolutions. Everything is
    measured at ``threads`` intra-op threads (default 1, as audits and ``Fixes.verify`` measure;
    None: the caller's count; the caller's count is given back afterwards). ``clock`` is ``wall``
    or ``cpu`` (default: :func:`default_clock`, process CPU time at one thread). ``progress``: a ``tqdm.auto`` bar on
    stderr, ``True``/``False`` to force it on or off (default: ``auditor._display.progress``
    decides: its ``ENABLED``, else ``AUDITOR_PROGRESS``, else a bar only on a terminal).
    The model is not modified: all work happens on copies. Returns a :class:`LayoutPlan`; see
    the package docstring for the method.
    """
    _check_arguments(model, inputs, kwargs, repeats, max_repeats, recordings, margin, clock)
    if threads is not None and (not isinstance(threads, int) or isinstance(threads, bool) or threads < 1):
        raise ValueError(f"threads is a number of intra-op threads, at least 1, or None, got {threads!r}")
    step = Step(model, inputs, kwargs or {}, backward=bool(backward), loss_fn=loss_fn or default_loss)
    given = _given_format(inputs)
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    with intra_op_threads(threads if device.type == "cpu" else None):
        clock = clock or default_clock(device)
        bar = progress_bar(total=2 * recordings, desc="plan_layout: recording", flag=progress, unit="step")
        try:
            return _plan(step, repeats, max_repeats, recordings, margin, clock, given, device, bar)
        finally:
            bar.close()


def _plan(step: Step, repeats, max_repeats, recordings, margin, clock, given, device, bar) -> LayoutPlan:
    model, train = step.model, step.backward

    def tick(n: int) -> None:
        bar.update(n)

    def stage(desc: str, more: int) -> None:
        bar.set_description_str(f"plan_layout: {desc}")
        bar.total = (bar.total or 0) + more
        bar.refresh()

    cl_step, c_step = _uniform_copies(step)
    structure = record(cl_step, record_time=True)
    tick(1)
    if not structure.complete:
        raise RuntimeError(f"the model failed in channels_last: {structure.error}")
    flow = FlowView(structure.ops(), structure.flow())
    planned = {n for n in set(flow.module[flow.is_conv & (flow.phase == "forward")])
               if n not in ("<root>", "<global>") and is_conv_module(model, n)}
    calls, edges = plan_graph(flow, planned, given)
    names = list(dict.fromkeys(c.module for c in calls))
    ranks = {n: model.get_submodule(n).weight.dim() for n in names}
    default = _default_format(model, names)
    reference = reference_output(step)

    ops_us = ops_between_convs(structure, cl_step, c_step, names, planned, given, recordings, tick)
    all_edges = edges + hotspot_edges(structure)
    stage("conversions", len({(e.shape, e.dtype) for e in all_edges if len(e.shape) in (4, 5)}))
    conversion_us = conversion_times(all_edges, repeats, device, clock, tick)
    fixed_cost, pair = border_costs(edges, conversion_us, names, train)

    sigs, rounds = conv_rounds(model, calls, train, device)
    fixed = {n: {f: ops_us[f][n] + fixed_cost[n][f] for f in ("contiguous", "channels_last")} for n in names}
    groups = conv_groups(names, calls, sigs, fixed)
    stage(f"{len(rounds)} convolution signatures", len(rounds) * repeats)

    def conv_tick(n: int) -> None:
        if bar.n + n > (bar.total or 0):
            bar.total = bar.n + n
        tick(n)
    decide_groups(groups, rounds, clock=clock, default=default, margin=margin, repeats=repeats,
                  max_repeats=max_repeats, tick=conv_tick)
    conv_us = conv_medians(rounds, clock)
    conv_cost = {n: {"contiguous": 0.0, "channels_last": 0.0} for n in names}
    for c, s in zip(calls, sigs):
        for f in conv_cost[c.module]:
            conv_cost[c.module][f] += conv_us[s][f]
    unary = {n: {f: conv_cost[n][f] + fixed[n][f] for f in ("contiguous", "channels_last")} for n in names}
    cut = min_cut(names, _cut_costs(unary, groups, default), pair, [g.members for g in groups]) if names else {}

    options = {
        "planned": cut,
        "all contiguous": dict.fromkeys(names, "contiguous"),
        "all channels_last": dict.fromkeys(names, "channels_last"),
    }
    for name, labels in region_candidates(structure, names).items():
        options.setdefault(name, labels)
    stage("whole model", len(set(map(lambda o: tuple(sorted(o.items())), options.values()))) * repeats)
    cand_rounds, timed_as = candidate_rounds(step, options, ranks, calls, device)
    cand = _choose(options, cand_rounds, timed_as, unary, pair, clock=clock, default=default, margin=margin,
                   repeats=repeats, max_repeats=max_repeats, tick=conv_tick)
    chosen = str(cand.loc[cand["chosen"], "candidate"].iloc[0])
    labels = options[chosen]
    formats = rank_names(labels, ranks)
    convs = _reasons(model, names, calls, conv_cost, ops_us, unary, pair, labels, formats, cut, chosen, groups,
                     default, margin, why_chosen(cand, chosen, margin))
    convs["proposed"] = [rank_names(cut, ranks)[n] for n in convs["module"]]
    plan = LayoutPlan(
        formats=formats, converted_inputs=converted_inputs(formats, calls), convs=convs,
        conversions=_conversions_frame(edges, structure, conversion_us, formats),
        candidates=cand, step=step, audit=structure, reference=reference, device=str(device), clock=clock,
        calls=calls, default=default, margin=margin,
    )
    if plan.within_noise:
        warnings.warn(f"plan_layout: the plan's choice is {plan.noise_note()}; more max_repeats, a quieter "
                      "machine or one thread (CPU time) may separate them", NoisyPlanWarning, stacklevel=3)
    return plan


def _check_arguments(model, inputs, kwargs, repeats, max_repeats, recordings, margin, clock) -> None:
    if not isinstance(model, nn.Module):
        raise TypeError(f"plan_layout expects an nn.Module, got {type(model).__name__}")
    if not inputs:
        raise ValueError("plan_layout needs the model's inputs (a batch as it will be fed)")
    if kwargs is not None:
        if not isinstance(kwargs, Mapping):
            raise TypeError(f"kwargs must be a mapping of keyword arguments, got {type(kwargs).__name__}")
        bad = [k for k in kwargs if not isinstance(k, str)]
        if bad:
            raise TypeError(f"kwargs keys must be strings (argument names), got {bad[0]!r}")
    if repeats < 1 or recordings < 1:
        raise ValueError("repeats and recordings must be at least 1")
    if max_repeats < repeats:
        raise ValueError(f"max_repeats ({max_repeats}) must be at least repeats ({repeats})")
    if not 0 <= margin < 1:
        raise ValueError(f"margin is a fraction in [0, 1), got {margin}")
    if clock not in (None, "wall", "cpu"):
        raise ValueError(f"clock is 'wall' or 'cpu', got {clock!r}")


def _uniform_copies(step: Step) -> tuple[Step, Step]:
    """``step`` on copies of its model all channels_last and all contiguous, without input
    hooks; its inputs, and the tensors among its keyword arguments, converted alike."""
    model, inputs, kwargs = step.model, step.inputs, dict(step.kwargs)
    cl_model = copy_model(model)
    remove_input_formats(cl_model)
    *cl_inputs, cl_kwargs = to_channels_last(cl_model, *inputs, kwargs)[1:]
    c_model = to_contiguous(copy_model(model))
    remove_input_formats(c_model)
    c_inputs, c_kwargs = pytree.tree_map(lambda t: t.contiguous() if isinstance(t, torch.Tensor) else t,
                                         (list(inputs), kwargs))
    return (step.replace(model=cl_model, inputs=tuple(cl_inputs), kwargs=cl_kwargs),
            step.replace(model=c_model, inputs=tuple(c_inputs), kwargs=c_kwargs))


def _cut_costs(unary, groups, default: str) -> dict[str, dict[str, float]]:
    """The costs the cut sees: measured, except that a group whose decision did not clearly
    take the other format costs at least as much in it as in ``default`` (and a hair more, so a
    tie keeps the default): noise below the margin never moves a convolution by itself."""
    out = {n: dict(u) for n, u in unary.items()}
    alt = other_format(default)
    for g in groups:
        if g.decision is not None and g.decision.takes_alternative:
            continue
        for n in g.members:
            d, a = out[n][default], out[n][alt]
            out[n][alt] = max(a, d) * (1 + 1e-9) + 1e-6
    return out


def _choose(options: dict, rounds, timed_as: dict, unary, pair, *, clock: str, default: str, margin: float,
            repeats: int, max_repeats: int, tick) -> pd.DataFrame:
    """The candidates table. The other uniform format is chosen over ``default``'s when it
    measures ``margin`` faster beyond the noise; the cut over the better uniform format when it
    measures ``margin`` faster than that beyond the noise. Rounds are added, ``repeats`` at a
    time, while a decision is within noise, up to ``max_repeats``."""
    default_name = f"all {default}"
    alt_name = f"all {other_format(default)}"
    is_uniform = options["planned"] in (options["all contiguous"], options["all channels_last"])
    uniforms = (options["all contiguous"], options["all channels_last"])
    regions = [n for n in options if n not in ("planned", "all contiguous", "all channels_last")
               and options[n] not in uniforms]
    step = max(1, repeats)
    rounds.run(repeats)
    tick(repeats * len(rounds.fns))

    def decisions():
        t = rounds.times(clock)
        out = {}

        def weigh(a: str, b: str) -> Decision:  # the paired ratios, and the medians agreeing with them
            x, y = t[timed_as[a]], t[timed_as[b]]
            return agreeing(decide(ratios(x, y), margin), x, y)

        if timed_as[alt_name] != timed_as[default_name]:
            out[alt_name] = (default_name, weigh(alt_name, default_name))
        uniform = alt_name if alt_name in out and out[alt_name][1].takes_alternative else default_name
        if not is_uniform:
            out["planned"] = (uniform, weigh("planned", uniform))
        for name in regions:  # a region the fixes would keep contiguous, against the better uniform format
            out[name] = (uniform, weigh(name, uniform))
        return uniform, out

    while True:
        uniform, made = decisions()
        if not any(d.within_noise for _, d in made.values()) or len(rounds) >= max_repeats:
            break
        n = min(step, max_repeats - len(rounds))
        rounds.run(n)
        tick(n * len(rounds.fns))
    # the cut or a region, where it measures margin faster than the better uniform format: the fastest of them
    taken = [n for n in ("planned", *regions) if n in made and made[n][1].takes_alternative]
    best = min(taken, key=lambda n: made[n][1].ratio) if taken else uniform
    frame = rounds.frame()
    rows = []
    for name, labels in options.items():
        timed = timed_as[name]
        vs, d = made.get(name, ("", None))
        rows.append({
            "candidate": name, "predicted_us": energy(labels, unary, pair),
            "measured_us": float(frame.at[timed, f"{clock}_us"]), "spread": float(frame.at[timed, f"{clock}_spread"]),
            "faults": float(frame.at[timed, "faults"]), "vs": vs,
            "ratio": d.ratio if d else float("nan"), "ratio_low": d.low if d else float("nan"),
            "ratio_high": d.high if d else float("nan"), "repeats": d.repeats if d else len(rounds),
            "within_noise": d.within_noise if d else pd.NA, "chosen": name == best,
        })
    return pd.DataFrame(rows, columns=CANDIDATE_COLUMNS)


def why_chosen(cand: pd.DataFrame, chosen: str, margin: float) -> str:
    """Why the whole-model candidate ``chosen`` was taken, as its own candidates table says: the
    fastest measured, or kept because none measured ``margin`` faster beyond the noise (then the
    faster one is named, so the reason never calls the slowest option fastest)."""
    measured = dict(zip(cand["candidate"].astype(str), cand["measured_us"].astype(float)))
    fastest = min(measured, key=measured.get)
    if fastest == chosen:
        return f"{chosen} measured fastest end to end"
    return (f"{chosen} kept: {fastest} measured {measured[fastest] / 1e3:.1f} ms against its "
            f"{measured[chosen] / 1e3:.1f} ms end to end, not {margin:.0%} faster beyond the noise")


def _reasons(model, names, calls, conv_cost, ops_us, unary, pair, labels, formats, cut, chosen_name, groups,
             default, margin, chosen_why: str = "") -> pd.DataFrame:
    region_of = regions(names, labels, pair)
    border = dict.fromkeys(names, 0.0)
    for (a, b), cost in pair.items():
        if labels[a] != labels[b]:
            c = cost["c_to_cl"] if labels[a] == "contiguous" else cost["cl_to_c"]
            border[b] += c
    group_of = {n: (i, g) for i, g in enumerate(groups) for n in g.members}
    rows = []
    first_call = {}
    for c in calls:
        first_call.setdefault(c.module, c)
    alt = other_format(default)
    for n in names:
        mod = model.get_submodule(n)
        c = first_call[n]
        gid, g = group_of[n]
        d = g.decision
        tc, tl = unary[n]["contiguous"], unary[n]["channels_last"]
        gt = {f: sum(unary[m][f] for m in g.members) for f in ("contiguous", "channels_last")}
        what = "with the ops after it" if any(ops_us[f][m] for f in ops_us for m in g.members) else "alone"
        if len(g.members) > 1:
            what += f" ({len(g.members)} convolutions, one signature)"
        prefer = alt if d.takes_alternative else default
        why = _conv_reason(prefer, alt, default, d, g.shown, margin, what)
        if cut[n] == prefer:
            reason = why
        else:
            reason = (f"{cut[n]}: a region border here would cost more than the "
                      f"{abs(gt[cut[n]] - gt[prefer]):.0f} us; alone, {why}")
        if chosen_name != "planned" and labels[n] != cut[n]:
            reason = f"{chosen_why or chosen_name + ' chosen end to end'} (cut: {reason})"
        rows.append({
            "module": n, "module_type": type(mod).__name__, "calls": sum(1 for x in calls if x.module == n),
            "input_shape": c.input_shape, "weight_shape": tuple(mod.weight.shape), "dtype": str(c.dtype).replace("torch.", ""),
            "groups": mod.groups, "stride": tuple(mod.stride),
            "conv_contiguous_us": conv_cost[n]["contiguous"], "conv_channels_last_us": conv_cost[n]["channels_last"],
            "ops_contiguous_us": ops_us["contiguous"][n], "ops_channels_last_us": ops_us["channels_last"][n],
            "total_contiguous_us": tc, "total_channels_last_us": tl,
            "speedup": tc / tl if tl > 0 else float("nan"),
            "ratio": g.shown[0], "ratio_low": g.shown[1], "ratio_high": g.shown[2], "repeats": d.repeats,
            "within_noise": d.within_noise, "group": gid, "border_us": border[n],
            "format": formats[n], "region": region_of[n], "reason": reason,
        })
    return pd.DataFrame(rows, columns=CONV_COLUMNS)


def _conv_reason(prefer: str, alt: str, default: str, d: Decision, shown: tuple[float, float, float],
                 margin: float, what: str) -> str:
    """Why a group runs in ``prefer``, in the numbers its row shows (``shown``: channels_last /
    contiguous, median of the paired rounds and its interval). A speed-up is claimed only where
    that whole interval says so, and then with the interval; an interval across 1 is said as
    such."""
    cl, low, high = shown
    if prefer == "contiguous":
        ratio, lo, hi = cl, low, high
    else:  # contiguous / channels_last: the inverse, its interval turned round
        ratio, lo, hi = (1 / x if x > 0 else float("inf") for x in (cl, high, low))
    if d.within_noise:
        return (f"{prefer}: within noise ({alt}/{default} {d.ratio:.3f} in [{d.low:.3f}, {d.high:.3f}] "
                f"after {d.repeats} rounds, margin {margin:.0%}) {what}")
    if lo > 1:  # the whole interval says prefer is faster
        return f"{prefer} {ratio:.3f}x faster [{lo:.3f}, {hi:.3f}] {what}"
    if d.takes_alternative:  # clear against the margin, on totals the row's ratio does not show
        return f"{prefer}: {alt}/{default} {d.ratio:.3f} in [{d.low:.3f}, {d.high:.3f}], past the {margin:.0%} margin {what}"
    if hi >= 1:  # the row's interval straddles 1: no speed-up either way is shown
        return (f"{prefer}: {alt} not {margin:.0%} faster ({alt}/{default} {d.ratio:.3f} in "
                f"[{d.low:.3f}, {d.high:.3f}]; cl/contig in [{low:.3f}, {high:.3f}]) {what}")
    return f"{prefer}: {alt} less than {margin:.0%} faster {what}"


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
    return pd.DataFrame(rows, columns=PLAN_CONVERSION_COLUMNS)
