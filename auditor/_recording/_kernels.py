"""What a fake audit's results are laid out like: the real kernel's strides, asked of it where it
is here (CPU), else the table of what a device's kernels are known to write (CUDA); and the
dispatch mode that applies them.

A fake audit sees the strides of the meta (and fake) kernels, which are written once for every
device, and are sometimes wrong for one: on CPU ``native_group_norm``, reflect/replicate pad's
backward, ``roll`` and ``channel_shuffle`` keep channels_last while their meta rules write
contiguous; on CUDA ``grid_sample`` writes contiguous while its meta rule keeps the input's
format.

* CPU targets: the kernels are on this machine, so every op that writes new tensors, reads an
  argument of 3 or more dimensions that is not plain row-major (a channels_last map, an ambiguous
  N x C x 1 x 1 one, a view, transposed tokens) and returns a result of 3 or more dimensions is
  asked of the real kernel (:mod:`._probe`: once per overload and signature, on real tensors laid out like its
  arguments), and its results get the real kernel's strides. No table: the running torch says
  what its kernels do, whatever the op and the release.
* CUDA targets (no GPU here): a table of :class:`Correction` entries, each naming the ops it
  corrects, the inputs it applies to (formats, dtype, rank), the torch releases it holds for
  where known, and its source (a kernel file or an issue of pytorch/pytorch, ``#N``). Models are
  never named. Where the answer depends on what a fake audit cannot know (the target's cuDNN),
  the entry says ``unknown`` and the audit warns instead of guessing. The ops the probe would
  have asked and no entry covers are the ones this audit could not check
  (:attr:`Restrider.unchecked`); the report names them.

:class:`Restrider` sits between ``FakeTensorMode`` and the recorder (entered before it, so
below it): it runs the op, and where the answer differs it hands the recorder a fake result with
the real kernel's strides (``torch.empty_strided`` under the fake mode: no data to move).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass

import pandas as pd
import torch

from ._probe import PROBE as SHARED_PROBE
from ._probe import KernelProbe, returns_fresh, tensor_args
from ._torch import TorchDispatchMode, _release

aten = torch.ops.aten

CONTIGUOUS = "contiguous"
CHANNELS_LAST = "channels_last"
UNKNOWN = "unknown"

_FORMATS = {4: torch.channels_last, 5: torch.channels_last_3d}


def channels_last_input(args, kwargs) -> bool:
    """A 4-D/5-D tensor argument (the input, or for a backward op its grad_output or saved input)
    is dense in channels_last (3d) order and not also contiguous."""
    for t in args:
        if isinstance(t, torch.Tensor) and t.dim() in _FORMATS and not t.is_contiguous() \
                and t.is_contiguous(memory_format=_FORMATS[t.dim()]):
            return True
    return False


def _all(*checks):
    return lambda args, kwargs: all(c(args, kwargs) for c in checks)


@dataclass(frozen=True)
class Correction:
    """What ``device``'s kernel for ``ops`` writes, where the meta kernel may write another format."""

    name: str
    device: str  # "cpu" or "cuda"
    ops: tuple  # OpOverloads
    writes: str  # CONTIGUOUS, CHANNELS_LAST, UNKNOWN or "conv3d" (the local cuDNN decides)
    source: str  # kernel file or issue (#N: pytorch/pytorch)
    since: str | None = None  # first torch release it holds for ("2.8"), None: as far back as known
    until: str | None = None  # first release it no longer holds for, None: still holds / not known
    when: Callable | None = None  # (args, kwargs) -> bool: the inputs it applies to
    outputs: tuple = (0,)  # which results it re-lays out
    note: str = ""

    def holds_for(self, version: str) -> bool:
        v = _release(version)
        if self.since is not None and v < _release(self.since):
            return False
        return self.until is None or v < _release(self.until)

    def applies(self, args, kwargs) -> bool:
        return self.when is None or bool(self.when(args, kwargs))


def _cudnn_version() -> int | None:
    try:
        return torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    except Exception:  # a build without cuDNN
        return None


