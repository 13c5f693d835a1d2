"""Recording: what happened, op by op.

Owns the private torch entry points the package uses, behind one fence (``_torch``), the format
labels (``_formats``), the per-op rule (``_rules``) and the data flow's facts it replays for
strict mode (``_facts``), module attribution (``_modules``), the dispatch mode on the hot path
and the raw log it leaves (``_mode``), the profiler beside it (``_profile``), notebook cells'
names (``_cells``), the event-log schema and its DataFrames (``_log``), the CSV file (``_csv``)
and the atomic writer every file goes through (``_files``). Imports torch, numpy and pandas
only: nothing here knows about data flow, reports or fixes.
"""

from ._cells import recorded
from ._files import atomic_write
from ._formats import format_label
from ._log import EVENT_COLUMNS, TENSOR_COLUMNS
from ._mode import FormatLossError, RawLog
from ._profile import HIDDEN_COLUMNS
from ._torch import TorchInternalsError

__all__ = [
    "EVENT_COLUMNS",
    "HIDDEN_COLUMNS",
    "TENSOR_COLUMNS",
    "FormatLossError",
    "RawLog",
    "TorchInternalsError",
    "atomic_write",
    "format_label",
    "recorded",
]

