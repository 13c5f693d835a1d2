"""Audits of distributed training: one log per rank, merged, and what DDP adds to the picture.

Each rank records its own :class:`~auditor.Audit` with an ordinary :class:`~auditor.FormatAuditor`
(the ``rank`` and ``world_size`` columns come from the default process group) and writes it with
:func:`save_rank_audit`. :func:`merge_rank_audits` reads the files back into a
:class:`RankAudits`, which keeps one Audit per rank: ``seq`` and ``tid`` are numbered per rank, so
the data-flow analyses run rank by rank and never link tensors of two processes
(:meth:`RankAudits.to_audit` renumbers them when one Audit over every rank is wanted).

DDP-specific findings, from the logs alone (nothing here depends on the backend):

* :func:`bucket_ops` / :func:`bucket_hotspots`: copies into and out of the buffers handed to a
  ``c10d`` collective (DDP's gradient buckets, its coalesced state broadcasts) and whether they
  change the layout;
* :func:`check_grad_formats`: every parameter's ``.grad`` in its parameter's format;
* :func:`rank_differences`: hotspot groups that differ between ranks.
"""

from __future__ import annotations

import glob
import os
import re
from collections.abc import Iterable

import numpy as np
import pandas as pd
import torch
from pandas.api.types import union_categoricals

from . import analysis, rules
from .audit import Audit, _fmt_bytes
from .formats import CHANNELS_LAST, CHANNELS_LAST_3D, CONTIGUOUS, OTHER, VIEW_SUFFIX, format_label

#: Op namespaces of collectives as they reach a dispatch mode (``c10d.allreduce_.default``, ...).
COLLECTIVE_NAMESPACES = ("c10d", "_c10d_functional", "c10d_functional")

_RANK_FILE = re.compile(r"\.rank(\d+)\.csv$")
_ORDERED = (CONTIGUOUS, CHANNELS_LAST, CHANNELS_LAST_3D, OTHER)


# -- per-rank files ---------------------------------------------------------------------------


def _current_rank() -> int:
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    return 0


def rank_path(out: str | os.PathLike, rank: int | None = None) -> str:
    """The file one rank writes: ``DIR/audit.rank{rank}.csv`` for a directory, ``x.rank{rank}.csv``
    for ``x.csv``, or ``out.format(rank=rank)`` when ``out`` contains ``{rank}``.

    ``rank`` defaults to this process's rank in the default process group (0 outside one), so
    the same line works unchanged on every rank.
    """
    rank = _current_rank() if rank is None else int(rank)
    out = os.fspath(out)
    if "{rank}" in out:
        return out.format(rank=rank)
    if out.endswith(".csv"):
        return f"{out[:-4]}.rank{rank}.csv"
    return os.path.join(out, f"audit.rank{rank}.csv")


def save_rank_audit(audit: Audit, out: str | os.PathLike = ".") -> str:
    """Write ``audit`` to its rank's file under ``out`` (see :func:`rank_path`); return the path.

    The rank is the one recorded in the audit's ``rank`` column, so a process group that was
    already destroyed does not matter. Directories are created; the write is atomic.
    """
    ranks = audit.events["rank"].unique()
    if len(ranks) > 1:
        raise ValueError(f"the audit holds several ranks {sorted(ranks)}; save one rank's audit")
    path = rank_path(out, int(ranks[0]) if len(ranks) else None)
    parent = os.path.dirname(path)
    if parent:
        os.makedirs(parent, exist_ok=True)
    audit.to_csv(path)
    return path


def _rank_files(paths_or_dir) -> list[str]:
    if isinstance(paths_or_dir, (str, os.PathLike)):
        spec = os.fspath(paths_or_dir)
        if os.path.isdir(spec):
            found = glob.glob(os.path.join(glob.escape(spec), "audit.rank*.csv"))
        elif "{rank}" in spec:
            found = glob.glob(glob.escape(spec).replace(glob.escape("{rank}"), "*"))
        elif glob.has_magic(spec):
            found = glob.glob(spec)
        else:
            found = [spec]
        found = [p for p in found if _RANK_FILE.search(p) or p == spec]
        if not found:
            raise FileNotFoundError(f"no per-rank audit files (*.rank<N>.csv) match {spec!r}")
        return sorted(found)
    return [os.fspath(p) for p in paths_or_dir]


