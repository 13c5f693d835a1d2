"""Which tensor rows are activations: the one definition the analyzers share.

An activation input is a floating tensor read by an op that is not a parameter and not in a
weight, bias or running-statistics argument (``rules.WEIGHT_ARGS``), as in
``auditor.recording.rules``, whose scalar rule decides for one op from the same facts.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from ..recording import rules


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
