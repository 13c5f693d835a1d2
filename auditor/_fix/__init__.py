"""Fixes (internal): what to change once the analysis says where data is permuted.

Owns the conversion helpers (``_convert``), per-convolution formats and input-format hooks
(``_hooks``), drop-in modules that keep the format (``_keep_format``), the statement rewrites
each pattern's fix makes (``_rewrite``, libcst, imported when a fix is first proposed), the fix
generators registered per pattern (``_generators``), source edits applied in memory and as a
patch (``_patch``), proving a fix (``_verify``) and the suggested fixes (``_suggest``). Imports
the analysis, display, measuring and the ``Audit`` facade and session; never the planner or the
entry points. The package itself exports nothing: the names users call are on :mod:`auditor`.
"""
