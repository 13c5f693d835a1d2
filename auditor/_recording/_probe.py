"""Asking the running torch's own kernels which strides an op writes: the kernel probe.

A question the recording and the analysis both ask: "does op X, given arguments laid out like
these, keep channels_last on this machine?" Fake audits ask it to agree with the real kernels by
construction (a meta kernel is written once for every device, and is sometimes wrong for one);
the analysis asks it to tell a missing kernel from a join of mixed formats. It is answered by
running the op once on real CPU tensors laid out like the arguments (same sizes, strides and
dtypes, values random; the non-tensor arguments as given) and reading its results' strides.
Answers are cached per (overload, signature), and the signature holds what a kernel can decide
on: each tensor's dtype, sizes and strides, every other argument, the intra-op thread count and
whether oneDNN is enabled. Sizes are kept: which kernel runs, and so which format it writes,
can depend on them (a convolution picks oneDNN or the native kernel from its batch, its numel,
its kernel size and the thread count: aten/src/ATen/native/ConvUtils.h), and an answer for
other sizes could be another kernel's. Only an op whose arguments exceed :data:`EXACT_BYTES`
(a large batch, which a fake audit never allocates) is asked with its batch cut to
:data:`SHRUNK_BATCH`, its results checked against the sizes they must have and their order of
dimensions laid over the full sizes. A model's repeated blocks share signatures, so a step is
asked far fewer questions than it runs ops; each one allocates only that op's arguments and
results, freed at once.

Arguments are tensors (real, fake or meta: only their layout is read) or :class:`Like`, a
layout without a tensor (what an event log holds). Only CPU kernels can be asked: they are the
ones on every machine.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from ._torch import op_schema, unset_fake_temporarily

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
        try:
            schema = op_schema(func)
        except AttributeError:  # not an op overload
            schema = None
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


def all_channels_last(args) -> list:
    """``args`` with every 4-D/5-D tensor argument (one level into lists) as a dense
    channels_last (3d) :class:`Like` of its sizes and dtype: the arguments to ask
    :meth:`KernelProbe.keeps_channels_last` whether an op has a channels_last kernel, as opposed
    to losing the format because its inputs disagree."""
    def one(a):
        if _is_layout(a):
            t = like(a)
            if len(t.shape) in _FORMATS:
                return Like(t.shape, _dense(t.shape, [0, *range(2, len(t.shape)), 1]), t.dtype)
            return a
        if isinstance(a, (list, tuple)) and any(_is_layout(x) for x in a):
            return type(a)(one(x) for x in a)
        return a
    return [one(a) for a in args]


def _dense_in(t: Like, fmt) -> bool:
    n = len(t.shape)
    order = [0, *range(2, n), 1] if fmt is not torch.contiguous_format else list(range(n))
    return all(size == 1 or got == want for size, got, want in zip(t.shape, t.stride, _dense(t.shape, order)))


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


#: Arguments of up to this many bytes in all are asked at their own sizes; larger ones (a big
#: batch, which a fake audit never allocates) with their batch cut to :data:`SHRUNK_BATCH`.
EXACT_BYTES = 16 * 2**20
#: The batch a large op is asked at: more than one sample, as the step has (a kernel may choose
#: another path for a single sample).
SHRUNK_BATCH = 2


def _nbytes(args) -> int:
    total = 0
    for a in args:
        if _is_layout(a):
            t = like(a)
            n = 1
            for d in t.shape:
                n *= d
            total += n * t.dtype.itemsize
        elif isinstance(a, (list, tuple)):
            total += _nbytes(a)
    return total


def _order(t: Like) -> list[int] | None:
    """The dimensions from outermost to innermost, if ``t`` is dense in that order (else None)."""
    order = sorted(range(len(t.shape)), key=lambda d: (-t.stride[d], d))
    step = 1
    for d in reversed(order):
        if t.shape[d] != 1 and t.stride[d] != step:
            return None
        step *= t.shape[d]
    return order


def _dense(shape, order) -> tuple[int, ...]:
    strides = [0] * len(shape)
    step = 1
    for d in reversed(order):
        strides[d] = step
        step *= max(shape[d], 1)
    return tuple(strides)


def _cut(a, n: int, b: int, ints: bool):
    """``a`` with its batch ``n`` cut to ``b``: tensors of 2 or more dimensions whose first size
    is ``n`` (dense ones stay dense in their order; others keep their strides), and with ``ints``
    the integers equal to ``n`` (``native_group_norm``'s ``N``)."""
    if _is_layout(a):
        t = like(a)
        if len(t.shape) < 2 or t.shape[0] != n:
            return t
        shape = (b, *t.shape[1:])
        order = _order(t)
        return Like(shape, _dense(shape, order) if order is not None else t.stride, t.dtype)
    if isinstance(a, (list, tuple)) and any(_is_layout(x) for x in a):
        return type(a)(_cut(x, n, b, ints) for x in a)
    if ints and type(a) is int and a == n:
        return b
    return a


class KernelProbe:
    """The probe's answers, cached per (overload, signature); :data:`PROBE` is the one shared."""

    def __init__(self):
        self._answers: dict[tuple, tuple] = {}
        self._gen = torch.Generator().manual_seed(0)
        self.asked = 0  # kernels run (cache misses)

    def results(self, func, args, kwargs=None, out_shapes=None) -> tuple:
        """Per result of ``func`` run on real CPU tensors laid out like ``args``: its layout
        (a :class:`Like`, or None for a result that is no tensor). Raises what the kernel raises.

        Arguments over :data:`EXACT_BYTES` are asked with their batch cut to
        :data:`SHRUNK_BATCH` when ``out_shapes`` (the results' sizes at the full batch) are
        given: each result must then have those sizes but the batch, and its order of
        dimensions is laid over the full sizes."""
        kwargs = kwargs or {}
        key = signature(func, args, kwargs)
        hit = self._answers.get(key)
        if hit is not None:
            if isinstance(hit, BaseException):
                raise hit
            return hit
        self.asked += 1
        try:
            answer = self._ask(func, args, kwargs, out_shapes)
        except Exception as exc:
            self._answers[key] = exc.with_traceback(None)  # the frames would keep the tensors alive
            raise
        self._answers[key] = answer
        return answer

    def _ask(self, func, args, kwargs, out_shapes) -> tuple:
        first = next((like(t) for t in _layouts(args) if len(like(t).shape) >= 3), None)
        n = first.shape[0] if first is not None else 0
        if out_shapes is None or n <= SHRUNK_BATCH or _nbytes([*args, *kwargs.values()]) <= EXACT_BYTES:
            return self._run(func, args, kwargs)
        refused = None
        for ints in (False, True):
            small = [_cut(a, n, SHRUNK_BATCH, ints) for a in args]
            small_kw = {k: _cut(v, n, SHRUNK_BATCH, ints) for k, v in kwargs.items()}
            try:
                got = self._run(func, small, small_kw)
            except Exception as exc:  # the cut broke an argument that the batch sizes
                refused = exc
                continue
            answer = _widen(got, out_shapes, n)
            if answer is not None:
                return answer
        raise RuntimeError(f"too large to ask at its own batch ({n}), and a batch of {SHRUNK_BATCH} "
                           f"does not give its results' sizes ({refused or 'other sizes'})")

    def _run(self, func, args, kwargs) -> tuple:
        with unset_fake_temporarily(), torch.no_grad():
            out = func(*(_real(a, self._gen) for a in args), **{k: _real(v, self._gen) for k, v in kwargs.items()})
        outs = out if isinstance(out, (list, tuple)) else (out,)
        return tuple(like(o) if isinstance(o, torch.Tensor) else None for o in outs)

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


def _layouts(args):
    for a in args:
        if _is_layout(a):
            yield a
        elif isinstance(a, (list, tuple)):
            yield from (x for x in a if _is_layout(x))


def _widen(got: tuple, out_shapes, n: int) -> tuple | None:
    """Results asked at a cut batch, laid over the full sizes (None: they do not fit them)."""
    if len(got) != len(out_shapes):
        return None
    wide = []
    for t, shape in zip(got, out_shapes):
        if t is None or shape is None:
            wide.append(t if shape is None else None)
            continue
        shape = tuple(shape)
        expect = (SHRUNK_BATCH, *shape[1:]) if shape and shape[0] == n else shape
        if t.shape != expect:
            return None
        order = _order(t)
        if order is None:
            return None
        wide.append(Like(shape, _dense(shape, order), t.dtype))
    return tuple(wide)


#: The probe every audit shares: an answer is the same for the whole process (its key holds the
#: thread count and the oneDNN switch, the run-time settings a CPU kernel reads).
PROBE = KernelProbe()
