"""Every private torch entry point and behaviour the package uses, in one place, each one
feature-detected.

torch changes its private names between releases without notice, so none is used anywhere
else: the recorder, the profiler join, fake audits, the fixes and compiled audits take them from
here. Each is looked up when a feature first needs it (:func:`require`, or the first read of its
name here), not at import: Inductor's and Dynamo's modules cost seconds to import, and an audit
needs neither. One that this torch lacks becomes a stand-in that raises
:class:`TorchInternalsError`, naming the feature, the entry point, this torch's version and the
releases the package is tested on; the features check theirs up front, so a recording fails
before it starts rather than halfway. ``tests/test_layout.py`` checks that no other module names
a private torch module or function.

Private *attributes* of torch's objects are read where they are needed, some on the hot path
(one call per aten op), and are checked here instead (:data:`ATTRIBUTES`).
"""

from __future__ import annotations

import functools
import importlib
import sys

import torch

#: The oldest and newest torch releases the test suite runs on; ``pyproject.toml`` declares the
#: same range, and CI tests both ends.
TESTED = ("2.8", "2.15")


class TorchInternalsError(RuntimeError):
    """A private torch entry point or behaviour the package needs is missing from this torch."""


def _tested() -> str:
    return f"auditor is tested on torch {TESTED[0]} to {TESTED[1]}"


def _message(name: str, why: str, feature: str | None = None) -> str:
    needs = f"{FEATURE_NAMES.get(feature, feature)} need" if feature else "auditor needs"
    return f"{needs} {name}, which torch {torch.__version__} does not have ({why}); {_tested()}"


#: feature -> what the user calls it, for the messages
FEATURE_NAMES = {
    "recorder": "recordings", "profiler": "timed audits", "fake": "fake audits",
    "inductor": "compiled audits (compile=True)",
}


class Missing:
    """Stands in for an entry point this torch lacks: false, and raises when used."""

    def __init__(self, name: str, why: str, feature: str | None = None):
        self._name, self._why, self._feature = name, why, feature

    def __bool__(self) -> bool:
        return False

    def __call__(self, *args, **kwargs):
        raise TorchInternalsError(_message(self._name, self._why, self._feature))

    def __getattr__(self, attr: str):
        if attr.startswith("__"):
            raise AttributeError(attr)
        raise TorchInternalsError(_message(self._name, self._why, self._feature))

    def __repr__(self) -> str:
        return f"<missing {self._name}>"


#: dotted name -> its stand-in, for every entry point looked up so far that this torch lacks
MISSING: dict[str, Missing] = {}


def lookup(name: str, feature: str | None = None):
    """The object at the dotted ``name`` (a module, then attributes), or a :class:`Missing`."""
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
        MISSING[name] = obj = Missing(name, f"no attribute {exc.args[0] if exc.args else '?'}", feature)
    return obj


