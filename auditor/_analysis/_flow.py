"""The data-flow graph of one event log: which op produced each tensor an op reads.

Every analysis that follows data (hotspots, causes, fixes, plans, DDP buckets) uses this one
graph. A read links to the last earlier op that wrote the tensor or any alias of it: views are
followed to their base tensor and in-place ops count as writes, so neither breaks a chain.
Links are kept per tensor row; those inside one phase are the graph's edges, and those that
cross phases (backward reading an activation saved in forward) are kept for the analyses
that need them.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from .._recording import _rules as rules
from ._activations import activation_inputs, op_flags


def view_roots(tensors: pd.DataFrame, n_events: int) -> np.ndarray:
    """For every tid, the tid it is a view of, followed to the end (views of views of ...).

    The base of a view result is its op's first tensor input; the first recorded base wins.
    In-place metadata ops (``as_strided_``) alias themselves and are no link.
    """
    tid = tensors["tid"].to_numpy()
    parent = np.arange(int(tid.max()) + 1 if len(tid) else 0, dtype=np.int64)
    if not len(tid):
        return parent
    seq = tensors["seq"].to_numpy()
    is_out = (tensors["role"] == "output").to_numpy()
    first_in = np.full(n_events, -1, dtype=np.int64)
    ins = np.flatnonzero(~is_out)
    first_in[seq[ins][::-1]] = ins[::-1]
    views = np.flatnonzero(is_out & tensors["is_view"].to_numpy())
    base = first_in[seq[views]]
    ok = base >= 0
    return follow_links(len(parent), tid[views[ok]], tid[base[ok]])


def follow_links(n: int, child: np.ndarray, parent: np.ndarray) -> np.ndarray:
    """For each of ``n`` ids, the id its chain of links ``child -> parent`` ends at (the first
    link of a child wins; a link to itself is none)."""
    up = np.arange(n, dtype=np.int64)
    keep = child != parent
    up[child[keep][::-1]] = parent[keep][::-1]
    root = up.copy()
    for _ in range(256):
        nxt = up[root]
        if np.array_equal(nxt, root):
            break
        root = nxt
    return root


def flow_links(events: pd.DataFrame, tensors: pd.DataFrame, roots: np.ndarray | None = None) -> pd.DataFrame:
    """The producer of every tensor input: one row per input row of ``tensors`` that has one.

    Columns: ``row`` (index into ``tensors``), ``consumer`` and ``producer`` (event seqs) and
    ``same_phase``. A consumer links to the last earlier event that wrote the tensor or any
    alias of it (views are followed to their base, in-place ops count as writes), so neither
    views nor in-place ops break a chain.
    """
    is_out = (tensors["role"] == "output").to_numpy()
    tid = tensors["tid"].to_numpy()
    seq = tensors["seq"].to_numpy()
    if roots is None:
        roots = view_roots(tensors, len(events))
    root = roots[tid] if len(tid) else tid
    phase = events["phase"].cat.codes.to_numpy()

    rows = np.arange(len(tensors))
    writes = pd.DataFrame({"seq": seq[is_out], "root": root[is_out]})
    writes = writes.drop_duplicates().sort_values("seq", kind="stable")
    writes["producer"] = writes["seq"]
    reads = pd.DataFrame({"seq": seq[~is_out], "root": root[~is_out], "row": rows[~is_out]})
    reads = reads.sort_values("seq", kind="stable")
    linked = pd.merge_asof(reads, writes, on="seq", by="root", allow_exact_matches=False)
    linked = linked.dropna(subset=["producer"])
    producer = linked["producer"].astype(np.int64).to_numpy()
    consumer = linked["seq"].to_numpy()
    return pd.DataFrame(
        {
            "row": linked["row"].to_numpy(),
            "consumer": consumer,
            "producer": producer,
            "same_phase": phase[producer] == phase[consumer],
        }
    )


def reachable(n: int, sources: np.ndarray, frm: np.ndarray, to: np.ndarray) -> np.ndarray:
    """Events reachable from ``sources`` by one or more edges (a vectorised breadth-first search)."""
    reached = np.zeros(n, dtype=bool)
    if n == 0 or len(frm) == 0:
        return reached
    order = np.argsort(frm, kind="stable")
    to_sorted = to[order]
    indptr = np.concatenate([[0], np.cumsum(np.bincount(frm, minlength=n))])
    frontier = np.flatnonzero(sources)
    while frontier.size:
        lo, hi = indptr[frontier], indptr[frontier + 1]
        cnt = hi - lo
        total = int(cnt.sum())
        if total == 0:
            break
        idx = np.repeat(lo - np.concatenate([[0], np.cumsum(cnt)[:-1]]), cnt) + np.arange(total)
        nxt = to_sorted[idx]
        nxt = np.unique(nxt[~reached[nxt]])
        reached[nxt] = True
        frontier = nxt
    return reached


class FlowGraph:
    """Producers and consumers of every op of one audit, phase by phase.

    Attributes:
        root: per tid, the base tensor it is a view of (itself when it is no view).
        links: :func:`flow_links`, every input row that has a producer.
        producer, same_phase: per tensor row, its producer's seq (-1: none recorded) and
            whether that producer runs in the consumer's phase.
        activation: per tensor row, an activation input (:mod:`.activations`).
        is_conv: per event, a convolution.
    """

    def __init__(self, events: pd.DataFrame, tensors: pd.DataFrame):
        self.n = len(events)
        self.tensors = tensors
        self.root = view_roots(tensors, self.n)
        self.links = flow_links(events, tensors, self.root)
        rows = self.links["row"].to_numpy()
        self.producer = np.full(len(tensors), -1, dtype=np.int64)
        self.producer[rows] = self.links["producer"].to_numpy()
        self.same_phase = np.zeros(len(tensors), dtype=bool)
        self.same_phase[rows] = self.links["same_phase"].to_numpy()
        self.activation = activation_inputs(tensors)
        self.is_conv = op_flags(events["op"], rules.is_convolution)
        seq = tensors["seq"].to_numpy()
        self.act_rows: dict[int, list[int]] = {}
        for r in np.flatnonzero(self.activation):  # tensors are in recording order, inputs by position
            self.act_rows.setdefault(int(seq[r]), []).append(int(r))
        same = self.links[self.links["same_phase"].to_numpy()].drop_duplicates(["producer", "consumer"])
        self._edges = (same["producer"].to_numpy(), same["consumer"].to_numpy())
        self.consumers: dict[int, list[int]] = {}
        for p, c in zip(*(a.tolist() for a in self._edges)):
            lst = self.consumers.setdefault(p, [])
            if not lst or lst[-1] != c:
                lst.append(c)
        self._walks: dict[tuple, set[int]] = {}

    def edges(self) -> tuple[np.ndarray, np.ndarray]:
        """(producer, consumer) of every same-phase link, each pair once, in consumer order."""
        return self._edges

    def downstream_of(self, sources: np.ndarray) -> np.ndarray:
        """Events a ``sources`` event feeds, directly or through other ops, in its phase."""
        frm, to = self.edges()
        return reachable(self.n, sources, frm, to)

    def upstream_of(self, sources: np.ndarray) -> np.ndarray:
        """Events that feed a ``sources`` event, directly or through other ops, in its phase."""
        frm, to = self.edges()
        return reachable(self.n, sources, to, frm)

    def input_producers(self, e: int, same_phase: bool = True) -> list[int]:
        """Producers of ``e``'s activation inputs, in argument order (-1: none recorded)."""
        out = []
        for r in self.act_rows.get(e, []):
            p = int(self.producer[r])
            out.append(p if p >= 0 and (self.same_phase[r] or not same_phase) else -1)
        return out

    def upstream_convs(self, e: int) -> set[int]:
        """The nearest convolutions feeding ``e``, in its phase."""
        return self._nearest_convs(e, upstream=True)

    def downstream_convs(self, e: int) -> set[int]:
        """The nearest convolutions fed by ``e``, in its phase."""
        return self._nearest_convs(e, upstream=False)

    def _nearest_convs(self, e: int, upstream: bool) -> set[int]:
        key = (e, upstream)
        if key not in self._walks:
            if upstream:
                def step(x):
                    return [p for p in self.input_producers(x) if p >= 0]
            else:
                def step(x):
                    return self.consumers.get(x, [])
            found, seen, stack = set(), {e}, list(step(e))
            while stack:
                x = stack.pop()
                if x in seen:
                    continue
                seen.add(x)
                if self.is_conv[x]:
                    found.add(x)
                else:
                    stack.extend(step(x))
            self._walks[key] = found
        return self._walks[key]


class FlowView:
    """An ops table's columns as plain arrays beside its flow graph, for code that walks the
    data flow op by op (causes, fixes, plans) without going through pandas per step."""

    def __init__(self, ops: pd.DataFrame, graph: FlowGraph):
        self.ops = ops
        self.graph = graph
        self.tensors = graph.tensors
        self.op = ops["op"].astype(str).to_numpy()
        self.module = ops["module"].astype(str).to_numpy()
        self.phase = ops["phase"].astype(str).to_numpy()
        self.source = ops["source"].astype(str).to_numpy()
        self.kind = ops["kind"].astype(str).to_numpy()
        self.is_conv = ops["is_conv"].to_numpy()
        self.act_rows = graph.act_rows
        self.consumers = graph.consumers
        self.input_producers = graph.input_producers
        self.upstream_convs = graph.upstream_convs
        self.downstream_convs = graph.downstream_convs
