"""Applying a plan in place, and the re-audit that checks it."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd
import torch.nn as nn

from .._display._plans import applied_html, applied_text
from .._fix._hooks import is_conv_module
from .._result import Audit
from .._step import copy_model
from ._assign import apply_formats
from ._check import compare_outputs, hotspot_totals, record, reference_output
from ._layout import LayoutPlan


@dataclass
class AppliedPlan:
    """What :func:`apply_plan` did, and the re-audit that checks it.

    Attributes:
        changes: the weights converted (the helpers' report).
        converted_inputs: the convolutions that now convert their input first.
        hotspots: per phase, hotspot groups and bytes in the channels_last audit
            (``before``) and in the planned model's audit (``after``).
        max_abs_diff, allclose: the planned model's eval-mode output against the original's.
        before, after: the two audits (``auditor.diff(before, after)`` lists the groups).
    """

    changes: pd.DataFrame
    converted_inputs: dict[str, str]
    hotspots: pd.DataFrame
    max_abs_diff: float
    allclose: bool
    before: Audit
    after: Audit | None

    def _shown(self) -> dict:
        """What its text and its HTML show (:mod:`auditor._display`)."""
        return {"weights": len(self.changes), "input_conversions": len(self.converted_inputs),
                "checked": self.after is not None, "allclose": self.allclose, "max_abs_diff": self.max_abs_diff,
                "hotspots": self.hotspots}

    def __str__(self) -> str:
        return applied_text(**self._shown())

    def _repr_html_(self) -> str:
        return applied_html(**self._shown())


def apply_plan(model: nn.Module, plan: LayoutPlan, *, check: bool = True) -> AppliedPlan:
    """Apply ``plan`` to ``model`` in place: each convolution's weight in its planned format,
    and an input conversion (a forward pre-hook) before every convolution whose input arrives
    in another format. Earlier input conversions are removed first, so applying twice is safe.

    The model keeps taking the same inputs (the plan converts them where needed) and keeps its
    ``Parameter`` objects. With ``check=True`` a copy is re-audited on the plan's inputs and
    its eval-mode output compared with the original's; the model itself is not run.
    """
    if not isinstance(plan, LayoutPlan):
        raise TypeError(f"apply_plan expects a LayoutPlan from plan_layout, got {type(plan).__name__}")
    for name in plan.formats:
        if not is_conv_module(model, name):
            raise ValueError(f"the plan names {name!r}, which is not a convolution of this model")
    changes = apply_formats(model, plan.formats, plan.converted_inputs)
    before = hotspot_totals(plan.audit)
    after_audit, diff, close = None, float("nan"), False
    if check:
        probe = copy_model(model)
        after_audit = record(plan.step.replace(model=probe))
        after = hotspot_totals(after_audit)
        before = before.merge(after, on="phase", suffixes=("_before", "_after"))
        out = reference_output(plan.step.replace(model=model))
        diff, close = compare_outputs(plan.reference, out)
    else:
        before = before.rename(columns={"groups": "groups_before", "bytes": "bytes_before"})
        before["groups_after"] = pd.NA
        before["bytes_after"] = pd.NA
    return AppliedPlan(changes, dict(plan.converted_inputs), before, diff, close, plan.audit, after_audit)
