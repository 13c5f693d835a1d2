"""Recording: what happened, op by op.

Owns the format labels (``formats``), the per-op rule (``rules``), module attribution
(``modules``), the dispatch mode on the hot path (``mode``), the event-log schema and its
DataFrames (``log``) and the CSV file (``csvfile``). Imports torch, numpy and pandas only:
nothing here knows about data flow, reports or fixes.
"""

from .._deprecated import moved_attribute


def __getattr__(name: str):
    """Modules of this package that went private, under their old names (deprecated)."""
    return moved_attribute(__name__, name)
