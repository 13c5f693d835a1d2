"""Analysis (internal): stateless analyzers over the event log's DataFrames.

Owns what an image is (``_activations``), the per-event classification (``_classification``),
the one data-flow graph (``_flow``), the ops table and its hotspots on conv -> conv paths
(``_ops``), what the format costs and what a fix saves, and whether to trust that estimate
(``_costs``), the cause patterns (``_patterns``), the causes (``_causes``), the summaries
(``_summaries``), the one pipeline that runs them (``_pipeline``) and the compiled step's tables
(``_compiled``). Imports :mod:`auditor._recording` only; every function takes DataFrames and
returns DataFrames or plain arrays, and display is someone else's job. The package itself
exports nothing.
"""
