"""Per-rank audit files: where each rank writes its audit, and reading them back together."""

from __future__ import annotations

import glob
import os
import re

from .._recording._mode import process_group
from .._result import Audit
from ._rank_audits import RankAudits

_RANK_FILE = re.compile(r"\.rank(\d+)\.csv$")


def rank_path(out: str | os.PathLike, rank: int | None = None) -> str:
    """The file one rank writes: ``DIR/audit.rank{rank}.csv`` for a directory, ``x.rank{rank}.csv``
    for ``x.csv``, or ``out.format(rank=rank)`` when ``out`` contains ``{rank}``.

    ``rank`` defaults to this process's rank in the default process group (0 outside one), so
    the same line works unchanged on every rank.
    """
    rank = process_group()[0] if rank is None else int(rank)
    out = os.fspath(out)
    if "{rank}" in out:
        return out.format(rank=rank)
    if out.endswith(".csv"):
        return f"{out[:-4]}.rank{rank}.csv"
    return os.path.join(out, f"audit.rank{rank}.csv")


def save_rank_audit(audit: Audit, out: str | os.PathLike = ".") -> str:
    """Write ``audit`` to its rank's file under ``out`` (a directory: ``out/audit.rank{r}.csv``;
    ``x.csv``: ``x.rank{r}.csv``; a pattern: ``out.format(rank=r)``); return the path.

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
