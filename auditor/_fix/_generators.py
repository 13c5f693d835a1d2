"""The fix generators: for each cause pattern, the change that removes the cause, made from the
audit's data flow and the cause line's syntax tree, each registered here for the patterns of
:mod:`auditor._analysis._patterns` it fixes (:func:`register_fix`, :func:`fix_generators`).

A generator returns a :class:`Proposal`: what to do (edit the source, swap a module, convert a
weight, keep a region contiguous), the text the user reads, and, where the change can be made
automatically, what makes it: a statement rewrite (:mod:`._rewrite`), a module to swap, a
region. Where the line does not have the shape a rewrite needs, the proposal stays "by hand"
and says why: a wrong edit is worse than none. The rewrites need libcst, imported when a fix is
first proposed, not with the package.
"""

from __future__ import annotations

import ast
import functools
import linecache
import textwrap
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
import torch

from .._analysis import _patterns as patterns
from .._analysis._activations import parse_tuple
from .._analysis._causes import CauseTracer
from .._analysis._flow import FlowView
from .._display._text import short_source
from .._recording._cells import recorded
from .._recording._formats import AMBIGUOUS
from .._recording._rules import VIEW
from ._keep_format import BROADCAST_SWAPS, CONV_SWAPS, KEEP_FORMAT, SWAPS
from ._patch import live_functions

if TYPE_CHECKING:  # the rewrites need libcst: imported when a fix is first proposed
    from . import _chain
    from . import _rewrite as rw

EDIT, SWAP, WEIGHT, REGION = "edit source", "swap module", "convert weight", "keep region contiguous"
#: a cause no generator has a fix for
BY_HAND = "by hand"


#: pattern name -> the fix generators registered for it, most specific first; filled below, in
#: this module, so whoever can ask for a generator has them all
_GENERATORS: dict[str, list[Callable]] = {}


def register_fix(*names: str, first: bool = False) -> Callable[[Callable], Callable]:
    """Decorator: register a fix generator for the patterns ``names`` (each must be registered),
    after those registered before it (with ``first``, before them: a generator that applies to
    few causes, ahead of one that answers every cause). A generator takes what the fix layer
    knows of one cause and returns a fix, or None when it does not apply, so the next one is tried."""
    for name in names:
        patterns.pattern(name)

    def register(generator: Callable) -> Callable:
        for name in names:
            found = _GENERATORS.setdefault(name, [])
            found.insert(0, generator) if first else found.append(generator)
        return generator
    return register


def fix_generators(name: str) -> list[Callable]:
    """The generators registered for pattern ``name``, in order."""
    patterns.pattern(name)
    return list(_GENERATORS.get(name, ()))


@dataclass
class Proposal:
    """One cause's fix, as a generator proposes it."""

    action: str  #: :data:`EDIT`, :data:`SWAP`, :data:`WEIGHT` or :data:`REGION`
    detail: str  #: why, in words
    suggestion: str = ""  #: what to write or do
    line: str = ""  #: the statement as it is (for an edit)
    region: tuple[str, ...] = ()  #: the convolutions a region fix runs contiguous
    added_bytes: int = 0  #: conversions a region fix moves to its edges, per phase
    #: what makes an edit: the statement, the rewrite and its facts (None: by hand)
    edit: tuple[rw.Statement, Callable, rw.Facts] | None = None
    reason: str = ""  #: why the fix cannot be made automatically ("" when it can)
    extra: dict = field(default_factory=dict)
    #: edits of other statements made with :attr:`edit` (a call site that now asks for a format)
    more_edits: tuple = ()

    @property
    def automatic(self) -> bool:
        return not self.reason

    @property
    def edits(self) -> list[tuple]:
        """Every statement edit the fix makes: :attr:`edit`, then :attr:`more_edits`."""
        return [self.edit, *self.more_edits] if self.edit is not None else []


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
        self.rank = _rank_of(view, self.e)
        self.cl_name = "channels_last_3d" if self.rank == 5 else "channels_last"
        e = self.e
        self.what = f"{self.op} ({view.kind[e]} {ops.at[e, 'from_format']} -> {ops.at[e, 'to_format']})"
        origin = int(tracer.forward_seq[e]) if view.phase[e] == "backward" else -1
        #: the forward op a backward cause is the backward of (the cause's own op in forward)
        self.forward = origin if origin >= 0 else e
        self.path, self.lineno = _where(self.source)
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

    def proposal(self, action: str, detail: str, **more) -> Proposal:
        return Proposal(action, detail, **more)

    def shapes(self, e: int) -> tuple[list[tuple[int, ...]], list[tuple[int, ...]]]:
        """(input shapes, output shapes) of event ``e``."""
        t = self.tracer
        rows = t.rows(e)
        ins = [parse_tuple(t.shape[r]) for r in rows if not t.is_out[r]]
        outs = [parse_tuple(t.shape[r]) for r in rows if t.is_out[r]]
        return ins, outs


def _where(source: str) -> tuple[str | None, int]:
    """(file, line) of a recorded ``path:line`` (a notebook cell's name resolved to the file
    IPython compiled it under); (None, 0) without one."""
    if not source:
        return None, 0
    path, _, line = recorded(source).rpartition(":")
    return (path, int(line)) if path and line.isdigit() else (None, 0)


def propose(view: FlowView, tracer: CauseTracer, row, threads: int | None = None) -> Proposal | None:
    """The fix for one cause: the first of its pattern's registered generators that has one, or
    None when no fix is known to help (``threads``: the audit's, see :class:`CauseView`)."""
    cause = CauseView(view, tracer, row, threads)
    for generate in fix_generators(row.pattern):
        found = generate(cause)
        if found is not None:
            note = tracer.size_notes.get(cause.e, "")  # a cause the audited size may have made
            if note and found.reason and note not in found.reason:
                found.reason = f"{found.reason} ({note})"
            elif note and not found.reason:
                found.detail = f"{found.detail} ({note})"
            return found
    return None


# -- the statement, and what a rewrite needs to know about where it runs --------------------------


def _functions(path: str, line: int) -> list[types.FunctionType]:
    return live_functions(path, [line])


def _facts(c: CauseView, fns: list[types.FunctionType], dims: tuple[int, ...] = ()) -> rw.Facts:
    """The facts a rewrite of ``c``'s line needs: the format, the name torch goes by where the
    line runs, the names in use there."""
    from . import _rewrite as rw

    torch_name, taken = None, set()
    for fn in fns:
        code = fn.__code__
        # its locals and the module's globals (a new local of a global's name would hide it)
        taken |= set(code.co_varnames) | set(code.co_cellvars) | set(code.co_freevars)
        taken |= {k for k in fn.__globals__ if not k.startswith("__")}
        if torch_name is None:
            torch_name = next((k for k, v in fn.__globals__.items() if v is torch), None)
    return rw.Facts(cl=c.cl_name, rank=c.rank, torch=torch_name, dims=dims, taken=frozenset(taken))


def _statement_edit(c: CauseView, rewrite: str | Callable, dims: tuple[int, ...] = (), span: int = 1,
                    **shown) -> Proposal:
    """An edit of ``c``'s statement by the rewrite named ``rewrite`` (a function of
    :mod:`._rewrite`): tried now, on the statement as it is, so
    that a statement without the shape the rewrite needs is reported by hand, with the reason.
    With ``span`` above 1 the rewrite may also need up to that many statements from the line
    on (a value made on the line and used on the next), tried from the shortest."""
    from libcst import ParserSyntaxError

    from . import _rewrite as rw

    rewrite = getattr(rw, rewrite) if isinstance(rewrite, str) else rewrite
    detail = shown.pop("detail", c.row.fix)
    if c.path is None:
        return c.proposal(EDIT, f"{detail} (audit with record_source=True for the line)",
                          reason="the audit has no source line (audit with record_source=True)", **shown)
    line = linecache.getline(c.path, c.lineno).rstrip("\n")
    reason = ""
    for count in range(1, span + 1):
        try:
            statement = rw.statements_from(c.path, c.lineno, count)
            fns = _functions(c.path, c.lineno)
            if not fns:
                raise rw.Refused("no function of the running program holds this line (run at the top level of a script)")
            facts = _facts(c, fns, dims)
            new = rw.rewrite(statement, [(rewrite, facts)])
        except rw.Refused as exc:
            reason = reason or str(exc)
            continue
        except ParserSyntaxError as exc:
            reason = reason or f"the statement does not parse ({exc.message})"
            continue
        return c.proposal(EDIT, detail, line=statement.text.rstrip("\n"), suggestion=new.rstrip("\n"),
                          edit=(statement, rewrite, facts), **shown)
    return c.proposal(EDIT, detail, line=line, reason=reason, **shown)


# -- the generators --------------------------------------------------------------------------------


