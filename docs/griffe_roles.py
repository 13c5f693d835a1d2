"""A griffe extension: the docstrings' Sphinx roles (``:func:`x```, ``:class:`~a.B```) become code
spans, so the API reference reads as the docstrings do in a terminal."""

from __future__ import annotations

import re

import griffe

ROLE = re.compile(r":(?:py:)?(?:func|meth|class|mod|attr|data|exc|obj|const):`~?([^`]+)`")


def plain_roles(text: str) -> str:
    return ROLE.sub(lambda m: f"`{m.group(1)}`", text)


class SphinxRoles(griffe.Extension):
    def on_object(self, *, obj, **kwargs) -> None:  # griffe >= 1.x calls this for every object
        if obj.docstring is not None:
            obj.docstring.value = plain_roles(obj.docstring.value)

    def on_instance(self, *, obj, **kwargs) -> None:
        if obj.docstring is not None:
            obj.docstring.value = plain_roles(obj.docstring.value)
