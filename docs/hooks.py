"""mkdocs hooks: the parts of the site that are generated from the code, so they cannot drift.

- ``<!-- generated: patterns -->``: the cause patterns, from the registry
  (``auditor/_analysis/_patterns.py``, loaded by path: building the site does not import torch);
- ``<!-- generated: fixes -->``: the fix generators and the variants of a family's fix, in the
  order they are tried, from their declarations (``auditor/_fix/_variants.py``, loaded by path);
- ``<!-- generated: cli-help -->``: ``format-audit --help`` (``format_auditor_cli`` imports no torch);
- ``<!-- generated: public-names -->``: every public name with the first line of its docstring;
- ``<!-- generated: benchmarks -->``: each benchmark script with the first paragraph of its docstring.

Every table cell's long words (a path, a ``snake_case`` name) may wrap after their ``/``, ``_``
and ``.`` (:func:`breakable_cells`), so a table of ten columns fits the page's column instead of
running past it or scrolling inside itself (issue 41; tests/test_docs.py measures the built site).

Before the build, every name in the ``__all__`` of the public modules must have a docstring:
a missing one is a warning, which ``mkdocs build --strict`` turns into a failure.
"""

from __future__ import annotations

import importlib.util
import logging
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PUBLIC = ("auditor", "auditor.testing", "auditor.plot", "auditor.distributed")
#: where each public module's reference lives on the site
REFERENCE = {"auditor": "auditor.md", "auditor.testing": "testing.md", "auditor.plot": "plot.md",
             "auditor.distributed": "distributed.md"}

log = logging.getLogger("mkdocs.hooks.generated")


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return module


def patterns_table() -> str:
    """The registry as a Markdown table: name, what happened, the one-line fix."""
    patterns = _load("_auditor_patterns", ROOT / "auditor" / "_analysis" / "_patterns.py")
    rows = ["| pattern | what happened | the one-line fix |", "| --- | --- | --- |"]
    rows += [f"| `{p.name}` | {p.happened} | {p.remedy} |" for p in patterns.PATTERNS.values()]
    return "\n".join(rows)


def fixes_table() -> str:
    """The declared fixes as a Markdown table, in the order they are tried: each generator with
    the patterns it fixes, then each variant with the family (pattern) whose fix it is, and what
    each changes."""
    declared = _load("_auditor_fix_variants", ROOT / "auditor" / "_fix" / "_variants.py")

    def patterns(names) -> str:
        return ", ".join(f"`{p}`" for p in names)

    rows = ["| fix | tried for | what it changes |", "| --- | --- | --- |"]
    rows += [f"| {d.name} | {patterns(d.patterns)} | {d.does} |" for d in declared.GENERATORS]
    rows += [f"| {d.name} | a variant, for {patterns(d.patterns)} | {d.does} |" for d in declared.VARIANTS]
    return "\n".join(rows)


def cli_help() -> str:
    """``format-audit --help`` as the console script prints it, at 100 columns."""
    import os

    os.environ["COLUMNS"] = "100"
    sys.path.insert(0, str(ROOT))
    try:
        cli = _load("_auditor_cli", ROOT / "format_auditor_cli.py")
    finally:
        sys.path.remove(str(ROOT))
    text = cli.build_parser().format_help()
    return "```text\n" + text.rstrip() + "\n```"


def _griffe_modules():
    import griffe

    loader = griffe.GriffeLoader(search_paths=[str(ROOT)])
    package = loader.load("auditor")
    loader.resolve_aliases(implicit=False, external=False)
    return {name: package if name == "auditor" else package[name.split(".", 1)[1]] for name in PUBLIC}


def _first_line(obj) -> str:
    doc = obj.docstring.value if obj.docstring else ""
    first = " ".join(doc.split("\n\n")[0].split())
    return _plain_roles(first)


def _plain_roles(text: str) -> str:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    try:
        from griffe_roles import plain_roles
    finally:
        sys.path.pop(0)
    return plain_roles(text)


def public_names_table() -> str:
    """Every public name, by module, with the first sentence of its docstring and a link."""
    out = []
    for name, module in _griffe_modules().items():
        out += [f"### `{name}`", "", "| name | what it is |", "| --- | --- |"]
        for member in module.exports or []:
            obj = module[member]
            first = _first_line(obj).replace("|", "\\|")
            out.append(f"| [`{member}`][{name}.{member}] | {first} |")
        out.append("")
    return "\n".join(out)


def check_docstrings() -> list[str]:
    """The public names without a docstring."""
    missing = []
    for name, module in _griffe_modules().items():
        if not module.exports:
            missing.append(f"{name} has no __all__")
        for member in module.exports or []:
            obj = module[member]
            if not (obj.docstring and obj.docstring.value.strip()):
                missing.append(f"{name}.{member}")
    return missing


def benchmarks_list() -> str:
    """Each script in ``benchmarks/`` with the first paragraph of its docstring."""
    import ast

    rows = []
    for path in sorted((ROOT / "benchmarks").glob("*.py")):
        doc = ast.get_docstring(ast.parse(path.read_text())) or ""
        if not doc.strip():
            log.warning("benchmarks/%s has no docstring to describe it", path.name)
        first = " ".join(doc.split("\n\n")[0].split()).replace("``", "`")
        rows.append(f"- `benchmarks/{path.name}`: {first}")
    return "\n".join(rows)


GENERATORS = {"patterns": patterns_table, "fixes": fixes_table, "cli-help": cli_help,
              "public-names": public_names_table, "benchmarks": benchmarks_list}


def on_pre_build(config, **kwargs):
    for name in check_docstrings():
        log.warning("public name without a docstring: %s", name)


#: a table cell, its tag and its content (no nested cells in these pages)
_CELL = re.compile(r"(<t[dh][^>]*>)(.*?)(</t[dh]>)", re.S)
#: a word long enough to widen its column
_LONG_WORD = re.compile(r"[^\s<>]{18,}")
#: where such a word may break: after a folder, an underscore, a dot between names
_BREAK_AFTER = re.compile(r"(?<=[/_])(?=[^/_\s])|(?<=[A-Za-z_)]\.)(?=[A-Za-z_])")


def breakable_cells(html: str) -> str:
    """``html`` with a ``<wbr>`` after each ``/``, ``_`` and dot between names in the long words
    of its table cells: such a cell wraps at a name's joints, never inside a word."""
    def words(text: str) -> str:
        return _LONG_WORD.sub(lambda m: _BREAK_AFTER.sub("<wbr>", m.group(0)), text)

    def cell(m: re.Match) -> str:
        inner = re.sub(r"(?<=>)[^<]+|^[^<]+", lambda t: words(t.group(0)), m.group(2))
        return m.group(1) + inner + m.group(3)

    return _CELL.sub(cell, html)


def on_page_content(html: str, page, config, files, **kwargs):
    return breakable_cells(html)


def on_page_markdown(markdown: str, page, config, files, **kwargs):
    for key, make in GENERATORS.items():
        marker = f"<!-- generated: {key} -->"
        if marker in markdown:
            markdown = markdown.replace(marker, make())
    return markdown
