"""What Inductor lowered, read while ``torch.compile`` compiles: plain rows, no analysis.

A compiled step runs code that Inductor generated, not the aten ops a dispatch mode sees (Dynamo
even skips compiled frames while one is active). So a compiled audit watches the compiler
instead: while :class:`InductorRecorder` is active, every graph Inductor lowers (forward and
backward, one per graph break) is read right after it was scheduled and written out
(``GraphLowering.compile_to_module``), and every kernel the code generator emits is named
(``debug.set_kernel_post_grad_provenance_tracing``, called once per kernel whatever the
provenance settings). The layouts are those of Inductor's buffers after lowering, the sources
those of the FX nodes each kernel came from. :func:`kernel_times` joins a profile of the compiled
step to the kernels. All private names come from :mod:`._torch`, which checks the version first.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import warnings
from collections import defaultdict

import torch

from . import _torch as T
from ._cells import readable
from ._errors import CompileError
from ._inductor_graph import explain_layout_opt, read_graph
from ._profile import quiet_stderr


class InductorRecorder:
    """Records every graph Inductor lowers inside the ``with`` block, as plain rows (``graphs``,
    ``kernels``, ``buffers``). It turns on the profiler marks a timed audit joins
    (``cpp.enable_kernel_profile``, ``profiler_mark_wrapper_call``) and turns off the compile
    caches, whose hits skip lowering; the caller resets Dynamo so that the model compiles anew."""

    def __init__(self, profile: bool = True):
        self.profile = profile
        self.graphs: list[dict] = []
        self.kernels: list[dict] = []
        self.buffers: list[dict] = []
        self.failures: list[str] = []
        self._emitted: dict[int, list] = defaultdict(list)
        self._decisions: dict[int, dict] = {}
        self._stack = contextlib.ExitStack()
        self._lock = threading.Lock()

    def __enter__(self) -> InductorRecorder:
        T.require_inductor()
        stack = self._stack
        try:
            if self.profile:
                stack.enter_context(T.inductor_config.patch({"cpp.enable_kernel_profile": True,
                                                             "profiler_mark_wrapper_call": True}))
            stack.enter_context(torch.compiler.config.patch(force_disable_caches=True))
            # the caches are off on purpose (a cache hit skips the lowering this watches), and with
            # them Dynamo's profile-guided recompiles, which it warns about once per process
            stack.enter_context(warnings.catch_warnings())
            warnings.filterwarnings("ignore", message="dynamo_pgo force disabled", category=UserWarning)
            # Inductor's C++ builder imports torch.utils.cpp_extension, which logs "No CUDA runtime
            # is found" on a machine with a CUDA toolkit and no GPU: a fact about the machine,
            # not the model (issue 29). That one message is dropped; the logger's others stay.
            cpp_log = logging.getLogger("torch.utils.cpp_extension")
            cpp_log.addFilter(_no_cuda_runtime_note)
            stack.callback(cpp_log.removeFilter, _no_cuda_runtime_note)
            if os.environ.get("TORCHINDUCTOR_FX_COMPILE_MODE", "").lower() not in ("", "normal"):
                warnings.warn("TORCHINDUCTOR_FX_COMPILE_MODE lowers in another process, where a compiled audit "
                              "cannot see it", stacklevel=2)
            self._wrap_decision()
            self._wrap_kernel_names()
            self._wrap_lowering()
        except BaseException:
            stack.close()
            raise
        return self

    def __exit__(self, *exc) -> bool:
        self._stack.close()
        return False

    def _setattr(self, obj, name: str, value) -> None:
        missing = object()
        raw = vars(obj).get(name, missing)
        setattr(obj, name, value)
        self._stack.callback(lambda: delattr(obj, name) if raw is missing else setattr(obj, name, raw))

    # -- the wrappers ------------------------------------------------------------------------
    def _wrap_decision(self) -> None:
        """Keep what ``decide_layout_opt`` decided and why: its rules replayed on the graph it was
        given (:func:`._inductor_graph.explain_layout_opt`), and the debug lines it logged."""
        original = T.GraphLowering.__dict__["decide_layout_opt"].__func__
        log, decisions = logging.getLogger(T.GraphLowering.__module__), self._decisions

        def decide_layout_opt(gm, *, is_inference):
            lines: list[str] = []
            handler = logging.Handler(logging.DEBUG)
            handler.emit = lambda record: lines.append(record.getMessage())
            level, propagate = log.level, log.propagate
            log.addHandler(handler)
            log.setLevel(logging.DEBUG)
            log.propagate = False  # torch's own handlers would print them
            decided = None
            try:
                decided = original(gm, is_inference=is_inference)
                return decided
            finally:
                log.removeHandler(handler)
                log.setLevel(level)
                log.propagate = propagate
                try:
                    why = explain_layout_opt(gm, is_inference=is_inference, decided=decided)
                except Exception as exc:  # noqa: BLE001  (the user's compile goes on)
                    why = {"layout_opt_rule": "unexplained", "layout_opt_reason": f"auditor's replay of the "
                           f"rules failed: {type(exc).__name__}: {exc}"}
                decisions[id(gm)] = {**why, "log": lines}

        decide_layout_opt.__wrapped__ = original
        self._setattr(T.GraphLowering, "decide_layout_opt", staticmethod(decide_layout_opt))

    def _wrap_kernel_names(self) -> None:
        """Every backend names each kernel it emits through this function, which codegen modules
        import by name: it is re-bound in each of them."""
        import importlib

        for name in ("torch._inductor.codegen.cpp", "torch._inductor.ir", "torch._inductor.scheduler"):
            with contextlib.suppress(ImportError):
                importlib.import_module(name)  # so that their copies of the name exist to re-bind
        original, emitted = T.inductor_debug.set_kernel_post_grad_provenance_tracing, self._emitted

        def set_kernel_post_grad_provenance_tracing(node_schedule, kernel_name, *args, **kwargs):
            is_extern = kwargs.get("is_extern", args[0] if args else False)
            emitted[id(T.inductor_V.graph)].append((kernel_name, node_schedule, bool(is_extern)))
            return original(node_schedule, kernel_name, *args, **kwargs)

        for name, module in list(sys.modules.items()):
            if name.startswith("torch._inductor") and getattr(module, "set_kernel_post_grad_provenance_tracing",
                                                               None) is original:
                self._setattr(module, "set_kernel_post_grad_provenance_tracing", set_kernel_post_grad_provenance_tracing)

    def _wrap_lowering(self) -> None:
        original, recorder = T.GraphLowering.compile_to_module, self

        def compile_to_module(graph):
            module = original(graph)
            try:
                recorder._read(graph, getattr(module, "__file__", None))
            except Exception as exc:  # noqa: BLE001  (the user's compile goes on; the audit fails later)
                recorder.failures.append(f"{type(exc).__name__}: {exc}")
            return module

        self._setattr(T.GraphLowering, "compile_to_module", compile_to_module)

    # -- reading one lowered graph -----------------------------------------------------------
    def _read(self, graph, path: str | None) -> None:
        emitted = self._emitted.pop(id(graph), [])
        if not emitted and graph.scheduler is not None and len(graph.scheduler.nodes):
            raise T.TorchInternalsError(
                f"Inductor of torch {torch.__version__} emitted kernels without naming them through "
                "set_kernel_post_grad_provenance_tracing")
        compile_id = str(T.CompileContext.current_compile_id())
        graph_row, kernels, buffers = read_graph(graph, emitted, path, compile_id,
                                                                 self._decisions.pop(id(graph.module), None))
        _name_cells(kernels)
        with self._lock:
            self.graphs.append(graph_row)
            self.kernels.extend(kernels)
            self.buffers.extend(buffers)


def _name_cells(kernels: list[dict]) -> None:
    """Each kernel's lines as the eager log names them (a notebook cell's as ``Cell In[3], line
    17``, :func:`._cells.readable`), so a compiled conversion meets the eager cause at its line."""
    for k in kernels:
        k["source"] = readable([k["source"]])[0] if k["source"] else ""
        k["sources"] = ";".join(readable(k["sources"].split(";"))) if k["sources"] else ""


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"


def _no_graph_reason() -> str:
    """Why Dynamo handed Inductor no graph: the graph-break reasons it counted."""
    reasons = [str(r).splitlines()[0] for key in ("graph_break", "unimplemented")
               for r in T.dynamo_counters.get(key, {})]
    return "; ".join(list(dict.fromkeys(reasons))[:3])


def _no_cuda_runtime_note(record: logging.LogRecord) -> bool:
    """A logging filter: False (drop) for cpp_extension's "No CUDA runtime is found" alone."""
    return not str(record.msg).startswith("No CUDA runtime is found")


