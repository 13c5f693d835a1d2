"""The examples in README.md and docs/ are tests (sybil): every ```python block runs, in order,
each page in one namespace, and a ```text block after an ``<!-- output -->`` comment is what the
block before it prints.

- ``<!-- output -->``: the printed text, exactly (trailing spaces aside);
- ``<!-- output: shape -->``: for output that holds timings: the same words, in the same number,
  every number free and a time or size unit free to change (``µs`` or ``ms``); the first line in
  place, the others in any order (rows ranked by time may swap) and wrapped anywhere; rows
  (``- ...``) shown above a ``... and N more`` line are the first of a list ranked by time, so
  which rows make the cut is free too: only their number and each one's form are checked;
- ``<!-- output: shape, measured -->``: shape, and what one timing on a noisy machine decides is
  free too: a verified step's outcome (``step 1 ms -> 2 ms: <this, to the verdict line>``) and
  its ``verdict:`` (helps, within noise, hurts); everything else the verification says is checked.

Setup that would only clutter a page goes in an ``<!-- invisible-code-block: python -->``
comment, which runs like a block. Pages run from the repository root, so the source lines that
reports print are ``README.md:NN`` and ``docs/...md:NN``.
"""

from __future__ import annotations

import contextlib
import io
import re
from collections import Counter
from pathlib import Path

import pytest

try:
    from sybil import Region, Sybil
    from sybil.evaluators.python import PythonEvaluator
    from sybil.parsers.markdown import CodeBlockParser
except ImportError:  # sybil is in the dev extra; without it the examples are not collected
    Sybil = None

ROOT = Path(__file__).resolve().parent
STDOUT = "__printed__"
OUTPUT = re.compile(r"^<!-- output(?:: (?P<mode>shape(?:, measured)?))? -->\n```text\n(?P<text>.*?)^```$", re.M | re.S)
#: in ``shape, measured`` blocks, what a timing decided: a verified step's outcome, its verdict
MEASURED = [(re.compile(r"^(\s*step [^:\n]*:).*?\n(?=\s*verdict:)", re.M | re.S), r"\1 <measured>\n"),
            (re.compile(r"^(\s*verdict:).*$", re.M), r"\1 <measured>")]
UNITS = {"ns", "µs", "ms", "s", "B", "kB", "MB", "GB", "TB"}
NUMBER = re.compile(r"\d+(?:\.\d+)?(?:e[-+]?\d+)?")
#: a number alone as :func:`shape` writes it (``#``, ``#x``, ``(#%)``), not a name holding one
COUNT = re.compile(r"[(\[]?#[x%]?[)\],;]?")


def _run(example) -> None:
    """Run a block as sybil does, keeping what it prints for an output block after it."""
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        PythonEvaluator()(example)
    example.namespace[STDOUT] = printed.getvalue()


def shape(text: str) -> list[str]:
    """The words of ``text`` with every number as ``#`` and a unit after a number as ``<unit>``."""
    words = []
    for word in text.split():
        core = word.strip("();,:[]")
        if words and words[-1].rstrip("();,:[]").endswith("#") and core in UNITS:
            word = word.replace(core, "<unit>", 1)
        words.append(NUMBER.sub("#", word))
    return words


def rank_free(text: str) -> str:
    """``text`` with each word of the rows above a ``... and N more`` line as ``<ranked>``, its
    numbers and units kept: which rows of a list ranked by time make the cut is noise."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if not line.lstrip().startswith("... and "):
            continue
        j = i - 1
        while j >= 0 and lines[j].lstrip().startswith("- "):
            words = shape(lines[j])
            lines[j] = " ".join(w if COUNT.fullmatch(w) or w.startswith("<unit>") else "<ranked>" for w in words[1:])
            j -= 1
    return "\n".join(lines)


def check_output(mode: str | None, expected: str, printed: str) -> str | None:
    """None when ``printed`` is what the page shows (``mode``: None exact, "shape" shape,
    "shape, measured" shape with the timings' outcomes free)."""
    if mode == "shape, measured":
        for pattern, to in MEASURED:
            expected, printed = pattern.sub(to, expected), pattern.sub(to, printed)
    if mode is None:
        strip = lambda s: "\n".join(line.rstrip() for line in s.strip("\n").splitlines())  # noqa: E731
        if strip(printed) == strip(expected):
            return None
        return f"the page shows:\n{expected}\nthe block printed:\n{printed}"
    first = lambda s: shape(s.strip().splitlines()[0]) if s.strip() else []  # noqa: E731
    if first(printed) != first(expected):
        return f"first line: the page shows {expected.strip().splitlines()[0]!r}, printed {printed.strip()[:200]!r}"
    want, got = Counter(shape(rank_free(expected))), Counter(shape(rank_free(printed)))
    if want == got:
        return None
    return (f"words the page shows that were not printed: {sorted((want - got).elements())}\n"
            f"words printed that the page does not show: {sorted((got - want).elements())}\n"
            f"printed:\n{printed}")


def _output_checker(mode: str | None, text: str):
    def evaluate(example):
        if STDOUT not in example.namespace:
            return "an output block must follow a ```python block"
        return check_output(mode, text, example.namespace.pop(STDOUT))
    return evaluate


def _parse_outputs(document):
    for m in OUTPUT.finditer(document.text):
        yield Region(m.start(), m.end(), parsed=m.group("text"), evaluator=_output_checker(m.group("mode"), m.group("text")))


def _setup(namespace) -> None:
    import torch

    torch.manual_seed(0)


def _teardown(namespace) -> None:
    import sys

    if "matplotlib.pyplot" in sys.modules:
        sys.modules["matplotlib.pyplot"].close("all")
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


if Sybil is not None:
    pytest_collect_file = Sybil(
        parsers=[CodeBlockParser("python", evaluator=_run), _parse_outputs],
        patterns=["README.md", "docs/*.md", "docs/*/*.md"],
        path=".",
        setup=_setup,
        teardown=_teardown,
    ).pytest()


#: pages whose examples take long (Inductor compiles for about a minute on a 2-core machine)
SLOW_PAGES = ("compiled.md",)


def pytest_collection_modifyitems(config, items):
    """The examples are the ``docs`` tests (``-m docs``, ``-m "not docs"``); the slow pages' are
    ``slow`` too."""
    for item in items:
        if item.path.suffix == ".md":
            item.add_marker(pytest.mark.docs)
            if item.path.name in SLOW_PAGES:
                item.add_marker(pytest.mark.slow)