@register_fix(patterns.NC11_BROADCAST.name)
def _restride_fix(c: CauseView) -> Proposal | None:
    """An op (in forward; not an interpolation or a mean, which :func:`_broadcast_fix` rewrites)
    whose input is a map in both formats at once and whose output comes out contiguous, where
    a convolution weight is in reach of the line: the map is passed re-strided, as a view, into
    that weight's format (:mod:`._restride`), so the op's output follows the convolutions."""
    import copy

    from ._restride import Restride

    op = str(c.tracer.op[c.forward])
    if c.forward != c.e or "upsample" in op or "interpolate" in op or op.startswith("aten.mean") or c.path is None:
        return None
    ins, _ = c.shapes(c.e)
    if not ins or len(ins[0]) != 4:
        return None
    fns = _functions(c.path, c.lineno)
    weight = _weight_in_reach(c, fns)
    name, types_ = str(c.module), c.view.ops["module_type"].astype(str).to_numpy()
    # the line runs in a module above the op's (a pool or a pad it calls): the nearest one whose
    # type holds the line's method, as recorded, or else as the method's own class, where its
    # convolution is reached by attribute (a Sequential's items are no attributes of that class)
    owner = fns[0].__qualname__.split(".<locals>")[-1].rpartition(".")[0].rpartition(".")[2] if fns else ""
    while weight is None and "." in name:
        name = name.rsplit(".", 1)[0]
        hits = np.flatnonzero(c.view.module == name)
        above = copy.copy(c)
        above.module, above.module_type = name, types_[int(hits[0])] if len(hits) else owner
        found = _weight_in_reach(above, fns)
        # a module of the line's class found by its method alone: each instance may hold its
        # convolution elsewhere (a Conv2d in one, a Sequential's item in another), so the
        # convolution is found at run time, in the module's own (``self``)
        weight = found if found is None or len(hits) else "self"
    if weight is None:
        return None
    found = _statement_edit(c, Restride(weight, op.split(".")[1].lstrip("_") if op.startswith("aten.") else ""), detail=(
        f"{c.what}: its input {ins[0]} is both formats at once, so PyTorch follows the strides it was made with and "
        f"writes the output contiguous; passed re-strided into the format of {weight} (a view of the same memory, "
        "the same values), the op follows the convolutions"))
    return found if found.automatic else None  # no edit: what the op is, by hand (_broadcast_fix)


@register_fix(patterns.JOINS.name, patterns.LOSES.name)
def _product_backward_fix(c: CauseView) -> Proposal | None:
    """A backward op that reads a gradient a product's backward wrote row-major for an input
    that was a column-major view (a (B, C, H·W) view of a channels_last map, as in a correlation
    ``fmap1.mT @ fmap2``): the product, on its own line, becomes ``keep_format.matmul``, whose
    backward writes each gradient in its input's order (same products). Found through the
    views between the two; offered only where the product's recorded inputs include such a view."""
    import copy

    from ._replace import PRODUCTS, ReplaceProduct

    view, fseq = c.view, c.tracer.forward_seq
    if view.phase[c.e] != "backward":
        return None
    todo, seen, product = [p for p in view.graph.input_producers(c.e) if p >= 0], set(), -1
    while todo and len(seen) < 64:
        p = todo.pop()
        if p in seen:
            continue
        seen.add(p)
        f = int(fseq[p])
        if view.op[p] in PRODUCTS and f >= 0 and view.op[f] in PRODUCTS:
            product = f
            break
        if view.kind[p] == VIEW or view.op[p] in _VIEWS:
            todo += [q for q in view.graph.input_producers(p) if q >= 0]
    if product < 0:
        return None
    # a line with a forward cause of its own gets its own fix there (the joins' candidates, a
    # product computed transposed): two rewrites of one statement would clash
    hot = np.flatnonzero(view.ops["hotspot"].to_numpy()) if "hotspot" in view.ops else []
    if any(view.phase[e] == "forward" and view.source[e] == view.source[product]
           for e in {c.tracer.cause(int(h))[0] for h in hot}):
        return None
    t = view.tensors
    ins = t[(t["seq"] == product) & (t["role"] == "input")]
    column_major = False
    for shape, strides in zip(ins["shape"].astype(str), ins["strides"].astype(str)):
        sh, st = parse_tuple(shape), parse_tuple(strides)
        column_major |= len(st) >= 2 and st[-2] == 1 and st[-1] != 1 and sh[-2] > 1
    path, line = _where(str(view.source[product]))
    if not column_major or path is None:
        return None
    at = copy.copy(c)
    at.path, at.lineno = path, line
    return _statement_edit(at, ReplaceProduct(), detail=(
        f"{c.what}: it reads the gradient the product at {short_source(str(view.source[product]))} wrote row-major "
        "for an input that is a column-major view of a map (its channels_last NHWC order); "
        "auditor.keep_format.matmul computes the same products and writes each gradient in its input's order"))


@register_fix(patterns.NO_CL_KERNEL.name, patterns.JOINS.name, patterns.LOSES.name)
def _replacement_fix(c: CauseView) -> Proposal | None:
    """An op with a format-keeping replacement (:mod:`._replace`), where the running torch says
    the op loses the format in the cause's phase on the cause's device and dtype: its call on
    the cause's line becomes the replacement's. Tried first: a replacement keeps channels_last
    around the op, where a region kept contiguous gives it up (the last resort)."""
    from ._replace import ReplaceCall, loses_here, replacement_of

    found = replacement_of(str(c.tracer.op[c.forward]))
    if found is None:
        return None
    t = c.view.tensors
    first = t[(t["seq"] == c.forward) & (t["role"] == "input")]
    if not len(first):
        return None
    device, dtype = str(first["device"].iloc[0]), getattr(torch, str(first["dtype"].iloc[0]), None)
    if not isinstance(dtype, torch.dtype):
        return None
    forward, backward = loses_here(found, device, dtype)
    lost = backward if c.view.phase[c.e] == "backward" else forward or backward
    if not lost:
        return None
    where = " and ".join(w for w, on in (("output", forward), ("input's gradient", backward)) if on)
    change = ReplaceCall(found)
    return _statement_edit(c, change, detail=(
        f"{c.what}: {found.op} writes its {where} contiguous for a {c.cl_name} map on this torch ({device}, "
        f"{str(dtype).removeprefix('torch.')}; asked with one small map); {found.describe()} computes the same "
        "values on the NHWC view and keeps the format"))


@register_fix(patterns.EXPLICIT_COPY.name, patterns.JOINS.name, patterns.LOSES.name)
def _inside_a_torch_module_fix(c: CauseView) -> Proposal | None:
    """A copy or join made inside a torch module that has a format-keeping replacement (an
    InstanceNorm2d runs batch norm on a (1, N·C, H, W) view and copies it back): the module's
    own computation loses the format, whatever line calls it, so swap the module."""
    typ = _torch_module_type(c.module_type, SWAPS)
    if typ is None or (typ is torch.nn.LayerNorm and _normalized_rank(c) not in (None, c.rank - 1)):
        return None  # a LayerNorm over fewer dimensions than (C, H, W) has no format-keeping version
    modules = c.instances(typ.__name__)
    return _swap(c, modules, typ, SWAPS,
                 f"{c.what} runs inside {modules[0]}{_and_more(modules)}, {_article(typ.__name__)} {typ.__name__}, "
                 f"whose own computation writes it off the {c.cl_name} format; the replacement computes the same "
                 "values and keeps the format")


def _normalized_rank(c: CauseView) -> int | None:
    """How many trailing dimensions the layer norm the cause stands for normalizes, as its
    recorded weight shows (None where it ran without one, or is no layer norm)."""
    if not c.tracer.op[c.forward].startswith("aten.native_layer_norm"):
        return None
    ins, _ = c.shapes(c.forward)
    return len(ins[1]) if len(ins) >= 2 else None


@register_fix(patterns.EXPLICIT_COPY.name)
def _explicit_copy_fix(c: CauseView) -> Proposal:
    frm = str(c.view.ops.at[c.e, "from_format"])
    detail = (f"{c.what} copies the activation into contiguous order between two convolutions; keep it "
              f"{c.cl_name}" + (f" (or remove the call: its input is already dense {c.cl_name})" if frm == c.cl_name
                                else ""))
    # an input already in the format: ask for the format the input is in, which keeps a contiguous
    # run of the same code as it was; otherwise only a copy into the format helps
    return _statement_edit(c, "follow_format_in_copy" if frm == c.cl_name else "keep_format_in_copy", detail=detail)


def _torch_module_type(name: str, table) -> type | None:
    """The torch module type of ``table`` named ``name`` (a recorded ``module_type``)."""
    return next((t for t in table if t.__name__ == name and t.__module__.startswith("torch.nn")), None)


def _swap(c: CauseView, modules: list[str], typ: type, table, why: str) -> Proposal:
    lines = [f"{module_expr(m)} = {KEEP_FORMAT}({module_expr(m)})" for m in modules]
    more = f"  # and {len(lines) - 1} more like it" if len(lines) > 1 else ""
    return c.proposal(SWAP, why, suggestion=lines[0] + more, extra={"modules": modules, "table": table})


def _article(word: str) -> str:
    return "an" if word[:1].lower() in "aeiou" else "a"


