"""Asking the running torch's own kernels which strides an op writes: the kernel probe.

A question the recording and the analysis both ask: "does op X, given arguments laid out like
these, keep channels_last on this machine?" Fake audits ask it to agree with the real kernels by
construction (a meta kernel is written once for every device, and is sometimes wrong for one);
the analysis asks it to tell a missing kernel from a join of mixed formats. It is answered by
running the op once on real CPU tensors laid out like the arguments (same sizes, strides and
dtypes, values random; the non-tensor arguments as given) and reading its results' strides.
Answers are cached per (overload, signature), and the signature holds what a kernel can decide
on: each tensor's dtype, sizes and strides, every other argument, the intra-op thread count and
whether oneDNN is enabled. Sizes are kept whole, not shrunk: which kernel runs, and so which
format it writes, can depend on them (a convolution picks oneDNN or the native kernel from its
batch, its numel, its kernel size and the thread count: aten/src/ATen/native/ConvUtils.h), and
an answer for other sizes would be another kernel's. A model's repeated blocks share signatures,
so a step is asked far fewer questions than it runs ops; each one allocates only that op's
arguments and results, freed at once.

Arguments are tensors (real, fake or meta: only their layout is read) or :class:`Like`, a
layout without a tensor (what an event log holds). Only CPU kernels can be asked: they are the
ones on every machine.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from ._torch import unset_fake_temporarily

_FORMATS = {4: torch.channels_last, 5: torch.channels_last_3d}


class Like(NamedTuple):
    """A tensor's layout without the tensor: what the probe reads of an argument."""

    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: torch.dtype


def like(t) -> Like:
    """The layout of a tensor (any device, fake or meta) or of a :class:`Like`."""
    if isinstance(t, Like):
        return t
    return Like(tuple(t.shape), tuple(t.stride()), t.dtype)


def _is_layout(a) -> bool:
    return isinstance(a, (torch.Tensor, Like))


def _key(a):
    if _is_layout(a):
        return like(a)
    if isinstance(a, (list, tuple)):
        return (type(a).__name__, *(_key(x) for x in a))
    if isinstance(a, torch.device):
        return ("device", a.type)  # the probe runs on the CPU whatever the argument says
    return (type(a).__name__, repr(a))


def signature(func, args, kwargs=None) -> tuple:
    """What the probe's answer for ``func`` on these arguments depends on (hashable)."""
    kwargs = kwargs or {}
    return (func, tuple(_key(a) for a in args), tuple((k, _key(v)) for k, v in sorted(kwargs.items())),
            torch.get_num_threads(), torch.backends.mkldnn.enabled)


def returns_fresh(func) -> bool:
    """Whether every result of ``func`` is a new tensor: not a view of an argument (``permute``,
    ``view``), not an argument written in place (``add_``) or an ``out=``. Only those have
    strides of the kernel's choosing; a view's follow its input's, by definition."""
    hit = _FRESH.get(func)
    if hit is None:
        schema = getattr(func, "_schema", None)
        hit = schema is not None and bool(schema.returns) and all(r.alias_info is None for r in schema.returns)
        _FRESH[func] = hit
    return hit


_FRESH: dict = {}


def tensor_args(args) -> list:
    """The tensor arguments (one level into lists: ``cat``'s)."""
    found = []
    for a in args:
        if isinstance(a, torch.Tensor):
            found.append(a)
        elif type(a) in (list, tuple):
            found.extend(x for x in a if isinstance(x, torch.Tensor))
    return found


def _dense_in(t: Like, fmt) -> bool:
    n = len(t.shape)
    order = [0, *range(2, n), 1] if fmt is not torch.contiguous_format else list(range(n))
    step = 1
    for d in reversed(order):
        if t.shape[d] != 1 and t.stride[d] != step:
            return False
        step *= t.shape[d]
    return True


def _real(a, gen: torch.Generator):
    """A real CPU tensor laid out like ``a`` (overlapping and non-dense strides included)."""
    if _is_layout(a):
        t = like(a)
        extent = 1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride) if n > 0) if all(t.shape) else 0
        if t.dtype.is_floating_point or t.dtype.is_complex:
            base = torch.randn(extent, dtype=t.dtype, generator=gen)
        else:  # zeros: a valid index, a valid mask, and no division by zero for floats
            base = torch.zeros(extent, dtype=t.dtype)
        return base.as_strided(t.shape, t.stride)
    if isinstance(a, (list, tuple)) and any(_is_layout(x) for x in a):
        return type(a)(_real(x, gen) for x in a)
    if isinstance(a, torch.device):
        return torch.device("cpu")
    return a


class KernelProbe:
    """The probe's answers, cached per (overload, signature); :data:`PROBE` is the one shared."""

    def __init__(self):
        self._answers: dict[tuple, tuple] = {}
        self._gen = torch.Generator().manual_seed(0)
        self.asked = 0  # kernels run (cache misses)

    def results(self, func, args, kwargs=None) -> tuple:
        """Per result of ``func`` run on real CPU tensors laid out like ``args``: its layout
        (a :class:`Like`, or None for a result that is no tensor). Raises what the kernel raises."""
        key = signature(func, args, kwargs)
        hit = self._answers.get(key)
        if hit is not None:
            if isinstance(hit, BaseException):
                raise hit
            return hit
        self.asked += 1
        try:
            with unset_fake_temporarily(), torch.no_grad():
                out = func(*(_real(a, self._gen) for a in args),
                           **{k: _real(v, self._gen) for k, v in (kwargs or {}).items()})
        except Exception as exc:
            self._answers[key] = exc.with_traceback(None)  # the frames would keep the tensors alive
            raise
        outs = out if isinstance(out, (list, tuple)) else (out,)
        answer = tuple(like(o) if isinstance(o, torch.Tensor) else None for o in outs)
        self._answers[key] = answer
        return answer

    def keeps_channels_last(self, func, args, kwargs=None) -> bool | None:
        """Whether ``func``'s first 4-D/5-D result is channels_last (an ambiguous one counts as
        kept: it is both) when run on arguments laid out like ``args``; None when it has no such
        result. Ask it with every image argument channels_last to learn whether the op has a
        channels_last kernel for these arguments."""
        for t in self.results(func, args, kwargs):
            if t is not None and len(t.shape) in _FORMATS:
                return _dense_in(t, _FORMATS[len(t.shape)])
        return None

    def __len__(self) -> int:
        return len(self._answers)


#: The probe every audit shares: an answer is the same for the whole process (its key holds the
#: thread count and the oneDNN switch, the run-time settings a CPU kernel reads).
PROBE = KernelProbe()
