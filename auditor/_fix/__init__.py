"""Fixes (internal): what to change once the analysis says where data is permuted.

The framework of a fix: the kinds of change, one frozen class each (``_changes``); a cause's
proposal and its candidate rewrites (``_proposal``); every generator and variant declared by
name and order (``_variants``) and bound to its code (``_registry``); the libcst core of a
statement edit (``_syntax``, ``_statements``, imported when a fix is first proposed). The
generators, one module per family beside its rewrites (``_generators``). Making fixes and the
exposed-causes loop (``_making``), source edits in memory and as a patch (``_patch``), the proof
(``_prove``, ``_verify``) and the facade (``_suggest``). Beside them: conversion helpers
(``_convert``), per-convolution formats and hooks (``_hooks``), format-keeping modules and op
replacements (``_keep_format``, ``_replace``, ``_roi_align``, ``_matmul``, ``_restride``).
Imports the analysis, display, measuring and the ``Audit`` facade and session; never the planner
or the entry points. The package itself exports nothing: the names users call are on
:mod:`auditor`.
"""
