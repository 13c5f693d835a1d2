"""The event-log schema: raw recorder rows -> two pandas DataFrames.

``events`` has one row per aten op call; ``tensors`` has one row per tensor argument or result.
Both are built once, at the end of a recording, with categoricals for repeated strings. The
column lists below are the documented schema (README, "Event-log schema").
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from .formats import LABELS, format_label, nbytes
from .mode import PHASES, ROLES, TENSOR_FIELDS, RawLog, op_info
from .modules import module_names

#: column -> dtype of ``Audit.events``. "category" columns list their categories below when
#: the vocabulary is fixed; free categoricals take their sorted distinct values.
EVENT_COLUMNS: dict[str, str] = {
    "seq": "int32",
    "op": "category",
    "phase": "category",
    "module": "category",
    "module_type": "category",
    "source": "category",
    "requested_format": "category",
    "in_format": "category",
    "out_format": "category",
    "duration_us": "float64",
    "forward_seq": "int32",
    "rank": "int16",
    "world_size": "int16",
}

#: column -> dtype of ``Audit.tensors``.
TENSOR_COLUMNS: dict[str, str] = {
    "seq": "int32",
    "role": "category",
    "position": "int16",
    "item": "int16",
    "arg": "category",
    "tid": "int32",
    "ndim": "int8",
    "shape": "category",
    "strides": "category",
    "storage_offset": "int64",
    "dtype": "category",
    "device": "category",
    "format": "category",
    "is_param": "bool",
    "is_view": "bool",
    "bytes": "int64",
}

FIXED_CATEGORIES: dict[str, tuple[str, ...]] = {
    "phase": PHASES,
    "role": ROLES,
    "format": LABELS,
    "in_format": ("", *LABELS),
    "out_format": ("", *LABELS),
}

#: Extra column of the CSV file: whether the recording ran to its end.
COMPLETE_COLUMN = "audit_complete"


def categorical(values, name: str) -> pd.Categorical:
    """A column of the schema as a categorical: its fixed vocabulary, or its sorted values."""
    cats = FIXED_CATEGORIES.get(name)
    if cats is None:
        cats = sorted(set(values))
    return pd.Categorical(values, categories=list(cats))


def _from_codes(unique_values: list, codes: np.ndarray, name: str) -> pd.Categorical:
    """A categorical from per-row codes into ``unique_values``, with the schema's categories."""
    cats = FIXED_CATEGORIES.get(name)
    if cats is None:
        cats = sorted(set(unique_values))
    where = {c: i for i, c in enumerate(cats)}
    remap = np.array([where[v] for v in unique_values] + [-1], dtype=np.int32)
    return pd.Categorical.from_codes(remap[codes] if len(codes) else codes, categories=list(cats))


def _factorize(values) -> tuple[list, np.ndarray]:
    """Distinct values in first-seen order, and each value's code (hashing, no sorting)."""
    index: dict = {}
    codes = np.fromiter((index.setdefault(v, len(index)) for v in values), dtype=np.int64)
    return list(index), codes


