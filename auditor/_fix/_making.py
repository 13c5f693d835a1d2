"""Making fixes: their source edits planned and applied a statement at a time, their changes of
the model made and taken back, and the causes that appear only once they are made found round
after round (written once, for :meth:`Fixes.apply` and :meth:`Fixes.verify` alike)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import pandas as pd
import torch.nn as nn

from .._result import Audit
from .._session import record_step, warm_up
from .._step import Step, copy_model
from ._changes import EditSource, Made, Undo, by_hand
from ._patch import CodePatch, EditError, SourceEdit, patch_functions
from ._proposal import Proposal


def planned_edits(proposals: Mapping[int, Proposal], numbers: list[int]
                  ) -> tuple[list[tuple[SourceEdit, list[int]]], dict[int, str]]:
    """([(the edit of one statement, the fixes it makes)], per edit fix that cannot be made:
    why), for the fixes ``numbers``: the rewrites of one statement combined into one edit, and
    a fix of several statements made whole or not at all."""
    from . import _syntax as syn  # libcst: only once a fix edits source

    statements: dict[tuple, list[tuple[int, object]]] = {}
    failed: dict[int, str] = {}
    for n in numbers:
        p = proposals.get(n)
        if p is None or p.kind is not EditSource:
            continue
        if not p.automatic:
            failed[n] = by_hand(p.reason)
            continue
        for edit in p.change.edits:
            st = edit.statement
            statements.setdefault((st.path, st.first, st.last), []).append((n, edit))
    edits = []
    for group in statements.values():
        st = group[0][1].statement
        try:
            # two causes of one pattern rewritten together (slices on two statements) are one rewrite
            new = syn.rewrite(st, list(dict.fromkeys((e.rewrite, e.facts) for _, e in group)))
        except syn.Refused as exc:
            failed.update({n: by_hand(str(exc)) for n, _ in group})
            continue
        edits.append((SourceEdit(st.path, st.first, st.last, st.text, new), list(dict.fromkeys(n for n, _ in group))))
    kept = []
    for e, members in edits:
        lost = [n for n in members if n in failed]
        if lost:
            failed.update({n: by_hand(f"made together with fix {lost[0]}, which cannot be made ({failed[lost[0]]})")
                           for n in members if n not in failed})
        else:
            kept.append((e, members))
    return kept, failed


def edit_source(proposals: Mapping[int, Proposal], numbers: list[int]
                ) -> tuple[CodePatch | None, dict[int, tuple[bool, str]]]:
    """Apply the source edits of ``numbers``, a statement at a time, so that one that cannot be
    applied leaves the others made; (the edits in force, per fix: (applied, what or why))."""
    groups, failed = planned_edits(proposals, numbers)
    done: dict[int, tuple[bool, str]] = {n: (False, why) for n, why in failed.items()}
    made: list[SourceEdit] = []
    functions: list[str] = []
    for edit, members in groups:
        try:
            one = patch_functions([edit])
        except EditError as exc:
            done.update({n: (False, f"not applied: {exc}") for n in members})
            continue
        made.append(edit)
        functions += one.functions
        done.update({n: (True, f"{', '.join(one.functions)} recompiled with the edited line, in memory "
                               "(Fixes.patch() writes it as a diff)") for n in members if done.get(n, (True,))[0]})
    if not made:
        return None, done
    return CodePatch(tuple(made), active=True, functions=list(dict.fromkeys(functions))), done


def change_model(model: nn.Module, proposals: Mapping[int, Proposal], numbers: list[int]
                 ) -> tuple[list[Undo], dict[int, tuple[bool, str]]]:
    """The fixes among ``numbers`` that change the model (swaps, weights, regions), made in
    place, each by its change; (how to take each back, per fix: (applied, what or why))."""
    undo: list[Undo] = []
    done: dict[int, tuple[bool, str]] = {}
    made = Made()
    for n in numbers:
        p = proposals[n]
        if p.kind is EditSource:
            continue
        if not p.automatic:
            done[n] = (False, by_hand(p.reason))
            continue
        more, done[n] = p.change.apply(model, n, made)
        undo.extend(more)
    return undo, done


def joined(first: CodePatch | None, second: CodePatch | None) -> CodePatch | None:
    """Two patches in force as one, which undo() and redo() take back and make again together."""
    if first is None or second is None:
        return first or second
    return CodePatch(first.edits + second.edits, active=first.active and second.active,
                     functions=list(dict.fromkeys(first.functions + second.functions)))


@contextlib.contextmanager
def applied(groups: list[tuple[Any, list[int]]], model: nn.Module, *copies: nn.Module):
    """``groups`` of fixes (each of one audit) applied to ``model`` (and to its ``copies``) and to
    the source, taken back after; yields (the source edits, per fix number of the first group:
    (applied, detail))."""
    patches, undo, first = [], [], {}
    try:
        for k, (fixes, numbers) in enumerate(groups):
            code, done = edit_source(fixes._proposals, numbers)
            if code is not None:
                patches.append(code)
            more, done_model = change_model(model, fixes._proposals, numbers)
            undo.extend(more)
            done.update(done_model)
            for other in copies:
                undo.extend(change_model(other, fixes._proposals, numbers)[0])
            if k == 0:
                first = done
        code = CodePatch(tuple(e for p in patches for e in p.edits), active=bool(patches))
        yield code, first
    finally:
        for p in reversed(patches):
            p.undo()
        for fn in reversed(undo):
            fn()


@contextlib.contextmanager
def code_off(code: CodePatch | None) -> Iterator[None]:
    """The source edits of ``code`` taken back for the block."""
    if code is None or not code.active:
        yield
        return
    code.undo()
    try:
        yield
    finally:
        code.redo()


def audit_step(step: Step, warmup: int, time: bool = True) -> Audit:
    """The step audited as :func:`auditor.audit` would, after ``warmup`` steps."""
    warm_up(step, warmup, record_time=time)
    return record_step(step, record_source=True, record_time=time, warmup=warmup)


def cause_keys(causes: pd.DataFrame) -> list[tuple]:
    """Where each cause is, across audits: its pattern, phase, op and line."""
    return list(zip(causes["pattern"], causes["phase"], causes["op"], causes["source"]))


@dataclass(frozen=True)
class Round:
    """One round of exposed causes: the causes new in it, the fixes of its audit, and the
    numbers of the automatic fixes among the new causes' (made in the rounds after it)."""

    new: pd.DataFrame
    fixes: Any
    automatic: tuple[int, ...]


def exposed_rounds(step: Step, groups: list[tuple[Any, list[int]]], known: set[tuple], rounds: int,
                   warmup: int, suggest: Callable[[Audit], Any]) -> list[Round]:
    """The causes that appear only once ``groups`` of fixes are made, a round at a time: each
    round audits a copy of ``step``'s model with the groups and the rounds before it made (and
    their source edits in force for the audit), until a round finds no new cause (none not in
    ``known``, which they join), or none with an automatic fix, at most ``rounds`` rounds."""
    groups = list(groups)
    found: list[Round] = []
    for _ in range(max(rounds, 0)):
        model = copy_model(step.model)
        with applied(groups, model):
            after = audit_step(step.replace(model=model), warmup)
        causes = after.causes()
        new = causes[[k not in known for k in cause_keys(causes)]]
        if new.empty:
            break
        known |= set(cause_keys(new))
        more = suggest(after)
        mine = more.frame[more.frame["cause"].isin(new["cause"]) & more.frame["automatic"]]
        automatic = tuple(int(n) for n in mine["fix"])
        found.append(Round(new, more, automatic))
        if not automatic:
            break
        groups.append((more, list(automatic)))
    return found
