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
from .recorder import PHASES, ROLES, RawLog, module_names

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


def build_frames(raw: RawLog) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Raw tuples -> (events, tensors), the only place DataFrames are made from a recording."""
    n = len(raw.events)
    funcs, phases, modules, sources, requested, durations = (
        zip(*raw.events) if n else ((),) * 6
    )
    op_names = {f: str(f) for f in set(funcs)}
    mod_map = module_names(dict.fromkeys(modules), raw.module_types)

    rows = raw.tensors
    seq = np.fromiter((r[0] for r in rows), dtype=np.int32, count=len(rows))
    role = np.fromiter((r[1] for r in rows), dtype=np.int8, count=len(rows))
    shapes = [tuple(r[6]) for r in rows]
    strides = [tuple(r[7]) for r in rows]
    labels = [format_label(s, st) for s, st in zip(shapes, strides)]
    itemsize = {}
    dtype_names = {}
    for r in rows:
        if r[9] not in dtype_names:
            dtype_names[r[9]] = str(r[9]).replace("torch.", "")
            itemsize[r[9]] = r[9].itemsize
    device_names = {d: str(d) for d in {r[10] for r in rows}}
    tensors = pd.DataFrame(
        {
            "seq": seq,
            "role": pd.Categorical.from_codes(role, categories=list(ROLES)),
            "position": np.fromiter((r[2] for r in rows), dtype=np.int16, count=len(rows)),
            "item": np.fromiter((r[3] for r in rows), dtype=np.int16, count=len(rows)),
            "arg": _categorical([r[4] for r in rows], "arg"),
            "tid": np.fromiter((r[5] for r in rows), dtype=np.int32, count=len(rows)),
            "ndim": np.fromiter((len(s) for s in shapes), dtype=np.int8, count=len(rows)),
            "shape": _categorical([str(s) for s in shapes], "shape"),
            "strides": _categorical([str(s) for s in strides], "strides"),
            "storage_offset": np.fromiter((r[8] for r in rows), dtype=np.int64, count=len(rows)),
            "dtype": _categorical([dtype_names[r[9]] for r in rows], "dtype"),
            "device": _categorical([device_names[r[10]] for r in rows], "device"),
            "format": _categorical(labels, "format"),
            "is_param": np.fromiter((r[11] for r in rows), dtype=bool, count=len(rows)),
            "is_view": np.fromiter((r[12] for r in rows), dtype=bool, count=len(rows)),
            "bytes": np.fromiter(
                (nbytes(s, itemsize[r[9]]) for s, r in zip(shapes, rows)), dtype=np.int64, count=len(rows)
            ),
        }
    )
    in_format = [""] * n
    out_format = [""] * n
    for s, r, label in zip(seq.tolist(), role.tolist(), labels):
        target = in_format if r == 0 else out_format
        if target[s] == "":
            target[s] = label
    events = pd.DataFrame(
        {
            "seq": np.arange(n, dtype=np.int32),
            "op": _categorical([op_names[f] for f in funcs], "op"),
            "phase": pd.Categorical.from_codes(np.asarray(phases, dtype=np.int8), categories=list(PHASES)),
            "module": _categorical([mod_map[m][0] for m in modules], "module"),
            "module_type": _categorical([mod_map[m][1] for m in modules], "module_type"),
            "source": _categorical(list(sources), "source"),
            "requested_format": _categorical(list(requested), "requested_format"),
            "in_format": _categorical(in_format, "in_format"),
            "out_format": _categorical(out_format, "out_format"),
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
