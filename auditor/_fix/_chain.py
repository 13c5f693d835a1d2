"""A chain of reshapes, views, transposes and permutes of one tensor, seen as what it is: one
permutation of the tensor's sizes split into factors. Written so, the chain can be gathered in
another order, by the one copy a reshape makes anyway (joins: tokens folded back into a map over
several statements, as MobileViT and HaloNet write it). Each factor carries the source expression
that sizes it, so the rewrite holds at every input size, not only the recorded one."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import torch

#: one step of a chain: ("reshape", sizes, exprs), ("permute", order), ("transpose", a, b)
Step = tuple


class NotAPermutation(Exception):
    """The chain is not one permutation of factors of its input's sizes; the message says why."""


@dataclass(eq=False)  # factors are told apart by identity: two of one size are two factors
class Factor:
    size: int
    expr: str  #: source code for the size, where the chain's statements run
    given: bool  #: the expression is one the source wrote (a reshape's argument), not derived
    dim: int = 0  #: the dimension of the chain's input it is (part of)


_ATOM = re.compile(r"[A-Za-z_][\w.]*(\[\d+\])?|\d+")


def _paren(expr: str) -> str:
    return expr if _ATOM.fullmatch(expr) else f"({expr})"


class Chain:
    """The factors of a tensor ``name`` of ``shape``, in its memory order (:attr:`order`), and
    the dimensions of the tensor the chain has made of it so far (:attr:`dims`, each a list of
    factors, outer first). A size of 1 has no factor."""

    def __init__(self, name: str, shape: tuple[int, ...]):
        self.name = name
        self.order = [Factor(n, f"{name}.shape[{i}]", False, i) for i, n in enumerate(shape) if n != 1]
        it = iter(self.order)
        self.dims = [[next(it)] if n != 1 else [] for n in shape]
        self.last_sizes: list[str | None] | None = None  #: the sizes of the last reshape, as written

    def shape(self) -> tuple[int, ...]:
        return tuple(math.prod(f.size for f in d) for d in self.dims)

    def permute(self, order: tuple[int, ...]) -> None:
        if sorted(o % len(self.dims) for o in order) != list(range(len(self.dims))):
            raise NotAPermutation(f"permute{tuple(order)} of a tensor of {len(self.dims)} dimensions")
        self.dims = [self.dims[o % len(self.dims)] for o in order]
        self.last_sizes = None

    def transpose(self, a: int, b: int) -> None:
        order = list(range(len(self.dims)))
        order[a], order[b] = order[b], order[a]
        self.permute(tuple(order))

    def reshape(self, sizes: tuple[int, ...], exprs: list[str | None]) -> None:
        """The recorded ``sizes`` of a reshape written with ``exprs`` (None for -1): each new
        dimension takes the next factors in order, a factor split where a dimension ends inside
        it (reshape's row-major rule); the parts are named by the reshape's own arguments where
        they are one, else as a quotient of expressions."""
        if math.prod(sizes) != math.prod(self.shape()):
            raise NotAPermutation(f"a reshape to {tuple(sizes)} of a tensor of {self.shape()}")
        queue = [f for d in self.dims for f in d]
        dims: list[list[Factor]] = []
        for j, (v, e) in enumerate(zip(sizes, exprs)):
            group: list[Factor] = []
            have = 1
            while have < v:
                f = queue.pop(0)
                if v % (have * f.size) == 0:
                    group.append(f)
                    have *= f.size
                    continue
                need = v // have
                if v % have or f.size % need:
                    raise NotAPermutation(f"a reshape to {tuple(sizes)} cuts a size of {f.size} into no factors of it")
                major, minor = self._split(f, need, group, v, e, sizes[j + 1:], exprs[j + 1:])
                group.append(major)
                have *= need
                queue.insert(0, minor)
            if len(group) == 1 and e is not None and not group[0].given:
                group[0].expr, group[0].given = e, True  # the source's own name for it
            dims.append(group)
        self.dims = dims
        self.last_sizes = list(exprs)

    def _split(self, f: Factor, need: int, group: list[Factor], v: int, e: str | None,
               later: tuple[int, ...], later_exprs: list[str | None]) -> tuple[Factor, Factor]:
        """``f`` cut into its outer part of size ``need`` (ending the dimension ``e`` of size
        ``v``) and the rest, which the next dimension starts with."""
        rest = f.size // need
        # the rest named by the next argument where it is all of that dimension
        rest_expr = later_exprs[0] if later and later[0] == rest and later_exprs[0] is not None else None
        if not group and e is not None:
            major_expr, given = e, True
        elif rest_expr is not None:
            major_expr, given = f"{_paren(f.expr)} // {_paren(rest_expr)}", False
        elif e is not None:
            major_expr, given = f"{_paren(e)} // {_paren(' * '.join(_paren(g.expr) for g in group))}", False
        else:
            raise NotAPermutation("a size is cut where no expression names either part")
        if rest_expr is None:
            rest_expr = f"{_paren(f.expr)} // {_paren(major_expr)}"
        major = Factor(need, major_expr, given, f.dim)
        minor = Factor(rest, rest_expr, rest_expr in later_exprs[:1], f.dim)
        at = next(i for i, g in enumerate(self.order) if g is f)
        self.order[at:at + 1] = [major, minor]
        return major, minor

    def size_exprs(self, order: list[int]) -> list[str]:
        """The current dimensions' sizes as code, in ``order``: the last reshape's arguments
        where it made them, else the product of their factors."""
        out = []
        for i in order:
            written = self.last_sizes[i] if self.last_sizes is not None else None
            if written is not None:
                out.append(written)
            elif not self.dims[i]:
                out.append("1")
            else:
                out.append(" * ".join(_paren(f.expr) for f in self.dims[i]))
        return out