def merge_rank_audits(paths_or_dir, *, allow_missing: bool = False) -> RankAudits:
    """Read per-rank audit files into one :class:`RankAudits`.

    ``paths_or_dir`` is a directory (its ``audit.rank<N>.csv`` files, the names
    :func:`save_rank_audit` gives), a pattern with ``{rank}``
    or glob characters, or a list of paths. The rank of each file is its ``rank`` column (the
    file name's ``rank<N>`` when the log is empty). Two files of one rank, disagreeing world
    sizes and, unless ``allow_missing``, ranks missing from ``0 .. world_size - 1`` raise
    ``ValueError``: a missing file usually means that rank died before writing it.
    """
    audits: dict[int, Audit] = {}
    sizes: set[int] = set()
    for path in _rank_files(paths_or_dir):
        audit = Audit.read_csv(path)
        m = _RANK_FILE.search(path)
        ranks = audit.events["rank"].unique()
        if len(ranks) > 1:
            raise ValueError(f"{path}: holds several ranks {sorted(ranks)}")
        if len(ranks):
            rank = int(ranks[0])
            if m and int(m.group(1)) != rank:
                raise ValueError(f"{path}: the file name says rank {m.group(1)}, the log says rank {rank}")
            sizes.update(int(w) for w in audit.events["world_size"].unique())
        elif m:
            rank = int(m.group(1))
        else:
            raise ValueError(f"{path}: an empty log and no rank<N> in the file name")
        if rank in audits:
            raise ValueError(f"two files for rank {rank} (the second is {path})")
        audits[rank] = audit
    if len(sizes) > 1:
        raise ValueError(f"the files come from different world sizes: {sorted(sizes)}")
    world_size = sizes.pop() if sizes else len(audits)
    missing = sorted(set(range(world_size)) - set(audits))
    if missing and not allow_missing:
        raise ValueError(f"no audit for rank(s) {missing} of world size {world_size}")
    return RankAudits(audits, world_size=world_size)


def _concat(frames: list[pd.DataFrame]) -> pd.DataFrame:
    """Concatenate frames whose categoricals have different categories, keeping them categorical."""
    if not frames:
        return pd.DataFrame()
    out = pd.concat(frames, ignore_index=True)
    for col in frames[0].columns:
        if isinstance(frames[0][col].dtype, pd.CategoricalDtype):
            out[col] = union_categoricals([f[col] for f in frames], sort_categories=False)
    return out


