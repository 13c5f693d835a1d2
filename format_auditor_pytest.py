"""pytest plugin of format-auditor, registered through the ``pytest11`` entry point
``format_auditor``: the ``format_audit`` fixture and marker.

    def test_stays_channels_last(format_audit):
        with format_audit():                 # forward and backward by default
            model(x).sum().backward()
        # the test fails here, with the report, if the block lost channels_last

    @pytest.mark.format_audit(phases=("forward",), allow=["head.*"])
    def test_inference():                    # the whole test call is recorded
        model(x)

pytest loads every installed plugin at start-up, in every project. This module therefore lives
outside the ``auditor`` package (importing ``auditor.anything`` runs the package, which imports
torch and pandas: seconds) and imports nothing but pytest; torch and ``auditor`` are imported
only when a test asks for the fixture or carries the marker.
"""

from __future__ import annotations

import pytest

MARKER = (
    "format_audit(phases=('forward', 'backward'), allow=(), record_source=True): record the test "
    "call under format-auditor and fail the test with the report if it loses channels_last "
    "(auditor.testing.BlockGuard)"
)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", MARKER)


@pytest.fixture
def format_audit():
    """Audit a block of code and fail the test with the report if it has hotspots:
    ``with format_audit(phases=..., allow=...): ...``; ``format_audit.audit`` is the last
    block's audit."""
    from auditor.testing import BlockGuard

    return BlockGuard()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item):
    """Run a test that carries the ``format_audit`` marker inside a guarded block."""
    __tracebackhide__ = True  # a failure shows the test, not the plugin
    marker = item.get_closest_marker("format_audit")
    if marker is None:
        yield
        return
    from auditor.testing import BlockGuard

    guard = BlockGuard()
    block = guard(*marker.args, **marker.kwargs)
    block.__enter__()
    outcome = yield
    try:
        # a failing test keeps its own failure; a passing one is checked
        block.__exit__(*(outcome.excinfo or (None, None, None)))
    except AssertionError as failure:
        if not hasattr(outcome, "force_exception"):  # pluggy < 1.1
            raise
        outcome.force_exception(failure)
    item.stash[AUDIT] = guard.audit


#: the audit of a marked test, in ``item.stash`` (for other plugins and reports)
AUDIT = pytest.StashKey[object]()
