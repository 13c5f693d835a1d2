"""Gradient formats after a step: every ``.grad`` in its parameter's format?"""

from __future__ import annotations

import pandas as pd
import torch

from .._recording._formats import format_label


def check_grad_formats(model: torch.nn.Module) -> pd.DataFrame:
    """After a step, whether every parameter's ``.grad`` has its parameter's memory format.

    One row per parameter (a DDP or DataParallel wrapper is looked through): ``param_format``,
    ``grad_format`` (format labels; empty when ``.grad`` is None), both strides,
    ``same_strides`` (autograd's gradient layout contract) and ``ok``: no grad, or a grad with
    the parameter's format label. A grad in another format makes the optimizer permute.
    """
    inner = model.module if isinstance(
        model, (torch.nn.parallel.DistributedDataParallel, torch.nn.DataParallel)
    ) else model
    rows = []
    for name, p in inner.named_parameters():
        g = p.grad
        pf = format_label(tuple(p.shape), tuple(p.stride()))
        gf = "" if g is None else format_label(tuple(g.shape), tuple(g.stride()))
        rows.append({
            "parameter": name,
            "shape": str(tuple(p.shape)),
            "param_format": pf,
            "grad_format": gf,
            "param_strides": str(tuple(p.stride())),
            "grad_strides": "" if g is None else str(tuple(g.stride())),
            "same_strides": g is not None and tuple(g.stride()) == tuple(p.stride()),
            "ok": g is None or gf == pf,
        })
    cols = ["parameter", "shape", "param_format", "grad_format", "param_strides", "grad_strides",
            "same_strides", "ok"]
    return pd.DataFrame(rows, columns=cols).astype({"same_strides": bool, "ok": bool})
