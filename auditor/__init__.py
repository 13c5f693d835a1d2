"""Find where a PyTorch model loses the channels_last memory format, what it costs, and how to fix it.

    import auditor
    a = auditor.audit(model, x)          # one forward + backward step
    print(a.report())
    a.hotspots()                          # a DataFrame, largest bytes first

    with auditor.FormatAuditor() as fa:   # or record any block of code
        train_step()
    fa.audit.events
"""

from .api import FormatAuditor, audit
from .audit import Audit, diff
from .formats import format_label
from .recorder import FormatLossError

__all__ = ["Audit", "FormatAuditor", "FormatLossError", "audit", "diff", "format_label"]
__version__ = "0.1.0"
