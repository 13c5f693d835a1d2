"""The event-log schema: raw recorder rows -> two pandas DataFrames, and their CSV round trip.

``events`` has one row per aten op call; ``tensors`` has one row per tensor argument or result.
Both are built once, at the end of a recording, with categoricals for repeated strings. The
column lists below are the documented schema (README, "Event-log schema").
"""

from __future__ import annotations

import io
import os

import numpy as np
import pandas as pd

from .formats import LABELS, format_label, nbytes
from .recorder import PHASES, ROLES, TENSOR_FIELDS, RawLog, module_names, op_info

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


def _categorical(values, name: str) -> pd.Categorical:
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
    funcs, phases, labels, requested, durations = zip(*raw.events) if n else ((),) * 5
    modules = [label[0] for label in labels]
    mod_map = module_names(dict.fromkeys(modules), raw.module_types)
    op_first, op_code = _first_seen(np.fromiter(map(id, funcs), dtype=np.int64, count=n))
    ops = [funcs[i] for i in op_first.tolist()]

    flat = raw.tensors
    m = len(flat) // TENSOR_FIELDS
    seq = np.array(flat[0::TENSOR_FIELDS], dtype=np.int32)
    role = np.array(flat[1::TENSOR_FIELDS], dtype=np.int8)
    position = np.array(flat[2::TENSOR_FIELDS], dtype=np.int16)
    item = np.array(flat[3::TENSOR_FIELDS], dtype=np.int16)
    # one weak reference per tensor, kept alive by the log: its id() is the tensor's identity
    _, tid = _first_seen(np.fromiter(map(id, flat[4::TENSOR_FIELDS]), dtype=np.int64, count=m))
    layout = np.array(flat[5::TENSOR_FIELDS], dtype=np.int64)
    # argument name and view flag: once per distinct (op, role, position, in a list)
    dims = (max(1, len(ops)), 2, int(position.max()) + 2 if m else 1, 2)
    slot_key = np.ravel_multi_index((op_code[seq], role, position + 1, item >= 0), dims) if m else seq
    slots, slot = np.unique(slot_key, return_inverse=True)
    slot = slot.ravel()
    infos = [op_info(f) for f in ops]
    slot_values = [
        infos[op].slot(r, pos1 - 1, 0 if in_list else -1)
        for op, r, pos1, in_list in zip(*(c.tolist() for c in np.unravel_index(slots, dims)))
    ]
    args, arg_code = _factorize(a for a, _ in slot_values)
    slot_view = np.array([v for _, v in slot_values] + [False], dtype=bool)

    keys = raw.layouts
    u_shape = [tuple(k[0]) for k in keys]
    u_strides = [k[1] for k in keys]
    u_label = [format_label(sh, st) for sh, st in zip(u_shape, u_strides)]
    u_bytes = np.array([nbytes(sh, k[3].itemsize) for sh, k in zip(u_shape, keys)] + [0], dtype=np.int64)
    u_ndim = np.array([len(sh) for sh in u_shape] + [0], dtype=np.int8)
    u_offset = np.array([k[2] for k in keys] + [0], dtype=np.int64)
    dtypes, dtype_code = _factorize(k[3] for k in keys)
    devices, device_code = _factorize(k[4] for k in keys)
    dtype_names = np.array([str(d).replace("torch.", "") for d in dtypes], dtype=object)
    device_names = np.array([str(d) for d in devices], dtype=object)
    tensors = pd.DataFrame(
        {
            "seq": seq,
            "role": pd.Categorical.from_codes(role, categories=list(ROLES)),
            "position": position,
            "item": item,
            "arg": _from_codes(args, arg_code[slot] if m else arg_code, "arg"),
            "tid": tid.astype(np.int32),
            "ndim": u_ndim[layout],
            "shape": _from_codes([str(sh) for sh in u_shape], layout, "shape"),
            "strides": _from_codes([str(st) for st in u_strides], layout, "strides"),
            "storage_offset": u_offset[layout],
            "dtype": _from_codes(list(dtype_names[dtype_code]) if keys else [], layout, "dtype"),
            "device": _from_codes(list(device_names[device_code]) if keys else [], layout, "device"),
            "format": _from_codes(u_label, layout, "format"),
            "is_param": np.array(flat[6::TENSOR_FIELDS], dtype=bool),
            "is_view": slot_view[slot] if m else np.zeros(0, dtype=bool),
            "bytes": u_bytes[layout],
        }
    )
    # the label of each event's first input and first result ("" where it has none)
    labels_and_none = u_label + [""]
    rows_idx = np.arange(m)
    firsts = []
    for r in (0, 1):
        pick = rows_idx[role == r][::-1]
        first = np.full(n, -1, dtype=np.int64)
        first[seq[pick]] = pick
        firsts.append(np.where(first >= 0, layout[np.maximum(first, 0)] if m else 0, len(u_label)))
    in_format, out_format = firsts
    module_code, module_raw = pd.factorize(np.array(modules, dtype=object))
    source_code, sources = pd.factorize(np.array([label[1] for label in labels], dtype=object))
    formats, format_code = _factorize(requested)
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
            "duration_us": np.where(
                np.asarray(durations, dtype=np.float64) < 0, np.nan, np.asarray(durations, dtype=np.float64) / 1e3
            )
            if n
            else np.empty(0),
            "rank": np.full(n, raw.rank, dtype=np.int16),
            "world_size": np.full(n, raw.world_size, dtype=np.int16),
        }
    )
    return events, tensors


