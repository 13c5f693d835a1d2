"""The event log as one CSV file, and back, with the schema's exact dtypes.

Every file this package writes goes through :func:`atomic_write`, so an interrupted write
never leaves a file that looks complete.
"""

from __future__ import annotations

import io
import os
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd

from .log import EVENT_COLUMNS, FIXED_CATEGORIES, TENSOR_COLUMNS, categorical

#: Extra column of the CSV file: whether the recording ran to its end.
COMPLETE_COLUMN = "audit_complete"


def atomic_write(path: str | os.PathLike, write: Callable[[Path], object]) -> None:
    """Call ``write(tmp)`` on a temporary name beside ``path``, then rename it to ``path``; on
    failure the temporary file is removed and ``path`` is left as it was."""
    path = Path(path)
    tmp = path.with_name(path.name + ".partial")
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def to_csv(events: pd.DataFrame, tensors: pd.DataFrame, complete: bool, path_or_buf=None):
    """One CSV file, one row per tensor with its event's columns; tensor-less events get one row
    with an empty ``role``. A path is written atomically (:func:`atomic_write`)."""
    long = events.merge(tensors, on="seq", how="left", sort=True)
    long[COMPLETE_COLUMN] = complete
    if path_or_buf is None:
        return long.to_csv(index=False)
    if isinstance(path_or_buf, (str, os.PathLike)):
        atomic_write(path_or_buf, lambda tmp: long.to_csv(tmp, index=False))
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
            return categorical(list(values), name)
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
