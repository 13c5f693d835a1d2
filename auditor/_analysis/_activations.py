"""Which tensor rows are activations: the one definition the analyzers share.

An activation input is a floating tensor read by an op that is not a parameter and not in a
weight, bias or running-statistics argument (``rules.WEIGHT_ARGS``), as in
``auditor._recording._rules``, whose scalar rule decides for one op from the same facts.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from .._recording import _rules as rules
from .._recording._facts import FactsReplay


def is_floating_dtype(dtype_name: str) -> bool:
    """A floating or complex dtype, by its name in the log (``float32``); indices and masks
    are never activations."""
    dt = getattr(torch, dtype_name, None)
    return isinstance(dt, torch.dtype) and (dt.is_floating_point or dt.is_complex)


def floating_rows(tensors: pd.DataFrame) -> np.ndarray:
    """Per tensor row: its dtype is floating or complex (decided once per distinct dtype)."""
    cats = tensors["dtype"].cat.categories
    of_code = np.array([is_floating_dtype(str(d)) for d in cats] + [False], dtype=bool)
    return of_code[tensors["dtype"].cat.codes.to_numpy()]


def op_flags(ops: pd.Series, predicate) -> np.ndarray:
    """Per event, ``predicate`` of its op's name (a rule of :mod:`auditor._recording._rules`),
    decided once per distinct op."""
    if isinstance(ops.dtype, pd.CategoricalDtype):
        codes, names = ops.cat.codes.to_numpy(), ops.cat.categories
    else:
        codes, names = pd.factorize(ops.astype(str))
    return np.array([predicate(str(o)) for o in names] + [False], dtype=bool)[codes]


def distinct_rows(columns: list) -> tuple[np.ndarray, np.ndarray]:
    """(per row, a code of its distinct combination of ``columns``, numbered in order of first
    appearance; per code, its first row). Each column (an array or a Series, categorical or
    not) is factorised on its own and the codes are combined arithmetically, so no tuple is
    built per row."""
    n = len(columns[0]) if columns else 0
    key, span = np.zeros(n, dtype=np.int64), 1
    for col in columns:
        if isinstance(getattr(col, "dtype", None), pd.CategoricalDtype):
            codes, size = col.cat.codes.to_numpy().astype(np.int64), len(col.cat.categories)
        else:
            codes, uniq = pd.factorize(np.asarray(col))
            size = len(uniq)
        if span * (size + 1) >= 1 << 62:  # renumber what is combined so far before it overflows
            key = pd.factorize(key)[0].astype(np.int64)
            span = int(key.max()) + 1 if n else 1
        key = key * (size + 1) + (codes + 1)
        span *= size + 1
    codes = pd.factorize(key)[0].astype(np.int64)
    first = np.zeros(int(codes.max()) + 1 if n else 0, dtype=np.int64)
    first[codes[::-1]] = np.arange(n - 1, -1, -1)
    return codes, first


def activation_inputs(tensors: pd.DataFrame, floating: np.ndarray | None = None) -> np.ndarray:
    """Per tensor row: an activation read by its op (see the module docstring)."""
    if floating is None:
        floating = floating_rows(tensors)
    return (
        (tensors["role"] == "input").to_numpy()
        & floating
        & ~tensors["is_param"].to_numpy()
        & ~tensors["arg"].isin(rules.WEIGHT_ARGS).to_numpy()
    )




def parse_tuple(text: str) -> tuple[int, ...]:
    """``"(2, 3, 8, 8)"`` (the log's shape and strides columns) -> ``(2, 3, 8, 8)``."""
    return tuple(int(x) for x in text.strip("()").split(",") if x.strip())


def image_facts(events: pd.DataFrame, tensors: pd.DataFrame) -> pd.DataFrame:
    """Per tensor row, what the data flow knew about that tensor when the op ran: whether it is
    an image, the dimension its channels run along, the rank of the image, its label as that
    image, and its effective format (:class:`auditor._recording._rules.Facts`).

    The ops are replayed in the order they ran (:class:`auditor._recording._facts.FactsReplay`,
    the replay ``strict=True`` steps while recording), keyed by tensor identity.
    """
    n_rows = len(tensors)
    out = {
        "image": np.zeros(n_rows, dtype=bool),
        "cdim": np.ones(n_rows, dtype=np.int8),
        "rank": tensors["ndim"].to_numpy().copy() if n_rows else np.zeros(0, dtype=np.int8),
        "label": tensors["format"].astype(str).to_numpy().copy() if n_rows else np.empty(0, dtype=object),
        "effective": np.full(n_rows, "", dtype=object),
    }
    if not n_rows:
        return pd.DataFrame(out)
    base, base_code = _base_signatures(tensors)
    ops = [str(o) for o in events["op"].cat.categories]
    op_code = events["op"].cat.codes.to_numpy()
    seq = tensors["seq"].to_numpy()
    is_out = (tensors["role"] == "output").to_numpy().tolist()
    tid = tensors["tid"].to_numpy().tolist()
    bounds = np.searchsorted(seq, np.arange(len(events) + 1)).tolist()
    replay = FactsReplay()
    row_facts: list = [None] * n_rows
    for e in range(len(events)):
        lo, hi = bounds[e], bounds[e + 1]
        if lo == hi:
            continue
        ins = [r for r in range(lo, hi) if not is_out[r]]
        outs = [r for r in range(lo, hi) if is_out[r]]
        in_facts, out_facts = replay.step(ops[op_code[e]], [(tid[r], base[base_code[r]]) for r in ins],
                                          [(tid[r], base[base_code[r]]) for r in outs])
        for r, f in zip(ins, in_facts):
            row_facts[r] = f
        for r, f in zip(outs, out_facts):
            row_facts[r] = f
    for r, f in enumerate(row_facts):
        if f is not None and (f.image or f.effective):
            out["image"][r], out["cdim"][r], out["rank"][r], out["label"][r], out["effective"][r] = f
    return pd.DataFrame(out)


def _base_signatures(tensors: pd.DataFrame) -> tuple[list[rules.TensorSig], np.ndarray]:
    """The rule's view of every distinct tensor row, before the data flow's facts: (the
    distinct signatures, each row's code into them)."""
    cols = ["role", "position", "arg", "format", "is_param", "is_view", "bytes", "dtype", "shape", "strides"]
    codes, first = distinct_rows([tensors[c] for c in cols])
    uniq = tensors[cols].iloc[first]
    floating = {d: is_floating_dtype(d) for d in tensors["dtype"].cat.categories.astype(str)}
    base = [
        rules.TensorSig(str(role), int(pos), str(arg), str(label), bool(param), bool(view), int(nbytes),
                        floating[str(dtype)], parse_tuple(str(shape)), parse_tuple(str(strides)))
        for role, pos, arg, label, param, view, nbytes, dtype, shape, strides in uniq.itertuples(index=False)
    ]
    return base, codes
