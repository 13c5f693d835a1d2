"""Causes: the op, and its line, where an activation first left the format its convolution wrote.

A hotspot is often a symptom: a convolution permutes its input because an op upstream wrote it
in another format, and the backward pass mirrors it. :class:`CauseTracer` follows every hotspot
back through the data flow to its cause, merges a backward cause into the forward op whose
autograd node ran it, and names the pattern the cause follows (from its ops, shapes, strides
and data flow, never from names of models or modules). :func:`cause_table` groups them per
line: what the user changes.
"""

from __future__ import annotations

import functools

import numpy as np
import pandas as pd
import torch

from .._recording import _rules as rules
from .._recording._formats import base_format, channels_last_order, logical_order
from .._recording._torch import is_reduction
from . import _patterns as patterns
from ._activations import op_flags, parse_tuple
from ._costs import copy_cost, estimate_note, own_saving_us, pass_cost, saving_us, timed
from ._flow import FlowView

#: Cause kinds: an op lost channels_last unasked (:data:`LOSES`, the op kind), a copy converted
#: it on request (:data:`CONVERTS`), a weight is stored or rebuilt in another format than its
#: convolution computes in, or data joined the path in another format.
LOSES, CONVERTS = rules.LOSES, rules.CONVERTS
WEIGHT, JOINS = "weight", "joins"

CAUSE_COLUMNS = [
    "cause", "phase", "module", "module_type", "op", "kind", "pattern", "source", "calls", "hotspots",
    "bytes", "time_us", "hotspot_us", "replaced_us", "saving_us", "saving_trusted", "saving_note", "first_seq",
    "fix",
]

_CL = ("channels_last", "channels_last_3d")
#: the arguments that hold the tensors a cat or stack joins
_JOINED = ("tensors",)
_SLICES = ("aten.slice", "aten.narrow", "aten.split", "aten.chunk", "aten.split_with_sizes", "aten.unbind")


