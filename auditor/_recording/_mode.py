"""The recorder's dispatch mode: appends raw values per aten op, and nothing else.

This is the hot path (one call per aten op), so it only appends what is cheap to read: one
event tuple per op and seven values per tensor (a weak reference as its identity, an interned
layout number). Labels, bytes and DataFrames are built once, at the end, by :mod:`auditor._recording._log`.
Module attribution reads :class:`~auditor._recording._modules.ForwardModuleTracker` in forward;
a backward op takes the module of the forward op that created its autograd node, found by the
node's sequence number (or, while a module's forward runs again inside backward, as activation
checkpointing does, that module). The per-overload schema facts the hot path needs are cached
here too.

A tensor without strides (sparse, nested, mkldnn) is recorded with its sizes as far as each is
one number (-1 for a ragged one) and no strides, and the log marks its layout not applicable.
"""

from __future__ import annotations

import gc
import os
import sys
import threading
import time
import weakref
from bisect import bisect_right
from dataclasses import dataclass, field
from itertools import islice

import torch

from . import _rules as rules
from ._facts import FactsReplay
from ._formats import format_label, has_strides, nbytes
from ._modules import GLOBAL_LABEL, ForwardModuleTracker, module_names
from ._profile import PlainStep, StepTime, join, take_out_recorder
from ._torch import (
    MODE_RECORD,
    OP_CALL_FORWARDS,
    OpOverload,
    TorchDispatchMode,
    autograd_sequence_nr,
    current_autograd_node,
    current_graph_task_id,
    dispatch_has_kernel_for_dispatch_key,
    eval_frame,
    is_view,
    node_sequence_nr,
    op_schema,
    set_eval_frame,
    storage_id,
)

FORWARD, BACKWARD, OTHER = 0, 1, 2
PHASES = ("forward", "backward", "other")
INPUT, OUTPUT = 0, 1
ROLES = ("input", "output")

_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
_AUDITOR_DIR = os.path.dirname(os.path.dirname(__file__)) + os.sep  # the whole package

_Tensor = torch.Tensor
_Parameter = torch.nn.Parameter
_STRIDED = torch.strided
#: ``t.device`` makes a new object per call; a CPU tensor's layout key shares this one
_CPU = torch.device("cpu")
_graph_task_id = current_graph_task_id
_current_node = current_autograd_node
_sequence_nr = autograd_sequence_nr
_get_ident = threading.get_ident
_set_eval_frame = set_eval_frame
_perf_counter_ns = time.perf_counter_ns
_process_time_ns = time.process_time_ns
_grad_enabled = torch.is_grad_enabled
_weakref = weakref.ref


class FormatLossError(RuntimeError):
    """Raised by ``strict=True`` at the first op that loses channels_last (a ``loses`` row)."""


@dataclass(frozen=True)
class _OpInfo:
    """What the recorder needs from an op's schema, computed once per overload."""

    func: object  # the OpOverload
    name: str
    arg_names: tuple[str, ...]
    view_outputs: tuple[bool, ...]  # result i aliases an input without moving data
    memory_format_index: int  # position of a memory_format argument, or -1
    list_return: bool  # the op returns one Tensor[] (split, chunk, unbind)
    tensor_args: tuple[int, ...]  # positions that can hold a tensor or a list of them
    keeps_layout: bool  # the one result has the layout of argument 0 (detach, relu_, add_, ...)
    plain: bool  # an OpOverload whose __call__ only forwards to the C++ op in ``_op``
    inplace: bool  # writes its argument 0 in place (add_, copy_, relu_)
    maybe_alias: bool  # a composite op that returns a view or a copy (reshape, contiguous)

    def slot(self, role: int, position: int, item: int, copied: bool = False) -> tuple[str, bool]:
        """(argument name, is a view) of the tensor a raw row puts at (role, position, item);
        ``copied``: this call of a maybe-alias op returned a copy."""
        if role == INPUT:
            names = self.arg_names
            return (names[position] if 0 <= position < len(names) else "", False)
        if copied:
            return ("", False)
        views = self.view_outputs
        if self.list_return:
            return ("", views[0])
        return ("", item < 0 and position < len(views) and views[position])


#: id(OpOverload) -> _OpInfo. Keyed by id: OpOverload.__hash__ is a Python method, one call
#: per op; the entry's ``func`` tells a reused id from the op it was made for.
_OP_INFO: dict[int, _OpInfo] = {}
_HIDDEN_VIEWS = frozenset({"aten._unsafe_view.default", "aten._reshape_alias.default"})
_SAME_LAYOUT = frozenset({"aten.detach.default", "aten.alias.default"})