class RankAudits:
    """The audits of one run, one per rank, and the analyses that compare them.

    Analyses run per rank (``seq`` and ``tid`` are per rank, so a merged data flow would link
    unrelated tensors) and their tables are concatenated with a leading ``rank`` column.

    Attributes:
        per_rank: rank -> :class:`~auditor.Audit`, in rank order.
        world_size: the world size the ranks recorded.
    """

    def __init__(self, per_rank: dict[int, Audit], *, world_size: int | None = None):
        self.per_rank = dict(sorted(per_rank.items()))
        self.world_size = world_size if world_size is not None else len(self.per_rank)
        self._bucket_ops: dict[int, pd.DataFrame] = {}

    @property
    def ranks(self) -> list[int]:
        return list(self.per_rank)

    @property
    def complete(self) -> bool:
        return all(a.complete for a in self.per_rank.values())

    def __getitem__(self, rank: int) -> Audit:
        return self.per_rank[rank]

    def __len__(self) -> int:
        return len(self.per_rank)

    @property
    def events(self) -> pd.DataFrame:
        """Every rank's events, rank after rank; ``(rank, seq)`` identifies a row."""
        return _concat([a.events for a in self.per_rank.values()])

    @property
    def tensors(self) -> pd.DataFrame:
        """Every rank's tensors with a leading ``rank`` column; ``tid`` is per rank."""
        return _concat([
            a.tensors.assign(rank=np.int16(r))[["rank", *a.tensors.columns]]
            for r, a in self.per_rank.items()
        ])

    def to_audit(self) -> Audit:
        """Every rank in one :class:`~auditor.Audit`: ``seq`` renumbered to the row position and
        ``tid`` shifted per rank, so no tensor links across ranks. Its hotspot groups add up the
        ranks (the ``rank`` column of ``events`` tells them apart); use :meth:`hotspots` for
        one table per rank."""
        events, tensors = [], []
        seq_off = tid_off = 0
        for a in self.per_rank.values():
            events.append(a.events.assign(seq=a.events["seq"] + seq_off))
            tensors.append(a.tensors.assign(seq=a.tensors["seq"] + seq_off, tid=a.tensors["tid"] + tid_off))
            seq_off += len(a.events)
            tid_off += int(a.tensors["tid"].max()) + 1 if len(a.tensors) else 0
        errors = "; ".join(f"rank {r}: {a.error}" for r, a in self.per_rank.items() if not a.complete)
        return Audit(_concat(events), _concat(tensors), complete=self.complete, error=errors)

    def _per_rank(self, fn) -> pd.DataFrame:
        frames = []
        for r, a in self.per_rank.items():
            df = fn(a)
            df.insert(0, "rank", np.full(len(df), r, dtype=np.int16))
            frames.append(df)
        return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()

    def hotspots(self) -> pd.DataFrame:
        """Each rank's :meth:`Audit.hotspots`, with a ``rank`` column."""
        return self._per_rank(lambda a: a.hotspots())

    def summary(self, depth: int = 1) -> pd.DataFrame:
        """Each rank's :meth:`Audit.summary`, with a ``rank`` column."""
        return self._per_rank(lambda a: a.summary(depth))

    def _rank_bucket_ops(self, audit: Audit) -> pd.DataFrame:
        key = id(audit)
        if key not in self._bucket_ops:
            self._bucket_ops[key] = bucket_ops(audit)
        return self._bucket_ops[key].copy()

    def bucket_ops(self) -> pd.DataFrame:
        """Each rank's :func:`bucket_ops`, with a ``rank`` column."""
        return self._per_rank(self._rank_bucket_ops)

    def bucket_hotspots(self) -> pd.DataFrame:
        """Each rank's :func:`bucket_hotspots`, with a ``rank`` column."""
        return self._per_rank(lambda a: _group_bucket_ops(self._rank_bucket_ops(a)))

    def differences(self, reference: int | None = None) -> pd.DataFrame:
        """:func:`rank_differences` of these audits."""
        return rank_differences(self, reference)

    def report(self, top: int = 10, depth: int = 1) -> str:
        """One screen: per-rank totals, hotspot differences between ranks, DDP bucket copies that
        change the layout, then the reference rank's own report."""
        ranks = self.ranks
        if not ranks:
            return "Distributed format audit: no ranks"
        ref = ranks[0]
        n_ops = sum(len(a.events) for a in self.per_rank.values())
        lines = [
            f"Distributed format audit: {len(ranks)} of {self.world_size} ranks, {n_ops} aten ops"
        ]
        for r, a in self.per_rank.items():
            ops = a.ops()
            hot = ops[ops["hotspot"]]
            state = "complete" if a.complete else f"INCOMPLETE: {a.error}"
            lines.append(
                f"  rank {r}: {len(ops)} ops, {a.hotspots().shape[0]} hotspot groups "
                f"({len(hot)} ops, {_fmt_bytes(hot['bytes'].sum())} moved); {state}"
            )
        diff = self.differences(ref)
        lines.append("")
        if len(ranks) == 1:
            lines.append(f"Hotspots: only rank {ref} was recorded, nothing to compare.")
        elif diff.empty:
            lines.append(f"Hotspots: identical on every rank (compared with rank {ref}).")
        else:
            lines.append(f"Hotspots differ between ranks (compared with rank {ref}):")
            w_mod = min(24, max(6, diff["module"].astype(str).str.len().max()))
            w_op = min(36, max(2, diff["op"].astype(str).str.len().max()))
            lines.append(
                f"  {'rank':>4} {'status':9} {'phase':8} {'module':{w_mod}} {'op':{w_op}} "
                f"{'kind':8} {'n':>7} {'bytes +/-':>10}"
            )
            for r in diff.head(top).itertuples():
                lines.append(
                    f"  {r.rank:>4} {r.status:9} {r.phase:8} {str(r.module)[:w_mod]:{w_mod}} "
                    f"{str(r.op)[:w_op]:{w_op}} {r.kind:8} {f'{r.count_before}->{r.count_after}':>7} "
                    f"{_fmt_bytes(r.bytes_delta):>10}"
                )
                if r.source:
                    lines.append(f"       at {r.source}")
            if len(diff) > top:
                lines.append(f"  ... and {len(diff) - top} more (RankAudits.differences())")
        lines.append("")
        lines.extend(_bucket_lines(self, top))
        lines.append("")
        lines.append(f"Rank {ref}:")
        ref_audit = self.per_rank[ref]
        lines.append(ref_audit.report(top=top, depth=depth))
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"<RankAudits ranks {self.ranks} of {self.world_size}, {len(self.events)} ops>"

    def _repr_html_(self) -> str:
        return "<pre>" + self.report().replace("&", "&amp;").replace("<", "&lt;") + "</pre>"


