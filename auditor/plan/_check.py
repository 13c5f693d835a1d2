"""Checking a plan: audits of model copies, and their outputs against the original's."""

from __future__ import annotations

import copy

import pandas as pd
import torch
import torch.nn as nn

from .._result import Audit
from .._session import record_step
from ..recording._torch import pytree


def bind(model, kwargs: dict | None):
    """``model``, or a callable that passes ``kwargs`` to it with the positional inputs."""
    if not kwargs:
        return model

    def call(*inputs):
        return model(*inputs, **kwargs)
    return call


def record(model, inputs, train, loss_fn, record_time=False, kwargs: dict | None = None) -> Audit:
    """One audited training step (``train``) or inference call of ``model`` on ``inputs``
    (and keyword arguments ``kwargs``)."""
    model = bind(model, kwargs)
    if train:
        return record_step(model, tuple(inputs), backward=True, loss_fn=loss_fn, record_time=record_time)
    with torch.no_grad():
        return record_step(model, tuple(inputs), backward=False, record_time=record_time)


def reference_output(model: nn.Module, inputs, kwargs: dict | None = None) -> object:
    """The model's output on ``inputs`` in eval mode (deterministic: no dropout, running
    statistics), computed on a copy so the caller's model keeps its state."""
    ref = copy.deepcopy(model).eval()
    with torch.no_grad():
        out = ref(*inputs, **(kwargs or {}))
    return pytree.tree_map(lambda t: t.detach().clone() if isinstance(t, torch.Tensor) else t, out)


def compare_outputs(a, b) -> tuple[float, bool]:
    """(max abs difference, allclose) of two model outputs, leaf by leaf."""
    la = [t for t in pytree.tree_leaves(a) if isinstance(t, torch.Tensor)]
    lb = [t for t in pytree.tree_leaves(b) if isinstance(t, torch.Tensor)]
    if len(la) != len(lb):
        return float("inf"), False
    diff, close = 0.0, True
    for x, y in zip(la, lb):
        if x.shape != y.shape:
            return float("inf"), False
        if x.is_floating_point():
            diff = max(diff, float((x.float() - y.float()).abs().max()) if x.numel() else 0.0)
            tol = 1e-2 if x.dtype in (torch.float16, torch.bfloat16) else 1e-4
            close &= bool(torch.allclose(x.float(), y.float(), rtol=tol, atol=tol))
        else:
            close &= bool(torch.equal(x, y))
    return diff, close


def hotspot_totals(a: Audit) -> pd.DataFrame:
    """Hotspot groups and bytes per phase, and in total."""
    hot = a.hotspots()
    rows = []
    for phase in ("forward", "backward", "total"):
        sel = hot if phase == "total" else hot[hot["phase"] == phase]
        rows.append({"phase": phase, "groups": len(sel), "bytes": int(sel["bytes"].sum())})
    return pd.DataFrame(rows)
