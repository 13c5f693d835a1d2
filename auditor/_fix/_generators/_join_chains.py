"""Join variants of a chain of reshapes and permutes over several statements: gathered in NHWC
order in one copy, or reading the map in its memory order."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import libcst as cst
import numpy as np
import pandas as pd

from ..._recording._cells import recorded
from .. import _chain
from .. import _syntax as syn
from .._proposal import Candidate, CauseView, where
from .._registry import register_variant
from .._statements import (
    candidate,
    functions_at,
)
from ._join_reach import (
    VIEWS,
    in_format,
    weight_in_reach,
)


@register_variant("a chain of reshapes")
def a_chain_of_reshapes(c: CauseView, weight: str | None) -> list[Candidate]:
    """The map the cause's tensor is, or was made from a few ops before (a pool, a view),
    where a chain of reshapes and permutes over several statements folds it out of tokens:
    the chain gathered in NHWC order in one copy, where a convolution weight in reach is in the
    format (:func:`chain_in_format_of`), proposed as a candidate; where the chain's input is a
    map in the format too (windows cut from a map), it is read in its memory order as well, so
    its gradient is merged in NHWC order. None where the recorded shapes show no permutation of
    factors, or no weight is in reach."""
    from .. import _chain

    seen = set()
    for anchor in _made_before(c, steps=3):
        path, line = where(str(c.view.source[anchor]))
        if path is None or (path, line) in seen:
            continue
        seen.add((path, line))
        found = _recorded_chain(c, anchor)
        if found is None:
            continue
        statement, parts, chains = found
        if any(len(ch.chain.dims) != c.rank for ch in chains):
            continue
        if not all(_chain.gathers_the_same(ch.shape, ch.steps, ch.chain) for ch in chains):
            continue
        reach = weight_in_reach(c, functions_at(path, line), at=anchor)
        if reach is None:
            continue
        longest = max(chains, key=lambda ch: len(ch.chain.order))
        if all(len(ch.shape) == c.rank and in_format(c, ch.first) and _chain.maps_the_same(ch.shape, ch.steps, ch.chain)
               for ch in chains):  # a map in the format cut or put back: read in its memory order too
            text, how = _chain.map_to_map_text(longest.chain), "read and gathered in NHWC order"
        else:
            text, how = _chain.nhwc_text(longest.chain), "gathered in NHWC order"
        label = f"{_statements_of(parts)} reshapes and permutes {how} in one copy, where {reach} is {c.cl_name}"
        made = candidate(c, label, chain_in_format_of(text, reach), at=(path, statement.first), span=len(parts))
        return [made] if made is not None else []
    return []


@register_variant("a chain read in memory order")
def a_chain_read_in_memory_order(c: CauseView, weight: str | None) -> list[Candidate]:
    """Where the cause's copy is made by a chain of reshapes and permutes that cuts a map in the
    format into tokens (patches), merging its channels with another dimension: the chain
    reading the map in its memory order (:func:`._chain.split_text`), only where the map is in
    the format, so a contiguous map keeps the chain it had; a candidate."""
    from .. import _chain

    found = _recorded_chain(c, c.forward)
    if found is None:
        return []
    statement, parts, chains = found
    if any(len(ch.shape) != c.rank or not in_format(c, ch.first) for ch in chains):
        return []
    if not all(_chain.splits_the_same(ch.shape, ch.steps, ch.chain) for ch in chains):
        return []
    text = _chain.split_text(max(chains, key=lambda ch: len(ch.chain.order)).chain, c.rank)
    label = f"{_statements_of(parts)} reshapes and permutes reading the map in its memory order (NHWC)"
    made = candidate(c, label, chain_read_in_format(text), at=(statement.path, statement.first), span=len(parts))
    return [made] if made is not None else []


def _statements_of(parts: list) -> str:
    return f"the {len(parts)} statements'" if len(parts) > 1 else "the statement's"


@dataclass(frozen=True)
class _Run:
    """One module's run of a chain: its input's shape, its steps with the recorded sizes, the
    chain they make, and the event of its first reshape."""

    shape: tuple[int, ...]
    steps: list
    chain: _chain.Chain
    first: int


def _recorded_chain(c: CauseView, anchor: int):
    """(the statements, their chain parts, one :class:`_Run` per module that ran them and
    whose recorded sizes fit) of the chain of reshapes around event ``anchor``'s line; None
    where there is no such chain, or no run fits."""

    path, line = where(str(c.view.source[anchor]))
    if path is None:
        return None
    try:
        statement, parts = chain_around(path, line)
    except syn.Refused:
        return None
    steps = [s for p in parts for s in p.steps]
    name = syn.code(parts[0].base) if syn.simple(parts[0].base) else parts[-1].target
    events = _span_events(c, statement, anchor)
    runs = []
    for module in dict.fromkeys(str(m) for m in c.view.module[events]):
        run = _chain_of(c, statement, steps, [int(x) for x in events if str(c.view.module[x]) == module], name)
        if run is not None:
            runs.append(run)
    return (statement, parts, runs) if runs else None


def _made_before(c: CauseView, steps: int) -> list[int]:
    """The cause's forward event, then the events that made its first input, ``steps`` back."""
    out, e = [c.forward], c.forward
    producer = c.tracer.graph.producer
    for _ in range(steps):
        rows = c.tracer.input_rows(e)
        if not rows or int(producer[rows[0]]) < 0:
            break
        e = int(producer[rows[0]])
        out.append(e)
    return out


