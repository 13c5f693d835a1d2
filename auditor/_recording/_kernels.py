"""Where a fake tensor's meta kernel writes another format than the device's real kernel: the
correction table, per device, and the dispatch mode that applies it in fake audits.

A fake audit sees the strides of the meta (and fake) kernels, which are written once for every
device, and are sometimes wrong for one: on CPU ``native_group_norm`` keeps channels_last while
its meta rule writes contiguous; on CUDA ``grid_sample`` writes contiguous while its meta rule
keeps the input's format. Each :class:`Correction` names the ops it corrects, the device, the
inputs it applies to (formats, dtype, rank), the torch releases it holds for where known, and
its source (a kernel file or an issue of pytorch/pytorch, ``#N``). Models are never named.

Two kinds of answer:

* ``probe``: the real kernel is on this machine (CPU targets), so it is asked: the op runs once
  on small real tensors with the same formats, dtype and other arguments, and its output's
  format is the answer (cached per op and signature). The table only says which ops are worth
  asking; the running torch says what they do, whatever its release.
* a fixed format (``contiguous``): for a device that is not here (CUDA), what its kernel is
  known to write, from its source.

Where the answer depends on what a fake audit cannot know (the target's cuDNN), the entry says
``unknown``, and the audit warns instead of guessing.

:class:`Restrider` sits between ``FakeTensorMode`` and the recorder (entered before it, so
below it): it runs the op, and where an entry applies it hands the recorder a fake result with
the real kernel's strides (``torch.empty_strided`` under the fake mode: no data to move).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ._torch import TorchDispatchMode, _release, unset_fake_temporarily

aten = torch.ops.aten

CONTIGUOUS = "contiguous"
CHANNELS_LAST = "channels_last"
PROBE = "probe"
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
    writes: str  # PROBE, CONTIGUOUS or UNKNOWN
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

#: The table. CPU entries ask the running torch (PROBE); CUDA entries are what its kernels are
#: known to write (../shared/cuda_channels_last_notes.md gathered the sources), each to be checked
#: on a real GPU by benchmarks/gpu_truth.py.
CORRECTIONS: tuple[Correction, ...] = (
    # -- CPU: the meta rule writes contiguous where the CPU kernel keeps channels_last ---------
    Correction("group_norm_cpu", "cpu", (aten.native_group_norm.default, aten.native_group_norm_backward.default),
               PROBE, "aten/src/ATen/native/group_norm.cpp: is_cpu() ? suggest_memory_format() : Contiguous; "
               "the meta rule (torch._refs.native_group_norm) writes contiguous",
               when=channels_last_input),
    Correction("pad_cpu", "cpu", tuple(getattr(aten, f"{kind}_pad{d}d{bwd}").default
                                       for kind in ("reflection", "replication") for d in (1, 2, 3)
                                       for bwd in ("", "_backward")),
        PROBE, "meta kernels of reflection/replication pad disagree with eager: the forward's on torch 2.8 "
        "(fixed by #179307, #179366), the backward's still on 2.14; the CPU kernels (ReflectionPad.cpp, "
        "ReplicationPadding.cpp) keep the input's (grad_output's) format", when=channels_last_input),
    Correction("roll_cpu", "cpu", (aten.roll.default,), PROBE,
               "aten/src/ATen/native/TensorTransformations.cpp (roll_cpu: empty_like keeps the format); "
               "the decomposition torch._refs.roll writes contiguous", when=channels_last_input),
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


# -- asking the real CPU kernel ------------------------------------------------------------------

_PROBED: dict[tuple, tuple] = {}  # (op, signature) -> per output: a format or None


def _format_of(t: torch.Tensor) -> str | None:
    if t.dim() not in _FORMATS:
        return None
    if t.is_contiguous():
        return CONTIGUOUS
    if t.is_contiguous(memory_format=_FORMATS[t.dim()]):
        return CHANNELS_LAST
    return None


def _signature(args, kwargs) -> tuple:
    def one(a):
        if isinstance(a, torch.Tensor):
            return ("T", tuple(a.shape), _format_of(a) or tuple(a.stride()), a.dtype)
        if isinstance(a, (list, tuple)):
            return tuple(one(x) for x in a)
        return repr(a)
    return tuple(one(a) for a in args), tuple((k, one(v)) for k, v in sorted(kwargs.items()))


def _real_like(t: torch.Tensor) -> torch.Tensor:
    """A real CPU tensor with ``t``'s shape, dtype and strides (random values where floating)."""
    with unset_fake_temporarily():
        if t.is_floating_point():
            base = torch.randn(t.shape, dtype=t.dtype)
        else:
            base = torch.zeros(t.shape, dtype=t.dtype)
        out = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype)
        return out.copy_(base) if out.numel() else out


def _shrunk(args, kwargs) -> tuple[tuple, dict] | None:
    """Smaller arguments with the same formats: the batch dimension of every 4-D/5-D tensor goes
    to 1 where no integer argument names it (group_norm's N is rewritten with it)."""
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    if not tensors:
        return None
    n = tensors[0].shape[0] if tensors[0].dim() >= 3 else None
    if n is None or n <= 1:
        return args, kwargs

    def fake_small(a):
        if isinstance(a, torch.Tensor) and a.dim() in _FORMATS and a.shape[0] == n:
            fmt = _FORMATS[a.dim()] if _format_of(a) == CHANNELS_LAST else torch.contiguous_format
            return ("shrink", (1, *a.shape[1:]), fmt, a.dtype)
        return a
    return tuple(fake_small(a) for a in args), kwargs


