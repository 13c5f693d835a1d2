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
from .fix import (
    convert_conv2d_weight_memory_format,
    convert_conv3d_weight_memory_format,
    keep_contiguous,
    suggest_fixes,
    to_channels_last,
)
from .formats import format_label
from .plan import apply_plan, plan_layout
from .recorder import FormatLossError

__all__ = [
    "Audit",
    "FormatAuditor",
    "FormatLossError",
    "apply_plan",
    "audit",
    "convert_conv2d_weight_memory_format",
    "convert_conv3d_weight_memory_format",
    "diff",
    "format_label",
    "keep_contiguous",
    "plan_layout",
    "suggest_fixes",
    "to_channels_last",
]
__version__ = "0.1.0"