class CauseTracer:
    """Traces hotspots of one audit back to their causes over its ops, facts and flow graph."""

    def __init__(self, view: FlowView, facts: pd.DataFrame, coverage: pd.DataFrame | None = None):
        self.view = view
        self.graph = view.graph
        ops = view.ops
        t = view.tensors
        self.kind, self.op, self.is_conv = view.kind, view.op, view.is_conv
        self.phase, self.module, self.source = view.phase, view.module, view.source
        self.to_format = ops["to_format"].astype(str).to_numpy()
        self.forward_seq = ops["forward_seq"].to_numpy() if "forward_seq" in ops else np.full(len(ops), -1)
        self.weight_permuted = ops["weight_permuted"].to_numpy()
        self.copy = op_flags(ops["op"], rules.is_copy)
        self.folds = op_flags(ops["op"], rules.folds)  # a conversion it makes is a reshape's copy
        self.image = facts["image"].to_numpy()
        self.cdim = facts["cdim"].to_numpy()
        self.rank = facts["rank"].to_numpy()
        self.label = facts["label"].astype(str).to_numpy()
        self.effective = facts["effective"].astype(str).to_numpy()
        self.ndim = t["ndim"].to_numpy()
        self.shape = t["shape"].astype(str).to_numpy()
        self.size = t["bytes"].to_numpy()
        self.arg = t["arg"].astype(str).to_numpy()
        self.seq = t["seq"].to_numpy()
        self.is_out = (t["role"] == "output").to_numpy()
        self.is_view = t["is_view"].to_numpy()
        self.tid = t["tid"].to_numpy()
        self.bounds = np.searchsorted(self.seq, np.arange(len(ops) + 1))
        self.coverage = coverage
        self._memo: dict[int, tuple[int, str]] = {}
        #: cause event -> why it may exist only at the audited size (:meth:`size_note`), for the
        #: fixes' reasons; filled by :func:`cause_table`
        self.size_notes: dict[int, str] = {}

    # -- which rows -------------------------------------------------------------------------
    # what the fix generators read of an op: its rows in the log, by argument

    def rows(self, e: int) -> range:
        """The log's rows of event ``e``: its tensor arguments, then its outputs."""
        return range(int(self.bounds[e]), int(self.bounds[e + 1]))

    def input_rows(self, e: int) -> list[int]:
        """The rows of ``e``'s tensor arguments, in argument order."""
        return [r for r in self.rows(e) if not self.is_out[r]]

    def image_inputs(self, e: int) -> list[int]:
        """The rows of ``e``'s activation inputs that are images, feed a convolution, or meet an
        image of their shape as a peer (as :func:`auditor._recording._rules.classify` counts them)."""
        rows = self.graph.act_rows.get(e, [])
        if self.is_conv[e]:
            return list(rows)
        shapes = {self.shape[r] for r in rows if self.image[r]}
        joined = {self.ndim[r] for r in rows if self.image[r] and self.arg[r] in _JOINED}
        return [r for r in rows if self.image[r] or (self.ndim[r] >= 4 and self.shape[r] in shapes)
                or (self.arg[r] in _JOINED and self.ndim[r] in joined)]

    def mixed_join(self, e: int) -> list[int]:
        """The odd inputs of a join of mixed formats: where ``e`` joins (``cat``, ``stack``)
        tensors of the images' rank whose recorded formats disagree, some channels_last and
        some in a definite other format, and writes the other format, the rows of those others;
        [] where it is no such join. Empty tensors are left out: they hold nothing to move. Only
        a forward join is the user's: a backward one is autograd's (a split's gradient), and the
        op that wrote its odd gradient stays the cause."""
        if self.is_conv[e] or self.copy[e] or self.phase[e] != "forward":
            return []
        rows = [r for r in self.graph.act_rows.get(e, []) if self.arg[r] in _JOINED and self.ndim[r] in (4, 5)
                and self.size[r] > 0]
        formats = [base_format(self.label[r]) for r in rows]
        out = self.output_row(e)
        if not any(f in _CL for f in formats) or out < 0 or base_format(self.label[out]) in _CL:
            return []
        return [r for r, f in zip(rows, formats) if f in ("contiguous", "other")
                or (f not in _CL and not self._dense_in_the_format(r))]

    def _dense_in_the_format(self, r: int) -> bool:
        """Whether tensor ``r``'s recorded strides are channels_last(_3d) to torch, which its
        label cannot say where it is ambiguous: a map of one channel expanded over H or W
        (stride 0) is either format by its channels and neither by its strides, and a join
        writes the other format for it."""
        shape = parse_tuple(self.shape[r])
        strides = parse_tuple(str(self.view.tensors["strides"].iat[r]))
        if len(shape) not in (4, 5) or len(strides) != len(shape):
            return True
        meta = torch.empty_strided(shape, strides, device="meta")
        return meta.is_contiguous(memory_format=torch.channels_last if len(shape) == 4 else torch.channels_last_3d)

    def output_row(self, e: int) -> int:
        """The row of ``e``'s first output; -1 without one."""
        outs = [r for r in self.rows(e) if self.is_out[r]]
        return outs[0] if outs else -1

    def weight_row(self, e: int) -> int:
        """The row of ``e``'s ``weight`` argument; -1 without one."""
        return next((r for r in self.rows(e) if not self.is_out[r] and self.arg[r] == "weight"), -1)

    @staticmethod
    def _off(fmt: str) -> bool:
        """A definite format other than channels_last: data the path did not mean to carry."""
        base = base_format(fmt)
        return base in ("contiguous", "other")

    # -- tracing ----------------------------------------------------------------------------
    def cause(self, h: int) -> tuple[int, str]:
        """(cause event, cause kind) of hotspot ``h``."""
        hit = self._memo.get(h)
        if hit is None:
            hit = self._memo[h] = self._cause(h, set())
        return hit

    def _cause(self, h: int, seen: set) -> tuple[int, str]:
        seen.add(h)
        kind = self.kind[h]
        blamed = [r for r in self.image_inputs(h) if self._off(self.effective[r] or self.label[r])]
        if self.is_conv[h] and self.weight_permuted[h] and not blamed:
            return self._weight_cause(h)
        copies = self.copy[h] or self.folds[h]
        if copies and not blamed and kind == rules.CONVERTS:
            return h, CONVERTS  # a copy into another format somebody asked for
        # an operand arrived off its format (a peer of an image's shape, for an op that loses):
        # blame whoever wrote it so
        found = self._upstream(blamed, seen)
        if self.mixed_join(h) and (found is None or found[1] == JOINS):
            # a join of maps in the format with a tensor that never was in it (made off the
            # path, or from no image): the join is what the user changes, converting that one
            return h, CONVERTS
        if found is not None:
            return found
        return h, (CONVERTS if copies and kind != rules.LOSES else LOSES)

    def _upstream(self, rows: list[int], seen: set) -> tuple[int, str] | None:
        """The cause behind the first of ``rows`` whose data an op wrote off its format; one
        that did (a loss, a conversion, a weight) before data that merely joined the path off
        its format (a gradient from a head without convolutions), which is often itself a
        consequence of the same cause."""
        joined = None
        for r in rows:
            found = self._trace(r, set(seen))
            if found is None:
                continue
            if found[1] != JOINS:
                return found
            joined = joined or found
        return joined

    def _trace(self, r: int, seen: set) -> tuple[int, str] | None:
        """Follow the data of input row ``r`` back to the op that wrote it off its format. A
        tensor with no elements (of a level no region fell in) carries nothing: the data entered
        the path at the op that read it (a backward that writes a map of zeros from an empty
        gradient)."""
        reader, p = int(self.seq[r]), int(self.graph.producer[r])
        while p >= 0 and p not in seen:
            seen.add(p)
            if 0 in parse_tuple(self.shape[r]):
                return reader, JOINS
            kind = self.kind[p]
            if kind in (rules.LOSES, rules.CONVERTS, rules.RESTORES) or self.is_conv[p]:
                return self._cause(p, seen)
            ins = [] if rules.is_factory(self.op[p]) else self.image_inputs(p)
            if not ins:  # the data entered the image path here (a factory reads none); a view is never a cause
                while self._aliases(p):
                    first = next((r for r in self.rows(p) if not self.is_out[r]), -1)
                    q = int(self.graph.producer[first]) if first >= 0 else -1
                    if q < 0:
                        break
                    p = q
                return p, JOINS
            nxt = next((x for x in ins if self._off(self.effective[x] or self.label[x])), ins[0])
            reader, r, p = p, nxt, int(self.graph.producer[nxt])
        return None

    def _aliases(self, p: int) -> bool:
        """``p`` returned views of its input (of any rank, image or not), or its inputs
        themselves (a dropout of probability 0 under inference_mode returns the tensor it was
        given): it moved no data."""
        if self.view.kind[p] == rules.VIEW:
            return True
        outs = [r for r in self.rows(p) if self.is_out[r]]
        if not outs:
            return False
        if all(self.is_view[r] for r in outs):
            return True
        ins = {int(self.tid[r]) for r in self.rows(p) if not self.is_out[r]}
        return all(int(self.tid[r]) in ins for r in outs)

    def _weight_cause(self, h: int) -> tuple[int, str]:
        """A convolution permutes its weight: the op that rebuilt the weight in another format,
        or the convolution itself when the stored parameter is in the other format."""
        w = self.weight_row(h)
        p = int(self.graph.producer[w]) if w >= 0 else -1
        seen = set()
        while p >= 0 and p not in seen:
            seen.add(p)
            if self._changes_weight_format(p):
                return p, WEIGHT
            first = next((r for r in self.rows(p) if not self.is_out[r]), -1)
            p = int(self.graph.producer[first]) if first >= 0 else -1
        return h, WEIGHT

    def _changes_weight_format(self, p: int) -> bool:
        """``p`` wrote the weight's data in another physical order than it read: a copy into
        another format, or a reshape that had to copy a channels_last weight (which it writes in
        contiguous order whatever rank it returns)."""
        out = self.output_row(p)
        src = next((r for r in self.rows(p) if not self.is_out[r]), -1)  # the data: the first argument
        if out < 0 or src < 0 or self.ndim[src] not in (4, 5) or self.view.kind[p] == rules.VIEW:
            return False
        a = base_format(self.label[src])
        if self.ndim[out] == self.ndim[src]:
            b = base_format(self.label[out])
            return a != b and a in ("contiguous", *_CL) and b in ("contiguous", *_CL)
        return bool(self.copy[p]) and a in _CL

    def root(self, c: int, causes: set[int]) -> int:
        """The event a cause is reported under. A backward cause belongs to a forward cause
        when the forward op whose autograd node ran it is that cause, or is joined to one by
        views only (the backward of a view next to the copy), or sits at the same line as
        one."""
        if self.phase[c] != "backward":
            return c
        f = int(self.forward_seq[c])
        if f < 0:
            return c
        forward = [x for x in causes if self.phase[x] == "forward"]
        at_line = {}
        for x in sorted(forward):
            at_line.setdefault((self.op[x], self.source[x] or self.module[x]), x)
        for g in self._through_views(f):
            if g in causes:
                return g
            hit = at_line.get((self.op[g], self.source[g] or self.module[g]))
            if hit is not None:
                return hit
        return c

    def _through_views(self, e: int, limit: int = 8) -> list[int]:
        """``e`` and the forward events joined to it by views only, nearest first."""
        found, frontier = [e], [e]
        while frontier and len(found) < limit:
            nxt = []
            for x in frontier:
                near = list(self.graph.consumers.get(x, [])) + [p for p in self.graph.input_producers(x) if p >= 0]
                for y in near:
                    if y not in found and (self.view.kind[x] == rules.VIEW or self.view.kind[y] == rules.VIEW):
                        found.append(y)
                        nxt.append(y)
            frontier = nxt
        return found

    # -- patterns ---------------------------------------------------------------------------
    def pattern(self, c: int, kind: str) -> str:
        """Which registered pattern cause ``c`` follows (:data:`.patterns.PATTERNS`)."""
        if kind == WEIGHT:
            return patterns.WEIGHT_FORMAT.name if self.is_conv[c] else patterns.WEIGHT_REBUILT.name
        if self.is_conv[c]:
            return patterns.CONV_NO_KERNEL.name
        origin = int(self.forward_seq[c]) if self.phase[c] == "backward" else -1
        ins = self.image_inputs(c)
        src = ins[0] if ins else next((r for r in self.rows(c) if not self.is_out[r]), -1)
        if origin >= 0 and self._inplace_on_view(origin):
            return patterns.INPLACE_VIEW.name
        if origin >= 0 and self._channel_slice(origin):
            return patterns.CHANNEL_SLICE.name
        if origin >= 0 and self._spatial_reduction(origin):
            return patterns.MEAN_BACKWARD.name
        if kind == CONVERTS:
            if self.mixed_join(c):
                return patterns.MIXED_JOIN.name
            if src >= 0 and self.ndim[src] == self.rank[src] + 1:
                return patterns.CHANNEL_SHUFFLE.name
            if self._reshaped(c):
                return patterns.RESHAPE_MERGE.name
            return patterns.EXPLICIT_COPY.name
        if kind == JOINS:
            return patterns.JOINS.name
        if src >= 0 and (self.cdim[src] != 1 or self.ndim[src] > self.rank[src]):
            return patterns.STACK_REDUCE.name
        if src >= 0 and self.label[src].startswith("ambiguous"):
            return patterns.NC11_BROADCAST.name
        return patterns.NO_CL_KERNEL.name if self._kernel_missing(c) else patterns.LOSES.name

    def _reshaped(self, c: int) -> bool:
        """The copy ``c`` is a reshape's: an undecomposed reshape (or a matrix product folding
        its operand) that had to copy, a copy that ``_unsafe_view`` consumes (only reshape's
        decomposition makes one), or a copy viewed to another rank."""
        if rules.folds(self.op[c]):
            return True
        for x in self.graph.consumers.get(c, []):
            if rules.op_packet(self.op[x]) == "aten._unsafe_view":
                return True
            out = self.output_row(x)
            if self.view.kind[x] == rules.VIEW and out >= 0 and self.ndim[out] != self.ndim[self.output_row(c)]:
                return True
        return False

    def _inplace_on_view(self, e: int) -> bool:
        """``e`` wrote, in place, a tensor that is a view of another."""
        first = next((r for r in self.rows(e) if not self.is_out[r]), -1)
        if first < 0 or not any(self.is_out[r] for r in self.rows(e)):
            return False
        out = self.output_row(e)
        tid = self.view.tensors["tid"].to_numpy()
        return tid[out] == tid[first] and self.graph.root[tid[first]] != tid[first]

    def _channel_slice(self, e: int) -> bool:
        """``e`` is a view that took some of its image input's channels."""
        if self.view.kind[e] != rules.VIEW or not rules.op_packet(self.op[e]).startswith(_SLICES):
            return False
        ins = self.image_inputs(e)
        out = self.output_row(e)
        if not ins or out < 0:
            return False
        a, b = parse_tuple(self.shape[ins[0]]), parse_tuple(self.shape[out])
        c = int(self.cdim[ins[0]])
        return len(a) == len(b) and a[c] != b[c] and a[:c] + a[c + 1:] == b[:c] + b[c + 1:]

    def _spatial_reduction(self, e: int) -> bool:
        """``e`` reduced an image over all its spatial dimensions (a global mean or pool)."""
        ins = self.image_inputs(e)
        out = self.output_row(e)
        if not ins or out < 0:
            return False
        a, b = parse_tuple(self.shape[ins[0]]), parse_tuple(self.shape[out])
        spatial = int(np.prod(a[2:])) if len(a) > 2 else 1
        return spatial > 1 and len(a) >= 4 and int(np.prod(b)) * spatial == int(np.prod(a))

    # -- what a fix replaces ------------------------------------------------------------------
    def replaced(self, members: list[int], pattern: str) -> tuple[list[int], list[int]]:
        """(the ops a fix of the cause at ``members`` replaces, those of them that the one pass
        replacing them stands in for, :attr:`.patterns.Pattern.replaces`).

        Replaced: the members that are not copies (a copy is priced as a symptom) and the
        backward ops of the forward ones; where the fix is one pass, also the forward op whose
        backward a member is (the mean whose backward writes contiguous) and the stack a
        stacked reduction reads when nothing else reads it, which the pass absorbs."""
        own = [m for m in members if not self.copy[m]]
        absorbed = []
        if patterns.pattern(pattern).replaces == patterns.WRITE:
            own += [int(self.forward_seq[m]) for m in own if self.phase[m] == "backward" and self.forward_seq[m] >= 0]
            for m in own:
                ins = self.image_inputs(m)
                if ins and self.ndim[ins[0]] > self.rank[ins[0]]:
                    p = int(self.graph.producer[ins[0]])
                    if p >= 0 and set(self.graph.consumers.get(p, [])) == {m} and self._stacks(p, ins[0]):
                        absorbed.append(p)
        passes = self._with_backward(own)
        return sorted(set(passes) | set(self._with_backward(absorbed))), passes

    def _stacks(self, p: int, row: int) -> bool:
        """Whether ``p`` made the stacked dimension of its result ``row`` (its inputs have fewer
        dimensions): a stack only moves data, which the fix's one pass absorbs; an op on the
        stacked tensor (a weighting ``x * attn``) does work the fix still does per branch."""
        ins = self.graph.act_rows.get(p, [])
        return bool(ins) and all(self.ndim[r] < self.ndim[row] for r in ins)

    def _with_backward(self, events: list[int]) -> list[int]:
        forward = [e for e in events if self.phase[e] != "backward"]
        backward = np.flatnonzero(np.isin(self.forward_seq, forward)) if forward else []
        return sorted(set(events) | {int(b) for b in backward})

    def result_bytes(self) -> np.ndarray:
        """Per event, the bytes of its (first) result; 0 for an event without one."""
        out = np.zeros(len(self.op))
        rows = np.flatnonzero(self.is_out)
        events, first = np.unique(self.seq[rows], return_index=True)
        out[events] = self.size[rows[first]]
        return out

    def pass_bytes(self, events: list[int]) -> list[float]:
        """The bytes a pass standing in for each of ``events`` moves: per op that is not a view,
        the larger of its result and its largest image input."""
        moved = []
        for e in events:
            if self.view.kind[e] == rules.VIEW:
                continue
            out = self.output_row(e)
            sizes = [int(self.size[r]) for r in self.image_inputs(e)] + ([int(self.size[out])] if out >= 0 else [])
            moved.append(float(max(sizes, default=0)))
        return moved

    def _kernel_missing(self, e: int) -> bool:
        """Coverage says this op never, or not always, keeps channels_last on this device."""
        cov = self.coverage
        if cov is None or cov.empty:
            return False
        row = cov[cov["op"] == self.op[e]]
        return bool(len(row)) and row["support"].isin(["none", "partial"]).any()

    # -- what the audited size made -----------------------------------------------------------
    def size_note(self, e: int) -> str:
        """:meth:`empty_note`, else :meth:`pixel_note` of event ``e``."""
        return self.empty_note(e) or self.pixel_note(e)

    def empty_note(self, e: int) -> str:
        """Why cause ``e`` may exist only at the audited size because it read a tensor with no
        elements (a level no element fell in: an FPN level without a region); "" where it read
        none (:meth:`pixel_note` for the rest)."""
        empty = [] if rules.is_factory(self.op[e]) else [  # a factory reads no data
            r for r in self.rows(e) if not self.is_out[r] and self.ndim[r] >= 2 and 0 in parse_tuple(self.shape[r])]
        if not empty:
            return ""
        shapes = ", ".join(dict.fromkeys("x".join(map(str, parse_tuple(self.shape[r]))) for r in empty))
        return (f"at the audited size it reads tensors with no elements ({shapes}: a level no element fell in); "
                "where every level gets elements it may not happen: audit at the model's own input size too")

    def pixel_note(self, e: int) -> str:
        """Why cause ``e`` may exist only at the audited input size, "" where nothing says so: it
        reads or writes a map whose spatial dimensions are all 1 that an op which is no global
        reduction made from a larger one (a strided convolution or pooling of a map only 2 or 3
        wide at a small input): a 1×1 map is in both formats at once, so PyTorch writes what
        follows it contiguous, where a larger map keeps the format."""
        made = self._shrunk_by(e)
        if made is None and self.phase[e] == "backward" and self.forward_seq[e] >= 0:
            made = self._shrunk_by(int(self.forward_seq[e]))  # the forward op it is the backward of
        if made is None:
            return ""
        op = rules.op_packet(self.op[made]).removeprefix("aten.")
        shape = "x".join(map(str, parse_tuple(self.shape[self.output_row(made)])))
        return (f"at the audited size the map here is 1x1 ({shape}, made by the {op} at "
                f"{self.source[made] or self.module[made]}), in both formats at once; at a larger input it is not, "
                "and the cause may not happen: audit at the model's own input size too")

    def _one_pixel(self, r: int) -> bool:
        shape = parse_tuple(self.shape[r])
        return len(shape) in (4, 5) and 0 not in shape and all(s == 1 for s in shape[2:])

    def _shrinks(self, p: int) -> bool | None:
        """Whether ``p`` made a 1x1 map from a larger one (True), passed a 1x1 map on (None), or
        neither (False)."""
        out = self.output_row(p)
        if out < 0 or not self._one_pixel(out):
            return False
        ins = [r for r in self.image_inputs(p) if self.ndim[r] == self.ndim[out]]
        if not ins:
            return False
        return None if all(self._one_pixel(r) for r in ins) else True

    def _shrunk_by(self, e: int, limit: int = 64) -> int | None:
        """The op that made the 1x1 map ``e`` reads or writes from a larger map, where it is no
        global reduction (:meth:`size_note`); None where there is none."""
        p, steps = e, 0
        while p >= 0 and steps < limit:
            steps += 1
            shrinks = self._shrinks(p)
            if shrinks:
                return p if self._size_dependent(p) else None
            ins = [r for r in self.image_inputs(p) if self._one_pixel(r)]
            if not ins:
                return None
            p = int(self.graph.producer[ins[0]])
        return None

    def _size_dependent(self, p: int) -> bool:
        """Whether ``p``, which made a 1x1 map from a larger one, makes one only at small sizes:
        no reduction (a mean over H and W) and no adaptive pool, which make one at any size; a
        convolution (its kernel and stride, fixed, cover this input's size only), or a pooling
        of a map at most 3 wide (a stride-2 pool of a 2x2 map; a pool whose kernel is the input's
        size, a global one, reads the map whatever its size)."""
        op = str(self.op[p])
        if "adaptive" in op or _reduces(op):
            return False
        if self.is_conv[p]:
            return True
        ins = [r for r in self.image_inputs(p) if self.ndim[r] in (4, 5)]
        return bool(ins) and all(s <= 3 for s in parse_tuple(self.shape[ins[0]])[2:])

    def support(self, e: int) -> str:
        cov = self.coverage
        if cov is None or cov.empty:
            return "unknown"
        row = cov[cov["op"] == self.op[e]]
        return ", ".join(sorted(set(row["support"]))) if len(row) else "unknown"




