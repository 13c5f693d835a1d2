"""Analysis: stateless analyzers over the event log's DataFrames.

Owns the activation mask (``activations``), the per-event classification (``classify``), the
one data-flow graph (``flow``), hotspots (``hotspots``), causes (``causes``) and the summaries
(``summaries``). Imports :mod:`auditor.recording` only; every function takes DataFrames and
returns DataFrames or plain arrays, and display is someone else's job.
"""

from .activations import activation_inputs, floating_rows, is_floating_dtype
from .causes import CauseTracer
from .classify import classify
from .flow import FlowGraph, FlowView, flow_links, reachable, view_roots
from .hotspots import HOTSPOT_COLUMNS, HOTSPOT_KEYS, hotspots, ops_table
from .summaries import coverage, diff, module_at_depth, naive_losses, summary

__all__ = [
    "HOTSPOT_COLUMNS",
    "HOTSPOT_KEYS",
    "CauseTracer",
    "FlowGraph",
    "FlowView",
    "activation_inputs",
    "classify",
    "coverage",
    "diff",
    "floating_rows",
    "flow_links",
    "hotspots",
    "is_floating_dtype",
    "module_at_depth",
    "naive_losses",
    "ops_table",
    "reachable",
    "summary",
    "view_roots",
]
