"""Kernel times and hidden conversions from torch's profiler, joined to the recorded ops.

While a timed recording runs, torch's profiler runs beside the dispatch mode. Each call of the
mode is wrapped in a ``PythonDispatchMode`` profiler record (torch's own, or where torch makes
none, the recorder's around its call of the op) whose first child is the recorder's own call of
the op: the op's kernels without the mode's Python, which is what ``time_us`` is.
Mode calls never nest, so those inner records, in start order, are the recorded ops in order
(autograd's saved-variable ``detach`` reaches the mode without a record: its own ``aten::detach``
record stands in). The ``aten::copy_`` records below an op's inner record are the data it moved
inside its kernels (a backend's internal ``contiguous()``): its hidden conversions. On CUDA a
library converts with device kernels of its own (cuDNN's ``nchwToNhwcKernel``): where the profiler
records the device (``DEVICE_ACTIVITIES``), the kernels below an op whose names are in
``CONVERSION_KERNELS`` are hidden conversions too.

Only the raw event tree is walked (no ``FunctionEvent`` parsing), once, when recording ends.
"""

from __future__ import annotations

import contextlib
import os
import sys
from dataclasses import dataclass, field

import torch

from . import _torch
from ._formats import VIEW_SUFFIX, format_label, nbytes
from ._torch import (
    MODE_RECORD,
    ExperimentalConfig,
    ProfilerActivity,
    ProfilerConfig,
    ProfilerState,
    TensorMetadata,
    TorchDispatchMode,
    TorchInternalsError,
    disable_profiler,
    enable_profiler,
    op_schema,
    prepare_profiler,
    profiler_enabled,
)

_CPU = {ProfilerActivity.CPU}

#: Device kernels that convert a tensor's format, by name (a substring of the kernel's name, which
#: cuDNN prefixes with its namespaces): name -> (from format, to format, where the name comes from).
#: They are device kernels, not aten ops, so they show only in a profile that records the device.
CONVERSION_KERNELS: dict[str, tuple[str, str, str]] = {
    "nchwToNhwcKernel": ("contiguous", "channels_last",
                         "cuDNN's layout kernel (cudnn::ops::nchwToNhwcKernel), in the traces of pytorch/pytorch#59168 "
                         "(nnU-Net: NCHW<->NHWC at 24% of CUDA time) and InstanSeg#144 (12%)"),
    "nhwcToNchwKernel": ("channels_last", "contiguous",
                         "cuDNN's layout kernel (cudnn::ops::nhwcToNchwKernel), same traces: pytorch/pytorch#59168, "
                         "InstanSeg#144"),
    "convertTensor_kernel": ("other", "other",
                             "cuDNN's tensor conversion kernel, about 10% of a 3-D step (auditor issue 30); its "
                             "direction is not in its name"),
}
#: cuDNN's transpose kernels: a kernel whose name has both is a conversion (direction unknown);
#: their exact names vary with cuDNN's version (auditor issue 30), to be confirmed on a GPU.
TRANSPOSE_KERNEL = ("cudnn", "transpose")


def conversion_kernel(name: str) -> tuple[str, str, str] | None:
    """(from, to, source) for a device kernel that converts a format, by its name; None otherwise."""
    if name.startswith("aten::"):
        return None
    for key, entry in CONVERSION_KERNELS.items():
        if key in name:
            return entry
    low = name.lower()
    if all(part in low for part in TRANSPOSE_KERNEL):
        return ("other", "other", "a cuDNN transpose kernel (auditor issue 30)")
    return None


def device_activities() -> set:
    """The profiler's activities for a timed recording: the CPU, and CUDA where a GPU is here (its
    kernels appear below the ops that launched them)."""
    cuda = getattr(ProfilerActivity, "CUDA", None)
    if cuda is not None and torch.cuda.is_available():
        return {*_CPU, cuda}
    return set(_CPU)
#: ops whose own job is to copy: the copy_ below them is the op itself, not a hidden conversion
_COPY_OPS = frozenset({
    "aten::copy_", "aten::_to_copy", "aten::clone", "aten::contiguous", "aten::to", "aten::_reshape_copy",
    "aten::reshape", "aten::_copy_from", "aten::_copy_from_and_resize", "aten::lift_fresh_copy",
})
#: records that wrap a copy: the outermost one below the op gives the copy's time, allocation included
_COPY_WRAPPERS = frozenset({"aten::contiguous", "aten::clone", "aten::to", "aten::_to_copy", "aten::reshape"})