def op_info(func) -> _OpInfo:
    """What the recorder needs from ``func``'s schema, built on the first call per overload."""
    info = _OP_INFO.get(id(func))
    return info if info is not None and info.func is func else _op_info(func)


def _op_info(func) -> _OpInfo:
    schema = op_schema(func)
    names = tuple(a.name for a in schema.arguments)
    views = tuple(
        r.alias_info is not None and not r.alias_info.is_write for r in schema.returns
    )
    if str(func) in _HIDDEN_VIEWS or torch.Tag.inplace_view in func.tags:
        # aliases the schema does not call views: _unsafe_view, and in-place metadata
        # changes (as_strided_, squeeze_, ...) that move no data
        views = (True,) * max(1, len(schema.returns))
    list_return = len(schema.returns) == 1 and str(schema.returns[0].type) == "List[Tensor]"
    tensor_args = tuple(i for i, a in enumerate(schema.arguments) if "Tensor" in str(a.type))
    first = schema.arguments[0] if schema.arguments else None
    inplace = first is not None and first.alias_info is not None and first.alias_info.is_write
    # An in-place pointwise op cannot resize or restride its argument (it returns it), and
    # detach and alias copy its sizes, strides and offset: their result needs no reading.
    returns_first = len(schema.returns) == 1 and schema.returns[0].alias_info is not None and \
        schema.returns[0].alias_info.is_write
    keeps_layout = len(schema.returns) == 1 and str(schema.arguments[0].type) == "Tensor" and (
        str(func) in _SAME_LAYOUT or (inplace and returns_first and torch.Tag.pointwise in func.tags)
    )
    # Composite ops reach a mode undecomposed under inference_mode; those whose schema says
    # "alias" (reshape, contiguous, flatten, to) may return a copy instead, checked per call.
    maybe_alias = any(views) and dispatch_has_kernel_for_dispatch_key(
        func.name(), "CompositeImplicitAutograd")
    info = _OpInfo(
        func, str(func), names, views,
        names.index("memory_format") if "memory_format" in names else -1, list_return,
        tensor_args, keeps_layout, type(func) is OpOverload and OP_CALL_FORWARDS,
        inplace, maybe_alias,
    )
    _OP_INFO[id(func)] = info
    return info


#: ``RecorderMode._param_types`` value for a tensor subclass whose instances say themselves
#: whether they are parameters: ``nn.Parameter(t)`` of a subclass (a ``FakeTensor`` in a fake
#: audit) keeps the subclass's type and sets ``_is_param``.
_BY_INSTANCE = object()


def _is_differentiable_view_write(args) -> bool:
    """An in-place op on a view that autograd records: it will add a CopySlices node."""
    a = args[0]
    if not isinstance(a, _Tensor) or not is_view(a) or not _grad_enabled():
        return False
    for x in args:
        if isinstance(x, _Tensor) and x.requires_grad:
            return True
    return False


def _copied(args, out) -> bool:
    """Whether a maybe-alias op (reshape, contiguous, ...) returned new memory, not a view."""
    a = args[0] if args else None
    if not isinstance(a, _Tensor) or not isinstance(out, _Tensor):
        return False
    try:
        return storage_id(out) != storage_id(a)
    except (RuntimeError, NotImplementedError):  # tensors without storage (sparse, nested)
        return False


def _param_kind(cls: type):
    if issubclass(cls, torch.nn.Parameter):
        return True
    return False if cls is torch.Tensor else _BY_INSTANCE


#: where the auditor calls the user's code: the step it runs (and the console scripts that run
#: it); the frames above one call the audit and are no op's line
_STEP_FILES = (os.path.join(_AUDITOR_DIR, "_step.py"),
               *(os.path.join(os.path.dirname(os.path.dirname(_AUDITOR_DIR)), name)
                 for name in ("format_auditor_cli.py", "format_auditor_pytest.py")))
SKIPPED_FRAME, STEP_FRAME, USER_FRAME = 0, 1, 2


def _frame_kind(filename: str) -> int:
    """Whose code a frame runs: the auditor's step that calls the model (:data:`_STEP_FILES`),
    torch's or the rest of the auditor's (its modes sit between the user's code and the
    recorder in a fake audit), or the user's."""
    if filename.startswith(_STEP_FILES):
        return STEP_FRAME
    if filename.startswith((_TORCH_DIR, _AUDITOR_DIR)) or filename.startswith("<frozen"):
        return SKIPPED_FRAME
    return USER_FRAME


