"""The kinds of change a fix makes, one frozen class each: a source edit of one or more
statements, a module swap, a weight conversion, a region kept contiguous.

Each change applies itself to a model (:meth:`Change.apply`, returning how to take it back and
what it did) and names its action for the fixes' table. A source edit changes no model: its
statements are rewritten for the whole process by :mod:`._patch`, planned together with the
other edits (two fixes of one statement are one rewrite). New kinds (a format-keeping
replacement of an op, a custom autograd function, a re-stride) are source edits whose rewrite
is a type of its own (:mod:`._replace`, :mod:`._restride`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar

import torch
import torch.nn as nn

from ._convert import CHANNELS_LAST_OF_RANK, FORMAT_NAMES
from ._hooks import (
    conv_module,
    is_conv_module,
    keep_contiguous,
    remove_input_formats,
    set_conv_format,
)
from ._keep_format import loses_format, swap_module

if TYPE_CHECKING:
    from ._syntax import Facts, Statement

#: how to take one change back
Undo = Callable[[], None]


def by_hand(why: str) -> str:
    """The reason a fix is left to the user, as every table shows it."""
    return f"by hand: {why}"


@dataclass(frozen=True)
class StatementEdit:
    """One statement and the rewrite that makes it keep the format, with what the rewrite
    needs to know about where the statement runs."""

    statement: Statement
    rewrite: Callable
    facts: Facts


@dataclass
class Made:
    """What the changes applied to one model so far share: the module each swapped module was
    swapped by (two causes, one module: swapped once)."""

    swapped_by: dict[str, int] = field(default_factory=dict)


class Change:
    """A change a fix makes. ``action`` is the name the fixes' table shows."""

    action: ClassVar[str]

    def apply(self, model: nn.Module, fix: int, made: Made) -> tuple[list[Undo], tuple[bool, str]]:
        """Make the change in ``model``, in place; (how to take it back, (applied, what was done or
        why not))."""
        raise NotImplementedError

    @property
    def edits(self) -> tuple[StatementEdit, ...]:
        """The statements this change rewrites (none for a change of the model)."""
        return ()


@dataclass(frozen=True)
class EditSource(Change):
    """Rewrite one or more statements of the source (the cause's, then any it needs with it,
    such as the call site that now asks for a format)."""

    action: ClassVar[str] = "edit source"
    statements: tuple[StatementEdit, ...]

    @property
    def edits(self) -> tuple[StatementEdit, ...]:
        return self.statements

    def apply(self, model: nn.Module, fix: int, made: Made) -> tuple[list[Undo], tuple[bool, str]]:
        return [], (True, "the source is edited, not the model")


@dataclass(frozen=True)
class SwapModules(Change):
    """Swap modules for drop-in ones that keep the format (from ``table``); ``latent`` ((module,
    input shape) pairs) are swapped too where they lose the format once fed it, asked of the
    running torch at the audit's ``threads``."""

    action: ClassVar[str] = "swap module"
    modules: tuple[str, ...]
    table: object = None
    latent: tuple[tuple[str, tuple[int, ...]], ...] = ()
    threads: int | None = None

    def apply(self, model: nn.Module, fix: int, made: Made) -> tuple[list[Undo], tuple[bool, str]]:
        latent = [name for name, shape in self.latent
                  if loses_format(model.get_submodule(name), shape, self.threads)]
        undo: list[Undo] = []
        swapped, failures = [], []
        for name in [*self.modules, *latent]:
            if name in made.swapped_by:
                swapped.append(f"{name} already swapped by fix {made.swapped_by[name]}")
                continue
            parent_name, _, attr = name.rpartition(".")
            try:
                parent = model.get_submodule(parent_name) if parent_name else model
                old = model.get_submodule(name)
                new = swap_module(model, name, self.table)
            except (ValueError, AttributeError) as exc:
                failures.append(str(exc))
                continue
            undo.append(lambda parent=parent, attr=attr, old=old: setattr(parent, attr, old))
            made.swapped_by[name] = fix
            swapped.append(f"{name} is now {type(new).__name__}")
        what = "; ".join(swapped[:2]) + (f" (and {len(swapped) - 2} more)" if len(swapped) > 2 else "")
        if latent:
            what += f"; {len(latent)} of them only lost the format once fed it (asked of this torch's kernels)"
        if failures:
            what += ("; " if what else "") + f"not applied: {failures[0]}"
        return undo, (bool(swapped) and not failures, what)


@dataclass(frozen=True)
class ConvertWeights(Change):
    """Store convolution weights in the format their convolutions compute in."""

    action: ClassVar[str] = "convert weight"
    modules: tuple[str, ...]

    def apply(self, model: nn.Module, fix: int, made: Made) -> tuple[list[Undo], tuple[bool, str]]:
        undo: list[Undo] = []
        converted = []
        target = None
        for name in self.modules:
            weight = conv_module(model, name).weight
            target = CHANNELS_LAST_OF_RANK[weight.dim()]
            if weight.is_contiguous(memory_format=target) and not weight.is_contiguous():
                continue
            strides = weight.stride()
            set_conv_format(model, name, target, convert_input=False)
            undo.append(lambda w=weight, strides=strides: restride(w, strides))
            converted.append(name)
        if converted:
            return undo, (True, f"{', '.join(converted)}.weight converted")
        return undo, (False, f"{self.modules[0]}.weight is already {FORMAT_NAMES.get(target, target)}: nothing to do")


@dataclass(frozen=True)
class KeepContiguous(Change):
    """Run the convolutions around an op that cannot keep the format contiguous; ``added_bytes``:
    the conversions this moves to the region's edges, per phase."""

    action: ClassVar[str] = "keep region contiguous"
    region: tuple[str, ...]
    added_bytes: int = 0

    def apply(self, model: nn.Module, fix: int, made: Made) -> tuple[list[Undo], tuple[bool, str]]:
        convs = [m for m in self.region if is_conv_module(model, m)]
        strides = {m: conv_module(model, m).weight.stride() for m in convs}
        keep_contiguous(model, convs)
        what = f"{', '.join(convs) or 'nothing'} run contiguous"
        if len(convs) < len(self.region):
            others = ", ".join(m for m in self.region if m not in convs)
            what += f"; {by_hand(others)} ran convolutions but are no convolution modules"
        return [lambda: _back_to(model, strides)], (bool(convs), what)


def restride(param: nn.Parameter, strides: tuple[int, ...]) -> None:
    """``param`` (and its gradient) laid out with ``strides`` again, its values kept: a 1x1
    kernel's strides pick the layout its convolution computes in, though both formats call it
    contiguous, so a format is not enough to put it back."""
    for t in (param, param.grad):
        if t is not None and t.stride() != strides:
            t.data = torch.empty_strided(t.shape, strides, dtype=t.dtype, device=t.device).copy_(t.detach())


def _back_to(model: nn.Module, strides: dict[str, tuple[int, ...]]) -> None:
    """Convolutions a region fix ran contiguous, back to their weights' layouts, their input
    conversions removed."""
    for name, weight_strides in strides.items():
        conv = conv_module(model, name)
        restride(conv.weight, weight_strides)
        remove_input_formats(conv)


class ByHand(Change):
    """No change is known: the user's, by hand (a proposal of this kind has no change)."""

    action: ClassVar[str] = "by hand"


#: the actions, as the fixes' table names them
EDIT, SWAP, WEIGHT, REGION, BY_HAND = (EditSource.action, SwapModules.action, ConvertWeights.action,
                                       KeepContiguous.action, ByHand.action)
