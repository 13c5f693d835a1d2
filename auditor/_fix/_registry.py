"""The fix generators, registered per cause pattern, and the variants of the ``joins`` family,
each under its name in the order :mod:`._variants` declares (not the order of a file).

The generators live in :mod:`._generators`, one module per family, loaded when a fix is first
proposed (they need libcst), not with the package.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import replace

from .._analysis import _patterns as patterns
from .._analysis._causes import CauseTracer
from .._analysis._flow import FlowView
from . import _variants as declared
from ._proposal import CauseView, Proposal

#: where the families' code is
_PACKAGE = "auditor._fix._generators"
#: declared name -> its code: a generator (cause view -> Proposal | None), or a variant's
#: detector (cause view, weight in reach -> candidates)
_CODE: dict[str, Callable] = {}


def _register(name: str, table: tuple[declared.Declared, ...]) -> Callable[[Callable], Callable]:
    found = declared.declared(name, table)

    def register(code: Callable) -> Callable:
        where = code.__module__.rpartition(".")[2]
        if where != found.family:
            raise ValueError(f"{name!r} is declared in {found.family}, not {where}")
        if name in _CODE and _CODE[name] is not code:
            raise ValueError(f"{name!r} is registered twice")
        _CODE[name] = code
        return code
    return register


def register_fix(name: str) -> Callable[[Callable], Callable]:
    """Decorator: the generator declared as ``name`` in :data:`._variants.GENERATORS`. A generator
    takes what the fix layer knows of one cause and returns a fix, or None when it does not
    apply, so the next one is tried."""
    return _register(name, declared.GENERATORS)


def register_variant(name: str) -> Callable[[Callable], Callable]:
    """Decorator: the detector of the variant declared as ``name`` in :data:`._variants.VARIANTS`:
    it takes the cause and the convolution weight its line can reach (or None) and yields the
    candidate rewrites the recorded shapes and strides allow (None for one that does not fit)."""
    return _register(name, declared.VARIANTS)


def _load() -> None:
    for family in dict.fromkeys(d.family for d in declared.GENERATORS + declared.VARIANTS):
        importlib.import_module(f"{_PACKAGE}.{family}")
    missing = [d.name for d in declared.GENERATORS + declared.VARIANTS if d.name not in _CODE]
    if missing:
        raise RuntimeError(f"declared fixes without code: {', '.join(missing)}")


def fix_generators(name: str) -> list[Callable]:
    """The generators declared for pattern ``name``, in the declared order."""
    patterns.pattern(name)
    _load()
    return [_CODE[d.name] for d in declared.GENERATORS if name in d.patterns]


def variants(family: str) -> list[tuple[declared.Declared, Callable]]:
    """The variants of pattern ``family``'s fix with their detectors, in the declared order."""
    patterns.pattern(family)
    _load()
    return [(d, _CODE[d.name]) for d in declared.VARIANTS if family in d.patterns]


def propose(view: FlowView, tracer: CauseTracer, row, threads: int | None = None) -> Proposal | None:
    """The fix for one cause: the first of its pattern's registered generators that has one, or
    None when no fix is known to help (``threads``: the audit's, see :class:`CauseView`)."""
    cause = CauseView(view, tracer, row, threads)
    for generate in fix_generators(row.pattern):
        found = generate(cause)
        if found is not None:
            note = tracer.size_notes.get(cause.e, "")  # a cause the audited size may have made
            if note and found.reason and note not in found.reason:
                found = replace(found, reason=f"{found.reason} ({note})")
            elif note and not found.reason:
                found = replace(found, detail=f"{found.detail} ({note})")
            return found
    return None