def _and_more(modules: list[str]) -> str:
    return f" and {len(modules) - 1} more like it" if len(modules) > 1 else ""


@register_fix(patterns.MEAN_BACKWARD.name)
def _mean_fix(c: CauseView) -> Proposal:
    """A mean over H and W: in a torch pooling module (``nn.AdaptiveAvgPool2d(1)``), swap the
    module; written on the line, rewrite it as a sum divided by H·W."""
    typ = _torch_module_type(str(c.view.ops.at[c.forward, "module_type"]), SWAPS)
    if typ is not None:
        modules = c.instances(typ.__name__)
        return _swap(c, modules, typ, SWAPS,
                     f"{c.row.fix} (it runs inside {modules[0]}{_and_more(modules)}, {_article(typ.__name__)} "
                     f"{typ.__name__}); the replacement computes the same "
                     "values and its backward keeps the format")
    return _statement_edit(c, "pool_by_sum", detail=f"{c.row.fix.split(':')[0]}: a sum divided by H·W computes the "
                                                     "mean's values, and its backward broadcasts a view")


@register_fix(patterns.STACK_REDUCE.name)
def _stack_fix(c: CauseView) -> Proposal:
    ins, outs = c.shapes(c.forward)
    dims = ()
    if ins and outs and len(ins[0]) == len(outs[0]) + 1:
        a, b = ins[0], outs[0]
        dims = tuple(d for d in range(len(a)) if a[:d] + a[d + 1:] == b)  # more than one where sizes repeat
    return _statement_edit(c, "add_the_branches", dims=dims)


@register_fix(patterns.NC11_BROADCAST.name)
def _broadcast_fix(c: CauseView) -> Proposal:
    """An op whose input is both formats at once (N×C×1×1, or N×1×H×W) and that writes its
    output contiguous: an interpolation of a map is a broadcast (on the line, rewritten;
    an ``nn.Upsample``, swapped); a mean over the channels, whose backward writes the gradient
    full size, a sum divided by their number; anything else, by hand, with what it is."""
    op = str(c.tracer.op[c.forward])
    ins, outs = c.shapes(c.forward)
    if c.forward != c.e and op.startswith("aten.mean") and ins and outs and len(ins[0]) == len(outs[0]):
        dims = tuple(d for d in range(len(ins[0])) if ins[0][d] != outs[0][d])
        return _statement_edit(c, "pool_by_sum", dims=dims, detail=(
            f"PyTorch's backward of a mean over dimensions {dims} writes its gradient full size in contiguous order "
            f"({c.what}: the gradient it expands, {outs[0]}, is both formats at once); a sum divided by their size "
            "computes the mean's values, and its backward broadcasts a view"))
    if "upsample" in op or "interpolate" in op:
        typ = _torch_module_type(str(c.view.ops.at[c.forward, "module_type"]), BROADCAST_SWAPS)
        if typ is not None and ins and all(s == 1 for s in ins[0][2:]):
            modules = c.instances(typ.__name__)
            return _swap(c, modules, typ, BROADCAST_SWAPS, (
                f"{c.what}: {modules[0]}{_and_more(modules)} ({_article(typ.__name__)} {typ.__name__}) interpolates an "
                f"N×C×1×1 map, {ins[0]}, and writes it contiguous; the replacement broadcasts the one pixel per "
                "channel as a view, the same values, which what reads it reads in its own format"))
        return _statement_edit(c, "broadcast_the_map")
    shape = f"{ins[0]}: " if ins else ""
    return c.proposal(EDIT, f"{c.what}: its input is both formats at once, and PyTorch writes the op's output "
                            "contiguous",
                      line=linecache.getline(c.path, c.lineno).rstrip("\n") if c.path else "",
                      reason=_AMBIGUOUS_REASON.format(op=("the backward of " if c.forward != c.e else "")
                                                      + op.removeprefix("aten."), shape=shape, cl=c.cl_name))


#: why an op of an input that is both formats at once, other than an interpolation, is by hand
_AMBIGUOUS_REASON = (
    "{op} takes an input whose memory order is both formats at once ({shape}its channels, or its height and width, "
    "are 1), so PyTorch writes its output contiguous: it is no interpolation of a map, to broadcast instead; "
    "write the output {cl} by hand where the model always runs {cl} (code that also runs contiguous would "
    "then convert)")


@register_fix(patterns.CHANNEL_SLICE.name)
def _slice_fix(c: CauseView) -> Proposal:
    if c.tracer.op[c.forward].startswith(_SPLITS):
        return c.proposal(EDIT, c.row.fix, line=linecache.getline(c.path, c.lineno).rstrip("\n") if c.path else "",
                          reason="the channels are split already: the contiguous zeros come from PyTorch's own backward "
                                 "of a split or chunk, for the part that is not used, and no rewrite of the line keeps "
                                 "the format")
    found = _statement_edit(c, "split_the_channels")
    if found.automatic or c.path is None or not found.reason.startswith(_NOT_A_PARTITION):
        return found  # the statement has no slices of one tensor to take together with others
    return _statements_edit(c, "split_the_channels", found, span=_SLICE_SPAN)


#: the most consecutive statements whose slices are taken together as one split
_SLICE_SPAN = 4
#: how the split rewrite refuses slices of one tensor that, on their statement alone, do not cut all its channels
_NOT_A_PARTITION = "the slices do not cut the channels into consecutive parts"


def _statements_edit(c: CauseView, rewrite: str, alone: Proposal, span: int) -> Proposal:
    """The edit of the fewest consecutive statements of ``c``'s block, up to ``span``, that hold
    ``c``'s statement and that ``rewrite`` takes as one (slices of one tensor on several
    statements that together cut its channels); ``alone`` (the statement's own edit, refused)
    where none does."""
    from libcst import ParserSyntaxError

    from . import _rewrite as rw

    try:
        mine = rw.statement_at(c.path, c.lineno)
        starts = rw.statement_starts(c.path)
        fns = _functions(c.path, c.lineno)
    except rw.Refused:
        return alone
    if not fns or (mine.first not in starts):
        return alone
    at = starts.index(mine.first)
    fn = getattr(rw, rewrite)
    facts = _facts(c, fns)
    for count in range(2, span + 1):
        for first in range(max(at - count + 1, 0), at + 1):
            try:
                statement = rw.statements_from(c.path, starts[first], count)
                new = rw.rewrite(statement, [(fn, facts)])
            except (rw.Refused, ParserSyntaxError, ValueError):
                continue
            return c.proposal(EDIT, alone.detail, line=statement.text.rstrip("\n"), suggestion=new.rstrip("\n"),
                              edit=(statement, fn, facts))
    return alone


#: ops whose backward writes zeros for the parts that are not used (PyTorch's own)
_SPLITS = ("aten.split", "aten.chunk", "aten.unbind", "aten.split_with_sizes", "aten.tensor_split")


@register_fix(patterns.INPLACE_VIEW.name)
def _inplace_fix(c: CauseView) -> Proposal:
    reason = _base_read_after(c)
    found = _statement_edit(c, "out_of_place")
    if reason and found.automatic:
        found.reason, found.edit = reason, None
    return found


def _base_read_after(c: CauseView) -> str:
    """Why writing ``c``'s in-place op out of place would change the program (its view's base,
    through another alias, is read after it), or ""."""
    t, e = c.tracer, c.forward
    ins = t.input_rows(e)
    if not ins:
        return ""
    tid = c.view.tensors["tid"].to_numpy()
    written = int(tid[ins[0]])
    root = c.view.graph.root
    base = int(root[written]) if written < len(root) else written
    seq = t.seq
    later = np.flatnonzero((seq > e) & ~t.is_out)
    for r in later:
        other = int(tid[r])
        if other != written and other < len(root) and int(root[other]) == base and not _descends(c, other, written):
            return (f"the tensor written in place is a view whose base is read afterwards ({t.op[int(seq[r])]}): "
                    "writing it out of place would change what that reads")
    return ""


def _descends(c: CauseView, tid: int, ancestor: int) -> bool:
    """Whether tensor ``tid`` is ``ancestor`` or a view made from it (after the write)."""
    t = c.view.tensors
    seqs, roles, tids, views = t["seq"].to_numpy(), t["role"].to_numpy(), t["tid"].to_numpy(), t["is_view"].to_numpy()
    frontier, seen = {ancestor}, {ancestor}
    while frontier:
        made = set()
        for e in np.unique(seqs[np.isin(tids, list(frontier)) & (roles == "input")]):
            outs = (seqs == e) & (roles == "output") & views
            made |= set(tids[outs].tolist())
        frontier = made - seen
        seen |= made
        if tid in seen:
            return True
    return tid in seen


@register_fix(patterns.WEIGHT_REBUILT.name)
def _weight_rebuilt_fix(c: CauseView) -> Proposal:
    return _statement_edit(c, "flatten_in_memory_order", span=3)


