"""Recording sessions: ``FormatAuditor`` (any block of code) and one audited training step.

``FormatAuditor`` is the public face of the recorder, like ``torch.utils.flop_counter``'s
``FlopCounterMode``: it owns the private dispatch mode and the module tracker, and hands back an
:class:`~auditor._result.Audit`. :func:`record_step` is what "one step" means everywhere (the
``audit()`` function, layout plans, fake audits reuse its pieces).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping

import torch

from ._result import Audit
from .recording._mode import RawLog, RecorderMode, process_group
from .recording._modules import ForwardModuleTracker
from .recording._profile import ProfileSession, join
from .recording._torch import current_dispatch_mode_stack, pop_mode, require_recorder


class FormatAuditor:
    """Record every aten op run inside the ``with`` block; ``fa.audit`` is the result.

    A thin owner of a private ``TorchDispatchMode`` and torch's ``ModuleTracker``, like
    ``torch.utils.flop_counter.FlopCounterMode``. Forward, backward (the autograd engine, on
    whichever of its threads it runs) and optimizer steps inside the block are all recorded;
    the ops and module calls of other threads are not. Entering and leaving leave no mode and
    no hook behind, whatever fails (``KeyboardInterrupt`` included).

    Args:
        strict: raise :class:`auditor.FormatLossError` at the first op that loses channels_last
            (the tutorial's ``check_wrapper``, but exact about views, copies and ambiguity).
        record_source: also record the user's source line of each op (slower).
        record_time: also measure each op: its kernels' time from torch's profiler
            (``time_us``, without the recorder's own Python), the copies its kernels make
            (``Audit.hidden``), the time outside ops before it (``gap_us``) and the wall time
            around it inside the mode (``duration_us``). When a profiler is already running,
            only ``duration_us`` is measured.
        profile: with ``record_time``, use torch's profiler (the default); ``False`` measures
            the wall time around each op alone, at less cost.
    """

    def __init__(self, *, strict: bool = False, record_source: bool = False, record_time: bool = False,
                 profile: bool = True):
        self.strict = strict  # raise FormatLossError at the first loss
        self.record_source = record_source  # the user's file:line per op
        self.record_time = record_time  # kernel time per op, the copies inside it, wall time around it
        self.profile = profile  # record_time through torch's profiler (False: the wall time alone)
        self._audit: Audit | None = None
        self._state = "new"  # "recording" inside the block, "done" after it
        self._mode: RecorderMode | None = None
        self._tracker: ForwardModuleTracker | None = None
        self._profile: ProfileSession | None = None
        self._hooks: list = []

    @property
    def audit(self) -> Audit:
        """The recorded audit; built on first access, after the block ends."""
        if self._audit is None:
            if self._state == "new":
                raise RuntimeError("FormatAuditor has not recorded anything yet: use it in a `with` block")
            if self._state == "recording":
                raise RuntimeError("the audit is available once the `with` block has ended")
            raise RuntimeError("no audit was recorded")
        return self._audit

    def __enter__(self) -> FormatAuditor:
        if self._state == "recording":
            raise RuntimeError("this FormatAuditor is already recording: nest a new FormatAuditor instead")
        require_recorder()  # a torch without the private entry points says so before anything starts
        self._audit = None
        self._tracker = tracker = ForwardModuleTracker()
        self._mode = mode = RecorderMode(
            tracker, strict=self.strict, record_source=self.record_source, record_time=self.record_time
        )
        from torch.optim.optimizer import (
            register_optimizer_step_post_hook,
            register_optimizer_step_pre_hook,
        )

        def pre(*_):
            mode.optimizer_depth += 1

        def post(*_):
            mode.optimizer_depth = max(0, mode.optimizer_depth - 1)

        # whatever fails on the way in (KeyboardInterrupt included) leaves no hook and no mode
        try:
            self._hooks.append(register_optimizer_step_pre_hook(pre))
            self._hooks.append(register_optimizer_step_post_hook(post))
            tracker.__enter__()
            if self.record_time and self.profile:
                self._profile = ProfileSession(record_shapes=True)
                self._profile.start()  # before the mode, so its own records are inside
            mode.__enter__()
            self._state = "recording"
        except BaseException:
            self._mode = None
            self._state = "done"
            try:
                _leave(mode)
            finally:
                self._teardown()
                mode.release()
            raise
        return self

    def __exit__(self, exc_type, exc, tb):
        mode, tracker = self._mode, self._tracker
        self._mode = None  # the block's buffers go with the Audit built from them
        self._state = "done"
        # the mode, the hooks and the profiler go first, whatever fails after them
        result = None
        try:
            try:
                _leave(mode, exc_type, exc, tb)
            finally:
                try:
                    result = self._profile.stop() if self._profile is not None else None
                finally:
                    types = dict(tracker.types) if tracker is not None else {}
                    self._teardown()
            rank, world_size = process_group()
            raw = RawLog(
                rank=rank,
                world_size=world_size,
                events=mode.events,
                tensors=mode.tensors,
                layouts=list(mode.layouts),
                module_types=types,
                complete=exc_type is None,
                error="" if exc_type is None else f"{exc_type.__name__}: {exc}",
                compiled=mode.compiled_events(),
            )
            if result is not None:
                timing = join([e[0] for e in mode.events], mode.failed, result)
                raw.time_ns, raw.start_ns, raw.gap_ns, raw.hidden = (
                    timing.time_ns, timing.start_ns, timing.gap_ns, timing.hidden)
            del result
            self._audit = Audit.from_raw(raw)
        finally:
            mode.release()
        if len(raw.compiled):
            warnings.warn(
                f"auditor: {len(raw.compiled)} recorded ops ran inside torch.compile'd code (events with "
                "compiled=True, their backward included); under a Python dispatch mode Dynamo runs "
                "that code eagerly, so the audit shows the eager ops and their layouts, not the "
                "compiled graph's kernels",
                UserWarning,
                stacklevel=2,
            )
        return False

    def _teardown(self) -> None:
        """Remove the optimizer hooks, the tracker's module hooks and the profiler; each is
        removed even when removing another raised."""
        hooks, self._hooks = self._hooks, []
        profile, self._profile = self._profile, None
        tracker, self._tracker = self._tracker, None
        try:
            for h in hooks:
                h.remove()
        finally:
            try:
                if profile is not None:
                    profile.stop()
            finally:
                if tracker is not None:
                    tracker.__exit__(None, None, None)


def _leave(mode: RecorderMode, exc_type=None, exc=None, tb=None) -> None:
    """Take ``mode`` off this thread's dispatch-mode stack: through its ``__exit__``, and if
    that failed before popping it, by popping it while it is on top."""
    try:
        if any(m is mode for m in current_dispatch_mode_stack()):
            mode.__exit__(exc_type, exc, tb)
    finally:
        stack = current_dispatch_mode_stack()
        if stack and stack[-1] is mode:
            pop_mode()


def loss_to_backward(loss_fn: Callable, output) -> torch.Tensor:
    """``loss_fn(output)``, checked: a step's backward needs something that requires grad."""
    loss = loss_fn(output)
    if not (isinstance(loss, torch.Tensor) and loss.requires_grad):
        raise ValueError(
            "backward=True, but the loss requires grad on nothing: give the model trainable "
            "parameters or inputs that require grad, or pass backward=False"
        )
    return loss


def default_loss(output) -> torch.Tensor:
    """The loss of a step when none is given: the sum of every floating output."""
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


def record_step(
    model: Callable,
    inputs: tuple,
    *,
    kwargs: Mapping | None = None,
    backward: bool = True,
    loss_fn: Callable | None = None,
    optimizer: torch.optim.Optimizer | None = None,
    strict: bool = False,
    record_source: bool = False,
    record_time: bool = False,
) -> Audit:
    """One step of ``model`` on ``inputs`` (and keyword arguments ``kwargs``) under a
    :class:`FormatAuditor`: the forward pass, then (``backward``) ``loss_fn(output).backward()``
    (default :func:`default_loss`), then ``optimizer.step()``. Exceptions from the model
    propagate."""
    fa = FormatAuditor(strict=strict, record_source=record_source, record_time=record_time)
    with fa:
        run_step(model, inputs, kwargs=kwargs, backward=backward, loss_fn=loss_fn, optimizer=optimizer)
    return fa.audit


def check_kwargs(kwargs) -> dict:
    """The model's keyword arguments as a dict; anything but a Mapping (or None) is refused."""
    if kwargs is None:
        return {}
    if not isinstance(kwargs, Mapping):
        raise TypeError(f"kwargs must be a mapping of keyword arguments for the model, got {type(kwargs).__name__}")
    bad = [k for k in kwargs if not isinstance(k, str)]
    if bad:
        raise TypeError(f"kwargs keys must be argument names (str), got {bad[0]!r}")
    return dict(kwargs)


def run_step(model: Callable, inputs: tuple, *, kwargs: Mapping | None = None, backward: bool = True,
             loss_fn: Callable | None = None, optimizer: torch.optim.Optimizer | None = None) -> object:
    """One step, unrecorded: the forward pass (``model(*inputs, **kwargs)``), then
    ``loss_fn(output).backward()`` and ``optimizer.step()`` when ``backward``. Returns the
    output."""
    output = model(*inputs, **check_kwargs(kwargs))
    if backward:
        loss_to_backward(loss_fn or default_loss, output).backward()
        if optimizer is not None:
            optimizer.step()
    return output