def _nhwc(rank: int) -> list[int]:
    """The dimensions of a map (B, C, *spatial) in NHWC order."""
    return [0, *range(2, rank), 1]


def _positions(factors: list[Factor], within: list[Factor]) -> list[int]:
    """Where each of ``factors`` is in ``within``, told apart by identity."""
    return [next(k for k, g in enumerate(within) if g is f) for f in factors]


def gathered_in_nhwc_order(chain: Chain) -> list[int]:
    """For a chain whose result is a map (B, C, *spatial): the permutation of its input's
    factors (:attr:`Chain.order`) that puts the result's factors in NHWC order."""
    return _positions([f for i in _nhwc(len(chain.dims)) for f in chain.dims[i]], chain.order)


def read_in_nhwc_order(chain: Chain, rank: int) -> tuple[list[Factor], list[int]]:
    """For a chain whose input is a map (B, C, *spatial): the input's factors in NHWC memory
    order, and the permutation that takes them to the order of the chain's result."""
    place = {d: k for k, d in enumerate(_nhwc(rank))}
    nhwc = sorted(chain.order, key=lambda f: place[f.dim])  # stable: each dimension's factors keep their order
    return nhwc, _positions([f for d in chain.dims for f in d], nhwc)


def split_text(chain: Chain, rank: int) -> str:
    """The chain's result computed from its input map read in NHWC order: a channels_last map
    permuted to (B, *spatial, C) is a view of its memory, cut into its factors there (a view),
    permuted into the result's order and merged into its sizes by the one copy the chain made
    anyway, reading the map in memory order."""
    nhwc, perm = read_in_nhwc_order(chain, rank)
    to_nhwc = ", ".join(map(str, _nhwc(rank)))
    cut = ", ".join(f.expr for f in nhwc)
    permute = "" if perm == sorted(perm) else f".permute({', '.join(map(str, perm))})"
    sizes = ", ".join(chain.size_exprs(list(range(len(chain.dims)))))
    return f"{chain.name}.permute({to_nhwc}).reshape({cut}){permute}.reshape({sizes})"


def splits_the_same(shape: tuple[int, ...], steps: list[Step], chain: Chain) -> bool:
    """Whether :func:`split_text`'s reading takes every element where the steps put it."""
    rank = len(shape)
    x = torch.arange(math.prod(shape)).reshape(shape)
    nhwc, perm = read_in_nhwc_order(chain, rank)
    z = x.permute(_nhwc(rank)).reshape([f.size for f in nhwc]).permute(perm).reshape(chain.shape())
    return bool(torch.equal(z, _moved(x, steps)))


def _moved(x: torch.Tensor, steps: list[Step]) -> torch.Tensor:
    for step in steps:
        if step[0] == "reshape":
            x = x.reshape(step[1])
        elif step[0] == "permute":
            x = x.permute(step[1])
        elif step[0] == "transpose":
            x = x.transpose(step[1], step[2])
    return x


