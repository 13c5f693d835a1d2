"""A cause's fix as a generator proposes it (:class:`Proposal`, frozen), the candidate rewrites
that verification proves or drops (:class:`Candidate`), and what every generator reads about
one cause (:class:`CauseView`)."""

from __future__ import annotations

import linecache
from dataclasses import dataclass

import numpy as np

from .._analysis._activations import parse_tuple
from .._analysis._causes import CauseTracer
from .._analysis._flow import FlowView
from .._recording._cells import recorded
from ._changes import Change, EditSource, KeepContiguous


@dataclass(frozen=True)
class Candidate:
    """One rewrite of a statement that is exact only where the model's shapes make it so:
    :meth:`Fixes.verify` proves it on the model, or drops it."""

    label: str  #: what it does, in a few words
    change: EditSource  #: the statements it rewrites
    line: str  #: the statement as it is
    suggestion: str  #: the statement rewritten


@dataclass(frozen=True)
class Proposal:
    """One cause's fix, as a generator proposes it: the kind of change that removes the cause,
    the text the user reads, and the change that makes it (None: by hand, saying why)."""

    kind: type[Change]  #: the kind of change (an edit the user makes by hand: :class:`EditSource`)
    detail: str  #: why, in words
    suggestion: str = ""  #: what to write or do
    line: str = ""  #: the statement as it is (for an edit)
    change: Change | None = None  #: what makes it (None: by hand)
    reason: str = ""  #: why it cannot be made automatically ("" when it can)
    #: the exception type that refused the edit, for a generator that then tries another form
    refused: type[Exception] | None = None
    #: rewrites exact only for some shapes, in the order verify tries them; the first it proves
    #: becomes the fix (a region fix stays the fix where none is proved)
    candidates: tuple[Candidate, ...] = ()
    #: the detail once a candidate is proved, where it differs from :attr:`detail`
    proved_detail: str = ""

    @property
    def action(self) -> str:
        return self.kind.action

    @property
    def automatic(self) -> bool:
        return self.change is not None and not self.reason

    @property
    def region(self) -> tuple[str, ...]:
        """The convolutions a region fix runs contiguous."""
        return self.change.region if isinstance(self.change, KeepContiguous) else ()

    @property
    def added_bytes(self) -> int:
        """The conversions a region fix moves to its edges, per phase."""
        return self.change.added_bytes if isinstance(self.change, KeepContiguous) else 0


def module_expr(name: str, root: str = "model") -> str:
    """``layer1.0.conv2`` -> ``model.layer1[0].conv2``: how to write a submodule in code."""
    if name in ("", "<root>"):
        return root
    out = root
    for part in name.split("."):
        out += f"[{part}]" if part.isdigit() else (f".{part}" if part.isidentifier() else f".get_submodule({part!r})")
    return out


class CauseView:
    """What every generator reads about one cause: its row of ``Audit.causes()``, its first
    event, the forward op it stands for, and the format of the images around it."""

    def __init__(self, view: FlowView, tracer: CauseTracer, row, threads: int | None = None):
        ops = view.ops
        self.view, self.tracer, self.row = view, tracer, row
        #: the intra-op threads the audit's step ran at (None: the process's count), which
        #: picks some kernels, and so whether an op keeps the format
        self.threads = threads
        self.e = int(row.first_seq)
        self.op, self.module, self.source = row.op, row.module, row.source
        self.module_type = row.module_type
        self.pattern = row.pattern
        self.rank = rank_of(view, self.e)
        self.cl_name = "channels_last_3d" if self.rank == 5 else "channels_last"
        e = self.e
        self.what = f"{self.op} ({view.kind[e]} {ops.at[e, 'from_format']} -> {ops.at[e, 'to_format']})"
        origin = int(tracer.forward_seq[e]) if view.phase[e] == "backward" else -1
        #: the forward op a backward cause is the backward of (the cause's own op in forward)
        self.forward = origin if origin >= 0 else e
        self.path, self.lineno = where(self.source)
        #: every event of the cause at its line (a line run in sixteen blocks is one cause)
        cause_of = ops["cause"].to_numpy() if "cause" in ops else np.zeros(len(ops), dtype=np.int64)
        self.members = [int(m) for m in np.flatnonzero((cause_of == row.cause) & (view.op == row.op)
                                                        & (view.phase == view.phase[e]) & (view.source == view.source[e]))]
        if e not in self.members:
            self.members.insert(0, e)

    def member_modules(self, forward: bool = False) -> list[str]:
        """The modules the cause's events ran in (with ``forward``, those of the forward ops they
        are the backward of), in order."""
        ops, fseq = self.view.ops, self.tracer.forward_seq
        events = [int(fseq[m]) if forward and fseq[m] >= 0 else m for m in self.members]
        return list(dict.fromkeys(str(ops.at[x, "module"]) for x in events))

    def instances(self, module_type: str) -> list[str]:
        """Every module of ``module_type`` whose recorded ops show this cause: its forward op
        at the same line, and, for a backward cause, that op's backward the same op doing the
        same thing (losing, converting) as the cause's. A line inside a module class runs in
        every instance of it; swapping one of N identical modules fixes one of N."""
        view, fseq = self.view, self.tracer.forward_seq
        f, e = self.forward, self.e
        types = self.view.ops["module_type"].astype(str).to_numpy()
        same_line = (types == module_type) & (view.phase == "forward") & (view.op == view.op[f]) \
            & (view.source == view.source[f])
        if e == f:
            found = np.flatnonzero(same_line & (view.kind == view.kind[e]))
        else:
            backward = np.flatnonzero((view.phase == view.phase[e]) & (view.op == view.op[e])
                                      & (view.kind == view.kind[e]) & (fseq >= 0))
            found = [int(fseq[b]) for b in backward if same_line[int(fseq[b])]]
        names = list(dict.fromkeys(str(view.module[x]) for x in found))
        own = self.member_modules(forward=True)
        return own + [m for m in names if m not in own]

    def source_line(self) -> str:
        """The cause's line as the file has it ("" without one)."""
        return linecache.getline(self.path, self.lineno).rstrip("\n") if self.path else ""

    def shapes(self, e: int) -> tuple[list[tuple[int, ...]], list[tuple[int, ...]]]:
        """(input shapes, output shapes) of event ``e``."""
        t = self.tracer
        rows = t.rows(e)
        ins = [parse_tuple(t.shape[r]) for r in rows if not t.is_out[r]]
        outs = [parse_tuple(t.shape[r]) for r in rows if t.is_out[r]]
        return ins, outs


def where(source: str) -> tuple[str | None, int]:
    """(file, line) of a recorded ``path:line`` (a notebook cell's name resolved to the file
    IPython compiled it under); (None, 0) without one."""
    if not source:
        return None, 0
    path, _, line = recorded(source).rpartition(":")
    return (path, int(line)) if path and line.isdigit() else (None, 0)


def rank_of(view: FlowView, e: int) -> int:
    """The rank of the convolutions' activations around ``e`` (4 or 5): a channel shuffle
    copies a 5-D view of 4-D activations, so ``e``'s own tensors can mislead."""
    nd = view.tensors["ndim"].to_numpy()
    near = sorted(view.upstream_convs(e) | view.downstream_convs(e)) if not view.is_conv[e] else [e]
    for x in near + [e]:
        for r in view.act_rows.get(x, []):
            if nd[r] in (4, 5):
                return int(nd[r])
    return 4
