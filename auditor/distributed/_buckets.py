"""DDP buckets: copies into and out of the buffers that collectives communicate.

DDP copies each gradient into a view of a flat bucket (``mul.out`` or ``copy_``), all-reduces
the bucket, and without bucket views copies the result back out. Whether those copies change
the layout, or read a bucket region through other strides than it was written with, is found
here from the log alone.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from .._analysis._activations import floating_rows
from .._recording._formats import CHANNELS_LAST, CHANNELS_LAST_3D, CONTIGUOUS, OTHER, base_format
from .._result import Audit

#: Op namespaces of collectives as they reach a dispatch mode (``c10d.allreduce_.default``, ...).
COLLECTIVE_NAMESPACES = ("c10d", "_c10d_functional", "c10d_functional")

BUCKET_COLUMNS = [
    "seq", "phase", "stage", "op", "collective", "shape", "from_format", "to_format",
    "from_strides", "to_strides", "bytes", "layout_change", "view_mismatch", "linked",
]
BUCKET_HOTSPOT_COLUMNS = [
    "phase", "stage", "op", "collective", "from_format", "to_format", "view_mismatch",
    "count", "bytes", "first_seq",
]

_BUCKET_DTYPES = {"seq": "int64", "bytes": "int64", "layout_change": "bool", "view_mismatch": "bool"}
_ORDERED = (CONTIGUOUS, CHANNELS_LAST, CHANNELS_LAST_3D, OTHER)


def _order(label: str) -> str | None:
    base = base_format(label)
    return base if base in _ORDERED else None


def _changes_layout(a: str, b: str) -> bool:
    oa, ob = _order(a), _order(b)
    return oa is not None and ob is not None and oa != ob


def labels_of(col: pd.Series) -> np.ndarray:
    """A categorical column as an object array of strings, without converting row by row."""
    cats = np.array([str(c) for c in col.cat.categories] + [""], dtype=object)
    return cats[col.cat.codes.to_numpy()]


def bucket_ops(audit: Audit) -> pd.DataFrame:
    """Copies into and out of the buffers that collectives communicate, one row per op.

    A *buffer* is a tensor handed to a collective (``c10d.allreduce_`` on DDP's flat gradient
    bucket, ``c10d.broadcast_`` on a coalesced state buffer); its recorded views are the per-
    parameter bucket views. Bucket views created before the recording began (DDP makes them at
    construction and when it rebuilds its buckets at the second step) are *inferred*: tensors
    the log never produced, written in place in backward, with the shape, dtype and offset of a
    recorded view of a buffer, and not a gradient the bucket is copied back to.

    Columns: ``stage`` is ``into`` (writes a buffer from another tensor: DDP's ``mul.out`` or
    ``copy_`` of a gradient, autograd's ``add_`` into a gradient that is a bucket view), ``out``
    (reads a buffer and writes another tensor: the ``copy_`` back to ``.grad``, an optimizer
    reading a gradient that is a bucket view) or ``flatten`` (the conversion that fed a 1-D
    buffer, as in DDP's coalesced broadcasts). ``layout_change``: source and destination are
    in different physical orders. ``view_mismatch``: the same bucket region was written through
    one layout and read through another, so the values come out permuted (DDP built its bucket
    views for strides the parameters no longer have). ``linked`` is ``view`` or ``inferred``.
    """
    empty = pd.DataFrame({c: pd.Series(dtype=_BUCKET_DTYPES.get(c, "object")) for c in BUCKET_COLUMNS})
    if not len(audit.events) or not len(audit.tensors):
        return empty
    scan = _BucketScan(audit)
    if not scan.collective.any():
        return empty
    scan.find_buffers()
    scan.infer_preexisting_views()
    scan.classify_copies()
    if not scan.rows:
        return empty
    df = pd.DataFrame(scan.rows, columns=BUCKET_COLUMNS)
    df["view_mismatch"] = scan.view_mismatch(df["stage"].to_numpy())
    df = df.sort_values("seq", kind="stable", ignore_index=True)
    return df.astype({"seq": np.int64, "bytes": np.int64, "layout_change": bool})


class _BucketScan:
    """The steps of :func:`bucket_ops` over one audit's log, sharing its arrays."""

    def __init__(self, audit: Audit):
        ev, t = audit.events, audit.tensors
        self.audit = audit
        self.op_names = labels_of(ev["op"])
        self.phase = labels_of(ev["phase"])
        self.collective = np.array([o.split(".", 1)[0] in COLLECTIVE_NAMESPACES for o in self.op_names], dtype=bool)
        self.seq = t["seq"].to_numpy()
        self.tid = t["tid"].to_numpy()
        self.is_in = (t["role"] == "input").to_numpy()
        self.is_view = t["is_view"].to_numpy()
        self.is_param = t["is_param"].to_numpy()
        self.shape, self.dtype = labels_of(t["shape"]), labels_of(t["dtype"])
        self.fmt, self.strides = labels_of(t["format"]), labels_of(t["strides"])
        self.offset = t["storage_offset"].to_numpy()
        self.nbytes = t["bytes"].to_numpy()
        self.ndim = t["ndim"].to_numpy()
        self.position = t["position"].to_numpy()
        self.floating = floating_rows(t)
        self.root = audit.flow().root
        self.eff_root = self.root.copy()  # roots with inferred bucket views moved under their buffer
        self.out_rows = np.flatnonzero(~self.is_in & ~self.is_view)
        self.rows: list[tuple] = []
        self.bucket_side: list[int] = []  # per row of ``rows``: the tensor row on the bucket's side

    def find_buffers(self) -> None:
        """Buffers are the roots of tensors handed to a collective; ``in_bucket`` is per tid."""
        tid, root = self.tid, self.root
        comm_rows = np.flatnonzero(self.collective[self.seq] & self.is_in)
        self.first_collective: dict[int, str] = {}
        for r in comm_rows:
            self.first_collective.setdefault(int(root[tid[r]]), self.op_names[self.seq[r]])
        self.in_bucket = np.isin(root, np.unique(root[tid[comm_rows]]))
        self.inferred: set[int] = set()

    def infer_preexisting_views(self) -> None:
        """Tensors seen first as inputs, written in place in backward, shaped like a recorded
        bucket view and not a gradient copied out of a bucket: bucket views made before the
        recording began."""
        tid, seq, is_in, root = self.tid, self.seq, self.is_in, self.root
        size = len(root)
        first_row = np.full(size, -1, dtype=np.int64)
        first_row[tid[::-1]] = np.arange(len(tid))[::-1]
        preexisting = np.zeros(size, dtype=bool)
        seen = first_row >= 0
        preexisting[seen] = is_in[first_row[seen]]
        param = np.zeros(size, dtype=bool)
        param[tid[self.is_param]] = True
        pairs = pd.DataFrame({"seq": seq, "tid": tid, "is_in": is_in})
        inplace = pairs[~pairs["is_in"]].merge(pairs[pairs["is_in"]], on=["seq", "tid"])
        inplace_bw = inplace[self.phase[inplace["seq"].to_numpy()] == "backward"]["tid"].unique()
        # gradients: written from a buffer by an op that is not itself writing a buffer
        reads_buffer = np.zeros(len(self.op_names), dtype=bool)
        reads_buffer[seq[is_in & self.in_bucket[tid] & ~self.collective[seq]]] = True
        out_rows = self.out_rows
        grads = set(tid[out_rows[reads_buffer[seq[out_rows]] & ~self.in_bucket[tid[out_rows]]]].tolist())
        keys: dict[tuple, int] = {}
        for r in np.flatnonzero(~is_in & self.is_view & self.in_bucket[tid]):
            keys.setdefault((self.shape[r], self.dtype[r], int(self.offset[r])), int(root[tid[r]]))
        for x in inplace_bw:
            if self.in_bucket[x] or not preexisting[x] or param[x] or x in grads:
                continue
            r = first_row[x]
            hit = keys.get((self.shape[r], self.dtype[r], int(self.offset[r])))
            if hit is not None:
                self.inferred.add(int(x))
                moved = root == x  # the tensor and any view recorded of it
                self.eff_root[moved] = hit
                self.in_bucket[moved] = True

    def classify_copies(self) -> None:
        """One row per op that writes a buffer from elsewhere (``into``, and the conversion that
        fed a flattened buffer), or reads one into another tensor (``out``)."""
        tid, seq, is_in, in_bucket = self.tid, self.seq, self.is_in, self.in_bucket
        touching = np.unique(seq[in_bucket[tid] & self.floating & ~self.collective[seq]])
        starts = np.searchsorted(seq, touching, side="left")
        ends = np.searchsorted(seq, touching, side="right")
        self.producer_row = np.full(len(self.root), -1, dtype=np.int64)  # tid -> the first row that wrote it
        self.producer_row[tid[self.out_rows][::-1]] = self.out_rows[::-1]
        self.flattened: set[int] = set()
        for e, lo, hi in zip(touching, starts, ends):
            rs = np.arange(lo, hi)
            rs = rs[self.floating[rs]]
            outs = rs[~is_in[rs]]
            if len(outs) and self.is_view[outs].all():
                continue  # making a bucket view moves no data
            outs = outs[~self.is_view[outs]]
            out_tids = set(tid[outs].tolist())
            ins = rs[is_in[rs]]
            b_outs = outs[in_bucket[tid[outs]]]
            srcs = [r for r in ins if not in_bucket[tid[r]] and tid[r] not in out_tids]
            if len(b_outs) and srcs:
                self._copy_into(int(e), srcs, b_outs[0])
                continue
            b_ins = [r for r in ins if in_bucket[tid[r]] and tid[r] not in out_tids]
            o_outs = outs[~in_bucket[tid[outs]]]
            if b_ins and len(o_outs):
                self._add(int(e), "out", b_ins[0], o_outs[0], b_ins[0])

    def _copy_into(self, e: int, srcs: list[int], dst: int) -> None:
        self._add(e, "into", srcs[0], dst, dst)
        ops_table = self.audit.ops()
        seq, tid = self.seq, self.tid
        for s in srcs:  # a conversion whose result was flattened (a view) into the buffer
            base = self.root[tid[s]]
            p_out = int(self.producer_row[base])
            if base == tid[s] or p_out < 0 or self.ndim[s] >= self.ndim[p_out] or self.position[p_out] != 0:
                continue
            p = int(seq[p_out])
            p_rows = np.arange(*np.searchsorted(seq, [p, p + 1]))
            p_in = p_rows[self.is_in[p_rows]]
            # the op that fed the buffer changed the layout (buffers hold weights and gradients
            # too, so this reads the labels, not the image classification)
            if p in self.flattened or ops_table.at[p, "is_conv"] or not len(p_in) or \
                    not _changes_layout(self.fmt[p_in[0]], self.fmt[p_out]):
                continue
            self.flattened.add(p)
            self._add(p, "flatten", p_in[0], p_out, dst)

    def _add(self, e: int, stage: str, src: int, dst: int, side: int) -> None:
        linked = "inferred" if stage != "flatten" and int(self.root[self.tid[side]]) in self.inferred else "view"
        self.rows.append((
            e, self.phase[e], stage, self.op_names[e], self.first_collective.get(int(self.eff_root[self.tid[side]]), ""),
            self.shape[src], self.fmt[src], self.fmt[dst], self.strides[src], self.strides[dst], int(self.nbytes[src]),
            _changes_layout(self.fmt[src], self.fmt[dst]), False, linked,
        ))
        self.bucket_side.append(side)

    def view_mismatch(self, stage: np.ndarray) -> np.ndarray:
        """Per row: its bucket region was written through one layout and read through another."""
        def region(x):
            return int(self.eff_root[self.tid[x]]), int(self.offset[x]), self.shape[x]
        strides: dict[tuple, set] = {}
        for i, x in enumerate(self.bucket_side):
            if stage[i] != "flatten":
                strides.setdefault(region(x), set()).add(self.strides[x])
        return np.array([stage[i] != "flatten" and len(strides[region(x)]) > 1
                         for i, x in enumerate(self.bucket_side)], dtype=bool)


def bucket_hotspots(audit: Audit) -> pd.DataFrame:
    """The :func:`bucket_ops` that change the layout or read a region through another layout
    than it was written with, grouped by (phase, stage, op, collective, from, to), largest
    ``bytes`` first. Empty when DDP's bucketing keeps every gradient's layout."""
    return group_bucket_ops(bucket_ops(audit))


def group_bucket_ops(ops: pd.DataFrame) -> pd.DataFrame:
    """:func:`bucket_hotspots` of an existing :func:`bucket_ops` table."""
    bad = ops[ops["layout_change"] | ops["view_mismatch"]]
    if bad.empty:
        numeric = {"count": "int64", "bytes": "int64", "first_seq": "int64", "view_mismatch": "bool"}
        return pd.DataFrame({c: pd.Series(dtype=numeric.get(c, "object")) for c in BUCKET_HOTSPOT_COLUMNS})
    g = bad.groupby(
        ["phase", "stage", "op", "collective", "from_format", "to_format", "view_mismatch"], sort=False
    ).agg(count=("seq", "size"), bytes=("bytes", "sum"), first_seq=("seq", "min")).reset_index()
    g = g.sort_values(["bytes", "first_seq"], ascending=[False, True], ignore_index=True)
    return g[BUCKET_HOTSPOT_COLUMNS]
