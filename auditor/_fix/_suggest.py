"""Suggested fixes: one concrete change per cause, made automatically where it can be, proved by
verification, and handed over as a patch.

Each row of ``Audit.causes()`` gets the fix its pattern's generator proposes
(:mod:`._generators`): a statement of the source to rewrite, a torch module to swap, a weight to
convert or a region to run contiguous. Only fixes that save bytes are suggested.
:meth:`Fixes.apply` makes them (source edits in memory, :mod:`._patch`), :meth:`Fixes.undo`
takes them back, :meth:`Fixes.verify` proves them (:mod:`._verify`) and :meth:`Fixes.patch`
writes the source edits as a diff.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator, Mapping

import numpy as np
import pandas as pd
import torch
import torch.nn as nn

from .._analysis._causes import WEIGHT as WEIGHT_CAUSE
from .._display._fixes import fixes_html, fixes_text, verification_html, verification_text
from .._display._units import format_bytes
from .._recording._files import atomic_write
from .._result import Audit
from .._session import record_step, warm_up
from .._step import Step, copy_model
from . import _verify as verification
from ._convert import CHANNELS_LAST_OF_RANK, FORMAT_NAMES
from ._generators import BY_HAND, EDIT, REGION, SWAP, WEIGHT, Proposal, propose
from ._hooks import (
    conv_module,
    is_conv_module,
    keep_contiguous,
    remove_input_formats,
    set_conv_format,
)
from ._keep_format import loses_format, swap_module
from ._patch import CodePatch, EditError, SourceEdit, one_scan, patch_functions, unified_diff

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
#: where a cause is: a fixed cause whose line, op and phase an audit still has is still there
_CAUSE_AT = ["phase", "op", "source"]


class Fixes:
    """The result of :func:`suggest_fixes`.

    Attributes:
        frame: one row per fix (columns in :data:`FIX_COLUMNS`), most bytes saved first.
            ``bytes`` is the net saving: ``hotspot_bytes`` (the hotspots it removes, forward and
            backward) less ``added_bytes`` (conversions a region fix moves to its edges).
            ``automatic``: :meth:`apply` can make it; ``reason``: why not, where it cannot.
        audit: the audit the fixes were suggested for; :meth:`hotspots` its hotspot groups, each
            with the fix that removes it.
        verification: the last :meth:`verify`'s table, or None.
    """

    def __init__(self, frame: pd.DataFrame, hotspots: pd.DataFrame, audit: Audit | None = None,
                 proposals: Mapping[int, Proposal] | None = None):
        self.frame = frame
        self._hotspots = hotspots
        self.audit = audit
        self.verification: pd.DataFrame | None = None
        self._proposals = dict(proposals or {})
        self._code: CodePatch | None = None  # the source edits apply() made, active or undone
        self._model_undo: list[Callable[[], None]] = []  # how to take back what apply() did to a model
        self._rounds: list[tuple[Fixes, list[int]]] = []  # the exposed fixes apply() made, by round
        #: (the fixes the last verify() made together, the exposed fixes it made after them, by round)
        self._verified_rounds: tuple[tuple[int, ...], list[tuple[Fixes, list[int]]]] = ((), [])

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
        the last :meth:`verify` found with the same automatic fixes. The first round is always
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
        self._code, done = self._edit_source(numbers)
        undo, done_model = _change_model(model, self.frame, self._proposals, numbers)
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
                code, made = more._edit_source(chosen)
                undo, made_model = _change_model(model, more.frame, more._proposals, chosen)
                self._model_undo.extend(undo)
                made.update(made_model)
                self._code = _joined(self._code, code)
                self._rounds.append((more, chosen))
                rows += [self._done_row(k, more, n, made[n]) for n in chosen]
        return pd.DataFrame(rows, columns=APPLY_COLUMNS)

    @staticmethod
    def _done_row(round_: int, fixes: Fixes, n: int, done: tuple[bool, str]) -> dict:
        r = fixes._row(n)
        return {"round": round_, "fix": n, "pattern": r["pattern"], "source": r["source"], "action": r["action"],
                "applied": done[0], "detail": done[1]}

    def _expose(self, step: Step, warmup: int, rounds: int) -> list[tuple[Fixes, list[int]]]:
        """The automatic fixes of the causes that appear once the fixes made so far are, a round
        at a time, each round audited on a copy of ``step``'s model with the rounds before it
        made (the source edits are in force already; the model's own changes are in it): until
        a round finds no new cause with an automatic fix, at most ``rounds`` rounds."""
        known = _cause_keys(self.audit.causes()) if self.audit is not None else set()
        found: list[tuple[Fixes, list[int]]] = []
        undo: list[Callable[[], None]] = []
        patches: list[CodePatch] = []
        fixed_model = copy_model(step.model)
        try:
            for _ in range(max(rounds, 0)):
                after = _audit(step.replace(model=copy_model(fixed_model)), warmup)
                more, automatic = _new_fixes(after, known)
                if not automatic:
                    break
                found.append((more, automatic))
                code, _ = more._edit_source(automatic)
                if code is not None:
                    patches.append(code)
                undo.extend(_change_model(fixed_model, more.frame, more._proposals, automatic)[0])
        finally:
            for p in reversed(patches):  # apply() makes them again, on the model itself
                p.undo()
            for fn in reversed(undo):
                fn()
        return found

    def _found_by_verify(self, numbers: list[int]) -> list[tuple[Fixes, list[int]]]:
        """The exposed fixes the last :meth:`verify` made with every automatic fix, where those
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
        return [edit for edit, _ in self._planned_edits(self._numbers(fixes))[0]]

    def _planned_edits(self, numbers: list[int]) -> tuple[list[tuple[SourceEdit, list[int]]], dict[int, str]]:
        """([(the edit of one statement, the fixes it makes)], per edit fix that cannot be made:
        why)."""
        from . import _rewrite as rw  # libcst: only once a fix edits source

        statements: dict[tuple, list[tuple[int, tuple]]] = {}
        failed: dict[int, str] = {}
        for n in numbers:
            p = self._proposals.get(n)
            if p is None or p.action != EDIT:
                continue
            if p.edit is None or not p.automatic:
                failed[n] = f"by hand: {p.reason}"
                continue
            for edit in p.edits:
                st = edit[0]
                statements.setdefault((st.path, st.first, st.last), []).append((n, edit))
        edits = []
        for group in statements.values():
            st = group[0][1][0]
            try:
                # two causes of one pattern rewritten together (slices on two statements) are one rewrite
                new = rw.rewrite(st, list(dict.fromkeys((e[1], e[2]) for _, e in group)))
            except rw.Refused as exc:
                failed.update({n: f"by hand: {exc}" for n, _ in group})
                continue
            edits.append((SourceEdit(st.path, st.first, st.last, st.text, new), list(dict.fromkeys(n for n, _ in group))))
        # a fix of several statements is made whole or not at all, and the fixes of a statement together
        kept = []
        for e, members in edits:
            lost = [n for n in members if n in failed]
            if lost:
                failed.update({n: f"by hand: made together with fix {lost[0]}, which cannot be made ({failed[lost[0]]})"
                               for n in members if n not in failed})
            else:
                kept.append((e, members))
        return kept, failed

    def _edit_source(self, numbers: list[int]) -> tuple[CodePatch | None, dict[int, tuple[bool, str]]]:
        """Apply the source edits of ``numbers``, a statement at a time, so that one that cannot
        be applied leaves the others made."""
        groups, failed = self._planned_edits(numbers)
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

    # -- the patch --------------------------------------------------------------------------------
    def patch(self, fixes: Iterable[int] | None = None) -> str:
        """The source edits as one unified diff: ``git apply`` (or ``patch -p1``) takes it in the
        project a file belongs to; an installed library's file is a diff against the installed
        file, labelled so. Fixes that are no source edit, or cannot be made, are listed in ``#``
        lines at its head, which ``git apply`` and ``patch`` skip. The source edits of the
        causes the last :meth:`apply` found exposed are in it too."""
        groups, failed = self._planned_edits(self._numbers(fixes))
        # and the source edits of the causes the last apply() found exposed, made after these
        edits = [edit for edit, _ in groups] + [e for more, made in self._rounds for e in more.source_edits(made)]
        head = []
        for n in self._numbers(fixes):
            p, row = self._proposals.get(n), self._row(n)
            where = row["source"] or row["module"]
            if n in failed:
                head.append(f"# fix {n} ({row['pattern']}) at {where}: {failed[n]}")
            elif p is not None and p.action != EDIT:
                head.append(f"# fix {n} ({row['pattern']}) is no source edit: {row['action']}: {row['suggestion']}")
        return "".join(f"{line}\n" for line in head) + unified_diff(edits)

    def save_patch(self, path) -> None:
        """Write :meth:`patch` to ``path``, atomically."""
        text = self.patch()
        atomic_write(path, lambda tmp: tmp.write_text(text))

    # -- proving ----------------------------------------------------------------------------------
    def verify(self, model: nn.Module, *inputs, kwargs: Mapping | None = None, backward: bool = True,
               loss_fn: Callable | None = None, warmup: int = 1, rounds: int = 7, max_rounds: int = 35,
               budget_s: float = 30.0, exposed: bool = True, seed: int = 0) -> pd.DataFrame:
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
        contiguous run becomes the fix, the others are dropped.

        Returns one row per fix (``kind`` ``fix``), one for all together (``all``) and one per
        exposed cause (``exposed``), columns in :data:`VERIFY_COLUMNS`; also kept as
        :attr:`verification`, which this object's text and HTML show. The audit is left as it
        is: ``audit.report(verification=table)`` and ``audit.html(verification=table)`` show the
        measured saving beside the estimate."""
        _check_changeable(model)
        if self._code is not None and self._code.active:
            raise RuntimeError("undo() the fixes applied before verifying: verify applies each one itself")
        step = Step(model, inputs, kwargs or {}, backward=backward, loss_fn=loss_fn)
        timing = {"rounds": rounds, "max_rounds": max_rounds, "budget_s": budget_s}
        self._contiguous_before = _contiguous_groups(step, copy_model(step.model), warmup)
        compared, self._reference = verification.reference_values(step, seed)
        self._float64 = compared is not step
        self._rounding = verification.rounding_sensitivity(compared, seed, base=self._reference)
        rows = []
        for n in self._numbers(None):
            p = self._proposals.get(n)
            if p is not None and p.extra.get("candidates"):
                rows.append(self._prove_candidates(n, p, step, warmup, seed, timing))
            else:
                rows.append(self._verify_one_or_drop(n, step, warmup, seed, timing))
        self._not_automatic_where_contiguous_hurts(rows)
        self._not_automatic_where_values_change(rows)
        if len(self) > 0:
            together, found = self._together(step, warmup, seed, timing, exposed, rows)
            self._removed_together(rows, together)
            rows.append(together)
            rows.extend(found)
        for r in rows:
            r.pop("_after", None)
        frame = pd.DataFrame(rows, columns=VERIFY_COLUMNS)
        self.verification = frame
        return frame

    def _verify_one(self, numbers: list[int], step: Step, warmup: int, seed: int, timing: dict,
                    extra: list[tuple[Fixes, list[int]]] = (), kind: str = "fix", prove: bool = False) -> dict:
        """One row: ``numbers`` (and fixes of other audits, ``extra``) applied to a copy; ``kind``
        ``fix`` for one fix, ``all`` for all of them. With ``prove`` (a candidate), a fix that
        fails a check (:func:`_failed_check`) is not timed."""
        row = self._row(numbers[0]) if kind == "fix" else None
        base = {"kind": kind, "fix": numbers[0] if row is not None else 0,
                "cause": int(row["cause"]) if row is not None else 0,
                "pattern": row["pattern"] if row is not None else "",
                "source": row["source"] if row is not None else "",
                "estimated_us": self._estimate(numbers)}
        fixed_model = copy_model(step.model)
        reference = copy_model(step.model)  # timed beside the fixed one
        # the values are compared in float64 where the model runs there (verify's _reference):
        # float32's rounding, which a batch norm over a handful of values amplifies, is no change
        # of the math
        checked = ((self._float64 and verification.in_float64(step.replace(model=fixed_model)))
                   or step.replace(model=copy_model(fixed_model)))
        names = verification.parameter_names(checked.model)  # a swapped module keeps its Parameters
        plain_model = copy_model(step.model)  # run all-contiguous, fixed
        with _applied([(self, numbers), *extra], fixed_model, checked.model, plain_model) as (code, done):
            applied = all(done[n][0] for n in numbers)
            reason = "; ".join(dict.fromkeys(done[n][1] for n in numbers if not done[n][0]))
            if not applied:
                return {**base, "applied": False, "reason": reason, "verdict": verification.NOT_APPLIED,
                        "hotspots_before": self._groups(numbers), "hotspots_after": pd.NA,
                        "contiguous_hotspots_before": pd.NA, "contiguous_hotspots_after": pd.NA}
            after = _audit(step.replace(model=copy_model(fixed_model)), warmup)
            out = {**base, "applied": True, "reason": "",
                   **self._hotspot_counts(numbers, after),
                   "contiguous_hotspots_before": getattr(self, "_contiguous_before", pd.NA),
                   "contiguous_hotspots_after": _contiguous_groups(step, plain_model, warmup)}
            after_values = verification.step_values(checked, seed, names)
            same = verification.compare_values(self._reference, after_values, floor=self._rounding)
            if prove and _failed_check({**out, "same_outputs": same.same, "max_rel_diff": same.max_rel_diff}):
                return {**out, "same_outputs": same.same, "max_abs_diff": same.max_abs_diff,
                        "max_rel_diff": same.max_rel_diff,
                        "verdict": verification.verdict(True, same, None, _contiguous_pair(out))}
            before_step = step.replace(model=reference).timed()
            after_step = step.replace(model=fixed_model).timed()

            def before():
                with _code_off(code):
                    before_step()

            saving = verification.measure_saving(before, after_step, **timing)
        return {**out, "same_outputs": same.same, "max_abs_diff": same.max_abs_diff, "max_rel_diff": same.max_rel_diff,
                "step_us_before": saving.step_us_before, "step_us_after": saving.step_us_after,
                "saving_us": saving.saving_us, "saving_low_us": saving.saving_low_us,
                "saving_high_us": saving.saving_high_us, "ratio": saving.ratio, "ratio_low": saving.ratio_low,
                "ratio_high": saving.ratio_high, "rounds": saving.rounds,
                "verdict": verification.verdict(True, same, saving, _contiguous_pair(out)), "_after": after}

    def _verify_one_or_drop(self, n: int, step: Step, warmup: int, seed: int, timing: dict) -> dict:
        """Fix ``n``'s row (:meth:`_verify_one`); where the fixed model raises (a wrong edit, a
        swap that does not fit), the fix is dropped: no longer automatic, its row not applied,
        both saying what it raised. A wrong fix never makes verify raise."""
        try:
            return self._verify_one([n], step, warmup, seed, timing)
        except Exception as exc:  # the fixed model raises: the fix is wrong for this model
            why = f"the fixed model raises {_raised(exc)}"
            self._drop(n, why)
            return {"kind": "fix", "fix": n, "cause": int(self._row(n)["cause"]), "pattern": self._row(n)["pattern"],
                    "source": self._row(n)["source"], "estimated_us": self._estimate([n]), "applied": False,
                    "reason": f"dropped: {why}", "verdict": verification.NOT_APPLIED,
                    "hotspots_before": self._groups([n]), "hotspots_after": pd.NA,
                    "contiguous_hotspots_before": getattr(self, "_contiguous_before", pd.NA),
                    "contiguous_hotspots_after": pd.NA}

    def _drop(self, n: int, why: str) -> None:
        """Fix ``n`` is no longer automatic (:meth:`apply` and :meth:`patch` leave it), saying why."""
        p = self._proposals.get(n)
        if p is not None:
            p.reason = why
        self._set_row(n, automatic=False, reason=why)

    def _not_automatic_where_values_change(self, rows: list[dict]) -> None:
        """A fix whose verdict is ``changes outputs`` is dropped: no longer automatic, with the
        largest difference it made."""
        for r in rows:
            if r.get("kind") == "fix" and r.get("verdict") == verification.CHANGES_OUTPUTS:
                why = (f"the fixed model computes other values (largest relative difference "
                       f"{float(r.get('max_rel_diff', float('nan'))):.1e})")
                self._drop(int(r["fix"]), why)
                r["reason"] = f"dropped: {why}"

    def _prove_candidates(self, n: int, p: Proposal, step: Step, warmup: int, seed: int, timing: dict) -> dict:
        """Fix ``n``'s candidate rewrites tried in turn on the model: the first that passes every
        check (:func:`_failed_check`) becomes the fix (its edit, its text, automatic), and its row
        is the fix's row; where none does, the fix stays by hand, saying why each failed."""
        candidates = p.extra["candidates"]
        # a region fix whose copy a rewrite may remove instead: tried as an edit, kept if none is proved
        region = p.action == REGION
        kept = (p.action, p.reason, self._row(n)["suggestion"])
        failures = []
        for cand in candidates:
            p.edit, p.more_edits, p.reason, p.action = cand.edit, cand.more, "", EDIT
            self._set_row(n, action=EDIT)
            try:
                row = self._verify_one([n], step, warmup, seed, timing, prove=True)
            except Exception as exc:  # the rewritten code raises on this model
                why = f"raises {type(exc).__name__}: {str(exc).splitlines()[0][:120] if str(exc) else ''}"
            else:
                why = _failed_check(row)
                if not why:
                    p.line, p.suggestion = cand.line, cand.suggestion
                    self._set_row(n, line=cand.line, suggestion=cand.suggestion, automatic=True, reason="")
                    if region:  # an edit now: no region, no edges to convert
                        p.region, p.added_bytes, p.detail = (), 0, p.extra.get("edit_detail", p.detail)
                        self._set_row(n, region=(), added_bytes=0, bytes=int(self._row(n)["hotspot_bytes"]),
                                      detail=p.detail)
                    return {**row, "reason": f"candidate {cand.label} proved ({len(candidates)} tried)"}
            failures.append(f"{cand.label}: {why}")
        p.edit, p.more_edits = None, ()
        unproved = "no candidate rewrite proved exact on this model: " + "; ".join(failures)
        if region:  # the region as it was, by hand or made
            p.action = kept[0]
            p.reason = f"{p.extra['region_reason']}; {unproved}" if kept[1] else ""
            self._set_row(n, action=kept[0], reason=p.reason, suggestion=kept[2], automatic=p.automatic)
            if p.automatic:
                row = self._verify_one([n], step, warmup, seed, timing)
                return {**row, "reason": "; ".join(x for x in (f"{unproved}; the region kept contiguous instead",
                                                                row["reason"]) if x)}
        else:
            p.reason = unproved
            self._set_row(n, automatic=False, reason=p.reason, suggestion="")
        row = self._row(n)
        return {"kind": "fix", "fix": n, "cause": int(row["cause"]), "pattern": row["pattern"],
                "source": row["source"], "estimated_us": self._estimate([n]), "applied": False,
                "reason": f"by hand: {p.reason}", "verdict": verification.NOT_APPLIED,
                "hotspots_before": self._groups([n]), "hotspots_after": pd.NA,
                "contiguous_hotspots_before": getattr(self, "_contiguous_before", pd.NA),
                "contiguous_hotspots_after": pd.NA}

    def _set_row(self, n: int, **values) -> None:
        """Fix ``n``'s row of :attr:`frame` changed in place (whoever holds the frame sees it)."""
        mask = self.frame["fix"] == n
        for column, value in values.items():
            if isinstance(value, tuple):  # one cell holds the tuple: pandas would spread it
                value = pd.Series([value] * int(mask.sum()), index=self.frame.index[mask], dtype=object)
            self.frame.loc[mask, column] = value

    def _not_automatic_where_contiguous_hurts(self, rows: list[dict]) -> None:
        """A fix whose verdict is ``hurts contiguous`` is no longer automatic, with the reason."""
        for r in rows:
            if r.get("kind") != "fix" or r.get("verdict") != verification.HURTS_CONTIGUOUS:
                continue
            n, p = int(r["fix"]), self._proposals.get(int(r["fix"]))
            where = (f"the model run all-contiguous has {r['contiguous_hotspots_before']} hotspot groups without it "
                     f"and {r['contiguous_hotspots_after']} with it")
            reason = (f"this edit makes code that runs contiguous slower: {where}" if self._row(n)["action"] == EDIT
                      else f"this fix makes the model slower where it runs contiguous: {where}")
            if p is not None:
                p.reason = reason
            self._set_row(n, automatic=False, reason=reason)

    def _verify_all(self, step: Step, warmup: int, seed: int, timing: dict, exposed: bool,
                    rows: list[dict]) -> tuple[dict, list[dict]]:
        """The row of every fix together, and one row per cause that only appears once they are
        made (whose own fixes are then made too, until no new cause appears, at most 3 times);
        one fix alone, and nothing exposed, is its own row again (``rows``: the fixes' rows).
        "Together" is every fix that can be made: a fix by hand is left out, as the user would."""
        numbers = [n for n in self._numbers(None) if self._row(n)["automatic"]]
        if not numbers:
            return {"kind": "all", "fix": 0, "cause": 0, "pattern": "", "source": "", "applied": False,
                    "reason": "no fix can be made automatically", "verdict": verification.NOT_APPLIED,
                    "hotspots_before": self._groups(self._numbers(None)), "hotspots_after": pd.NA,
                    "contiguous_hotspots_before": getattr(self, "_contiguous_before", pd.NA),
                    "contiguous_hotspots_after": pd.NA,
                    "estimated_us": self._estimate(self._numbers(None))}, []
        extra: list[tuple[Fixes, list[int]]] = []
        found: list[dict] = []
        known = _cause_keys(self.audit.causes()) if self.audit is not None else set()
        for _ in range(3 if exposed else 0):
            fixed_model = copy_model(step.model)
            with _applied([(self, numbers), *extra], fixed_model):
                after = _audit(step.replace(model=fixed_model), warmup)
            causes = after.causes()
            new = causes[[k not in known for k in _keys_of(causes)]]
            if new.empty:
                break
            more = suggest_fixes(after)
            mine = more.frame[more.frame["cause"].isin(new["cause"])]
            for c in new.itertuples():
                f = mine[mine["cause"] == c.cause]
                found.append({"kind": "exposed", "fix": int(f["fix"].iloc[0]) if len(f) else 0, "cause": c.cause,
                              "pattern": c.pattern, "source": c.source, "applied": bool(len(f) and f["automatic"].iloc[0]),
                              "reason": "" if len(f) and f["automatic"].iloc[0] else
                              (f["reason"].iloc[0] if len(f) else "no fix is known to help"),
                              "hotspots_before": int(c.hotspots), "hotspots_after": pd.NA,
                              "estimated_us": c.saving_us, "verdict": ""})
            known |= _cause_keys(new)
            automatic = [int(n) for n in mine.loc[mine["automatic"], "fix"]]
            if not automatic:
                break
            extra.append((more, automatic))
        self._verified_rounds = (tuple(numbers), list(extra))
        if len(numbers) == 1 and not extra:
            [alone] = [r for r in rows if r["fix"] == numbers[0]]
            return {**alone, "kind": "all", "fix": 0, "cause": 0, "pattern": "", "source": ""}, found
        return self._verify_one(numbers, step, warmup, seed, timing, extra, kind="all"), found

    def _together(self, step: Step, warmup: int, seed: int, timing: dict, exposed: bool,
                  rows: list[dict]) -> tuple[dict, list[dict]]:
        """:meth:`_verify_all`; where the automatic fixes made together raise, the fixes proved
        from candidates are taken back one at a time, the last proved first, until they do not
        (each proved alone: only a pair of rewrites can clash), each left by hand saying why."""
        while True:
            try:
                return self._verify_all(step, warmup, seed, timing, exposed, rows)
            except Exception as exc:
                proved = [n for n in self._numbers(None) if self._row(n)["automatic"]
                          and (self._proposals.get(n) is not None and self._proposals[n].extra.get("candidates"))]
                if not proved:  # never raise for a wrong fix: the row says what the fixes together raise
                    numbers = self._numbers(None)
                    return {"kind": "all", "fix": 0, "cause": 0, "pattern": "", "source": "", "applied": False,
                            "reason": f"the automatic fixes made together raise {_raised(exc)}",
                            "verdict": verification.NOT_APPLIED, "hotspots_before": self._groups(numbers),
                            "hotspots_after": pd.NA,
                            "contiguous_hotspots_before": getattr(self, "_contiguous_before", pd.NA),
                            "contiguous_hotspots_after": pd.NA, "estimated_us": self._estimate(numbers)}, []
                n = proved[-1]
                why = (f"proved alone, but the automatic fixes made together with it raise {type(exc).__name__}: "
                       f"{str(exc).splitlines()[0][:120] if str(exc) else ''}")
                self._proposals[n].edit, self._proposals[n].reason = None, why
                self._set_row(n, automatic=False, reason=why, suggestion="")
                for r in rows:
                    if r["kind"] == "fix" and r["fix"] == n:
                        r["reason"] = f"by hand: {why}"

    def _removed_together(self, rows: list[dict], together: dict) -> None:
        """The rows of the fixes left by hand whose causes' hotspot groups are all gone once the
        automatic fixes are made together, with the same values, and whose groups went nowhere
        else (the step has at most as many groups as the fixes and these causes account for),
        changed to say so: the automatic fixes fix them too."""
        after = together.get("_after")
        if after is None or not together.get("applied") or together.get("same_outputs") is not True:
            return
        made = [n for n in self._numbers(None) if self._row(n)["automatic"]]
        left = [r for r in rows if r["kind"] == "fix" and not r.get("applied")
                and not self._row(r["fix"])["automatic"] and self._hotspot_counts([r["fix"]], after)["hotspots_after"] == 0]
        gone = self._groups(made + [r["fix"] for r in left])
        if not left or len(after.hotspots()) > len(self._hotspots) - gone:
            return
        for r in left:
            r.update(hotspots_after=0, same_outputs=True, max_abs_diff=together.get("max_abs_diff"),
                     max_rel_diff=together.get("max_rel_diff"), verdict=verification.REMOVED_BY_OTHERS,
                     reason=f"{r.get('reason') or 'by hand'}; removed by the automatic fixes "
                            f"({', '.join(map(str, made))}) made together: its hotspot groups are gone with theirs, "
                            "the values the same")

    def _estimate(self, numbers: list[int]) -> float:
        if self.audit is None:
            return float("nan")
        causes = self.audit.causes().set_index("cause")
        chosen = [int(self._row(n)["cause"]) for n in numbers]
        return float(causes.loc[chosen, "saving_us"].sum(min_count=1))

    def _groups(self, numbers: list[int]) -> int:
        causes = {int(self._row(n)["cause"]) for n in numbers}
        return int(self._hotspots["cause"].isin(causes).sum())

    def _hotspot_counts(self, numbers: list[int], after: Audit) -> dict:
        """That cause's hotspot groups before, and after: the groups of ``after`` whose cause is
        at the same line, op and phase (a group another cause still makes is that cause's)."""
        causes = {int(self._row(n)["cause"]) for n in numbers}
        before = self.audit.causes() if self.audit is not None else pd.DataFrame(columns=["cause", *_CAUSE_AT])
        keys = {tuple(k) for k in before.loc[before["cause"].isin(causes), _CAUSE_AT].astype(str).to_numpy()}
        mine = after.causes()
        still = mine.loc[[tuple(k) in keys for k in mine[_CAUSE_AT].astype(str).to_numpy()], "cause"]
        hot = after.hotspots()
        return {"hotspots_before": int(self._hotspots["cause"].isin(causes).sum()),
                "hotspots_after": int(hot["cause"].isin(set(still)).sum())}

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


