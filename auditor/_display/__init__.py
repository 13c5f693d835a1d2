"""Display (internal): turning analysis results into text and HTML for people.

One convention for every type that shows itself (``Audit``, ``Fixes``, ``LayoutPlan``,
``AppliedPlan``, ``RankAudits``): its ``__str__``/``report()`` and ``_repr_html_`` gather plain
data (DataFrames, strings, numbers) and call a renderer here; no formatting lives next to the
type.

Owns number formatting (``_units``: bytes and times in engineering units, the same in reports,
tables and plots), the text every rendering shares (``_text``), the audit's text report
(``_report``), the notebook's HTML tables (``_html``) and any DataFrame shown like them
(``_styled``), the renderers of fixes (``_fixes``), of layout and applied plans (``_plans``), of
a distributed run's audits (``_ranks``) and of the compiled step (``_compiled``), the Chrome
trace (``_trace``) and the package's one progress switch (``progress``). Imports
:mod:`auditor._analysis` and :mod:`auditor._recording`; nothing here computes a finding. The
package itself exports nothing.
"""