#: Whether Dynamo skips the mode's dispatch code (settled below, after the class is made).
_SKIPPED_BY_DYNAMO = True

#: Fields per tensor in ``RecorderMode.tensors``, a flat list:
#: (seq, role, position, item, identity, layout, is_param).
TENSOR_FIELDS = 7
_LAYOUT = 5  # where the layout number is among them


class RecorderMode(TorchDispatchMode):
    """The private dispatch mode. Each call appends one event tuple and seven values per tensor.

    Per tensor it keeps a weak reference (the identity) and an interned layout number, so the
    log holds small shared objects only; argument names and view flags follow from the op's
    schema and are filled in when the DataFrames are built.
    """

    def __init__(self, tracker: ForwardModuleTracker, *, strict: bool, record_source: bool, record_time: bool):
        super().__init__()
        self.tracker = tracker
        self.strict = strict
        self.facts = FactsReplay() if strict else None  # the data flow's facts, replayed online for strict
        self.record_source = record_source
        self.record_time = record_time
        #: with a profiler beside it, a profiler record to make around each call of an op
        #: (``RecordFunctionFast``), where torch's own does not record the calls of a mode
        self.mark = None
        # (func, phase, (module, source), memory_format, ns, forward seq of a backward op's
        # node or -1, whether a maybe-alias op returned a copy)
        self.events: list[tuple] = []
        self.tensors: list = []  # TENSOR_FIELDS values per tensor
        # (shape, strides, storage_offset, dtype, device) -> layout number
        self.layouts: dict[tuple, int] = {}
        self._extend, self._layout, self._count = self.tensors.extend, self.layouts.setdefault, self.layouts.__len__
        self.optimizer_depth = 0
        self._layout_keys: list[tuple] = []  # layout number -> key, for strict mode
        self._param_types: dict[type, object] = {}
        self._internal_code: dict = {}
        # Which recorded op created each autograd node, by the node's sequence number (this
        # thread's counter, bumped as autograd creates a node, before the op reaches the
        # mode): _node_events[i] is the seq of the first op that saw the counter at
        # _node_nrs[i], the op that created nodes _node_nrs[i - 1] .. _node_nrs[i] - 1.
        # Nodes numbered below _first_nr were made before recording began.
        self._first_nr = self._last_nr = _sequence_nr()
        self._thread = _get_ident()  # whose counter that is (backward may run on other threads)
        self._node_nrs: list[int] = []
        self._node_events: list[int] = []
        # a node may run several ops; no node (the engine summing gradients) is <global>
        self._last_node, self._last_node_label, self._last_node_event = None, GLOBAL_LABEL, -1
        # Nodes that autograd engine threads made while running backward (checkpoint
        # recomputation there, create_graph): thread -> [(its node counter after its previous
        # op, after this op, this op's seq, the graph task it ran in)]; each thread counts on
        # its own.
        self._engine_nodes: dict[int, list[tuple[int, int, int, int]]] = {}
        self._engine_last: dict[int, int] = {}  # thread -> its node counter after its last op
        self.failed: list[tuple[int, str]] = []  # (seq it would have had, op) of calls that raised
        #: per event, the process CPU time around its call (timed recordings): the profiler's time
        #: less the time the process was off the CPU, when another process took it
        self.cpu_ns: list[int] = []
        #: process CPU time (ns) at the first op's call and after the last op's (timed recordings)
        self.cpu_first = self.cpu_last = 0
        self.compiled: list[int] = []  # seqs of ops run while a torch.compile'd function ran
        tracker.mode = self  # how the tracker tells this recording's engine threads from others

    # -- hot path ---------------------------------------------------------------------------
    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # TorchDispatchMode wraps every subclass's __torch_dispatch__ in torch._disable_dynamo,
        # four Python calls per op. Instead the dispatch's code is marked for Dynamo to skip
        # (torch._dynamo.eval_frame.skip_code) and clears the frame hook for its duration,
        # which is what the wrapper does; where that mark cannot be set, the wrapper stays.
        return not _SKIPPED_BY_DYNAMO

    # A tensor's identity is ``weakref.ref(t)``: CPython hands back the one plain reference an
    # object already has, so it is a C call with no table; the log keeps each reference alive,
    # so a new tensor at a dead one's address (a reused ``id()``) gets a reference of its own.
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: C901  (the hot path: one call per aten op, kept flat on purpose)
        prior = _set_eval_frame(None)  # keep Dynamo out of the recorder (see _should_skip_dynamo)
        seq = len(self.events)  # before anything that can raise: the finally reads it
        try:
            info = _OP_INFO.get(id(func))  # op_info(func), inlined
            if info is None or info.func is not func:
                info = _op_info(func)
            tensors = self.tensors
            first = len(tensors)
            ext, layouts = self._extend, self.layouts
            known = layouts.get  # one dict call per strided tensor: a layout seen before
            nargs = len(args)
            # inputs are read before the call: in-place metadata ops (as_strided_, ...) change them
            try:
                for i in info.tensor_args:
                    if i >= nargs:
                        break
                    a = args[i]
                    if isinstance(a, _Tensor):
                        if a.layout is _STRIDED:
                            key = (a.shape, a.stride(), a.storage_offset(), a.dtype, _CPU if a.is_cpu else a.device)
                            lay = known(key)
                            if lay is None:
                                lay = layouts[key] = len(layouts)
                        else:
                            lay = self._unstrided(a)
                        ext((seq, INPUT, i, -1, _weakref(a), lay,
                             False if type(a) is _Tensor else True if type(a) is _Parameter else self._is_param(a)))
                    elif type(a) in (list, tuple):
                        for j, x in enumerate(a):
                            if isinstance(x, _Tensor):
                                if x.layout is _STRIDED:
                                    key = (x.shape, x.stride(), x.storage_offset(), x.dtype,
                                           _CPU if x.is_cpu else x.device)
                                    lay = known(key)
                                    if lay is None:
                                        lay = layouts[key] = len(layouts)
                                else:
                                    lay = self._unstrided(x)
                                ext((seq, INPUT, i, j, _weakref(x), lay,
                                     False if type(x) is _Tensor else self._is_param(x)))
                if kwargs:
                    names = info.arg_names
                    for k, a in kwargs.items():
                        if isinstance(a, _Tensor):
                            ext((seq, INPUT, names.index(k) if k in names else -1, -1, _weakref(a),
                                 self._layout_of_strided(a) if a.layout is _STRIDED else self._unstrided(a),
                                 False))
            except Exception:  # a strided tensor whose sizes raise (a strided nested tensor)
                del tensors[first:]
                self._read_inputs(seq, info, args, kwargs)
            # OpOverload.__call__ calls its C++ op (``_op``) unless a Python dispatcher is set:
            # calling that op here saves a Python frame per op
            call = func._op if info.plain and func._pyobj_dispatcher is None else func
            try:
                if self.record_time:
                    cpu = _process_time_ns()
                    start = _perf_counter_ns()
                    if self.mark is None:
                        out = call(*args, **kwargs) if kwargs else call(*args)
                    else:  # the profiler's record of this call, where torch makes none
                        with self.mark(MODE_RECORD):
                            out = call(*args, **kwargs) if kwargs else call(*args)
                    duration = _perf_counter_ns() - start
                    self.cpu_last = end = _process_time_ns()
                    self.cpu_ns.append(end - cpu)
                    if not seq:
                        self.cpu_first = cpu
                else:
                    out = call(*args, **kwargs) if kwargs else call(*args)
                    duration = -1
            except BaseException:
                del tensors[first:]  # the op never happened: no rows for it
                self.failed.append((seq, op_schema(func).name))  # the profiler saw it: the join skips it
                raise
            if (task := _graph_task_id()) != -1:
                phase = BACKWARD
                node = _current_node()
                if node is not self._last_node:
                    self._backward_label(node)
                label, origin = self._last_node_label, self._last_node_event
                if self.tracker.recomputing:  # a module's forward runs inside backward (checkpointing)
                    label = self._recomputed_label(label)
                nr = _sequence_nr()  # backward that builds a graph (create_graph, checkpoint
                if (tid := _get_ident()) == self._thread:  # recomputation): its nodes are this op's
                    if nr != self._last_nr:
                        self._last_nr = nr
                        self._node_nrs.append(nr)
                        self._node_events.append(seq)
                elif (last := self._engine_last.get(tid)) != nr:  # an engine thread counts on its own
                    self._engine_last[tid] = nr
                    if last is not None:
                        self._engine_nodes.setdefault(tid, []).append((last, nr, seq, task))
            else:
                phase = OTHER if self.optimizer_depth else FORWARD
                label = self.tracker.label
                if self.record_source:
                    label = (label[0], self._user_line())
                origin = -1
                nr = _sequence_nr()
                if nr != self._last_nr:  # this op created autograd nodes
                    self._last_nr = nr
                    self._node_nrs.append(nr)
                    self._node_events.append(seq)
                if info.inplace and nargs and _is_differentiable_view_write(args):
                    # autograd wraps this op's node in a CopySlices once the op returns: that
                    # node (numbered nr) is this op's too, not the next op's
                    self._last_nr = nr + 1
                    self._node_nrs.append(nr + 1)
                    self._node_events.append(seq)
            mf = info.memory_format_index
            self.events.append((
                func, phase, label,
                None if mf < 0 else (kwargs or {}).get("memory_format") if mf >= nargs else args[mf],
                duration, origin, info.maybe_alias and _copied(args, out),
            ))
            outputs = len(tensors)
            try:
                if isinstance(out, _Tensor):
                    if info.keeps_layout and outputs > first:
                        lay = tensors[first + _LAYOUT]
                    elif out.layout is _STRIDED:
                        key = (out.shape, out.stride(), out.storage_offset(), out.dtype,
                               _CPU if out.is_cpu else out.device)
                        lay = known(key)
                        if lay is None:
                            lay = layouts[key] = len(layouts)
                    else:
                        lay = self._unstrided(out)
                    ext((seq, OUTPUT, 0, -1, _weakref(out), lay, False))
                elif type(out) in (list, tuple):
                    list_return = info.list_return  # one Tensor[] result (split, unbind): item i of it
                    for i, o in enumerate(out):
                        if isinstance(o, _Tensor):
                            pos, item = (0, i) if list_return else (i, -1)
                            ext((seq, OUTPUT, pos, item, _weakref(o),
                                 self._layout_of_strided(o) if o.layout is _STRIDED else self._unstrided(o),
                                 False))
                        elif type(o) in (list, tuple):
                            for j, x in enumerate(o):
                                if isinstance(x, _Tensor):
                                    ext((seq, OUTPUT, i, j, _weakref(x),
                                         self._layout_of_strided(x) if x.layout is _STRIDED else self._unstrided(x),
                                         False))
            except Exception:  # a strided tensor whose sizes raise (a strided nested tensor)
                del tensors[outputs:]
                self._read_outputs(seq, info, out)
            if self.strict:
                self._check_strict(seq, info, tensors[first:])
            return out
        finally:
            if prior is not None:  # a compiled function is running: give its frame hook back
                _set_eval_frame(prior)
                if len(self.events) > seq:  # and note that this op ran inside it
                    self.compiled.append(seq)

    # -- tensors without strides ------------------------------------------------------------
    def _unstrided(self, t) -> int:
        """The layout number of a tensor without strides (sparse, jagged nested, mkldnn): its
        sizes, -1 for one that is not a single number (a ragged dimension), and no strides."""
        try:
            ndim = t.dim()
        except Exception:
            ndim = 0
        shape = []
        for d in range(ndim):
            try:
                size = t.size(d)
            except Exception:  # an irregular dimension of a strided nested tensor
                size = -1
            shape.append(size if type(size) is int else -1)  # a jagged one is a symbolic int
        return self._layout((tuple(shape), (), 0, t.dtype, _CPU if t.is_cpu else t.device), self._count())

    def _layout_of_strided(self, t) -> int:
        """The layout number of a strided tensor (the hot path reads most of them inline)."""
        return self._layout((t.shape, t.stride(), t.storage_offset(), t.dtype, _CPU if t.is_cpu else t.device),
                            self._count())

    def _layout_of(self, t) -> int:
        if t.layout is _STRIDED and not t.is_nested:
            return self._layout((t.shape, t.stride(), t.storage_offset(), t.dtype, _CPU if t.is_cpu else t.device),
                                self._count())
        return self._unstrided(t)

    def _read_inputs(self, seq: int, info: _OpInfo, args, kwargs) -> None:
        """The input rows, read one tensor at a time (the hot path's rows, for calls where one
        tensor raised there)."""
        ext, layout_of = self._extend, self._layout_of
        for i in info.tensor_args:
            if i >= len(args):
                break
            a = args[i]
            items = enumerate(a) if type(a) in (list, tuple) else [(-1, a)]
            for j, x in items:
                if isinstance(x, _Tensor):
                    ext((seq, INPUT, i, j, _weakref(x), layout_of(x), self._is_param(x)))
        for k, a in (kwargs or {}).items():
            if isinstance(a, _Tensor):
                names = info.arg_names
                ext((seq, INPUT, names.index(k) if k in names else -1, -1, _weakref(a), layout_of(a), False))

    def _read_outputs(self, seq: int, info: _OpInfo, out) -> None:
        ext, layout_of = self._extend, self._layout_of
        if isinstance(out, _Tensor):
            ext((seq, OUTPUT, 0, -1, _weakref(out), layout_of(out), False))
            return
        if type(out) not in (list, tuple):
            return
        for i, o in enumerate(out):
            if isinstance(o, _Tensor):
                pos, item = (0, i) if info.list_return else (i, -1)
                ext((seq, OUTPUT, pos, item, _weakref(o), layout_of(o), False))
            elif type(o) in (list, tuple):
                for j, x in enumerate(o):
                    if isinstance(x, _Tensor):
                        ext((seq, OUTPUT, i, j, _weakref(x), layout_of(x), False))

    def _is_param(self, t) -> bool:
        kind = self._param_types.get(type(t))
        if kind is None:
            kind = self._param_types[type(t)] = _param_kind(type(t))
        return getattr(t, "_is_param", False) if kind is _BY_INSTANCE else kind

    # -- module and source labels -----------------------------------------------------------
    def _backward_label(self, node) -> tuple[str, str]:
        """The module and line of the op that created the node now running backward (a forward
        op; with ``create_graph=True``, a backward op).

        This is how torch's own tracing tags backward nodes (``seq_nr`` in ``torch.fx.proxy``).
        Gradient accumulation into a parameter (AccumulateGrad) belongs to the parameter's
        module; a node created before recording began has no module (``<global>``).
        """
        origin = -1
        if node is None:
            label = GLOBAL_LABEL
        elif self._engine_nodes and (origin := self._engine_node_event(node_sequence_nr(node))) >= 0:
            label = self.events[origin][2]
        elif self._first_nr <= (nr := node_sequence_nr(node)) < self._last_nr:
            origin = self._node_events[bisect_right(self._node_nrs, nr)]
            label = self.events[origin][2]
        else:
            var = getattr(node, "variable", None)
            label = GLOBAL_LABEL if var is None else (self.tracker.param_modules.get(id(var), GLOBAL_LABEL[0]), "")
        self._last_node, self._last_node_label, self._last_node_event = node, label, origin
        return label

    def _engine_node_event(self, nr: int) -> int:
        """The op that made a node this engine thread created itself, or -1.

        A node made inside backward runs in a later graph task (the reentrant backward of a
        checkpoint, a double backward), never in the one that made it: that, and the thread's
        own counter, tell it from a node of the recording thread with the same number.
        """
        made = self._engine_nodes.get(_get_ident())
        if not made:
            return -1
        task = _graph_task_id()
        for before, after, seq, made_in in reversed(made):
            if before <= nr < after and made_in != task:
                return seq
        return -1

    def _recomputed_label(self, label: tuple[str, str]) -> tuple[str, str]:
        """A backward op inside a module's forward run again in backward (checkpointing): that
        module, and with ``record_source`` the user's line; else the node's ``label``."""
        running = self.tracker.backward_label()
        if running is None:
            return label
        return (running[0], self._user_line(3)) if self.record_source else running

    def _user_line(self, depth: int = 2) -> str:
        """The user's line: the first frame outside torch and the auditor (looked for from
        ``depth`` frames up: the caller of ``__torch_dispatch__``), or "" where the auditor's
        step comes first (:func:`_frame_kind`). An op that torch's own modules run (an
        ``nn.Sequential`` of torch layers) has no line of the user's below the auditor's step,
        and the lines above it call the audit (a notebook's ``auditor.audit(...)``, the command
        line's own script), not the op."""
        frame = sys._getframe(depth)
        kinds = self._internal_code
        while frame is not None:
            code = frame.f_code
            kind = kinds.get(code)
            if kind is None:
                kind = kinds[code] = _frame_kind(code.co_filename)
            if kind == USER_FRAME:
                return f"{code.co_filename}:{frame.f_lineno}"
            if kind == STEP_FRAME:
                return ""
            frame = frame.f_back
        return ""

    def _check_strict(self, seq: int, info: _OpInfo, values: list) -> None:
        """Classify the op as the analyzer will, with the data flow's facts replayed online."""
        keys = self._layout_keys
        if len(keys) < len(self.layouts):
            keys.extend(islice(self.layouts, len(keys), None))
        copied = self.events[seq][6]
        rows = [values[k:k + TENSOR_FIELDS] for k in range(0, len(values), TENSOR_FIELDS)]
        plain = [(id(ref), tensor_sig(role, pos, *info.slot(role, pos, item, copied), keys[lay], param))
                 for _, role, pos, item, ref, lay, param in rows]
        ins = [x for x, row in zip(plain, rows) if row[1] == INPUT]
        outs = [x for x, row in zip(plain, rows) if row[1] == OUTPUT]
        in_facts, out_facts = self.facts.step(info.name, ins, outs)
        sigs = tuple(s.with_facts(f) for (_, s), f in zip(ins + outs, [*in_facts, *out_facts]))
        verdict = rules.classify(info.name, sigs)
        if verdict.kind == rules.LOSES:
            phase, (module, _) = self.events[seq][1:3]
            module = module_names(dict.fromkeys(e[2][0] for e in self.events), self.tracker.types)[module][0]
            inputs = "; ".join(
                f"{sig.arg}{'' if item < 0 else f'[{item}]'}: shape {tuple(keys[lay][0])} "
                f"strides {keys[lay][1]} ({sig.label})"
                for (_, role, _, item, _, lay, _), sig in zip([r for r in rows if r[1] == INPUT], sigs)
            )
            raise FormatLossError(
                f"{info.name} lost channels_last in module '{module}' ({PHASES[phase]}): "
                f"{verdict.from_format} -> {verdict.to_format}. Inputs: {inputs}"
            )

    def finish(self, module_types: dict[str, str], *, complete: bool = True, error: str = "",
               profile=None, plain: PlainStep | None = None) -> RawLog:
        """What this recording leaves behind, once the mode is off the stack: its buffers (the
        RawLog shares them until :meth:`release`), the module types the tracker saw, whether
        the recorded code finished, and, given ``profile`` (the raw result of the profiler
        that ran beside the mode), each op's kernel time and the copies inside it; given
        ``plain`` too (the step timed without the recorder), those times less the recorder's
        own cost (:func:`~auditor._recording._profile.take_out_recorder`)."""
        rank, world_size = process_group()
        raw = RawLog(rank=rank, world_size=world_size, events=self.events, tensors=self.tensors,
                     layouts=list(self.layouts), module_types=module_types, complete=complete, error=error,
                     compiled=self.compiled_events())
        if profile is not None:
            timing = join([e[0] for e in self.events], self.failed, profile)
            time_ns = on_cpu(timing.time_ns, self.cpu_ns)
            hidden, gap_ns = hidden_on_cpu(timing.hidden, timing.time_ns, time_ns), timing.gap_ns
            if plain is not None and self.cpu_last > self.cpu_first and complete:
                ops_ns, gap_ns, raw.step_time = take_out_recorder(
                    time_ns, gap_ns, timing.records, plain, self.cpu_last - self.cpu_first, timing.names)
                hidden, time_ns = hidden_on_cpu(hidden, time_ns, ops_ns), ops_ns
            raw.time_ns, raw.start_ns, raw.gap_ns, raw.hidden = time_ns, timing.start_ns, gap_ns, hidden
        return raw

    def compiled_events(self) -> list[int]:
        """Seqs of the ops that ran inside a ``torch.compile``'d callable, and of the backward
        ops of the autograd nodes those made (a compiled backward graph in a plain run)."""
        if not self.compiled:
            return []
        inside = set(self.compiled)
        inside.update(seq for seq, e in enumerate(self.events) if e[1] == BACKWARD and e[5] in inside)
        return sorted(inside)

    def release(self) -> None:
        """Drop every reference to user tensors, autograd nodes and the raw log once the audit
        is built. Lists are emptied in place: a traceback that holds a frame of the mode (an op
        that raised, ``strict``'s error) holds them too."""
        for buffer in (self.events, self.tensors, self._node_nrs, self._node_events, self.failed, self.compiled,
                       self._layout_keys):
            buffer.clear()
        self.layouts.clear()
        self._engine_nodes, self._engine_last = {}, {}
        self._internal_code = {}
        self._param_types = {}
        self.facts = None
        self._last_node, self._last_node_label, self._last_node_event = None, GLOBAL_LABEL, -1