def _conv3d_cuda_writes(args, kwargs, cudnn: int | None = None) -> str:
    """Conv3d on CUDA writes NDHWC only through cuDNN >= 8.0.5 (ConvUtils.h); torch 2.9 turned
    cuDNN off for fp16/bf16 conv3d with a kernel other than 1 on cuDNN 9.8-9.14 (#163581,
    re-enabled for >= 9.15 by #166480); the native kernels write contiguous."""
    cudnn = _cudnn_version() if cudnn is None else cudnn
    if cudnn is None or cudnn < 0:
        return UNKNOWN
    if cudnn < 8005:
        return CONTIGUOUS
    x, w = args[0], args[1]
    if (x.dtype in (torch.float16, torch.bfloat16) and any(k != 1 for k in w.shape[2:])
            and 90800 <= cudnn < 91500 and _release(torch.__version__) >= (2, 9)):
        return CONTIGUOUS
    return CHANNELS_LAST


def _is_5d(args, kwargs) -> bool:
    return isinstance(args[0], torch.Tensor) and args[0].dim() == 5


def _float64(args, kwargs) -> bool:
    return isinstance(args[0], torch.Tensor) and args[0].dtype == torch.float64


_POOLS_3D = tuple(getattr(aten, n).default for n in (
    "max_pool3d_with_indices", "max_pool3d_with_indices_backward", "avg_pool3d", "avg_pool3d_backward",
    "adaptive_avg_pool3d", "_adaptive_avg_pool3d", "_adaptive_avg_pool3d_backward", "adaptive_max_pool3d",
    "adaptive_max_pool3d_backward", "max_unpool3d") if hasattr(aten, n))

#: The table, for devices whose kernels are not here: what CUDA's kernels are known to write
#: (../shared/cuda_channels_last_notes.md gathered the sources), each to be checked on a real GPU
#: by benchmarks/gpu_truth.py. CPU kernels are asked instead (:mod:`._probe`).
CORRECTIONS: tuple[Correction, ...] = (
    # -- CUDA: what torch's CUDA kernels write -------------------------------------------------
    Correction("group_norm_cuda", "cuda", (aten.native_group_norm.default, aten.native_group_norm_backward.default),
               CONTIGUOUS, "aten/src/ATen/native/group_norm.cpp: is_cpu() || is_privateuseone() ? suggest : "
               "Contiguous; NHWC CUDA kernels: #126635, #140440, #191945 (merge command 2026-08-13, release "
               "not known here); torch 2.14.1's libtorch_cuda.so has no NHWC group-norm kernel (its "
               "group_norm_kernel.cu symbols: RowwiseMoments, ComputeFusedParams, GammaBetaBackward...)",
               until="2.15", when=channels_last_input),
    Correction("group_norm_cuda_unknown", "cuda", (aten.native_group_norm.default,
                                                   aten.native_group_norm_backward.default),
               UNKNOWN, "#191945 (NHWC GroupNorm on CUDA, merge command 2026-08-13): the first release that "
               "ships it is not known here", since="2.15", when=channels_last_input),
    Correction("instance_norm_cuda", "cuda", (aten.instance_norm.default,), CONTIGUOUS,
               "aten/src/ATen/native/Normalization.cpp instance_norm: input.contiguous(); NHWC fix pending #194616",
               when=channels_last_input,
               note="instance_norm is composite: its .contiguous() is recorded as ops already"),
    Correction("grid_sample_cuda", "cuda", (aten.grid_sampler_2d.default, aten.grid_sampler_3d.default,
                                            aten.cudnn_grid_sampler.default),
               CONTIGUOUS, "aten/src/ATen/native/cuda/GridSampler.cpp: at::empty(..., input.options())",
               when=channels_last_input),
    Correction("grid_sample_backward_cuda", "cuda", (aten.grid_sampler_2d_backward.default,
                                                     aten.grid_sampler_3d_backward.default),
               CONTIGUOUS, "aten/src/ATen/native/cuda/GridSampler.cpp: grad_input is contiguous",
               when=channels_last_input, outputs=(0,)),
    Correction("adaptive_max_pool2d_cuda", "cuda", (aten.adaptive_max_pool2d.default,), CHANNELS_LAST,
               "#116482, #67697: no NHWC kernel; the input is made contiguous and the output copied back "
               "(a hidden conversion, read from the profiler on a GPU)", when=channels_last_input,
               note="the format is kept; the cost is a transpose inside the op"),
    Correction("pools_3d_cuda", "cuda", _POOLS_3D, CONTIGUOUS,
               "max/avg/adaptive 3d pools and max_unpool3d have no NDHWC CUDA path (#48430); fixes #80748 and "
               "#116305 closed unmerged", when=channels_last_input, outputs=(0,)),
    Correction("conv_float64_cuda", "cuda", (aten.convolution.default, aten.convolution_backward.default),
               CONTIGUOUS, "aten/src/ATen/native/ConvUtils.h cudnn_conv_suggest_memory_format: double -> "
               "Contiguous (cuDNN has no NHWC double kernels)", when=_all(channels_last_input, _float64),
               outputs=(0, 1)),
    Correction("conv3d_cuda", "cuda", (aten.convolution.default, aten.convolution_backward.default),
               "conv3d", "aten/src/ATen/native/ConvUtils.h: NDHWC needs cuDNN >= 8.0.5; #163581 (2.9: cuDNN off "
               "for fp16/bf16 conv3d, kernel != 1, cuDNN 9.8-9.14), #166480 (back for cuDNN >= 9.15)",
               when=_all(channels_last_input, _is_5d), outputs=(0, 1)),
)


