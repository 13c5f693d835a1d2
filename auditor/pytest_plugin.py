"""The ``format_audit`` fixture, importable from the package (``pytest_plugins =
["auditor.pytest_plugin"]`` in a conftest keeps working).

The plugin pytest loads through the ``pytest11`` entry point ``format_auditor`` is the
top-level module ``format_auditor_pytest``: it has the fixture and the ``format_audit`` marker,
and imports neither torch nor this package until a test uses them. Importing this module
imports the package (and torch) at once, which is why the entry point does not name it.
"""

from __future__ import annotations

from format_auditor_pytest import format_audit

__all__ = ["format_audit"]