def _skip_in_dynamo(code) -> bool:
    """What torch._dynamo.eval_frame.skip_code does, without importing torch._dynamo."""
    try:
        frames = eval_frame
        frames.set_code_exec_strategy(
            code, frames._FrameExecStrategy(frames._FrameAction.SKIP, frames._FrameAction.DEFAULT)
        )
    except (AttributeError, TypeError, RuntimeError):
        return False
    return True


_SKIPPED_BY_DYNAMO = _skip_in_dynamo(RecorderMode.__torch_dispatch__.__code__)
if not _SKIPPED_BY_DYNAMO:  # then torch's wrapper, as for any other mode
    RecorderMode.__init_subclass__()


def tensor_sig(role: int, position: int, arg: str, is_view: bool, layout: tuple, is_param: bool) -> rules.TensorSig:
    """A raw tensor row, its slot and its layout key -> the rule's view of it."""
    shape, strides, _, dtype, _ = layout
    shape = tuple(shape)
    return rules.TensorSig(
        ROLES[role],
        position,
        arg,
        format_label(shape, strides),
        is_param,
        is_view,
        nbytes(shape, dtype.itemsize) if has_strides(shape, strides) else 0,
        dtype.is_floating_point or dtype.is_complex,
        shape,
        tuple(strides),
    )


