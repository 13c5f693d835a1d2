"""Module swaps and weights: a torch module whose own computation loses the format, swapped for
one that keeps it; a convolution without a kernel for its shape; a weight stored in another
format than its convolution computes in."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import torch

from ..._analysis._activations import parse_tuple
from .._changes import (
    ConvertWeights,
    SwapModules,
)
from .._keep_format import CONV_SWAPS, KEEP_FORMAT, SWAPS
from .._proposal import CauseView, Proposal, module_expr
from .._registry import register_fix


@register_fix("torch module's own copy")
def _inside_a_torch_module_fix(c: CauseView) -> Proposal | None:
    """A copy or join made inside a torch module that has a format-keeping replacement (an
    InstanceNorm2d runs batch norm on a (1, N·C, H, W) view and copies it back): the module's
    own computation loses the format, whatever line calls it, so swap the module."""
    typ = torch_module_type(c.module_type, SWAPS)
    if typ is None or (typ is torch.nn.LayerNorm and _normalized_rank(c) not in (None, c.rank - 1)):
        return None  # a LayerNorm over fewer dimensions than (C, H, W) has no format-keeping version
    modules = c.instances(typ.__name__)
    return swap(c, modules, typ, SWAPS,
                 f"{c.what} runs inside {modules[0]}{and_more(modules)}, {article(typ.__name__)} {typ.__name__}, "
                 f"whose own computation writes it off the {c.cl_name} format; the replacement computes the same "
                 "values and keeps the format")


def _normalized_rank(c: CauseView) -> int | None:
    """How many trailing dimensions the layer norm the cause stands for normalizes, as its
    recorded weight shows (None where it ran without one, or is no layer norm)."""
    if not c.tracer.op[c.forward].startswith("aten.native_layer_norm"):
        return None
    ins, _ = c.shapes(c.forward)
    return len(ins[1]) if len(ins) >= 2 else None


def torch_module_type(name: str, table) -> type | None:
    """The torch module type of ``table`` named ``name`` (a recorded ``module_type``)."""
    return next((t for t in table if t.__name__ == name and t.__module__.startswith("torch.nn")), None)


def swap(c: CauseView, modules: list[str], typ: type, table, why: str) -> Proposal:
    lines = [f"{module_expr(m)} = {KEEP_FORMAT}({module_expr(m)})" for m in modules]
    more = f"  # and {len(lines) - 1} more like it" if len(lines) > 1 else ""
    return Proposal(SwapModules, why, suggestion=lines[0] + more, change=SwapModules(tuple(modules), table))


def article(word: str) -> str:
    return "an" if word[:1].lower() in "aeiou" else "a"


def and_more(modules: list[str]) -> str:
    return f" and {len(modules) - 1} more like it" if len(modules) > 1 else ""


@register_fix("module swap")
def _module_swap_fix(c: CauseView) -> Proposal | None:
    typ = torch_module_type(c.module_type, SWAPS)
    if typ is None:
        return None
    return swap(c, c.instances(typ.__name__), typ, SWAPS,
                 f"{c.row.fix} ({c.what}); the replacement computes the same values in the same format")


@register_fix("convolution as a Conv2d")
def _conv_swap_fix(c: CauseView) -> Proposal | None:
    """A convolution without a channels_last kernel for its shape whose sums another convolution
    that has one computes: a Conv3d that spans time only, (k, 1, 1), as a Conv2d over (T, H·W);
    one that spans space only, (1, kh, kw), as a Conv2d over each frame (or every s-th). The
    swap names the cause's convolutions that span one of them, and says which it leaves; the
    others at its line, fed another format by the first, are tried: those that lose the format
    when fed it are swapped too (:func:`~._keep_format.loses_format`, where the model is at hand)."""
    typ = torch_module_type(c.module_type, CONV_SWAPS)
    if typ is None:
        return None
    losing, symptoms = _recorded_convs(c)
    swappable = {m: span for m, (span, _, _) in losing.items() if span}
    if not swappable:
        return None
    left = [f"{m} {kernel}" for m, (span, kernel, _) in losing.items() if not span]
    spans = list(dict.fromkeys(swappable.values()))
    sizes = ", ".join(dict.fromkeys(str(losing[m][1]) for m in swappable))
    how = (f"its kernel {sizes} spans {spans[0]}" if len(swappable) == 1 else
           f"their kernels {sizes} span {' or '.join(spans)}") + f", so {' or '.join(SPANS[s] for s in spans)}"
    leaves = f"; it leaves {', '.join(left)}, which span time and space" if left else ""
    latent = tuple((m, shape) for m, (span, _, shape) in symptoms.items() if span)
    tries = (f"; of the {len(latent)} more at its line that were fed another format, it swaps those that lose "
             "the format when fed it") if latent else ""
    proposal = swap(c, list(swappable), typ, CONV_SWAPS,
                     f"{c.row.fix.rsplit(': ', 1)[0]}: {how} computes the same sums, and has a "
                     f"{c.cl_name.replace('_3d', '')} kernel{leaves}{tries}")
    return replace(proposal, change=replace(proposal.change, latent=latent, threads=c.threads))


@register_fix("a Conv1d over a map's positions as a Conv2d")
def _positions_conv_fix(c: CauseView) -> Proposal | None:
    """A ``Conv1d`` fed a flattened channels_last map (its channels innermost, as ``flatten(2)``
    leaves them) writes contiguous, so the map made of its output meets the convolutions in
    another format: computed as a ``Conv2d`` over the (N, C, 1, L) view
    (:class:`~._keep_format.PositionsConv`), it keeps the channels innermost."""
    if torch_module_type(c.module_type, CONV_SWAPS) is not torch.nn.Conv1d:
        return None
    rows = [r for r in c.tracer.input_rows(c.forward) if c.tracer.arg[r] not in ("weight", "bias")]
    if not rows or c.tracer.ndim[rows[0]] != 3:
        return None
    shape, strides = parse_tuple(c.tracer.shape[rows[0]]), parse_tuple(str(c.view.tensors["strides"].iat[rows[0]]))
    if shape[1] == 1 or strides[1] != 1:
        return None
    ops = c.view.ops
    conv1d = set(ops.loc[ops["module_type"].astype(str) == "Conv1d", "module"].astype(str))
    modules = [m for m in c.instances("Conv1d") if m in conv1d]  # a map's convolution at the line is no Conv1d
    return swap(c, modules, torch.nn.Conv1d, CONV_SWAPS,
                f"{c.row.fix.rsplit(': ', 1)[0]}: the Conv1d reads a flattened {c.cl_name} map, its channels "
                f"innermost, and writes contiguous; the same sums computed as a Conv2d over its (N, C, 1, L) "
                f"view keep the channels innermost")


#: what a Conv3d that spans one of these alone is computed as (:mod:`._keep_format`)
SPANS = {"time only": "a Conv2d over (T, H·W)", "space only": "a Conv2d over each frame"}


def _recorded_convs(c: CauseView) -> tuple[dict, dict]:
    """The 3-D convolutions at the cause's line, by module, each as (what it spans alone, its
    kernel, the input shape it was fed), read from recorded shapes: (the cause's that do what
    its first does (lose the format), those fed another format than channels_last there, which
    cannot show whether they would keep it)."""
    same, other = {}, {}
    fseq, kind, view = c.tracer.forward_seq, c.view.kind, c.view
    f = c.forward
    at_line = np.flatnonzero((view.op == view.op[f]) & (view.phase == "forward") & (view.source == view.source[f]))
    fed_other = [int(e) for e in at_line if str(view.ops.at[int(e), "in_format"]) != c.cl_name]
    for m in [*c.members, *fed_other]:
        e = int(fseq[m]) if fseq[m] >= 0 else m
        w = c.tracer.weight_row(e)
        ins, outs = c.shapes(e)
        if w < 0 or not ins or not outs or len(ins[0]) != 5:
            continue
        kernel, into, out = parse_tuple(c.tracer.shape[w])[2:], ins[0][2:], outs[0][2:]
        # a dimension a convolution leaves alone: kernel 1, and as many outputs as inputs
        # (stride 1, no padding); frames it may also take every s-th of (no more outputs than
        # inputs: no padding), each a Conv2d
        alone = [kernel[d] == 1 and into[d] == out[d] for d in range(3)]
        span = "time only" if alone[1] and alone[2] else "space only" if kernel[0] == 1 and out[0] <= into[0] else ""
        found = same if m in c.members and kind[m] == kind[c.e] else other
        found.setdefault(str(view.ops.at[e, "module"]), (span, kernel, ins[0]))
    return same, {m: v for m, v in other.items() if m not in same}


@register_fix("weight converted")
def _conv_weight_fix(c: CauseView) -> Proposal:
    modules = c.member_modules()
    more = f"  # and {len(modules) - 1} more like it" if len(modules) > 1 else ""
    return Proposal(ConvertWeights, f"{c.module} stores its weight in another format than it computes in and permutes it "
                            f"every step ({c.what}); store it {c.cl_name}",
                    suggestion=f"auditor.convert_conv{c.rank - 2}d_weight_memory_format({module_expr(c.module)}, "
                               f"torch.{c.cl_name}){more}", change=ConvertWeights(tuple(modules)))
