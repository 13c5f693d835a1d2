"""Every package the code imports is declared in pyproject.toml: what ``import auditor`` and its
modules import at their top in the base dependencies, what a function imports only when it
runs (timm, torchvision in the command line) in the base or an extra."""

from __future__ import annotations

import ast
import functools
import importlib.metadata
import re
import sys
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "auditor"
PLUGIN = ROOT / "format_auditor_pytest.py"
CLI = ROOT / "format_auditor_cli.py"

#: modules pytest itself loads: ``pytest`` is there whenever they run
PYTEST_ONLY = {"format_auditor_pytest"}


def _requirement_name(spec: str) -> str:
    return re.split(r"[\s<>=!~;\[]", spec.strip(), maxsplit=1)[0].lower().replace("_", "-")


def _declared() -> tuple[set[str], set[str]]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    base = {_requirement_name(s) for s in project["dependencies"]}
    extras = {_requirement_name(s) for specs in project.get("optional-dependencies", {}).values() for s in specs}
    return base, extras


@functools.cache
def _providers() -> dict[str, list[str]]:
    return importlib.metadata.packages_distributions()


def _distribution(top: str) -> str:
    """The distribution that provides the importable top-level name ``top``."""
    dists = _providers().get(top)
    return (dists[0] if dists else top).lower().replace("_", "-")


def _third_party_imports() -> list[tuple[str, str, bool]]:
    """(module, top-level name imported, at module level) for every import of a third-party
    package in the source; imports in functions and in ``try: ... except ImportError`` blocks
    run only when used."""
    out = []
    files = [(p.relative_to(PACKAGE).with_suffix("").as_posix().replace("/", "."), p) for p in PACKAGE.rglob("*.py")]
    files += [("format_auditor_pytest", PLUGIN), ("format_auditor_cli", CLI)]
    for name, path in files:
        tree = ast.parse(path.read_text())
        lazy: set[int] = set()
        for node in ast.walk(tree):
            guarded = isinstance(node, ast.Try) and any(
                isinstance(h.type, ast.Name) and h.type.id in ("ImportError", "ModuleNotFoundError")
                for h in node.handlers)
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) or guarded:
                lazy.update(id(n) for n in ast.walk(node) if n is not node or guarded)
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                tops = [a.name.split(".")[0] for a in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                tops = [node.module.split(".")[0]]
            else:
                continue
            for top in tops:
                if top in sys.stdlib_module_names or top in ("auditor", "format_auditor_pytest", "format_auditor_cli", "__future__"):
                    continue
                out.append((name, top, id(node) not in lazy))
    return out


def test_every_third_party_import_is_declared():
    base, extras = _declared()
    found = _third_party_imports()
    assert {"torch", "pandas", "numpy", "matplotlib", "tqdm"} <= {top for _, top, _ in found}
    for module, top, eager in found:
        dist = _distribution(top)
        if module.split(".")[-1] in PYTEST_ONLY and top in ("pytest", "_pytest"):
            continue
        if eager:
            assert dist in base, f"auditor.{module} imports {top} at its top: declare {dist} in dependencies"
        else:
            assert dist in base | extras, f"auditor.{module} imports {top}: declare {dist} in an extra"


def test_the_base_install_stays_lean():
    base, _ = _declared()
    # networkx and jinja2 (pandas' Styler, for the HTML tables) come with torch; libcst makes the
    # fixes' source edits; the others are what the package needs at import
    assert base <= {"torch", "pandas", "matplotlib", "numpy", "tqdm", "networkx", "jinja2", "libcst"}