def nhwc_text(chain: Chain) -> str:
    """The chain's result (a map (B, C, *spatial)) computed from its input in one gather in NHWC
    order: the input cut into its factors, permuted so the channels come last, merged into (B,
    *spatial, C), and viewed back as (B, C, *spatial), a channels_last view."""
    rank = len(chain.dims)
    perm = gathered_in_nhwc_order(chain)
    sizes = ", ".join(chain.size_exprs(_nhwc(rank)))
    cut = ", ".join(f.expr for f in chain.order)
    back = ", ".join(map(str, [0, rank - 1, *range(1, rank - 1)]))
    permute = "" if perm == sorted(perm) else f".permute({', '.join(map(str, perm))})"
    return f"{chain.name}.reshape({cut}){permute}.reshape({sizes}).permute({back})"


def _map_to_map(chain: Chain, rank: int) -> tuple[list[Factor], list[int]]:
    """The input map's factors in NHWC memory order, and the permutation that puts the result's
    factors in NHWC order from them."""
    nhwc, _ = read_in_nhwc_order(chain, rank)
    return nhwc, _positions([f for i in _nhwc(rank) for f in chain.dims[i]], nhwc)


def map_to_map_text(chain: Chain) -> str:
    """The chain's result (a map (B, C, *spatial)) made from its input map (the same rank) read
    in NHWC order and gathered in NHWC order: the input permuted to (B, *spatial, C), a view of
    channels_last memory, cut into its factors there, permuted so the result's channels come
    last, merged by the one copy the chain made anyway, and viewed back as (B, C, *spatial). A
    map cut into windows (or windows put back) keeps the format both ways: its gradient is
    merged in NHWC order too, where :func:`nhwc_text`'s would be merged in NCHW order."""
    rank = len(chain.dims)
    nhwc, perm = _map_to_map(chain, rank)
    to_nhwc = ", ".join(map(str, _nhwc(rank)))
    cut = ", ".join(f.expr for f in nhwc)
    sizes = ", ".join(chain.size_exprs(_nhwc(rank)))
    back = ", ".join(map(str, [0, rank - 1, *range(1, rank - 1)]))
    permute = "" if perm == sorted(perm) else f".permute({', '.join(map(str, perm))})"
    return f"{chain.name}.permute({to_nhwc}).reshape({cut}){permute}.reshape({sizes}).permute({back})"


def maps_the_same(shape: tuple[int, ...], steps: list[Step], chain: Chain) -> bool:
    """Whether :func:`map_to_map_text`'s reading and gathering takes every element where the
    steps put it, at the recorded sizes."""
    rank = len(shape)
    if len(chain.dims) != rank:
        return False
    x = torch.arange(math.prod(shape)).reshape(shape)
    y = _moved(x, steps)
    nhwc, perm = _map_to_map(chain, rank)
    sizes = [math.prod(f.size for f in chain.dims[i]) for i in _nhwc(rank)]
    z = x.permute(_nhwc(rank)).reshape([f.size for f in nhwc]).permute(perm).reshape(sizes).permute(
        0, rank - 1, *range(1, rank - 1))
    return z.shape == y.shape and bool(torch.equal(z, y))


def build(name: str, shape: tuple[int, ...], steps: list[Step]) -> Chain:
    """The chain of ``steps`` from a tensor ``name`` of ``shape``."""
    chain = Chain(name, shape)
    for step in steps:
        if step[0] == "reshape":
            chain.reshape(step[1], step[2])
        elif step[0] == "permute":
            chain.permute(step[1])
        elif step[0] == "transpose":
            chain.transpose(step[1], step[2])
    return chain


def gathers_the_same(shape: tuple[int, ...], steps: list[Step], chain: Chain) -> bool:
    """Whether the NHWC gather of :func:`nhwc_text` takes every element where the steps put it,
    at the recorded sizes (the index of each element, followed through both)."""
    x = torch.arange(math.prod(shape)).reshape(shape)
    y = _moved(x, steps)
    rank = len(chain.dims)
    sizes = [math.prod(f.size for f in chain.dims[i]) for i in _nhwc(rank)]
    z = x.reshape([f.size for f in chain.order]).permute(gathered_in_nhwc_order(chain)).reshape(sizes).permute(
        0, rank - 1, *range(1, rank - 1))
    return z.shape == y.shape and bool(torch.equal(z, y))
