"""The breadth table's totals from rows (benchmarks/breadth.py), without running a model."""

from __future__ import annotations

from test_breadth import _breadth

from auditor._fix import _verify as verification


def _cause(pattern, automatic, verified, verdict="", reason=""):
    return {"row": "cause", "model": "m", "source": "s", "pattern": pattern, "automatic": str(automatic),
            "verified": str(verified), "verdict": verdict, "reason": reason, "applied": str(automatic),
            "changed_outputs": "False", "location": "f.py:1", "action": "edit source", "hotspots_before": "1",
            "hotspots_after": "0"}


def test_a_cause_the_other_fixes_remove_counts_as_verified_and_not_by_hand():
    breadth = _breadth()
    assert breadth.REMOVED == verification.REMOVED_BY_OTHERS  # the verdict the table reads is verify's
    rows = [_cause("joins", True, True), _cause("joins", False, True, breadth.REMOVED, "by hand; removed by ..."),
            _cause("joins", False, False, "not applied", "by hand: no rewrite"),
            {"row": "model", "model": "m", "source": "s", "family": "f", "status": "ok", "changed_outputs": "False",
             "layout_regression": "False", "contiguous_hotspots_before": "0", "contiguous_hotspots_after": "0",
             "patch_check": "ok", "input": "", "causes": "3", "automatic_verified": "2", "by_hand": "1",
             "seconds": "1", "stages": "", "error": ""}]
    t = breadth.totals(rows)
    assert (t["causes"], t["verified"], t["removed"], t["by_hand"], t["automatic"]) == (3, 2, 1, 1, 1)
    text = breadth.summary(rows)
    assert "**automatic and verified 2 (67%)**, of which 1 by hand but removed by the other causes' automatic fixes" in text
    assert "| joins | 3 | 1 | 1 | 2 | 1 | 67% | 1 | 0 |" in text