def cause_table(tracer: CauseTracer | FlowView, *, facts: pd.DataFrame | None = None,
                coverage: pd.DataFrame | None = None, hidden: pd.DataFrame | None = None
                ) -> tuple[pd.DataFrame, np.ndarray]:
    """(one row per cause, costliest first; the cause id of every event, 0 where none), traced
    by ``tracer`` (or by a new one over a ``FlowView``, the ``facts`` and the ``coverage``).

    Causes are grouped per line: (phase, op, source, kind) when source lines were recorded,
    (phase, module, op, kind) otherwise. ``hotspots`` counts the hotspot ops a cause leads to,
    itself included; ``bytes``, ``time_us`` (their kernel time) and ``saving_us`` (what a fix
    is expected to save, :mod:`.timing`) sum theirs, and a rebuilt weight's own copy.
    ``time_us`` is in two parts that add up to it: ``hotspot_us``, the cause's hotspot ops, and
    ``replaced_us``, the other ops its fix replaces or removes (the ops its pattern replaces
    with one pass that keeps the format, a weight's rebuilding copy), which is why a cause's
    time, and what its fix saves, can exceed its hotspots'. Timed
    causes rank by ``saving_us``, untimed ones by ``bytes``. A hotspot the recording mode made
    itself (``events.artifact``: an out-of-place gradient sum) and that nothing upstream
    explains gets no cause: a plain run does not do it.
    """
    if isinstance(tracer, FlowView):
        tracer = CauseTracer(tracer, facts, coverage)
    view = tracer.view
    ops = view.ops
    hot = np.flatnonzero(ops["hotspot"].to_numpy())
    artifact = ops["artifact"].to_numpy() if "artifact" in ops else np.zeros(len(ops), dtype=bool)
    traced = {int(h): tracer.cause(int(h)) for h in hot}
    traced = {h: c for h, c in traced.items() if not (artifact[c[0]] and c[0] == h)}
    cause_events = {c for c, _ in traced.values()}
    roots = {c: tracer.root(c, cause_events) for c in cause_events}
    kinds: dict[int, str] = {}
    for c, k in traced.values():
        kinds.setdefault(roots[c], k)
    keys = {r: _group_key(view, r, kinds[r]) for r in set(roots.values())}
    order = {k: i for i, k in enumerate(dict.fromkeys(keys[r] for r in sorted(keys)))}
    group_of_event = np.zeros(len(ops), dtype=np.int64)
    for h, (c, _) in traced.items():
        group_of_event[h] = order[keys[roots[c]]] + 1
    result_bytes = tracer.result_bytes()
    cost = copy_cost(ops, hidden, result_bytes)
    table = _cause_rows(view, tracer, keys, kinds, order, group_of_event,
                        saving_us(ops, hidden, result_bytes, cost), hidden, (cost, _pass_cost(tracer)), result_bytes)
    if table.empty:
        return table[CAUSE_COLUMNS], group_of_event
    by = ["saving_us", "time_us", "bytes"] if timed(ops) else ["bytes"]
    ranked = table.sort_values([*by, "first_seq"], ascending=[False] * len(by) + [True], kind="stable")
    renumber = np.zeros(len(order) + 1, dtype=np.int64)
    renumber[ranked["cause"].to_numpy()] = np.arange(1, len(ranked) + 1)
    ranked = ranked.assign(cause=renumber[ranked["cause"].to_numpy()]).reset_index(drop=True)
    return ranked[CAUSE_COLUMNS], renumber[group_of_event]


