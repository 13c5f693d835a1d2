"""Two audits of one model, lined up event by event (the same model in two memory formats).

An event is named by (phase, module, op, source line, and how many events with those four came
before it): the same op of the same step in both audits, wherever the two logs differ in
between. Compared from the ``kind`` of each event, so that a conversion the analyzer calls a
hotspot in the channels_last audit can be looked up in the all-contiguous one.
"""

from __future__ import annotations

from collections import defaultdict

import auditor

#: kinds of op that write data in another order than they read
MOVES = ("loses", "converts", "restores")


def event_keys(ops) -> list[tuple]:
    """Per event of ``Audit.ops()``: (phase, module, op, source, occurrence)."""
    seen: dict[tuple, int] = defaultdict(int)
    keys = []
    for key in zip(*(ops[c].astype(str) for c in ("phase", "module", "op", "source"))):
        keys.append((*key, seen[key]))
        seen[key] += 1
    return keys


def hotspots_moving_in(a: auditor.Audit, other: auditor.Audit) -> list[tuple]:
    """The hotspot ops of ``a`` whose event in ``other`` moves data the same way (loses,
    converts or restores, the same kind): made whatever the layout, so no format problem of
    ``a``'s. A convolution's backward that converts its input in one layout and loses its
    gradient in the other moves two different tensors: not the same conversion."""
    ops, theirs = a.ops(), other.ops()
    where = {k: i for i, k in enumerate(event_keys(theirs))}
    kind = theirs["kind"].astype(str).to_numpy()
    hot = ops["hotspot"].to_numpy()
    found = []
    for i, key in enumerate(event_keys(ops)):
        j = where.get(key)
        if hot[i] and j is not None and kind[j] in MOVES and kind[j] == str(ops["kind"].iat[i]):
            found.append((*key, str(ops["kind"].iat[i]), kind[j]))
    return found
