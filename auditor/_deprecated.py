"""Import paths that moved, still importable with a ``DeprecationWarning``.

The modules of release 0.1 (``auditor.formats``, ``auditor.rules``, ``auditor.recorder``,
``auditor.log``) and the modules that went private (``auditor.recording.mode`` is now
``auditor.recording._mode``): the supported names are each package's ``__all__``. Importing an
old path gives the module at its new one, once warned.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings

#: old module path -> the module it now is
MOVED = {
    "auditor.analysis.activations": "auditor.analysis._activations",
    "auditor.analysis.causes": "auditor.analysis._causes",
    "auditor.analysis.classification": "auditor.analysis._classification",
    "auditor.analysis.flow": "auditor.analysis._flow",
    "auditor.analysis.paths": "auditor.analysis._ops",
    "auditor.analysis.summaries": "auditor.analysis._summaries",
    "auditor.analysis.timing": "auditor.analysis._costs",
    "auditor.api": "auditor._api",
    "auditor.display.html": "auditor.display._html",
    "auditor.display.report": "auditor.display._report",
    "auditor.display.tables": "auditor.display._text",
    "auditor.display.trace": "auditor.display._trace",
    "auditor.display.units": "auditor.display._units",
    "auditor.distributed.buckets": "auditor.distributed._buckets",
    "auditor.distributed.files": "auditor.distributed._files",
    "auditor.distributed.grads": "auditor.distributed._grads",
    "auditor.distributed.rank_audits": "auditor.distributed._rank_audits",
    "auditor.fake": "auditor._fake",
    "auditor.fix.convert": "auditor.fix._convert",
    "auditor.fix.hooks": "auditor.fix._hooks",
    "auditor.fix.keep_format": "auditor.fix._keep_format",
    "auditor.fix.source": "auditor.fix._source_text",
    "auditor.fix.suggest": "auditor.fix._suggest",
    "auditor.formats": "auditor.recording._formats",
    "auditor.log": "auditor.recording._log",
    "auditor.plan.apply": "auditor.plan._apply",
    "auditor.plan.assign": "auditor.plan._assign",
    "auditor.plan.check": "auditor.plan._check",
    "auditor.plan.cut": "auditor.plan._cut",
    "auditor.plan.decide": "auditor.measure._decide",
    "auditor.plan.graph": "auditor.plan._graph",
    "auditor.plan.layout": "auditor.plan._layout",
    "auditor.plan.measure": "auditor.plan._measure",
    "auditor.plan.timing": "auditor.measure._harness",
    "auditor.recorder": "auditor.recording._mode",
    "auditor.recording.csvfile": "auditor.recording._csv",
    "auditor.recording.facts": "auditor.recording._facts",
    "auditor.recording.formats": "auditor.recording._formats",
    "auditor.recording.log": "auditor.recording._log",
    "auditor.recording.mode": "auditor.recording._mode",
    "auditor.recording.modules": "auditor.recording._modules",
    "auditor.recording.profile": "auditor.recording._profile",
    "auditor.recording.rules": "auditor.recording._rules",
    "auditor.recording.sources": "auditor.recording._cells",
    "auditor.result": "auditor._result",
    "auditor.rules": "auditor.recording._rules",
    "auditor.session": "auditor._session",
}


#: old ``package.NAME`` -> (module, name) of what it is now: names that misled
RENAMED = {
    "auditor.fix.CHANNELS_LAST": ("torch", "channels_last"),
    "auditor.fix.CHANNELS_LAST_3D": ("torch", "channels_last_3d"),
    "auditor.fix.CONTIGUOUS": ("torch", "contiguous_format"),
    "auditor.fix.CONVERSION_COLUMNS": ("auditor.fix", "WEIGHT_CONVERSION_COLUMNS"),
    "auditor.plan.CONVERSION_COLUMNS": ("auditor.plan", "PLAN_CONVERSION_COLUMNS"),
}


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds an old path in :data:`MOVED` and loads it as the module at the new one."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in MOVED:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec):
        new = MOVED[spec.name]
        warnings.warn(f"{spec.name} is deprecated: its supported names are in the __all__ of its package "
                      f"(the module itself is now the private {new})", DeprecationWarning, stacklevel=2)
        return importlib.import_module(new)

    def exec_module(self, module):
        pass  # the module at the new path has run already


def install() -> None:
    """Put the finder on ``sys.meta_path`` (once)."""
    if not any(isinstance(f, _MovedModules) for f in sys.meta_path):
        sys.meta_path.append(_MovedModules())


def moved_attribute(package: str, name: str):
    """For a package's ``__getattr__``: the module ``package.name`` when ``name`` is a module
    that moved (``auditor.recording.mode``), or what a renamed name is now (``auditor.fix.CHANNELS_LAST``
    is ``torch.channels_last``), with a ``DeprecationWarning``; raises ``AttributeError`` otherwise."""
    old = f"{package}.{name}"
    if old in MOVED:
        return importlib.import_module(old)
    if old in RENAMED:
        module, new = RENAMED[old]
        warnings.warn(f"{old} is deprecated: use {module}.{new}", DeprecationWarning, stacklevel=3)
        return getattr(importlib.import_module(module), new)
    raise AttributeError(f"module {package!r} has no attribute {name!r}")