#: Columns of ``Audit.hidden``: one row per copy inside a recorded op.
HIDDEN_COLUMNS: dict[str, str] = {
    "seq": "int32",  # the recorded op that made the copy
    "via": "category",  # the calls from the op down to the copy ("_convolution > contiguous > clone > copy_")
    "arg": "category",  # the op's argument that was copied, "(internal)" for a temporary
    "kind": "category",  # see HIDDEN_KINDS
    "from_format": "category",
    "to_format": "category",
    "shape": "category",
    "dtype": "category",
    "bytes": "int64",
    "time_us": "float64",  # the copy and its allocation
    "start_us": "float64",
}
#: ``format``: a dense tensor copied into another format (a conversion); ``materialize``: a
#: non-dense view made dense; ``same_format``: a copy in the same order; ``broadcast``: a bias or
#: scalar filled into an output; ``not_4d_5d``: any other rank.
HIDDEN_KINDS = ("format", "materialize", "same_format", "broadcast", "not_4d_5d", "unknown")


class ProfileSession:
    """torch's profiler, on the CPU, for the span of one recording.

    ``start`` does nothing when a profiler is already running (starting one would take over the
    user's session); ``active`` says whether ours runs. ``stop`` returns the raw result.
    """

    def __init__(self, record_shapes: bool):
        self.record_shapes = record_shapes  # input shapes and strides, for hidden conversions' bytes
        self.active = False

    def start(self) -> None:
        if profiler_enabled():
            return
        config = ProfilerConfig(ProfilerState.KINETO, self.record_shapes, False, False, False, False,
                                ExperimentalConfig())
        activities = device_activities()
        with quiet_stderr():
            prepare_profiler(config, activities)
            enable_profiler(config, activities)
        self.active = True

    def stop(self):
        if not self.active:
            return None
        self.active = False
        with quiet_stderr():
            return disable_profiler()


_MODE_CALLS_RECORDED: list[bool] = []  # the answer, once the profiler has given it


