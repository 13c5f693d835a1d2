"""``RankAudits``: the audits of one distributed run, one per rank, and what differs."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import numpy as np
import pandas as pd
from pandas.api.types import union_categoricals

from .._analysis._summaries import diff
from .._display._ranks import ranks_html, ranks_text
from .._result import Audit
from ._buckets import bucket_ops, group_bucket_ops


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
        return self._per_rank(lambda a: group_bucket_ops(self._rank_bucket_ops(a)))

    def differences(self, reference: int | None = None) -> pd.DataFrame:
        """Hotspot groups that differ between each rank and ``reference`` (the lowest rank):
        ``auditor.diff`` of the reference rank's hotspots against each other rank's."""
        return rank_differences(self, reference)

    def _totals(self) -> pd.DataFrame:
        """One row per rank: its ops, hotspot groups, hotspot ops and their bytes, and whether it
        was recorded whole."""
        rows = []
        for r, a in self.per_rank.items():
            ops = a.ops()
            hot = ops[ops["hotspot"]]
            rows.append({"rank": r, "ops": len(ops), "hotspot groups": len(a.hotspots()), "hotspot ops": len(hot),
                         "bytes": int(hot["bytes"].sum()),
                         "state": "complete" if a.complete else f"INCOMPLETE: {a.error}"})
        return pd.DataFrame(rows, columns=["rank", "ops", "hotspot groups", "hotspot ops", "bytes", "state"])

    def _shown(self, own: Callable[[Audit], str]) -> dict:
        """What its report shows (:mod:`auditor._display`); ``own`` renders the reference rank's
        audit."""
        shown = {"world_size": self.world_size, "totals": self._totals()}
        if not self.per_rank:
            return shown
        ref = self.ranks[0]
        ops = self.bucket_ops()
        return {**shown, "reference": ref, "differences": self.differences(ref), "bucket_ops": ops,
                "bucket_hotspots": self.bucket_hotspots() if len(ops) else pd.DataFrame(),
                "reference_report": own(self.per_rank[ref])}

    def report(self, top: int = 10, depth: int = 1) -> str:
        """One screen: per-rank totals, hotspot differences between ranks, DDP bucket copies that
        change the layout, then the reference rank's own report."""
        return ranks_text(**self._shown(lambda a: a.report(top=top, depth=depth)), top=top)

    def __repr__(self) -> str:
        return f"<RankAudits ranks {self.ranks} of {self.world_size}, {len(self.events)} ops>"

    def _repr_html_(self, top: int = 10, depth: int = 1) -> str:
        """:meth:`report` as HTML tables, for notebooks: per-rank totals, the hotspot groups that
        differ between ranks, the bucket copies that change the layout, the reference rank."""
        return ranks_html(**self._shown(lambda a: a.html(top=top, depth=depth)), top=top)


def rank_differences(rank_audits: RankAudits | dict[int, Audit] | Iterable[Audit],
                     reference: int | None = None) -> pd.DataFrame:
    """Hotspot groups that differ between each rank and ``reference`` (the lowest rank).

    :func:`auditor._analysis.diff` of the reference rank's hotspots against each other rank's,
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
        d = diff(base, a.hotspots())
        d.insert(0, "rank", np.full(len(d), r, dtype=np.int16))
        frames.append(d)
    if not frames:
        d = diff(base, base)
        d.insert(0, "rank", np.zeros(0, dtype=np.int16))
        return d
    return pd.concat(frames, ignore_index=True)