def record_compiled(run, *, time: bool = True, warmup: int = 1, rounds: int = 3) -> InductorRecorder:
    """Compile and run one step (``run()``, which calls the compiled model) while recording what
    Inductor lowers; with ``time``, then profile ``rounds`` more steps after ``warmup`` and give
    each kernel its mean time (``recorder.times``). Dynamo is reset first, so that the model
    compiles inside the recorder rather than reusing code compiled earlier in the process."""
    T.require_inductor()
    T.dynamo_reset()
    T.dynamo_counters.clear()
    recorder = InductorRecorder(profile=time)
    recorder.times = {}
    with recorder:
        try:
            run()
        except T.TorchInternalsError:
            raise
        except Exception as exc:
            raise CompileError(f"torch.compile failed: {_first_line(exc)}") from exc
        if recorder.failures:
            raise T.TorchInternalsError(
                f"reading Inductor's lowered graph failed on torch {torch.__version__} (auditor is tested on "
                f"{T.INDUCTOR_SINCE} to {T.TESTED[1]}): {recorder.failures[0]}")
        if not recorder.graphs:
            why = _no_graph_reason()
            raise CompileError("torch.compile lowered no graph with Inductor (is the backend 'inductor'?)"
                               + (f": Dynamo says {why}" if why else ""))
        if time:
            for _ in range(warmup):
                run()
            prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
            with quiet_stderr():  # Kineto's start, stop and device query (issue 29): not the steps'
                prof.start()
            try:
                for _ in range(rounds):
                    run()
            finally:
                with quiet_stderr():
                    prof.stop()
            with quiet_stderr():
                events = prof.events()
            recorder.times = kernel_times(events, recorder.kernels)
    return recorder


