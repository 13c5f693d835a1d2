"""``Audit``: the result of a recording. Plain DataFrames plus a facade over the analyzers."""

from __future__ import annotations

import pandas as pd

from ._analysis import _summaries as summaries
from ._analysis._compiled import CompiledStep, compiled_report_tables
from ._analysis._flow import FlowGraph
from ._analysis._pipeline import STAGES, Analysis
from ._display import progress
from ._display._compiled import compiled_html, compiled_text
from ._display._html import audit_html
from ._display._report import audit_report
from ._display._trace import chrome_trace, write_chrome_trace
from ._recording import _csv as csvfile
from ._recording import _log as log
from ._recording._files import atomic_write
from ._recording._mode import RawLog

#: why a timed audit's estimates are not trusted when no step ran before the recorded one
FIRST_STEP = ("no step ran before the recorded one (warmup=0): if it is the first in the process, its times "
              "include setting up kernels and memory")


def _joined(first: str, then: str) -> str:
    return f"{first}; {then}" if then else first


class Audit:
    """The event log of one recording and the analyses over it.

    Attributes:
        events: one row per aten op call (schema in the README).
        tensors: one row per tensor argument or result, linked to ``events`` by ``seq``.
        hidden: one row per copy an op's kernels made inside it (a timed recording), linked
            to ``events`` by ``seq``.
        complete: False when the recorded code raised; the log then ends at the failure.
        error: the exception that ended an incomplete recording, as text.
    """

    def __init__(self, events: pd.DataFrame, tensors: pd.DataFrame, *, complete: bool = True, error: str = "",
                 hidden: pd.DataFrame | None = None):
        self.events = events
        self.tensors = tensors
        self.hidden = hidden if hidden is not None else log.hidden_frame()
        self.complete = complete
        self.error = error
        self._analysis: Analysis | None = None
        #: the table of ``Fixes.verify`` once the fixes of this audit were verified (the report
        #: then shows the measured saving beside the estimate), else None
        self.verification: pd.DataFrame | None = None
        #: what Inductor lowered when the audit was compiled (``audit(..., compile=True)``), else None:
        #: ``events`` are then the eager step's, the compiled tables come from here
        self.compiled_step: CompiledStep | None = None
        #: the unrecorded steps ``auditor.audit`` ran before the recorded one (None: not known, as
        #: for a ``FormatAuditor`` or a log read back); at 0 the times may be a first step's
        self.warmup: int | None = None

    @property
    def compiled(self) -> bool:
        """Whether this audit also ran the step compiled by ``torch.compile`` (Inductor)."""
        return self.compiled_step is not None

    def _compiled_or_raise(self) -> CompiledStep:
        if self.compiled_step is None:
            raise ValueError("this audit was not compiled: use auditor.audit(model, x, compile=True)")
        return self.compiled_step

    def conversions(self) -> pd.DataFrame:
        """One row per kernel of the compiled step that reads an image in one physical order and
        writes it in another, or copies a convolution weight every step (README, "Compiled models")."""
        return self._compiled_or_raise().conversions()

    def graphs(self) -> pd.DataFrame:
        """Per graph Inductor lowered (forward and backward, one per graph break): whether layout
        optimization ran and why, each convolution's layout, kernels, conversions and time."""
        return self._compiled_or_raise().graph_table()

    def kernels(self) -> pd.DataFrame:
        """Every kernel of the compiled step in code order, with its time and source."""
        return self._compiled_or_raise().kernels.copy()

    def compare_compiled(self) -> pd.DataFrame:
        """Each eager cause of this audit beside the compiled step (``auditor.compare_compiled``)."""
        return compare_compiled(self, self)

    @classmethod
    def from_raw(cls, raw: RawLog) -> Audit:
        events, tensors = log.build_frames(raw)
        return cls(events, tensors, complete=raw.complete, error=raw.error, hidden=log.build_hidden(raw))

    # -- persistence -----------------------------------------------------------------------
    def to_csv(self, path_or_buf=None):
        """Write the audit as one CSV file (README, "The event log"); with no path, return the
        text. ``complete`` and ``error`` are kept; a path is written atomically."""
        return csvfile.to_csv(self.events, self.tensors, self.complete, path_or_buf, error=self.error,
                              hidden=self.hidden)

    @classmethod
    def read_csv(cls, path_or_buf, compiled=None) -> Audit:
        """Read a CSV written by :meth:`to_csv` (a path, a buffer, or the text itself), exactly.
        A cut, edited or foreign file raises ``ValueError`` naming the line and column.
        ``compiled``: the file :meth:`compiled_to_csv` wrote, for a compiled audit."""
        read = csvfile.read_csv(path_or_buf)
        audit = cls(read.events, read.tensors, complete=read.complete, error=read.error, hidden=read.hidden)
        if compiled is not None:
            audit.compiled_step = CompiledStep.read_csv(compiled)
        return audit

    def compiled_to_csv(self, path_or_buf=None):
        """Write what Inductor lowered (graphs, kernels with their times, buffers with their
        layouts) as one CSV, from which ``read_csv(..., compiled=)`` rebuilds every compiled
        table; with no path, return the text."""
        text = self._compiled_or_raise().to_csv()
        if path_or_buf is None:
            return text
        if hasattr(path_or_buf, "write"):
            path_or_buf.write(text)
        else:
            atomic_write(path_or_buf, lambda tmp: tmp.write_text(text))
        return None

    # -- analyses ----------------------------------------------------------------------------
    def analysis(self) -> Analysis:
        """The analysis of this log (:func:`auditor._analysis.analyze`), every stage run once
        and cached; large audits show a progress bar over the stages (``display.progress``)."""
        a = self._pipeline()
        if not a.done:
            with progress.bar(len(STAGES), "analysing the audit", work=len(self.events),
                              min_work=progress.LARGE_AUDIT, unit="stage") as bar:
                a.run(lambda name: progress.stage(bar, name))
        return a

    def _pipeline(self) -> Analysis:
        """The analysis object, its stages run as they are asked for."""
        if self._analysis is None:
            self._analysis = Analysis(self.events, self.tensors, self.hidden)
        return self._analysis

    def flow(self) -> FlowGraph:
        """The data-flow graph of the log (cached): producers and consumers of every op."""
        return self._pipeline().flow

    def facts(self) -> pd.DataFrame:
        """Per tensor row, what the data flow knew about it (cached): whether it is an image,
        where its channels run, its format label as that image, and what an ambiguous one
        stands for (:func:`auditor._analysis.image_facts`)."""
        return self._pipeline().facts

    def ops(self) -> pd.DataFrame:
        """``events`` with the classification, data-flow and cause columns (cached)."""
        return self.analysis().ops

    def causes(self) -> pd.DataFrame:
        """One row per cause: the op and line where an activation first left its format, with
        the hotspots it leads to (its symptoms, forward and backward): the most time a fix
        saves first when timed, else the most bytes."""
        causes = self.analysis().causes.copy()
        if self.warmup == 0 and len(causes) and causes["saving_us"].notna().any():
            causes["saving_trusted"] = False
            causes["saving_note"] = [_joined(FIRST_STEP, n) for n in causes["saving_note"]]
        return causes

    def hotspots(self) -> pd.DataFrame:
        """Losses and conversions on conv -> ... -> conv paths, grouped, the most time first
        when timed, else the largest bytes; ``cause`` names the row of :meth:`causes` each
        belongs to."""
        return self.analysis().hotspots()

    def summary(self, depth: int = 1) -> pd.DataFrame:
        """Per-module totals at ``depth`` (1 = children of the root), in execution order."""
        return summaries.summary(self.ops(), depth)

    def coverage(self) -> pd.DataFrame:
        """Per aten op: how often it preserved or lost channels_last on this device and dtype."""
        return self.analysis().coverage.copy()

    def report(self, top: int = 10, depth: int = 1) -> str:
        """A one-screen text report: totals, the ``top`` causes with their symptoms folded under
        them, and the modules at ``depth`` that cost most."""
        text = audit_report(self.ops(), self.hotspots(), self.summary(depth), self.causes(),
                            complete=self.complete, error=self.error, top=top, depth=depth, verified=self.verification)
        if self.compiled:
            text += "\n\n" + compiled_text(*compiled_report_tables(self.compiled_step, self.causes()), top=top)
        return text

    def chrome_trace(self) -> dict:
        """The audit as a Chrome trace (:func:`auditor._display.chrome_trace`), a dict."""
        return chrome_trace(self.ops(), self.hidden, self.causes())

    def export_chrome_trace(self, path) -> None:
        """Write the audit as a Chrome trace JSON file (the name ``torch.profiler`` uses) for
        Perfetto or chrome://tracing: a slice per op on a track per phase, coloured by kind,
        hidden copies nested in their op, and an arrow from each cause to its symptoms."""
        atomic_write(path, lambda tmp: write_chrome_trace(self.chrome_trace(), tmp))

    def __repr__(self) -> str:
        state = "complete" if self.complete else "incomplete"
        compiled = f", compiled: {len(self.conversions())} conversions" if self.compiled else ""
        return f"<Audit {len(self.events)} ops, {len(self.tensors)} tensors, {state}{compiled}>"

    def _repr_html_(self, top: int = 10, depth: int = 1) -> str:
        """The report as HTML tables (:func:`auditor._display.audit_html`), for notebooks."""
        html = audit_html(self.ops(), self.hotspots(), self.summary(depth), self.causes(),
                          complete=self.complete, error=self.error, top=top, depth=depth, verified=self.verification)
        if self.compiled:
            html += compiled_html(*compiled_report_tables(self.compiled_step, self.causes()), top=top)
        return html


def diff(before: Audit, after: Audit, include_unchanged: bool = False, by: str = "group") -> pd.DataFrame:
    """What appeared, vanished or changed between two audits: hotspot groups (``by="group"``)
    or causes (``by="cause"``, with the hotspots and bytes each leads to)."""
    if by == "cause":
        return summaries.diff_causes(before.causes(), after.causes(), include_unchanged)
    if by != "group":
        raise ValueError(f"by is 'group' or 'cause', got {by!r}")
    return summaries.diff(before.hotspots(), after.hotspots(), include_unchanged)


def compare_compiled(eager: Audit, compiled: Audit) -> pd.DataFrame:
    """The eager audit's causes beside the compiled audit's step: for each cause ``removed by the
    compiler`` or ``still there`` (with the kernel that converts at its line), then every
    conversion of the compiled step that no eager cause explains (``only compiled``)."""
    return compiled._compiled_or_raise().compare(eager.causes())
