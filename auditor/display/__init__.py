"""Display: turning analysis results into text and HTML for people.

Owns number formatting (``units``: bytes and times in engineering units, the same in reports,
tables and plots), text and HTML tables (``tables``) and the audit's text report (``report``).
Imports :mod:`auditor.analysis` and :mod:`auditor.recording` names only; nothing here computes
a finding.
"""
