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
* :meth:`RankAudits.differences`: hotspot groups that differ between ranks.

The package owns the per-rank files (``_files``), the merged view (``_rank_audits``), DDP's
buckets (``_buckets``) and gradient formats (``_grads``). It imports the ``Audit`` facade, the
analysis and display; nothing imports it.
"""

from ._buckets import bucket_hotspots, bucket_ops
from ._files import merge_rank_audits, save_rank_audit
from ._grads import check_grad_formats
from ._rank_audits import RankAudits

__all__ = [
    "save_rank_audit",
    "merge_rank_audits",
    "RankAudits",
    "check_grad_formats",
    "bucket_ops",
    "bucket_hotspots",
]