@dataclass
class RawLog:
    """What a recording leaves behind, before any DataFrame is built."""

    events: list[tuple] = field(default_factory=list)  # RecorderMode.events
    tensors: list = field(default_factory=list)  # flat, TENSOR_FIELDS values per tensor
    layouts: list[tuple] = field(default_factory=list)  # layout number -> its key
    module_types: dict[str, str] = field(default_factory=dict)
    complete: bool = True
    error: str = ""
    rank: int = 0  # torch.distributed rank while recording (0 outside a process group)
    world_size: int = 1
    compiled: list[int] = field(default_factory=list)  # seqs of ops run inside torch.compile'd code
    time_ns: list[int] = field(default_factory=list)  # per event, kernel time from the profiler (-1: none)
    start_ns: list[int] = field(default_factory=list)  # per event, its start from the first (-1: none)
    gap_ns: list[int] = field(default_factory=list)  # per event, the time outside ops before it (-1: none)
    hidden: list[tuple] = field(default_factory=list)  # profile.HIDDEN_COLUMNS rows
    step_time: StepTime | None = None  # how the recorder's cost was kept out of the times (audit())


def on_cpu(time_ns: list[int], cpu_ns: list[int]) -> list[int]:
    """Per event, the profiler's time of its kernels, or the process CPU time around its call
    where that is less: the profiler's clock is the wall's, and on a busy machine it also counts
    the slices another process ran while the op waited for the CPU (one such op read 94 ms in a
    46 ms step). CPU time can only be less when the op ran on this thread alone; with more
    threads at work it is more, and the profiler's time stays (-1, untimed, stays)."""
    if len(cpu_ns) != len(time_ns):
        return time_ns
    return [t if t < 0 or c >= t else max(c, 0) for t, c in zip(time_ns, cpu_ns)]