def _bucket_lines(ra: RankAudits, top: int) -> list[str]:
    ops = ra.bucket_ops()
    if ops.empty:
        return ["DDP buckets: no copies into or out of collective buffers were recorded."]
    lines = ["DDP buckets and collective buffers (copies per rank):"]
    for r, g in ops.groupby("rank", sort=True):
        counts = g.groupby(["phase", "stage"], observed=True).size()
        parts = ", ".join(f"{p} {s} {n}" for (p, s), n in counts.items())
        changed = g["layout_change"] | g["view_mismatch"]
        lines.append(
            f"  rank {r}: {len(g)} copies ({parts}); {int(changed.sum())} change the layout or "
            f"mismatch a bucket view, {_fmt_bytes(g.loc[changed, 'bytes'].sum())}"
        )
    hot = ra.bucket_hotspots()
    if hot.empty:
        lines.append("  No copy into or out of a bucket changes the layout.")
        return lines
    lines.append(
        f"  {'rank':>4} {'phase':8} {'stage':7} {'op':24} {'from -> to':30} {'n':>4} {'bytes':>9}"
    )
    for r in hot.head(top).itertuples():
        flag = "  VIEW MISMATCH: values permuted" if r.view_mismatch else ""
        lines.append(
            f"  {r.rank:>4} {r.phase:8} {r.stage:7} {r.op[:24]:24} "
            f"{(r.from_format + ' -> ' + r.to_format)[:30]:30} {r.count:>4} {_fmt_bytes(r.bytes):>9}{flag}"
        )
    if len(hot) > top:
        lines.append(f"  ... and {len(hot) - top} more (RankAudits.bucket_hotspots())")
    return lines


# -- DDP buckets --------------------------------------------------------------------------------

BUCKET_COLUMNS = [
    "seq", "phase", "stage", "op", "collective", "shape", "from_format", "to_format",
    "from_strides", "to_strides", "bytes", "layout_change", "view_mismatch", "linked",
]


_BUCKET_DTYPES = {"seq": "int64", "bytes": "int64", "layout_change": "bool", "view_mismatch": "bool"}


def _order(label: str) -> str | None:
    base = label[: -len(VIEW_SUFFIX)] if label.endswith(VIEW_SUFFIX) else label
    return base if base in _ORDERED else None