#: feature -> {this module's name for an entry point: its dotted name in torch}. Each is looked up
#: on the first read of its name here (``from ._torch import x`` reads it), then kept.
ENTRIES: dict[str, dict[str, str]] = {
    # the recorder's hot path: autograd, the dispatch-mode stack, Dynamo's frame hook
    "recorder": {
        "current_graph_task_id": "torch._C._current_graph_task_id",
        "current_autograd_node": "torch._C._current_autograd_node",
        "autograd_sequence_nr": "torch._C._autograd._get_sequence_nr",
        "set_eval_frame": "torch._C._dynamo.eval_frame.set_eval_frame",
        "len_dispatch_stack": "torch._C._len_torch_dispatch_stack",
        "dispatch_stack_at": "torch._C._get_dispatch_stack_at",
        "dispatch_has_kernel_for_dispatch_key": "torch._C._dispatch_has_kernel_for_dispatch_key",
        "OpOverload": "torch._ops.OpOverload",
        "TorchDispatchMode": "torch.utils._python_dispatch.TorchDispatchMode",
        "current_dispatch_mode_stack": "torch.utils._python_dispatch._get_current_dispatch_mode_stack",
        "pop_mode": "torch.utils._python_dispatch._pop_mode",
        # marks a code object for Dynamo to skip (``set_code_exec_strategy``, ``_FrameExecStrategy``,
        # ``_FrameAction``), which is what ``torch._dynamo.eval_frame.skip_code`` does
        "eval_frame": "torch._C._dynamo.eval_frame",
    },
    # the profiler behind record_time
    "profiler": {
        "ProfilerActivity": "torch._C._profiler.ProfilerActivity",
        "ProfilerConfig": "torch._C._profiler.ProfilerConfig",
        "ProfilerState": "torch._C._profiler.ProfilerState",
        "ExperimentalConfig": "torch._C._profiler._ExperimentalConfig",
        "TensorMetadata": "torch._C._profiler._TensorMetadata",
        "profiler_enabled": "torch.autograd._profiler_enabled",
        "prepare_profiler": "torch.autograd._prepare_profiler",
        "enable_profiler": "torch.autograd._enable_profiler",
        "disable_profiler": "torch.autograd._disable_profiler",
        # a profiler record of the recorder's own call of each op, where torch makes none itself
        "RecordFunctionFast": "torch._C._profiler._RecordFunctionFast",
    },
    # fake tensors, pytrees
    "fake": {
        "FakeTensor": "torch._subclasses.fake_tensor.FakeTensor",
        "FakeTensorMode": "torch._subclasses.fake_tensor.FakeTensorMode",
        "foreach_supported_devices": "torch.utils._foreach_utils._get_foreach_kernels_supported_devices",
        # leaves fake mode for a moment: the correction table asks the real CPU kernel (_kernels)
        "unset_fake_temporarily": "torch._subclasses.fake_tensor.unset_fake_temporarily",
    },
    "pytree": {"pytree": "torch.utils._pytree"},
    # Inductor: what torch.compile lowered, for compiled audits. Its internals change between
    # releases more than the recorder's entry points do, so a compiled audit also checks the
    # release (:func:`require_inductor`): a table read through internals that changed would be
    # wrong, not missing.
    "inductor": {
        "GraphLowering": "torch._inductor.graph.GraphLowering",
        "is_mkldnn_conv": "torch._inductor.graph.is_mkldnn_conv",
        # the FLOPs decide_layout_opt weighs for an inference graph, and the devices of its CPU rule
        "count_flops_fx": "torch._inductor.fx_utils.count_flops_fx",
        "has_free_symbols": "torch.fx.experimental.symbolic_shapes.has_free_symbols",
        # the loads and stores of a scheduled loop in its own loop variables (not normalized, which
        # merges each access's loops apart): what a conversion kernel moves, whatever its buffers' ranks
        "extract_read_writes": "torch._inductor.dependencies.extract_read_writes",
        "SUPPORTED_MKLDNN_DEVICES": "torch._inductor.utils.SUPPORTED_MKLDNN_DEVICES",
        "inductor_debug": "torch._inductor.debug",
        "inductor_config": "torch._inductor.config",
        "inductor_ir": "torch._inductor.ir",
        "KernelCallLine": "torch._inductor.codegen.wrapper.KernelCallLine",
        "ExternKernelSchedulerNode": "torch._inductor.scheduler.ExternKernelSchedulerNode",
        "NopKernelSchedulerNode": "torch._inductor.scheduler.NopKernelSchedulerNode",
        "inductor_V": "torch._inductor.virtualized.V",
        "CompileContext": "torch._guards.CompileContext",
        "dynamo_reset": "torch._dynamo.reset",
        "dynamo_counters": "torch._dynamo.utils.counters",
        "OptimizedModule": "torch._dynamo.eval_frame.OptimizedModule",
    },
}
_WHERE = {name: (feature, dotted) for feature, names in ENTRIES.items() for name, dotted in names.items()}
#: feature -> the dotted names of the entry points it needs
FEATURES = {feature: tuple(names.values()) for feature, names in ENTRIES.items()}


