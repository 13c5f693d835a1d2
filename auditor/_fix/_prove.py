"""Proof: each fix, and all of them together, applied to a copy of the model, re-audited, its
values and gradients compared with the original's and its step timed; candidate rewrites tried
in turn. A stage that returns a new value: it works on its own copies of the fixes' table and
proposals, and :meth:`Fixes.verify` builds a new ``Fixes`` from them; the fixes verified are
left as they were."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import Any

import pandas as pd

from .._result import Audit
from .._step import Step, copy_model
from . import _verify as verification
from ._changes import EditSource, KeepContiguous, by_hand
from ._making import applied as fixes_applied
from ._making import audit_step, cause_keys, code_off, exposed_rounds
from ._proposal import Candidate, Proposal

#: where a cause is: a fixed cause whose line, op and phase an audit still has is still there
_CAUSE_AT = ["phase", "op", "source"]


class Proof:
    """The working state of one :meth:`Fixes.verify`: copies of the fixes' table and proposals,
    which the checks change (a fix dropped, a candidate proved), and what the new ``Fixes`` is
    built from."""

    def __init__(self, fixes: Any, step: Step, warmup: int, seed: int, timing: dict,
                 suggest: Callable[[Audit], Any]):
        self.frame = fixes.frame.copy()
        self._proposals = dict(fixes._proposals)
        self._hotspots = fixes._hotspots
        self.audit = fixes.audit
        self._suggest = suggest
        self.step, self.warmup, self.seed, self.timing = step, warmup, seed, timing
        #: (the fixes made together, the exposed fixes made after them, by round)
        self.verified_rounds: tuple[tuple[int, ...], list[tuple[Any, list[int]]]] = ((), [])
        self.contiguous_before = _contiguous_groups(step, copy_model(step.model), warmup)
        compared, self.reference = verification.reference_values(step, seed)
        self.float64 = compared is not step
        self.rounding = verification.rounding_sensitivity(compared, seed, base=self.reference)

    def run(self, exposed: bool) -> pd.DataFrame:
        """The verification table (:data:`VERIFY_COLUMNS` order is the caller's)."""
        step, warmup, seed, timing = self.step, self.warmup, self.seed, self.timing
        rows = []
        for n in self._numbers(None):
            p = self._proposals[n]
            if p.candidates:
                rows.append(self._prove_candidates(n, p, step, warmup, seed, timing))
            else:
                rows.append(self._verify_one_or_drop(n, step, warmup, seed, timing))
        self._not_automatic_where_contiguous_hurts(rows)
        self._not_automatic_where_values_change(rows)
        self._not_automatic_where_slower(rows)
        if len(self.frame) > 0:
            together, found = self._together(step, warmup, seed, timing, exposed, rows)
            self._removed_together(rows, together)
            rows.append(together)
            rows.extend(found)
        for r in rows:
            r.pop("_after", None)
        return rows

    def _numbers(self, fixes: Iterable[int] | None) -> list[int]:
        return [int(n) for n in self.frame["fix"]]

    def _row(self, n: int):
        return self.frame.loc[self.frame["fix"] == n].iloc[0]

    def _unapplied(self, n: int, reason: str) -> dict:
        """Fix ``n``'s row where it is not applied, saying why."""
        row = self._row(n)
        return {"kind": "fix", "fix": n, "cause": int(row["cause"]), "pattern": row["pattern"],
                "source": row["source"], "estimated_us": self._estimate([n]), "applied": False,
                "reason": reason, "verdict": verification.NOT_APPLIED,
                "hotspots_before": self._groups([n]), "hotspots_after": pd.NA,
                "contiguous_hotspots_before": self.contiguous_before, "contiguous_hotspots_after": pd.NA}

    def _unapplied_all(self, reason: str) -> dict:
        """The row of all fixes together where they are not applied, saying why."""
        numbers = self._numbers(None)
        return {"kind": "all", "fix": 0, "cause": 0, "pattern": "", "source": "", "applied": False,
                "reason": reason, "verdict": verification.NOT_APPLIED, "hotspots_before": self._groups(numbers),
                "hotspots_after": pd.NA, "contiguous_hotspots_before": self.contiguous_before,
                "contiguous_hotspots_after": pd.NA, "estimated_us": self._estimate(numbers)}


    def _verify_one(self, numbers: list[int], step: Step, warmup: int, seed: int, timing: dict,
                    extra: list[tuple[Any, list[int]]] = (), kind: str = "fix", prove: bool = False) -> dict:
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
        checked = ((self.float64 and verification.in_float64(step.replace(model=fixed_model)))
                   or step.replace(model=copy_model(fixed_model)))
        names = verification.parameter_names(checked.model)  # a swapped module keeps its Parameters
        plain_model = copy_model(step.model)  # run all-contiguous, fixed
        with fixes_applied([(self, numbers), *extra], fixed_model, checked.model, plain_model) as (code, done):
            applied = all(done[n][0] for n in numbers)
            reason = "; ".join(dict.fromkeys(done[n][1] for n in numbers if not done[n][0]))
            if not applied:
                return {**base, "applied": False, "reason": reason, "verdict": verification.NOT_APPLIED,
                        "hotspots_before": self._groups(numbers), "hotspots_after": pd.NA,
                        "contiguous_hotspots_before": pd.NA, "contiguous_hotspots_after": pd.NA}
            after = audit_step(step.replace(model=copy_model(fixed_model)), warmup)
            out = {**base, "applied": True, "reason": "",
                   **self._hotspot_counts(numbers, after),
                   "contiguous_hotspots_before": self.contiguous_before,
                   "contiguous_hotspots_after": _contiguous_groups(step, plain_model, warmup)}
            after_values = verification.step_values(checked, seed, names)
            same = verification.compare_values(self.reference, after_values, floor=self.rounding)
            if prove and _failed_check({**out, "same_outputs": same.same, "max_rel_diff": same.max_rel_diff}):
                return {**out, "same_outputs": same.same, "max_abs_diff": same.max_abs_diff,
                        "max_rel_diff": same.max_rel_diff,
                        "verdict": verification.verdict(True, same, None, _contiguous_pair(out))}
            before_step = step.replace(model=reference).timed()
            after_step = step.replace(model=fixed_model).timed()

            def before():
                with code_off(code):
                    before_step()

            saving = verification.measure_saving(before, after_step, **timing)
            if kind == "fix" and verification.slower(saving):  # timed again: one run can be unlucky
                first = saving
                saving = verification.measure_saving(before, after_step, **verification.longer(timing))
                out["reason"] = (f"timed {'slower' if verification.slower(saving) else 'within noise or faster'} "
                                 f"again with {verification.LONGER}x the budget ({verification.saving_words(saving)}) "
                                 f"after a first timing said slower ({verification.saving_words(first)})")
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
            return self._unapplied(n, f"dropped: {why}")

    def _drop(self, n: int, why: str) -> None:
        """Fix ``n`` is no longer automatic (:meth:`apply` and :meth:`patch` leave it), saying why."""
        self._proposals[n] = replace(self._proposals[n], reason=why)
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

    def _not_automatic_where_slower(self, rows: list[dict]) -> None:
        """A fix whose verdict stays ``hurts`` when timed again for longer makes the step slower:
        it is no longer automatic, saying so (the user came for speed)."""
        for r in rows:
            if r.get("kind") == "fix" and r.get("verdict") == verification.HURTS and self._row(int(r["fix"]))["automatic"]:
                self._drop(int(r["fix"]), f"this fix makes the step slower: {r['reason']}")
                r["reason"] = f"dropped: this fix makes the step slower: {r['reason']}"

    def _prove_candidates(self, n: int, p: Proposal, step: Step, warmup: int, seed: int, timing: dict) -> dict:
        """Fix ``n``'s candidate rewrites tried in turn on the model: the first that passes every
        check (:func:`_failed_check`) becomes the fix (its edit, its text, automatic), and its row
        is the fix's row; where none does, the fix stays by hand, saying why each failed (a region
        fix stays the region it was)."""
        region = p.kind is KeepContiguous
        failures = []
        for cand in self._agreeing_first(n, p.candidates):
            trial = replace(p, kind=EditSource, change=cand.change, reason="", line=cand.line,
                            suggestion=cand.suggestion, detail=p.proved_detail or p.detail)
            self._proposals[n] = trial
            self._set_row(n, action=EditSource.action)
            try:
                row = self._verify_one([n], step, warmup, seed, timing, prove=True)
            except Exception as exc:  # the rewritten code raises on this model
                why = f"raises {_raised(exc)}"
            else:
                why = _failed_check(row)
                if not why:
                    self._set_row(n, line=cand.line, suggestion=cand.suggestion, automatic=True, reason="")
                    if region:  # an edit now: no region, no edges to convert
                        self._set_row(n, region=(), added_bytes=0, bytes=int(self._row(n)["hotspot_bytes"]),
                                      detail=trial.detail)
                    proved = f"candidate {cand.label} proved ({len(p.candidates)} tried)"
                    return {**row, "reason": "; ".join(filter(None, [proved, row.get("reason")]))}
            failures.append(f"{cand.label}: {why}")
        unproved = "no candidate rewrite proved exact on this model: " + "; ".join(failures)
        if region:  # the region as it was, by hand or made
            kept = replace(p, reason=f"{p.reason}; {unproved}" if p.reason else "")
            self._proposals[n] = kept
            self._set_row(n, action=p.action, reason=kept.reason, suggestion=p.suggestion, automatic=kept.automatic)
            if kept.automatic:
                row = self._verify_one([n], step, warmup, seed, timing)
                return {**row, "reason": "; ".join(x for x in (f"{unproved}; the region kept contiguous instead",
                                                                row["reason"]) if x)}
        else:
            self._proposals[n] = replace(p, change=None, reason=unproved)
            self._set_row(n, automatic=False, reason=unproved, suggestion="")
        return self._unapplied(n, by_hand(self._proposals[n].reason))

    def _agreeing_first(self, n: int, candidates: tuple[Candidate, ...]) -> list[Candidate]:
        """``candidates`` with those that rewrite their statements as a fix proved before ``n``
        rewrites them tried first, in their order: two causes of one statement (its forward and
        its backward copy) proved with different rewrites of it could not be made together."""
        def key(e) -> tuple:
            return e.statement.path, e.statement.first, e.statement.last, e.rewrite, e.facts

        made = {key(e) for m, q in self._proposals.items() if m != n and q.automatic and isinstance(q.change, EditSource)
                for e in q.change.edits}
        agrees = [all(key(e) in made for e in cand.change.edits) for cand in candidates]
        return [c for c, a in zip(candidates, agrees) if a] + [c for c, a in zip(candidates, agrees) if not a]

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
            reason = (f"this edit makes code that runs contiguous slower: {where}" if self._row(n)["action"] == EditSource.action
                      else f"this fix makes the model slower where it runs contiguous: {where}")
            self._proposals[n] = replace(p, reason=reason)
            self._set_row(n, automatic=False, reason=reason)

    def _verify_all(self, step: Step, warmup: int, seed: int, timing: dict, exposed: bool,
                    rows: list[dict]) -> tuple[dict, list[dict]]:
        """The row of every fix together, and one row per cause that only appears once they are
        made (whose own fixes are then made too, until no new cause appears, at most 3 rounds);
        one fix alone, and nothing exposed, is its own row again (``rows``: the fixes' rows).
        "Together" is every fix that can be made: a fix by hand is left out, as the user would."""
        numbers = [n for n in self._numbers(None) if self._row(n)["automatic"]]
        if not numbers:
            return self._unapplied_all("no fix can be made automatically"), []
        known = set(cause_keys(self.audit.causes())) if self.audit is not None else set()
        rounds = exposed_rounds(step, [(self, numbers)], known, 3 if exposed else 0, warmup, self._suggest)
        found: list[dict] = []
        for r in rounds:
            mine = r.fixes.frame[r.fixes.frame["cause"].isin(r.new["cause"])]
            for c in r.new.itertuples():
                f = mine[mine["cause"] == c.cause]
                made = bool(len(f) and f["automatic"].iloc[0])
                found.append({"kind": "exposed", "fix": int(f["fix"].iloc[0]) if len(f) else 0, "cause": c.cause,
                              "pattern": c.pattern, "source": c.source, "applied": made,
                              "reason": "" if made else (f["reason"].iloc[0] if len(f) else "no fix is known to help"),
                              "hotspots_before": int(c.hotspots), "hotspots_after": pd.NA,
                              "estimated_us": c.saving_us, "verdict": ""})
        extra = [(r.fixes, list(r.automatic)) for r in rounds if r.automatic]
        self.verified_rounds = (tuple(numbers), extra)
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
                          and self._proposals[n].candidates]
                if not proved:  # never raise for a wrong fix: the row says what the fixes together raise
                    return self._unapplied_all(f"the automatic fixes made together raise {_raised(exc)}"), []
                n = proved[-1]
                why = (f"proved alone, but the automatic fixes made together with it raise {type(exc).__name__}: "
                       f"{str(exc).splitlines()[0][:120] if str(exc) else ''}")
                self._proposals[n] = replace(self._proposals[n], change=None, reason=why)
                self._set_row(n, automatic=False, reason=why, suggestion="")
                for r in rows:
                    if r["kind"] == "fix" and r["fix"] == n:
                        r["reason"] = by_hand(why)

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


def _contiguous_groups(step: Step, model, warmup: int):
    """The hotspot groups of ``step`` on ``model`` (a copy, made contiguous in place) with its
    inputs all-contiguous; NA where that step raises or does not complete."""
    try:
        found = audit_step(verification.contiguous_step(step, model), warmup, time=False)
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
    hotspot groups of its cause left, more hotspot groups in the contiguous run, or a step still
    slower when timed again for longer (the next candidate may be a faster form)."""
    if not row.get("applied"):
        return str(row.get("reason") or "not applied")
    if row.get("same_outputs") is False:
        return f"changes the values (largest relative difference {float(row.get('max_rel_diff', float('nan'))):.1e})"
    after = row.get("hotspots_after")
    if after is not None and not pd.isna(after) and int(after) > 0:
        return f"leaves {int(after)} of its {row.get('hotspots_before')} hotspot groups"
    if verification.hurts_contiguous(*_contiguous_pair(row)):
        return (f"adds hotspot groups to the contiguous run ({row['contiguous_hotspots_before']} -> "
                f"{row['contiguous_hotspots_after']})")
    if row.get("verdict") == verification.HURTS:
        return f"makes the step slower: {row.get('reason')}"
    return ""