def _changes_layout(a: str, b: str) -> bool:
    oa, ob = _order(a), _order(b)
    return oa is not None and ob is not None and oa != ob


def _labels(col: pd.Series) -> np.ndarray:
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
    ev, t = audit.events, audit.tensors
    empty = pd.DataFrame({c: pd.Series(dtype=_BUCKET_DTYPES.get(c, "object")) for c in BUCKET_COLUMNS})
    if not len(ev) or not len(t):
        return empty
    op_names = _labels(ev["op"])
    collective = np.array([o.split(".", 1)[0] in COLLECTIVE_NAMESPACES for o in op_names], dtype=bool)
    if not collective.any():
        return empty
    seq = t["seq"].to_numpy()
    tid = t["tid"].to_numpy()
    is_in = (t["role"] == "input").to_numpy()
    is_view = t["is_view"].to_numpy()
    phase = _labels(ev["phase"])
    root = analysis.view_roots(t, len(ev))

    comm_rows = np.flatnonzero(collective[seq] & is_in)
    buffer_roots = np.unique(root[tid[comm_rows]])
    first_collective: dict[int, str] = {}
    for r in comm_rows:
        first_collective.setdefault(int(root[tid[r]]), op_names[seq[r]])
    in_bucket = np.isin(root, buffer_roots)  # indexed by tid
    eff_root = root.copy()

    # bucket views made before the recording: infer them (see the docstring)
    size = len(root)
    first_row = np.full(size, -1, dtype=np.int64)
    first_row[tid[::-1]] = np.arange(len(t))[::-1]
    preexisting = np.zeros(size, dtype=bool)
    seen = first_row >= 0
    preexisting[seen] = is_in[first_row[seen]]
    param = np.zeros(size, dtype=bool)
    param[tid[t["is_param"].to_numpy()]] = True
    out_rows = np.flatnonzero(~is_in & ~is_view)
    pairs = pd.DataFrame({"seq": seq, "tid": tid, "is_in": is_in})
    inplace = pairs[~pairs["is_in"]].merge(pairs[pairs["is_in"]], on=["seq", "tid"])
    inplace_bw = inplace[phase[inplace["seq"].to_numpy()] == "backward"]["tid"].unique()
    # gradients: written from a buffer by an op that is not itself writing a buffer
    reads_buffer = np.zeros(len(ev), dtype=bool)
    reads_buffer[seq[is_in & in_bucket[tid] & ~collective[seq]]] = True
    grads = set(tid[out_rows[reads_buffer[seq[out_rows]] & ~in_bucket[tid[out_rows]]]].tolist())
    view_rows = np.flatnonzero(~is_in & is_view & in_bucket[tid])
    keys: dict[tuple, int] = {}
    shape_s, dtype_s = _labels(t["shape"]), _labels(t["dtype"])
    offset = t["storage_offset"].to_numpy()
    for r in view_rows:
        keys.setdefault((shape_s[r], dtype_s[r], int(offset[r])), int(root[tid[r]]))
    inferred: set[int] = set()
    for x in inplace_bw:
        if in_bucket[x] or not preexisting[x] or param[x] or x in grads:
            continue
        r = first_row[x]
        hit = keys.get((shape_s[r], dtype_s[r], int(offset[r])))
        if hit is not None:
            inferred.add(int(x))
            moved = root == x  # the tensor and any view recorded of it
            eff_root[moved] = hit
            in_bucket[moved] = True

    # classify the ops that touch a buffer
    floating = np.array([analysis.is_floating_dtype(d) for d in t["dtype"].cat.categories] + [False])[
        t["dtype"].cat.codes.to_numpy()
    ]
    touching = np.unique(seq[in_bucket[tid] & floating & ~collective[seq]])
    fmt, strides = _labels(t["format"]), _labels(t["strides"])
    nbytes = t["bytes"].to_numpy()
    starts = np.searchsorted(seq, touching, side="left")
    ends = np.searchsorted(seq, touching, side="right")
    ops_table = audit.ops()
    producer_row = np.full(size, -1, dtype=np.int64)  # tid -> the first row that wrote it
    producer_row[tid[out_rows][::-1]] = out_rows[::-1]
    ndim = t["ndim"].to_numpy()
    position = t["position"].to_numpy()
    rows, bucket_side = [], []
    flattened: set[int] = set()

    def add(e, stage, src, dst, side, linked):
        rows.append((
            int(e), phase[e], stage, op_names[e], first_collective.get(int(eff_root[tid[side]]), ""),
            shape_s[src], fmt[src], fmt[dst], strides[src], strides[dst], int(nbytes[src]),
            _changes_layout(fmt[src], fmt[dst]), False, linked,
        ))
        bucket_side.append(side)

    for e, lo, hi in zip(touching, starts, ends):
        rs = np.arange(lo, hi)
        rs = rs[floating[rs]]
        outs = rs[~is_in[rs]]
        if len(outs) and is_view[outs].all():
            continue  # making a bucket view moves no data
        outs = outs[~is_view[outs]]
        out_tids = set(tid[outs].tolist())
        ins = rs[is_in[rs]]
        b_outs = outs[in_bucket[tid[outs]]]
        srcs = [r for r in ins if not in_bucket[tid[r]] and tid[r] not in out_tids]
        if len(b_outs) and srcs:
            dst = b_outs[0]
            add(e, "into", srcs[0], dst, dst, "inferred" if int(root[tid[dst]]) in inferred else "view")
            for s in srcs:  # a conversion whose result was flattened (a view) into the buffer
                base = root[tid[s]]
                p_out = int(producer_row[base])
                if base == tid[s] or p_out < 0 or ndim[s] >= ndim[p_out] or position[p_out] != 0:
                    continue
                p = int(seq[p_out])
                if p in flattened or ops_table.at[p, "is_conv"] or ops_table.at[p, "kind"] not in rules.COSTLY_KINDS:
                    continue
                flattened.add(p)
                p_rows = np.arange(*np.searchsorted(seq, [p, p + 1]))
                add(p, "flatten", p_rows[is_in[p_rows]][0], p_out, dst, "view")
            continue
        b_ins = [r for r in ins if in_bucket[tid[r]] and tid[r] not in out_tids]
        o_outs = outs[~in_bucket[tid[outs]]]
        if b_ins and len(o_outs):
            src = b_ins[0]
            add(e, "out", src, o_outs[0], src, "inferred" if int(root[tid[src]]) in inferred else "view")
    if not rows:
        return empty
    df = pd.DataFrame(rows, columns=BUCKET_COLUMNS)
    # a bucket region written through one layout and read through another
    stage = df["stage"].to_numpy()
    region: dict[tuple, set] = {}
    for i, x in enumerate(bucket_side):
        if stage[i] != "flatten":
            region.setdefault((int(eff_root[tid[x]]), int(offset[x]), shape_s[x]), set()).add(strides[x])
    mismatch = np.array([
        stage[i] != "flatten"
        and len(region[(int(eff_root[tid[x]]), int(offset[x]), shape_s[x])]) > 1
        for i, x in enumerate(bucket_side)
    ], dtype=bool)
    df["view_mismatch"] = mismatch
    df = df.sort_values("seq", kind="stable", ignore_index=True)
    return df.astype({"seq": np.int64, "bytes": np.int64, "layout_change": bool})