def _pass_cost(tracer: CauseTracer):
    """The cost of a pass, from the step's format-keeping ops that are no convolution or copy."""
    ops = tracer.view.ops
    if "time_us" not in ops:
        return None
    keep = ((ops["kind"].to_numpy() == rules.PRESERVES) & ~ops["is_conv"].to_numpy().astype(bool)
            & ~op_flags(ops["op"], rules.is_copy) & ops["time_us"].notna().to_numpy())
    events = np.flatnonzero(keep)
    return pass_cost(ops, events, tracer.pass_bytes(events.tolist()))


def _group_key(view: FlowView, r: int, kind: str) -> tuple:
    if view.source[r]:
        return view.phase[r], view.op[r], view.source[r], kind
    return view.phase[r], view.module[r], view.op[r], kind


def _cause_rows(view, tracer: CauseTracer, keys, kinds, order, group_of_event, saving: np.ndarray,
                hidden: pd.DataFrame | None, costs: tuple, result_bytes: np.ndarray) -> pd.DataFrame:
    """One row per cause; ``costs``: (:func:`copy_cost`, :func:`pass_cost`)."""
    ops = view.ops
    nbytes = ops["bytes"].to_numpy()
    time = ops["time_us"].to_numpy() if "time_us" in ops else np.full(len(ops), np.nan)
    rows = []
    for key, number in order.items():
        members = sorted(r for r, k in keys.items() if k == key)
        first = members[0]
        kind = kinds[first]
        pattern = tracer.pattern(first, kind)
        symptoms = np.flatnonzero(group_of_event == number + 1)
        # a weight rebuilt every step: the rebuilding copy is part of its cost
        rebuilt = [m for m in members if kind == WEIGHT and not tracer.is_conv[m] and m not in set(symptoms.tolist())
                   and tracer.output_row(m) >= 0]
        rebuilt_bytes = sum(int(tracer.size[tracer.output_row(m)]) for m in rebuilt)
        own, passes = ([], []) if kind == WEIGHT else tracer.replaced(members, pattern)
        others = [int(h) for h in symptoms if h not in set(own)]
        own_saving = own_saving_us(ops, hidden, pattern, own, tracer.pass_bytes(passes), *costs)
        total = _total(saving, others, 0.0) + own_saving + _total(time, rebuilt, 0.0)
        parts = {**{e: float(time[e]) for e in [*own, *rebuilt] if time[e] == time[e]},
                 **{e: float(saving[e]) for e in others if saving[e] == saving[e]}}
        trusted, note = estimate_note(ops, result_bytes, parts, total, len(symptoms))
        rows.append({
            "cause": number + 1, "phase": view.phase[first], "module": view.module[first],
            "module_type": str(ops.at[first, "module_type"]), "op": view.op[first], "kind": kind,
            "pattern": pattern, "source": view.source[first], "calls": len(members),
            "hotspots": len(symptoms), "bytes": int(nbytes[symptoms].sum()) + rebuilt_bytes,
            "time_us": _total(time, sorted({*symptoms.tolist(), *own, *rebuilt})),
            "hotspot_us": _total(time, symptoms.tolist()),
            "replaced_us": _total(time, sorted({*own, *rebuilt} - set(symptoms.tolist())), 0.0),
            "saving_us": total, "saving_trusted": trusted, "saving_note": note,
            "fix": _fix_text(view, tracer, first, pattern, members, symptoms.tolist()), "first_seq": first,
        })
    if not rows:
        numeric = {"cause": "int64", "calls": "int64", "hotspots": "int64", "bytes": "int64",
                   "time_us": "float64", "hotspot_us": "float64", "replaced_us": "float64", "saving_us": "float64", "saving_trusted": "bool", "first_seq": "int64"}
        return pd.DataFrame({c: pd.Series(dtype=numeric.get(c, "object")) for c in CAUSE_COLUMNS})
    return pd.DataFrame(rows)


