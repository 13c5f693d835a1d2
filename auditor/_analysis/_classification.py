"""Per-event classification: the recording's own per-op rule, applied once per signature.

``rules.classify`` (the function ``strict=True`` calls online) decides for one op call from its
tensors' labels. Here every event gets its verdict: events with the same op and the same
tensor facts share one call of the rule, and the rest is vectorised.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from .._recording import _rules as rules
from .._recording._formats import CHANNELS_LAST, CHANNELS_LAST_3D, LABELS, VIEW_SUFFIX
from ._activations import (
    activation_inputs,
    distinct_rows,
    floating_rows,
    image_facts,
    op_flags,
    parse_tuple,
)

_CL_LABELS = (CHANNELS_LAST, CHANNELS_LAST_3D, CHANNELS_LAST + VIEW_SUFFIX, CHANNELS_LAST_3D + VIEW_SUFFIX)
#: Signature width handled by the vectorised path; wider ops (foreach, long cats) go one by one.
_WIDE = 12


def classify(events: pd.DataFrame, tensors: pd.DataFrame, facts: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per event: ``kind`` (see :data:`auditor._recording._rules.KINDS`), ``bytes`` moved into
    another layout, ``from_format``/``to_format``, ``is_conv`` and ``cl_input`` (the op read a
    channels_last image). ``facts`` is :func:`~.activations.image_facts` of the log, computed
    here when not given."""
    n = len(events)
    ops = events["op"].cat.categories
    op_codes = events["op"].cat.codes.to_numpy()
    floating = floating_rows(tensors)
    if facts is None:
        facts = image_facts(events, tensors)
    rows = _EventRows(tensors, n, floating, facts)
    sig, wide = _event_signatures(op_codes, rows, _tensor_signatures(tensors, floating, facts))
    verdicts = _Verdicts(n)
    narrow = ~wide
    if narrow.any():
        first = np.full(int(sig.max()) + 1, -1, dtype=np.int64)
        narrow_idx = np.flatnonzero(narrow)
        first[sig[narrow_idx[::-1]]] = narrow_idx[::-1]  # first event of each signature
        table = [rows.verdict(ops[op_codes[e]], int(e)) for e in first]
        verdicts.spread(narrow, sig[narrow], table)
    for e in np.flatnonzero(wide):
        verdicts.set(int(e), rows.verdict(ops[op_codes[e]], int(e)))
    seq = tensors["seq"].to_numpy()
    cl_in = np.zeros(n, dtype=bool)
    is_in = (tensors["role"] == "input").to_numpy()
    cl_effective = np.isin(facts["effective"].to_numpy(), _CL_LABELS)
    is_conv = op_flags(events["op"], rules.is_convolution)
    conv_input = is_conv[seq] & activation_inputs(tensors, floating)  # always an image to its convolution
    cl_in[seq[is_in & (facts["image"].to_numpy() | conv_input) & cl_effective]] = True
    labels = ["", *LABELS]
    return pd.DataFrame(
        {
            "kind": pd.Categorical(verdicts.kind, categories=list(rules.KINDS)),
            "bytes": verdicts.moved,
            "from_format": pd.Categorical(verdicts.src, categories=labels),
            "to_format": pd.Categorical(verdicts.dst, categories=labels),
            "is_conv": is_conv,
            "cl_input": cl_in,
        },
        index=events.index,
    )


def _tensor_signatures(tensors: pd.DataFrame, floating: np.ndarray, facts: pd.DataFrame) -> np.ndarray:
    """A code per distinct (role, position, arg, format, is_param, is_view, floating, bytes,
    shape and strides, and the data flow's facts)."""
    if not len(tensors):
        return np.zeros(0, np.int64)
    columns = ["role", "position", "arg", "format", "is_param", "is_view", "bytes", "shape", "strides"]
    return distinct_rows([tensors[c] for c in columns] + [floating] + [facts[c] for c in facts.columns])[0]


