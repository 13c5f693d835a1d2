"""``Audit``: the result of a recording. Plain DataFrames plus a facade over the analyzers."""

from __future__ import annotations

import pandas as pd

from . import analysis
from .display import audit_html, audit_report, chrome_trace, progress, write_chrome_trace
from .recording import _csv as csvfile
from .recording import _log as log
from .recording._files import atomic_write
from .recording._mode import RawLog


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
        self._analysis: analysis.Analysis | None = None
        #: the table of ``Fixes.verify`` once the fixes of this audit were verified (the report
        #: then shows the measured saving beside the estimate), else None
        self.verification: pd.DataFrame | None = None

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
    def read_csv(cls, path_or_buf) -> Audit:
        """Read a CSV written by :meth:`to_csv` (a path, a buffer, or the text itself), exactly.
        A cut, edited or foreign file raises ``ValueError`` naming the line and column."""
        read = csvfile.read_csv(path_or_buf)
        return cls(read.events, read.tensors, complete=read.complete, error=read.error, hidden=read.hidden)

    # -- analyses ----------------------------------------------------------------------------
    def analysis(self) -> analysis.Analysis:
        """The analysis of this log (:func:`auditor.analysis.analyze`), every stage run once
        and cached; large audits show a progress bar over the stages (``display.progress``)."""
        a = self._pipeline()
        if not a.done:
            with progress.bar(len(analysis.STAGES), "analysing the audit", work=len(self.events),
                              min_work=progress.LARGE_AUDIT, unit="stage") as bar:
                a.run(lambda name: progress.stage(bar, name))
        return a

    def _pipeline(self) -> analysis.Analysis:
        """The analysis object, its stages run as they are asked for."""
        if self._analysis is None:
            self._analysis = analysis.Analysis(self.events, self.tensors, self.hidden)
        return self._analysis

    def flow(self) -> analysis.FlowGraph:
        """The data-flow graph of the log (cached): producers and consumers of every op."""
        return self._pipeline().flow

    def facts(self) -> pd.DataFrame:
        """Per tensor row, what the data flow knew about it (cached): whether it is an image,
        where its channels run, its format label as that image, and what an ambiguous one
        stands for (:func:`auditor.analysis.image_facts`)."""
        return self._pipeline().facts

    def ops(self) -> pd.DataFrame:
        """``events`` with the classification, data-flow and cause columns (cached)."""
        return self.analysis().ops

    def causes(self) -> pd.DataFrame:
        """One row per cause: the op and line where an activation first left its format, with
        the hotspots it leads to (its symptoms, forward and backward): the most time a fix
        saves first when timed, else the most bytes."""
        return self.analysis().causes.copy()

    def hotspots(self) -> pd.DataFrame:
        """Losses and conversions on conv -> ... -> conv paths, grouped, the most time first
        when timed, else the largest bytes; ``cause`` names the row of :meth:`causes` each
        belongs to."""
        return self.analysis().hotspots()

    def summary(self, depth: int = 1) -> pd.DataFrame:
        """Per-module totals at ``depth`` (1 = children of the root), in execution order."""
        return analysis.summary(self.ops(), depth)

    def coverage(self) -> pd.DataFrame:
        """Per aten op: how often it preserved or lost channels_last on this device and dtype."""
        return self.analysis().coverage.copy()

    def report(self, top: int = 10, depth: int = 1) -> str:
        """A one-screen text report: totals, the ``top`` causes with their symptoms folded under
        them, and the modules at ``depth`` that cost most."""
        return audit_report(self.ops(), self.hotspots(), self.summary(depth), self.causes(),
                            complete=self.complete, error=self.error, top=top, depth=depth, verified=self.verification)

    def chrome_trace(self) -> dict:
        """The audit as a Chrome trace (:func:`auditor.display.chrome_trace`), a dict."""
        return chrome_trace(self.ops(), self.hidden, self.causes())

    def export_chrome_trace(self, path) -> None:
        """Write the audit as a Chrome trace JSON file (the name ``torch.profiler`` uses) for
        Perfetto or chrome://tracing: a slice per op on a track per phase, coloured by kind,
        hidden copies nested in their op, and an arrow from each cause to its symptoms."""
        atomic_write(path, lambda tmp: write_chrome_trace(self.chrome_trace(), tmp))

    def __repr__(self) -> str:
        state = "complete" if self.complete else "incomplete"
        return f"<Audit {len(self.events)} ops, {len(self.tensors)} tensors, {state}>"

    def _repr_html_(self, top: int = 10, depth: int = 1) -> str:
        """The report as HTML tables (:func:`auditor.display.audit_html`), for notebooks."""
        return audit_html(self.ops(), self.hotspots(), self.summary(depth), self.causes(),
                          complete=self.complete, error=self.error, top=top, depth=depth, verified=self.verification)


def diff(before: Audit, after: Audit, include_unchanged: bool = False, by: str = "group") -> pd.DataFrame:
    """What appeared, vanished or changed between two audits: hotspot groups (``by="group"``)
    or causes (``by="cause"``, with the hotspots and bytes each leads to)."""
    if by == "cause":
        return analysis.diff_causes(before.causes(), after.causes(), include_unchanged)
    if by != "group":
        raise ValueError(f"by is 'group' or 'cause', got {by!r}")
    return analysis.diff(before.hotspots(), after.hotspots(), include_unchanged)
