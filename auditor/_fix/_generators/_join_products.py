"""Join variants of a product or an elementwise meeting: the product computed transposed; a new
tensor copied into the format of the image it meets."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator

import libcst as cst

from ..._display._text import short_source
from ..._recording._rules import VIEW
from .. import _syntax as syn
from .._proposal import Candidate, CauseView, where
from .._registry import register_variant
from .._statements import (
    candidate,
)
from ._join_reach import (
    line_events,
    row_in_format,
)

#: elementwise ops whose result takes the format of their first operand where the two differ
_FIRST_OPERAND_DECIDES = ("aten.add.Tensor", "aten.mul.Tensor", "aten.sub.Tensor")


def first_meeting(c: CauseView) -> int | None:
    """The first add, multiply or subtract (in forward) where the tensor the cause made, or a
    view or cast of it, meets a map dense in the format, as its first operand: the result takes
    the first operand's format, so the image's is lost there."""
    if c.view.phase[c.e] != "forward":
        return None
    chain, todo = {c.e}, [c.e]
    producer = c.tracer.graph.producer
    while todo:
        e = todo.pop(0)
        for k in c.view.consumers.get(e, []):
            if k in chain or c.view.phase[k] != "forward":
                continue
            op = str(c.tracer.op[k])
            if op.startswith(_FIRST_OPERAND_DECIDES):
                rows = c.tracer.input_rows(k)
                if len(rows) == 2 and int(producer[rows[0]]) in chain and row_in_format(c, rows[1]):
                    return k
                continue
            if c.view.kind[k] == VIEW or op.startswith("aten._to_copy"):
                chain.add(k)
                todo.append(k)
    return None


_OPERATORS = {"add": (cst.Add, "+"), "mul": (cst.Multiply, "*"), "sub": (cst.Subtract, "-")}


@functools.cache  # one rewrite for one argument: two causes of one statement rewrite it once
def meet_in_format(op: str) -> Callable[[cst.Module, syn.Facts], cst.Module]:
    """The one ``a + b`` (or ``*``, ``-``) of the statement, where ``a`` is a tensor made of no
    image and ``b`` an image, written ``a.contiguous(memory_format=<b's format>) + b``: the same
    values, ``a`` copied into the format ``b`` is in (no copy where ``b`` is contiguous), so the
    op meets two maps of one format (joins, a new map meeting the path)."""
    def rewrite(module: cst.Module, facts: syn.Facts) -> cst.Module:
        kind, sign = _OPERATORS[op]
        node = syn.the_one(syn.find(module, lambda n: isinstance(n, cst.BinaryOperation) and isinstance(n.operator, kind)),
                        f"{op} of two operands (a {sign} b)")
        cl = syn.memory_format(facts)
        image = facts.new_name("_image")
        left = syn.code(node.left.with_changes(lpar=[], rpar=[]))
        atom = isinstance(node.left, (cst.Name, cst.Attribute, cst.Call, cst.Subscript)) or node.left.lpar
        text = (f"{left if atom else f'({left})'}.contiguous(memory_format={cl} if ({image} := {syn.code(node.right)})"
                f".is_contiguous(memory_format={cl}) else {facts.torch}.contiguous_format) {sign} {image}")
        return syn.replace_node(module, node, syn.expr(f"({text})" if node.lpar else text))
    return rewrite


def _product(module: cst.Module) -> cst.BinaryOperation:
    return syn.the_one(syn.find(module, lambda n: isinstance(n, cst.BinaryOperation)
                          and isinstance(n.operator, cst.MatrixMultiply)), "matrix product (a @ b)")


def _transposed_product(node: cst.BinaryOperation) -> str:
    """``a @ b`` as ``(b.mT @ a.mT).mT``, written with ``transpose(-2, -1)``; a factor that is
    itself ``z.transpose(-2, -1)`` is written ``z``."""
    def transposed(e: cst.BaseExpression) -> str:
        if isinstance(e, cst.Call) and isinstance(e.func, cst.Attribute) and e.func.attr.value == "transpose":
            values = [syn.literal_int(a.value) for a in e.args]
            if len(values) == 2 and set(values) == {-1, -2} and all(a.keyword is None for a in e.args):
                return syn.code(e.func.value)
        text = syn.code(e)
        simple = syn.simple(e) or (isinstance(e, cst.Call) and syn.simple(e.func))
        return f"{text if simple else f'({text})'}.transpose(-2, -1)"
    return f"({transposed(node.right)} @ {transposed(node.left)}).transpose(-2, -1)"


def product_transposed(module: cst.Module, facts: syn.Facts) -> cst.Module:
    """``a @ b`` computed transposed (:func:`_transposed_product`): each output element the same
    dot product, so the result is a transposed view whose last dimension (the positions of a
    map) lies across memory (joins)."""
    node = _product(module)
    return syn.replace_node(module, node, syn.expr(_transposed_product(node)))


@functools.cache  # one rewrite for one argument: two causes of one statement rewrite it once
def product_transposed_in_format_of(weight: str) -> Callable[[cst.Module, syn.Facts], cst.Module]:
    """:func:`product_transposed` where ``weight`` (a convolution's weight, as code) is laid out
    in the format (:func:`weight_in_format`), the product as it was where it is not: the map
    that follows is a channels_last view where the model runs channels_last, and rows as before
    where it runs contiguous (joins)."""
    def rewrite(module: cst.Module, facts: syn.Facts) -> cst.Module:
        node = _product(module)
        text = f"({_transposed_product(node)} if {syn.weight_in_format(weight, facts)} else {syn.code(node)})"
        return syn.replace_node(module, node, syn.expr(text))
    return rewrite


@register_variant("the product transposed")
def the_product_transposed(c: CauseView, weight: str | None) -> Iterator[Candidate | None]:
    if not any(c.tracer.op[x].startswith(("aten.bmm", "aten.mm", "aten.matmul")) for x in line_events(c)):
        return
    yield candidate(c, "the product computed transposed", product_transposed)
    if weight:
        yield candidate(c, f"the product computed transposed where {weight} is {c.cl_name}",
                        product_transposed_in_format_of(weight))


@register_variant("the new tensor meets an image")
def the_new_tensor_meets_an_image(c: CauseView, weight: str | None) -> Iterator[Candidate | None]:
    meets = first_meeting(c)
    if meets is None:
        return
    at = where(str(c.view.source[meets]))
    if at[0] is not None:
        name = str(c.tracer.op[meets]).removeprefix("aten.").split(".")[0]
        yield candidate(c, f"the new tensor copied into the format of the image it meets in the {name} at "
                           f"{short_source(c.view.source[meets])}", meet_in_format(name), at=at)