def _span_events(c: CauseView, statement, anchor: int) -> np.ndarray:
    """The forward reshapes and views recorded on ``statement``'s lines, by modules of the
    anchor's type (every block that runs the chain)."""
    view = c.view
    lines = {f"{statement.path}:{k}" for k in range(statement.first, statement.last + 1)}
    sources = pd.Series(view.source, dtype=object)
    on_lines = sources.isin([s for s in sources.unique() if recorded(str(s)) in lines]).to_numpy()
    types_ = view.ops["module_type"].astype(str).to_numpy()
    return np.flatnonzero(on_lines & (view.phase == "forward") & (types_ == str(types_[anchor]))
                          & np.isin(view.op, VIEWS))


def _chain_of(c: CauseView, statement, steps: list, events: list[int], name: str) -> _Run | None:
    """The chain as one module ran it (:class:`_Run`), ``events`` its reshapes and views on the
    chain's lines, their sizes those recorded (its last run's); None where they do not fit, or
    it makes no copy."""
    from .. import _chain

    written = [s for s in steps if s[0] == "reshape"]
    if len(events) < len(written) or not written:
        return None
    events = events[-len(written):]
    if not _copies(c, events[-1], statement):
        return None  # a chain of views makes no copy: gathered in NHWC order it would make one
    numeric, k = [], 0
    shape = None
    for s in steps:
        if s[0] == "contiguous":
            continue
        if s[0] != "reshape":
            numeric.append(s)
            continue
        ins, outs = c.shapes(events[k])
        if len(ins) != 1 or len(outs) != 1 or len(outs[0]) != len(s[1]):
            return None
        if any(w is not None and w.lstrip("-").isdigit() and int(w) != n for w, n in zip(s[1], outs[0])):
            return None
        if shape is None:  # the chain's input: the first reshape's, its permutes before undone
            shape = tuple(ins[0])
            for p in reversed(numeric):
                shape = _unpermute(shape, p)
        numeric.append(("reshape", tuple(outs[0]), list(s[1])))
        k += 1
    try:
        return _Run(shape, numeric, _chain.build(name, shape, numeric), _moves_back(c, events[0], statement)[-1])
    except _chain.NotAPermutation:
        return None


#: the ops a chain of reshapes, views, transposes and permutes is recorded as
_MOVES = ("aten.view.default", "aten._unsafe_view.default", "aten.clone.default", "aten.transpose.int",
          "aten.permute.default")


def _copies(c: CauseView, last: int, statement) -> int:
    """How many copies the chain ending at event ``last`` makes."""
    return sum(str(c.view.op[e]) == "aten.clone.default" for e in _moves_back(c, last, statement))


