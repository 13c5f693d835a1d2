"""Edits of the statement a cause sits on: a rewrite tried now, on the statement as it is, so
that a statement without the shape the rewrite needs is reported by hand, with the reason; and
candidate rewrites, exact only for some shapes, that verification proves on the model."""

from __future__ import annotations

import types
from collections.abc import Callable

import torch
from libcst import ParserSyntaxError

from . import _syntax as syn
from ._changes import EditSource, StatementEdit
from ._patch import live_functions
from ._proposal import Candidate, CauseView, Proposal

#: the refusal of a statement that has no source line to edit
NO_SOURCE = "the audit has no source line (audit with record_source=True)"
NO_FUNCTION = "no function of the running program holds this line (run at the top level of a script)"


def functions_at(path: str, line: int) -> list[types.FunctionType]:
    """The live functions whose code holds ``line`` of ``path``."""
    return live_functions(path, [line])


def facts_for(c: CauseView, fns: list[types.FunctionType], dims: tuple[int, ...] = ()) -> syn.Facts:
    """The facts a rewrite of ``c``'s line needs: the format, the name torch goes by where the
    line runs, the names in use there."""
    torch_name, taken = None, set()
    for fn in fns:
        code = fn.__code__
        # its locals and the module's globals (a new local of a global's name would hide it)
        taken |= set(code.co_varnames) | set(code.co_cellvars) | set(code.co_freevars)
        taken |= {k for k in fn.__globals__ if not k.startswith("__")}
        if torch_name is None:
            torch_name = next((k for k, v in fn.__globals__.items() if v is torch), None)
    return syn.Facts(cl=c.cl_name, rank=c.rank, torch=torch_name, dims=dims, taken=frozenset(taken))


def edit_of(statement: syn.Statement, rewrite: Callable, facts: syn.Facts) -> EditSource:
    """The change that rewrites one statement."""
    return EditSource((StatementEdit(statement, rewrite, facts),))


def statement_edit(c: CauseView, rewrite: Callable, dims: tuple[int, ...] = (), span: int = 1,
                   **shown) -> Proposal:
    """An edit of ``c``'s statement by ``rewrite``: tried now, on the statement as it is, so that
    a statement without the shape the rewrite needs is reported by hand, with the reason (and
    the type of the refusal). With ``span`` above 1 the rewrite may also need up to that many
    statements from the line on (a value made on the line and used on the next), tried from
    the shortest."""
    detail = shown.pop("detail", c.row.fix)
    if c.path is None:
        return Proposal(EditSource, f"{detail} (audit with record_source=True for the line)", reason=NO_SOURCE,
                        **shown)
    reason, refused = "", None
    for count in range(1, span + 1):
        try:
            statement = syn.statements_from(c.path, c.lineno, count)
            fns = functions_at(c.path, c.lineno)
            if not fns:
                raise syn.Refused(NO_FUNCTION)
            facts = facts_for(c, fns, dims)
            new = syn.rewrite(statement, [(rewrite, facts)])
        except syn.Refused as exc:
            reason, refused = (reason, refused) if reason else (str(exc), type(exc))
            continue
        except ParserSyntaxError as exc:
            reason, refused = (reason, refused) if reason else (f"the statement does not parse ({exc.message})",
                                                                type(exc))
            continue
        return Proposal(EditSource, detail, line=statement.text.rstrip("\n"), suggestion=new.rstrip("\n"),
                        change=edit_of(statement, rewrite, facts), **shown)
    return Proposal(EditSource, detail, line=c.source_line(), reason=reason, refused=refused, **shown)


def statements_edit(c: CauseView, rewrite: Callable, alone: Proposal, span: int) -> Proposal:
    """The edit of the fewest consecutive statements of ``c``'s block, up to ``span``, that hold
    ``c``'s statement and that ``rewrite`` takes as one (slices of one tensor on several
    statements that together cut its channels); ``alone`` (the statement's own edit, refused)
    where none does."""
    try:
        mine = syn.statement_at(c.path, c.lineno)
        starts = syn.statement_starts(c.path)
        fns = functions_at(c.path, c.lineno)
    except syn.Refused:
        return alone
    if not fns or (mine.first not in starts):
        return alone
    at = starts.index(mine.first)
    facts = facts_for(c, fns)
    for count in range(2, span + 1):
        for first in range(max(at - count + 1, 0), at + 1):
            try:
                statement = syn.statements_from(c.path, starts[first], count)
                new = syn.rewrite(statement, [(rewrite, facts)])
            except (syn.Refused, ParserSyntaxError, ValueError):
                continue
            return Proposal(EditSource, alone.detail, line=statement.text.rstrip("\n"),
                            suggestion=new.rstrip("\n"), change=edit_of(statement, rewrite, facts))
    return alone


def candidate(c: CauseView, label: str, rewrite: Callable, at: tuple[str, int] | None = None,
              before: int = 0, span: int = 1) -> Candidate | None:
    """``rewrite`` of ``c``'s statement (or of the statement at ``at``, a (file, line) the
    cause's data reaches), given with the ``before`` statements before it in its block (or the
    ``span`` statements from it on), or None where the statements do not have the shape the
    rewrite needs."""
    path, lineno = at or (c.path, c.lineno)
    if path is None:
        return None
    try:
        statement = syn.statement_at(path, lineno)
        if before:
            starts = syn.statement_starts(path)
            at_first = starts.index(statement.first)
            if at_first < before:
                return None
            statement = syn.statements_from(path, starts[at_first - before], before + 1)
        elif span > 1:
            statement = syn.statements_from(path, statement.first, span)
        fns = functions_at(path, lineno)
        if not fns:
            return None
        facts = facts_for(c, fns)
        new = syn.rewrite(statement, [(rewrite, facts)])
    except (syn.Refused, ParserSyntaxError):
        return None
    return Candidate(label, edit_of(statement, rewrite, facts), statement.text.rstrip("\n"), new.rstrip("\n"))
