"""The analysis of one event log, stage by stage, in one object.

:func:`analyze` is the one pipeline every consumer goes through (the ``Audit`` facade, the
fixes, the layout plan, the distributed bucket analysis): the facts the data flow knows about
each tensor, the data-flow graph, the classification with the conv -> conv paths, the causes,
and the final hotspot mask. Nothing outside it decides what a hotspot is.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from contextlib import AbstractContextManager

import numpy as np
import pandas as pd

from ._activations import image_facts
from ._causes import CauseTracer, cause_table
from ._costs import after_warmup, within_step
from ._flow import FlowGraph, FlowView
from ._ops import classified_ops, hotspots
from ._summaries import coverage

#: The stages :meth:`Analysis.run` goes through, in order.
STAGES = ("facts", "flow", "classification", "causes")


def _no_stage(name: str) -> AbstractContextManager:
    return contextlib.nullcontext()


class Analysis:
    """Everything the analyzers find in one event log, each part computed once, when first
    asked for (``facts`` and ``flow`` alone are cheap; anything else runs every stage).

    Attributes (read-only):
        facts: per tensor row, what the data flow knows about it (:func:`image_facts`).
        flow: the data-flow graph (:class:`FlowGraph`).
        ops: ``events`` with the classification, data-flow and cause columns; ``hotspot`` is
            the final mask: a loss or conversion on a conv -> conv path that has a cause (a
            copy the recording mode made itself, which nothing upstream explains, has none).
        causes: one row per cause (:func:`cause_table`), their estimates trusted as far as
            ``warmup`` allows (:func:`~._costs.after_warmup`) and both sanity rules of time
            hold (:func:`~._costs.within_step`).
        coverage: per op, device and dtype, how often it kept channels_last.
        tracer: the :class:`CauseTracer` the causes were traced with, for the fixes.
    """

    def __init__(self, events: pd.DataFrame, tensors: pd.DataFrame, hidden: pd.DataFrame | None = None,
                 warmup: int | None = None):
        self.events, self.tensors, self.hidden, self.warmup = events, tensors, hidden, warmup
        self._facts: pd.DataFrame | None = None
        self._flow: FlowGraph | None = None
        self._ops: pd.DataFrame | None = None
        self._causes: pd.DataFrame | None = None
        self._coverage: pd.DataFrame | None = None
        self._tracer: CauseTracer | None = None

    @property
    def done(self) -> bool:
        """Whether every stage has run."""
        return self._ops is not None

    def run(self, stage: Callable[[str], AbstractContextManager] = _no_stage) -> Analysis:
        """Run the stages not run yet, each inside ``stage(name)`` (a progress bar's step);
        returns ``self``."""
        if self.done:
            return self
        with stage("facts"):
            facts = self.facts
        with stage("flow"):
            flow = self.flow
        with stage("classification"):
            ops = classified_ops(self.events, self.tensors, flow, facts)
            cov = coverage(ops, self.tensors)
        with stage("causes"):
            tracer = CauseTracer(FlowView(ops, flow), facts, cov)
            causes, event_cause = cause_table(tracer, hidden=self.hidden)
            causes = within_step(after_warmup(causes, self.warmup), ops)
        # a recording-mode artifact that nothing explains is no hotspot of the plain run
        self._ops = ops.assign(cause=event_cause, hotspot=ops["hotspot"].to_numpy() & (event_cause > 0))
        self._causes, self._coverage, self._tracer = causes, cov, tracer
        return self

    @property
    def facts(self) -> pd.DataFrame:
        if self._facts is None:
            self._facts = image_facts(self.events, self.tensors)
        return self._facts

    @property
    def flow(self) -> FlowGraph:
        if self._flow is None:
            self._flow = FlowGraph(self.events, self.tensors)
        return self._flow

    @property
    def ops(self) -> pd.DataFrame:
        return self.run()._ops

    @property
    def causes(self) -> pd.DataFrame:
        return self.run()._causes

    @property
    def coverage(self) -> pd.DataFrame:
        return self.run()._coverage

    @property
    def tracer(self) -> CauseTracer:
        return self.run()._tracer

    def view(self) -> FlowView:
        """The final ops over the data-flow graph."""
        return FlowView(self.ops, self.flow)

    def hotspots(self) -> pd.DataFrame:
        """The hotspot groups (:func:`hotspots` of :attr:`ops`)."""
        return hotspots(self.ops)

    def cause_of(self) -> np.ndarray:
        """Per event, the number of its cause (0: none)."""
        return self.ops["cause"].to_numpy()


def analyze(events: pd.DataFrame, tensors: pd.DataFrame, hidden: pd.DataFrame | None = None,
            warmup: int | None = None) -> Analysis:
    """Every stage of the analysis of an event log (``Audit.events``, ``Audit.tensors`` and,
    for savings, ``Audit.hidden`` and ``Audit.warmup``), run now."""
    return Analysis(events, tensors, hidden, warmup).run()


def ops_table(events: pd.DataFrame, tensors: pd.DataFrame, graph: FlowGraph | None = None,
              facts: pd.DataFrame | None = None, hidden: pd.DataFrame | None = None) -> pd.DataFrame:
    """``events`` with the classification, data-flow and cause columns: :attr:`Analysis.ops`,
    so that ``hotspots(ops_table(events, tensors))`` are ``Audit.hotspots()``. ``graph`` and
    ``facts``, when given, are this log's own :class:`FlowGraph` and :func:`image_facts`."""
    a = Analysis(events, tensors, hidden)
    a._flow, a._facts = graph, facts
    return a.ops
