"""The public entry points: ``FormatAuditor`` (a context manager) and ``audit`` (one step)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from .audit import Audit
from .recorder import RawLog, _RecorderMode, _Tracker


class FormatAuditor:
    """Record every aten op run inside the ``with`` block; ``fa.audit`` is the result.

    A thin owner of a private ``TorchDispatchMode`` and torch's ``ModuleTracker``, like
    ``torch.utils.flop_counter.FlopCounterMode``. Forward, backward (the autograd engine) and
    optimizer steps inside the block are all recorded.

    Args:
        strict: raise :class:`auditor.FormatLossError` at the first op that loses channels_last
            (the tutorial's ``check_wrapper``, but exact about views, copies and ambiguity).
        record_source: also record the user's source line of each op (slower).
        record_time: also record each op's wall time in ``duration_us`` (see the README on
            what a Python mode does to timings).
    """

    def __init__(self, *, strict: bool = False, record_source: bool = False, record_time: bool = False):
        self.strict = strict
        self.record_source = record_source
        self.record_time = record_time
        self._audit: Audit | None = None
        self._mode: _RecorderMode | None = None
        self._tracker: _Tracker | None = None
        self._hooks: list = []

    @property
    def audit(self) -> Audit:
        """The recorded audit; built on first access, after the block ends."""
        if self._audit is None:
            if self._mode is None:
                raise RuntimeError("FormatAuditor has not recorded anything yet: use it in a `with` block")
            if self._tracker is not None:
                raise RuntimeError("the audit is available once the `with` block has ended")
            raise RuntimeError("no audit was recorded")
        return self._audit

    def __enter__(self) -> FormatAuditor:
        self._audit = None
        self._tracker = _Tracker()
        self._mode = _RecorderMode(
            self._tracker, strict=self.strict, record_source=self.record_source, record_time=self.record_time
        )
        mode = self._mode
        from torch.optim.optimizer import (
            register_optimizer_step_post_hook,
            register_optimizer_step_pre_hook,
        )

        def pre(*_):
            mode.optimizer_depth += 1

        def post(*_):
            mode.optimizer_depth = max(0, mode.optimizer_depth - 1)

        self._hooks = [register_optimizer_step_pre_hook(pre), register_optimizer_step_post_hook(post)]
        self._tracker.__enter__()
        try:
            mode.__enter__()
        except BaseException:
            self._teardown()
            raise
        return self

    def __exit__(self, exc_type, exc, tb):
        mode = self._mode
        try:
            mode.__exit__(exc_type, exc, tb)
        finally:
            types = dict(self._tracker.types) if self._tracker else {}
            self._teardown()
            rank, world_size = _process_group()
            raw = RawLog(
                rank=rank,
                world_size=world_size,
                events=mode.events,
                tensors=mode.tensors,
                layouts=list(mode.layouts),
                module_types=types,
                complete=exc_type is None,
                error="" if exc_type is None else f"{exc_type.__name__}: {exc}",
            )
            mode.release()
            self._audit = Audit.from_raw(raw)
        return False

    def _teardown(self) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks = []
        if self._tracker is not None:
            self._tracker.__exit__(None, None, None)
            self._tracker = None


def _process_group() -> tuple[int, int]:
    """(rank, world_size) of the default process group, or (0, 1) outside one."""
    dist = getattr(torch, "distributed", None)
    if dist is not None and dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def loss_to_backward(loss_fn: Callable, output) -> torch.Tensor:
    """``loss_fn(output)``, checked: a step's backward needs something that requires grad."""
    loss = loss_fn(output)
    if not (isinstance(loss, torch.Tensor) and loss.requires_grad):
        raise ValueError(
            "backward=True, but the loss requires grad on nothing: give the model trainable "
            "parameters or inputs that require grad, or pass backward=False"
        )
    return loss


def _default_loss(output) -> torch.Tensor:
    if isinstance(output, torch.Tensor):
        return output.float().sum()
    if isinstance(output, dict):
        output = list(output.values())
    if isinstance(output, (list, tuple)):
        parts = [o.float().sum() for o in output if isinstance(o, torch.Tensor) and o.is_floating_point()]
        if parts:
            return torch.stack(parts).sum()
    raise TypeError(
        f"cannot make a loss from a model output of type {type(output).__name__}; pass loss_fn="
    )


def audit(
    model: Callable,
    *inputs,
    backward: bool = True,
    loss_fn: Callable | None = None,
    optimizer: torch.optim.Optimizer | None = None,
    strict: bool = False,
    record_source: bool = False,
    record_time: bool = False,
    fake: bool = False,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
) -> Audit:
    """Run one step of ``model`` on ``inputs`` under a :class:`FormatAuditor` and return the Audit.

    The step is the forward pass, then (``backward=True``) ``loss_fn(output).backward()``, where
    the default loss is ``output.sum()``, then ``optimizer.step()`` when an optimizer is given.
    Exceptions from the model propagate; ``strict=True`` raises at the first loss.

    ``fake=True`` runs the step on fake tensors (:mod:`auditor.fake`): parameters, buffers and
    inputs become fakes on ``device`` and, for floating tensors, ``dtype`` (by default the
    model's own), strides kept; the model and the optimizer are left untouched.
    """
    if not callable(model):
        raise TypeError(f"model must be callable, got {type(model).__name__}")
    loss_fn = loss_fn or _default_loss
    if fake:
        from .fake import fake_audit  # imports this module: a late import keeps the cycle open

        return fake_audit(
            model, inputs, device=device, dtype=dtype, backward=backward, loss_fn=loss_fn,
            optimizer=optimizer, strict=strict, record_source=record_source, record_time=record_time,
        )
    if device is not None or dtype is not None:
        raise ValueError("device= and dtype= apply to fake audits only: pass fake=True")
    fa = FormatAuditor(strict=strict, record_source=record_source, record_time=record_time)
    with fa:
        output = model(*inputs)
        if backward:
            loss = loss_to_backward(loss_fn, output)
            loss.backward()
            if optimizer is not None:
                optimizer.step()
    return fa.audit
