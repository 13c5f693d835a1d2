"""The guard for users' suites: passes on a clean model, fails with the module and op."""

from __future__ import annotations

import re

import pytest
from planted import make

import auditor
from auditor.testing import assert_no_hotspots, unexpected_hotspots

pytest_plugins = ["pytester"]


def test_clean_model_passes():
    model, x = make("clean")
    a = assert_no_hotspots(model, x)
    assert isinstance(a, auditor.Audit)
    assert_no_hotspots(model, x, phases=("forward", "backward"))


def test_planted_break_fails_naming_module_and_op():
    model, x = make("softmax")
    with pytest.raises(AssertionError) as info:
        assert_no_hotspots(model, x)
    msg = str(info.value)
    assert "module 'mid' (Softmax) op aten._softmax.default loses" in msg
    assert "planted.py:" in msg  # the source line
    assert "Format audit:" in msg  # and the report


def test_allow_and_phases():
    model, x = make("softmax")
    assert_no_hotspots(model, x, allow=["mid", "conv2"])
    assert_no_hotspots(model, x, allow=[lambda row: row["kind"] in ("loses", "converts")])
    with pytest.raises(AssertionError, match="conv2"):
        assert_no_hotspots(model, x, allow=["aten._softmax.*"])
    model, x = make("bicubic")  # loses only in backward
    assert_no_hotspots(model, x, phases=("forward",))
    with pytest.raises(AssertionError, match="upsample_bicubic2d_backward"):
        assert_no_hotspots(model, x, phases=("forward", "backward"))
    with pytest.raises(ValueError, match="phases"):
        assert_no_hotspots(model, x, phases=("sideways",))


def test_unexpected_hotspots_is_a_frame():
    model, x = make("explicit_contiguous")
    a = auditor.audit(model, x)
    bad = unexpected_hotspots(a, phases=("forward",), allow=["<root>"])
    assert set(bad["module"]) == {"conv2"}


PLUGIN_TESTS = '''
import sys
sys.path.insert(0, {tests_dir!r})
from planted import make

def test_clean(format_audit):
    model, x = make("clean")
    with format_audit():
        model(x).sum().backward()
    assert format_audit.audit is not None and len(format_audit.audit.events) > 0

def test_planted(format_audit):
    model, x = make("softmax")
    with format_audit(phases=("forward",)):
        model(x)
'''


def test_fixture_is_registered_and_fails_with_the_report(pytester):
    import os

    tests_dir = os.path.dirname(__file__)
    pytester.makepyfile(test_inner=PLUGIN_TESTS.format(tests_dir=tests_dir))
    result = pytester.runpytest_subprocess("-q", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*module 'mid' (Softmax) op aten._softmax.default loses*"])


GUARDED_FAILURE = '''
import sys
sys.path.insert(0, {tests_dir!r})
from planted import make
from auditor.testing import assert_no_hotspots

def test_assert(format_audit):
    model, x = make("softmax")
    assert_no_hotspots(model, x, record_time=False)

def test_block(format_audit):
    model, x = make("softmax")
    with format_audit(phases=("forward",)):
        model(x)
'''


def test_a_guard_failure_shows_the_users_test_and_bytes_in_units(pytester, monkeypatch):
    """Issue 41: the failure showed the library's own frames (auditor/testing.py) and "16384
    bytes". It shows the user's test, and sizes as the report writes them."""
    import os
    from pathlib import Path

    tests_dir = os.path.dirname(__file__)
    root = str(Path(tests_dir).parent)  # the subprocess imports this checkout, plugin included
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([root, *filter(None, [os.environ.get("PYTHONPATH")])]))
    pytester.makepyfile(test_inner=GUARDED_FAILURE.format(tests_dir=tests_dir))
    result = pytester.runpytest_subprocess("-q", "-p", "no:cacheprovider")
    result.assert_outcomes(failed=2)
    out = result.stdout.str()
    assert "test_inner.py" in out and re.search(r"1x, [\d.]+ kB", out) and not re.search(r"\d bytes", out)
    assert "auditor/testing.py" not in out and "format_auditor_pytest.py" not in out