def _audit(step: Step, warmup: int, time: bool = True) -> Audit:
    """The step audited as :func:`auditor.audit` would, after ``warmup`` steps."""
    warm_up(step, warmup, record_time=time)
    return record_step(step, record_source=True, record_time=time, warmup=warmup)


def _contiguous_groups(step: Step, model: nn.Module, warmup: int):
    """The hotspot groups of ``step`` on ``model`` (a copy, made contiguous in place) with its
    inputs all-contiguous; NA where that step raises or does not complete."""
    try:
        found = _audit(verification.contiguous_step(step, model), warmup, time=False)
    except Exception:
        return pd.NA
    return int(len(found.hotspots())) if found.complete else pd.NA


def _raised(exc: BaseException) -> str:
    """``TypeError: its first line``, for a reason."""
    text = str(exc).splitlines()[0][:160] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _contiguous_pair(row: dict) -> tuple[object, object]:
    return row.get("contiguous_hotspots_before", pd.NA), row.get("contiguous_hotspots_after", pd.NA)


def _failed_check(row: dict) -> str:
    """Why a candidate's row does not prove it ("" when it does): not applied, other values,
    hotspot groups of its cause left, or more hotspot groups in the contiguous run."""
    if not row.get("applied"):
        return str(row.get("reason") or "not applied").removeprefix("by hand: ")
    if row.get("same_outputs") is False:
        return f"changes the values (largest relative difference {float(row.get('max_rel_diff', float('nan'))):.1e})"
    after = row.get("hotspots_after")
    if after is not None and not pd.isna(after) and int(after) > 0:
        return f"leaves {int(after)} of its {row.get('hotspots_before')} hotspot groups"
    if verification.hurts_contiguous(*_contiguous_pair(row)):
        return (f"adds hotspot groups to the contiguous run ({row['contiguous_hotspots_before']} -> "
                f"{row['contiguous_hotspots_after']})")
    return ""


