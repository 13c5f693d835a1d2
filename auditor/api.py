"""``auditor.audit``: one audited step of a model, real or on fake tensors."""

from __future__ import annotations

from collections.abc import Callable

import torch

from .fake import fake_audit
from .result import Audit
from .session import default_loss, record_step


def audit(
    model: Callable,
    *inputs,
    backward: bool = True,
    loss_fn: Callable | None = None,
    optimizer: torch.optim.Optimizer | None = None,
    strict: bool = False,
    record_source: bool = True,
    record_time: bool = False,
    fake: bool = False,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
) -> Audit:
    """Run one step of ``model`` on ``inputs`` under a :class:`FormatAuditor` and return the Audit.

    The step is the forward pass, then (``backward=True``) ``loss_fn(output).backward()``, where
    the default loss is ``output.sum()``, then ``optimizer.step()`` when an optimizer is given.
    Exceptions from the model propagate; ``strict=True`` raises at the first loss. Source
    lines are recorded by default, since causes name the line to change.

    ``fake=True`` runs the step on fake tensors (:mod:`auditor.fake`): parameters, buffers and
    inputs become fakes on ``device`` and, for floating tensors, ``dtype`` (by default the
    model's own), strides kept; the model and the optimizer are left untouched.
    """
    if not callable(model):
        raise TypeError(f"model must be callable, got {type(model).__name__}")
    loss_fn = loss_fn or default_loss
    if fake:
        return fake_audit(
            model, inputs, device=device, dtype=dtype, backward=backward, loss_fn=loss_fn,
            optimizer=optimizer, strict=strict, record_source=record_source, record_time=record_time,
        )
    if device is not None or dtype is not None:
        raise ValueError("device= and dtype= apply to fake audits only: pass fake=True")
    return record_step(model, inputs, backward=backward, loss_fn=loss_fn, optimizer=optimizer, strict=strict,
                       record_source=record_source, record_time=record_time)
