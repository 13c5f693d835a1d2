"""The event-log schema: raw recorder rows -> two pandas DataFrames.

``events`` has one row per aten op call; ``tensors`` has one row per tensor argument or result.
Both are built once, at the end of a recording, with categoricals for repeated strings. The
column lists below are the documented schema (docs, "The event log").
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ._cells import readable
from ._formats import LABELS, format_label, has_strides, nbytes
from ._mode import BACKWARD, PHASES, ROLES, TENSOR_FIELDS, RawLog, op_info
from ._modules import module_names
from ._profile import HIDDEN_COLUMNS

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
    # times in µs, float32 (7 digits: 0.01 µs for a 100 ms op); NaN where not measured
    "duration_us": "float32",  # wall time around the op inside the mode, with the recorder's Python
    "time_us": "float32",  # the op's own kernels, by the profiler
    "start_us": "float32",  # when those began, from the recording's start (1 µs steps past 16 s)
    "gap_us": "float32",  # CPU time between the previous op and this one, outside any op
    "forward_seq": "int32",  # a backward op: the forward op whose autograd node ran it (else -1)
    "artifact": "bool",  # the recording mode made it: a plain run does it in place
    "compiled": "bool",  # ran inside a torch.compile'd callable
    "rank": "int16",
    "world_size": "int16",
}

#: column -> dtype of ``Audit.tensors``.
TENSOR_COLUMNS: dict[str, str] = {
    "seq": "int32",
    "role": "category",
    "position": "int8",  # the argument's index in the op's schema (aten ops have fewer than 128)
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


#: the categorical dtypes of the columns with a fixed vocabulary, made once
_FIXED_DTYPES = {name: pd.CategoricalDtype(list(cats)) for name, cats in FIXED_CATEGORIES.items()}


#: categorical dtypes by their categories: a recording of the same model makes the same ones
#: (its shapes, strides, modules, ops), and pandas checks every new dtype's categories again
_DTYPES: dict[tuple, pd.CategoricalDtype] = {}
_MAX_DTYPES = 512


def _cached_dtype(categories: tuple) -> pd.CategoricalDtype:
    """The categorical dtype of these (sorted, distinct) categories, made once per process."""
    dtype = _DTYPES.get(categories)
    if dtype is None:
        if len(_DTYPES) >= _MAX_DTYPES:
            _DTYPES.clear()
        dtype = _DTYPES[categories] = pd.CategoricalDtype(list(categories))
    return dtype


def _with_codes(codes: np.ndarray, dtype: pd.CategoricalDtype) -> pd.Categorical:
    """A categorical from codes this module computed (always valid: -1 or an index into the
    categories), without pandas checking them again where it can skip that (pandas >= 2.1)."""
    try:
        return pd.Categorical.from_codes(codes, dtype=dtype, validate=False)
    except TypeError:  # an older pandas: no ``validate``
        return pd.Categorical.from_codes(codes, dtype=dtype)


def categorical(values, name: str) -> pd.Categorical:
    """A column of the schema as a categorical: its fixed vocabulary, or its sorted values."""
    cats = FIXED_CATEGORIES.get(name)
    if cats is None:
        cats = sorted(set(values))
    return pd.Categorical(values, categories=list(cats))


def _from_codes(unique_values: list, codes: np.ndarray, name: str) -> pd.Categorical:
    """A categorical from per-row codes into ``unique_values``, with the schema's categories."""
    fixed = FIXED_CATEGORIES.get(name)
    cats = fixed if fixed is not None else tuple(sorted(set(unique_values)))
    dtype = _FIXED_DTYPES[name] if fixed is not None else _cached_dtype(cats)
    where = {c: i for i, c in enumerate(cats)}  # the Python values: iterating pandas' categories is slow
    remap = np.array([where[v] for v in unique_values] + [-1], dtype=np.int32)
    return _with_codes(remap[codes] if len(codes) else np.asarray(codes, dtype=np.int32), dtype)


def _factorize(values) -> tuple[list, np.ndarray]:
    """Distinct values in first-seen order, and each value's code (hashing, no sorting)."""
    index: dict = {}
    codes = np.fromiter((index.setdefault(v, len(index)) for v in values), dtype=np.int64)
    return list(index), codes


