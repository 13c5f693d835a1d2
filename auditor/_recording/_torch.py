"""Every private torch entry point the package uses, in one place, each one feature-detected.

torch changes its private names between releases without notice, so none is used anywhere
else: the recorder, the profiler join, fake audits, the fixes and compiled audits take them from
here. Each is looked up once, when the package is imported. One that this torch lacks does not
stop the import: it becomes a stand-in that raises :class:`TorchInternalsError`, naming the
entry point, this torch's version and the versions the package is tested on, at its first use;
:func:`require` checks a feature's entry points up front, so a recording fails before it
starts rather than halfway. ``tests/test_layout.py`` checks that no other module names a
private torch module or function.

Private *attributes* of torch's objects are read where they are needed, some on the hot path
(one call per aten op), and are checked here instead (:data:`ATTRIBUTES`).
"""

from __future__ import annotations

import importlib

import torch

#: torch releases the test suite runs on (``pyproject.toml`` declares the same range).
TESTED = ("2.14", "2.15")


class TorchInternalsError(RuntimeError):
    """A private torch entry point the package needs is missing from this torch."""


def _message(name: str, why: str) -> str:
    return (f"auditor needs {name}, which torch {torch.__version__} does not have ({why}); auditor is "
            f"tested on torch {', '.join(TESTED)}")


class Missing:
    """Stands in for an entry point this torch lacks: false, and raises when used."""

    def __init__(self, name: str, why: str):
        self._name, self._why = name, why

    def __bool__(self) -> bool:
        return False

    def __call__(self, *args, **kwargs):
        raise TorchInternalsError(_message(self._name, self._why))

    def __getattr__(self, attr: str):
        if attr.startswith("__"):
            raise AttributeError(attr)
        raise TorchInternalsError(_message(self._name, self._why))

    def __repr__(self) -> str:
        return f"<missing {self._name}>"


#: dotted name -> its stand-in, for every entry point this torch lacks
MISSING: dict[str, Missing] = {}


#: feature -> the dotted names of the entry points it needs, in the order they were looked up
FEATURES: dict[str, list[str]] = {}


def lookup(name: str, feature: str | None = None):
    """The object at the dotted ``name`` (a module, then attributes), or a :class:`Missing`;
    with ``feature``, the name is listed among what that feature needs (:data:`FEATURES`)."""
    if feature is not None:
        FEATURES.setdefault(feature, []).append(name)
    parts = name.split(".")
    obj, i = None, len(parts)
    while i > 0:
        try:
            obj = importlib.import_module(".".join(parts[:i]))
            break
        except ImportError:
            i -= 1
    try:
        if obj is None:
            raise AttributeError(parts[0])
        for attr in parts[i:]:
            obj = getattr(obj, attr)
    except AttributeError as exc:
        MISSING[name] = obj = Missing(name, f"no attribute {exc.args[0] if exc.args else '?'}")
    return obj


def essential(name: str, feature: str | None = None):
    """The object at ``name``, which the package's classes are built on: without it nothing can
    be recorded, so its absence stops the import with a clear error."""
    found = lookup(name, feature)
    if isinstance(found, Missing):
        raise TorchInternalsError(_message(name, "the recorder is a subclass of it"))
    return found


def require(*names: str) -> None:
    """Raise :class:`TorchInternalsError` when any of the dotted ``names`` is missing here."""
    gone = [n for n in names if n in MISSING]
    if gone:
        raise TorchInternalsError(_message(", ".join(gone), "not found"))


# -- the recorder's hot path: autograd, the dispatch-mode stack, Dynamo's frame hook ----------------
current_graph_task_id = lookup("torch._C._current_graph_task_id", "recorder")
current_autograd_node = lookup("torch._C._current_autograd_node", "recorder")
autograd_sequence_nr = lookup("torch._C._autograd._get_sequence_nr", "recorder")
set_eval_frame = lookup("torch._C._dynamo.eval_frame.set_eval_frame", "recorder")
len_dispatch_stack = lookup("torch._C._len_torch_dispatch_stack", "recorder")
dispatch_stack_at = lookup("torch._C._get_dispatch_stack_at", "recorder")
dispatch_has_kernel_for_dispatch_key = lookup("torch._C._dispatch_has_kernel_for_dispatch_key", "recorder")
OpOverload = lookup("torch._ops.OpOverload", "recorder")
TorchDispatchMode = essential("torch.utils._python_dispatch.TorchDispatchMode", "recorder")
current_dispatch_mode_stack = lookup("torch.utils._python_dispatch._get_current_dispatch_mode_stack", "recorder")
pop_mode = lookup("torch.utils._python_dispatch._pop_mode", "recorder")
#: marks a code object for Dynamo to skip (``set_code_exec_strategy``, ``_FrameExecStrategy``,
#: ``_FrameAction``), which is what ``torch._dynamo.eval_frame.skip_code`` does
eval_frame = lookup("torch._C._dynamo.eval_frame")

