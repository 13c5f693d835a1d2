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
from ._display._report import audit_report, trunk_depth
from ._display._trace import chrome_trace, write_chrome_trace
from ._recording import _csv as csvfile
from ._recording import _log as log
from ._recording._files import atomic_write
from ._recording._mode import RawLog
from ._recording._profile import StepTime


class Audit:
    """The event log of one recording and the analyses over it: a finished value, complete when
    it is made, that nothing writes into afterwards (its attributes are read-only; its analyses
    are computed once, when first asked for).

    Attributes:
        events: one row per aten op call (schema: the docs, "The event log").
        tensors: one row per tensor argument or result, linked to ``events`` by ``seq``.
        hidden: one row per copy an op's kernels made inside it (a timed recording), linked
            to ``events`` by ``seq``.
        complete: False when the recorded code raised; the log then ends at the failure.
        error: the exception that ended an incomplete recording, as text.
        warmup: the unrecorded steps :func:`auditor.audit` ran before the recorded one (None: not
            known, as for a ``FormatAuditor`` or a log read back); at 0 the times may be those of
            the first step in the process, and the causes' estimates say so.
        threads: the intra-op threads the recorded step's times were taken at: 1 for a timed
            :func:`auditor.audit` (as ``Fixes.verify`` times), None where the audit did not set
            it (a ``FormatAuditor`` runs at the caller's count, an untimed audit, a log read back).
        kernels: for a fake audit, per op whose results' strides a kernel chooses, how the audit
            knew them: asked of this machine's real kernel (CPU targets), the table of a device's
            known kernels, or not checked (``checked``), with ``calls`` and ``relaid`` (results
            laid out otherwise than the meta kernel did). None for a real audit.
        compiled: what Inductor lowered, for an audit made with ``compile=True``
            (:class:`CompiledStep`: ``conversions()``, ``graphs()``, ``kernels()``,
            ``to_csv()``); ``events`` and the causes are then the eager step's. None for an
            eager audit.
    """

    __slots__ = ("_events", "_tensors", "_hidden", "_complete", "_error", "_warmup", "_compiled", "_threads", "_kernels",
                 "_analysis", "_step_time")

    def __init__(self, events: pd.DataFrame, tensors: pd.DataFrame, *, complete: bool = True, error: str = "",
                 hidden: pd.DataFrame | None = None, warmup: int | None = None, compiled: CompiledStep | None = None,
                 threads: int | None = None, kernels: pd.DataFrame | None = None, step_time: StepTime | None = None):
        self._events = events
        self._tensors = tensors
        self._hidden = hidden if hidden is not None else log.hidden_frame()
        self._complete = complete
        self._error = error
        self._warmup = warmup
        self._compiled = compiled
        self._threads = threads
        self._kernels = kernels
        self._step_time = step_time  # how the recorder's own cost was kept out of the times
        self._analysis: Analysis | None = None

    events = property(lambda self: self._events, doc="One row per aten op call (schema: the docs, 'The event log').")
    tensors = property(lambda self: self._tensors,
                       doc="One row per tensor argument or result, linked to ``events`` by ``seq``.")
    hidden = property(lambda self: self._hidden,
                      doc="One row per copy an op's kernels made inside it (a timed recording).")
    complete = property(lambda self: self._complete, doc="False when the recorded code raised.")
    error = property(lambda self: self._error, doc="The exception that ended an incomplete recording, as text.")
    warmup = property(lambda self: self._warmup,
                      doc="The unrecorded steps run before the recorded one (None: not known).")
    threads = property(lambda self: self._threads,
                       doc="The intra-op threads the step's times were taken at (None: not set by the audit).")
    compiled = property(lambda self: self._compiled,
                        doc="What Inductor lowered (a ``CompiledStep``) for a compiled audit, else None.")
    kernels = property(lambda self: self._kernels,
                       doc="For a fake audit: per op whose results' strides are the target kernel's choice, how "
                           "they were known (``checked``: ``kernel``, asked of the real kernel here; ``table``; "
                           "``not checked``; ``not asked``), with ``calls`` and ``relaid``. None for a real audit.")

    @classmethod
    def from_raw(cls, raw: RawLog, *, warmup: int | None = None, compiled: CompiledStep | None = None) -> Audit:
        """The audit of a finished recording's raw log."""
        events, tensors = log.build_frames(raw)
        return cls(events, tensors, complete=raw.complete, error=raw.error, hidden=log.build_hidden(raw),
                   warmup=warmup, compiled=compiled, step_time=raw.step_time)

    def _with(self, *, warmup: int | None = None, compiled: CompiledStep | None = None,
              threads: int | None = None, kernels: pd.DataFrame | None = None) -> Audit:
        """This log as a new Audit that also knows its warm-up, thread count and compiled step:
        how a step's recording (:mod:`auditor._session`) is finished by the one who ran the step."""
        return Audit(self._events, self._tensors, complete=self._complete, error=self._error, hidden=self._hidden,
                     warmup=warmup, compiled=compiled, threads=threads, kernels=kernels, step_time=self._step_time)

    # -- persistence -----------------------------------------------------------------------
    def to_csv(self, path_or_buf=None):
        """Write the audit as one CSV file (docs, "The event log"); with no path, return the
        text. ``complete`` and ``error`` are kept; a path is written atomically. A compiled
        audit's compiled step goes to a file of its own (``audit.compiled.to_csv``)."""
        return csvfile.to_csv(self.events, self.tensors, self.complete, path_or_buf, error=self.error,
                              hidden=self.hidden)

    @classmethod
    def read_csv(cls, path_or_buf, compiled=None) -> Audit:
        """Read a CSV written by :meth:`to_csv` (a path, a buffer, or the text itself), exactly.
        A cut, edited or foreign file raises ``ValueError`` naming the line and column.
        ``compiled``: the file ``audit.compiled.to_csv`` wrote, for a compiled audit."""
        read = csvfile.read_csv(path_or_buf)
        return cls(read.events, read.tensors, complete=read.complete, error=read.error, hidden=read.hidden,
                   compiled=CompiledStep.read_csv(compiled) if compiled is not None else None)

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
            self._analysis = Analysis(self.events, self.tensors, self.hidden, warmup=self.warmup)
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
        return self.analysis().causes.copy()

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

    def report(self, top: int = 10, depth: int | None = None, verification: pd.DataFrame | None = None) -> str:
        """A one-screen text report: totals, the ``top`` causes with their symptoms folded under
        them, and the modules at ``depth`` that cost most (by default 1, or deeper while one
        module, a model's single trunk, holds every hotspot); then, for a compiled audit, the
        compiled step. ``verification``: the verification table of ``Fixes.verify()`` (its ``verification``), whose measured savings are
        shown beside the estimates."""
        depth = trunk_depth(self.ops()) if depth is None else depth
        text = audit_report(self.ops(), self.hotspots(), self.summary(depth), self.causes(), complete=self.complete,
                            error=self.error, top=top, depth=depth, verified=verification, threads=self.threads,
                            kernels=self.kernels, step_time=self._step_time)
        if self.compiled is not None:
            text += "\n\n" + compiled_text(*compiled_report_tables(self.compiled, self.causes()), top=top)
        return text

    def html(self, top: int = 10, depth: int | None = None, verification: pd.DataFrame | None = None) -> str:
        """The report as HTML tables, as a notebook shows the audit (``IPython.display.HTML``
        shows this one): with ``verification``, the measured savings beside the estimates;
        ``depth`` as in :meth:`report`."""
        depth = trunk_depth(self.ops()) if depth is None else depth
        html = audit_html(self.ops(), self.hotspots(), self.summary(depth), self.causes(), complete=self.complete,
                          error=self.error, top=top, depth=depth, verified=verification, threads=self.threads,
                          kernels=self.kernels, step_time=self._step_time)
        if self.compiled is not None:
            html += compiled_html(*compiled_report_tables(self.compiled, self.causes()), top=top)
        return html

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
        compiled = f", compiled: {len(self.compiled.conversions())} conversions" if self.compiled is not None else ""
        return f"<Audit {len(self.events)} ops, {len(self.tensors)} tensors, {state}{compiled}>"

    def _repr_html_(self) -> str:
        return self.html()


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
    conversion of the compiled step that no eager cause explains (``only compiled``). A compiled
    audit carries its own eager causes: ``compare_compiled(a, a)``."""
    if compiled.compiled is None:
        raise ValueError("this audit was not compiled: use auditor.audit(model, x, compile=True)")
    return compiled.compiled.compare(eager.causes())
