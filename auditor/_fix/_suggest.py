"""Suggested fixes: one concrete change per cause, made automatically where it can be, proved by
verification, and handed over as a patch.

Each row of ``Audit.causes()`` gets the fix its pattern's generators propose
(:mod:`._registry`, :mod:`._generators`): a statement of the source to rewrite, a torch module
to swap, a weight to convert or a region to run contiguous (:mod:`._changes`). Only fixes that
save bytes are suggested. :meth:`Fixes.apply` makes them (source edits in memory, :mod:`._patch`;
:mod:`._making`), :meth:`Fixes.undo` takes them back, :meth:`Fixes.verify` proves them
(:mod:`._prove`) and returns the proved fixes as a new value, and :meth:`Fixes.patch` writes the
source edits as a diff.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import replace
from types import MappingProxyType

import numpy as np
import pandas as pd
import torch
import torch.nn as nn

from .._analysis._causes import WEIGHT as WEIGHT_CAUSE
from .._display._fixes import fixes_html, fixes_text, verification_html, verification_text
from .._display._units import format_bytes
from .._recording._files import atomic_write
from .._result import Audit
from .._step import Step
from ._changes import BY_HAND, EDIT, REGION, SWAP, WEIGHT, ByHand, EditSource, Undo
from ._making import cause_keys, change_model, edit_source, exposed_rounds, joined, planned_edits
from ._patch import CodePatch, SourceEdit, one_scan, unified_diff
from ._proposal import Proposal
from ._prove import Proof
from ._registry import propose

__all__ = ["APPLY_COLUMNS", "BY_HAND", "EDIT", "FIX_COLUMNS", "REGION", "SWAP", "VERIFY_COLUMNS", "WEIGHT", "Fixes", "suggest_fixes"]

FIX_COLUMNS = [
    "fix", "cause", "pattern", "action", "module", "module_type", "op", "source", "line", "suggestion", "detail",
    "hotspots", "count", "bytes", "hotspot_bytes", "added_bytes", "forward_bytes", "backward_bytes",
    "region", "automatic", "reason",
]
#: The columns of :meth:`Fixes.verify`.
VERIFY_COLUMNS = [
    "kind", "fix", "cause", "pattern", "source", "applied", "reason", "hotspots_before", "hotspots_after",
    "contiguous_hotspots_before", "contiguous_hotspots_after", "same_outputs", "max_abs_diff", "max_rel_diff", "step_us_before", "step_us_after", "saving_us",
    "saving_low_us", "saving_high_us", "ratio", "ratio_low", "ratio_high", "rounds", "estimated_us", "verdict",
]
#: The columns of :meth:`Fixes.apply`.
APPLY_COLUMNS = ["round", "fix", "pattern", "source", "action", "applied", "detail"]


class Fixes:
    """The result of :func:`suggest_fixes`.

    Attributes:
        frame: one row per fix (columns in :data:`FIX_COLUMNS`), most bytes saved first.
            ``bytes`` is the net saving: ``hotspot_bytes`` (the hotspots it removes, forward and
            backward) less ``added_bytes`` (conversions a region fix moves to its edges).
            ``automatic``: :meth:`apply` can make it; ``reason``: why not, where it cannot.
        audit: the audit the fixes were suggested for; :meth:`hotspots` its hotspot groups, each
            with the fix that removes it.
        verification: the table of the :meth:`verify` that made these fixes, or None.

    A finished value: :meth:`verify` returns new ``Fixes``, the proved ones, and leaves these as
    they are. :meth:`apply` and :meth:`undo` change a model (and the running source), not the
    fixes.
    """

    def __init__(self, frame: pd.DataFrame, hotspots: pd.DataFrame, audit: Audit | None = None,
                 proposals: Mapping[int, Proposal] | None = None, verification: pd.DataFrame | None = None,
                 verified_rounds: tuple[tuple[int, ...], list[tuple[Fixes, list[int]]]] = ((), [])):
        self.frame = frame
        self._hotspots = hotspots
        self.audit = audit
        self.verification = verification
        self._proposals = MappingProxyType(dict(proposals or {}))
        #: (the fixes the verify() that made these made together, the exposed fixes it made after them, by round)
        self._verified_rounds = verified_rounds
        self._code: CodePatch | None = None  # the source edits apply() made, active or undone
        self._model_undo: list[Undo] = []  # how to take back what apply() did to a model
        self._rounds: list[tuple[Fixes, list[int]]] = []  # the exposed fixes apply() made, by round

    def __len__(self) -> int:
        return len(self.frame)

    def hotspots(self) -> pd.DataFrame:
        """``Audit.hotspots()`` with a ``fix`` column naming the fix that removes each group."""
        return self._hotspots.copy()

    # -- applying ---------------------------------------------------------------------------------
    def apply(self, model: nn.Module, *inputs, fixes: Iterable[int] | None = None, kwargs: Mapping | None = None,
              backward: bool = True, loss_fn: Callable | None = None, exposed: bool = True,
              warmup: int = 1, max_rounds: int = 5) -> pd.DataFrame:
        """Make the fixes (all, or the numbers in ``fixes``): source edits in memory, for the
        whole process (each edited function is compiled again from its edited lines, under its
        file name and line numbers, and swapped in wherever it is held), module swaps, weight
        conversions and regions kept contiguous in ``model``, in place. :meth:`undo` takes all of
        it back; :meth:`restored` puts the original source back for a block. Applying again
        replaces the source edits made before.

        With ``exposed`` (the default), the causes that appear only once these fixes are made
        get their automatic fixes made too, round after round until no new cause appears (at
        most ``max_rounds`` rounds in all): found by auditing a copy of the fixed ``model`` on
        ``inputs`` (the step options as :func:`auditor.audit`), or, without ``inputs``, those
        the :meth:`verify` that returned these fixes found with the same automatic fixes. The first round is always
        the fixes asked for; the rounds after it only add fixes of causes not seen before.

        Returns one row per fix made or tried: ``round`` (1 for these fixes, 2 and on for the
        causes each round exposed), ``fix`` (its number among its round's fixes), ``pattern``,
        ``source``, ``action``, ``applied`` and what was done, or why not.

        Raises ``TypeError`` for a model it cannot change in place (TorchScript), before
        changing anything."""
        _check_changeable(model)
        numbers = self._numbers(fixes)
        if self._code is not None:
            self._code.undo()
        self._rounds = []
        self._code, done = edit_source(self._proposals, numbers)
        undo, done_model = change_model(model, self._proposals, numbers)
        self._model_undo.extend(undo)
        done.update(done_model)
        rows = [self._done_row(1, self, n, done[n]) for n in numbers]
        if exposed:
            if inputs or kwargs:
                step = Step(model, inputs, kwargs or {}, backward=backward, loss_fn=loss_fn)
                later = self._expose(step, warmup, max_rounds - 1)
            else:
                later = self._found_by_verify(numbers)
            for k, (more, chosen) in enumerate(later, start=2):
                code, made = edit_source(more._proposals, chosen)
                undo, made_model = change_model(model, more._proposals, chosen)
                self._model_undo.extend(undo)
                made.update(made_model)
                self._code = joined(self._code, code)
                self._rounds.append((more, chosen))
                rows += [self._done_row(k, more, n, made[n]) for n in chosen]
        return pd.DataFrame(rows, columns=APPLY_COLUMNS)

    @staticmethod
    def _done_row(round_: int, fixes: Fixes, n: int, done: tuple[bool, str]) -> dict:
        r = fixes._row(n)
        return {"round": round_, "fix": n, "pattern": r["pattern"], "source": r["source"], "action": r["action"],
                "applied": done[0], "detail": done[1]}

    def _expose(self, step: Step, warmup: int, rounds: int) -> list[tuple[Fixes, list[int]]]:
        """The automatic fixes of the causes that appear once the fixes made so far are
        (:func:`._making.exposed_rounds`: the source edits are in force already; the model's own
        changes are in ``step``'s model)."""
        known = set(cause_keys(self.audit.causes())) if self.audit is not None else set()
        found = exposed_rounds(step, [], known, rounds, warmup, suggest_fixes)
        return [(r.fixes, list(r.automatic)) for r in found if r.automatic]

    def _found_by_verify(self, numbers: list[int]) -> list[tuple[Fixes, list[int]]]:
        """The exposed fixes the :meth:`verify` that returned these fixes made with every automatic fix, where those
        are the automatic ones among ``numbers`` (a fix by hand is made by neither): what it
        found holds only for the same fixes."""
        made, found = self._verified_rounds
        automatic = tuple(n for n in numbers if self._row(n)["automatic"])
        return list(found) if automatic and made == automatic else []

    def undo(self) -> None:
        """Take back everything :meth:`apply` did: the source edits, and the module swaps, weight
        conversions and regions in the models it changed."""
        if self._code is not None:
            self._code.undo()
            self._code = None
        self._rounds = []
        while self._model_undo:
            self._model_undo.pop()()

    @contextlib.contextmanager
    def restored(self) -> Iterator[None]:
        """The original source, for the block (the edits :meth:`apply` made, undone, then made
        again): to run or time the unfixed model beside the fixed one."""
        code = self._code
        if code is not None and code.active:
            code.undo()
        try:
            yield
        finally:
            if code is not None and code is self._code:
                code.redo()

    def _numbers(self, fixes: Iterable[int] | None) -> list[int]:
        known = [int(n) for n in self.frame["fix"]]
        if fixes is None:
            return known
        wanted = [int(n) for n in fixes]
        unknown = sorted(set(wanted) - set(known))
        if unknown:
            raise ValueError(f"no fix numbered {unknown[0]}; the fixes are {known}")
        return [n for n in known if n in wanted]

    def _row(self, n: int):
        return self.frame.loc[self.frame["fix"] == n].iloc[0]

    def source_edits(self, fixes: Iterable[int] | None = None) -> list[SourceEdit]:
        """The source edits of the automatic edit fixes among ``fixes`` (all by default), the
        rewrites of one statement combined into one edit."""
        return [edit for edit, _ in planned_edits(self._proposals, self._numbers(fixes))[0]]

    # -- the patch --------------------------------------------------------------------------------
    def patch(self, fixes: Iterable[int] | None = None) -> str:
        """The source edits as one unified diff: ``git apply`` (or ``patch -p1``) takes it in the
        project a file belongs to; an installed library's file is a diff against the installed
        file, labelled so. Fixes that are no source edit, or cannot be made, are listed in ``#``
        lines at its head, which ``git apply`` and ``patch`` skip. The source edits of the
        causes the last :meth:`apply` found exposed are in it too."""
        groups, failed = planned_edits(self._proposals, self._numbers(fixes))
        # and the source edits of the causes the last apply() found exposed, made after these
        edits = [edit for edit, _ in groups] + [e for more, made in self._rounds for e in more.source_edits(made)]
        head = []
        for n in self._numbers(fixes):
            p, row = self._proposals.get(n), self._row(n)
            where = row["source"] or row["module"]
            if n in failed:
                head.append(f"# fix {n} ({row['pattern']}) at {where}: {failed[n]}")
            elif p is not None and p.kind is not EditSource:
                head.append(f"# fix {n} ({row['pattern']}) is no source edit: {row['action']}: {row['suggestion']}")
        return "".join(f"{line}\n" for line in head) + unified_diff(edits)

    def save_patch(self, path) -> None:
        """Write :meth:`patch` to ``path``, atomically."""
        text = self.patch()
        atomic_write(path, lambda tmp: tmp.write_text(text))

    # -- proving ----------------------------------------------------------------------------------
    def verify(self, model: nn.Module, *inputs, kwargs: Mapping | None = None, backward: bool = True,
               loss_fn: Callable | None = None, warmup: int = 1, rounds: int = 7, max_rounds: int = 35,
               budget_s: float = 30.0, exposed: bool = True, seed: int = 0) -> Fixes:
        """Prove each fix, and all of them together, on ``model`` and ``inputs`` (those the audit
        ran; the same step options as :func:`auditor.audit`). Each is applied to a copy of the
        model (its source edits for the time it runs), the copy re-audited, its forward outputs
        and gradients compared with the original's (:data:`TOLERANCE`), and the step of both
        timed in interleaved rounds at one thread until the interval of the saving lies on one
        side of 0 or ``budget_s`` seconds or ``max_rounds`` rounds are spent. With ``exposed``,
        the causes that appear only once every fix is made get rows of their own (their fixes are
        made too, until no new cause appears). ``model`` itself is left as it was.

        Each fix is also audited all-contiguous (the copy and the inputs in
        torch.contiguous_format): ``contiguous_hotspots_before`` and ``_after``. A fix that adds
        hotspot groups there changes code a contiguous run goes through for the worse: its
        verdict is ``hurts contiguous`` and it is no longer automatic (:meth:`apply` and
        :meth:`patch` leave it, with the reason). A fix proposed as candidate rewrites (a
        statement whose rewrite is exact only for some shapes) has each tried in turn; the first
        that keeps the values, removes its cause's hotspot groups and does not hurt the
        contiguous run becomes the fix, the others are dropped. A fix timed slower is timed again
        with :data:`~auditor._fix._verify.LONGER` times the rounds and the budget; one still
        slower is no longer automatic (a candidate's next one is tried).

        Returns new ``Fixes``: the proved ones (a fix that failed a check no longer automatic,
        saying why; a candidate proved, the fix), with the verification table as
        :attr:`verification` (one row per fix, ``kind`` ``fix``; one for all together, ``all``;
        one per exposed cause, ``exposed``; columns in :data:`VERIFY_COLUMNS`), which their text
        and HTML show. These fixes and the audit are left as they are:
        ``audit.report(verification=proved.verification)`` shows the measured saving beside the
        estimate."""
        _check_changeable(model)
        if self._code is not None and self._code.active:
            raise RuntimeError("undo() the fixes applied before verifying: verify applies each one itself")
        step = Step(model, inputs, kwargs or {}, backward=backward, loss_fn=loss_fn)
        timing = {"rounds": rounds, "max_rounds": max_rounds, "budget_s": budget_s}
        proof = Proof(self, step, warmup, seed, timing, suggest_fixes)
        table = pd.DataFrame(proof.run(exposed), columns=VERIFY_COLUMNS)
        return Fixes(proof.frame, self._hotspots, self.audit, proof._proposals, table, proof.verified_rounds)

    # -- display ----------------------------------------------------------------------------------
    def __str__(self) -> str:
        text = fixes_text(self.frame, len(self._hotspots), writes=(EDIT,))
        return text if self.verification is None else f"{text}\n\n{verification_text(self.verification)}"

    def __repr__(self) -> str:
        saved = int(self.frame["bytes"].clip(lower=0).sum()) if len(self) else 0
        return f"<Fixes {len(self)} fixes, {saved} bytes to save>"

    def _repr_html_(self) -> str:
        """One table row per fix, for notebooks, then the verification once there is one."""
        html = fixes_html(self.frame, len(self._hotspots))
        return html if self.verification is None else html + verification_html(self.verification)



def suggest_fixes(audit: Audit) -> Fixes:
    """One fix for every cause of ``audit`` that has one that saves bytes.

    The fix follows the cause's pattern (:mod:`._generators`): a rewrite of the cause's
    statement (an explicit ``.contiguous()`` asks for channels_last; a mean over H and W becomes
    a sum divided by H·W; a stack reduced along the stack becomes the sum of the branches;
    slices of the channels become one ``split``; an N×C×1×1 map interpolated is broadcast; an
    in-place op on a view goes out of place; a rebuilt weight is flattened in its memory order;
    a channel shuffle function becomes ``F.channel_shuffle``), a torch module to swap for one
    that keeps the format (:data:`SWAPS`), a weight to convert, or the convolutions around an op
    that cannot keep the format to run contiguous, when that moves fewer bytes than it saves.
    Where a statement does not have the shape its rewrite needs, the fix is left by hand, with
    the reason (``automatic``, ``reason``). Lines need an audit with source lines (the
    default). A claim that an op has no channels_last kernel is made only where
    ``Audit.coverage()`` says so for this device and dtype.
    """
    if not isinstance(audit, Audit):
        raise TypeError(f"suggest_fixes expects an auditor.Audit, got {type(audit).__name__}")
    hot = audit.hotspots()
    causes = audit.causes()
    if causes.empty:
        return Fixes(pd.DataFrame(columns=FIX_COLUMNS), hot.assign(fix=pd.Series(dtype="int64")), audit)
    found = audit.analysis()
    ops, view, tracer = found.ops, found.view(), found.tracer
    backward = bool((ops["phase"] == "backward").any())
    rows, proposals = [], []
    with one_scan():
        found_proposals = {c.cause: propose(view, tracer, c, audit.threads) for c in causes.itertuples()}
    for cause in causes.itertuples():
        p = found_proposals[cause.cause]
        if p is None:  # no generator has a fix for it: reported, by hand
            p = Proposal(ByHand, cause.fix, reason="no change is known that keeps the format here")
        mine = hot[hot["cause"] == cause.cause]
        fwd = int(mine.loc[mine["phase"] == "forward", "bytes"].sum())
        bwd = int(mine.loc[mine["phase"] != "forward", "bytes"].sum())
        removed = int(cause.bytes) if cause.kind == WEIGHT_CAUSE else fwd + bwd
        added = p.added_bytes * (2 if backward else 1)  # a region's edges convert gradients too
        shown = p.reason
        if removed - added <= 0 and p.automatic:
            p = replace(p, reason=(
                f"its edges would convert {format_bytes(added)} where it removes {format_bytes(removed)}: "
                f"auditor.plan_layout times the model with this region kept contiguous (its candidate "
                f"'{region_candidate_name(p.region)}') against the uniform layouts, "
                "and auditor.apply_plan applies it where it measures faster"))
            shown = p.reason
            if p.candidates:
                labels = "; ".join(x.label for x in p.candidates)
                shown += (f"; or {len(p.candidates)} candidate rewrite{'s' * (len(p.candidates) > 1)} ({labels}), "
                          "exact only for some shapes: Fixes.verify(model, *inputs) proves one on this model or "
                          "drops them")
        rows.append({"cause": cause.cause, "pattern": cause.pattern, "action": p.action, "module": cause.module,
                     "module_type": cause.module_type, "op": cause.op, "source": cause.source, "line": p.line,
                     "suggestion": p.suggestion, "detail": p.detail, "hotspots": len(mine),
                     "count": int(mine["count"].sum()), "bytes": removed - int(added), "hotspot_bytes": removed,
                     "added_bytes": int(added), "forward_bytes": fwd, "backward_bytes": bwd, "region": p.region,
                     "automatic": p.automatic, "reason": shown})
        proposals.append((cause.cause, p))
    frame = pd.DataFrame(rows, columns=[c for c in FIX_COLUMNS if c != "fix"])
    frame = frame.sort_values(["bytes", "hotspot_bytes"], ascending=False, kind="stable", ignore_index=True)
    frame.insert(0, "fix", np.arange(1, len(frame) + 1))
    number = dict(zip(frame["cause"], frame["fix"]))
    out_hot = hot.copy()
    out_hot["fix"] = np.array([number.get(c, 0) for c in hot["cause"]], dtype=np.int64)
    by_number = {int(number[c]): p for c, p in proposals if c in number}
    frame = frame[FIX_COLUMNS].astype({"fix": "int64", "cause": "int64", "automatic": bool})
    return Fixes(frame, out_hot, audit, by_number)


def region_candidate_name(region: Iterable[str]) -> str:
    """The name :func:`auditor.plan_layout` gives the candidate that keeps a region fix's
    convolutions contiguous (:mod:`auditor._plan._regions`): the convolutions."""
    names = list(region)
    more = f" and {len(names) - 2} more" if len(names) > 2 else ""
    return f"region {', '.join(names[:2])}{more} contiguous"


def _check_changeable(model) -> None:
    if isinstance(model, torch.jit.ScriptModule):
        raise TypeError("Fixes.apply cannot change a TorchScript module in place: apply the fixes to the "
                        "Python model, then script it again")
    if not isinstance(model, nn.Module):
        raise TypeError(f"Fixes.apply expects an nn.Module, got {type(model).__name__}")