def _first_seen(ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Integer keys -> (the row where each distinct key first occurs, in first-seen order;
    each row's code into that order), by hashing (``pd.factorize`` numbers keys as first seen)."""
    if not len(ids):
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    codes, uniques = pd.factorize(ids)
    first = np.empty(len(uniques), dtype=np.int64)
    rows = np.arange(len(ids), dtype=np.int64)
    first[codes[::-1]] = rows[::-1]  # the last write to each code is its first row
    return first, codes.astype(np.int64, copy=False)


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
    columns = {
        "seq": rows.seq,
        "role": _with_codes(rows.role, _FIXED_DTYPES["role"]),
        "position": rows.position,
        "item": rows.item,
        "arg": _from_codes(args, arg_code, "arg"),
        "tid": rows.tid.astype(np.int32),
        **layouts.columns(rows.layout),
        "is_param": rows.is_param,
        "is_view": is_view,
    }
    # in the schema's order; every column is an array made here for this frame alone, so pandas
    # need not copy it
    tensors = pd.DataFrame({name: columns[name] for name in TENSOR_COLUMNS}, copy=False)
    in_format, out_format = _first_labels(n, rows, len(layouts.label))
    # a label is one tuple per module (and per line): factorize the distinct tuples' strings, in
    # the rows' first-seen order, and spread them over the rows
    label_first, label_code = _first_seen(np.fromiter(map(id, labels), dtype=np.int64, count=n))
    distinct = [labels[i] for i in label_first.tolist()]
    module_code, module_raw = pd.factorize(np.array([label[0] for label in distinct], dtype=object))
    module_code = module_code[label_code]
    mod_map = module_names(module_raw, raw.module_types)
    source_code, sources = pd.factorize(np.array([label[1] for label in distinct], dtype=object))
    source_code = source_code[label_code]
    sources = readable(sources)  # a notebook cell's line as IPython names it, once per distinct line
    if n and requested.count(None) == n:  # no op asked for a memory format (most steps)
        formats, format_code = [None], np.zeros(n, dtype=np.int64)
    else:
        formats, format_code = _factorize(requested)
    labels_and_none = layouts.label + [""]
    events = pd.DataFrame(
        {
            "seq": np.arange(n, dtype=np.int32),
            "op": _from_codes([str(f) for f in ops], op_code, "op"),
            "phase": _with_codes(np.asarray(phases, dtype=np.int8), _FIXED_DTYPES["phase"]),
            "module": _from_codes([mod_map[mo][0] for mo in module_raw], module_code, "module"),
            "module_type": _from_codes([mod_map[mo][1] for mo in module_raw], module_code, "module_type"),
            "source": _from_codes(sources, source_code, "source"),
            "requested_format": _from_codes(
                ["" if f is None else str(f).replace("torch.", "") for f in formats], format_code, "requested_format"
            ),
            "in_format": _from_codes(labels_and_none, in_format, "in_format"),
            "out_format": _from_codes(labels_and_none, out_format, "out_format"),
            "duration_us": _from_ns(durations, len(durations)),
            "time_us": _from_ns(raw.time_ns, n),
            "start_us": _from_ns(raw.start_ns, n),
            "gap_us": _from_ns(raw.gap_ns, n),
            "forward_seq": np.array(origins, dtype=np.int32),
            "artifact": _engine_sums(ops, op_code, phases, origins, rows),
            "compiled": np.isin(np.arange(n), raw.compiled),
            "rank": np.full(n, raw.rank, dtype=np.int16),
            "world_size": np.full(n, raw.world_size, dtype=np.int16),
        },
        copy=False,
    )
    return events, tensors


class _TensorRows:
    """The recorder's flat tensor list as columns (``TENSOR_FIELDS`` values per tensor)."""

    def __init__(self, flat: list):
        f = TENSOR_FIELDS
        m = len(flat) // f
        self.count = m
        self.seq = np.fromiter(flat[0::f], dtype=np.int32, count=m)
        self.role = np.fromiter(flat[1::f], dtype=np.int8, count=m)
        self.position = np.fromiter(flat[2::f], dtype=np.int8, count=m)
        self.item = np.fromiter(flat[3::f], dtype=np.int16, count=m)
        # one weak reference per tensor, kept alive by the log: its id() is the tensor's identity,
        # numbered as first seen
        self.tid = pd.factorize(np.fromiter(map(id, flat[4::f]), dtype=np.int64, count=m))[0] if m else \
            np.zeros(0, dtype=np.int64)
        self.layout = np.fromiter(flat[5::f], dtype=np.int64, count=m)
        self.is_param = np.fromiter(flat[6::f], dtype=bool, count=m)


class _Layouts:
    """Per distinct layout key (shape, strides, offset, dtype, device): its columns, computed
    once; ``columns(codes)`` spreads them over the rows."""

    def __init__(self, keys: list[tuple]):
        shapes = [tuple(k[0]) for k in keys]
        strides = [k[1] for k in keys]
        self.label = [format_label(sh, st) for sh, st in zip(shapes, strides)]
        self.shape = [str(sh) for sh in shapes]
        self.strides = [str(st) for st in strides]
        # a tensor without strides (recorded with none) has no dense bytes to move: 0
        self.bytes = np.array([nbytes(sh, k[3].itemsize) if has_strides(sh, st) else 0
                               for sh, st, k in zip(shapes, strides, keys)] + [0], dtype=np.int64)
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
    slot, slots = pd.factorize(slot_key)  # hashing: np.unique sorts (and the order does not matter)
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


def _from_ns(values: list[int], n: int) -> np.ndarray:
    """Per event, a profiler time in µs; NaN where the op was not timed or not matched."""
    if len(values) != n:
        return np.full(n, np.nan, dtype=np.float32)
    ns = np.asarray(values, dtype=np.float64)
    return np.where(ns < 0, np.nan, ns / 1e3).astype(np.float32)


def _engine_sums(ops: list, op_code: np.ndarray, phases, origins, rows: _TensorRows) -> np.ndarray:
    """Per event, whether it is the autograd engine summing two gradients for one input. Under a
    dispatch mode the engine adds out of place (``aten.add.Tensor``) where a plain run adds in
    place (``add_``): a backward ``add.Tensor`` whose first operand came from another autograd
    node's ops (or from an earlier such sum) is the engine's."""
    n = len(op_code)
    out = np.zeros(n, dtype=bool)
    add = [i for i, f in enumerate(ops) if str(f) == "aten.add.Tensor"]
    if not n or not add or not rows.count:
        return out
    phase = np.asarray(phases, dtype=np.int8)
    origin = np.asarray(origins, dtype=np.int64)
    candidates = np.flatnonzero(_member(op_code, add, len(ops)) & (phase == BACKWARD))
    if not len(candidates):
        return out
    is_out = rows.role == 1
    writer: dict[int, int] = {}  # tid -> the last event that wrote it
    first_in = {}
    for r in np.flatnonzero(~is_out & (rows.position == 0) & _member(rows.seq, candidates, n)):
        first_in.setdefault(int(rows.seq[r]), int(rows.tid[r]))
    # only the writes of the tensors the candidates add into matter
    wanted = is_out & _member(rows.tid, list(first_in.values()), int(rows.tid.max()) + 1)
    out_seq, out_tid = rows.seq[wanted].tolist(), rows.tid[wanted].tolist()
    k = 0
    for e in candidates.tolist():
        while k < len(out_seq) and out_seq[k] < e:
            writer[out_tid[k]] = out_seq[k]
            k += 1
        p = writer.get(first_in.get(e, -1))
        if p is not None and phase[p] == BACKWARD and (origin[p] != origin[e] or out[p]):
            out[e] = True
    return out


def _member(values: np.ndarray, members, size: int) -> np.ndarray:
    """Whether each of ``values`` (integers in ``[0, size)``) is one of ``members``, by a lookup
    table (``np.isin`` sorts)."""
    table = np.zeros(size, dtype=bool)
    table[np.asarray(members, dtype=np.int64)] = True
    return table[values]


def build_hidden(raw: RawLog) -> pd.DataFrame:
    """The copies made inside recorded ops (``Audit.hidden``), one row each."""
    return hidden_frame(pd.DataFrame(raw.hidden, columns=list(HIDDEN_COLUMNS)) if raw.hidden else None)


_EMPTY_HIDDEN: list[pd.DataFrame] = []  # the empty table, made once: each audit gets a copy


def hidden_frame(frame: pd.DataFrame | None = None) -> pd.DataFrame:
    """``frame`` with the dtypes of :data:`HIDDEN_COLUMNS`; none: an empty table of them."""
    if frame is None:
        if not _EMPTY_HIDDEN:
            _EMPTY_HIDDEN.append(hidden_frame(pd.DataFrame({c: [] for c in HIDDEN_COLUMNS})))
        return _EMPTY_HIDDEN[0].copy()
    out = {}
    for col, dtype in HIDDEN_COLUMNS.items():
        values = frame[col]
        out[col] = categorical(list(values), col) if dtype == "category" else values.to_numpy().astype(dtype)
    return pd.DataFrame(out)