def corrections_for(device_type: str, version: str | None = None) -> tuple[Correction, ...]:
    version = torch.__version__ if version is None else version
    return tuple(c for c in CORRECTIONS if c.device == device_type and c.holds_for(version))


# -- applying the answers ------------------------------------------------------------------------


def _format_of(t: torch.Tensor) -> str | None:
    if t.dim() not in _FORMATS:
        return None
    if t.is_contiguous():
        return CONTIGUOUS
    if t.is_contiguous(memory_format=_FORMATS[t.dim()]):
        return CHANNELS_LAST
    return None


def _dense_strides(shape, fmt: str) -> tuple[int, ...] | None:
    if fmt == CONTIGUOUS:
        order = list(range(len(shape)))
    elif fmt == CHANNELS_LAST and len(shape) in _FORMATS:
        order = [0, *range(2, len(shape)), 1]
    else:
        return None
    strides = [0] * len(shape)
    step = 1
    for d in reversed(order):
        strides[d] = step
        step *= max(shape[d], 1)
    return tuple(strides)


def worth_asking(func, args) -> bool:
    """An op whose results' strides a device's kernel chooses (it writes new tensors), with an
    argument of 3 or more dimensions that is not plain row-major: a channels_last map (an
    ambiguous one too: N x C x 1 x 1 reads as both, and kernels pick either), a view of one, a
    transposed token tensor. The ops a probe asks; an op whose arguments are all row-major
    writes row-major results on every kernel the tests know."""
    if not returns_fresh(func):
        return False
    return any(t.dim() >= 3 and (not t.is_contiguous() or
                                 (t.dim() in _FORMATS and t.is_contiguous(memory_format=_FORMATS[t.dim()])))
               for t in tensor_args(args))


def _shaped_out(out) -> bool:
    """A result of 3 or more dimensions: one whose strides are a layout."""
    return any(isinstance(o, torch.Tensor) and o.dim() >= 3
               for o in (out if isinstance(out, (list, tuple)) else (out,)))