@register_fix(patterns.CHANNEL_SHUFFLE.name)
def _channel_shuffle_fix(c: CauseView) -> Proposal:
    """A channel shuffle written view -> transpose -> .contiguous() -> view, in one statement or
    over a few consecutive ones around the cause's line: exactly those statements become one call
    of torch's format-keeping channel_shuffle."""
    from libcst import ParserSyntaxError

    from . import _rewrite as rw

    detail = (f"this is a channel shuffle written as view -> transpose -> .contiguous() -> view, which writes "
              f"contiguous order ({c.what}); torch.nn.functional.channel_shuffle (nn.ChannelShuffle) computes the "
              f"same values and keeps {c.cl_name}")
    suggestion = "x = torch.nn.functional.channel_shuffle(x, groups)"
    if c.path is None:
        return c.proposal(EDIT, detail, reason="the audit has no source line (audit with record_source=True)")
    line = linecache.getline(c.path, c.lineno).rstrip("\n")
    reason = ""
    try:
        fns = _functions(c.path, c.lineno)
        if not fns:
            raise rw.Refused("no function of the running program holds this line (run at the top level of a script)")
        facts = _facts(c, fns)
        for statement in _shuffle_spans(c.path, c.lineno):
            try:
                new = rw.rewrite(statement, [(rw.shuffle_by_torch, facts)])
            except (rw.Refused, ParserSyntaxError) as exc:
                reason = reason or str(getattr(exc, "message", exc))
                continue
            try:
                _temporaries_unread(statement)
            except rw.Refused as exc:  # a shuffle, whose rewrite would lose a name: the reason to give
                reason = str(exc)
                continue
            try:  # a `return y` of the shuffled name right after it joins: `return channel_shuffle(...)`
                count = sum(statement.first <= k <= statement.last for k in rw.statement_starts(c.path))
                longer = rw.statements_from(c.path, statement.first, count + 1)
                if longer.last > statement.last:
                    new, statement = rw.rewrite(longer, [(rw.shuffle_by_torch, facts)]), longer
            except (rw.Refused, ParserSyntaxError):
                pass
            return c.proposal(EDIT, detail, line=statement.text.rstrip("\n"), suggestion=new.rstrip("\n"),
                              edit=(statement, rw.shuffle_by_torch, facts))
    except rw.Refused as exc:
        reason = str(exc)
    return c.proposal(EDIT, detail, line=line, reason=f"{reason}: replace the shuffle by {suggestion} by hand",
                      suggestion=suggestion)


#: how many statements a channel shuffle written by hand may take (split, swap, copy, merge, return)
_SHUFFLE_STATEMENTS = 5


def _shuffle_spans(path: str, line: int):
    """The runs of consecutive statements of one block that hold ``line``, shortest first, the
    ones that end later first among equals (a trailing ``return`` of the shuffled name joins)."""
    from . import _rewrite as rw

    starts = rw.statement_starts(path)
    at = rw.statement_at(path, line).first
    index = starts.index(at)
    for count in range(1, _SHUFFLE_STATEMENTS + 1):
        for first in range(index, index - count, -1):
            if first < 0:
                continue
            try:
                yield rw.statements_from(path, starts[first], count)
            except rw.Refused:
                continue


def _temporaries_unread(statement: rw.Statement) -> None:
    """Refuses where a name the shuffle's statements bind on the way (not its result) is read
    after them in the function: the rewrite no longer binds it."""
    import libcst as cst

    from . import _rewrite as rw

    indent = statement.text[:len(statement.text) - len(statement.text.lstrip(" \t"))]
    module = cst.parse_module(("if True:\n" if indent else "") + statement.text)
    temporaries = rw.shuffle_temporaries(module)
    if not temporaries:
        return
    lines = linecache.getlines(statement.path)
    tree = ast.parse("".join(lines))
    holders = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Module))
               and (isinstance(n, ast.Module) or n.lineno <= statement.first <= (n.end_lineno or n.lineno))]
    scope = max(holders, key=lambda n: getattr(n, "lineno", 0))
    read = {n.id for n in ast.walk(scope) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)
            and n.lineno > statement.last}
    if temporaries & read:
        raise rw.Refused(f"{', '.join(sorted(temporaries & read))}, bound on the way by the shuffle, is read after it")


@register_fix(patterns.NO_CL_KERNEL.name)
def _module_swap_fix(c: CauseView) -> Proposal | None:
    typ = _torch_module_type(c.module_type, SWAPS)
    if typ is None:
        return None
    return _swap(c, c.instances(typ.__name__), typ, SWAPS,
                 f"{c.row.fix} ({c.what}); the replacement computes the same values in the same format")


@register_fix(patterns.NO_CL_KERNEL.name)
def _whole_slice_fix(c: CauseView) -> Proposal | None:
    """A slice that keeps every channel, whose backward (this torch's ``slice_backward``) writes
    its gradient contiguous: skipped when it keeps them all."""
    forward = c.forward
    if not c.tracer.op[forward].startswith("aten.slice") or c.rank < 4:
        return None
    ins, outs = c.shapes(forward)
    if not ins or not outs or ins[0] != outs[0]:
        return None
    return _statement_edit(c, "skip_the_whole_slice", detail=(
        f"{c.what}: the slice keeps every channel, but its backward writes the gradient contiguous; skip it when "
        f"it keeps them all"))


@register_fix(patterns.CONV_NO_KERNEL.name)
def _conv_swap_fix(c: CauseView) -> Proposal | None:
    """A convolution without a channels_last kernel for its shape whose sums another convolution
    that has one computes: a Conv3d that spans time only, (k, 1, 1), as a Conv2d over (T, H·W);
    one that spans space only, (1, kh, kw), as a Conv2d over each frame (or every s-th). The
    swap names the cause's convolutions that span one of them, and says which it leaves; the
    others at its line, fed another format by the first, are tried: those that lose the format
    when fed it are swapped too (:func:`~._keep_format.loses_format`, where the model is at hand)."""
    typ = _torch_module_type(c.module_type, CONV_SWAPS)
    if typ is None:
        return None
    losing, symptoms = _recorded_convs(c)
    swappable = {m: span for m, (span, _, _) in losing.items() if span}
    if not swappable:
        return None
    left = [f"{m} {kernel}" for m, (span, kernel, _) in losing.items() if not span]
    spans = list(dict.fromkeys(swappable.values()))
    sizes = ", ".join(dict.fromkeys(str(losing[m][1]) for m in swappable))
    how = (f"its kernel {sizes} spans {spans[0]}" if len(swappable) == 1 else
           f"their kernels {sizes} span {' or '.join(spans)}") + f", so {' or '.join(SPANS[s] for s in spans)}"
    leaves = f"; it leaves {', '.join(left)}, which span time and space" if left else ""
    latent = tuple((m, shape) for m, (span, _, shape) in symptoms.items() if span)
    tries = (f"; of the {len(latent)} more at its line that were fed another format, it swaps those that lose "
             "the format when fed it") if latent else ""
    proposal = _swap(c, list(swappable), typ, CONV_SWAPS,
                     f"{c.row.fix.rsplit(': ', 1)[0]}: {how} computes the same sums, and has a "
                     f"{c.cl_name.replace('_3d', '')} kernel{leaves}{tries}")
    proposal.extra.update(latent=latent, threads=c.threads)
    return proposal


#: what a Conv3d that spans one of these alone is computed as (:mod:`._keep_format`)
SPANS = {"time only": "a Conv2d over (T, H·W)", "space only": "a Conv2d over each frame"}


def _recorded_convs(c: CauseView) -> tuple[dict, dict]:
    """The 3-D convolutions at the cause's line, by module, each as (what it spans alone, its
    kernel, the input shape it was fed), read from recorded shapes: (the cause's that do what
    its first does (lose the format), those fed another format than channels_last there, which
    cannot show whether they would keep it)."""
    same, other = {}, {}
    fseq, kind, view = c.tracer.forward_seq, c.view.kind, c.view
    f = c.forward
    at_line = np.flatnonzero((view.op == view.op[f]) & (view.phase == "forward") & (view.source == view.source[f]))
    fed_other = [int(e) for e in at_line if str(view.ops.at[int(e), "in_format"]) != c.cl_name]
    for m in [*c.members, *fed_other]:
        e = int(fseq[m]) if fseq[m] >= 0 else m
        w = c.tracer.weight_row(e)
        ins, outs = c.shapes(e)
        if w < 0 or not ins or not outs or len(ins[0]) != 5:
            continue
        kernel, into, out = parse_tuple(c.tracer.shape[w])[2:], ins[0][2:], outs[0][2:]
        # a dimension a convolution leaves alone: kernel 1, and as many outputs as inputs
        # (stride 1, no padding); frames it may also take every s-th of (no more outputs than
        # inputs: no padding), each a Conv2d
        alone = [kernel[d] == 1 and into[d] == out[d] for d in range(3)]
        span = "time only" if alone[1] and alone[2] else "space only" if kernel[0] == 1 and out[0] <= into[0] else ""
        found = same if m in c.members and kind[m] == kind[c.e] else other
        found.setdefault(str(view.ops.at[e, "module"]), (span, kernel, ins[0]))
    return same, {m: v for m, v in other.items() if m not in same}