def _new_fixes(after: Audit, known: set[tuple]) -> tuple[Fixes | None, list[int]]:
    """The fixes of ``after`` and the numbers of the automatic ones among the causes not in
    ``known`` (which they are added to); (None, []) where no cause is new."""
    causes = after.causes()
    new = causes[[k not in known for k in _keys_of(causes)]]
    if new.empty:
        return None, []
    known |= _cause_keys(new)
    more = suggest_fixes(after)
    mine = more.frame[more.frame["cause"].isin(new["cause"]) & more.frame["automatic"]]
    return more, [int(n) for n in mine["fix"]]


def _joined(first: CodePatch | None, second: CodePatch | None) -> CodePatch | None:
    """Two patches in force as one, which undo() and redo() take back and make again together."""
    if first is None or second is None:
        return first or second
    return CodePatch(first.edits + second.edits, active=first.active and second.active,
                     functions=list(dict.fromkeys(first.functions + second.functions)))


def _cause_keys(causes: pd.DataFrame) -> set[tuple]:
    return set(_keys_of(causes))


def _keys_of(causes: pd.DataFrame) -> list[tuple]:
    return list(zip(causes["pattern"], causes["phase"], causes["op"], causes["source"]))


@contextlib.contextmanager
def _code_off(code: CodePatch | None) -> Iterator[None]:
    if code is None or not code.active:
        yield
        return
    code.undo()
    try:
        yield
    finally:
        code.redo()


