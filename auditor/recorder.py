"""The recorder: a TorchDispatchMode that appends one raw row per aten op, and nothing else.

This is the hot path (one call per aten op), so it only appends tuples of values that are
cheap to read (sizes, strides, dtype, ...). Labels, bytes and DataFrames are built once, at
the end, by :mod:`auditor.log`. Module attribution reuses torch's ``ModuleTracker``.
"""

from __future__ import annotations

import os
import sys
import time
import weakref
from collections.abc import Iterable
from dataclasses import dataclass, field

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.module_tracker import ModuleTracker

from . import rules
from .formats import format_label, nbytes

FORWARD, BACKWARD, OTHER = 0, 1, 2
PHASES = ("forward", "backward", "other")
INPUT, OUTPUT = 0, 1
ROLES = ("input", "output")

#: Module column for ops outside every module, and for the root module's own ops.
GLOBAL_MODULE = "<global>"
ROOT_MODULE = "<root>"

_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
_AUDITOR_DIR = os.path.dirname(__file__) + os.sep
_SOURCE_KEY = "auditor_source"


class FormatLossError(RuntimeError):
    """Raised by ``strict=True`` at the first op that loses channels_last (a ``loses`` row)."""


@dataclass(frozen=True)
class _OpInfo:
    """What the recorder needs from an op's schema, computed once per overload."""

    name: str
    arg_names: tuple[str, ...]
    view_outputs: tuple[bool, ...]  # result i aliases an input without moving data
    memory_format_index: int  # position of a memory_format argument, or -1
    list_return: bool  # the op returns one Tensor[] (split, chunk, unbind)


#: Wrappers whose ``module`` child is the user's model: their names are dropped from fqns.
_WRAPPERS = frozenset({"DistributedDataParallel", "DataParallel", "FullyShardedDataParallel"})

_OP_INFO: dict = {}
_HIDDEN_VIEWS = frozenset({"aten._unsafe_view.default", "aten._reshape_alias.default"})


def _op_info(func) -> _OpInfo:
    info = _OP_INFO.get(func)
    if info is None:
        schema = func._schema
        names = tuple(a.name for a in schema.arguments)
        views = tuple(
            r.alias_info is not None and not r.alias_info.is_write for r in schema.returns
        )
        if str(func) in _HIDDEN_VIEWS or torch.Tag.inplace_view in func.tags:
            # aliases the schema does not call views: _unsafe_view, and in-place metadata
            # changes (as_strided_, squeeze_, ...) that move no data
            views = (True,) * max(1, len(schema.returns))
        list_return = len(schema.returns) == 1 and str(schema.returns[0].type) == "List[Tensor]"
        info = _OpInfo(
            str(func), names, views,
            names.index("memory_format") if "memory_format" in names else -1, list_return,
        )
        _OP_INFO[func] = info
    return info


#: ``_RecorderMode._param_types`` value for a tensor subclass whose instances say themselves
#: whether they are parameters: ``nn.Parameter(t)`` of a subclass (a ``FakeTensor`` in a fake
#: audit) keeps the subclass's type and sets ``_is_param``.
_BY_INSTANCE = object()


def _param_kind(cls: type):
    if issubclass(cls, torch.nn.Parameter):
        return True
    return False if cls is torch.Tensor else _BY_INSTANCE


class _Ref(weakref.ref):
    __slots__ = ("key", "uid")


class _TensorIds:
    """A stable integer per live tensor object.

    ``id()`` alone is reused by CPython once a tensor dies; a weak reference tells a reused id
    from the original, and its callback drops the entry so the table stays small.
    """

    def __init__(self):
        self._refs: dict[int, _Ref] = {}
        self._next = 0

    def _forget(self, ref: _Ref) -> None:
        if self._refs.get(ref.key) is ref:
            del self._refs[ref.key]

    def __call__(self, t) -> int:
        key = id(t)
        ref = self._refs.get(key)
        if ref is not None and ref() is t:
            return ref.uid
        ref = _Ref(t, self._forget)
        ref.key = key
        ref.uid = uid = self._next
        self._next += 1
        self._refs[key] = ref
        return uid

    def clear(self) -> None:
        self._refs = {}


