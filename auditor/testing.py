"""A guard for users' own test suites: fail when a change brings a format loss back.

    from auditor.testing import assert_no_hotspots
    assert_no_hotspots(model, x)                                 # forward only, by default
    assert_no_hotspots(model, x, phases=("forward", "backward"), allow=["head.*"])

The pytest fixture ``format_audit`` (registered by this package's ``pytest11`` entry point)
does the same for any block of code.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Iterable

import pandas as pd

from ._api import audit
from ._display._text import short_source
from ._display._units import format_bytes
from ._result import Audit
from ._session import FormatAuditor

__all__ = ["assert_no_hotspots", "unexpected_hotspots"]

_PHASES = ("forward", "backward", "other")

#: ``allow`` entries: a glob matched against the module and against the op of a hotspot, or a
#: predicate on its row of ``Audit.hotspots()``.
Allow = str | Callable[[pd.Series], bool]


def _check_phases(phases: Iterable[str]) -> tuple[str, ...]:
    phases = (phases,) if isinstance(phases, str) else tuple(phases)
    bad = [p for p in phases if p not in _PHASES]
    if bad or not phases:
        raise ValueError(f"phases must be a non-empty subset of {_PHASES}, got {phases!r}")
    return phases


def unexpected_hotspots(a: Audit, phases: Iterable[str] = ("forward",), allow: Iterable[Allow] = ()) -> pd.DataFrame:
    """The hotspot groups of ``a`` in ``phases`` that no ``allow`` entry matches."""
    phases = _check_phases(phases)
    allow = list(allow)
    hot = a.hotspots()
    hot = hot[hot["phase"].isin(phases)]

    def allowed(row: pd.Series) -> bool:
        for rule in allow:
            if callable(rule):
                if rule(row):
                    return True
            elif fnmatch.fnmatchcase(row["module"], rule) or fnmatch.fnmatchcase(row["op"], rule):
                return True
        return False

    if allow and len(hot):
        hot = hot[~hot.apply(allowed, axis=1)]
    return hot.reset_index(drop=True)


def check_audit(a: Audit, phases: Iterable[str] = ("forward",), allow: Iterable[Allow] = ()) -> None:
    """Raise ``AssertionError`` naming every unexpected hotspot's module and op."""
    __tracebackhide__ = True  # pytest shows the user's test failing, not this library's frames
    bad = unexpected_hotspots(a, phases, allow)
    if bad.empty:
        return
    lines = [f"{len(bad)} unexpected channels_last hotspot group(s) in {', '.join(_check_phases(phases))}:"]
    for r in bad.itertuples():
        where = f" at {short_source(r.source)}" if r.source else ""
        lines.append(
            f"  {r.phase}: module '{r.module}' ({r.module_type}) op {r.op} {r.kind} "
            f"{r.from_format} -> {r.to_format}, {r.count}x, {format_bytes(r.bytes)}{where}"
        )
    lines += ["", a.report()]
    raise AssertionError("\n".join(lines))


def assert_no_hotspots(
    model: Callable,
    *inputs,
    phases: Iterable[str] = ("forward",),
    allow: Iterable[Allow] = (),
    record_source: bool = True,
    **audit_kwargs,
) -> Audit:
    """Audit one step of ``model`` and fail if a hotspot appears in ``phases`` that ``allow``
    does not excuse. The backward pass runs only when a backward phase is checked. Returns
    the audit, for further checks."""
    __tracebackhide__ = True
    phases = _check_phases(phases)
    audit_kwargs.setdefault("backward", "backward" in phases)
    a = audit(model, *inputs, record_source=record_source, **audit_kwargs)
    check_audit(a, phases, allow)
    return a


class BlockGuard:
    """What the ``format_audit`` fixture gives: ``with format_audit(): ...`` records the block
    and fails the test at its end if a hotspot appears. ``.audit`` is the last block's audit."""

    def __init__(self):
        self.audit: Audit | None = None

    def __call__(self, phases: Iterable[str] = ("forward", "backward"), allow: Iterable[Allow] = (),
                 record_source: bool = True):
        return _GuardedBlock(self, _check_phases(phases), list(allow), record_source)


class _GuardedBlock:
    def __init__(self, owner: BlockGuard, phases, allow, record_source: bool):
        self.owner, self.phases, self.allow = owner, phases, allow
        self.recorder = FormatAuditor(record_source=record_source)

    def __enter__(self) -> FormatAuditor:
        return self.recorder.__enter__()

    def __exit__(self, exc_type, exc, tb):
        __tracebackhide__ = True
        self.recorder.__exit__(exc_type, exc, tb)
        self.owner.audit = self.recorder.audit
        if exc_type is None:
            check_audit(self.owner.audit, self.phases, self.allow)
        return False