@contextlib.contextmanager
def _applied(groups: list[tuple[Fixes, list[int]]], model: nn.Module, *copies: nn.Module):
    """``groups`` of fixes (each of one audit) applied to ``model`` (and to its ``copies``) and to
    the source, taken back after; yields (the source edits, per fix number of the first group:
    (applied, detail))."""
    patches, undo, first = [], [], {}
    try:
        for k, (fixes, numbers) in enumerate(groups):
            code, done = fixes._edit_source(numbers)
            if code is not None:
                patches.append(code)
            more, done_model = _change_model(model, fixes.frame, fixes._proposals, numbers)
            undo.extend(more)
            done.update(done_model)
            for other in copies:
                undo.extend(_change_model(other, fixes.frame, fixes._proposals, numbers)[0])
            if k == 0:
                first = done
        code = CodePatch(tuple(e for p in patches for e in p.edits), active=bool(patches))
        yield code, first
    finally:
        for p in reversed(patches):
            p.undo()
        for fn in reversed(undo):
            fn()


def _losing(model: nn.Module, latent: Iterable[tuple[str, tuple[int, ...]]], threads: int | None) -> list[str]:
    """The modules among ``latent`` ((name, input shape) pairs) that write another format when
    fed channels_last at that shape, here: a kernel choice only the running torch knows."""
    return [name for name, shape in latent if loses_format(model.get_submodule(name), shape, threads)]