class _Tracker(ModuleTracker):
    """torch's ModuleTracker, plus the innermost module kept current at each of its hooks.

    ``parents`` is an unordered set, and in backward it can hold modules whose gradients are
    still pending on another branch (a ResNet downsample, say). The most recently entered module
    that is still open is the one running, so a stack of entries beside the set gives
    ``current`` at no cost per op. Modules entered by one event (a parent and the child that
    produced the parent's output) are ordered parent below child.
    """

    def __init__(self):
        super().__init__()
        self.current = "Global"
        self.types: dict[str, str] = {}
        self._stack: list[str] = []
        self._ops_at_entry: list[int] = []
        self.op_count = None  # set by the recorder: a callable giving the ops recorded so far

    def _get_append_fn(self, name, is_bw):
        fn = super()._get_append_fn(name, is_bw)
        stack = self._stack

        prefix = name + "."

        def append(*args):
            fn(*args)
            # an enclosing module whose hook fires after its child's (they share an output
            # tensor) goes below the child: the child is the one running
            i = len(stack)
            while i and stack[i - 1].startswith(prefix):
                i -= 1
            stack.insert(i, name)
            self.current = stack[-1]

        return append

    def _get_pop_fn(self, name, is_bw):
        fn = super()._get_pop_fn(name, is_bw)
        stack = self._stack

        def pop(*args):
            fn(*args)
            for i in range(len(stack) - 1, -1, -1):
                if stack[i] == name:
                    del stack[i]
                    break
            self.current = stack[-1] if stack else "Global"

        return pop

    def _maybe_set_engine_callback(self):
        if self._has_callback:
            return

        def callback():
            self.parents = {"Global"}
            self._stack.clear()
            self.current = "Global"
            self._has_callback = False

        torch.autograd.Variable._execution_engine.queue_callback(callback)
        self._has_callback = True

    def _fw_pre_hook(self, mod, input):
        super()._fw_pre_hook(mod, input)
        self._ops_at_entry.append(self.op_count() if self.op_count else -1)
        name = self._known_modules.get(mod)
        if name is not None and name not in self.types:
            self.types[name] = type(mod).__name__

    def _fw_post_hook(self, mod, input, output):
        start = self._ops_at_entry.pop() if self._ops_at_entry else -1
        if start >= 0 and start == self.op_count() and _passes_through(input, output):
            # nn.Identity and the like: no op ran, the output is the input. A backward hook on
            # that tensor would open the module around its neighbours' backward ops.
            self._get_pop_fn(self._get_mod_name(mod), False)()
            return
        super()._fw_post_hook(mod, input, output)


def module_names(tracker_names: Iterable[str], types: dict[str, str]):
    """ModuleTracker names ("ResNet.layer1.0") -> (fqn, type) as ``named_modules`` gives them.

    The first top-level module seen is the root: its prefix is dropped and its own ops are
    ``<root>``. Any other top-level module (a loss module, say) keeps its class name as prefix.
    """
    root = None
    mapping = {}
    for name in tracker_names:
        if name in mapping:
            continue
        if name == "Global":
            mapping[name] = (GLOBAL_MODULE, "")
            continue
        head, _, rest = name.partition(".")
        if root is None:
            root = head
        if head == root:
            if types.get(head) in _WRAPPERS and (rest == "module" or rest.startswith("module.")):
                rest = rest[len("module."):]  # DDP(model): name the model's modules, not the wrapper's
            fqn = rest or ROOT_MODULE
        else:
            fqn = name
        mapping[name] = (fqn, types.get(name, head if not rest else ""))
    return mapping


def _passes_through(inputs, outputs) -> bool:
    """Every tensor the module returned is one of the tensors it was given."""
    given = {id(t) for t in tree_leaves(inputs) if isinstance(t, torch.Tensor)}
    returned = [t for t in tree_leaves(outputs) if isinstance(t, torch.Tensor)]
    return bool(returned) and all(id(t) in given for t in returned)


