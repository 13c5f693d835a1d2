"""Measuring (internal): how two or more versions of a step are timed against each other on a
noisy machine.

Owns the timing harness (``_harness``: interleaved rounds, A B, B A, ..., on a chosen clock,
process CPU time at one thread, and steady memory to time on) and the decisions drawn from it
(``_decide``: the median of the paired ratios within rounds and its distribution-free
interval, and whether it clears a margin). The layout plan and the fix verification both measure
through it. Imports torch, numpy and pandas only. The package itself exports nothing.
"""