def __getattr__(name: str):
    """An entry point of :data:`ENTRIES`, looked up on its first read and kept."""
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    feature, dotted = _WHERE[name]
    found = globals()[name] = lookup(dotted, feature)
    if name in _ESSENTIAL and isinstance(found, Missing):
        raise TorchInternalsError(_message(dotted, "the recorder is a subclass of it", feature))
    return found


#: entry points the package's classes are built on: without one, the import stops, saying why
_ESSENTIAL = frozenset({"TorchDispatchMode"})


def require(feature: str) -> None:
    """Look up every entry point ``feature`` needs, and raise :class:`TorchInternalsError`
    naming those this torch lacks."""
    for name in ENTRIES[feature]:
        getattr(sys.modules[__name__], name)
    gone = [n for n in FEATURES[feature] if n in MISSING]
    if gone:
        raise TorchInternalsError(_message(", ".join(gone), "not found", feature))


def _has(obj, attr: str) -> bool:
    try:
        return hasattr(obj, attr)
    except Exception:
        return False


def _module_tracker():
    from torch.utils.module_tracker import ModuleTracker

    return ModuleTracker


#: Private attributes of torch's objects that the package reads in place, and whether this torch
#: has each: an op overload's schema (``_schema``) and, on the hot path, the C++ op it forwards
#: to (``_op``) unless a Python dispatcher is set (``_pyobj_dispatcher``); whether a tensor is a
#: view (``Tensor._is_view``) and its storage's identity (``UntypedStorage._cdata``); an autograd
#: node's sequence number (``_sequence_nr``); a module's own parameters (``Module._parameters``),
#: its children (``Module._modules``, what ``named_children`` walks) and forward hooks
#: (``_forward_hooks``, ``_forward_pre_hooks``, which a layout plan's copies drop); and the forward
#: hooks ``ModuleTracker`` calls (``_fw_pre_hook``, ``_fw_post_hook``), which the recorder's
#: tracker overrides.
ATTRIBUTES = {
    "OpOverload._schema": _has(torch.ops.aten.add.Tensor, "_schema"),
    "OpOverload._op": _has(torch.ops.aten.add.Tensor, "_op"),
    "OpOverload._pyobj_dispatcher": "_pyobj_dispatcher" in vars(torch.ops.aten.add.Tensor),
    "Tensor._is_view": _has(torch.Tensor, "_is_view"),
    "UntypedStorage._cdata": _has(torch.empty(0).untyped_storage(), "_cdata"),
    "Node._sequence_nr": _has(torch.ones(1, requires_grad=True).sum().grad_fn, "_sequence_nr"),
    "Module._parameters": _has(torch.nn.Linear(1, 1), "_parameters"),
    "Module._modules": _has(torch.nn.Linear(1, 1), "_modules"),
    "Module._forward_hooks": _has(torch.nn.Linear(1, 1), "_forward_hooks"),
    "Module._forward_pre_hooks": _has(torch.nn.Linear(1, 1), "_forward_pre_hooks"),
    "ModuleTracker._fw_pre_hook": _has(_module_tracker(), "_fw_pre_hook"),
    "ModuleTracker._fw_post_hook": _has(_module_tracker(), "_fw_post_hook"),
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
    require("recorder")
    require_attributes("OpOverload._schema", "Tensor._is_view", "UntypedStorage._cdata", "Node._sequence_nr",
                       "Module._parameters", "Module._modules", "ModuleTracker._fw_pre_hook",
                       "ModuleTracker._fw_post_hook")


def load_what_steps_import() -> None:
    """Import the torch modules a step may import on first use (Dynamo: checkpointing and the
    optimizers reach it through ``torch._disable_dynamo``) before a recording starts: some
    releases run tensor ops while importing it (torch 2.8: 73), which would be recorded as the
    step's own."""
    if "torch._dynamo" not in sys.modules:
        importlib.import_module("torch._dynamo")


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


def drop_forward_hooks(module: torch.nn.Module) -> None:
    """Remove ``module``'s own forward hooks and pre-hooks (a copy of a user's module, timed alone)."""
    require_attributes("Module._forward_hooks", "Module._forward_pre_hooks")
    module._forward_pre_hooks.clear()
    module._forward_hooks.clear()


def node_sequence_nr(node) -> int:
    """The sequence number autograd gave ``node`` when the op that created it ran."""
    return node._sequence_nr()


# -- fake tensors on a device the machine lacks ------------------------------------------------------


@functools.cache
def fake_device_problem(device_type: str) -> str | None:
    """Why fake tensors on ``device_type`` cannot stand in for that device on this machine, or
    None. Asked of the running torch, once: some releases reach the device's runtime from C++
    even for fake tensors (a copy; autograd's bookkeeping, where it ends the process), which
    raises without the device."""
    if device_type == "cpu" or getattr(torch, device_type).is_available():
        return None
    require("fake")
    try:
        with __getattr__("FakeTensorMode")():
            torch.empty(8, device=device_type).copy_(torch.empty(8, device=device_type))
    except Exception as exc:  # the runtime's own error, whatever its class
        return f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
    return None


# -- op tags ---------------------------------------------------------------------------------------
#: ``torch.Tag.reduction`` (a TensorIterator reduction), which older releases lack
_TAG_REDUCTION = getattr(torch.Tag, "reduction", None)


def is_reduction(func) -> bool:
    """Whether ``func`` is a reduction: its ``torch.Tag.reduction``, or, on a torch without that
    tag, a schema that takes ``dim`` and ``keepdim`` and writes no argument in place."""
    if _TAG_REDUCTION is not None:
        return _TAG_REDUCTION in func.tags
    args = func._schema.arguments
    names = {a.name for a in args}
    return {"dim", "keepdim"} <= names and not any(a.alias_info is not None and a.alias_info.is_write for a in args)


# -- the profiler's record of each call of the recorder --------------------------------------------
#: the name of the profiler record around each call of a dispatch mode
MODE_RECORD = "PythonDispatchMode"


# -- Inductor: what torch.compile lowered, for compiled audits --------------------------------------
#: The oldest release whose Inductor compiled audits are tested on.
INDUCTOR_SINCE = "2.12"

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


def _release(version: str) -> tuple[int, int]:
    major, minor = version.split("+")[0].split(".")[:2]
    return int(major), int("".join(c for c in minor if c.isdigit()) or 0)


def torch_release() -> str:
    """This torch's ``major.minor``."""
    return ".".join(map(str, _release(torch.__version__)))


def _inductor_shape_problems() -> list[str]:
    import inspect

    problems = []
    owners = {"GraphLowering": __getattr__("GraphLowering"), "debug": __getattr__("inductor_debug")}
    for dotted, params in INDUCTOR_SHAPES.items():
        owner, _, attr = dotted.partition(".")
        fn = getattr(owners[owner], attr, None)
        try:
            have = list(inspect.signature(fn).parameters) if fn is not None else None
        except (TypeError, ValueError):
            have = None
        if have is None or any(p not in have for p in params if p != "self"):
            problems.append(f"{dotted}({', '.join(have) if have else '?'})")
    ir, config = __getattr__("inductor_ir"), __getattr__("inductor_config")
    problems += [f"ir.{n}" for n in INDUCTOR_IR if not hasattr(ir, n)]
    for name in INDUCTOR_CONFIG:
        owner, *rest = name.split(".")
        obj = getattr(config, owner, None) if rest else config
        if obj is None or not hasattr(obj, rest[0] if rest else owner):
            problems.append(f"config.{name}")
    return problems


#: The numbers ``GraphLowering.decide_layout_opt`` decides with, as written in its body (local
#: constants, not config), as torch 2.14's graph.py orders its rules: config off, forced, no
#: convolution, oneDNN on a CPU/XPU device, nodes >= 300 per convolution, dynamic sizes, then
#: for inference FLOPs weighted by the four multipliers, for training a grouped convolution with
#: more than one input channel per group, one with ``out * 2 <= in`` and a kernel wider than 1,
#: and every convolution with at most 64 input and output channels. It has no category for
#: transposed convolutions. torch 2.15 adds ``aten.convolution_backward`` to the convolutions
#: every rule counts (:func:`layout_opt_counts_conv_backward`). The explanation (``_inductor_graph.explain_layout_opt``) replays these
#: rules and compares its verdict with the one the running torch returned;
#: :func:`layout_opt_constants` checks each number against the constants of the running torch's
#: function, so a release that changes one is named instead of explained with the old number.
LAYOUT_OPT_CONSTANTS = {"nodes_per_conv": 300, "small_channels": 64, "in_out_ratio": 2,
                        "multipliers": {"grouped": 1.358, "default": 0.823, "in_out": 0.725, "small": 0.783}}


def _code_constants(code) -> set:
    found = set()
    for c in code.co_consts:
        if hasattr(c, "co_consts"):
            found |= _code_constants(c)
        elif isinstance(c, (int, float)) and not isinstance(c, bool):
            found.add(c)
    return found


def _code_names(code) -> set:
    found = set(code.co_names)
    for c in code.co_consts:
        if hasattr(c, "co_names"):
            found |= _code_names(c)
    return found


def layout_opt_counts_conv_backward() -> bool:
    """Whether the running torch's ``decide_layout_opt`` counts ``aten.convolution_backward``
    nodes as convolutions, read from the names its code refers to. torch 2.15 does (its input and
    weight at arguments 1 and 2, its groups at argument 9), so a backward graph's
    convolution_backward decide by the same rules as a forward's convolutions; torch 2.14 and
    earlier count ``aten.convolution`` only, so a backward graph has no convolution for them."""
    fn = getattr(__getattr__("GraphLowering"), "decide_layout_opt", None)
    fn = getattr(fn, "__wrapped__", fn)
    code = getattr(fn, "__code__", None)
    return code is not None and "convolution_backward" in _code_names(code)


def layout_opt_constants() -> tuple[dict, list[str]]:
    """(the numbers of :data:`LAYOUT_OPT_CONSTANTS`, those the running torch's
    ``decide_layout_opt`` does not contain): an empty list means this torch decides with them."""
    fn = getattr(__getattr__("GraphLowering"), "decide_layout_opt", None)
    fn = getattr(fn, "__wrapped__", fn)  # a compiled audit's wrapper keeps the original
    code = getattr(fn, "__code__", None)
    have = _code_constants(code) if code is not None else set()
    c = LAYOUT_OPT_CONSTANTS
    wanted = {"nodes_per_conv": c["nodes_per_conv"], "small_channels": c["small_channels"],
              "in_out_ratio": c["in_out_ratio"], **{f"{k} multiplier": v for k, v in c["multipliers"].items()}}
    return c, [f"{name} {value}" for name, value in wanted.items() if value not in have]


def require_inductor() -> None:
    """What a compiled audit needs, checked before it compiles: a tested torch release (Inductor's
    internals differ from one to the next) and the entry points with the parameters read here."""
    release = _release(torch.__version__)
    if not _release(INDUCTOR_SINCE) <= release <= _release(TESTED[1]):
        raise TorchInternalsError(
            f"compiled audits read Inductor's private internals, which change between releases; torch "
            f"{torch.__version__} is not one auditor was tested on for them ({INDUCTOR_SINCE} to {TESTED[1]}), "
            f"so its table could be wrong: use a tested torch, or audit the model eagerly (compile=False)")
    require("inductor")
    problems = _inductor_shape_problems()
    if problems:
        raise TorchInternalsError(_message(", ".join(problems), "Inductor's internals differ from those auditor reads",
                                           "inductor"))


def is_compiled_module(model) -> bool:
    """Whether ``model`` is a module ``torch.compile`` wrapped; without importing Dynamo, which
    made every such module."""
    if "torch._dynamo.eval_frame" not in sys.modules:
        return False
    return isinstance(model, __getattr__("OptimizedModule"))


def original_module(compiled):
    """The module an ``OptimizedModule`` (``torch.compile(module)``) wraps (``_orig_mod``)."""
    return compiled._orig_mod
