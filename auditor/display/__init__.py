"""Display: turning analysis results into text and HTML for people.

Owns number formatting (``units``: bytes and times in engineering units, the same in reports,
tables and plots), text tables (``tables``), the audit's text report (``report``), the
notebook's HTML tables (``html``), the Chrome trace (``trace``) and the package's one progress
switch (``progress``). Imports :mod:`auditor.analysis` and :mod:`auditor.recording` names only;
nothing here computes a finding.
"""

from .._deprecated import moved_attribute


def __getattr__(name: str):
    """Modules of this package that went private, under their old names (deprecated)."""
    return moved_attribute(__name__, name)
