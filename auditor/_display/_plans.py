"""Layout plans (:class:`~auditor._plan.LayoutPlan`) and applied plans
(:class:`~auditor._plan.AppliedPlan`) as text and as HTML, from their tables."""

from __future__ import annotations

from collections.abc import Mapping

import pandas as pd

from ._html import header_html, table_html
from ._text import Column, text_table
from ._units import format_bytes

#: Groups of convolutions the plan's text lists (``LayoutPlan.decisions_table`` lists them all).
DECISIONS_SHOWN = 12

#: The whole-model candidates: their times, then the decision that weighed each, if any.
CANDIDATE_COLUMNS = [
    Column("candidate", width=18), Column("predicted", width=10, align=">"),
    Column("measured", width=10, align=">"), Column("spread", "±IQR/2", width=7, align=">"),
    Column("vs", "ratio to", width=18, gap=3), Column("ratio", width=6, align=">"),
    Column("interval", "[98% interval]", width=16, align=">"), Column("rounds", width=6, align=">"),
]
#: One group of same-signature convolutions: its totals, its decision and why.
DECISION_COLUMNS = [
    # cut to its end, where the module names differ
    Column("convolutions", "convolutions (same signature)", width=32, most=32, clip=lambda text, width: text[-width:]),
    Column("contiguous_us", "contiguous", width=11, align=">", text="{:.0f}us".format),
    Column("channels_last_us", "chan_last", width=11, align=">", text="{:.0f}us".format),
    Column("ratio", "cl/contig", width=9, align=">", text="{:.3f}".format, gap=2),
    Column("interval", "[98% interval]", width=16, align=">"),
    Column("repeats", "rounds", width=6, align=">", text="{:d}".format),
    Column("within_noise", "noise", width=5, text=lambda noisy: "yes" if noisy else "no", gap=2),
    Column("format", width=16, gap=2), Column("reason", gap=2),
]


def _interval(low, high) -> str:
    return f"[{low:6.3f}, {high:6.3f}]"


def noise_note(candidates: pd.DataFrame, margin: float, chosen: str) -> str:
    """What stayed within noise among the whole-model decisions ("" when nothing did)."""
    notes = []
    for r in candidates.itertuples():
        if r.within_noise is True:
            notes.append(f"{r.candidate} / {r.vs} = {r.ratio:.3f} [{r.ratio_low:.3f}, {r.ratio_high:.3f}] "
                         f"after {r.repeats} rounds")
    if not notes:
        return ""
    return f"within noise against a {margin:.0%} margin: " + "; ".join(notes) + f"; kept {chosen}"


def plan_headline(*, backward: bool, device: str, clock: str, margin: float, formats: Mapping[str, str],
                  regions: int | None, input_conversions: int) -> str:
    """What was planned and how it was measured: the convolutions per format, in ``regions``
    regions (``None``: no convolutions), and the input conversions."""
    mode = "training step" if backward else "inference"
    counts = pd.Series(list(formats.values()), dtype="object").value_counts()
    return (f"Layout plan ({mode}, measured on {device}, {clock} time, margin {margin:.0%}): "
            f"{len(formats)} convolutions"
            + "".join(f", {n} {f}" if i else f": {n} {f}" for i, (f, n) in enumerate(counts.items()))
            + (f" in {regions} region{'' if regions == 1 else 's'}" if regions is not None else "")
            + f"; {input_conversions} input conversions")


def plan_notes(candidates: pd.DataFrame, margin: float, chosen: str) -> list[str]:
    """The notes under the candidates: decisions within noise, page faults while timing."""
    notes = []
    note = noise_note(candidates, margin, chosen)
    if note:
        notes.append(f"note: {note}")
    if (candidates["faults"] > 0).any():
        notes.append("note: page faults while timing (the allocator returns memory to the OS between steps);"
                     " call auditor.steady_malloc() first for steadier numbers")
    return notes


def candidate_lines(candidates: pd.DataFrame) -> list[str]:
    """The candidates as a text table: predicted and measured times, their spread, and the
    decision that weighed each against another (none for the uniform default)."""
    c = candidates
    compared = [isinstance(vs, str) and bool(vs) for vs in c["vs"]]
    shown = pd.DataFrame({
        "candidate": c["candidate"].to_numpy(),
        "predicted": [f"{us / 1e3:.2f}ms" for us in c["predicted_us"]],
        "measured": [f"{us / 1e3:.2f}ms" for us in c["measured_us"]],
        "spread": [f"{s / 2:.0%}" for s in c["spread"]],
        "vs": [vs if k else "" for vs, k in zip(c["vs"], compared, strict=True)],
        "ratio": [f"{x:.3f}" if k else "" for x, k in zip(c["ratio"], compared, strict=True)],
        "interval": [_interval(lo, hi) if k else ""
                     for lo, hi, k in zip(c["ratio_low"], c["ratio_high"], compared, strict=True)],
        "rounds": [f"{n:d}" if k else "" for n, k in zip(c["repeats"], compared, strict=True)],
    })
    # the mark sits two columns further out on a row that weighed nothing (as it always has)
    tails = [("  within noise" if k and noisy is True else "") + ("" if k else "  ") + ("  <- chosen" if chosen else "")
             for k, noisy, chosen in zip(compared, c["within_noise"], c["chosen"], strict=True)]
    head, *rows = text_table(shown, CANDIDATE_COLUMNS, tails=tails)
    return [head, *(row.rstrip() for row in rows)]


