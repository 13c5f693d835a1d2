"""The recorder: a TorchDispatchMode that appends one raw row per aten op, and nothing else.

This is the hot path (one call per aten op), so it only appends tuples of values that are
cheap to read (sizes, strides, dtype, ...). Labels, bytes and DataFrames are built once, at
the end, by :mod:`auditor.log`. Module attribution reuses torch's ``ModuleTracker`` in forward
and labels autograd nodes for backward.
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
#: Key of the (module, source line) label the recorder puts on autograd nodes in forward.
_LABEL_KEY = "auditor_label"

_Tensor = torch.Tensor
_weakref = weakref.ref
_graph_task_id = torch._C._current_graph_task_id
_current_node = torch._C._current_autograd_node
_is_grad_enabled = torch.is_grad_enabled
_perf_counter_ns = time.perf_counter_ns


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
    tensor_args: tuple[int, ...]  # positions that can hold a tensor or a list of them


#: Wrappers whose ``module`` child is the user's model: their names are dropped from fqns.
_WRAPPERS = frozenset({"DistributedDataParallel", "DataParallel", "FullyShardedDataParallel"})

_OP_INFO: dict = {}
_HIDDEN_VIEWS = frozenset({"aten._unsafe_view.default", "aten._reshape_alias.default"})


def _op_info(func) -> _OpInfo:
    """Build and cache what the recorder needs from ``func``'s schema (first call per overload)."""
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
    tensor_args = tuple(i for i, a in enumerate(schema.arguments) if "Tensor" in str(a.type))
    info = _OpInfo(
        str(func), names, views,
        names.index("memory_format") if "memory_format" in names else -1, list_return,
        tensor_args,
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
    """torch's ModuleTracker for the forward pass (its module names, its global forward hooks),
    with the innermost running module kept in ``current`` for the recorder to read per op.

    Its backward mechanism is not used: two multi-grad hooks per module call were most of the
    cost of recording, and they can only guess which module a backward op belongs to. Instead
    the recorder labels each autograd node with the module that created it in forward and reads
    the label back in backward (see ``_RecorderMode._backward_label``).
    """

    def __init__(self):
        super().__init__()
        self.current = "Global"
        self.types: dict[str, str] = {}
        self.param_modules: dict = {}  # parameter -> module name, for AccumulateGrad nodes
        self._stack: list[str] = []

    def _fw_pre_hook(self, mod, input):
        name = self._get_mod_name(mod)
        if name not in self.types:
            self.types[name] = type(mod).__name__
            for p in mod.parameters(recurse=False):
                self.param_modules.setdefault(id(p), name)
        self.parents.add(name)
        self._stack.append(name)
        self.current = name

    def _fw_post_hook(self, mod, input, output):
        name = self._get_mod_name(mod)
        stack = self._stack
        for i in range(len(stack) - 1, -1, -1):
            if stack[i] == name:
                del stack[i]
                break
        if name not in stack:
            self.parents.discard(name)
        self.current = stack[-1] if stack else "Global"

    def __exit__(self, *args):
        super().__exit__(*args)
        self.param_modules = {}


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


def _is_internal(filename: str) -> bool:
    return filename.startswith((_TORCH_DIR, _AUDITOR_DIR)) or filename.startswith("<frozen")


class _RecorderMode(TorchDispatchMode):
    """The private dispatch mode. Each call appends one event tuple and one tuple per tensor."""

    def __init__(self, tracker: _Tracker, *, strict: bool, record_source: bool, record_time: bool):
        super().__init__()
        self.tracker = tracker
        self.strict = strict
        self.record_source = record_source
        self.record_time = record_time
        self.events: list[tuple] = []
        self.tensors: list[tuple] = []
        self.optimizer_depth = 0
        self._uid = _TensorIds()
        self._param_types: dict[type, object] = {}
        self._internal_code: dict = {}
        # forward results whose autograd node is not set yet: (weakref, label, tries)
        self._pending: list[tuple] = []

    # -- hot path ---------------------------------------------------------------------------
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        info = _OP_INFO.get(func) or _op_info(func)
        if self._pending:
            self._label_nodes()
        seq = len(self.events)
        tensors = self.tensors
        first = len(tensors)
        append = tensors.append
        uid = self._uid
        names = info.arg_names
        nargs = len(args)
        # inputs are read before the call: in-place metadata ops (as_strided_, ...) change them
        for i in info.tensor_args:
            if i >= nargs:
                break
            a = args[i]
            if type(a) in (list, tuple):
                for j, x in enumerate(a):
                    if isinstance(x, _Tensor):
                        append((seq, INPUT, i, j, names[i], uid(x), x.shape, x.stride(),
                                x.storage_offset(), x.dtype, x.device, self._is_param(x), False))
            elif isinstance(a, _Tensor):
                append((seq, INPUT, i, -1, names[i], uid(a), a.shape, a.stride(),
                        a.storage_offset(), a.dtype, a.device,
                        False if type(a) is _Tensor else self._is_param(a), False))
        if kwargs:
            for k, a in kwargs.items():
                if isinstance(a, _Tensor):
                    append((seq, INPUT, names.index(k) if k in names else -1, -1, k, uid(a), a.shape,
                            a.stride(), a.storage_offset(), a.dtype, a.device, False, False))
        try:
            if self.record_time:
                start = _perf_counter_ns()
                out = func(*args, **kwargs) if kwargs else func(*args)
                duration = _perf_counter_ns() - start
            else:
                out = func(*args, **kwargs) if kwargs else func(*args)
                duration = -1
        except BaseException:
            del tensors[first:]  # the op never happened: no rows for it
            raise
        if _graph_task_id() != -1:
            phase = BACKWARD
            module, source = self._backward_label()
        else:
            phase = OTHER if self.optimizer_depth else FORWARD
            module = self.tracker.current
            source = self._user_line() if self.record_source else ""
            if _is_grad_enabled():
                result = out if isinstance(out, _Tensor) else (
                    out[0] if type(out) in (list, tuple) and out and isinstance(out[0], _Tensor) else None
                )
                if result is not None:
                    self._pending.append((_weakref(result), (module, source), 0))
        mf = info.memory_format_index
        requested = ""
        if mf >= 0:
            fmt = (kwargs or {}).get("memory_format") if mf >= nargs else args[mf]
            if fmt is not None:
                requested = str(fmt).replace("torch.", "")
        self.events.append((func, phase, module, source, requested, duration))
        views = info.view_outputs
        if isinstance(out, _Tensor):
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
                    if isinstance(o, _Tensor):
                        view = views[i] if i < len(views) else False
                        append((seq, OUTPUT, i, -1, "", uid(o), o.shape, o.stride(),
                                o.storage_offset(), o.dtype, o.device, False, view))
                    elif type(o) in (list, tuple):
                        for j, x in enumerate(o):
                            if isinstance(x, _Tensor):
                                append((seq, OUTPUT, i, j, "", uid(x), x.shape, x.stride(),
                                        x.storage_offset(), x.dtype, x.device, False, False))
        if self.strict:
            self._check_strict(seq, info, tensors[first:])
        return out

    def _is_param(self, t) -> bool:
        kind = self._param_types.get(type(t))
        if kind is None:
            kind = self._param_types[type(t)] = _param_kind(type(t))
        return getattr(t, "_is_param", False) if kind is _BY_INSTANCE else kind

    # -- module and source labels -----------------------------------------------------------
    def _label_nodes(self) -> None:
        """Put (module, source line) on the autograd nodes of recent forward results.

        Autograd sets ``grad_fn`` after an op returns through this mode, so the label goes on
        at the next op; a result still without a node is tried for a few more ops.
        """
        keep = []
        for ref, label, tries in self._pending:
            t = ref()
            if t is None:
                continue
            fn = t.grad_fn
            if fn is None:
                if tries < 3:
                    keep.append((ref, label, tries + 1))
                continue
            meta = fn.metadata
            if _LABEL_KEY not in meta:
                meta[_LABEL_KEY] = label
        self._pending = keep

    def _backward_label(self) -> tuple[str, str]:
        """The module and line of the forward op that created the node now running backward.

        Gradient accumulation into a parameter (AccumulateGrad) belongs to the parameter's module.
        """
        node = _current_node()
        if node is None:
            return "Global", ""
        meta = node.metadata
        label = meta.get(_LABEL_KEY)
        if label is None:
            var = getattr(node, "variable", None)
            owner = self.tracker.param_modules.get(id(var), "Global") if var is not None else "Global"
            label = meta[_LABEL_KEY] = (owner, "")
        return label

    def _user_line(self) -> str:
        """The user's line: the first frame outside torch and auditor."""
        frame = sys._getframe(2)
        internal = self._internal_code
        while frame is not None:
            code = frame.f_code
            skip = internal.get(code)
            if skip is None:
                skip = internal[code] = _is_internal(code.co_filename)
            if not skip:
                return f"{code.co_filename}:{frame.f_lineno}"
            frame = frame.f_back
        return ""

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
        self._pending = []


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