def _is_internal(filename: str) -> bool:
    return filename.startswith((_TORCH_DIR, _AUDITOR_DIR)) or filename.startswith("<frozen")


class _RecorderMode(TorchDispatchMode):
    """The private dispatch mode. Each call appends one event tuple and one tuple per tensor."""

    def __init__(self, tracker: _Tracker, *, strict: bool, record_source: bool, record_time: bool):
        super().__init__()
        self.tracker = tracker
        self.strict = strict
        self.events: list[tuple] = []
        tracker.op_count = self.events.__len__
        self.record_source = record_source
        self.record_time = record_time
        self.tensors: list[tuple] = []
        self.optimizer_depth = 0
        self._uid = _TensorIds()
        self._param_types: dict[type, bool] = {}
        self._internal_code: dict = {}
        self._pending_source: tuple | None = None

    # -- hot path ---------------------------------------------------------------------------
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if kwargs is None:
            kwargs = {}
        info = _OP_INFO.get(func) or _op_info(func)
        seq = len(self.events)
        tensors = self.tensors
        first = len(tensors)
        append = tensors.append
        uid = self._uid
        params = self._param_types
        names = info.arg_names
        # inputs are read before the call: in-place metadata ops (as_strided_, ...) change them
        for i, a in enumerate(args):
            if isinstance(a, torch.Tensor):
                is_param = params.get(type(a))
                if is_param is None:
                    is_param = params[type(a)] = _param_kind(type(a))
                if is_param is _BY_INSTANCE:
                    is_param = getattr(a, "_is_param", False)
                append((seq, INPUT, i, -1, names[i], uid(a), a.shape, a.stride(),
                        a.storage_offset(), a.dtype, a.device, is_param, False))
            elif type(a) in (list, tuple):
                for j, x in enumerate(a):
                    if isinstance(x, torch.Tensor):
                        is_param = params.get(type(x))
                        if is_param is None:
                            is_param = params[type(x)] = _param_kind(type(x))
                        if is_param is _BY_INSTANCE:
                            is_param = getattr(x, "_is_param", False)
                        append((seq, INPUT, i, j, names[i], uid(x), x.shape, x.stride(),
                                x.storage_offset(), x.dtype, x.device, is_param, False))
        if kwargs:
            for k, a in kwargs.items():
                if isinstance(a, torch.Tensor):
                    append((seq, INPUT, names.index(k) if k in names else -1, -1, k, uid(a), a.shape,
                            a.stride(), a.storage_offset(), a.dtype, a.device, False, False))
        try:
            if self.record_time:
                start = time.perf_counter_ns()
                out = func(*args, **kwargs)
                duration = time.perf_counter_ns() - start
            else:
                out = func(*args, **kwargs)
                duration = -1
        except BaseException:
            del tensors[first:]  # the op never happened: no rows for it
            raise
        if torch._C._current_graph_task_id() != -1:
            phase = BACKWARD
        else:
            phase = OTHER if self.optimizer_depth else FORWARD
        source = self._source(phase, out) if self.record_source else ""
        mf = info.memory_format_index
        requested = ""
        if mf >= 0:
            fmt = kwargs.get("memory_format") if mf >= len(args) else args[mf]
            if fmt is not None:
                requested = str(fmt).replace("torch.", "")
        self.events.append((func, phase, self.tracker.current, source, requested, duration))
        views = info.view_outputs
        if isinstance(out, torch.Tensor):
            append((seq, OUTPUT, 0, -1, "", uid(out), out.shape, out.stride(),
                    out.storage_offset(), out.dtype, out.device, False, views[0] if views else False))
        elif type(out) in (list, tuple):
            if info.list_return:  # split, chunk, unbind: one Tensor[] result, item j of it
                view = views[0]
                for j, o in enumerate(out):
                    append((seq, OUTPUT, 0, j, "", uid(o), o.shape, o.stride(),
                            o.storage_offset(), o.dtype, o.device, False, view))
            else:
                for i, o in enumerate(out):
                    if isinstance(o, torch.Tensor):
                        view = views[i] if i < len(views) else False
                        append((seq, OUTPUT, i, -1, "", uid(o), o.shape, o.stride(),
                                o.storage_offset(), o.dtype, o.device, False, view))
                    elif type(o) in (list, tuple):
                        for j, x in enumerate(o):
                            if isinstance(x, torch.Tensor):
                                append((seq, OUTPUT, i, j, "", uid(x), x.shape, x.stride(),
                                        x.storage_offset(), x.dtype, x.device, False, False))
        if self.strict:
            self._check_strict(seq, info, tensors[first:])
        return out

    # -- opt-in extras ----------------------------------------------------------------------
    def _source(self, phase: int, out) -> str:
        """The user's line: the first frame outside torch and auditor.

        In backward there is no user frame; the line comes from the autograd node, on which
        the forward op's line was stored (see ``_attach_pending``).
        """
        self._attach_pending()
        if phase == BACKWARD:
            node = torch._C._current_autograd_node()
            if node is None:
                return ""
            return node.metadata.get(_SOURCE_KEY, "")
        frame = sys._getframe(2)
        internal = self._internal_code
        while frame is not None:
            code = frame.f_code
            skip = internal.get(code)
            if skip is None:
                skip = internal[code] = _is_internal(code.co_filename)
            if not skip:
                source = f"{code.co_filename}:{frame.f_lineno}"
                # autograd attaches grad_fn after this op returns; label it on the next op
                self._pending_source = (out, source)
                return source
            frame = frame.f_back
        return ""

    def _attach_pending(self) -> None:
        pending, self._pending_source = self._pending_source, None
        if pending is None:
            return
        out, source = pending
        for t in out if isinstance(out, (list, tuple)) else (out,):
            fn = getattr(t, "grad_fn", None) if isinstance(t, torch.Tensor) else None
            if fn is not None and _SOURCE_KEY not in fn.metadata:
                fn.metadata[_SOURCE_KEY] = source

    def _check_strict(self, seq: int, info: _OpInfo, rows: list[tuple]) -> None:
        sigs = tuple(tensor_sig(r) for r in rows)
        verdict = rules.classify(info.name, sigs)
        if verdict.kind == rules.LOSES:
            func, phase, module = self.events[seq][:3]
            names = module_names(dict.fromkeys(e[2] for e in self.events), self.tracker.types)
            module = names[module][0]
            inputs = "; ".join(
                f"{r[4]}"
                f"{'' if r[3] < 0 else f'[{r[3]}]'}: shape {tuple(r[6])} strides {tuple(r[7])}"
                f" ({format_label(tuple(r[6]), tuple(r[7]))})"
                for r in rows
                if r[1] == INPUT
            )
            raise FormatLossError(
                f"{info.name} lost channels_last in module '{module}' ({PHASES[phase]}): "
                f"{verdict.from_format} -> {verdict.to_format}. Inputs: {inputs}"
            )

    def release(self) -> None:
        """Drop every reference to user tensors once recording is over."""
        self._uid.clear()
        self._pending_source = None


def tensor_sig(row: tuple) -> rules.TensorSig:
    """A raw tensor row -> the rule's view of it."""
    shape, strides = tuple(row[6]), tuple(row[7])
    return rules.TensorSig(
        ROLES[row[1]],
        row[2],
        row[4],
        format_label(shape, strides),
        row[11],
        row[12],
        nbytes(shape, row[9].itemsize),
        row[9].is_floating_point or row[9].is_complex,
    )


@dataclass
class RawLog:
    """What a recording leaves behind, before any DataFrame is built."""

    events: list[tuple] = field(default_factory=list)
    tensors: list[tuple] = field(default_factory=list)
    module_types: dict[str, str] = field(default_factory=dict)
    complete: bool = True
    error: str = ""
    rank: int = 0  # torch.distributed rank while recording (0 outside a process group)
    world_size: int = 1