RECORDER = tuple(FEATURES["recorder"])

# -- the profiler behind record_time ---------------------------------------------------------------
ProfilerActivity = lookup("torch._C._profiler.ProfilerActivity", "profiler")
ProfilerConfig = lookup("torch._C._profiler.ProfilerConfig", "profiler")
ProfilerState = lookup("torch._C._profiler.ProfilerState", "profiler")
ExperimentalConfig = lookup("torch._C._profiler._ExperimentalConfig", "profiler")
TensorMetadata = lookup("torch._C._profiler._TensorMetadata", "profiler")
profiler_enabled = lookup("torch.autograd._profiler_enabled", "profiler")
prepare_profiler = lookup("torch.autograd._prepare_profiler", "profiler")
enable_profiler = lookup("torch.autograd._enable_profiler", "profiler")
disable_profiler = lookup("torch.autograd._disable_profiler", "profiler")

PROFILER = tuple(FEATURES["profiler"])

# -- fake tensors, pytrees -------------------------------------------------------------------------
FakeTensor = lookup("torch._subclasses.fake_tensor.FakeTensor", "fake")
FakeTensorMode = lookup("torch._subclasses.fake_tensor.FakeTensorMode", "fake")
foreach_supported_devices = lookup("torch.utils._foreach_utils._get_foreach_kernels_supported_devices", "fake")
pytree = lookup("torch.utils._pytree")

FAKE = tuple(FEATURES["fake"])


def _has(obj, attr: str) -> bool:
    try:
        return hasattr(obj, attr)
    except Exception:
        return False


#: Private attributes of torch's objects that the package reads in place, and whether this torch
#: has each: an op overload's schema (``_schema``) and, on the hot path, the C++ op it forwards
#: to (``_op``) unless a Python dispatcher is set (``_pyobj_dispatcher``); whether a tensor is a
#: view (``Tensor._is_view``) and its storage's identity (``UntypedStorage._cdata``); an autograd
#: node's sequence number (``_sequence_nr``); a module's own parameters (``Module._parameters``);
#: and the forward hooks ``ModuleTracker`` calls (``_fw_pre_hook``, ``_fw_post_hook``), which the
#: recorder's tracker overrides.
ATTRIBUTES = {
    "OpOverload._schema": _has(torch.ops.aten.add.Tensor, "_schema"),
    "OpOverload._op": _has(torch.ops.aten.add.Tensor, "_op"),
    "OpOverload._pyobj_dispatcher": "_pyobj_dispatcher" in vars(torch.ops.aten.add.Tensor),
    "Tensor._is_view": _has(torch.Tensor, "_is_view"),
    "UntypedStorage._cdata": _has(torch.empty(0).untyped_storage(), "_cdata"),
    "Node._sequence_nr": _has(torch.ones(1, requires_grad=True).sum().grad_fn, "_sequence_nr"),
    "Module._parameters": _has(torch.nn.Linear(1, 1), "_parameters"),
    "ModuleTracker._fw_pre_hook": _has(lookup("torch.utils.module_tracker.ModuleTracker"), "_fw_pre_hook"),
    "ModuleTracker._fw_post_hook": _has(lookup("torch.utils.module_tracker.ModuleTracker"), "_fw_post_hook"),
}

#: Whether ``OpOverload.__call__`` only forwards to its C++ op (``self._op(...)``) while no
#: Python dispatcher is set: the recorder then calls that op itself, a Python frame less per op.
OP_CALL_FORWARDS = ATTRIBUTES["OpOverload._op"] and ATTRIBUTES["OpOverload._pyobj_dispatcher"]


def require_attributes(*names: str) -> None:
    """Raise :class:`TorchInternalsError` when this torch lacks any of the attributes ``names``
    (keys of :data:`ATTRIBUTES`)."""
    gone = [n for n in names if not ATTRIBUTES.get(n, False)]
    if gone:
        raise TorchInternalsError(_message(", ".join(gone), "attribute not found"))


def require_recorder() -> None:
    """What a recording needs, checked before it starts."""
    require(*RECORDER)
    require_attributes("OpOverload._schema", "Tensor._is_view", "UntypedStorage._cdata", "Node._sequence_nr",
                       "Module._parameters", "ModuleTracker._fw_pre_hook", "ModuleTracker._fw_post_hook")


def op_schema(func):
    """``func``'s schema (``OpOverload._schema``)."""
    return func._schema


def is_view(t: torch.Tensor) -> bool:
    """Whether ``t`` is a view of another tensor (``Tensor._is_view``)."""
    return t._is_view()