def _profiler_name(kernel: str, kind: str, graph: int) -> str:
    """The profiler event of a kernel: ``graph_<id>_<name>`` for a generated one (the mark
    ``cpp.enable_kernel_profile`` adds), the aten op's name for an extern one."""
    if kind != "extern":
        return f"graph_{graph}_{kernel}"
    if kernel.startswith("extern_kernels."):
        return "aten::" + kernel.split(".", 1)[1]
    if kernel.startswith("torch.ops."):
        parts = kernel.split(".")
        return f"{parts[2]}::{parts[3]}"
    return kernel


def _wrapper_calls(events) -> dict[tuple, list[list]]:
    """The children of each ``graph_<id>_inductor_wrapper_call`` event, by (graph, phase): a
    backward one runs under autograd's ``CompiledFunctionBackward``."""
    calls = defaultdict(list)
    for e in events:
        if not (e.name.startswith("graph_") and e.name.endswith("_inductor_wrapper_call")):
            continue
        graph = int(e.name[len("graph_"):-len("_inductor_wrapper_call")])
        parent, phase = e.cpu_parent, "forward"
        while parent is not None:
            phase = "backward" if parent.name == "CompiledFunctionBackward" else phase
            parent = parent.cpu_parent
        calls[(graph, phase)].append(list(e.cpu_children))
    return calls


def kernel_times(events, kernels: list[dict]) -> dict[tuple, float]:
    """Mean time (µs) per call of each kernel, by (graph, phase, order). Kernels are matched to
    the events under their graph's wrapper call in code order; an extern kernel with no event of
    its own (a Python custom op) gets the events between its matched neighbours."""
    calls = _wrapper_calls(events)
    by_graph = defaultdict(list)
    for k in kernels:
        by_graph[(k["graph"], "forward" if k["phase"] == "inference" else k["phase"])].append(k)
    total, count = defaultdict(float), defaultdict(int)
    for key, ks in by_graph.items():
        for children in calls.get(key, []):
            for k, spent in zip(ks, _match(ks, children)):
                if spent is not None:
                    total[(k["graph"], k["phase"], k["order"])] += spent
                    count[(k["graph"], k["phase"], k["order"])] += 1
    return {key: total[key] / count[key] for key in total}


def _match(kernels: list[dict], children: list) -> list[float | None]:
    pos, i = {}, 0
    for n, k in enumerate(kernels):
        want = _profiler_name(k["kernel"], k["kind"], k["graph"])
        j = next((j for j in range(i, len(children)) if children[j].name == want), None)
        if j is not None:
            pos[n], i = j, j + 1
    spent = []
    for n, k in enumerate(kernels):
        if n in pos:
            spent.append(children[pos[n]].cpu_time_total)
            continue
        lo = max((pos[m] for m in pos if m < n), default=-1) + 1
        hi = min((pos[m] for m in pos if m > n), default=len(children))
        span = children[lo:hi] if k["kind"] == "extern" else []
        spent.append(sum(c.cpu_time_total for c in span) if span else None)
    return spent
