"""Analysis: stateless analyzers over the event log's DataFrames.

Owns what an image is (``activations``), the per-event classification (``classification``),
the one data-flow graph (``flow``), the ops table and its hotspots on conv -> conv paths
(``paths``), causes (``causes``) and the summaries (``summaries``). Imports :mod:`auditor._recording` only; every function takes DataFrames and
returns DataFrames or plain arrays, and display is someone else's job.
"""

from ._activations import (
    activation_inputs,
    floating_rows,
    image_facts,
    is_floating_dtype,
    parse_tuple,
)
from ._causes import CAUSE_COLUMNS, CauseTracer, cause_table
from ._classification import classify
from ._flow import FlowGraph, FlowView, flow_links, reachable, view_roots
from ._ops import HOTSPOT_COLUMNS, HOTSPOT_KEYS, hotspots
from ._patterns import PATTERNS, Pattern, fix_generators, pattern, register_fix, register_pattern
from ._pipeline import STAGES, Analysis, analyze, ops_table
from ._summaries import coverage, diff, diff_causes, module_at_depth, naive_losses, summary

__all__ = [
    "PATTERNS",
    "Pattern",
    "fix_generators",
    "pattern",
    "register_fix",
    "register_pattern",
    "STAGES",
    "Analysis",
    "analyze",
    "HOTSPOT_COLUMNS",
    "HOTSPOT_KEYS",
    "CAUSE_COLUMNS",
    "CauseTracer",
    "FlowGraph",
    "FlowView",
    "activation_inputs",
    "cause_table",
    "classify",
    "coverage",
    "diff",
    "diff_causes",
    "floating_rows",
    "flow_links",
    "hotspots",
    "image_facts",
    "is_floating_dtype",
    "module_at_depth",
    "naive_losses",
    "ops_table",
    "parse_tuple",
    "reachable",
    "summary",
    "view_roots",
]