@register_fix(patterns.WEIGHT_FORMAT.name)
def _conv_weight_fix(c: CauseView) -> Proposal:
    modules = c.member_modules()
    more = f"  # and {len(modules) - 1} more like it" if len(modules) > 1 else ""
    return c.proposal(WEIGHT, f"{c.module} stores its weight in another format than it computes in and permutes it "
                              f"every step ({c.what}); store it {c.cl_name}",
                      suggestion=f"auditor.convert_conv{c.rank - 2}d_weight_memory_format({module_expr(c.module)}, "
                                 f"torch.{c.cl_name}){more}", extra={"modules": modules})


@dataclass(frozen=True)
class Candidate:
    """One rewrite of a statement that is exact only where the model's shapes make it so:
    :meth:`Fixes.verify` proves it on the model, or drops it."""

    label: str  #: what it does, in a few words
    edit: tuple  #: (the statement, the rewrite, its facts), as :attr:`Proposal.edit`
    line: str  #: the statement as it is
    suggestion: str  #: the statement rewritten
    more: tuple = ()  #: edits of other statements made with it, as :attr:`Proposal.more_edits`


def _candidate(c: CauseView, label: str, rewrite: Callable, at: tuple[str, int] | None = None,
               before: int = 0, span: int = 1) -> Candidate | None:
    """``rewrite`` of ``c``'s statement (or of the statement at ``at``, a (file, line) the
    cause's data reaches), given with the ``before`` statements before it in its block (or the
    ``span`` statements from it on), or None where the statements do not have the shape the
    rewrite needs."""
    from libcst import ParserSyntaxError

    from . import _rewrite as rw

    path, lineno = at or (c.path, c.lineno)
    if path is None:
        return None
    try:
        statement = rw.statement_at(path, lineno)
        if before:
            starts = rw.statement_starts(path)
            at_first = starts.index(statement.first)
            if at_first < before:
                return None
            statement = rw.statements_from(path, starts[at_first - before], before + 1)
        elif span > 1:
            statement = rw.statements_from(path, statement.first, span)
        fns = _functions(path, lineno)
        if not fns:
            return None
        facts = _facts(c, fns)
        new = rw.rewrite(statement, [(rewrite, facts)])
    except (rw.Refused, ParserSyntaxError):
        return None
    return Candidate(label, (statement, rewrite, facts), statement.text.rstrip("\n"), new.rstrip("\n"))


def _line_events(c: CauseView) -> list[int]:
    """The forward events recorded at the cause's line (those of its forward op's line)."""
    view = c.view
    return [int(x) for x in np.flatnonzero((view.phase == "forward") & (view.source == view.source[c.forward]))]


#: the ops a reshape into a map is recorded as (a view, or the view after the copy it makes)
_RESHAPES = ("aten.view.", "aten._unsafe_view.", "aten.reshape.")


def _tokens_to_map_rank(c: CauseView) -> int | None:
    """The rank of a tensor laid out (B, c1 .. ck, N) that the reshapes on the cause's line make
    into a map (B, C, H, W) with N = H·W and c1·..·ck = C, as the recorded shapes of every such
    reshape there show (a line run at several sizes: one of them may fit by chance); None
    where one does not, or the ranks differ."""
    found, every = set(), True
    for x in _line_events(c):
        if not c.tracer.op[x].startswith(_RESHAPES):
            continue
        ins, outs = c.shapes(x)
        if len(ins) != 1 or len(outs) != 1 or len(ins[0]) < 3 or len(outs[0]) != 4:
            continue
        (i,), (o,) = ins, outs
        if i[0] == o[0] and i[-1] == o[2] * o[3] and int(np.prod(i[1:-1])) == o[1]:
            found.add(len(i))
        else:
            every = False
    return found.pop() if every and len(found) == 1 else None


def _map_split(c: CauseView) -> int | None:
    """How many of the sizes after the batch a reshape on the cause's line splits a map's
    channels into, where it reshapes a map (B, C, H, W) dense in the format into (B, c1 .. ck,
    s1 .. sm) with c1·..·ck = C and s1·..·sm = H·W (its spatial dimensions split or merged in
    order: window partitions, heads): the one k every such reshape recorded there allows (a
    size of 1 lets one map fit several); None where no one k does."""
    allowed = None
    for x in _line_events(c):
        if not c.tracer.op[x].startswith(_RESHAPES):
            continue
        ins, outs = c.shapes(x)
        if len(ins) != 1 or len(outs) != 1 or len(ins[0]) != c.rank or len(outs[0]) < 3 or ins[0][0] != outs[0][0]:
            continue
        (i,), (o,) = ins, outs
        if not _in_format(c, x):
            continue
        ks = {(k, len(o)) for k in range(1, len(o) - 1)
              if int(np.prod(o[1:1 + k])) == i[1] and int(np.prod(o[1 + k:])) == int(np.prod(i[2:]))}
        if ks:
            allowed = ks if allowed is None else allowed & ks
    return next(iter(allowed))[0] if allowed and len(allowed) == 1 else None


def _in_format(c: CauseView, x: int) -> bool:
    """Whether event ``x``'s first input is a map dense in the format (its channels innermost)."""
    rows = c.tracer.input_rows(x)
    return bool(rows) and _row_in_format(c, rows[0])


def _permuted_into_map(c: CauseView) -> bool:
    """Whether a reshape on the cause's line makes a map (B, C, H, W) of a tensor (B, C, s1 ..
    sm) whose second dimension alone is the channels (a window partition undone by a permute
    that puts C second), as the recorded shapes of every such reshape there show."""
    found = False
    for x in _line_events(c):
        if not c.tracer.op[x].startswith(_RESHAPES):
            continue
        ins, outs = c.shapes(x)
        if len(ins) != 1 or len(outs) != 1 or len(outs[0]) != c.rank or len(ins[0]) <= c.rank:
            continue
        (i,), (o,) = ins, outs
        if i[:2] != o[:2] or int(np.prod(i[2:])) != int(np.prod(o[2:])):
            return False
        found = True
    return found


def _copied_map(c: CauseView) -> str | None:
    """How the cause's line copies (clone) a map of the images' rank, as the recorded strides of
    the copy's input show: ``"dense"`` where each sample is a dense map in the format already (a
    permuted view of NHWC data; the samples may lie apart, as the tokens of a sample with a class
    token do), so the copy only changes the format; ``"channels innermost"`` where its channels
    lie innermost but the map is not dense (tokens taken out of a larger row), so a copy into the
    format is a copy like the one it replaces; None where the line copies no such map."""
    t = c.view.tensors
    strides = t["strides"].to_numpy()
    found = None
    for x in c.members[:1] + [c.forward]:
        if not c.tracer.op[x].startswith("aten.clone"):
            continue
        rows = c.tracer.input_rows(x)
        if not rows:
            continue
        shape, stride = parse_tuple(c.tracer.shape[rows[0]]), parse_tuple(strides[rows[0]])
        if len(shape) != c.rank or len(stride) != len(shape):
            continue
        meta = torch.empty_strided(shape, stride, device="meta")[0]
        if meta.movedim(0, -1).is_contiguous() and not meta.is_contiguous():
            return "dense"
        if meta.shape[0] > 1 and meta.stride(0) == 1 and all(s > 1 or n == 1 for s, n in zip(meta.stride()[1:], meta.shape[1:])):
            found = "channels innermost"
    return found


def _weight_in_reach(c: CauseView, fns: list[types.FunctionType], at: int | None = None) -> str | None:
    """A convolution weight the cause's line (or event ``at``'s line) can read as
    ``self.<path>.weight``: of a convolution that ran inside the module the line ran in (the
    one the map feeds first, else the one that made its input, else any), where the line is in
    a method of that module. Its layout is the format the model runs in."""
    e = c.forward if at is None else at
    view = c.view
    own, own_type = (c.module, c.module_type) if at is None else (view.module[e], view.ops["module_type"].iat[e])
    if not fns or not all(_method_of(fn, str(own_type)) for fn in fns):
        return None
    own = str(own)
    prefix = "" if own in ("", "<root>") else own + "."
    inside = [int(x) for x in np.flatnonzero(view.is_conv & (view.phase == "forward"))
              if str(view.module[int(x)]).startswith(prefix) and str(view.module[int(x)]) not in ("", "<root>")]
    if not inside:
        return None
    down, up = view.downstream_convs(e), view.upstream_convs(e)
    chosen = next((x for x in inside if x in down), None) or next((x for x in reversed(inside) if x in up), None) \
        or inside[0]
    path = str(view.module[chosen])[len(prefix):]
    if not all(p.isidentifier() or p.isdigit() for p in path.split(".")):
        return None
    return module_expr(path, root="self") + ".weight"


#: elementwise ops whose result takes the format of their first operand where the two differ
_FIRST_OPERAND_DECIDES = ("aten.add.Tensor", "aten.mul.Tensor", "aten.sub.Tensor")


