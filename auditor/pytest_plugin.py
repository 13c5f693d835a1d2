"""pytest plugin, registered through the ``pytest11`` entry point: the ``format_audit`` fixture.

    def test_stays_channels_last(format_audit):
        with format_audit():                 # forward and backward by default
            model(x).sum().backward()
        # the test fails here, with the report, if the block lost channels_last
"""

from __future__ import annotations

import pytest


@pytest.fixture
def format_audit():
    """Audit a block of code and fail the test with the report if it has hotspots."""
    from .testing import BlockGuard

    return BlockGuard()
