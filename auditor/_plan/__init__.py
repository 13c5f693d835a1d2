"""Measured layout plans (internal): which convolutions to run channels_last, and where to convert.

Converting a whole model to channels_last does not always pay: some convolutions run faster
contiguous on a given device, dtype and shape, and every op without a channels_last kernel
costs a copy. :func:`plan_layout` measures instead of guessing:

1. it audits the model in channels_last to learn the data flow: which convolution feeds which,
   through which ops, and where an op forces a format (a loss, an explicit ``.contiguous()``);
2. it times every convolution alone, with its recorded input shape, dtype, groups, stride and
   padding, in both formats (median of several runs, forward, or forward + backward for
   training), the other ops from ``record_time`` audits in both formats, attributed to the
   convolution whose output they process, and each conversion the plan might need;
3. it picks a format per convolution minimising the sum of those times plus the conversions at
   the borders of same-format regions (an exact minimum cut: two formats, pairwise costs);
4. it times the whole model end to end for the plan, all contiguous and all channels_last,
   inputs converted inside the timed call, and keeps the fastest, so a cost model that misses
   something can never make the model slower than the better uniform format.

:func:`apply_plan` applies the result in place: weights with :mod:`auditor._fix`'s helpers and
input conversions with forward pre-hooks at region borders, so the model still takes a plain
contiguous batch. It then re-audits a copy and reports hotspot bytes before and after.

The package owns the plan's data flow (``_graph``), applying formats to a model (``_assign``),
the minimum cut (``_cut``), the measurements (``_measure``, timed through :mod:`auditor._measure`),
checking outputs (``_check``), the plan itself (``_layout``) and applying it (``_apply``). It
imports the fixes, the analysis, the session and the measuring harness; nothing below imports it.
The package itself exports nothing: :func:`auditor.plan_layout` and :func:`auditor.apply_plan` are
the public entry points.
"""
