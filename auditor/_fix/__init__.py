"""Fixes: what to change once the analysis says where data is permuted.

Owns the conversion helpers (``_convert``), per-convolution formats and input-format hooks
(``_hooks``), drop-in modules that keep the format (``_keep_format``), the statement rewrites each pattern's fix makes (``_rewrite``), the fix
generators registered per pattern (``_generators``), source edits applied in memory and as a
patch (``_patch``), proving a fix (``_verify``) and the suggested fixes (``_suggest``). Imports
the analysis, display, measuring and the ``Audit`` facade and session; never the planner or the
entry points.
"""

from ._convert import (
    CHANNELS_LAST_OF_RANK,
    FORMAT_NAMES,
    WEIGHT_CONVERSION_COLUMNS,
    convert_conv2d_weight_memory_format,
    convert_conv3d_weight_memory_format,
    layout_name,
    to_channels_last,
)
from ._generators import module_expr
from ._hooks import (
    InputFormat,
    keep_contiguous,
    remove_input_formats,
    set_conv_format,
    set_input_format,
)
from ._keep_format import (
    SWAPS,
    GlobalAvgPool,
    LayerNormKeepFormat,
    SoftmaxKeepFormat,
    TemporalConv,
    softmax_keep_format,
    swap_instance_norm,
    swap_module,
)
from ._suggest import (
    BY_HAND,
    EDIT,
    FIX_COLUMNS,
    REGION,
    SWAP,
    VERIFY_COLUMNS,
    WEIGHT,
    Fixes,
    suggest_fixes,
)
from ._verify import TOLERANCE

__all__ = [
    "BY_HAND",
    "CHANNELS_LAST_OF_RANK",
    "WEIGHT_CONVERSION_COLUMNS",
    "EDIT",
    "FIX_COLUMNS",
    "FORMAT_NAMES",
    "TOLERANCE",
    "VERIFY_COLUMNS",
    "GlobalAvgPool",
    "REGION",
    "SWAP",
    "SWAPS",
    "WEIGHT",
    "Fixes",
    "InputFormat",
    "LayerNormKeepFormat",
    "SoftmaxKeepFormat",
    "TemporalConv",
    "convert_conv2d_weight_memory_format",
    "convert_conv3d_weight_memory_format",
    "keep_contiguous",
    "layout_name",
    "module_expr",
    "remove_input_formats",
    "set_conv_format",
    "set_input_format",
    "softmax_keep_format",
    "suggest_fixes",
    "swap_instance_norm",
    "swap_module",
    "to_channels_last",
]

