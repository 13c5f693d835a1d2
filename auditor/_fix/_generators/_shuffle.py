"""A channel shuffle written by hand: the statements it spans become torch's channel_shuffle."""

from __future__ import annotations

import ast
import linecache
from dataclasses import dataclass

import libcst as cst

from .. import _syntax as syn
from .._changes import (
    EditSource,
)
from .._proposal import CauseView, Proposal
from .._registry import register_fix
from .._statements import (
    edit_of,
    facts_for,
    functions_at,
)


@register_fix("channel shuffle")
def _channel_shuffle_fix(c: CauseView) -> Proposal:
    """A channel shuffle written view -> transpose -> .contiguous() -> view, in one statement or
    over a few consecutive ones around the cause's line: exactly those statements become one call
    of torch's format-keeping channel_shuffle."""
    from libcst import ParserSyntaxError


    detail = (f"this is a channel shuffle written as view -> transpose -> .contiguous() -> view, which writes "
              f"contiguous order ({c.what}); torch.nn.functional.channel_shuffle (nn.ChannelShuffle) computes the "
              f"same values and keeps {c.cl_name}")
    suggestion = "x = torch.nn.functional.channel_shuffle(x, groups)"
    if c.path is None:
        return Proposal(EditSource, detail, reason="the audit has no source line (audit with record_source=True)")
    line = linecache.getline(c.path, c.lineno).rstrip("\n")
    reason = ""
    try:
        fns = functions_at(c.path, c.lineno)
        if not fns:
            raise syn.Refused("no function of the running program holds this line (run at the top level of a script)")
        facts = facts_for(c, fns)
        for statement in _shuffle_spans(c.path, c.lineno):
            try:
                new = syn.rewrite(statement, [(shuffle_by_torch, facts)])
            except (syn.Refused, ParserSyntaxError) as exc:
                reason = reason or str(getattr(exc, "message", exc))
                continue
            try:
                _temporaries_unread(statement)
            except syn.Refused as exc:  # a shuffle, whose rewrite would lose a name: the reason to give
                reason = str(exc)
                continue
            try:  # a `return y` of the shuffled name right after it joins: `return channel_shuffle(...)`
                count = sum(statement.first <= k <= statement.last for k in syn.statement_starts(c.path))
                longer = syn.statements_from(c.path, statement.first, count + 1)
                if longer.last > statement.last:
                    new, statement = syn.rewrite(longer, [(shuffle_by_torch, facts)]), longer
            except (syn.Refused, ParserSyntaxError):
                pass
            return Proposal(EditSource, detail, line=statement.text.rstrip("\n"), suggestion=new.rstrip("\n"),
                            change=edit_of(statement, shuffle_by_torch, facts))
    except syn.Refused as exc:
        reason = str(exc)
    return Proposal(EditSource, detail, line=line, reason=f"{reason}: replace the shuffle by {suggestion} by hand",
                    suggestion=suggestion)


#: how many statements a channel shuffle written by hand may take (split, swap, copy, merge, return)
_SHUFFLE_STATEMENTS = 5


def _shuffle_spans(path: str, line: int):
    """The runs of consecutive statements of one block that hold ``line``, shortest first, the
    ones that end later first among equals (a trailing ``return`` of the shuffled name joins)."""

    starts = syn.statement_starts(path)
    at = syn.statement_at(path, line).first
    index = starts.index(at)
    for count in range(1, _SHUFFLE_STATEMENTS + 1):
        for first in range(index, index - count, -1):
            if first < 0:
                continue
            try:
                yield syn.statements_from(path, starts[first], count)
            except syn.Refused:
                continue


def _temporaries_unread(statement: syn.Statement) -> None:
    """Refuses where a name the shuffle's statements bind on the way (not its result) is read
    after them in the function: the rewrite no longer binds it."""
    import libcst as cst


    indent = statement.text[:len(statement.text) - len(statement.text.lstrip(" \t"))]
    module = cst.parse_module(("if True:\n" if indent else "") + statement.text)
    temporaries = shuffle_temporaries(module)
    if not temporaries:
        return
    lines = linecache.getlines(statement.path)
    tree = ast.parse("".join(lines))
    holders = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Module))
               and (isinstance(n, ast.Module) or n.lineno <= statement.first <= (n.end_lineno or n.lineno))]
    scope = max(holders, key=lambda n: getattr(n, "lineno", 0))
    read = {n.id for n in ast.walk(scope) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)
            and n.lineno > statement.last}
    if temporaries & read:
        raise syn.Refused(f"{', '.join(sorted(temporaries & read))}, bound on the way by the shuffle, is read after it")


#: the steps of a channel shuffle written by hand, in order: a tensor split into (N, g, C/g, ...),
#: its two group dimensions swapped, made contiguous (optional before a reshape), merged back
_PLAIN, _SPLIT, _SWAPPED, _COPIED, _MERGED = range(5)


@dataclass(frozen=True)
class _Step:
    stage: int
    source: str = ""  #: the tensor shuffled (code), from the split on
    groups: str = ""  #: the number of groups (code): the split's second size
    rank: int = 0  #: of the split view


