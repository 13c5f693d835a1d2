"""Joins: a tensor made from no image joins the path of the images. Its fix is the first of the
registered variants' candidate rewrites that :meth:`Fixes.verify` proves on the model."""

from __future__ import annotations

from ..._display._text import short_source
from .._changes import (
    EditSource,
)
from .._proposal import Candidate, CauseView, Proposal
from .._registry import register_fix, variants
from .._statements import (
    functions_at,
)
from ._join_reach import (
    weight_in_reach,
)
from ._regions import own_convolutions


@register_fix("joins")
def _joins_fix(c: CauseView) -> Proposal:
    """A token or row tensor made into a map: the rewrites the recorded shapes and strides allow
    (the map written in NHWC order, the copy of a channels_last view dropped, the product that
    makes the map computed transposed), each also in the form that follows the format of a
    convolution weight the line can reach, proposed as candidates that :meth:`Fixes.verify`
    proves on the model; without one, by hand."""
    at = short_source(c.source) if c.source else c.module
    candidates = _join_candidates(c)
    line = c.source_line()
    if candidates:
        labels = "; ".join(x.label for x in candidates)
        return Proposal(EditSource, c.row.fix, line=candidates[0].line, candidates=tuple(candidates),
                        reason=f"{len(candidates)} candidate rewrite{'s' * (len(candidates) > 1)} ({labels}) "
                               "exact only for some shapes: Fixes.verify(model, *inputs) proves one on this model "
                               "or drops them")
    if own_convolutions(c)[0]:
        return None  # the map's own convolutions, kept contiguous, are the next generator's fix
    return Proposal(EditSource, c.row.fix, line=line, reason=f"{_made_from(c)} at {at}, and no rewrite of its "
                                                       "statement is known to make it a map in the format")


def _join_candidates(c: CauseView) -> list[Candidate]:
    """The candidate rewrites of a join (:func:`_joins_fix`) its variants' detectors find in the
    recorded shapes and strides, in the declared order."""
    weight = weight_in_reach(c, functions_at(c.path, c.lineno)) if c.path else None
    found: list[Candidate] = []
    for _, detect in variants(c.pattern):
        found += [x for x in detect(c, weight) if x is not None]
    return found


def _made_from(c: CauseView) -> str:
    """What the recording shows of the tensor that joined the path: the op that made it, its
    shape, and the shapes of the tensors it was made from (none of them an image)."""
    ins, outs = c.shapes(c.e)
    op = str(c.tracer.op[c.e]).removeprefix("aten.").removesuffix(".default")
    made = "x".join(map(str, outs[0])) if outs else "?"
    what = "a map" if outs and len(outs[0]) == c.rank else "a tensor"
    sources = ", ".join("x".join(map(str, s)) or "a scalar" for s in ins)
    of = (f"from tensors shaped {sources}, none of them an image of the convolutions," if ins
          else "from no tensor (a new one)")
    phase = "in backward " if c.view.phase[c.e] != "forward" else ""
    return f"{op} {phase}makes {what} ({made}) {of}"