def _first_seen(ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Integer keys -> (the row where each distinct key first occurs, in first-seen order;
    each row's code into that order), vectorised."""
    if not len(ids):
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    _, first, inverse = np.unique(ids, return_index=True, return_inverse=True)
    order = np.argsort(first)
    rank = np.empty_like(order)
    rank[order] = np.arange(len(order))
    return first[order], rank[inverse.ravel()]


def build_frames(raw: RawLog) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Raw tuples -> (events, tensors), the only place DataFrames are made from a recording.

    Every per-layout quantity (label, bytes, the shape and stride strings) is computed once per
    distinct layout, and argument names and view flags once per distinct (op, slot), not once
    per row.
    """
    n = len(raw.events)
    funcs, phases, labels, requested, durations, origins, copied = zip(*raw.events) if n else ((),) * 7
    op_first, op_code = _first_seen(np.fromiter(map(id, funcs), dtype=np.int64, count=n))
    ops = [funcs[i] for i in op_first.tolist()]
    rows = _TensorRows(raw.tensors)
    layouts = _Layouts(raw.layouts)
    args, arg_code, is_view = _slot_facts(ops, op_code, np.array(copied, dtype=bool), rows)
    tensors = pd.DataFrame(
        {
            "seq": rows.seq,
            "role": pd.Categorical.from_codes(rows.role, categories=list(ROLES)),
            "position": rows.position,
            "item": rows.item,
            "arg": _from_codes(args, arg_code, "arg"),
            "tid": rows.tid.astype(np.int32),
            **layouts.columns(rows.layout),
            "is_param": rows.is_param,
            "is_view": is_view,
        }
    )[list(TENSOR_COLUMNS)]
    in_format, out_format = _first_labels(n, rows, len(layouts.label))
    module_code, module_raw = pd.factorize(np.array([label[0] for label in labels], dtype=object))
    mod_map = module_names(module_raw, raw.module_types)
    source_code, sources = pd.factorize(np.array([label[1] for label in labels], dtype=object))
    formats, format_code = _factorize(requested)
    labels_and_none = layouts.label + [""]
    events = pd.DataFrame(
        {
            "seq": np.arange(n, dtype=np.int32),
            "op": _from_codes([str(f) for f in ops], op_code, "op"),
            "phase": pd.Categorical.from_codes(np.asarray(phases, dtype=np.int8), categories=list(PHASES)),
            "module": _from_codes([mod_map[mo][0] for mo in module_raw], module_code, "module"),
            "module_type": _from_codes([mod_map[mo][1] for mo in module_raw], module_code, "module_type"),
            "source": _from_codes(sources, source_code, "source"),
            "requested_format": _from_codes(
                ["" if f is None else str(f).replace("torch.", "") for f in formats], format_code, "requested_format"
            ),
            "in_format": _from_codes(labels_and_none, in_format, "in_format"),
            "out_format": _from_codes(labels_and_none, out_format, "out_format"),
            "duration_us": _durations_us(durations),
            "forward_seq": np.array(origins, dtype=np.int32),
            "rank": np.full(n, raw.rank, dtype=np.int16),
            "world_size": np.full(n, raw.world_size, dtype=np.int16),
        }
    )
    return events, tensors


class _TensorRows:
    """The recorder's flat tensor list as columns (``TENSOR_FIELDS`` values per tensor)."""

    def __init__(self, flat: list):
        f = TENSOR_FIELDS
        m = len(flat) // f
        self.count = m
        self.seq = np.array(flat[0::f], dtype=np.int32)
        self.role = np.array(flat[1::f], dtype=np.int8)
        self.position = np.array(flat[2::f], dtype=np.int16)
        self.item = np.array(flat[3::f], dtype=np.int16)
        # one weak reference per tensor, kept alive by the log: its id() is the tensor's identity
        self.tid = _first_seen(np.fromiter(map(id, flat[4::f]), dtype=np.int64, count=m))[1]
        self.layout = np.array(flat[5::f], dtype=np.int64)
        self.is_param = np.array(flat[6::f], dtype=bool)


class _Layouts:
    """Per distinct layout key (shape, strides, offset, dtype, device): its columns, computed
    once; ``columns(codes)`` spreads them over the rows."""

    def __init__(self, keys: list[tuple]):
        shapes = [tuple(k[0]) for k in keys]
        strides = [k[1] for k in keys]
        self.label = [format_label(sh, st) for sh, st in zip(shapes, strides)]
        self.shape = [str(sh) for sh in shapes]
        self.strides = [str(st) for st in strides]
        self.bytes = np.array([nbytes(sh, k[3].itemsize) for sh, k in zip(shapes, keys)] + [0], dtype=np.int64)
        self.ndim = np.array([len(sh) for sh in shapes] + [0], dtype=np.int8)
        self.offset = np.array([k[2] for k in keys] + [0], dtype=np.int64)
        dtypes, dtype_code = _factorize(k[3] for k in keys)
        devices, device_code = _factorize(k[4] for k in keys)
        dtype_names = np.array([str(d).replace("torch.", "") for d in dtypes], dtype=object)
        device_names = np.array([str(d) for d in devices], dtype=object)
        self.dtype = list(dtype_names[dtype_code]) if keys else []
        self.device = list(device_names[device_code]) if keys else []

    def columns(self, codes: np.ndarray) -> dict:
        return {
            "ndim": self.ndim[codes],
            "shape": _from_codes(self.shape, codes, "shape"),
            "strides": _from_codes(self.strides, codes, "strides"),
            "storage_offset": self.offset[codes],
            "dtype": _from_codes(self.dtype, codes, "dtype"),
            "device": _from_codes(self.device, codes, "device"),
            "format": _from_codes(self.label, codes, "format"),
            "bytes": self.bytes[codes],
        }


def _slot_facts(ops: list, op_code: np.ndarray, copied: np.ndarray, rows: _TensorRows):
    """Argument name and view flag of every tensor row, looked up once per distinct slot
    (op, role, position, in a list, the call returned a copy): (distinct names, each row's
    code into them, is_view)."""
    if not rows.count:
        return [], np.zeros(0, dtype=np.int64), np.zeros(0, dtype=bool)
    dims = (max(1, len(ops)), 2, int(rows.position.max()) + 2, 2, 2)
    slot_key = np.ravel_multi_index(
        (op_code[rows.seq], rows.role, rows.position + 1, rows.item >= 0, copied[rows.seq]), dims)
    slots, slot = np.unique(slot_key, return_inverse=True)
    slot = slot.ravel()
    infos = [op_info(f) for f in ops]
    slot_values = [
        infos[op].slot(r, pos1 - 1, 0 if in_list else -1, bool(cp))
        for op, r, pos1, in_list, cp in zip(*(c.tolist() for c in np.unravel_index(slots, dims)))
    ]
    args, arg_code = _factorize(a for a, _ in slot_values)
    slot_view = np.array([v for _, v in slot_values], dtype=bool)
    return args, arg_code[slot], slot_view[slot]


def _first_labels(n: int, rows: _TensorRows, none: int) -> list[np.ndarray]:
    """Per event, the layout code of its first input and of its first result (``none`` where
    it has none)."""
    index = np.arange(rows.count)
    firsts = []
    for r in (0, 1):
        pick = index[rows.role == r][::-1]
        first = np.full(n, -1, dtype=np.int64)
        first[rows.seq[pick]] = pick
        firsts.append(np.where(first >= 0, rows.layout[np.maximum(first, 0)] if rows.count else 0, none))
    return firsts


def _durations_us(durations) -> np.ndarray:
    ns = np.asarray(durations, dtype=np.float64)
    return np.where(ns < 0, np.nan, ns / 1e3) if len(ns) else np.empty(0)