def hidden_on_cpu(hidden: list[tuple], wall_ns: list[int], time_ns: list[int]) -> list[tuple]:
    """The copies inside each op (``profile.HIDDEN_COLUMNS`` rows: the op's seq first, the µs
    tenth), their times scaled by the share of the op's wall time it spent on the CPU
    (:func:`on_cpu`): the profiler times them on the wall's clock too, and a copy cannot take
    longer than the op it ran in."""
    out = []
    for row in hidden:
        seq = row[0]
        wall, cpu = wall_ns[seq], time_ns[seq]
        if 0 <= cpu < wall:
            row = [*row[:9], row[9] * cpu / wall, *row[10:]]
        out.append(row)
    return out


def pause_collector() -> bool:
    """Pause Python's cyclic garbage collector for a recording; returns whether it was running.

    The log keeps a few tracked objects per op (the event tuple, the weak references), and each
    700 more start a collection, every tenth of them a larger one and in time a full one, which
    walks every object of the process (a model, torch, pandas: 300,000 and more): in one
    resnet50 step those collections cost about as much as the recorder's own work. Cycles the
    recorded code leaves are collected once recording ends, when :func:`resume_collector`
    turns it back on."""
    running = gc.isenabled()
    gc.disable()
    return running


def resume_collector(running: bool) -> None:
    """Undo :func:`pause_collector`: the collector runs again if it ran before."""
    if running:
        gc.enable()


def process_group() -> tuple[int, int]:
    """(rank, world_size) of the default ``torch.distributed`` process group, or (0, 1)
    outside one: what the log's ``rank`` and ``world_size`` columns record."""
    dist = getattr(torch, "distributed", None)
    if dist is not None and dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1
