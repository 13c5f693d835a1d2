"""Format-keeping replacements of ops that have no channels_last kernel, as a kind of fix.

An :class:`OpReplacement` says which recorded op a function of ``auditor.keep_format`` replaces,
how the op is called in source (the op's own call, ``torch.ops.torchvision.roi_align(...)``, or a
public function with the replacement's signature, ``torchvision.ops.roi_align(...)``) and how to
ask the running torch whether the op loses the format (one tiny channels_last run).
:class:`ReplaceCall` is the change a fix makes: the op's call on a statement becomes the call of
the replacement, with the same values; ``Fixes.verify`` proves it on the user's model in float64,
values and gradients. A replacement is offered only where the probe says the op loses the
format on the running torch and device (:func:`loses_here`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ._roi_align import roi_align, roi_align_loses_format


@dataclass(frozen=True)
class OpReplacement:
    """One op without a channels_last kernel and the function that computes it in the format."""

    op: str  #: the recorded op, without its overload (``torchvision.roi_align``)
    name: str  #: the function's name under ``auditor.keep_format``
    function: Callable  #: the format-keeping function
    #: (device, dtype) -> (loses in forward, loses in backward), asked of the running torch
    probe: Callable[[str, torch.dtype], tuple[bool, bool]]
    #: the dotted name the op is called by in source; its positional arguments become the
    #: function's by :attr:`op_arguments`
    op_call: str
    #: the op call's positional arguments (as source text) -> the function's
    op_arguments: Callable[[list[str]], list[str]]
    #: names of public functions that take the function's own arguments (called by any module path)
    calls: tuple[str, ...]

    def describe(self) -> str:
        return f"auditor.keep_format.{self.name}"


def _roi_align_arguments(args: list[str]) -> list[str]:
    """torchvision's op (input, rois, spatial_scale, pooled_height, pooled_width, sampling_ratio,
    aligned) -> its public function's (input, boxes, output_size, spatial_scale, sampling_ratio,
    aligned)."""
    if len(args) != 7:
        raise ValueError(f"torchvision.roi_align takes 7 arguments, not {len(args)}")
    x, rois, scale, ph, pw, ratio, aligned = args
    return [x, rois, f"({ph}, {pw})", scale, ratio, aligned]


ROI_ALIGN = OpReplacement(
    op="torchvision.roi_align", name="roi_align", function=roi_align, probe=roi_align_loses_format,
    op_call="torch.ops.torchvision.roi_align", op_arguments=_roi_align_arguments, calls=("roi_align",),
)

#: recorded op (no overload) -> its replacement; the backward op names the forward op it is of
REPLACEMENTS: dict[str, OpReplacement] = {r.op: r for r in (ROI_ALIGN,)}


def replacement_of(op: str) -> OpReplacement | None:
    """The replacement of a recorded op (``torchvision.roi_align.default``), or None."""
    base = op.rsplit(".", 1)[0] if op.count(".") >= 2 else op
    return REPLACEMENTS.get(base) or REPLACEMENTS.get(op)


@functools.cache
def _probe(replacement: OpReplacement, device: str, dtype: torch.dtype) -> tuple[bool, bool]:
    return replacement.probe(device, dtype)


def loses_here(replacement: OpReplacement, device: str, dtype: torch.dtype) -> tuple[bool, bool]:
    """(forward, backward): whether the op loses the format on the running torch, ``device``
    and ``dtype`` (asked once per process and signature; (False, False) where the probe cannot
    run there)."""
    try:
        return _probe(replacement, device, dtype)
    except (RuntimeError, NotImplementedError, TypeError):
        return False, False


@dataclass(frozen=True)
class ReplaceCall:
    """The change of a statement that calls an op without a channels_last kernel: the call
    becomes the call of its :class:`OpReplacement`, imported from ``auditor`` before the
    statement. A statement rewrite (``rewrite(module, facts)``, as :mod:`._rewrite`'s): it
    raises ``Refused`` where the statement has no single call of the op it can rewrite."""

    replacement: OpReplacement

    def describe(self) -> str:
        return f"call {self.replacement.describe()} in place of {self.replacement.op}"

    def __call__(self, module, facts):
        import libcst as cst

        from . import _syntax as syn


        r = self.replacement

        def is_call(node) -> bool:
            return isinstance(node, cst.Call) and (syn.code(node.func) == r.op_call or syn.callee(node) in r.calls)

        call = syn.the_one(syn.find(module, is_call), f"call of {r.op}")
        name = facts.new_name("keep_format")
        callee = syn.expr(f"{name}.{r.name}")
        if syn.code(call.func) == r.op_call:
            if any(a.keyword is not None or a.star for a in call.args):
                raise syn.Refused(f"the call of {r.op} names or unpacks its arguments: call {r.describe()} by hand")
            try:
                args = r.op_arguments([syn.code(a.value) for a in call.args])
            except ValueError as exc:
                raise syn.Refused(str(exc)) from None
            new = syn.expr(f"{name}.{r.name}({', '.join(args)})")
        else:
            new = call.with_changes(func=callee)
        module = syn.replace_node(module, call, new)
        return syn.insert_before(module, f"from auditor import keep_format as {name}" if name != "keep_format"
                                 else "from auditor import keep_format")


#: the ops a product of two matrices runs as (a ``torch.matmul`` of 3-D tensors is a ``bmm``)
PRODUCTS = frozenset({"aten.bmm.default", "aten.mm.default"})


@dataclass(frozen=True)
class ReplaceProduct:
    """The change of a statement holding one product of two tensors (``torch.matmul(a, b)``,
    ``torch.bmm(a, b)``, ``a @ b``, ``a.matmul(b)``, ``a.bmm(b)``): it becomes
    ``keep_format.matmul(a, b)``, whose backward writes each gradient in its input's memory order
    (:mod:`._matmul`). A statement rewrite, as :class:`ReplaceCall`."""

    def describe(self) -> str:
        return "call auditor.keep_format.matmul in place of the product"

    def __call__(self, module, facts):
        import libcst as cst

        from . import _syntax as syn


        def operands(node) -> tuple | None:
            if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.MatrixMultiply):
                return node.left, node.right
            if not isinstance(node, cst.Call) or syn.callee(node) not in ("matmul", "bmm", "mm"):
                return None
            args = [a for a in node.args if a.keyword is None and not a.star]
            if len(args) != len(node.args):
                return None
            if syn.is_method(node, facts.torch) and len(args) == 1:
                return node.func.value, args[0].value
            if not syn.is_method(node, facts.torch) and len(args) == 2:
                return args[0].value, args[1].value
            return None

        node = syn.the_one(syn.find(module, lambda n: operands(n) is not None), "product of two tensors")
        a, b = operands(node)
        name = facts.new_name("keep_format")
        new = syn.expr(f"{name}.matmul({syn.code(a)}, {syn.code(b)})")
        module = syn.replace_node(module, node, new)
        return syn.insert_before(module, f"from auditor import keep_format as {name}" if name != "keep_format"
                                 else "from auditor import keep_format")


#: the recorded ops of a split into views (``torch.chunk`` runs as ``split``)
SPLIT_OPS = ("aten.split.Tensor", "aten.split_with_sizes.default", "aten.chunk.default")


@dataclass(frozen=True)
class ReplaceSplit:
    """The change of a statement holding one split of a tensor (``x.chunk(3, dim=1)``,
    ``x.split([a, b], 1)``, ``torch.chunk(x, 2)``, ``torch.split(x, s, dim=1)``): it becomes
    ``keep_format.chunk(x, ...)`` or ``keep_format.split(x, ...)``, the same views, whose backward
    writes the gradient in the format of ``x`` (:mod:`._split`). A statement rewrite, as
    :class:`ReplaceCall`."""

    def describe(self) -> str:
        return "call auditor.keep_format.split or chunk in place of the split"

    def __call__(self, module, facts):
        import libcst as cst

        from . import _syntax as syn


        def split_of(node) -> tuple | None:
            """(its function's name, the tensor, its other arguments) of a split call, or None."""
            if not isinstance(node, cst.Call) or syn.callee(node) not in ("split", "chunk") \
                    or any(a.star for a in node.args):
                return None
            if syn.is_method(node, facts.torch):
                return syn.callee(node), node.func.value, list(node.args)
            if syn.code(node.func) in (f"{facts.torch}.split", f"{facts.torch}.chunk") and node.args \
                    and node.args[0].keyword is None:
                return syn.callee(node), node.args[0].value, list(node.args[1:])
            return None

        node = syn.the_one(syn.find(module, lambda n: split_of(n) is not None), "split of a tensor (x.chunk, x.split)")
        fn, tensor, rest = split_of(node)
        name = facts.new_name("keep_format")
        arguments = ", ".join([syn.code(tensor), *(syn.code(a.with_changes(comma=cst.MaybeSentinel.DEFAULT))
                                                  for a in rest)])
        module = syn.replace_node(module, node, syn.expr(f"{name}.{fn}({arguments})"))
        return syn.insert_before(module, f"from auditor import keep_format as {name}" if name != "keep_format"
                                 else "from auditor import keep_format")