class _EventRows:
    """Each event's tensor rows (grouped by ``seq``, in recording order), and the rule's view
    of them."""

    def __init__(self, tensors: pd.DataFrame, n: int, floating: np.ndarray, facts: pd.DataFrame):
        seq = tensors["seq"].to_numpy()
        self.counts = np.bincount(seq, minlength=n)
        self.starts = np.concatenate([[0], np.cumsum(self.counts)[:-1]]) if n else np.zeros(0, np.int64)
        # rank of each tensor row inside its event
        self.rank = np.arange(len(tensors)) - self.starts[seq] if len(tensors) else np.zeros(0, np.int64)
        self.seq = seq
        self.role = tensors["role"].to_numpy()
        self.position = tensors["position"].to_numpy()
        self.arg = tensors["arg"].to_numpy()
        self.fmt = tensors["format"].to_numpy()
        self.is_param = tensors["is_param"].to_numpy()
        self.is_view = tensors["is_view"].to_numpy()
        self.nbytes = tensors["bytes"].to_numpy()
        self.floating = floating
        shapes, strides = tensors["shape"].cat.categories, tensors["strides"].cat.categories
        self.shape_of = [parse_tuple(str(x)) for x in shapes]
        self.strides_of = [parse_tuple(str(x)) for x in strides]
        self.shape = tensors["shape"].cat.codes.to_numpy()
        self.strides = tensors["strides"].cat.codes.to_numpy()
        self.image = facts["image"].to_numpy()
        self.cdim = facts["cdim"].to_numpy()
        self.image_rank = facts["rank"].to_numpy()
        self.label = facts["label"].to_numpy()
        self.effective = facts["effective"].to_numpy()

    def verdict(self, op: str, event: int) -> rules.Verdict:
        lo = self.starts[event]
        sigs = tuple(
            rules.TensorSig(self.role[i], int(self.position[i]), self.arg[i], self.label[i], bool(self.is_param[i]),
                            bool(self.is_view[i]), int(self.nbytes[i]), bool(self.floating[i]),
                            self.shape_of[self.shape[i]], self.strides_of[self.strides[i]], bool(self.image[i]),
                            int(self.cdim[i]), int(self.image_rank[i]), self.effective[i])
            for i in range(lo, lo + self.counts[event])
        )
        return rules.classify(op, sigs)


def _event_signatures(op_codes: np.ndarray, rows: _EventRows, tsig: np.ndarray):
    """(signature code per event, whether it is too wide for the vectorised path): events with
    the same op and the same tensor signatures in the same order share a code."""
    n = len(op_codes)
    wide = rows.counts > _WIDE
    grid = np.full((n, _WIDE + 1), -1, dtype=np.int64)
    grid[:, 0] = op_codes
    keep = rows.rank < _WIDE
    grid[rows.seq[keep], rows.rank[keep] + 1] = tsig[keep]
    sig = np.full(n, -1, dtype=np.int64)
    narrow = ~wide
    if narrow.any():
        sig[narrow] = pd.DataFrame(grid[narrow]).groupby(list(range(_WIDE + 1)), sort=False).ngroup()
    return sig, wide


class _Verdicts:
    """The classification columns, filled per signature or per event."""

    def __init__(self, n: int):
        self.kind = np.empty(n, dtype=object)
        self.moved = np.zeros(n, dtype=np.int64)
        self.src = np.empty(n, dtype=object)
        self.dst = np.empty(n, dtype=object)

    def spread(self, mask: np.ndarray, codes: np.ndarray, table: list[rules.Verdict]) -> None:
        k, b, f, t = (np.array(col, dtype=object) for col in zip(*table))
        self.kind[mask], self.moved[mask], self.src[mask], self.dst[mask] = (
            k[codes], b[codes].astype(np.int64), f[codes], t[codes]
        )

    def set(self, e: int, v: rules.Verdict) -> None:
        self.kind[e], self.moved[e], self.src[e], self.dst[e] = v.kind, v.nbytes, v.from_format, v.to_format