def _total(values: np.ndarray, rows: list[int], empty: float = float("nan")) -> float:
    """The sum over ``rows``, NaN when none of them is measured (``empty`` when there are none)."""
    if not rows:
        return empty
    picked = values[rows]
    return float(np.nansum(picked)) if not np.isnan(picked).all() else float("nan")


@functools.lru_cache(maxsize=1024)
def _reduces(op: str) -> bool:
    """Whether the aten op named ``op`` is a reduction (asked of torch's own tags)."""
    namespace, _, rest = op.partition(".")
    name, _, overload = rest.partition(".")
    try:
        return is_reduction(getattr(getattr(getattr(torch.ops, namespace), name), overload or "default"))
    except (AttributeError, RuntimeError):
        return False


def _fix_text(view: FlowView, tracer: CauseTracer, c: int, pattern: str, members: list[int] = (),
              symptoms: list[int] = ()) -> str:
    rank = next((int(tracer.rank[r]) for r in tracer.image_inputs(c)), 4)
    out = tracer.output_row(c)
    fmt = base_format(tracer.label[out]) if out >= 0 else "contiguous"
    if fmt not in ("contiguous", *_CL):  # not an image itself (a token tensor): its dense order
        fmt = "another"
    cl = "channels_last_3d" if rank == 5 else "channels_last"
    text = patterns.pattern(pattern).fix_text(cl=cl, fmt=fmt, op=rules.op_packet(view.op[c]).removeprefix("aten."),
                                              dims=rank - 2, support=tracer.support(c),
                                              to_memory_order=channels_last_order(rank),
                                              from_memory_order=logical_order(rank))
    members = list(members) or [c]
    # a level with no element made the cause only where every call of it read one (an FPN
    # level without regions beside levels with them is a cause at any size)
    empty = [tracer.empty_note(m) for m in members[:_NOTE_CALLS]]
    note = empty[0] if all(empty) else ""
    # a 1x1 map made the cause where every call of it, or every symptom of it, reads one (a
    # symptom that does beside one that does not is no sign)
    for events in (members, symptoms):
        notes = [tracer.pixel_note(m) for m in events[:_NOTE_CALLS]]
        if not note and notes and all(notes):
            note = notes[0]
    if note:
        tracer.size_notes[c] = note
    return f"{text} ({note})" if note else text


#: how many calls of a cause's line :func:`_fix_text` asks for a note on the audited size
_NOTE_CALLS = 16