def storage_id(t: torch.Tensor) -> int:
    """The identity of ``t``'s storage (``UntypedStorage._cdata``): two tensors share memory
    when theirs are equal."""
    return t.untyped_storage()._cdata


def node_sequence_nr(node) -> int:
    """The sequence number autograd gave ``node`` when the op that created it ran."""
    return node._sequence_nr()


# -- Inductor: what torch.compile lowered, for compiled audits --------------------------------------
# Inductor's internals change between releases more than the recorder's entry points do, so a
# compiled audit also checks the version (:func:`require_inductor`): a table read through
# internals that changed would be wrong, not missing.
GraphLowering = lookup("torch._inductor.graph.GraphLowering", "inductor")
is_mkldnn_conv = lookup("torch._inductor.graph.is_mkldnn_conv", "inductor")
mkldnn_devices = lookup("torch._inductor.graph.SUPPORTED_MKLDNN_DEVICES", "inductor")
inductor_debug = lookup("torch._inductor.debug", "inductor")
inductor_config = lookup("torch._inductor.config", "inductor")
inductor_ir = lookup("torch._inductor.ir", "inductor")
KernelCallLine = lookup("torch._inductor.codegen.wrapper.KernelCallLine", "inductor")
ExternKernelSchedulerNode = lookup("torch._inductor.scheduler.ExternKernelSchedulerNode", "inductor")
NopKernelSchedulerNode = lookup("torch._inductor.scheduler.NopKernelSchedulerNode", "inductor")
inductor_V = lookup("torch._inductor.virtualized.V", "inductor")
CompileContext = lookup("torch._guards.CompileContext", "inductor")
dynamo_reset = lookup("torch._dynamo.reset", "inductor")
dynamo_counters = lookup("torch._dynamo.utils.counters", "inductor")
OptimizedModule = lookup("torch._dynamo.eval_frame.OptimizedModule", "inductor")

INDUCTOR = tuple(FEATURES["inductor"])

#: Inductor functions and attributes a compiled audit wraps or reads, with the parameters each
#: wrapped function must take: checked before compiling, so that a torch whose Inductor moved
#: on fails with its version named instead of giving a wrong table.
INDUCTOR_SHAPES = {
    "GraphLowering.compile_to_module": ("self",),
    "GraphLowering.decide_layout_opt": ("gm", "is_inference"),
    "debug.set_kernel_post_grad_provenance_tracing": ("node_schedule", "kernel_name", "is_extern"),
}
INDUCTOR_IR = ("Layout", "MultiOutputLayout", "NoneLayout", "IRNode", "MultiOutput", "TemplateBuffer")
INDUCTOR_CONFIG = ("cpp.enable_kernel_profile", "profiler_mark_wrapper_call", "layout_optimization",
                   "force_layout_optimization")


def torch_release() -> str:
    """This torch's ``major.minor``."""
    return ".".join(torch.__version__.split("+")[0].split(".")[:2])


def _inductor_shape_problems() -> list[str]:
    import inspect

    problems = []
    owners = {"GraphLowering": GraphLowering, "debug": inductor_debug}
    for dotted, params in INDUCTOR_SHAPES.items():
        owner, _, attr = dotted.partition(".")
        fn = getattr(owners[owner], attr, None)
        try:
            have = list(inspect.signature(fn).parameters) if fn is not None else None
        except (TypeError, ValueError):
            have = None
        if have is None or any(p not in have for p in params if p != "self"):
            problems.append(f"{dotted}({', '.join(have) if have else '?'})")
    problems += [f"ir.{n}" for n in INDUCTOR_IR if not hasattr(inductor_ir, n)]
    for name in INDUCTOR_CONFIG:
        owner, *rest = name.split(".")
        obj = getattr(inductor_config, owner, None) if rest else inductor_config
        if obj is None or not hasattr(obj, rest[0] if rest else owner):
            problems.append(f"config.{name}")
    return problems


def require_inductor() -> None:
    """What a compiled audit needs, checked before it compiles: a tested torch release (Inductor's
    internals differ from one to the next) and the entry points with the parameters read here."""
    if torch_release() not in TESTED:
        raise TorchInternalsError(
            f"compiled audits read Inductor's private internals, which change between releases; torch "
            f"{torch.__version__} is not one auditor was tested on ({', '.join(TESTED)}), so its table could be "
            f"wrong: use a tested torch, or audit the model eagerly (compile=False)")
    require(*INDUCTOR)
    problems = _inductor_shape_problems()
    if problems:
        raise TorchInternalsError(_message(", ".join(problems), "Inductor's internals differ from those auditor reads"))


def original_module(compiled):
    """The module an ``OptimizedModule`` (``torch.compile(module)``) wraps (``_orig_mod``)."""
    return compiled._orig_mod
