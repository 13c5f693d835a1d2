"""Recording sessions: ``FormatAuditor`` (any block of code) and one audited training step.

``FormatAuditor`` is the public face of the recorder, like ``torch.utils.flop_counter``'s
``FlopCounterMode``: it owns the private dispatch mode and the module tracker, and hands back an
:class:`~auditor._result.Audit`. :func:`record_step` records one :class:`~auditor._step.Step`.
"""

from __future__ import annotations

import statistics
import time
import warnings

from ._recording._mode import RecorderMode, pause_collector, resume_collector
from ._recording._modules import ForwardModuleTracker
from ._recording._profile import (
    PlainStep,
    ProfileSession,
    count_records,
    op_totals,
    profiler_records_mode_calls,
    require_profiler,
)
from ._recording._torch import (
    current_dispatch_mode_stack,
    load_what_steps_import,
    pop_mode,
    require_recorder,
)
from ._result import Audit
from ._step import Step


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
        #: the step timed without the recorder (set by :func:`record_step`): the times then
        #: leave the recorder's own cost out
        self._plain: PlainStep | None = None
        self._collector = False  # whether Python's garbage collector ran before recording paused it

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
        load_what_steps_import()
        if self.record_time and self.profile:
            require_profiler()
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
                if not profiler_records_mode_calls():
                    from ._recording._torch import RecordFunctionFast

                    mode.mark = RecordFunctionFast
                self._profile = ProfileSession(record_shapes=True)
                self._profile.start()  # before the mode, so its own records are inside
            self._collector = pause_collector()  # the log's growth would start collections
            mode.__enter__()
            self._state = "recording"
        except BaseException:
            self._mode = None
            self._state = "done"
            try:
                _leave(mode)
            finally:
                try:
                    self._teardown()
                    mode.release()
                finally:
                    resume_collector(self._collector)
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
            raw = mode.finish(types, complete=exc_type is None,
                              error="" if exc_type is None else f"{exc_type.__name__}: {exc}", profile=result,
                              plain=self._plain)
            del result
            self._audit = Audit.from_raw(raw)
        finally:
            try:
                mode.release()
            finally:
                resume_collector(self._collector)
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


#: plain steps (no recorder, no profiler) a timed audit times after its warm-up, around one
#: step under the profiler alone: the step the user runs, against which the recorder's own cost
#: is measured (their median), and what the profiler's records cost it
PLAIN_STEPS = 2


def warm_up(step: Step, steps: int, *, record_time: bool = False) -> PlainStep | None:
    """``steps`` warm-up runs of ``step`` (:meth:`Step.warm_up`); for a timed recording the last
    runs under torch's profiler with shapes recorded, as the recorded step will. The profiler's
    records take memory the plain step never touched, and where that memory is first mapped
    inside the recorded step its page faults land in the ops' times: the first audit of a
    process took 13,000-15,000 minor faults in its recorded step and read its ops 35% slower
    and its saving 40-60% higher than a second audit did (shufflenet_v2_x1_0, 8x3x128x128);
    after a profiled warm-up, 4,000-5,000 and within 7% of the second audit.

    A timed recording then times the step the user runs: :data:`PLAIN_STEPS` steps with nothing
    watching them, and between them one under the profiler alone (process CPU time each), which
    says what a profiler record costs (:class:`PlainStep`). None when untimed, without warm-up
    (a first step is no step to compare with) or under the user's profiler."""
    if steps <= 0:
        return None
    if not record_time:
        step.warm_up(steps)
        return None
    step.warm_up(steps - 1)
    if _profiled(step) is None:  # the user's profiler runs
        return None
    plain = [_plain_cpu_ns(step)]
    profiled = _profiled(step)
    plain.extend(_plain_cpu_ns(step) for _ in range(PLAIN_STEPS - 1))
    if profiled is None:
        return None
    return PlainStep(cpu_ns=int(statistics.median(plain)), steps=len(plain), profiled_ns=profiled[0],
                     profiled_records=profiled[1], op_totals=profiled[2])


def _plain_cpu_ns(step: Step) -> int:
    """One step with nothing watching it: its process CPU time."""
    c0 = time.process_time_ns()
    step.warm_up(1)
    return time.process_time_ns() - c0


def _profiled(step: Step) -> tuple[int, int, dict] | None:
    """One step under torch's profiler alone, shapes recorded: (its process CPU time, the records
    the profiler made, each op's calls and time: :func:`op_totals`), or None when the user's
    profiler runs (the step then runs under it)."""
    session = ProfileSession(record_shapes=True)
    session.start()
    try:
        c0, w0 = time.process_time_ns(), time.perf_counter_ns()
        step.warm_up(1)
        spent, wall = time.process_time_ns() - c0, time.perf_counter_ns() - w0
    finally:
        result = session.stop()
    if result is None:
        return None
    roots = result.experimental_event_tree()
    # the profiler's clock is the wall's: on a busy machine its records also count the slices
    # other processes ran, which the step's CPU time says how much of
    on_cpu = min(1.0, spent / wall) if wall > 0 else 1.0
    return spent, count_records(roots), {k: (n, round(t * on_cpu)) for k, (n, t) in op_totals(roots).items()}


def record_step(step: Step, *, strict: bool = False, record_source: bool = False, record_time: bool = False,
                warmup: int | None = None, compiled=None, threads: int | None = None,
                plain: PlainStep | None = None) -> Audit:
    """``step`` run once under a :class:`FormatAuditor`; the Audit knows the ``warmup`` steps run
    before it, the intra-op ``threads`` its times were taken at (None: not fixed by the audit)
    and, for a compiled audit, the ``compiled`` step (a ``CompiledStep``). Given the ``plain``
    step's time (:func:`warm_up`), the times leave the recorder's cost out. Exceptions from the
    model propagate."""
    fa = FormatAuditor(strict=strict, record_source=record_source, record_time=record_time)
    fa._plain = plain
    with fa:
        step.run()
    return fa.audit._with(warmup=warmup, compiled=compiled, threads=threads)


def record_compiled_step(step: Step, compile_options: dict | None = None, record_time: bool = True):
    """Compile ``step``'s model with Inductor (or take the ``torch.compile``'d module it is),
    run one step under :func:`~auditor._recording._inductor.record_compiled` and return what was
    lowered as a :class:`~auditor._analysis.CompiledStep`. Gradients are given back the values
    they had, so an eager recording of the same step sees what it would have seen."""
    import torch

    from ._analysis._compiled import CompiledStep
    from ._recording._inductor import record_compiled
    from ._recording._torch import is_compiled_module

    model = step.model
    compiled = model if is_compiled_module(model) else torch.compile(model, **(compile_options or {}))
    run = step.replace(model=compiled)
    leaves = [p for p in compiled.parameters() if p.requires_grad] if isinstance(compiled, torch.nn.Module) else []
    leaves += [t for t in (*step.inputs, *step.kwargs.values()) if isinstance(t, torch.Tensor) and t.requires_grad]
    grads = [t.grad for t in leaves]
    try:
        recorder = record_compiled(run.run, time=record_time)
    finally:
        for t, g in zip(leaves, grads):
            t.grad = g
    return CompiledStep.from_rows(recorder.graphs, recorder.kernels, recorder.buffers, recorder.times,
                                  torch.__version__)