def decisions_text(decisions: pd.DataFrame, max_rows: int | None = None) -> str:
    """``LayoutPlan.decisions()`` as text, ``max_rows`` of them."""
    shown = decisions if max_rows is None else decisions.head(max_rows)
    shown = shown.assign(interval=[_interval(lo, hi) for lo, hi in zip(shown["ratio_low"], shown["ratio_high"],
                                                                      strict=True)])
    lines = text_table(shown, DECISION_COLUMNS)
    if len(decisions) > len(shown):
        lines.append(f"  ... {len(decisions) - len(shown)} more groups in plan.convs")
    return "\n".join(lines)


def plan_text(*, headline: str, candidates: pd.DataFrame, notes: list[str], decisions: pd.DataFrame) -> str:
    """The headline, the candidates, their notes, then the first groups' decisions."""
    lines = [headline, *candidate_lines(candidates), *(f"  {n}" for n in notes)]
    if len(decisions):
        lines.append("")
        lines.append(decisions_text(decisions, max_rows=DECISIONS_SHOWN))
    return "\n".join(lines)


def plan_html(*, headline: str, candidates: pd.DataFrame, notes: list[str], decisions: pd.DataFrame) -> str:
    """The plan in a notebook: its headline and notes, the candidates, and the decisions."""
    # headings as the text's, not the frame's names ("predicted_us" over values in ms), ratios to 3 places;
    # the spread as the text shows it: half the interquartile range, over the median
    names = {"candidate": "candidate", "predicted_us": "predicted", "measured_us": "measured", "spread": "±IQR/2",
             "vs": "ratio to", "ratio": "ratio", "ratio_low": "low", "ratio_high": "high", "repeats": "repeats",
             "within_noise": "within noise", "chosen": "chosen"}
    ratios = {c: _ratio for c in (*RATIO_COLUMNS, *(c for c in decisions.columns if "ratio" in str(c)))}
    shown = candidates.assign(spread=candidates["spread"] / 2) if "spread" in candidates else candidates
    return (header_html([headline, *notes])
            + table_html(shown, columns={c: n for c, n in names.items() if c in candidates},
                         formats={"spread": "±{:.0%}".format, **ratios},
                         caption="Candidates: the whole model, timed end to end")
            + table_html(decisions, caption="Decisions per group of same-signature convolutions", formats=ratios,
                         max_rows=30, more="LayoutPlan.decisions()"))


#: a plan's ratio columns, written to 3 places in its HTML as in its text
RATIO_COLUMNS = ("ratio", "ratio_low", "ratio_high")


def _ratio(x) -> str:
    return "" if x is None or x != x else f"{float(x):.3f}"


#: Hotspot bytes per phase, before and after a plan.
APPLIED_COLUMNS = [
    Column("phase", width=9),
    Column("bytes_before", text=lambda b: f"hotspot bytes {format_bytes(b):>9} (all channels_last) ->"),
    Column("bytes_after", text=lambda b: f"{format_bytes(b):>9} (planned)"),
]


def _applied_lines(*, weights: int, input_conversions: int, checked: bool, allclose: bool,
                   max_abs_diff: float) -> list[str]:
    lines = [f"Plan applied: {weights} weights converted, {input_conversions} input conversions installed"]
    if checked:
        lines.append(f"  outputs {'allclose to' if allclose else 'DIFFER from'} the original "
                     f"(max abs diff {max_abs_diff:.2e})")
    return lines


def applied_text(*, weights: int, input_conversions: int, checked: bool, allclose: bool, max_abs_diff: float,
                 hotspots: pd.DataFrame) -> str:
    """What was changed; when the planned model was re-audited (``checked``), whether its output
    matches and its hotspot bytes per phase against all channels_last."""
    lines = _applied_lines(weights=weights, input_conversions=input_conversions, checked=checked,
                           allclose=allclose, max_abs_diff=max_abs_diff)
    if checked:
        lines.extend(text_table(hotspots, APPLIED_COLUMNS, header=False))
    return "\n".join(lines)


def applied_html(*, weights: int, input_conversions: int, checked: bool, allclose: bool, max_abs_diff: float,
                 hotspots: pd.DataFrame) -> str:
    """:func:`applied_text` in a notebook: its head, then the hotspots per phase as a table."""
    return (header_html(_applied_lines(weights=weights, input_conversions=input_conversions, checked=checked,
                                       allclose=allclose, max_abs_diff=max_abs_diff))
            + table_html(hotspots, caption="Hotspots by phase"))
