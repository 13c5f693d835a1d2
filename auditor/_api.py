"""``auditor.audit``: one audited step of a model, real or on fake tensors."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar

import torch

from ._fake import fake_audit, resolve_device, resolve_dtype
from ._recording._torch import is_compiled_module, original_module
from ._result import Audit
from ._session import record_compiled_step, record_step, warm_up
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

    ``fake=True`` runs the step on fake tensors: parameters, buffers, inputs and the tensors in
    ``kwargs`` become fakes on ``device`` and, for floating tensors, ``dtype`` (by default the
    model's own), strides kept; the model and the optimizer are left untouched. ``device`` and
    ``dtype`` apply to fake audits only, and ``warmup`` to real ones.

    ``warmup`` steps run unrecorded first, so that times are those of a steady step rather than
    of the first one in the process (which sets up kernels and memory): by default one when the
    audit is timed, none otherwise (``warmup=0`` times the first step). A timed audit with a
    warm-up then runs three more steps to time the step without the auditor (two with nothing
    watching, one under the profiler alone): the recorder's own cost is kept out of the times and
    shown on its own line (docs, "The time model"). They are real steps: they
    update batch-norm statistics and, with an optimizer, the parameters, but every gradient
    is given back the value it had, so the recorded step sees the gradients it would have seen.

    ``compile=True`` (or a model that ``torch.compile`` already wrapped) also compiles the step
    with Inductor (``compile_options`` go to ``torch.compile``), runs it once while recording
    what Inductor lowers, and times its kernels (``record_time``): ``Audit.compiled``
    (``conversions()``, ``graphs()``, ``kernels()``) and :func:`auditor.compare_compiled` then
    describe the compiled step, while ``events`` and the causes are those of the eager step
    (docs, "Compiled models"). It runs on the model's own device and dtype: ``device=`` and
    ``dtype=`` are refused. A model that does not compile raises :class:`auditor.CompileError`
    with Dynamo's reason.

    Every argument is checked, alone and against the others, before any step runs: a refused
    call (``ValueError`` or ``TypeError``) has changed nothing, batch-norm statistics included.
    """
    step = Step(model, inputs, kwargs or {}, backward=backward, loss_fn=loss_fn, optimizer=optimizer)
    compiled = compile or is_compiled(model)
    _check(step, compile=compile, compiled=compiled, compile_options=compile_options, fake=fake, device=device,
           dtype=dtype, record_time=record_time, warmup=warmup)
    record_time = not fake if record_time is None else record_time
    if warmup is None:
        warmup = 1 if record_time and not fake else 0
    if fake:
        return fake_audit(step, device=device, dtype=dtype, strict=strict, record_source=record_source)
    if compiled:
        return _compiled_audit(step, compile_options, record_time=record_time, strict=strict,
                               record_source=record_source, warmup=warmup)
    with timing_threads(record_time) as threads:
        plain = warm_up(step, warmup, record_time=record_time)
        return record_step(step, strict=strict, record_source=record_source, record_time=record_time,
                           warmup=warmup, threads=threads, plain=plain)


#: who is told when a compiled audit moves from compiling to recording the eager step (the CLI's
#: progress): a callable of the stage's name, set with :func:`stages`
_STAGE: ContextVar[Callable[[str], None] | None] = ContextVar("auditor_stage", default=None)


@contextmanager
def stages(tell: Callable[[str], None]) -> Iterator[None]:
    """Inside, :func:`audit` calls ``tell("compiling")`` before a compiled audit compiles and
    runs the compiled step, and ``tell("recording")`` before it records the eager one."""
    token = _STAGE.set(tell)
    try:
        yield
    finally:
        _STAGE.reset(token)


def _tell(stage: str) -> None:
    tell = _STAGE.get()
    if tell is not None:
        tell(stage)


#: the intra-op threads a timed audit's step runs at (docs, "The time model")
TIMED_THREADS = 1


@contextmanager
def timing_threads(record_time: bool) -> Iterator[int | None]:
    """Inside: a timed step runs at :data:`TIMED_THREADS` intra-op threads, as ``Fixes.verify``
    times it, and yields that count; an untimed one runs at the user's count and yields None.
    With several OpenMP threads on a busy machine every parallel region waits for a descheduled
    thread, and that wait shows up as op time (seconds for a 78 ms step); at one thread the
    process CPU time the recorder takes holds. The user's count is restored on the way out,
    whatever is raised (``KeyboardInterrupt`` included)."""
    if not record_time:
        yield None
        return
    before = torch.get_num_threads()
    torch.set_num_threads(TIMED_THREADS)
    try:
        yield TIMED_THREADS
    finally:
        torch.set_num_threads(before)


def _check(step: Step, *, compile: bool, compiled: bool, compile_options, fake: bool, device, dtype,
           record_time: bool | None, warmup) -> None:
    """Refuse an argument that is wrong, or that does not apply with the others, before any step
    runs (a warm-up step would already have moved batch-norm statistics)."""
    if warmup is not None and (not isinstance(warmup, int) or isinstance(warmup, bool) or warmup < 0):
        raise ValueError(f"warmup is a number of steps, at least 0, got {warmup!r}")
    if not step.backward:
        given = [name for name, value in (("loss_fn", step.loss_fn), ("optimizer", step.optimizer)) if value is not None]
        if given:
            raise ValueError(f"{' and '.join(given)} apply to a step with a backward pass: drop "
                             f"{'them' if len(given) > 1 else 'it'}, or pass backward=True")
    if compile_options is not None and not compile:
        raise ValueError("compile_options= applies with compile=True")
    if fake:
        if compiled:
            raise ValueError("a fake audit runs no compiled code: compile=True needs real tensors")
        if record_time:
            raise ValueError("fake tensors run no kernels, so a fake audit has no times: leave record_time unset")
        if warmup:
            raise ValueError("a fake audit runs no real step, so there is nothing to warm up: leave warmup unset")
        resolve_dtype(dtype)
        if device is not None:
            resolve_device(device, [])
        return
    if device is not None or dtype is not None:
        given = " and ".join(f"{n}=" for n, v in (("device", device), ("dtype", dtype)) if v is not None)
        if compiled:
            raise ValueError(f"{given} do not apply to a compiled audit, which runs the model on its own device "
                             "and dtype: move the model and its inputs instead")
        raise ValueError("device= and dtype= apply to fake audits only: pass fake=True")


def is_compiled(model) -> bool:
    """Whether ``model`` is a module ``torch.compile`` wrapped."""
    return is_compiled_module(model)


def _compiled_audit(step: Step, compile_options, *, record_time: bool, strict: bool, record_source: bool,
                    warmup: int) -> Audit:
    """The eager step recorded as usual, with what Inductor lowered for the compiled one."""
    model = step.model
    eager = step.replace(model=original_module(model)) if is_compiled(model) else step
    _tell("compiling")
    # lowered and timed at the thread count the eager ops are timed at (Inductor's C++ kernels
    # take the thread count at compile time), so that graph and op times are of the same kind
    with timing_threads(record_time):
        compiled = record_compiled_step(step if is_compiled(model) else eager, dict(compile_options or {}),
                                        record_time=record_time)
    _tell("recording")
    with timing_threads(record_time) as threads:
        warm_up(eager, warmup, record_time=record_time)
        return record_step(eager, strict=strict, record_source=record_source, record_time=record_time,
                           warmup=warmup, compiled=compiled, threads=threads)
