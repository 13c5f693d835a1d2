"""A format per convolution, applied to a model: weights converted and input conversions
installed as forward pre-hooks where data arrives in another format."""

from __future__ import annotations

import pandas as pd
import torch
import torch.nn as nn

from .._fix._convert import conversion_frame
from .._fix._hooks import remove_input_formats, set_conv_format
from .._recording._formats import base_format
from ._graph import Call

FORMAT_OF = {"contiguous": torch.contiguous_format, "channels_last": torch.channels_last,
              "channels_last_3d": torch.channels_last_3d}


CL_NAME = {4: "channels_last", 5: "channels_last_3d"}


def rank_names(labels: dict[str, str], ranks: dict[str, int]) -> dict[str, str]:
    """``channels_last`` -> ``channels_last_3d`` for the 5-D convolutions."""
    return {n: CL_NAME[ranks[n]] if f == "channels_last" else "contiguous" for n, f in labels.items()}


def converted_inputs(formats: dict[str, str], calls: list[Call]) -> dict[str, str]:
    """The convolutions whose input arrives in another format than their own, per the flow."""
    out = {}
    for c in calls:
        want = base_format(formats[c.module])
        if base_format(c.input_label) == "ambiguous":
            continue
        have = formats.get(c.source[1]) if c.source[0] == "conv" else c.source[1]
        if have != want:
            out[c.module] = formats[c.module]
    return out


def apply_formats(model: nn.Module, formats: dict[str, str], converted: dict[str, str]) -> pd.DataFrame:
    """Each convolution's weight in its format, and an input conversion before those in
    ``converted``; earlier input conversions are removed first. Returns the weight report."""
    remove_input_formats(model)
    frames = [set_conv_format(model, name, FORMAT_OF[fmt], convert_input=name in converted)
              for name, fmt in formats.items()]
    return pd.concat(frames, ignore_index=True) if frames else conversion_frame([])

