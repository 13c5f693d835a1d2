"""Join variants that write a map in NHWC order: tokens folded into a map, a map split into
windows, windows gathered back."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator

import libcst as cst
import numpy as np

from .. import _syntax as syn
from .._proposal import Candidate, CauseView
from .._registry import register_variant
from .._statements import (
    candidate,
)
from ._join_reach import (
    RESHAPES,
    in_format,
    line_events,
)


def tokens_to_map_rank(c: CauseView) -> int | None:
    """The rank of a tensor laid out (B, c1 .. ck, N) that the reshapes on the cause's line make
    into a map (B, C, H, W) with N = H·W and c1·..·ck = C, as the recorded shapes of every such
    reshape there show (a line run at several sizes: one of them may fit by chance); None
    where one does not, or the ranks differ."""
    found, every = set(), True
    for x in line_events(c):
        if not c.tracer.op[x].startswith(RESHAPES):
            continue
        ins, outs = c.shapes(x)
        if len(ins) != 1 or len(outs) != 1 or len(ins[0]) < 3 or len(outs[0]) != 4:
            continue
        (i,), (o,) = ins, outs
        if i[0] == o[0] and i[-1] == o[2] * o[3] and int(np.prod(i[1:-1])) == o[1]:
            found.add(len(i))
        else:
            every = False
    return found.pop() if every and len(found) == 1 else None


def map_split(c: CauseView) -> int | None:
    """How many of the sizes after the batch a reshape on the cause's line splits a map's
    channels into, where it reshapes a map (B, C, H, W) dense in the format into (B, c1 .. ck,
    s1 .. sm) with c1·..·ck = C and s1·..·sm = H·W (its spatial dimensions split or merged in
    order: window partitions, heads): the one k every such reshape recorded there allows (a
    size of 1 lets one map fit several); None where no one k does."""
    allowed = None
    for x in line_events(c):
        if not c.tracer.op[x].startswith(RESHAPES):
            continue
        ins, outs = c.shapes(x)
        if len(ins) != 1 or len(outs) != 1 or len(ins[0]) != c.rank or len(outs[0]) < 3 or ins[0][0] != outs[0][0]:
            continue
        (i,), (o,) = ins, outs
        if not in_format(c, x):
            continue
        ks = {(k, len(o)) for k in range(1, len(o) - 1)
              if int(np.prod(o[1:1 + k])) == i[1] and int(np.prod(o[1 + k:])) == int(np.prod(i[2:]))}
        if ks:
            allowed = ks if allowed is None else allowed & ks
    return next(iter(allowed))[0] if allowed and len(allowed) == 1 else None


def permuted_into_map(c: CauseView) -> bool:
    """Whether a reshape on the cause's line makes a map (B, C, H, W) of a tensor (B, C, s1 ..
    sm) whose second dimension alone is the channels (a window partition undone by a permute
    that puts C second), as the recorded shapes of every such reshape there show."""
    found = False
    for x in line_events(c):
        if not c.tracer.op[x].startswith(RESHAPES):
            continue
        ins, outs = c.shapes(x)
        if len(ins) != 1 or len(outs) != 1 or len(outs[0]) != c.rank or len(ins[0]) <= c.rank:
            continue
        (i,), (o,) = ins, outs
        if i[:2] != o[:2] or int(np.prod(i[2:])) != int(np.prod(o[2:])):
            return False
        found = True
    return found


def _is_swap_of_last_two(node, rank: int) -> bool:
    """``y.transpose(a, b)`` or ``y.permute(...)`` that swaps the last two of ``rank``
    dimensions and nothing else."""
    if not isinstance(node, cst.Call) or not isinstance(node.func, cst.Attribute) or node.func.attr.value not in (
            "transpose", "permute", "swapaxes", "swapdims"):
        return False
    values = [syn.literal_int(a.value) for a in node.args if a.keyword is None and not a.star]
    if len(values) == 1 and isinstance(node.args[0].value, (cst.Tuple, cst.List)):
        values = list(syn.literal_ints(node.args[0].value) or [None])
    if None in values or any(a.keyword is not None for a in node.args):
        return False
    if node.func.attr.value == "permute":
        return len(values) == rank and [v % rank for v in values] == [*range(rank - 2), rank - 1, rank - 2]
    return len(values) == 2 and {v % rank for v in values} == {rank - 2, rank - 1}


def _reshape_args(call: cst.Call) -> list[cst.BaseExpression] | None:
    """The four sizes of ``x.reshape(a, b, c, d)`` (or ``x.view``, or one tuple of four)."""
    args = [a for a in call.args if a.keyword is None and not a.star]
    if len(args) != len(call.args):
        return None
    if len(args) == 1 and isinstance(args[0].value, cst.Tuple):
        args = list(args[0].value.elements)
    return [a.value for a in args] if len(args) == 4 else None


@functools.cache  # one rewrite for one argument: two causes of one statement rewrite it once
def map_in_nhwc_order(rank: int, weight: str | None = None) -> Callable[[cst.Module, syn.Facts], cst.Module]:
    """The rewrite of ``x.reshape(B, C, H, W)`` of a tensor ``x`` of ``rank`` dimensions laid
    out (B, c1 .. ck, N), with N = H·W and c1·..·ck = C (as the recorded shapes show), into
    ``x.permute(0, rank - 1, 1 .. k).reshape(B, H, W, C).permute(0, 3, 1, 2)``: the same index
    permutation of the same values, written in NHWC order, so the map is a channels_last view
    and the reshape a view where ``x`` is a transposed view of tokens (joins). Where ``x`` is
    itself a swap of its last two dimensions, the two permutations are written as one. With
    ``weight`` (a convolution's weight, as code), the map is then made contiguous in that
    weight's format (:func:`format_of_weight`): no copy where the model runs channels_last, the
    copy it always made where it runs contiguous."""
    def rewrite(module: cst.Module, facts: syn.Facts) -> cst.Module:
        def is_reshape(node) -> bool:
            return (isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute)
                    and node.func.attr.value in ("reshape", "view") and _reshape_args(node) is not None)

        call = syn.the_one(syn.find(module, is_reshape), "reshape into four dimensions (x.reshape(B, C, H, W))")
        b, ch, h, w = (syn.code(a) for a in _reshape_args(call))
        x = call.func.value
        if isinstance(x, cst.Call) and _is_swap_of_last_two(x, rank):  # x = y with its last two swapped
            y = syn.code(x.func.value)
            order = [0, rank - 2, *range(1, rank - 2), rank - 1]
            first = y if order == list(range(rank)) else f"{y}.permute({', '.join(map(str, order))})"
        else:
            order = [0, rank - 1, *range(1, rank - 1)]
            first = f"{syn.code(x)}.permute({', '.join(map(str, order))})"
        text = f"{first}.reshape({b}, {h}, {w}, {ch}).permute(0, 3, 1, 2)"
        if weight is not None:
            text += f".contiguous(memory_format={syn.format_of_weight(weight, facts)})"
        return syn.replace_node(module, call, syn.expr(text))
    return rewrite


def _holds(node: cst.CSTNode, other: cst.CSTNode) -> bool:
    """Whether ``other`` is ``node`` or lies inside it."""
    return bool(syn.find(node, lambda n: n is other))


def _is_reshape_of(count: int) -> Callable[[cst.CSTNode], bool]:
    """``x.reshape(...)`` or ``x.view(...)`` of ``count`` sizes, written out one by one."""
    def test(node) -> bool:
        if not (isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute)
                and node.func.attr.value in ("reshape", "view")):
            return False
        return len(node.args) == count and all(a.keyword is None and not a.star for a in node.args)
    return test


@functools.cache  # one rewrite for one argument: two causes of one statement rewrite it once
def split_map_in_nhwc_order(k: int, rank: int) -> Callable[[cst.Module, syn.Facts], cst.Module]:
    """The rewrite of ``x.reshape(B, c1 .. ck, s1 .. sm)`` of a map ``x`` (B, C, H, W), with
    c1·..·ck = C and s1·..·sm = H·W as the recorded shapes show, into ``x.permute(0, 2, 3,
    1).reshape(B, s1 .. sm, c1 .. ck).permute(...)`` back to the same order: the same view of
    the same elements, whose gradient, where the backward must copy it, is copied in NHWC order
    into a channels_last map; only where ``x`` is channels_last, so a contiguous map keeps its
    reshape (joins, the map made into tokens or windows)."""
    def rewrite(module: cst.Module, facts: syn.Facts) -> cst.Module:
        calls = [c for n in range(k + 2, k + 9) for c in syn.find(module, _is_reshape_of(n))]
        # the reshape the others are applied to: the one whose receiver holds no other
        inner = [c for c in calls if not any(o is not c and _holds(c.func.value, o) for o in calls)]
        call = syn.the_one(inner, "reshape of a map into its channels and positions (x.reshape(B, c, .., s, ..))")
        args = [syn.code(a.value) for a in call.args]
        m = len(args) - 1 - k
        if m < 1:
            raise syn.Refused("the reshape keeps no positions")
        to_nhwc = ", ".join(map(str, [0, *range(2, rank), 1]))
        back = ", ".join(map(str, [0, *range(m + 1, m + k + 1), *range(1, m + 1)]))
        x = call.func.value
        ref = syn.code(x) if syn.simple(x) else facts.new_name("_map")
        first = syn.code(x) if syn.simple(x) else f"({ref} := {syn.code(x)})"
        cl = syn.memory_format(facts)
        # the order the map is in decides: a contiguous map keeps the reshape it had
        text = (f"({ref}.permute({to_nhwc}).reshape({', '.join([args[0], *args[1 + k:], *args[1:1 + k]])})"
                f".permute({back}) if {first}.is_contiguous(memory_format={cl}) "
                f"else {ref}.{call.func.attr.value}({', '.join(args)}))")
        return syn.replace_node(module, call, syn.expr(text))
    return rewrite


@functools.cache  # one rewrite for one argument: two causes of one statement rewrite it once
def permuted_map_in_nhwc_order(rank: int, weight: str | None = None) -> Callable[[cst.Module, syn.Facts], cst.Module]:
    """The rewrite of ``y.permute(p0, p1, .., pr).reshape(B, C, H, W)`` whose permuted second
    dimension alone is the channels (as the recorded shapes show) into ``y.permute(p0, p2, ..,
    pr, p1).reshape(B, H, W, C).permute(0, 3, 1, 2)``: the same values, gathered in NHWC order
    by the one copy the reshape always made, so the map is a channels_last view (joins, windows
    made into a map). The permute may be the statement before, ``y = z.permute(..)``, given
    with it. With ``weight``, the map is then made contiguous in that weight's format
    (:func:`format_of_weight`)."""
    def rewrite(module: cst.Module, facts: syn.Facts) -> cst.Module:
        def is_permute(node) -> bool:
            return (isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute)
                    and node.func.attr.value == "permute" and len(node.args) > rank
                    and all(a.keyword is None and syn.literal_int(a.value) is not None for a in node.args))

        def nhwc(permute: cst.Call) -> cst.Call:
            order = [a.value for a in permute.args]
            return permute.with_changes(args=[cst.Arg(v, comma=a.comma) for v, a in zip(
                [order[0], *order[2:], order[1]], permute.args)])

        back = ", ".join(map(str, [0, rank - 1, *range(1, rank - 1)]))
        fmt = f".contiguous(memory_format={syn.format_of_weight(weight, facts)})" if weight is not None else ""
        gathers = syn.find(module, lambda n: _is_reshape_of(rank)(n) and is_permute(n.func.value))
        if gathers:
            call = syn.the_one(gathers, "reshape of a permuted tensor into a map (.permute(..).reshape(B, C, H, W))")
            b, ch, *space = (syn.code(a.value) for a in call.args)
            text = f"{syn.code(nhwc(call.func.value))}.reshape({', '.join([b, *space, ch])}).permute({back}){fmt}"
            return syn.replace_node(module, call, syn.expr(text))
        # the permute one statement before: ``y = z.permute(..)`` then ``y.reshape(B, C, H, W)``
        body, _ = syn.statement_of(module)
        if len(body.body) != 2:
            raise syn.Refused("no permute before the reshape into a map")
        first, second = body.body
        assign = first.body[0] if isinstance(first, cst.SimpleStatementLine) and len(first.body) == 1 else None
        if not (isinstance(assign, cst.Assign) and len(assign.targets) == 1
                and isinstance(assign.targets[0].target, cst.Name) and is_permute(assign.value)):
            raise syn.Refused("the statement before the reshape is no y = z.permute(...)")
        name = assign.targets[0].target.value
        calls = syn.find(second, lambda n: _is_reshape_of(rank)(n) and isinstance(n.func.value, cst.Name)
                      and n.func.value.value == name)
        call = syn.the_one(calls, f"reshape of {name} into a map ({name}.reshape(B, C, H, W))")
        b, ch, *space = (syn.code(a.value) for a in call.args)
        return syn.replace_nodes(module, [(assign.value, nhwc(assign.value)),
                                     (call, syn.expr(f"{name}.reshape({', '.join([b, *space, ch])}).permute({back}){fmt}"))])
    return rewrite


@register_variant("tokens to a map")
def tokens_to_a_map(c: CauseView, weight: str | None) -> Iterator[Candidate | None]:
    rank = tokens_to_map_rank(c)
    if rank is None:
        return
    yield candidate(c, "the map written in NHWC order (reshape then permute)", map_in_nhwc_order(rank))
    if weight:
        yield candidate(c, f"the map written in NHWC order, in the format of {weight}", map_in_nhwc_order(rank, weight))


@register_variant("a map split into windows")
def a_map_split_into_windows(c: CauseView, weight: str | None) -> Iterator[Candidate | None]:
    split = map_split(c)
    if split is not None:
        yield candidate(c, "the map split in NHWC order (permute, reshape, permute back)",
                        split_map_in_nhwc_order(split, c.rank))


@register_variant("windows gathered into a map")
def windows_gathered_into_a_map(c: CauseView, weight: str | None) -> Iterator[Candidate | None]:
    if not permuted_into_map(c):
        return
    for before in (0, 1):  # the permute on the line, else on the statement before it
        plain = candidate(c, "the map gathered in NHWC order (channels permuted last)",
                          permuted_map_in_nhwc_order(c.rank), before=before)
        if plain is None:
            continue
        yield plain
        if weight:
            yield candidate(c, f"the map gathered in NHWC order, in the format of {weight}",
                            permuted_map_in_nhwc_order(c.rank, weight), before=before)
        return