def profiler_records_mode_calls() -> bool:
    """Whether this torch's profiler wraps each call of a dispatch mode in a ``PythonDispatchMode``
    record (asked of the profiler itself, once): where it does not, the recorder makes that
    record around its own call of each op (``RecordFunctionFast``)."""

    class Probe(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    if _MODE_CALLS_RECORDED:
        return _MODE_CALLS_RECORDED[0]
    session = ProfileSession(record_shapes=False)
    session.start()
    if not session.active:  # the user's profiler runs: ask another time, and mark the calls meanwhile
        return False
    try:
        with Probe():
            torch.ones(1) + 1
    finally:
        result = session.stop()
    stack, found = list(result.experimental_event_tree()), False
    while stack and not found:
        e = stack.pop()
        found = e.name == MODE_RECORD
        stack.extend(e.children)
    _MODE_CALLS_RECORDED.append(found)
    return found


def require_profiler() -> None:
    """What a timed recording needs, checked before it starts: the profiler's entry points, and a
    record of each call of the recorder, torch's own or the recorder's."""
    _torch.require("profiler")
    if not profiler_records_mode_calls() and not _torch.RecordFunctionFast:
        raise TorchInternalsError(
            f"timed audits need a profiler record of each call of a dispatch mode, which torch "
            f"{torch.__version__} does not make (no PythonDispatchMode record) and cannot be made here (no "
            f"torch._C._profiler._RecordFunctionFast); record_time=False audits work")


@contextlib.contextmanager
def quiet_stderr():
    """Kineto prints its start and stop (and, on a machine without a GPU, a failed device
    query) to the process's stderr, which a recording must not litter: silence fd 2 for the
    call. Only the profiler's own calls are wrapped: what the user's code prints stays."""
    sys.stderr.flush()
    try:
        saved = os.dup(2)
    except OSError:  # no fd 2 to silence
        yield
        return
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(null)


@dataclass
class Timing:
    """Per recorded op, its kernel time, its start, and the time since the op before it ended
    outside any op (ns; -1 where unmatched), and the hidden conversions' rows (HIDDEN_COLUMNS
    order)."""

    time_ns: list[int] = field(default_factory=list)
    start_ns: list[int] = field(default_factory=list)
    gap_ns: list[int] = field(default_factory=list)
    hidden: list[tuple] = field(default_factory=list)
    #: per recorded op, the profiler records inside it (its inner record and all below): what the
    #: profiler's own per-record cost adds to its time (0 where unmatched)
    records: list[int] = field(default_factory=list)
    names: list[str] = field(default_factory=list)  # per recorded op, its profiler name


@dataclass(frozen=True)
class PlainStep:
    """The step the user runs, timed by the audit without the recorder: process CPU time at the
    audit's thread count. ``cpu_ns``: the median of ``steps`` plain steps (no mode, no
    profiler); ``profiled_ns`` and ``profiled_records``: the step under the profiler alone (the
    last warm-up step) and the records the profiler made in it, which give the profiler's own
    cost per record."""

    cpu_ns: int
    steps: int
    profiled_ns: int = 0
    profiled_records: int = 0
    #: per op name ("aten::convolution"), its calls in the profiled step and their summed time (ns):
    #: the outermost records of each name, where no Python mode slows them (:func:`op_totals`)
    op_totals: dict = field(default_factory=dict)

    @property
    def per_record_ns(self) -> float:
        """What one profiler record costs the step (0 where not measured)."""
        if self.profiled_records <= 0 or self.profiled_ns <= 0:
            return 0.0
        return max(0.0, (self.profiled_ns - self.cpu_ns) / self.profiled_records)


@dataclass(frozen=True)
class StepTime:
    """How the recorded step's times were made the plain step's (µs): ``recorded_us`` the
    process CPU time from the recorded step's first op to its last, ``plain_us`` the plain
    step's (median of ``plain_steps``), ``ops_us`` and ``outside_us`` what the audit shows
    (they add up to ``plain_us`` unless the ops alone exceed it), ``recorder_us`` the rest
    (the recorder's own cost: the mode's Python and the profiler's records), ``per_record_us``
    the profiler's measured cost per record, taken out of each op."""

    plain_us: float
    recorded_us: float
    ops_us: float
    outside_us: float
    recorder_us: float
    per_record_us: float
    plain_steps: int


def op_totals(roots) -> dict[str, tuple[int, int]]:
    """Per op name, (calls, summed duration in ns) of its profiler records that no record of the
    same name encloses, over the trees under ``roots``: ``aten::convolution`` inside
    ``aten::conv2d`` counts, a ``clone`` inside a ``clone`` does not. Where a name also runs
    inside another recorded op (a ``copy_`` inside a ``clone``), its calls outnumber the
    recorded ones and :func:`_mode_factors` leaves it alone."""
    out: dict[str, list[int]] = {}
    stack = [(e, frozenset()) for e in roots]
    while stack:
        e, above = stack.pop()
        name = e.name
        if name.startswith("aten::") and name not in above:
            entry = out.setdefault(name, [0, 0])
            entry[0] += 1
            entry[1] += e.duration_time_ns
            above = above | {name}
        stack.extend((c, above) for c in e.children)
    return {k: (v[0], v[1]) for k, v in out.items()}


def _mode_factors(time_ns: list[int], names: list[str], plain: PlainStep) -> list[float]:
    """Per recorded op, what its op's calls took in the profiled plain step over what they took
    recorded (both under the profiler, so its records cost both alike): the share of the op's time
    that is its own, the rest being what running under the mode added (colder caches between
    ops, the call's way through the dispatcher). 1 where the calls of that name do not pair up."""
    recorded: dict[str, list[int]] = {}
    for t, name in zip(time_ns, names, strict=True):
        if t >= 0:
            entry = recorded.setdefault(name, [0, 0])
            entry[0] += 1
            entry[1] += t
    factor = {}
    for name, (calls, total) in recorded.items():
        seen = plain.op_totals.get(name)
        if seen is not None and seen[0] == calls and total > 0:
            factor[name] = min(1.0, seen[1] / total)  # the mode never makes an op faster
    return [factor.get(name, 1.0) for name in names]


#: the share of an op's time the profiler's per-record cost may not take: that cost is measured
#: on one profiled step against two plain ones, and on a step of a few small ops its noise would
#: otherwise take whole ops
KEPT_AT_LEAST = 0.25


def take_out_recorder(time_ns: list[int], gap_ns: list[int], records: list[int], plain: PlainStep,
                      recorded_ns: int, names: list[str] | None = None) -> tuple[list[int], list[int], StepTime]:
    """The recorded ops' times and gaps as the plain step's (``-1``, untimed, stays).

    Each op (``names``: as the profiler names them) first takes the share that its op's calls
    took in the step profiled without the mode (:func:`_mode_factors`), then loses the profiler's cost of the records made inside it (``records`` x the cost per
    record measured on the profiled warm-up step against the plain ones); the time outside ops
    is what the plain step spent beyond those ops, shared among the gaps as the recorded step
    spread them (the recorder's Python falls in every gap alike, per op). What the recorded
    step took beyond the plain one is the recorder's cost, kept apart (:class:`StepTime`)."""
    per = plain.per_record_ns
    factors = _mode_factors(time_ns, names, plain) if names is not None and plain.op_totals else [1.0] * len(time_ns)
    ops = [t if t < 0 else round(max(t * f - per * r, t * f * KEPT_AT_LEAST))
           for t, r, f in zip(time_ns, records, factors, strict=True)]
    ops_ns = sum(t for t in ops if t > 0)
    gaps_ns = sum(g for g in gap_ns if g > 0)
    outside = max(0, plain.cpu_ns - ops_ns) if gaps_ns else 0
    scale = outside / gaps_ns if gaps_ns else 0.0
    gaps = [g if g < 0 else round(g * scale) for g in gap_ns]
    return ops, gaps, StepTime(
        plain_us=plain.cpu_ns / 1e3, recorded_us=recorded_ns / 1e3, ops_us=ops_ns / 1e3,
        outside_us=sum(g for g in gaps if g > 0) / 1e3,
        recorder_us=max(0, recorded_ns - ops_ns - outside) / 1e3, per_record_us=per / 1e3,
        plain_steps=plain.steps)


def join(funcs: list, failed: list[tuple[int, str]], result) -> Timing:
    """Match the profiler's inner records to the recorded ops (``funcs``, in order; ``failed``:
    the calls that raised, with the seq they would have had) and read their times and the copies
    below them."""
    calls = _mode_calls(result.experimental_event_tree())
    names = [_profiler_name(f) for f in funcs]
    expected, kept = list(names), list(range(len(names)))
    for pos, name in sorted(failed, reverse=True):  # their records exist, their rows do not
        expected.insert(pos, name)
        kept.insert(pos, -1)
    matched = [k for k, i in zip(_match(expected, calls), kept, strict=True) if i >= 0]
    timing = Timing(names=names)
    origin = min((inner.start_time_ns for _, inner, _ in calls if inner is not None), default=0)
    args: dict[int, tuple[str, ...]] = {}
    last_end = None  # the end of the previous op's outer record: what lies between is not an op's
    for seq, (func, k) in enumerate(zip(funcs, matched, strict=True)):
        if k < 0:
            timing.time_ns.append(-1)
            timing.start_ns.append(-1)
            timing.gap_ns.append(-1)
            timing.records.append(0)
            continue
        _, inner, outer = calls[k]
        timing.records.append(count_records([inner]))
        outer = outer if outer is not None else inner
        timing.time_ns.append(inner.duration_time_ns)
        timing.start_ns.append(inner.start_time_ns - origin)
        timing.gap_ns.append(max(0, outer.start_time_ns - last_end) if last_end is not None else 0)
        last_end = max(last_end or 0, outer.end_time_ns)
        if inner.children and names[seq] not in _COPY_OPS:
            names_of = args.get(id(func))
            if names_of is None:
                names_of = args[id(func)] = tuple(a.name for a in op_schema(func).arguments)
            timing.hidden.extend(_hidden_copies(seq, inner, names_of, origin))
            timing.hidden.extend(device_conversions(seq, inner, origin))
    return timing


def count_records(roots) -> int:
    """The profiler records in the trees under ``roots``, the roots included."""
    n, stack = 0, list(roots)
    while stack:
        e = stack.pop()
        n += 1
        stack.extend(e.children)
    return n


def _profiler_name(func) -> str:
    return op_schema(func).name  # "aten::convolution", as the profiler names the record


def _mode_calls(roots) -> list[tuple[str, object, object]]:
    """(name, inner record, outer record) for every call of the mode, in start order."""
    out = []
    stack = sorted(roots, key=lambda e: e.start_time_ns, reverse=True)
    while stack:
        e = stack.pop()
        kids = e.children
        if e.name == MODE_RECORD:
            inner = kids[0] if kids else None
            while inner is not None and inner.name == MODE_RECORD:  # torch's record, then the recorder's
                inner = inner.children[0] if inner.children else None
            out.append((inner.name if inner is not None else "", inner, e.parent))
            continue
        if e.name == "aten::detach" and kids and kids[0].name == "detach" and not kids[0].children:
            out.append((e.name, kids[0], e))  # autograd's saved-variable detach: no mode record
            continue
        stack.extend(reversed(kids))
    return out


def _match(names: list[str], calls: list, lookahead: int = 8) -> list[int]:
    """Order-preserving match by name; per expected op the index into ``calls`` or -1."""
    res = [-1] * len(names)
    j, n = 0, len(calls)
    for i, name in enumerate(names):
        for k in range(j, min(j + lookahead, n)):
            if calls[k][0] == name:
                res[i] = k
                j = k + 1
                break
    return res


def _hidden_copies(seq: int, inner, arg_names: tuple[str, ...], origin: int) -> list[tuple]:
    """The copy_ records below one op's inner record, as HIDDEN_COLUMNS rows."""
    by_impl: dict[int, int] = {}
    for i, a in enumerate(inner.extra_fields.inputs):
        for x in a if isinstance(a, list) else (a,):
            if isinstance(x, TensorMetadata) and x.impl_ptr is not None:
                by_impl.setdefault(x.impl_ptr, i)
    rows = []
    stack = [(c, (), None) for c in reversed(inner.children)]
    while stack:
        e, path, wrapper = stack.pop()
        path = (*path, e.name.removeprefix("aten::"))
        if wrapper is None and e.name in _COPY_WRAPPERS:
            wrapper = e
        if e.name != "aten::copy_":
            stack.extend((c, path, wrapper) for c in reversed(e.children))
            continue
        timed = wrapper or e
        row = [seq, " > ".join(path), "", "unknown", "", "", "", "", 0, timed.duration_time_ns / 1e3,
               (timed.start_time_ns - origin) / 1e3]
        ins = e.extra_fields.inputs
        if len(ins) >= 2 and isinstance(ins[0], TensorMetadata) and isinstance(ins[1], TensorMetadata):
            dst, src = ins[0], ins[1]
            source = by_impl.get(src.impl_ptr)
            if source is None and wrapper is not None:  # contiguous(x), clone(x): x is the wrapper's input
                w_in = wrapper.extra_fields.inputs
                if w_in and isinstance(w_in[0], TensorMetadata):
                    source = by_impl.get(w_in[0].impl_ptr)
            frm = format_label(tuple(src.sizes), tuple(src.strides))
            to = format_label(tuple(dst.sizes), tuple(dst.strides))
            row[2] = arg_names[source] if source is not None and source < len(arg_names) else "(internal)"
            row[3] = _copy_kind(src, dst, frm, to)
            row[4:9] = frm, to, str(tuple(dst.sizes)), str(dst.dtype).removeprefix("torch."), \
                nbytes(tuple(dst.sizes), dst.dtype.itemsize)
        rows.append(tuple(row))
    return rows


def device_conversions(seq: int, inner, origin: int) -> list[tuple]:
    """The format-conversion device kernels below one op's inner record (CONVERSION_KERNELS), as
    HIDDEN_COLUMNS rows of kind ``format``: their time is the kernel's on the device. The kernel
    does not say which argument it converts (``(internal)``) nor its shape."""
    rows = []
    stack = [(c, ()) for c in reversed(inner.children)]
    while stack:
        e, path = stack.pop()
        path = (*path, e.name.removeprefix("aten::"))
        entry = conversion_kernel(e.name)
        if entry is None:
            stack.extend((c, path) for c in reversed(e.children))
            continue
        frm, to, _ = entry
        rows.append((seq, " > ".join(path), "(internal)", "format", frm, to, "", "", 0,
                     e.duration_time_ns / 1e3, (e.start_time_ns - origin) / 1e3))
    return rows


def _copy_kind(src, dst, frm: str, to: str) -> str:
    if len(dst.sizes) not in (4, 5):
        return "not_4d_5d"
    numel = 1
    for s in src.sizes:
        numel *= s
    whole = 1
    for s in dst.sizes:
        whole *= s
    if numel < whole or (0 in tuple(src.strides) and not frm.endswith(VIEW_SUFFIX)):
        return "broadcast"
    if frm.endswith(VIEW_SUFFIX):
        return "materialize"
    if frm == to or "ambiguous" in (frm, to):
        return "same_format"
    return "format"
