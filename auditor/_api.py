"""``auditor.audit``: one audited step of a model, real or on fake tensors."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch

from ._fake import fake_audit
from ._recording._torch import OptimizedModule, original_module
from ._result import Audit
from ._session import record_compiled_step, record_step
from ._step import Step


def audit(
    model: Callable,
    *inputs,
    kwargs: Mapping | None = None,
    backward: bool = True,
    loss_fn: Callable | None = None,
    optimizer: torch.optim.Optimizer | None = None,
    strict: bool = False,
    record_source: bool = True,
    record_time: bool | None = None,
    fake: bool = False,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
    warmup: int | None = None,
    compile: bool = False,
    compile_options: Mapping | None = None,
) -> Audit:
    """Run one step of ``model`` on ``inputs`` under a :class:`FormatAuditor` and return the Audit.

    The step is the forward pass (``model(*inputs, **kwargs)``; ``kwargs`` is a mapping of
    keyword arguments, ``None`` for none), then (``backward=True``)
    ``loss_fn(output).backward()``, where the default loss is ``output.sum()``, then
    ``optimizer.step()`` when an optimizer is given. Exceptions from the model propagate;
    ``strict=True`` raises at the first loss. Source lines and times are recorded by default,
    since causes name the line to change and rank by the time they cost (``record_time=False``
    records faster, without times; fake steps run no kernels, so they record no times and
    ``record_time=True`` with ``fake=True`` is an error).

    ``fake=True`` runs the step on fake tensors (:mod:`auditor._fake`): parameters, buffers,
    inputs and the tensors in ``kwargs`` become fakes on ``device`` and, for floating tensors,
    ``dtype`` (by default the model's own), strides kept; the model and the optimizer are left
    untouched.

    ``warmup`` steps run unrecorded first, so that times are those of a steady step rather than
    of the first one in the process (which sets up kernels and memory): by default one when the
    audit is timed, none otherwise (``warmup=0`` times the first step). They are real steps: they
    update batch-norm statistics and, with an optimizer, the parameters, but every gradient
    is given back the value it had, so the recorded step sees the gradients it would have seen.

    ``compile=True`` (or a model that ``torch.compile`` already wrapped) also compiles the step
    with Inductor (``compile_options`` go to ``torch.compile``), runs it once while recording
    what Inductor lowers, and times its kernels (``record_time``): ``Audit.conversions()``,
    ``Audit.graphs()`` and ``auditor.compare_compiled`` then describe the compiled step, while
    ``events`` and the causes are those of the eager step (README, "Compiled models"). A model
    that does not compile raises :class:`auditor.CompileError` with Dynamo's reason.
    """
    step = Step(model, inputs, kwargs or {}, backward=backward, loss_fn=loss_fn, optimizer=optimizer)
    if warmup is not None and (not isinstance(warmup, int) or isinstance(warmup, bool) or warmup < 0):
        raise ValueError(f"warmup is a number of steps, at least 0, got {warmup!r}")
    if fake and record_time:
        raise ValueError("fake tensors run no kernels, so a fake audit has no times: leave record_time unset")
    record_time = not fake if record_time is None else record_time
    if warmup is None:
        warmup = 1 if record_time else 0
    compiled = compile or is_compiled(model)
    if compiled and fake:
        raise ValueError("a fake audit runs no compiled code: compile=True needs real tensors")
    if compile_options is not None and not compile:
        raise ValueError("compile_options= applies with compile=True")
    if compiled:
        return _compiled_audit(step, compile_options, record_time=record_time, strict=strict,
                               record_source=record_source, warmup=warmup)
    if not fake:
        step.warm_up(warmup)
    if fake:
        return fake_audit(step, device=device, dtype=dtype, strict=strict, record_source=record_source)
    if device is not None or dtype is not None:
        raise ValueError("device= and dtype= apply to fake audits only: pass fake=True")
    recorded = record_step(step, strict=strict, record_source=record_source, record_time=record_time)
    recorded.warmup = warmup
    return recorded


def is_compiled(model) -> bool:
    """Whether ``model`` is a module ``torch.compile`` wrapped."""
    return isinstance(model, OptimizedModule)


def _compiled_audit(step: Step, compile_options, *, record_time: bool, strict: bool, record_source: bool,
                    warmup: int) -> Audit:
    """The eager step recorded as usual, with what Inductor lowered for the compiled one."""
    model = step.model
    eager = step.replace(model=original_module(model)) if is_compiled(model) else step
    compiled = record_compiled_step(step if is_compiled(model) else eager, dict(compile_options or {}),
                                    record_time=record_time)
    eager.warm_up(warmup)
    result = record_step(eager, strict=strict, record_source=record_source, record_time=record_time)
    result.compiled_step = compiled
    result.warmup = warmup
    return result