def _change_model(model: nn.Module, frame: pd.DataFrame, proposals: Mapping[int, Proposal],
                  numbers: list[int]) -> tuple[list[Callable[[], None]], dict[int, tuple[bool, str]]]:
    """The fixes among ``numbers`` that change the model (swaps, weights, regions), made in
    place; (how to take each back, per fix: (applied, what was done or why not))."""
    undo: list[Callable[[], None]] = []
    done: dict[int, tuple[bool, str]] = {}
    swapped_by: dict[str, int] = {}  # module -> the fix that swapped it (two causes, one module)
    rows = frame.set_index("fix")
    for n in numbers:
        r, p = rows.loc[n], proposals.get(n)
        action = r["action"]
        if action == EDIT:
            continue
        if p is not None and not p.automatic:
            done[n] = (False, f"by hand: {p.reason}")
        elif action == SWAP:
            modules = (p.extra.get("modules") if p is not None else None) or [r["module"]]
            table = p.extra.get("table") if p is not None else None
            latent = _losing(model, p.extra.get("latent", ()), p.extra.get("threads")) if p is not None else []
            modules = [*modules, *latent]
            swapped, failures = [], []
            for name in modules:
                if name in swapped_by:
                    swapped.append(f"{name} already swapped by fix {swapped_by[name]}")
                    continue
                parent_name, _, attr = name.rpartition(".")
                try:
                    parent = model.get_submodule(parent_name) if parent_name else model
                    old = model.get_submodule(name)
                    new = swap_module(model, name, table)
                except (ValueError, AttributeError) as exc:
                    failures.append(str(exc))
                    continue
                undo.append(lambda parent=parent, attr=attr, old=old: setattr(parent, attr, old))
                swapped_by[name] = n
                swapped.append(f"{name} is now {type(new).__name__}")
            what = "; ".join(swapped[:2]) + (f" (and {len(swapped) - 2} more)" if len(swapped) > 2 else "")
            if latent:
                what += f"; {len(latent)} of them only lost the format once fed it (asked of this torch's kernels)"
            if failures:
                what += ("; " if what else "") + f"not applied: {failures[0]}"
            done[n] = (bool(swapped) and not failures, what)
        elif action == WEIGHT:
            modules = (p.extra.get("modules") if p is not None else None) or [r["module"]]
            converted = []
            for name in modules:
                weight = conv_module(model, name).weight
                target = CHANNELS_LAST_OF_RANK[weight.dim()]
                if weight.is_contiguous(memory_format=target) and not weight.is_contiguous():
                    continue
                strides = weight.stride()
                set_conv_format(model, name, target, convert_input=False)
                undo.append(lambda w=weight, strides=strides: _restride(w, strides))
                converted.append(name)
            done[n] = ((True, f"{', '.join(converted)}.weight converted") if converted else
                       (False, f"{modules[0]}.weight is already {FORMAT_NAMES[target]}: nothing to do"))
        elif action == REGION:
            convs = [m for m in r["region"] if is_conv_module(model, m)]
            strides = {m: conv_module(model, m).weight.stride() for m in convs}
            keep_contiguous(model, convs)
            undo.append(lambda strides=strides: _back_to(model, strides))
            what = f"{', '.join(convs) or 'nothing'} run contiguous"
            if len(convs) < len(r["region"]):
                others = ", ".join(m for m in r["region"] if m not in convs)
                what += f"; by hand: {others} ran convolutions but are no convolution modules"
            done[n] = (bool(convs), what)
        else:
            done[n] = (False, f"by hand, at {r['source'] or r['module']}: {r['suggestion'] or r['detail']}")
    return undo, done