BUCKET_HOTSPOT_COLUMNS = [
    "phase", "stage", "op", "collective", "from_format", "to_format", "view_mismatch",
    "count", "bytes", "first_seq",
]


def bucket_hotspots(audit: Audit) -> pd.DataFrame:
    """The :func:`bucket_ops` that change the layout or read a region through another layout
    than it was written with, grouped by (phase, stage, op, collective, from, to), largest
    ``bytes`` first. Empty when DDP's bucketing keeps every gradient's layout."""
    return _group_bucket_ops(bucket_ops(audit))


def _group_bucket_ops(ops: pd.DataFrame) -> pd.DataFrame:
    bad = ops[ops["layout_change"] | ops["view_mismatch"]]
    if bad.empty:
        numeric = {"count": "int64", "bytes": "int64", "first_seq": "int64", "view_mismatch": "bool"}
        return pd.DataFrame({c: pd.Series(dtype=numeric.get(c, "object")) for c in BUCKET_HOTSPOT_COLUMNS})
    g = bad.groupby(
        ["phase", "stage", "op", "collective", "from_format", "to_format", "view_mismatch"], sort=False
    ).agg(count=("seq", "size"), bytes=("bytes", "sum"), first_seq=("seq", "min")).reset_index()
    g = g.sort_values(["bytes", "first_seq"], ascending=[False, True], ignore_index=True)
    return g[BUCKET_HOTSPOT_COLUMNS]


