"""Display: turning analysis results into text and HTML for people.

One convention for every type that shows itself (``Audit``, ``Fixes``, ``LayoutPlan``,
``AppliedPlan``, ``RankAudits``): its ``__str__``/``report()`` and ``_repr_html_`` gather plain
data (DataFrames, strings, numbers) and call a renderer here; no formatting lives next to the
type.

Owns number formatting (``units``: bytes and times in engineering units, the same in reports,
tables and plots), the text every rendering shares (``text``: names cut to a width, the one
way a source line is shown, :func:`short_source`, and the one fixed-width text table), the
audit's text report with the one hotspot table (``report``), the notebook's HTML tables
(``html``, :func:`table_html`), the renderers of fixes (``fixes``), of layout and applied
plans (``plans``) and of a distributed run's audits (``ranks``), the Chrome trace (``trace``)
and the package's one progress switch (``progress``). Imports :mod:`auditor._analysis` and
:mod:`auditor._recording` names only; nothing here computes a finding.
"""

from . import progress
from ._fixes import fixes_html, fixes_text, verification_html, verification_text
from ._html import audit_html, table_html
from ._plans import (
    applied_html,
    applied_text,
    decisions_text,
    noise_note,
    plan_headline,
    plan_html,
    plan_notes,
    plan_text,
)
from ._ranks import ranks_html, ranks_text
from ._report import audit_report
from ._styled import Styled, styled, timing_text
from ._text import saving_text, short_source, shorten
from ._trace import chrome_trace, write_chrome_trace
from ._units import QUANTITIES, format_bytes, format_us

__all__ = [
    "progress",
    "format_bytes",
    "format_us",
    "QUANTITIES",
    "shorten",
    "short_source",
    "table_html",
    "styled",
    "Styled",
    "timing_text",
    "audit_report",
    "audit_html",
    "chrome_trace",
    "write_chrome_trace",
    "fixes_text",
    "fixes_html",
    "saving_text",
    "verification_text",
    "verification_html",
    "plan_headline",
    "plan_notes",
    "plan_text",
    "plan_html",
    "decisions_text",
    "noise_note",
    "applied_text",
    "applied_html",
    "ranks_text",
    "ranks_html",
]