def _first_meeting(c: CauseView) -> int | None:
    """The first add, multiply or subtract (in forward) where the tensor the cause made, or a
    view or cast of it, meets a map dense in the format, as its first operand: the result takes
    the first operand's format, so the image's is lost there."""
    if c.view.phase[c.e] != "forward":
        return None
    chain, todo = {c.e}, [c.e]
    producer = c.tracer.graph.producer
    while todo:
        e = todo.pop(0)
        for k in c.view.consumers.get(e, []):
            if k in chain or c.view.phase[k] != "forward":
                continue
            op = str(c.tracer.op[k])
            if op.startswith(_FIRST_OPERAND_DECIDES):
                rows = c.tracer.input_rows(k)
                if len(rows) == 2 and int(producer[rows[0]]) in chain and _row_in_format(c, rows[1]):
                    return k
                continue
            if c.view.kind[k] == VIEW or op.startswith("aten._to_copy"):
                chain.add(k)
                todo.append(k)
    return None


def _row_in_format(c: CauseView, row: int) -> bool:
    """Whether tensor ``row`` is a map of the images' rank dense in the format (its recorded
    label: contiguous in the format, alone or with the other one)."""
    return str(c.view.tensors["format"].iat[row]) in (c.cl_name, AMBIGUOUS)


def _made_from(c: CauseView) -> str:
    """What the recording shows of the tensor that joined the path: the op that made it, its
    shape, and the shapes of the tensors it was made from (none of them an image)."""
    ins, outs = c.shapes(c.e)
    op = str(c.tracer.op[c.e]).removeprefix("aten.").removesuffix(".default")
    made = "x".join(map(str, outs[0])) if outs else "?"
    what = "a map" if outs and len(outs[0]) == c.rank else "a tensor"
    sources = ", ".join("x".join(map(str, s)) or "a scalar" for s in ins)
    of = (f"from tensors shaped {sources}, none of them an image of the convolutions," if ins
          else "from no tensor (a new one)")
    phase = "in backward " if c.view.phase[c.e] != "forward" else ""
    return f"{op} {phase}makes {what} ({made}) {of}"


def _method_of(fn: types.FunctionType, module_type: str) -> bool:
    """Whether ``fn`` is a method of the module class named ``module_type`` (or of a class it
    derives from), so that its ``self`` is the module the line's ops were recorded in: a line
    in a method of a plain object a module calls (RAFT's CorrBlock) has another ``self``."""
    if fn.__code__.co_varnames[:1] != ("self",):
        return False
    owner = fn.__globals__.get(fn.__qualname__.split(".<locals>")[-1].rpartition(".")[0])
    if not isinstance(owner, type) or not issubclass(owner, torch.nn.Module):
        return False
    seen, todo = set(), [owner]
    while todo:
        k = todo.pop()
        if k.__name__ == module_type:
            return True
        seen.add(k)
        todo += [s for s in k.__subclasses__() if s not in seen]
    return False


@register_fix(patterns.JOINS.name)
def _joins_fix(c: CauseView) -> Proposal:
    """A token or row tensor made into a map: the rewrites the recorded shapes and strides allow
    (the map written in NHWC order, the copy of a channels_last view dropped, the product that
    makes the map computed transposed), each also in the form that follows the format of a
    convolution weight the line can reach, proposed as candidates that :meth:`Fixes.verify`
    proves on the model; without one, by hand."""
    where = short_source(c.source) if c.source else c.module
    candidates = _join_candidates(c)
    line = linecache.getline(c.path, c.lineno).rstrip("\n") if c.path else ""
    if candidates:
        labels = "; ".join(x.label for x in candidates)
        return c.proposal(EDIT, c.row.fix, line=candidates[0].line, extra={"candidates": candidates},
                          reason=f"{len(candidates)} candidate rewrite{'s' * (len(candidates) > 1)} ({labels}) "
                                 "exact only for some shapes: Fixes.verify(model, *inputs) proves one on this model "
                                 "or drops them")
    return c.proposal(EDIT, c.row.fix, line=line, reason=f"{_made_from(c)} at {where}, and no rewrite of its "
                                                         "statement is known to make it a map in the format")


def _join_candidates(c: CauseView) -> list[Candidate]:
    """The candidate rewrites of a join (:func:`_joins_fix`) the recorded shapes and strides
    allow, in the order verify tries them."""
    from . import _rewrite as rw

    found: list[Candidate | None] = []
    weight = _weight_in_reach(c, _functions(c.path, c.lineno)) if c.path else None
    rank = _tokens_to_map_rank(c)
    if rank is not None:
        found.append(_candidate(c, "the map written in NHWC order (reshape then permute)", rw.map_in_nhwc_order(rank)))
        if weight:
            found.append(_candidate(c, f"the map written in NHWC order, in the format of {weight}",
                                    rw.map_in_nhwc_order(rank, weight)))
    split = _map_split(c)
    if split is not None:
        found.append(_candidate(c, "the map split in NHWC order (permute, reshape, permute back)",
                                rw.split_map_in_nhwc_order(split, c.rank)))
    if _permuted_into_map(c):
        for before in (0, 1):  # the permute on the line, else on the statement before it
            gathered = [_candidate(c, "the map gathered in NHWC order (channels permuted last)",
                                   rw.permuted_map_in_nhwc_order(c.rank), before=before)]
            if weight:
                gathered.append(_candidate(c, f"the map gathered in NHWC order, in the format of {weight}",
                                           rw.permuted_map_in_nhwc_order(c.rank, weight), before=before))
            if gathered[0] is not None:
                found += gathered
                break
    copied = _copied_map(c)
    if copied == "dense":
        found.append(_candidate(c, "the copy of the channels_last view dropped", rw.drop_copy_of_permuted))
        if weight:
            found.append(_candidate(c, f"the copy of the channels_last view made in the format of {weight}",
                                    rw.copy_in_format_of(weight)))
        elif c.path:
            found.append(_copy_at_the_call(c))
    if copied == "channels innermost":
        if weight:
            found.append(_candidate(c, f"the copy made in the format of {weight}", rw.copy_in_format_of(weight)))
        found.append(_candidate(c, f"the copy made in torch.{c.cl_name}, a format-specific edit (code that runs "
                                   f"contiguous copies into {c.cl_name} too)", rw.keep_format_in_copy))
    if any(c.tracer.op[x].startswith(("aten.bmm", "aten.mm", "aten.matmul")) for x in _line_events(c)):
        found.append(_candidate(c, "the product computed transposed", rw.product_transposed))
        if weight:
            found.append(_candidate(c, f"the product computed transposed where {weight} is {c.cl_name}",
                                    rw.product_transposed_in_format_of(weight)))
    if not found or all(x is None for x in found):
        found += _chain_candidates(c)
    meets = _first_meeting(c)
    if meets is not None:
        where_k = _where(str(c.view.source[meets]))
        if where_k[0] is not None:
            name = str(c.tracer.op[meets]).removeprefix("aten.").split(".")[0]
            found.append(_candidate(c, f"the new tensor copied into the format of the image it meets in the {name} at "
                                       f"{short_source(c.view.source[meets])}", rw.meet_in_format(name), at=where_k))
    return [x for x in found if x is not None]


#: the ops a reshape or view is recorded as (a reshape that copies: a clone, then this)
_VIEWS = ("aten.view.default", "aten._unsafe_view.default")


def _chain_candidates(c: CauseView) -> list[Candidate]:
    """The map the cause's tensor is, or was made from a few ops before (a pool, a view),
    where a chain of reshapes and permutes over several statements folds it out of tokens:
    the chain gathered in NHWC order in one copy, where a convolution weight in reach is in the
    format (:func:`._rewrite.chain_in_format_of`), proposed as a candidate. None where the
    recorded shapes show no permutation of factors, or no weight is in reach."""
    from . import _chain
    from . import _rewrite as rw

    seen = set()
    for anchor in _made_before(c, steps=3):
        path, line = _where(str(c.view.source[anchor]))
        if path is None or (path, line) in seen:
            continue
        seen.add((path, line))
        found = _recorded_chain(c, anchor)
        if found is None:
            continue
        statement, parts, chains = found
        if any(len(ch.chain.dims) != c.rank for ch in chains):
            continue
        if not all(_chain.gathers_the_same(ch.shape, ch.steps, ch.chain) for ch in chains):
            continue
        weight = _weight_in_reach(c, _functions(path, line), at=anchor)
        if weight is None:
            continue
        text = _chain.nhwc_text(max(chains, key=lambda ch: len(ch.chain.order)).chain)
        label = (f"{_statements_of(parts)} reshapes and permutes gathered in NHWC order in one copy, where {weight} "
                 f"is {c.cl_name}")
        made = _candidate(c, label, rw.chain_in_format_of(text, weight), at=(path, statement.first), span=len(parts))
        return [made] if made is not None else []
    return []


