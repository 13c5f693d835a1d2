"""The pytest plugin costs an unrelated test session nothing: torch and auditor load only when a
test uses the fixture or the marker, and then both work."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

pytest_plugins = ["pytester"]

TESTS_DIR = os.path.dirname(__file__)

CONFTEST = textwrap.dedent(
    """
    import sys

    def pytest_collection_finish(session):
        heavy = sorted(m for m in ("torch", "auditor", "pandas") if m in sys.modules)
        print(f"\\nLOADED AFTER COLLECTION: {heavy}")
    """
)

TRIVIAL = textwrap.dedent(
    """
    import sys

    def test_plugin_is_there_and_nothing_heavy_is_loaded(request):
        assert request.config.pluginmanager.has_plugin("format_auditor")
        assert any(m.startswith("format_audit") for m in request.config.getini("markers"))
        assert "torch" not in sys.modules and "auditor" not in sys.modules
    """
)


def _pytest(cwd, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", *args],
                          cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def test_an_unrelated_session_imports_neither_torch_nor_auditor(tmp_path):
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_trivial.py").write_text(TRIVIAL)
    run = _pytest(tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "LOADED AFTER COLLECTION: []" in run.stdout, run.stdout


MARKED = '''
import sys
sys.path.insert(0, {tests_dir!r})
import pytest
from planted import make


def test_fixture(format_audit):
    model, x = make("clean")
    with format_audit():
        model(x).sum().backward()
    assert format_audit.audit is not None and len(format_audit.audit.events) > 0


@pytest.mark.format_audit
def test_marked_clean():
    model, x = make("clean")
    model(x).sum().backward()


@pytest.mark.format_audit(phases=("forward",))
def test_marked_planted():
    model, x = make("softmax")
    model(x)


@pytest.mark.format_audit(phases=("forward",), allow=["mid", "conv2"])
def test_marked_planted_allowed():
    model, x = make("softmax")
    model(x)


@pytest.mark.format_audit
def test_marked_failing_on_its_own():
    assert 1 == 2, "its own failure"
'''


def test_the_fixture_and_the_marker_work(pytester):
    pytester.makepyfile(test_inner=MARKED.format(tests_dir=TESTS_DIR))
    result = pytester.runpytest_subprocess("-q", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=3, failed=2)
    out = result.stdout.str()
    assert "module 'mid' (Softmax) op aten._softmax.default loses" in out
    assert "its own failure" in out  # a test that fails by itself keeps its failure


def test_the_plugin_is_off_with_no_format_auditor(pytester):
    pytester.makepyfile(test_inner="def test_uses(format_audit):\n    pass\n")
    result = pytester.runpytest_subprocess("-q", "-p", "no:cacheprovider", "-p", "no:format_auditor")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*fixture 'format_audit' not found*"])