# -- CSV round trip -------------------------------------------------------------------------


def to_csv(events: pd.DataFrame, tensors: pd.DataFrame, complete: bool, path_or_buf=None):
    """One CSV file, one row per tensor with its event's columns; tensor-less events get one row
    with an empty ``role``. Written to a temporary name and renamed, so a failed write never
    leaves a file that looks complete."""
    long = events.merge(tensors, on="seq", how="left", sort=True)
    long[COMPLETE_COLUMN] = complete
    if path_or_buf is None:
        return long.to_csv(index=False)
    if isinstance(path_or_buf, (str, os.PathLike)):
        path = os.fspath(path_or_buf)
        tmp = f"{path}.partial"
        try:
            long.to_csv(tmp, index=False)
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.remove(tmp)
        return None
    long.to_csv(path_or_buf, index=False)
    return None


def read_csv(path_or_buf) -> tuple[pd.DataFrame, pd.DataFrame, bool]:
    """Inverse of :func:`to_csv`: (events, tensors, complete) with the exact dtypes."""
    if isinstance(path_or_buf, str) and "\n" in path_or_buf:
        path_or_buf = io.StringIO(path_or_buf)
    long = pd.read_csv(
        path_or_buf,
        keep_default_na=False,
        na_values={"duration_us": [""]},
        dtype=str,
    )
    required = list(dict.fromkeys([*EVENT_COLUMNS, *TENSOR_COLUMNS, COMPLETE_COLUMN]))
    for col in required:
        if col not in long.columns:
            raise ValueError(f"not an auditor CSV: column {col!r} is missing")
    has_tensor = long["role"] != ""
    ev = long.drop_duplicates("seq", keep="first")
    events = pd.DataFrame(
        {col: _parse(ev[col], col, dtype) for col, dtype in EVENT_COLUMNS.items()}
    ).reset_index(drop=True)
    tv = long[has_tensor]
    tensors = pd.DataFrame(
        {col: _parse(tv[col], col, dtype) for col, dtype in TENSOR_COLUMNS.items()}
    ).reset_index(drop=True)
    complete = bool(len(long) == 0 or (long[COMPLETE_COLUMN] == "True").all())
    return events, tensors, complete


def _parse(series: pd.Series, name: str, dtype: str):
    values = series.to_numpy()
    try:
        if dtype == "category":
            allowed = FIXED_CATEGORIES.get(name)
            if allowed is not None:
                unknown = sorted(set(values) - set(allowed))
                if unknown:
                    raise ValueError(f"unknown value {unknown[0]!r}")
            return _categorical(list(values), name)
        if dtype == "bool":
            bad = ~np.isin(values, ["True", "False"])
            if bad.any():
                raise ValueError(f"{values[bad][0]!r}")
            return values == "True"
        if dtype == "float64":
            return pd.to_numeric(pd.Series(values), errors="raise").to_numpy(dtype=np.float64)
        return pd.to_numeric(pd.Series(values), errors="raise").to_numpy().astype(dtype)
    except (ValueError, TypeError) as exc:
        raise ValueError(f"column {name!r} does not hold {dtype} values: {exc}") from None