def probe(func, args, kwargs) -> tuple:
    """The format of each 4-D/5-D result of ``func`` on real CPU tensors laid out like ``args``
    (one probe per op and signature; the batch dimension shrunk where the op's integer
    arguments allow)."""
    key = (func, _signature(args, kwargs))
    hit = _PROBED.get(key)
    if hit is not None:
        return hit
    small = _shrink_for(func, args)

    def real(a):
        if isinstance(a, tuple) and len(a) == 4 and a[0] == "shrink":
            with unset_fake_temporarily():
                return torch.randn(a[1], dtype=a[3]).contiguous(memory_format=a[2]) if a[3].is_floating_point \
                    else torch.zeros(a[1], dtype=a[3]).contiguous(memory_format=a[2])
        if isinstance(a, torch.Tensor):
            return _real_like(a)
        if isinstance(a, (list, tuple)) and any(isinstance(x, torch.Tensor) for x in a):
            return type(a)(real(x) for x in a)
        return a
    with unset_fake_temporarily():
        out = func(*[real(a) for a in small], **{k: real(v) for k, v in kwargs.items()})
    outs = out if isinstance(out, (list, tuple)) else (out,)
    answer = tuple(_format_of(o) if isinstance(o, torch.Tensor) else None for o in outs)
    _PROBED[key] = answer
    return answer


def _shrink_for(func, args) -> tuple:
    """Probe arguments: the batch shrunk to 1 for the ops whose integers do not depend on it,
    and for group_norm with its N rewritten."""
    if func in (aten.native_group_norm.default, aten.native_group_norm_backward.default):
        return _shrink_group_norm(func, args)
    shrunk = _shrunk(args, {})
    return shrunk[0] if shrunk is not None else args


def _shrink_group_norm(func, args) -> tuple:
    # native_group_norm(input, weight, bias, N, C, HxW, group, eps)
    # native_group_norm_backward(grad_out, input, mean, rstd, weight, N, C, HxW, group, mask)
    n_at = 3 if func is aten.native_group_norm.default else 5
    n = args[n_at]
    if n <= 1:
        return args
    out = []
    for i, a in enumerate(args):
        if i == n_at:
            out.append(1)
        elif isinstance(a, torch.Tensor) and a.dim() >= 1 and a.shape[0] == n:
            fmt = _FORMATS.get(a.dim()) if _format_of(a) == CHANNELS_LAST else torch.contiguous_format
            out.append(("shrink", (1, *a.shape[1:]), fmt, a.dtype))
        else:
            out.append(a)
    return tuple(out)


# -- applying the table -------------------------------------------------------------------------


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


class Restrider(TorchDispatchMode):
    """Between the fake mode and the recorder: re-lays out the results of the ops whose device
    kernel writes another format than their meta kernel (``corrections``), so the recorder logs
    what the real kernel writes. ``applied`` counts (correction, op) pairs that changed a result;
    ``unknown`` names the entries whose answer this machine cannot know (warned once each)."""

    def __init__(self, corrections: tuple[Correction, ...]):
        super().__init__()
        self.table: dict = {}
        for c in corrections:
            for op in c.ops:
                self.table.setdefault(op, []).append(c)
        self.applied: dict[tuple[str, str], int] = {}
        self.unknown: set[str] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        entries = self.table.get(func)
        if not entries:
            return out
        for c in entries:
            if not c.applies(args, kwargs):
                continue
            writes = c.writes
            if writes == "conv3d":
                writes = _conv3d_cuda_writes(args, kwargs)
            if writes == UNKNOWN:
                if c.name not in self.unknown:
                    self.unknown.add(c.name)
                    warnings.warn(f"fake audit: whether {c.name} keeps channels_last on the target cannot be "
                                  f"known here ({c.source}); the meta kernel's format is logged", stacklevel=2)
                continue
            wanted = None
            if writes == PROBE:
                try:
                    wanted = probe(func, args, kwargs)
                except Exception as exc:  # arguments a real tensor cannot copy (overlapping strides): say so
                    if c.name not in self.unknown:
                        self.unknown.add(c.name)
                        warnings.warn(f"fake audit: the real kernel of {func} could not be asked ({exc}); the "
                                      "meta kernel's format is logged", stacklevel=2)
                    continue
            out = self._restride(c, func, out, writes, wanted)
        return out

    def _restride(self, c: Correction, func, out, writes: str, wanted):
        single = not isinstance(out, (list, tuple))
        outs = [out] if single else list(out)
        changed = False
        for i in c.outputs if wanted is None else range(len(outs)):
            if i >= len(outs) or not isinstance(outs[i], torch.Tensor) or outs[i].dim() not in _FORMATS:
                continue
            fmt = writes if wanted is None else (wanted[i] if i < len(wanted) else None)
            if fmt is None:
                continue
            o = outs[i]
            if _format_of(o) == fmt:
                continue
            strides = _dense_strides(tuple(o.shape), fmt)
            outs[i] = torch.empty_strided(o.shape, strides, dtype=o.dtype, device=o.device)
            changed = True
        if not changed:
            return out
        key = (c.name, str(func))
        self.applied[key] = self.applied.get(key, 0) + 1
        return outs[0] if single else type(out)(outs)
