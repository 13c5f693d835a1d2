"""Causes: the op at the root of each hotspot, where the data first left its format.

A hotspot is often a symptom: a convolution permutes its input because an op upstream wrote it
in another format. :class:`CauseTracer` follows the permuted operands back through the data
flow to that op.
"""

from __future__ import annotations

import numpy as np

from ..recording import rules
from ..recording.formats import base_format
from .flow import FlowView


class CauseTracer:
    """Traces hotspots of one audit back to their causes over its ops and flow graph."""

    def __init__(self, view: FlowView):
        self.view = view
        self.graph = view.graph
        self.kind, self.op, self.is_conv = view.kind, view.op, view.is_conv
        self._format = view.tensors["format"].to_numpy()

    def blamed_producers(self, e: int) -> list[int]:
        """Producers (any phase) of the operands to blame for costly op ``e``: the ones stored
        in a definite format other than channels_last. A convolution or a restore permuted
        them; an op whose peers came in mixed formats (``cat``, ``mul``) converted them or
        followed them, whichever operand came first."""
        return [int(self.graph.producer[r]) for r in self.graph.act_rows.get(e, [])
                if base_format(str(self._format[r])) in ("contiguous", "other")]

    def cause(self, e: int) -> int:
        """The costly op at the root of hotspot ``e``: follow the operands it permuted back
        through views and format-preserving ops to the op that first wrote them in the wrong
        format. An op is its own cause when nothing upstream explains it."""
        seen = set()
        while e not in seen:
            seen.add(e)
            nxt = None
            peer = self.kind[e] == rules.CONVERTS and rules.op_packet(self.op[e]) not in rules.COPY_OPS
            if self.is_conv[e] or peer or self.kind[e] == rules.RESTORES:
                for p in self.blamed_producers(e):
                    c = self._costly_upstream(p)
                    if c is not None:
                        nxt = c
                        break
            if nxt is None:
                return e
            e = nxt
        return e

    def _costly_upstream(self, p: int) -> int | None:
        """Walk back from producer ``p`` along first activation inputs to a costly non-conv op."""
        steps = 0
        while p >= 0 and steps < 10_000:
            if self.is_conv[p]:
                return p if self.kind[p] in rules.COSTLY_KINDS else None
            if self.kind[p] in rules.COSTLY_KINDS:
                return p
            prods = self.graph.input_producers(p, same_phase=False)
            p = prods[0] if prods else -1
            steps += 1
        return None

    def causes_of(self, events: np.ndarray) -> dict[int, int]:
        """``{hotspot event: its cause event}`` for every event of ``events``."""
        return {int(e): self.cause(int(e)) for e in events}
