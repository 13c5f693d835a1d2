"""Fixes: what to change once the analysis says where data is permuted.

Owns the conversion helpers (``convert``), per-convolution formats and input-format hooks
(``hooks``), drop-in modules that keep the format (``keep_format``), reading the user's source
(``source``) and suggested fixes (``suggest``). Imports the analysis, display and the ``Audit``
facade; never the planner or the entry points.
"""

from .._deprecated import moved_attribute
from ._convert import (
    CHANNELS_LAST_OF_RANK,
    FORMAT_NAMES,
    WEIGHT_CONVERSION_COLUMNS,
    convert_conv2d_weight_memory_format,
    convert_conv3d_weight_memory_format,
    layout_name,
    to_channels_last,
)
from ._hooks import (
    InputFormat,
    keep_contiguous,
    remove_input_formats,
    set_conv_format,
    set_input_format,
)
from ._keep_format import (
    SWAPS,
    LayerNormKeepFormat,
    SoftmaxKeepFormat,
    softmax_keep_format,
    swap_instance_norm,
    swap_module,
)
from ._source_text import module_expr
from ._suggest import EDIT, FIX_COLUMNS, FUNCTION, REGION, SWAP, WEIGHT, Fixes, suggest_fixes

__all__ = [
    "CHANNELS_LAST_OF_RANK",
    "WEIGHT_CONVERSION_COLUMNS",
    "EDIT",
    "FIX_COLUMNS",
    "FORMAT_NAMES",
    "FUNCTION",
    "REGION",
    "SWAP",
    "SWAPS",
    "WEIGHT",
    "Fixes",
    "InputFormat",
    "LayerNormKeepFormat",
    "SoftmaxKeepFormat",
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


def __getattr__(name: str):
    """Modules of this package that went private, under their old names (deprecated)."""
    return moved_attribute(__name__, name)