def _copy_at_the_call(c: CauseView) -> Candidate | None:
    """Where the line that copies a channels_last view is in a function no weight is in reach
    of (a method of a plain object the module calls: RAFT's CorrBlock), the copy dropped there
    and made where the module's own method calls that function, in the format of a weight in
    reach there: two edits, one candidate. None where the call is not one statement of one
    method of the module."""
    from . import _rewrite as rw

    fns = _functions(c.path, c.lineno)
    if len(fns) != 1:
        return None
    site = _call_site(c, fns[0].__name__)
    if site is None:
        return None
    path, line, callers = site
    weight = _weight_in_reach(c, callers)
    if weight is None:
        return None
    label = (f"the copy of the channels_last view dropped, and made where {short_source(f'{path}:{line}')} "
             f"calls {fns[0].__name__}, in the format of {weight}")
    here = _candidate(c, label, rw.drop_copy_of_permuted)
    if here is None:
        return None
    try:
        statement = rw.statement_at(path, line)
        facts = _facts(c, callers)
        rewrite = rw.call_in_format_of(fns[0].__name__, weight)
        new = rw.rewrite(statement, [(rewrite, facts)])
    except rw.Refused:
        return None
    # each statement from the first column, as the display shows one alone (it dedents code)
    shown = (f"{textwrap.dedent(here.suggestion)}\n# and at {short_source(f'{path}:{statement.first}')}:\n"
             f"{textwrap.dedent(new).rstrip()}")
    return Candidate(label, here.edit, here.line, shown, more=((statement, rewrite, facts),))


def _call_site(c: CauseView, name: str) -> tuple[str, int, list[types.FunctionType]] | None:
    """(file, line, the functions there) of the one call of ``name`` in the method of the
    cause's module that its recorded ops ran in, as the recorded lines of the module's own ops
    show."""
    view = c.view
    for x in np.flatnonzero((view.module == c.module) & (view.phase == "forward")):
        path, line = _where(str(view.source[int(x)]))
        if path is None:
            continue
        fns = _functions(path, line)
        if fns and all(_method_of(fn, c.module_type) for fn in fns):
            break
    else:
        return None
    try:
        tree = ast.parse("".join(linecache.getlines(path)))
    except SyntaxError:
        return None
    method = next((n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
                   and n.lineno <= line <= (n.end_lineno or n.lineno) and n.name == fns[0].__name__), None)
    if method is None:
        return None
    calls = [n.lineno for n in ast.walk(method) if isinstance(n, ast.Call)
             and ((isinstance(n.func, ast.Attribute) and n.func.attr == name)
                  or (isinstance(n.func, ast.Name) and n.func.id == name))]
    return (path, calls[0], fns) if len(calls) == 1 else None


def _split_chain_candidates(c: CauseView) -> list[Candidate]:
    """Where the cause's copy is made by a chain of reshapes and permutes that cuts a map in the
    format into tokens (patches), merging its channels with another dimension: the chain
    reading the map in its memory order (:func:`._chain.split_text`), only where the map is in
    the format, so a contiguous map keeps the chain it had; a candidate."""
    from . import _chain
    from . import _rewrite as rw

    found = _recorded_chain(c, c.forward)
    if found is None:
        return []
    statement, parts, chains = found
    if any(len(ch.shape) != c.rank or not _in_format(c, ch.first) for ch in chains):
        return []
    if not all(_chain.splits_the_same(ch.shape, ch.steps, ch.chain) for ch in chains):
        return []
    text = _chain.split_text(max(chains, key=lambda ch: len(ch.chain.order)).chain, c.rank)
    label = f"{_statements_of(parts)} reshapes and permutes reading the map in its memory order (NHWC)"
    made = _candidate(c, label, rw.chain_read_in_format(text), at=(statement.path, statement.first), span=len(parts))
    return [made] if made is not None else []


def _statements_of(parts: list) -> str:
    return f"the {len(parts)} statements'" if len(parts) > 1 else "the statement's"


@dataclass(frozen=True)
class _Run:
    """One module's run of a chain: its input's shape, its steps with the recorded sizes, the
    chain they make, and the event of its first reshape."""

    shape: tuple[int, ...]
    steps: list
    chain: _chain.Chain
    first: int


def _recorded_chain(c: CauseView, anchor: int):
    """(the statements, their chain parts, one :class:`_Run` per module that ran them and
    whose recorded sizes fit) of the chain of reshapes around event ``anchor``'s line; None
    where there is no such chain, or no run fits."""
    from . import _rewrite as rw

    path, line = _where(str(c.view.source[anchor]))
    if path is None:
        return None
    try:
        statement, parts = rw.chain_around(path, line)
    except rw.Refused:
        return None
    steps = [s for p in parts for s in p.steps]
    name = rw._code(parts[0].base) if rw._simple(parts[0].base) else parts[-1].target
    events = _span_events(c, statement, anchor)
    runs = []
    for module in dict.fromkeys(str(m) for m in c.view.module[events]):
        run = _chain_of(c, statement, steps, [int(x) for x in events if str(c.view.module[x]) == module], name)
        if run is not None:
            runs.append(run)
    return (statement, parts, runs) if runs else None


def _made_before(c: CauseView, steps: int) -> list[int]:
    """The cause's forward event, then the events that made its first input, ``steps`` back."""
    out, e = [c.forward], c.forward
    producer = c.tracer.graph.producer
    for _ in range(steps):
        rows = c.tracer.input_rows(e)
        if not rows or int(producer[rows[0]]) < 0:
            break
        e = int(producer[rows[0]])
        out.append(e)
    return out


def _span_events(c: CauseView, statement, anchor: int) -> np.ndarray:
    """The forward reshapes and views recorded on ``statement``'s lines, by modules of the
    anchor's type (every block that runs the chain)."""
    view = c.view
    lines = {f"{statement.path}:{k}" for k in range(statement.first, statement.last + 1)}
    sources = pd.Series(view.source, dtype=object)
    on_lines = sources.isin([s for s in sources.unique() if recorded(str(s)) in lines]).to_numpy()
    types_ = view.ops["module_type"].astype(str).to_numpy()
    return np.flatnonzero(on_lines & (view.phase == "forward") & (types_ == str(types_[anchor]))
                          & np.isin(view.op, _VIEWS))


def _chain_of(c: CauseView, statement, steps: list, events: list[int], name: str) -> _Run | None:
    """The chain as one module ran it (:class:`_Run`), ``events`` its reshapes and views on the
    chain's lines, their sizes those recorded (its last run's); None where they do not fit, or
    it makes no copy."""
    from . import _chain

    written = [s for s in steps if s[0] == "reshape"]
    if len(events) < len(written) or not written:
        return None
    events = events[-len(written):]
    if not _copies(c, events[-1], statement):
        return None  # a chain of views makes no copy: gathered in NHWC order it would make one
    numeric, k = [], 0
    shape = None
    for s in steps:
        if s[0] == "contiguous":
            continue
        if s[0] != "reshape":
            numeric.append(s)
            continue
        ins, outs = c.shapes(events[k])
        if len(ins) != 1 or len(outs) != 1 or len(outs[0]) != len(s[1]):
            return None
        if any(w is not None and w.lstrip("-").isdigit() and int(w) != n for w, n in zip(s[1], outs[0])):
            return None
        if shape is None:  # the chain's input: the first reshape's, its permutes before undone
            shape = tuple(ins[0])
            for p in reversed(numeric):
                shape = _unpermute(shape, p)
        numeric.append(("reshape", tuple(outs[0]), list(s[1])))
        k += 1
    try:
        return _Run(shape, numeric, _chain.build(name, shape, numeric), _moves_back(c, events[0], statement)[-1])
    except _chain.NotAPermutation:
        return None


#: the ops a chain of reshapes, views, transposes and permutes is recorded as
_MOVES = ("aten.view.default", "aten._unsafe_view.default", "aten.clone.default", "aten.transpose.int",
          "aten.permute.default")


def _copies(c: CauseView, last: int, statement) -> int:
    """How many copies the chain ending at event ``last`` makes."""
    return sum(str(c.view.op[e]) == "aten.clone.default" for e in _moves_back(c, last, statement))


def _moves_back(c: CauseView, last: int, statement) -> list[int]:
    """The recorded ops of a chain, from ``last`` back, while they are moves on the chain's
    statements (the last of them reads the chain's input)."""
    lines = {f"{statement.path}:{k}" for k in range(statement.first, statement.last + 1)}
    producer = c.tracer.graph.producer
    out, e = [], last
    while e >= 0 and str(c.view.op[e]) in _MOVES and recorded(str(c.view.source[e])) in lines:
        out.append(e)
        rows = c.tracer.input_rows(e)
        e = int(producer[rows[0]]) if rows else -1
    return out or [last]


def _unpermute(shape: tuple[int, ...], step: tuple) -> tuple[int, ...]:
    order = list(range(len(shape)))
    if step[0] == "transpose":
        order[step[1]], order[step[2]] = order[step[2]], order[step[1]]
    else:
        order = [o % len(shape) for o in step[1]]
    out = [0] * len(shape)
    for i, o in enumerate(order):
        out[o] = shape[i]
    return tuple(out)