class Restrider(TorchDispatchMode):
    """Between the fake mode and the recorder: gives the recorder results laid out as the target's
    real kernels write them.

    With ``probe`` (a CPU target), every op :func:`worth_asking` with a result of 3 or more
    dimensions is asked of the real kernel, and a result whose strides differ from the real
    one's is re-laid out; ``asked`` counts the calls asked per op, ``changed`` the calls (per
    op) whose results it re-laid out, ``failed`` the ops whose kernel could not be asked (the meta kernel's strides are kept,
    warned once per op). Without it, ``corrections`` (the device's table) are applied:
    ``applied`` counts (correction, op) pairs that changed a result, ``unknown`` names the
    entries whose answer this machine cannot know (warned once each), and ``unchecked`` counts
    the ops a probe would have asked that no entry covers: what this audit could not check."""

    def __init__(self, corrections: tuple[Correction, ...] = (), probe: KernelProbe | None = None):
        super().__init__()
        self.probe = probe
        self.table: dict = {}
        for c in corrections:
            for op in c.ops:
                self.table.setdefault(op, []).append(c)
        self.applied: dict[tuple[str, str], int] = {}
        self.unknown: set[str] = set()
        self.asked: dict[str, int] = {}  # op -> calls asked of the real kernel
        self.changed: dict[str, int] = {}
        self.failed: dict[str, str] = {}
        self.unchecked: dict[str, int] = {}
        self.tabled: dict[str, int] = {}  # op -> calls a table entry applied to

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if self.probe is not None:
            if worth_asking(func, args) and _shaped_out(out):
                return self._asked(func, args, kwargs, out)
            return out
        entries = [c for c in self.table.get(func, ()) if c.applies(args, kwargs)]
        if not entries:
            if worth_asking(func, args) and _shaped_out(out):
                name = str(func)
                self.unchecked[name] = self.unchecked.get(name, 0) + 1
            return out
        self.tabled[str(func)] = self.tabled.get(str(func), 0) + 1
        for c in entries:
            writes = c.writes
            if writes == "conv3d":
                writes = _conv3d_cuda_writes(args, kwargs)
            if writes == UNKNOWN:
                if c.name not in self.unknown:
                    self.unknown.add(c.name)
                    warnings.warn(f"fake audit: whether {c.name} keeps channels_last on the target cannot be "
                                  f"known here ({c.source}); the meta kernel's format is logged", stacklevel=2)
                continue
            out = self._restride(c, func, out, writes)
        return out

    def _asked(self, func, args, kwargs, out):
        name = str(func)
        self.asked[name] = self.asked.get(name, 0) + 1
        try:
            outs = out if isinstance(out, (list, tuple)) else (out,)
            shapes = [tuple(o.shape) if isinstance(o, torch.Tensor) else None for o in outs]
            real = self.probe.results(func, args, kwargs, out_shapes=shapes)
        except Exception as exc:  # a kernel that needs values a random tensor lacks: say so
            if name not in self.failed:
                self.failed[name] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
                warnings.warn(f"fake audit: the real kernel of {name} could not be asked ({self.failed[name]}); "
                              "the meta kernel's strides are logged", stacklevel=3)
            return out
        single = not isinstance(out, (list, tuple))
        outs = [out] if single else list(out)
        changed = False
        for i, (o, r) in enumerate(zip(outs, real)):
            if (r is None or not isinstance(o, torch.Tensor) or o.dim() < 3
                    or tuple(o.shape) != r.shape or tuple(o.stride()) == r.stride):
                continue
            outs[i] = torch.empty_strided(o.shape, r.stride, dtype=o.dtype, device=o.device)
            changed = True
        if not changed:
            return out
        self.changed[name] = self.changed.get(name, 0) + 1
        return outs[0] if single else type(out)(outs)

    def checks(self, device_type: str) -> pd.DataFrame:
        """Per op this audit had to know a device kernel's strides for: ``checked`` is
        ``"kernel"`` (asked of the real kernel here), ``"not asked"`` (the kernel raised on random
        values; the meta kernel's strides kept), ``"table"`` (a table entry's source) or
        ``"not checked"`` (the meta kernel's strides, which nothing here could check); ``calls``
        how often it ran so, ``relaid`` how many of those results were re-laid out."""
        rows = []
        for op, n in self.asked.items():
            rows.append((op, device_type, "not asked" if op in self.failed else "kernel", n, self.changed.get(op, 0),
                         self.failed.get(op, "")))
        relaid: dict[str, int] = {}
        for (_, op), n in self.applied.items():
            relaid[op] = relaid.get(op, 0) + n
        for op, n in self.tabled.items():
            rows.append((op, device_type, "table", n, relaid.get(op, 0), ""))
        for op, n in self.unchecked.items():
            rows.append((op, device_type, "not checked", n, 0, ""))
        frame = pd.DataFrame(rows, columns=["op", "device", "checked", "calls", "relaid", "reason"])
        frame["calls"] = frame["calls"].astype("Int64")
        return frame.sort_values(["checked", "op"], kind="stable").reset_index(drop=True)

    def _restride(self, c: Correction, func, out, writes: str):
        single = not isinstance(out, (list, tuple))
        outs = [out] if single else list(out)
        changed = False
        for i in c.outputs:
            if i >= len(outs) or not isinstance(outs[i], torch.Tensor) or outs[i].dim() not in _FORMATS:
                continue
            o = outs[i]
            if _format_of(o) == writes:
                continue
            strides = _dense_strides(tuple(o.shape), writes)
            outs[i] = torch.empty_strided(o.shape, strides, dtype=o.dtype, device=o.device)
            changed = True
        if not changed:
            return out
        key = (c.name, str(func))
        self.applied[key] = self.applied.get(key, 0) + 1
        return outs[0] if single else type(out)(outs)


def restrider_for(device_type: str) -> Restrider:
    """The target's re-layout: its real kernels asked where they are here (CPU), else its table."""
    if device_type == "cpu":
        return Restrider(probe=SHARED_PROBE)
    return Restrider(corrections_for(device_type))