def _moves_back(c: CauseView, last: int, statement) -> list[int]:
    """The recorded ops of a chain, from ``last`` back, while they are moves on the chain's
    statements (the last of them reads the chain's input)."""
    lines = {f"{statement.path}:{k}" for k in range(statement.first, statement.last + 1)}
    producer = c.tracer.graph.producer
    out, e = [], last
    while e >= 0 and str(c.view.op[e]) in _MOVES and recorded(str(c.view.source[e])) in lines:
        out.append(e)
        rows = c.tracer.input_rows(e)
        e = int(producer[rows[0]]) if rows else -1
    return out or [last]


def _unpermute(shape: tuple[int, ...], step: tuple) -> tuple[int, ...]:
    order = list(range(len(shape)))
    if step[0] == "transpose":
        order[step[1]], order[step[2]] = order[step[2]], order[step[1]]
    else:
        order = [o % len(shape) for o in step[1]]
    out = [0] * len(shape)
    for i, o in enumerate(order):
        out[o] = shape[i]
    return tuple(out)


#: the methods a chain of reshapes is made of: each moves elements, none computes
_CHAIN_METHODS = frozenset({"reshape", "view", "transpose", "permute", "contiguous"})


@dataclass(frozen=True)
class ChainStatement:
    """``target = base.m1(..).m2(..)``: a statement of a chain, its steps as written
    (``("reshape", [size as code, or None for -1])``, ``("permute", order)``, ``("transpose",
    a, b)``, ``("contiguous",)``), first to last."""

    target: str
    base: cst.BaseExpression
    steps: tuple


def _chain_statement(node: cst.CSTNode) -> ChainStatement | None:
    if not (isinstance(node, cst.SimpleStatementLine) and len(node.body) == 1 and isinstance(node.body[0], cst.Assign)):
        return None
    assign = node.body[0]
    if len(assign.targets) != 1 or not isinstance(assign.targets[0].target, cst.Name):
        return None
    steps, e = [], assign.value
    while isinstance(e, cst.Call) and isinstance(e.func, cst.Attribute) and e.func.attr.value in _CHAIN_METHODS:
        step = _chain_step(e)
        if step is None:
            return None
        steps.append(step)
        e = e.func.value
    if not steps:
        return None
    return ChainStatement(assign.targets[0].target.value, e, tuple(reversed(steps)))


def _chain_step(call: cst.Call) -> tuple | None:
    name = call.func.attr.value
    args = [a for a in call.args if a.keyword is None and not a.star]
    if len(args) != len(call.args):
        return None
    if name == "contiguous":
        return ("contiguous",) if not args else None
    if name in ("permute", "transpose"):
        values = [syn.literal_int(a.value) for a in args]
        if len(values) == 1:
            values = list(syn.literal_ints(args[0].value) or [None])
        if not values or None in values or (name == "transpose" and len(values) != 2):
            return None
        return (name, *values) if name == "transpose" else (name, tuple(values))
    if len(args) == 1:
        if not isinstance(args[0].value, (cst.Tuple, cst.List)):
            return None  # x.view(dtype), or a flat view
        values = [e.value for e in args[0].value.elements]
    else:
        values = [a.value for a in args]
    return ("reshape", tuple(None if syn.literal_int(v) == -1 else syn.code(v) for v in values))


def _parsed(statement: syn.Statement) -> list[cst.CSTNode]:
    indent = syn.indent(statement.text)
    module = cst.parse_module(syn.WRAPPER + statement.text if indent else statement.text)
    body, _ = syn.statement_of(module)
    return list(body.body)