@register_fix(patterns.MIXED_JOIN.name)
def _mixed_join_fix(c: CauseView) -> Proposal:
    """A ``cat`` (or ``stack``) of maps in the format and a tensor in another format: the odd
    tensor, as the recorded formats of every call at the line show it, converted to the format
    of one of the others before the join. The conversion follows that tensor's format (no copy
    where the model runs contiguous), so the edit is layout-neutral; it copies the odd tensor
    (usually the small one) instead of the join writing every map in the other format."""
    odd, ref = _odd_joined(c)
    detail = c.row.fix
    if not odd or ref is None:
        line = linecache.getline(c.path, c.lineno).rstrip("\n") if c.path else ""
        return c.proposal(EDIT, detail, line=line,
                          reason="the calls at this line join tensors in different formats at different places, so no "
                                 "one of them can be converted at the line")
    if c.path is None:
        return c.proposal(EDIT, f"{detail} (audit with record_source=True for the line)",
                          reason="the audit has no source line (audit with record_source=True)")
    found = _candidate(c, "the odd tensor converted to the others' format", _convert_joined(odd, ref))
    if found is None:
        line = linecache.getline(c.path, c.lineno).rstrip("\n")
        places = ", ".join(map(str, odd))
        if ref > min(odd):
            why = (f"the odd tensor (at index {places}) comes before the tensor in the format (at index {ref}) in the "
                   "list, which is no plain name, so its format cannot be read where the odd one is converted: name "
                   "that tensor in a statement before the join, then convert the odd one to its format")
        else:
            why = (f"this line has no one call of cat or stack with a list of {_count_joined(c)} tensors written out, "
                   f"whose odd one (at index {places}) could be converted")
        return c.proposal(EDIT, detail, line=line, reason=why)
    return c.proposal(EDIT, detail, line=found.line, suggestion=found.suggestion, edit=found.edit)


def _joined_rows(c: CauseView, e: int) -> list[int]:
    """The rows of the tensors event ``e`` joins, in the order of its list."""
    t = c.tracer
    return [r for r in t.input_rows(e) if t.arg[r] == "tensors"]


def _count_joined(c: CauseView) -> int:
    return len(_joined_rows(c, c.e))


def _odd_joined(c: CauseView) -> tuple[tuple[int, ...], int | None]:
    """(the places in the list of the tensors the join reads off the format, in every call of
    the cause at its line; the place of the largest tensor in the format in all of them, None
    where there is none)."""
    t = c.tracer
    odd: set[int] = set()
    kept: set[int] | None = None
    sizes: dict[int, int] = {}
    for e in c.members:
        rows = _joined_rows(c, e)
        if len(rows) != _count_joined(c):
            return (), None
        bad = set(t.mixed_join(e))
        odd |= {i for i, r in enumerate(rows) if r in bad}
        cl = {i for i, r in enumerate(rows) if t.label[r].startswith("channels_last") and t.size[r] > 0}
        kept = cl if kept is None else kept & cl
        for i, r in enumerate(rows):
            sizes[i] = max(sizes.get(i, 0), int(t.size[r]))
    kept = (kept or set()) - odd
    ref = max(sorted(kept), key=lambda i: sizes[i]) if kept else None
    return tuple(sorted(odd)), ref


@functools.cache  # one rewrite for one argument: two causes of one statement rewrite it once
def _convert_joined(odd: tuple[int, ...], ref: int) -> Callable:
    """The rewrite of a join whose tensors at places ``odd`` of its list are off the format:
    each written ``x.contiguous(memory_format=<cl> if ref.is_contiguous(memory_format=<cl>)
    else torch.contiguous_format)``, ``ref`` the tensor at place ``ref`` (named by a walrus
    where it is no plain name and comes first; refused where it comes after them)."""
    def rewrite(module, facts):
        import libcst as cst

        from . import _rewrite as rw

        def is_join(node) -> bool:
            if not (isinstance(node, cst.Call) and rw._callee(node) in _JOIN_CALLS and node.args):
                return False
            first = node.args[0].value
            return isinstance(first, (cst.List, cst.Tuple)) and len(first.elements) > max(*odd, ref)

        call = rw._the_one(rw._find(module, is_join), "cat or stack of a list of tensors written out")
        items = list(call.args[0].value.elements)
        if any(isinstance(x, cst.StarredElement) for x in items):
            raise rw.Refused("the list of tensors has a starred element")
        cl = rw._memory_format(facts)
        ref_node = items[ref].value
        if rw._simple(ref_node):
            name = rw._code(ref_node)
        elif ref < min(odd):
            name = facts.new_name("_joined")
            items[ref] = items[ref].with_changes(value=rw._expr(f"({name} := {rw._code(ref_node)})"))
        else:
            raise rw.Refused("the tensor in the format comes after the odd one and is no plain name")
        for i in odd:
            x = items[i].value
            text = rw._code(x)
            atom = isinstance(x, (cst.Name, cst.Attribute, cst.Call, cst.Subscript)) or x.lpar
            items[i] = items[i].with_changes(value=rw._expr(
                f"{text if atom else f'({text})'}.contiguous(memory_format={cl} if {name}.is_contiguous("
                f"memory_format={cl}) else {facts.torch}.contiguous_format)"))
        joined = call.args[0].value.with_changes(elements=items)
        new = call.with_changes(args=[call.args[0].with_changes(value=joined), *call.args[1:]])
        return rw._replace(module, call, new)
    return rewrite


#: the calls that join a list of tensors along a dimension
_JOIN_CALLS = ("cat", "concat", "concatenate", "stack")


@register_fix(patterns.NO_CL_KERNEL.name, patterns.RESHAPE_MERGE.name, patterns.CONV_NO_KERNEL.name,
              patterns.LOSES.name)
def _region_fix(c: CauseView) -> Proposal | None:
    region, added = _region_around(c.view, c.members)
    if not region:
        return None
    names = ", ".join(repr(n) for n in region)
    merge = c.pattern == patterns.RESHAPE_MERGE.name
    why = "a reshape that merges C with another dimension must copy a channels_last tensor" if merge else c.row.fix
    # the chain that makes the copy, read in the map's memory order: an edit verify may prove instead
    candidates = _split_chain_candidates(c) if merge and c.path else []
    extra = {"candidates": candidates, "edit_detail": f"{why}: {c.what}; read the map in its memory order"} \
        if candidates else {}
    return c.proposal(REGION, f"{why}: {c.what}; run the convolutions around it contiguous so no copy is needed "
                              "(or let auditor.plan_layout measure whether that pays)",
                      suggestion=f"auditor.keep_contiguous(model, [{names}])", region=region, added_bytes=added,
                      extra=extra)


# -- the data flow around a cause ------------------------------------------------------------------


def _rank_of(view: FlowView, e: int) -> int:
    """The rank of the convolutions' activations around ``e`` (4 or 5): a channel shuffle
    copies a 5-D view of 4-D activations, so ``e``'s own tensors can mislead."""
    nd = view.tensors["ndim"].to_numpy()
    near = sorted(view.upstream_convs(e) | view.downstream_convs(e)) if not view.is_conv[e] else [e]
    for x in near + [e]:
        for r in view.act_rows.get(x, []):
            if nd[r] in (4, 5):
                return int(nd[r])
    return 4


def _region_around(view: FlowView, events: list[int]) -> tuple[tuple[str, ...], int]:
    """The convolutions on both sides of a cause's ``events`` (found in forward), and the bytes
    the region's edges would then convert, per phase."""
    convs: set[int] = set()
    for c in events:
        e = c
        if view.phase[c] != "forward":
            same = np.flatnonzero((view.phase == "forward") & (view.module == view.module[c])
                                  & (view.source == view.source[c]))
            if not len(same):
                continue
            e = int(same[0])
        convs |= view.upstream_convs(e) | view.downstream_convs(e)
        if view.is_conv[e]:
            convs |= {e}
    # the modules that ran the convolution ops; Fixes.apply keeps those that are convolution
    # modules (a subclass of nn.Conv2d by any name, not a module calling F.conv2d)
    names = sorted({view.module[x] for x in convs}, key=lambda n: min(x for x in convs if view.module[x] == n))
    if not names:
        return (), 0
    inside = set(names)
    nbytes = view.tensors["bytes"].to_numpy()
    added = 0
    for x in np.flatnonzero((view.phase == "forward") & view.is_conv):
        x = int(x)
        if view.module[x] not in inside:
            continue
        # its input comes from a convolution outside the region: converted at the edge
        if any(view.module[u] not in inside for u in view.upstream_convs(x)):
            added += int(nbytes[view.act_rows[x][0]])
        # its output feeds one outside: converted back at the edge
        if any(view.module[d] not in inside for d in view.downstream_convs(x)):
            added += _output_bytes(view, x)
    return tuple(names), added


def _output_bytes(view: FlowView, e: int) -> int:
    t = view.tensors
    sel = t[(t["seq"] == e) & (t["role"] == "output") & (t["position"] == 0)]
    return int(sel["bytes"].iloc[0]) if len(sel) else 0


# the generators of their own modules, which import this one: loaded by name, once it is whole
for _module in ("_canvas", "_norm_view", "_gather_above"):
    __import__(f"{__package__}.{_module}")