def _shuffle_step(node, names: dict[str, _Step], torch_name: str | None) -> _Step:
    """Which step of a channel shuffle ``node`` computes, given the steps ``names`` hold."""
    if isinstance(node, cst.Name) and node.value in names:
        return names[node.value]
    if not isinstance(node, cst.Call):
        return _Step(_PLAIN)
    name = syn.callee(node)
    positional = [a.value for a in node.args if a.keyword is None and not a.star]
    if len(positional) != len(node.args):
        return _Step(_PLAIN)
    if syn.is_method(node, torch_name):
        inner, args = _shuffle_step(node.func.value, names, torch_name), positional
    elif name in ("transpose", "flatten") and positional:  # torch.transpose(x, 1, 2)
        inner, args = _shuffle_step(positional[0], names, torch_name), positional[1:]
    else:
        return _Step(_PLAIN)
    if name in ("view", "reshape"):
        sizes = [e.value for e in args[0].elements] if len(args) == 1 and isinstance(args[0], cst.Tuple) else args
        if inner.stage == _PLAIN and len(sizes) >= 4:
            return _Step(_SPLIT, syn.code(node.func.value), syn.code(sizes[1]), len(sizes))
        if (inner.stage == _COPIED or (inner.stage == _SWAPPED and name == "reshape")) and len(sizes) == inner.rank - 1:
            return _Step(_MERGED, inner.source, inner.groups, inner.rank)
    elif name in ("transpose", "swapaxes", "swapdims") and inner.stage == _SPLIT:
        if len(args) == 2 and {syn.literal_int(a) for a in args} == {1, 2}:
            return _Step(_SWAPPED, inner.source, inner.groups, inner.rank)
    elif name == "permute" and inner.stage == _SPLIT:
        order = [syn.literal_int(a) for a in args] if len(args) > 1 else list(syn.literal_ints(args[0]) or []) if args else []
        if order == [0, 2, 1, *range(3, inner.rank)]:
            return _Step(_SWAPPED, inner.source, inner.groups, inner.rank)
    elif name == "contiguous" and not args and inner.stage == _SWAPPED:
        return _Step(_COPIED, inner.source, inner.groups, inner.rank)
    elif name == "flatten" and inner.stage in (_SWAPPED, _COPIED) and [syn.literal_int(a) for a in args] == [1, 2]:
        return _Step(_MERGED, inner.source, inner.groups, inner.rank)
    return _Step(_PLAIN)


def shuffle_by_torch(module: cst.Module, facts: syn.Facts) -> cst.Module:
    """The rewrite of a channel shuffle written by hand (``x.view(n, g, c // g, h, w)``, then
    ``.transpose(1, 2)`` and ``.contiguous()``, then ``.view(n, c, h, w)``), in one statement or
    over consecutive ones, into one ``y = torch.nn.functional.channel_shuffle(x, g)``, whose
    values are the same and which keeps the format. The statements must be exactly the shuffle's:
    the first splits the tensor, each one after takes the step before it further, the last
    merges the channels back (or returns the merged name): a statement that does anything else
    refuses, so nothing but the shuffle is replaced. Whether the names the shuffle's steps bind
    are read after it is for the caller to check (:func:`shuffle_temporaries`)."""
    if facts.torch is None:
        raise syn.Refused("torch is not imported where this line runs")
    body, last = syn.statement_of(module)
    statements = list(body.body)
    names: dict[str, _Step] = {}
    step = _Step(_PLAIN)
    target = None
    for k, line in enumerate(statements):
        if not isinstance(line, cst.SimpleStatementLine) or len(line.body) != 1:
            raise syn.Refused("the shuffle's statements are not simple ones")
        small = line.body[0]
        if isinstance(small, cst.Return) and k == len(statements) - 1 and k > 0 \
                and isinstance(small.value, cst.Name) and small.value.value == target:
            target = None
            break
        if not (isinstance(small, cst.Assign) and len(small.targets) == 1
                and isinstance(small.targets[0].target, cst.Name)) and not (
                isinstance(small, cst.Return) and small.value is not None and k == len(statements) - 1):
            raise syn.Refused("a statement of the shuffle is not an assignment to one name")
        new = _shuffle_step(small.value, names, facts.torch)
        if new.stage == _PLAIN or (k == 0) != (step.stage == _PLAIN) or new.stage <= step.stage \
                or (k > 0 and new.source != step.source):
            raise syn.Refused("these statements are not a channel shuffle written view -> transpose -> .contiguous() "
                          "-> view, and only that")
        step = new
        target = small.targets[0].target.value if isinstance(small, cst.Assign) else None
        if target is not None:
            names[target] = step
    if step.stage != _MERGED:
        raise syn.Refused("the channels are not merged back (view or reshape to the map's shape) in these statements")
    call = f"{facts.torch}.nn.functional.channel_shuffle({step.source}, {step.groups})"
    written = cst.parse_statement(f"{target} = {call}\n" if target is not None else f"return {call}\n")
    written = written.with_changes(leading_lines=statements[0].leading_lines,
                                   trailing_whitespace=statements[-1].trailing_whitespace)
    return module.with_deep_changes(body, body=[written]) if body is not module else module.with_changes(
        body=[written])


def shuffle_temporaries(module: cst.Module) -> set[str]:
    """The names a shuffle's statements bind other than its last one's: :func:`shuffle_by_torch`
    binds none of them, so none may be read after it."""
    body, _ = syn.statement_of(module)
    names: set[str] = set()
    for line in body.body[:-1]:
        for small in getattr(line, "body", ()):
            if isinstance(small, cst.Assign):
                names |= {t.target.value for t in small.targets if isinstance(t.target, cst.Name)}
    last = body.body[-1].body[0] if isinstance(body.body[-1], cst.SimpleStatementLine) else None
    if isinstance(last, cst.Assign):
        names -= {t.target.value for t in last.targets if isinstance(t.target, cst.Name)}
    return names
