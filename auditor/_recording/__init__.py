"""Recording (internal): what happened, op by op.

Owns the private torch entry points the package uses, behind one fence (``_torch``), the format
labels (``_formats``), the per-op rule (``_rules``) and the data flow's facts it replays for
strict mode (``_facts``), module attribution (``_modules``), the dispatch mode on the hot path
and the raw log it leaves (``_mode``), the profiler beside it (``_profile``), notebook cells'
names (``_cells``), the event-log schema and its DataFrames (``_log``), the CSV file (``_csv``),
the atomic writer every file goes through (``_files``), and for compiled audits the watch on
Inductor's lowering (``_inductor``, ``_inductor_graph``; imported only by a compiled audit).
Imports torch, numpy and pandas only: nothing here knows about data flow, reports or fixes.
Import what you need from its modules; the package itself exports nothing.
"""
