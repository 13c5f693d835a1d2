"""The breadth table's totals from rows (benchmarks/breadth.py), without running a model."""

from __future__ import annotations

import re

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
    assert (t["strict"], t["hurts"]) == (1, 0)
    text = breadth.summary(rows)
    assert "**fixed by the engine's own fixes, verified, not `hurts`: 1 (33.3%)**" in text
    assert "removed by the other fixes (no fix of their own) 1; by hand 1" in text
    assert "| joins | 3 | 1 | 1 | 1 | 33% | 0 | 1 | 1 | 0 |" in text


def test_the_headline_counts_only_the_engines_own_verified_fixes_that_do_not_hurt():
    """Issue 38 item 7: a fix verified but `hurts` and a cause removed by the other fixes are
    columns of their own, outside the strict share; one not verified is in none of them."""
    breadth = _breadth()
    rows = [_cause("joins", True, True, "within noise"), _cause("joins", True, True, "helps"),
            _cause("joins", True, True, "hurts"), _cause("joins", False, True, breadth.REMOVED, "by hand; ..."),
            _cause("no_cl_kernel", True, False, "changes outputs"), _cause("no_cl_kernel", False, False, "not applied",
                                                                            "by hand: no kernel")]
    t = breadth.totals(rows)
    assert (t["causes"], t["strict"], t["hurts"], t["removed"], t["by_hand"], t["automatic"]) == (6, 2, 1, 1, 1, 4)
    text = breadth.summary(rows)
    assert "**fixed by the engine's own fixes, verified, not `hurts`: 2 (33.3%)**" in text
    assert "verified but `hurts` (slower with the fix) 1" in text and "of them not verified 1" in text
    assert "| joins | 4 | 1 | 3 | 2 | 50% | 1 | 1 | 0 | 0 |" in text
    assert "| no_cl_kernel | 2 | 1 | 1 | 0 | 0% | 0 | 0 | 1 | 0 |" in text
    assert "| verified, but its timing verdict is `hurts` (the step is slower with it) | 1 | joins | m |" in text


def test_a_map_made_1x1_by_a_small_input_or_an_empty_tensor_is_found_and_a_global_pool_is_not():
    """Issue 38 item 5: what exists only because the input is small, from the recorded shapes."""
    import torch
    from torch import nn

    import auditor

    breadth = _breadth()
    cl = torch.channels_last

    class Squeeze(nn.Module):  # a global mean and 1x1 convolutions on the pooled map: 1x1 by design
        def __init__(self):
            super().__init__()
            self.conv, self.se = nn.Conv2d(3, 8, 3, padding=1), nn.Conv2d(8, 8, 1)

        def forward(self, x):
            f = self.conv(x)
            return f * torch.sigmoid(self.se(f.mean((2, 3), keepdim=True)))

    class Strided(nn.Module):  # a stride that leaves one pixel of a 2x2 input
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Conv2d(3, 8, 3, stride=2, padding=1), nn.Conv2d(8, 8, 3, padding=1)

        def forward(self, x):
            empty = x[:0]  # no element, as an FPN level that got no region
            return self.b(self.a(x)) + empty.sum()

    def audit(model, size):
        return auditor.audit(model.to(memory_format=cl), torch.randn(2, 3, size, size).to(memory_format=cl),
                             record_time=False)

    assert breadth.small_maps(audit(Squeeze(), 8)) == ""
    empty = r"\d+ op calls? read or write a tensor with no element"
    assert re.fullmatch(empty, breadth.small_maps(audit(Strided(), 8)))
    # the stride leaves 1x1 of 2x2, and the next 3x3 window reads that one pixel
    assert re.fullmatch("2 convolution or pool calls make a 1x1 map; " + empty, breadth.small_maps(audit(Strided(), 2)))


def test_rows_appended_to_a_table_written_before_a_column_was_added_are_read_back_whole(tmp_path):
    """--resume on a committed table older than a column: the table is written again under
    today's header, so the new rows' last columns are not read back as extra fields of no name."""
    breadth = _breadth()
    path = tmp_path / "breadth.csv"
    old = [c for c in breadth.COLUMNS if c != "small_maps"]
    path.write_text(",".join(old) + "\n" + ",".join("old" if c == "model" else "" for c in old) + "\n")
    breadth.append_rows(path, [{"model": "new", "row": "model", "small_maps": "conv 1x1"}])
    assert path.read_text().splitlines()[0] == ",".join(breadth.COLUMNS)
    rows = breadth.read_rows(path)
    assert [r["model"] for r in rows] == ["old", "new"] and rows[1]["small_maps"] == "conv 1x1"
    assert all(None not in r for r in rows)
