"""Find where a PyTorch model loses the channels_last memory format, what it costs, and how to fix it.

    import auditor
    a = auditor.audit(model, x)          # one forward + backward step
    print(a.report())
    a.causes()                            # a DataFrame: where the format is lost, what a fix saves

    with auditor.FormatAuditor() as fa:   # or record any block of code
        train_step()
    fa.audit.events

    fixes = auditor.suggest_fixes(a)      # one fix per cause; fixes.verify(model, x) proves them
    plan = auditor.plan_layout(model, x)  # which convolutions should run channels_last, measured

This module, :mod:`auditor.testing`, :mod:`auditor.plot` and :mod:`auditor.distributed` are the
public API; every module whose name starts with ``_`` is internal (CONTRIBUTING.md, "How the code is
laid out"). ``format-audit`` (:mod:`auditor.cli`) and ``python -m auditor.demo`` are the commands.
"""

from importlib import metadata as _metadata

from ._api import audit
from ._display._styled import styled
from ._fix._convert import (
    convert_conv2d_weight_memory_format,
    convert_conv3d_weight_memory_format,
    to_channels_last,
)
from ._fix._hooks import keep_contiguous
from ._fix._keep_format import keep_format
from ._fix._suggest import Fixes, suggest_fixes
from ._measure._harness import steady_malloc
from ._plan._apply import apply_plan
from ._plan._layout import NoisyPlanWarning, plan_layout
from ._recording._errors import CompileError
from ._recording._formats import format_label
from ._recording._mode import FormatLossError
from ._recording._torch import TorchInternalsError
from ._result import Audit, compare_compiled, diff
from ._session import FormatAuditor

__all__ = [
    # auditing
    "audit",
    "FormatAuditor",
    "Audit",
    "diff",
    "compare_compiled",
    "format_label",
    "styled",
    # fixing
    "suggest_fixes",
    "Fixes",
    "to_channels_last",
    "keep_contiguous",
    "convert_conv2d_weight_memory_format",
    "convert_conv3d_weight_memory_format",
    "keep_format",
    # planning
    "plan_layout",
    "apply_plan",
    "NoisyPlanWarning",
    "steady_malloc",
    # errors
    "FormatLossError",
    "CompileError",
    "TorchInternalsError",
]

#: This package's version, from its installed metadata (``pyproject.toml`` is the one source;
#: ``format-audit --version`` prints the same); ``0+unknown`` for a source tree never installed.
try:
    __version__ = _metadata.version("format-auditor")
except _metadata.PackageNotFoundError:
    __version__ = "0+unknown"
