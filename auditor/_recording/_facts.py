"""Replaying the data flow's facts op by op: what every tensor is when it is written.

:class:`FactsReplay` applies :func:`auditor._recording._rules.flow_facts` to the ops in the order
they ran. ``strict=True`` steps it online, as each op runs; the analyzer steps it over the log
afterwards (``auditor._analysis.image_facts``). Both key tensors by their identity in the log, so
the two can never disagree.

Besides each op's own rule it follows memory: a view taken of a buffer that an image was
written into (autograd builds gradients in a flat buffer, then views it) holds that image too.
And it follows an image through a decomposed Linear over its channels: the 2-D rows a reshape
makes of it, the rows ``mm``/``addmm`` write from them, and the reshape of those back to the
image's sizes (:class:`auditor._recording._rules.Rows`), which is the image again, as the
undecomposed ``aten.linear`` of inference_mode says in one op.
"""

from __future__ import annotations

from ._formats import channel_dim, channel_label
from ._rules import (
    Facts,
    Rows,
    TensorSig,
    definite,
    flow_facts,
    image_of_rows,
    moves_rows,
    plain_facts,
    rows_written,
)


class FactsReplay:
    """The facts of every tensor seen so far, keyed by tensor identity.

    ``step(op, inputs, outputs)`` takes each input and result as (key, TensorSig without
    facts) and returns (input facts, result facts). Calls with the same op and the same facts
    share one call of the rule.
    """

    def __init__(self):
        self.known: dict[object, Facts] = {}  # tensor key -> facts of its last write
        self.root: dict[object, object] = {}  # tensor key -> the key of the buffer it views
        self.held: dict[object, tuple] = {}  # buffer key -> (facts, shape, strides) of the image written in it
        self.rows: dict[object, Rows] = {}  # tensor key -> the image rows it holds
        self._memo: dict[tuple, tuple[Facts, ...]] = {}
        self._moves_rows: dict[str, bool] = {}

    def facts_of(self, key, sig: TensorSig) -> Facts:
        found = self.known.get(key)
        return found if found is not None else plain_facts(sig)

    def step(self, op: str, inputs: list[tuple], outputs: list[tuple]) -> tuple[list[Facts], tuple[Facts, ...]]:
        in_facts = [self.facts_of(k, s) for k, s in inputs]
        if not outputs:
            return in_facts, ()
        memo_key = (op, tuple(zip((s for _, s in inputs), in_facts)), tuple(s for _, s in outputs))
        out_facts = self._memo.get(memo_key)
        if out_facts is None:
            sigs = tuple(s.with_facts(f) for (_, s), f in zip(inputs, in_facts)) + tuple(s for _, s in outputs)
            out_facts = self._memo[memo_key] = flow_facts(op, sigs)
        moves = self._moves_rows.get(op)
        if moves is None:
            moves = self._moves_rows[op] = moves_rows(op)
        if moves:
            out_facts = self._through_rows(op, inputs, in_facts, outputs, out_facts)
        elif self.rows:
            for key, _ in outputs:  # a new write of that tensor holds no rows
                if all(key != k for k, _ in inputs):
                    self.rows.pop(key, None)
        base = inputs[0][0] if inputs else None
        result = []
        for (key, sig), facts in zip(outputs, out_facts):
            if key not in self.root:
                self.root[key] = self.root.get(base, base) if sig.is_view and base is not None else key
            buffer = self.root[key]
            if facts.image:
                self.held[buffer] = (facts, sig.shape, sig.strides)
            elif sig.is_view and buffer in self.held:
                facts = _view_of_held(self.held[buffer], sig) or facts
            self.known[key] = facts
            result.append(facts)
        return in_facts, tuple(result)

    def _through_rows(self, op: str, inputs, in_facts, outputs, out_facts) -> tuple[Facts, ...]:
        """The rows each result holds (remembered), and the image a reshape of rows makes."""
        ins = [(sig.with_facts(f), self.rows.get(key)) for (key, sig), f in zip(inputs, in_facts)]
        result = list(out_facts)
        for i, (key, sig) in enumerate(outputs):
            rows = rows_written(op, ins, sig)
            if rows is not None:
                self.rows[key] = rows
                continue
            self.rows.pop(key, None)
            if ins and ins[0][1] is not None:
                facts = image_of_rows(op, ins[0][1], sig)
                if facts is not None:
                    result[i] = facts
        return tuple(result)


def _view_of_held(held: tuple, sig: TensorSig) -> Facts | None:
    """The facts of a view of a buffer whose image was written through another view."""
    facts, shape, strides = held
    if not sig.floating or len(sig.shape) not in (4, 5):
        return None
    cdim = channel_dim(shape, strides, facts.cdim, sig.shape, sig.strides, True)
    if cdim is None:
        return None
    label = channel_label(sig.shape, sig.strides, cdim, facts.rank)
    return Facts(True, cdim, facts.rank, label, definite(label) or facts.effective)
