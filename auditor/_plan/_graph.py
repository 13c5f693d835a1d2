"""The data flow a plan works on: the calls of the planned convolutions and the edges where
data passes from one region to another, read off a channels_last audit's flow graph."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from .._analysis._activations import parse_tuple
from .._analysis._flow import FlowView
from .._recording import _rules as rules
from .._recording._formats import base_format
from .._result import Audit

#: a source of data whose format no plan changes: ("fixed", format label)
FIXED = "fixed"


#: a copy asked for one of these writes it whatever it reads
EXPLICIT_FORMATS = ("contiguous_format", "channels_last", "channels_last_3d")


@dataclass
class Call:
    """One call of a planned convolution, as recorded."""

    module: str
    seq: int
    input_shape: tuple
    dtype: torch.dtype
    input_label: str
    source: tuple  # ("conv", module) or (FIXED, label)
    input_bytes: int
    from_model_input: bool  # reads the model's input: needs no input gradient


@dataclass
class Edge:
    """Data that passes from one region to another: converted when their formats differ."""

    a: str  # a conv module, or None for a fixed source
    b: str
    fixed: str  # the fixed source's format when a is None
    where: str
    kind: str
    shape: tuple
    dtype: torch.dtype
    nbytes: int


def sources(flow: FlowView, planned: set[str], given_format: str) -> list:
    """For every event: where the format of its result comes from.

    A planned convolution is its own source; an op that writes one format whatever it reads
    (a loss, a copy with an explicit ``memory_format``, as seen in the channels_last audit) is a
    fixed source; any other op takes the source of its first activation input (the operand
    TensorIterator follows, so a ``cat`` or ``mul`` of mixed peers is not a source); the model's
    inputs are a fixed source in the format they are given.
    """
    n = len(flow.ops)
    src: list = [None] * n
    requested = flow.ops["requested_format"].astype(str).to_numpy()
    for e in range(n):
        if flow.is_conv[e] and flow.module[e] in planned:
            src[e] = ("conv", flow.module[e])
            continue
        forces = flow.kind[e] == rules.LOSES or (
            rules.op_packet(flow.op[e]) in rules.COPY_OPS and requested[e] in EXPLICIT_FORMATS)
        if not flow.is_conv[e] and forces and flow.kind[e] in rules.COSTLY_KINDS:
            src[e] = (FIXED, base_format(str(flow.ops.at[e, "to_format"])))
            continue
        prods = flow.input_producers(e)
        if prods:
            src[e] = src[prods[0]] if prods[0] >= 0 else (FIXED, given_format)
    return src


def owned_time_us(a: Audit, planned: set[str], given_format: str) -> dict[str, float]:
    """Time of the non-convolution ops of one timed audit, per planned convolution whose
    output they process (the convolution that decides the layout they run in)."""
    flow = FlowView(a.ops(), a.flow())
    src = sources(flow, planned, given_format)
    dur = a.events["duration_us"].to_numpy()
    out: dict[str, float] = {}
    for e in range(len(src)):
        if flow.is_conv[e] and flow.module[e] in planned:
            continue
        prods = flow.input_producers(e)
        owner = src[prods[0]] if prods and prods[0] >= 0 else None
        if owner and owner[0] == "conv" and not math.isnan(dur[e]):
            out[owner[1]] = out.get(owner[1], 0.0) + float(dur[e])
    return out


def plan_graph(flow: FlowView, planned: set[str], given_format: str) -> tuple[list[Call], list[Edge]]:
    """Calls of the planned convolutions and the edges between regions, from the forward
    phase of the channels_last audit."""
    src = sources(flow, planned, given_format)
    t = flow.tensors
    shape, label = t["shape"].astype(str).to_numpy(), t["format"].astype(str).to_numpy()
    dtype, nbytes, ndim = t["dtype"].astype(str).to_numpy(), t["bytes"].to_numpy(), t["ndim"].to_numpy()
    calls, edges = [], []
    forward = np.flatnonzero(flow.phase == "forward")
    for e in forward:
        e = int(e)
        rows = flow.act_rows.get(e, [])
        if not rows:
            continue
        prods = flow.input_producers(e)
        if flow.is_conv[e] and flow.module[e] in planned:
            r, p = rows[0], prods[0]
            s = src[p] if p >= 0 else (FIXED, given_format)
            call = Call(flow.module[e], e, parse_tuple(shape[r]), getattr(torch, dtype[r]), label[r], s,
                         int(nbytes[r]), p < 0)
            calls.append(call)
            if base_format(label[r]) == "ambiguous" or s is None:
                continue
            edges.append(Edge(s[1] if s[0] == "conv" else None, call.module, s[1] if s[0] == FIXED else "",
                               call.module, "conv input", call.input_shape, call.dtype, call.input_bytes))
            continue
        if flow.is_conv[e] or len(rows) < 2 or (src[e] is not None and src[e][0] == FIXED):
            continue
        # peers (add, mul, cat): each operand in another format than the first is converted
        first = src[prods[0]] if prods[0] >= 0 else None
        if first is None or first[0] != "conv":
            continue
        for r, p in zip(rows[1:], prods[1:]):
            if p < 0 or ndim[r] not in (4, 5) or shape[r] != shape[rows[0]]:
                continue
            s = src[p]
            if s is None or s == first or base_format(label[r]) not in ("contiguous", "channels_last", "channels_last_3d"):
                continue
            a = s[1] if s[0] == "conv" else None
            edges.append(Edge(a, first[1], s[1] if s[0] == FIXED else "", f"{flow.module[e]}: {flow.op[e]}",
                               "peer operand", parse_tuple(shape[r]), getattr(torch, dtype[r]), int(nbytes[r])))
    return calls, edges


def hotspot_edges(a: Audit) -> list[Edge]:
    """One edge per costly op of the channels_last audit, so each gets a measured time."""
    ops = a.ops()
    t = a.tensors
    first_in = t[t["role"] == "input"].drop_duplicates("seq").set_index("seq")
    out = []
    for e in np.flatnonzero(ops["hotspot"].to_numpy()):
        if e not in first_in.index:
            continue
        r = first_in.loc[e]
        shape = parse_tuple(str(r["shape"]))
        if len(shape) not in (4, 5):
            continue
        out.append(Edge(None, str(ops.at[e, "module"]), "", f"{ops.at[e, 'module']}: {ops.at[e, 'op']}",
                         f"hotspot ({ops.at[e, 'phase']})", shape, getattr(torch, str(r["dtype"])),
                         int(ops.at[e, "bytes"])))
    return out