# -- gradients and ranks ----------------------------------------------------------------------


def check_grad_formats(model: torch.nn.Module) -> pd.DataFrame:
    """After a step, whether every parameter's ``.grad`` has its parameter's memory format.

    One row per parameter (a DDP or DataParallel wrapper is looked through): ``param_format``,
    ``grad_format`` (format labels; empty when ``.grad`` is None), both strides,
    ``same_strides`` (autograd's gradient layout contract) and ``ok``: no grad, or a grad with
    the parameter's format label. A grad in another format makes the optimizer permute.
    """
    inner = model.module if isinstance(
        model, (torch.nn.parallel.DistributedDataParallel, torch.nn.DataParallel)
    ) else model
    rows = []
    for name, p in inner.named_parameters():
        g = p.grad
        pf = format_label(tuple(p.shape), tuple(p.stride()))
        gf = "" if g is None else format_label(tuple(g.shape), tuple(g.stride()))
        rows.append({
            "parameter": name,
            "shape": str(tuple(p.shape)),
            "param_format": pf,
            "grad_format": gf,
            "param_strides": str(tuple(p.stride())),
            "grad_strides": "" if g is None else str(tuple(g.stride())),
            "same_strides": g is not None and tuple(g.stride()) == tuple(p.stride()),
            "ok": g is None or gf == pf,
        })
    cols = ["parameter", "shape", "param_format", "grad_format", "param_strides", "grad_strides",
            "same_strides", "ok"]
    return pd.DataFrame(rows, columns=cols).astype({"same_strides": bool, "ok": bool})


def rank_differences(rank_audits: RankAudits | dict[int, Audit] | Iterable[Audit],
                     reference: int | None = None) -> pd.DataFrame:
    """Hotspot groups that differ between each rank and ``reference`` (the lowest rank).

    :func:`auditor.analysis.diff` of the reference rank's hotspots against each other rank's,
    with a leading ``rank`` column: ``appeared`` on that rank, ``vanished`` from it, or
    ``changed`` in count or bytes. Empty when every rank has the same hotspots.
    """
    if isinstance(rank_audits, RankAudits):
        per_rank = rank_audits.per_rank
    elif isinstance(rank_audits, dict):
        per_rank = dict(sorted(rank_audits.items()))
    else:
        per_rank = dict(enumerate(rank_audits))
    if not per_rank:
        raise ValueError("no audits to compare")
    ref = min(per_rank) if reference is None else reference
    if ref not in per_rank:
        raise ValueError(f"reference rank {ref} is not among ranks {sorted(per_rank)}")
    base = per_rank[ref].hotspots()
    frames = []
    for r, a in per_rank.items():
        if r == ref:
            continue
        d = analysis.diff(base, a.hotspots())
        d.insert(0, "rank", np.full(len(d), r, dtype=np.int16))
        frames.append(d)
    if not frames:
        d = analysis.diff(base, base)
        d.insert(0, "rank", np.zeros(0, dtype=np.int16))
        return d
    return pd.concat(frames, ignore_index=True)
