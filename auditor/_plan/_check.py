"""Checking a plan: audits of model copies, and their outputs against the original's."""

from __future__ import annotations

import pandas as pd
import torch

from .._recording._torch import pytree
from .._result import Audit
from .._session import record_step
from .._step import Step, copy_model


def record(step: Step, record_time: bool = False) -> Audit:
    """One audited ``step`` (a training step, or an inference call under ``no_grad``)."""
    return record_step(step, record_time=record_time)


def reference_output(step: Step) -> object:
    """The output of ``step``'s model on its inputs in eval mode (deterministic: no dropout,
    running statistics), computed on a copy so the caller's model keeps its state."""
    ref = copy_model(step.model).eval()
    out = step.replace(model=ref, backward=False).run()
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