def _restride(param: nn.Parameter, strides: tuple[int, ...]) -> None:
    """``param`` (and its gradient) laid out with ``strides`` again, its values kept: a 1x1
    kernel's strides pick the layout its convolution computes in, though both formats call it
    contiguous, so a format is not enough to put it back."""
    for t in (param, param.grad):
        if t is not None and t.stride() != strides:
            t.data = torch.empty_strided(t.shape, strides, dtype=t.dtype, device=t.device).copy_(t.detach())


def _back_to(model: nn.Module, strides: dict[str, tuple[int, ...]]) -> None:
    """Convolutions a region fix ran contiguous, back to their weights' layouts, their input
    conversions removed."""
    for name, weight_strides in strides.items():
        conv = conv_module(model, name)
        _restride(conv.weight, weight_strides)
        remove_input_formats(conv)


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
            p = Proposal(BY_HAND, cause.fix, reason="no change is known that keeps the format here")
        mine = hot[hot["cause"] == cause.cause]
        fwd = int(mine.loc[mine["phase"] == "forward", "bytes"].sum())
        bwd = int(mine.loc[mine["phase"] != "forward", "bytes"].sum())
        removed = int(cause.bytes) if cause.kind == WEIGHT_CAUSE else fwd + bwd
        added = p.added_bytes * (2 if backward else 1)  # a region's edges convert gradients too
        if removed - added <= 0 and p.automatic:
            p.reason = (f"its edges would convert {format_bytes(added)} where it removes {format_bytes(removed)}: "
                        f"auditor.plan_layout times the model with this region kept contiguous (its candidate "
                        f"'{region_candidate_name(p.region)}') against the uniform layouts, "
                        "and auditor.apply_plan applies it where it measures faster")
            if p.extra.get("candidates"):
                p.extra["region_reason"] = p.reason
                labels = "; ".join(x.label for x in p.extra["candidates"])
                p.reason += (f"; or {len(p.extra['candidates'])} candidate rewrite"
                             f"{'s' * (len(p.extra['candidates']) > 1)} ({labels}), exact only for some shapes: "
                             "Fixes.verify(model, *inputs) proves one on this model or drops them")
        rows.append({"cause": cause.cause, "pattern": cause.pattern, "action": p.action, "module": cause.module,
                     "module_type": cause.module_type, "op": cause.op, "source": cause.source, "line": p.line,
                     "suggestion": p.suggestion, "detail": p.detail, "hotspots": len(mine),
                     "count": int(mine["count"].sum()), "bytes": removed - int(added), "hotspot_bytes": removed,
                     "added_bytes": int(added), "forward_bytes": fwd, "backward_bytes": bwd, "region": p.region,
                     "automatic": p.automatic, "reason": p.reason})
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

