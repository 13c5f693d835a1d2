"""Find where a PyTorch model loses the channels_last memory format, what it costs, and how to fix it.

    import auditor
    a = auditor.audit(model, x)          # one forward + backward step
    print(a.report())
    a.hotspots()                          # a DataFrame, largest bytes first

    with auditor.FormatAuditor() as fa:   # or record any block of code
        train_step()
    fa.audit.events

The package is split by layer, each importing only the ones before it: ``recording`` ->
``analysis`` -> ``display`` -> ``result``/``session`` -> ``fix`` -> ``plan`` -> the entry points
(``api``, ``fake``, ``distributed``, ``plot``, ``cli``, ``testing``). See the README, "How the
code is laid out".
"""

from ._api import audit
from ._fix import (
    convert_conv2d_weight_memory_format,
    convert_conv3d_weight_memory_format,
    keep_contiguous,
    suggest_fixes,
    to_channels_last,
)
from ._plan import apply_plan, plan_layout
from ._recording._formats import format_label
from ._recording._inductor import CompileError
from ._recording._mode import FormatLossError
from ._result import Audit, compare_compiled, diff
from ._session import FormatAuditor

__all__ = [
    "Audit",
    "CompileError",
    "FormatAuditor",
    "FormatLossError",
    "apply_plan",
    "audit",
    "compare_compiled",
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
