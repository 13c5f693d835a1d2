"""A map in both formats at once, re-strided (as a view) into the format of a convolution's weight.

A 4-D map whose channels, or whose height and width, are 1 is contiguous and channels_last at
once: its memory order is the same either way. PyTorch then follows the strides it was given,
and a map made contiguous gives a contiguous result (a ``cat`` of two N×1×H×W maps, a ``pad``
of an N×C×1×1 one), which the next channels_last convolution converts. Its NHWC view, read
back (``x.reshape(N, H, W, C).permute(0, 3, 1, 2)``), is the same memory and the same values
with channels_last strides: no copy. :func:`restride` does that where a convolution weight it
is given is channels_last, and the other way where it is contiguous, so code that also runs
contiguous keeps its layout; :class:`Restride` is the fix's rewrite of a statement that passes
such a map to the op.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


def _weight_channels_last(weight: Tensor) -> bool:
    """A convolution weight laid out channels_last: its input channels innermost (stride 1),
    where a contiguous one has them so only with a 1×1 kernel, and then its last stride is 1."""
    return weight.stride(1) == 1 and (weight.shape[1] == 1 or weight.stride(-1) > 1)


def restride(x, like: Tensor | torch.nn.Module):
    """``x`` in the memory format ``like`` (a 4-D convolution weight, or a module's first
    ``Conv2d``'s) is laid out in, as a view
    of the same memory, where ``x`` is a 4-D map in both formats at once (its channels, or its
    height and width, are 1); anything else is returned as it is. The same values, no copy;
    what PyTorch computes from it then follows the weight's format, where it followed the
    strides ``x`` happened to have."""
    if isinstance(like, torch.nn.Module):
        like = next((m.weight for m in like.modules() if isinstance(m, torch.nn.Conv2d)), None)
    if not isinstance(x, Tensor) or not isinstance(like, Tensor) or x.dim() != 4 or like.dim() != 4:
        return x
    if not (x.is_contiguous() and x.is_contiguous(memory_format=torch.channels_last)):
        return x
    n, c, h, w = x.shape
    if _weight_channels_last(like):
        return x.reshape(n, h, w, c).permute(0, 3, 1, 2)
    return x.permute(0, 2, 3, 1).reshape(n, c, h, w)


@dataclass(frozen=True)
class Restride:
    """The change of a statement that passes a map in both formats at once to one call: its
    first positional argument (or each item of a list or tuple argument, as ``torch.cat([a,
    b])``) is passed as ``keep_format.restride(arg, weight)``, ``weight`` a convolution weight in
    reach as code (anything that is no such map passes through it as it is). A statement
    rewrite (``rewrite(module, facts)``)."""

    weight: str
    op: str = ""  #: the op's name (``cat`` for ``aten.cat.default``): the call it is passed to

    def describe(self) -> str:
        return f"re-stride the map into the format of {self.weight}"

    def __call__(self, module, facts):
        import libcst as cst

        from . import _syntax as syn


        calls = syn.find(module, lambda n: isinstance(n, cst.Call))
        if not calls:
            raise syn.Refused("this line calls nothing to pass the re-strided map to")
        # the call of the op by its name (torch.cat for aten.cat), else the outermost call (a
        # module's, whose op runs inside it): the visitor meets it first
        named = [n for n in calls if syn.callee(n) == self.op]
        call = syn.the_one(named, f"call of {self.op}") if named else calls[0]
        name = facts.new_name("keep_format")

        def wrapped(expr, first: bool):
            if isinstance(expr, (cst.List, cst.Tuple)) and expr.elements and all(
                    isinstance(e, cst.Element) for e in expr.elements):
                return expr.with_changes(elements=[e.with_changes(value=wrapped(e.value, True))
                                                   for e in expr.elements])
            if not first or isinstance(expr, (cst.Integer, cst.Float, cst.SimpleString)) or (
                    isinstance(expr, cst.Name) and expr.value in ("None", "True", "False")):
                return None
            return syn.expr(f"{name}.restride({syn.code(expr)}, {self.weight})")

        # the first positional argument (the map), or each item of a list or tuple of them
        args, changed = [], 0
        for k, a in enumerate(call.args):
            new = wrapped(a.value, k == 0) if a.keyword is None and not a.star else None
            changed += new is not None
            args.append(a.with_changes(value=new) if new is not None else a)
        if not changed:
            raise syn.Refused("the call on this line takes no map to re-stride")
        module = syn.replace_node(module, call, call.with_changes(args=args))
        return syn.insert_before(module, f"from auditor import keep_format as {name}" if name != "keep_format"
                                 else "from auditor import keep_format")