def chain_around(path: str, line: int) -> tuple[syn.Statement, list[ChainStatement]]:
    """The longest run of statements around ``line``, one after the other in its block, each
    ``x = x.<reshapes, transposes, permutes>`` of the name the one before assigns (the first of
    any tensor): a chain of moves of one tensor's elements, and its statements."""
    from libcst import ParserSyntaxError

    starts = syn.statement_starts(path)
    here = syn.statement_at(path, line)
    at = starts.index(here.first)

    def parts(k: int) -> ChainStatement | None:
        try:
            nodes = _parsed(syn.statement_at(path, starts[k]))
        except (syn.Refused, ParserSyntaxError):
            return None
        return _chain_statement(nodes[0]) if len(nodes) == 1 else None

    def follows(before: ChainStatement, after: ChainStatement) -> bool:
        return (isinstance(after.base, cst.Name) and after.base.value == before.target == after.target)

    own = parts(at)
    if own is None:
        raise syn.Refused("this line is no x = x.reshape(..) / .transpose(..) / .permute(..) chain")
    chain, first = [own], at
    while first > 0 and (p := parts(first - 1)) is not None and follows(p, chain[0]):
        try:
            syn.statements_from(path, starts[first - 1], len(chain) + 1)
        except syn.Refused:
            break
        chain.insert(0, p)
        first -= 1
    while first + len(chain) < len(starts) and (n := parts(first + len(chain))) is not None and follows(chain[-1], n):
        try:
            syn.statements_from(path, starts[first], len(chain) + 1)
        except syn.Refused:
            break
        chain.append(n)
    return syn.statements_from(path, starts[first], len(chain)), chain


@functools.cache  # one rewrite for one argument: two causes of one statement rewrite it once
def chain_in_format_of(nhwc: str, weight: str) -> Callable[[cst.Module, syn.Facts], cst.Module]:
    """The statements of a chain (:func:`chain_around`) kept as they are where ``weight`` (a
    convolution's weight, as code) is contiguous, and replaced where it is in the format by
    ``nhwc``: the same map gathered from the chain's input in one copy in NHWC order, a
    channels_last view (joins: tokens folded into a map over several statements)."""
    return _chain_in_branch(nhwc, lambda facts, name: syn.weight_in_format(weight, facts))


@functools.cache
def chain_read_in_format(text: str) -> Callable[[cst.Module, syn.Facts], cst.Module]:
    """The statements of a chain whose input is a map kept as they are where the map is
    contiguous, and replaced where it is in the format by ``text``: the same tensor made by
    reading the map in its memory order, in the one copy the chain made (a reshape that merges
    the channels with another dimension: a map cut into patches of tokens)."""
    return _chain_in_branch(text, lambda facts, name: f"{name}.is_contiguous(memory_format={syn.memory_format(facts)})")


def _chain_in_branch(text: str, test: Callable[[syn.Facts, str], str]) -> Callable[[cst.Module, syn.Facts], cst.Module]:
    """The statements of a chain in the ``else`` of an ``if`` on ``test`` (of the facts and the
    name the chain's input goes by), whose branch assigns ``text`` to the chain's target. An
    input that is no name is first assigned to the target, so both branches read it."""
    def rewrite(module: cst.Module, facts: syn.Facts) -> cst.Module:
        body, _ = syn.statement_of(module)
        nodes = list(body.body)
        parts = [_chain_statement(n) for n in nodes]
        if None in parts:
            raise syn.Refused("the statements are no chain of reshapes")
        target, base = parts[-1].target, parts[0].base
        before, name = [], syn.code(base)
        if not syn.simple(base):
            before = [cst.parse_statement(f"{target} = {syn.code(base.with_changes(lpar=[], rpar=[]))}")]
            nodes[0] = syn.replace_node(cst.Module([nodes[0]]), base, cst.Name(target)).body[0]
            name = target
        branch = cst.parse_statement(f"if {test(facts, name)}:\n    {target} = {text}\nelse:\n    pass\n")
        first = nodes[0]
        # the new blocks one level in (the parsed statement's own indentation is the module's default)
        unit = "\t" if module.default_indent.startswith("\t") else "    "
        branch = branch.with_changes(leading_lines=first.leading_lines,
                                     body=branch.body.with_changes(indent=unit),
                                     orelse=branch.orelse.with_changes(body=branch.orelse.body.with_changes(
                                         indent=unit, body=[first.with_changes(leading_lines=[]), *nodes[1:]])))
        new_body = [*before, branch]
        if before:
            new_body[0] = new_body[0].with_changes(leading_lines=first.leading_lines)
            branch = branch.with_changes(leading_lines=[])
            new_body[1] = branch
        return module.with_deep_changes(body, body=new_body) if body is not module else module.with_changes(body=new_body)
    return rewrite
