"""Rewrites of the statement a cause sits on, generated from the pattern and the statement's
syntax tree (libcst, which keeps the user's formatting and comments).

Each rewrite finds, in the statement, the one expression its pattern names (the mean over H and
W, the reduction over the stacked dimension, the slices of the channels, the ``.contiguous()``,
the in-place operator, the interpolation of an N×C×1×1 map, the reshaped weight) and writes the
version that keeps the format, with the same values. Where the statement does not have the
shape the rewrite needs, or the rewrite would be ambiguous, it raises :class:`Refused` with the
reason, and the fix stays "by hand": a wrong edit is worse than none.
"""

from __future__ import annotations

import functools
import linecache
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import libcst as cst
from libcst.metadata import MetadataWrapper, PositionProvider

#: The wrapper a statement is parsed in, so that its own indentation is kept.
_WRAPPER = "if True:\n"


class Refused(Exception):
    """The statement does not have the shape the rewrite needs; the message says why."""


@dataclass(frozen=True)
class Statement:
    """The simple statement (one logical line, possibly over several physical lines) that holds
    a cause's line: lines ``first`` .. ``last`` of ``path``, and their text."""

    path: str
    first: int
    last: int
    text: str


@dataclass(frozen=True)
class Facts:
    """What a rewrite needs to know beyond the statement's text."""

    cl: str = "channels_last"  #: the format to keep: ``channels_last`` or ``channels_last_3d``
    rank: int = 4  #: of the images
    torch: str | None = "torch"  #: the name ``torch`` is bound to where the statement runs
    dims: tuple[int, ...] = ()  #: the dimensions the cause's op reduced (or sliced), as it ran
    taken: frozenset[str] = field(default_factory=frozenset)  #: names in use where the statement runs

    def new_name(self, base: str) -> str:
        """A name not in use where the statement runs."""
        name, k = base, 1
        while name in self.taken:
            k += 1
            name = f"{base}{k}"
        return name


# -- finding the statement -----------------------------------------------------------------------


@functools.lru_cache(maxsize=32)
def _statements(path: str, text: str) -> tuple[tuple[int, int], ...]:
    """(first, last) line of every simple statement of a file's ``text``."""
    try:
        wrapper = MetadataWrapper(cst.parse_module(text))
    except cst.ParserSyntaxError:
        return ()
    positions = wrapper.resolve(PositionProvider)
    return tuple(sorted((p.start.line, p.end.line) for node, p in positions.items()
                        if isinstance(node, cst.SimpleStatementLine)))


def statement_starts(path: str) -> list[int]:
    """The first line of every simple statement of ``path``, in order."""
    return [first for first, _ in _statements(path, "".join(linecache.getlines(path)))]


def statements_from(path: str, line: int, count: int) -> Statement:
    """The statement that holds ``line`` and the ``count - 1`` simple statements after it, when
    they follow it in the same block (nothing but blank and comment lines between them)."""
    lines = linecache.getlines(path)
    spans = _statements(path, "".join(lines))
    first = statement_at(path, line)
    at = spans.index((first.first, first.last))
    chosen = list(spans[at:at + count])
    indent = _indent(lines[first.first - 1])
    for (_, end), (start, _) in zip(chosen, chosen[1:]):
        between = lines[end:start - 1]
        if any(t.strip() and not t.strip().startswith("#") for t in between) or _indent(lines[start - 1]) != indent:
            raise Refused("the statements after this line are not in its block")
    if len(chosen) < count:
        raise Refused("the block ends before the statements the rewrite needs")
    return Statement(path, chosen[0][0], chosen[-1][1], "".join(lines[chosen[0][0] - 1:chosen[-1][1]]))


def _indent(text: str) -> str:
    return text[:len(text) - len(text.lstrip(" \t"))]


def statement_at(path: str, line: int) -> Statement:
    """The simple statement of ``path`` that holds ``line``."""
    lines = linecache.getlines(path)
    if not lines:
        raise Refused(f"the source of {path} cannot be read")
    for first, last in _statements(path, "".join(lines)):
        if first <= line <= last:
            # a statement ends where its last line ends (its comment included)
            return Statement(path, first, last, "".join(lines[first - 1:last]))
    raise Refused(f"line {line} is part of a compound statement (an if, for, while or with header, a def): "
                  "edit it by hand")


def rewrite(statement: Statement, rewrites: Iterable[tuple[Callable[[cst.Module, Facts], cst.Module], Facts]]) -> str:
    """The statement's lines after ``rewrites`` (each a rewrite function and its facts), one
    after the other; the text keeps its indentation, formatting and comments."""
    indent = statement.text[:len(statement.text) - len(statement.text.lstrip(" \t"))]
    module = cst.parse_module(_WRAPPER + statement.text if indent else statement.text)
    for fn, facts in rewrites:
        module = fn(module, facts)
    code = module.code
    return code[len(_WRAPPER):] if indent else code


# -- small helpers on syntax ---------------------------------------------------------------------


def _code(node: cst.CSTNode) -> str:
    return cst.Module([]).code_for_node(node)


def _expr(text: str) -> cst.BaseExpression:
    return cst.parse_expression(text)


def _int(node) -> int | None:
    if isinstance(node, cst.Integer):
        return int(node.value)
    if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.Minus) and isinstance(node.expression, cst.Integer):
        return -int(node.expression.value)
    return None


def _ints(node) -> tuple[int, ...] | None:
    """A literal int, or a tuple or list of them."""
    one = _int(node)
    if one is not None:
        return (one,)
    if isinstance(node, (cst.Tuple, cst.List)):
        values = [_int(e.value) for e in node.elements]
        return tuple(values) if values and None not in values else None
    return None


def _bool(node) -> bool | None:
    if isinstance(node, cst.Name) and node.value in ("True", "False"):
        return node.value == "True"
    return None


def _simple(node) -> bool:
    """A name or a chain of attributes of one (``x``, ``self.weight``): reading it twice reads
    the same thing and costs nothing."""
    while isinstance(node, cst.Attribute):
        node = node.value
    return isinstance(node, cst.Name)


def _callee(call: cst.Call) -> str:
    """The last name of what a call calls: ``mean`` for ``x.mean(...)`` and ``torch.mean(...)``."""
    f = call.func
    return f.attr.value if isinstance(f, cst.Attribute) else f.value if isinstance(f, cst.Name) else ""


#: Names a function is called through rather than a tensor: ``torch.mean(x)``, ``F.pad(x)``.
_NAMESPACES = frozenset({"torch", "F", "nn", "functional"})


def _is_method(call: cst.Call, torch_name: str | None) -> bool:
    """``x.f(...)`` on a tensor, not ``torch.f(...)`` or ``F.f(...)``."""
    f = call.func
    if not isinstance(f, cst.Attribute):
        return False
    root = f.value
    while isinstance(root, cst.Attribute):
        root = root.value
    return not (isinstance(root, cst.Name) and root.value in _NAMESPACES | {torch_name})


def _arg(call: cst.Call, position: int, keyword: str) -> cst.Arg | None:
    for a in call.args:
        if a.keyword is not None and a.keyword.value == keyword:
            return a
    positional = [a for a in call.args if a.keyword is None and not a.star]
    return positional[position] if len(positional) > position else None


def _normal(dims: Iterable[int], ndim: int) -> set[int]:
    return {d % ndim for d in dims}


def _memory_format(facts: Facts) -> str:
    if facts.torch is None:
        raise Refused("torch is not imported where this line runs, so the rewrite cannot name its memory format")
    return f"{facts.torch}.{facts.cl}"


class _Collect(cst.CSTVisitor):
    def __init__(self, keep: Callable[[cst.CSTNode], bool]):
        self.keep, self.found = keep, []

    def on_visit(self, node: cst.CSTNode) -> bool:
        if self.keep(node):
            self.found.append(node)
        return True


def _find(module: cst.Module, keep: Callable[[cst.CSTNode], bool]) -> list[cst.CSTNode]:
    visitor = _Collect(keep)
    module.visit(visitor)
    return visitor.found


def _the_one(found: list, what: str) -> cst.CSTNode:
    if not found:
        raise Refused(f"this line has no {what}")
    if len(found) > 1:
        raise Refused(f"this line has {len(found)} candidates for the {what}, and which one the cause is cannot be "
                      "told from the line")
    return found[0]


class _Replace(cst.CSTTransformer):
    def __init__(self, new: dict[int, cst.CSTNode]):
        super().__init__()
        self.new = new

    def on_leave(self, original_node, updated_node):
        return self.new.get(id(original_node), updated_node)


def _replace(module: cst.Module, old: cst.CSTNode, new: cst.CSTNode) -> cst.Module:
    return _replace_all(module, [(old, new)])


def _replace_all(module: cst.Module, pairs: list[tuple[cst.CSTNode, cst.CSTNode]]) -> cst.Module:
    """``module`` with each old node (found by identity, in one pass) replaced by its new one."""
    return module.visit(_Replace({id(old): new for old, new in pairs}))


def _statement_of(module: cst.Module) -> tuple[cst.BaseSuite | cst.Module, int]:
    """(the block that holds the statement, the statement's index in it)."""
    body = module.body[0].body if isinstance(module.body[0], cst.If) and _code(module.body[0].test) == "True" else module
    return body, len(body.body) - 1


def _insert_before(module: cst.Module, text: str, first: bool = False) -> cst.Module:
    """``module`` with the statement ``text`` before the rewritten one (with ``first``, before
    the first of the statements rewritten together), at its indentation."""
    body, index = _statement_of(module)
    if first:
        index = 0
    statement = cst.parse_statement(text)
    new_body = body.with_changes(body=[*body.body[:index], statement, *body.body[index:]])
    return new_body if body is module else module.with_deep_changes(body, body=new_body.body)


# -- the rewrites, one per pattern ---------------------------------------------------------------


def _is_copy_into_contiguous(node) -> bool:
    """``.contiguous()``, or a ``.contiguous``/``.to`` into ``contiguous_format``."""
    if not isinstance(node, cst.Call) or not isinstance(node.func, cst.Attribute):
        return False
    name, fmt = node.func.attr.value, _arg(node, 99, "memory_format")
    if name == "contiguous":
        return not node.args or (fmt is not None and _code(fmt.value).endswith("contiguous_format"))
    return name == "to" and fmt is not None and _code(fmt.value).endswith("contiguous_format")


def keep_format_in_copy(module: cst.Module, facts: Facts) -> cst.Module:
    """``.contiguous()`` (or a copy ``.to``/``.contiguous`` into ``contiguous_format``) asks for
    the channels_last format instead (explicit_copy)."""
    call = _the_one(_find(module, _is_copy_into_contiguous), "copy into contiguous order (.contiguous())")
    return _replace(module, call, _with_memory_format(call, _expr(_memory_format(facts))))


def _with_memory_format(call: cst.Call, value: cst.BaseExpression) -> cst.Call:
    """``call`` with its ``memory_format=`` argument set to ``value`` (added where it has none)."""
    fmt = _arg(call, 99, "memory_format")
    if fmt is not None:
        return call.with_deep_changes(fmt, value=value)
    return call.with_changes(args=[*call.args, cst.Arg(value, keyword=cst.Name("memory_format"), equal=cst.AssignEqual(
        cst.SimpleWhitespace(""), cst.SimpleWhitespace("")))])


def follow_format_in_copy(module: cst.Module, facts: Facts) -> cst.Module:
    """``x.contiguous()`` (or a copy into ``contiguous_format``) whose input is already dense in
    the channels_last format asks for the format ``x`` is in: no copy where ``x`` is a dense
    channels_last map, the same copy as before where it is not, so code a contiguous model runs
    too is not made to write channels_last (explicit_copy)."""
    call = _the_one(_find(module, _is_copy_into_contiguous), "copy into contiguous order (.contiguous())")
    cl = _memory_format(facts)
    x = call.func.value
    if _simple(x):
        ref, receiver = _code(x), x
    else:
        ref = facts.new_name("_copied")
        receiver = _expr(f"({ref} := {_code(x)})")
    follow = _expr(f"{cl} if {ref}.is_contiguous(memory_format={cl}) else {facts.torch}.contiguous_format")
    new = _with_memory_format(call, follow)
    return _replace(module, call, new.with_changes(func=new.func.with_changes(value=receiver)))


def _spatial(facts: Facts) -> set[int]:
    return set(range(2, facts.rank))


def pool_by_sum(module: cst.Module, facts: Facts) -> cst.Module:
    """A mean over all spatial dimensions, ``x.mean((2, 3), keepdim=True)`` (or
    ``torch.mean(x, ...)``, ``F.adaptive_avg_pool2d(x, 1)``), becomes ``x.sum((2, 3),
    keepdim=True) / (x.shape[2] * x.shape[3])``: the same sum and division as the mean, so the
    same values, but its backward broadcasts the gradient as a view instead of writing it
    contiguous (mean_backward). With ``facts.dims``, the mean over those dimensions instead (a
    mean over the channels, whose N×1×H×W gradient PyTorch's backward writes full size and
    contiguous)."""
    spatial = {d % facts.rank for d in facts.dims} if facts.dims else _spatial(facts)

    def is_mean(node) -> bool:
        if not isinstance(node, cst.Call):
            return False
        name = _callee(node)
        if name == "mean":
            method = _is_method(node, facts.torch)
            dims = _arg(node, 0 if method else 1, "dim")
            return dims is not None and _ints(dims.value) is not None and _normal(_ints(dims.value), facts.rank) == spatial
        if name in ("adaptive_avg_pool2d", "adaptive_avg_pool3d") and spatial == _spatial(facts):
            size = _arg(node, 1, "output_size")
            values = _ints(size.value) if size is not None else None
            return values is not None and set(values) == {1}
        return False

    call = _the_one(_find(module, is_mean), "mean over the spatial dimensions" if not facts.dims else
                    f"mean over dimensions {tuple(sorted(spatial))}")
    method = _callee(call) == "mean" and _is_method(call, facts.torch)
    x = call.func.value if method else _arg(call, 0, "input").value
    if _callee(call) == "mean":
        dims_text = _code(_arg(call, 0 if method else 1, "dim").value)
        keep = _arg(call, 1 if method else 2, "keepdim")
        keepdim = _bool(keep.value) if keep is not None else False
        if keepdim is None:
            raise Refused("the mean's keepdim is not a literal True or False")
    else:
        dims_text, keepdim = repr(tuple(sorted(spatial))), True
    sizes = sorted(spatial)
    if _simple(x):
        ref, first = _code(x), _code(x)
    else:
        ref = facts.new_name("_pooled")
        first = f"({ref} := {_code(x)})"
    divisor = " * ".join(f"{ref}.shape[{d}]" for d in sizes)
    text = f"{first}.sum({dims_text}{', keepdim=True' if keepdim else ''}) / ({divisor})"
    return _replace(module, call, _expr(text))


def add_the_branches(module: cst.Module, facts: Facts) -> cst.Module:
    """A sum (or mean) over the dimension images were stacked along, ``torch.sum(x, dim=1)``,
    becomes the sum of the branches, ``sum(x.unbind(1))`` (``sum(branches)`` when the line
    stacks them itself): the same additions, and each keeps the images' format
    (stack_reduce)."""
    if not facts.dims:
        raise Refused("the reduction is not over one stacked dimension")
    stacked_dims = {d % (facts.rank + 1) for d in facts.dims}  # those the op's shapes allow

    def is_reduction(node) -> bool:
        if not isinstance(node, cst.Call) or _callee(node) not in ("sum", "mean"):
            return False
        method = _is_method(node, facts.torch)
        if not method and not (isinstance(node.func, cst.Attribute) and _code(node.func.value) == facts.torch):
            return False  # the builtin sum
        dim = _arg(node, 0 if method else 1, "dim")
        values = _ints(dim.value) if dim is not None else None
        return values is not None and len(values) == 1 and values[0] % (facts.rank + 1) in stacked_dims

    call = _the_one(_find(module, is_reduction), "reduction over the stacked dimension")
    method = _is_method(call, facts.torch)
    stacked = _ints(_arg(call, 0 if method else 1, "dim").value)[0] % (facts.rank + 1)
    keep = _arg(call, 1 if method else 2, "keepdim")
    if keep is not None and _bool(keep.value) is not False:
        raise Refused("the reduction keeps the stacked dimension (keepdim)")
    if "sum" in facts.taken:
        raise Refused("the name sum is taken where this line runs, so the builtin sum cannot add the branches")
    x = call.func.value if method else _arg(call, 0, "input").value
    mean = _callee(call) == "mean"
    if isinstance(x, cst.Call) and _callee(x) == "stack" and not _is_method(x, facts.torch):
        dim = _arg(x, 1, "dim")
        given = _ints(dim.value) if dim is not None else (0,)
        if given is not None and given[0] % (facts.rank + 1) == stacked % (facts.rank + 1):
            branches = _code(_arg(x, 0, "tensors").value)
            text = f"sum({branches})" + (f" / len({branches})" if mean else "")
            return _replace(module, call, _expr(text))
    if _simple(x) or not mean:
        text = f"sum({_code(x)}.unbind({stacked}))" + (f" / {_code(x)}.shape[{stacked}]" if mean else "")
    else:
        ref = facts.new_name("_stacked")
        text = f"sum(({ref} := {_code(x)}).unbind({stacked})) / {ref}.shape[{stacked}]"
    return _replace(module, call, _expr(text))


def broadcast_the_map(module: cst.Module, facts: Facts) -> cst.Module:
    """``F.interpolate(p, size=s, ...)`` of an N×C×1×1 map becomes
    ``p.expand(-1, -1, *s).contiguous(memory_format=...)``: every output pixel is the one input
    pixel, written once, in the format the map's strides show (channels_last where C is
    innermost, else contiguous), as the interpolation wrote it (nc11_broadcast)."""
    def is_resize(node) -> bool:
        return isinstance(node, cst.Call) and _callee(node) in ("interpolate", "upsample", "upsample_bilinear",
                                                                  "upsample_nearest")

    call = _the_one(_find(module, is_resize), "interpolation")
    x = _arg(call, 0, "input")
    size = _arg(call, 1, "size")
    if x is None or size is None or (isinstance(size.value, cst.Name) and size.value.value == "None"):
        raise Refused("the interpolation is given no output size (a scale factor, say)")
    values = size.value
    if isinstance(values, (cst.Tuple, cst.List)):
        spatial = ", ".join(_code(e.value) for e in values.elements)
    else:
        spatial = f"*{_code(values)}"
    # the format follows the map's own strides, as the interpolation's output did: channels_last
    # where it is laid out so (C innermost), contiguous where a contiguous run made it
    cl = _memory_format(facts)
    if _simple(x.value):
        ref = first = _code(x.value)
    else:
        ref = facts.new_name("_map")
        first = f"({ref} := {_code(x.value)})"
    follow = f"{cl} if {ref}.stride(1) == 1 and ({ref}.shape[1] == 1 or {ref}.stride(-1) > 1) else {facts.torch}.contiguous_format"
    text = f"{first}.expand(-1, -1, {spatial}).contiguous(memory_format={follow})"
    return _replace(module, call, _expr(text))


def _channel_slice(node) -> bool:
    """``x[:, a:b]`` (more dimensions whole): a slice of dimension 1 alone, without a step."""
    if not isinstance(node, cst.Subscript) or len(node.slice) < 2:
        return False
    first, second = (e.slice for e in node.slice[:2])
    full = isinstance(first, cst.Slice) and first.lower is None and first.upper is None and first.step is None
    rest = all(isinstance(e.slice, cst.Slice) and e.slice.lower is None and e.slice.upper is None
               for e in node.slice[2:])
    return full and rest and isinstance(second, cst.Slice) and second.step is None


def split_the_channels(module: cst.Module, facts: Facts) -> cst.Module:
    """Slices that cut one tensor's channels into consecutive parts, ``x[:, :k]`` and
    ``x[:, k:]``, become the parts of ``x.split([k, x.shape[1] - k], dim=1)``, taken once
    before the line: split's backward is a cat, which keeps the format, where a slice's writes
    its zeros contiguous (channel_slice). The slices may lie on consecutive statements of one
    block (``a = x[:, :k]`` then ``b = x[:, k:]``), rewritten together, where none of them
    assigns a name the slices read."""
    found = _find(module, _channel_slice)
    bases: dict[str, list] = {}
    for node in found:
        bases.setdefault(_code(node.value), []).append(node)
    where = "these statements" if _statement_count(module) > 1 else "this line"
    if len(bases) != 1:
        raise Refused(f"the slices of {where} are not of one tensor's channels" if bases else
                      f"{where} has no slice of the channels (x[:, a:b])")
    (base, parts), = bases.items()
    if not _simple(parts[0].value):
        raise Refused(f"the sliced tensor ({base}) is an expression, not a name: split it by hand")
    bounds = [tuple(_code(b) if b is not None else None for b in (n.slice[1].slice.lower, n.slice[1].slice.upper))
              for n in parts]
    chain, left = [], list(range(len(parts)))
    start = next((i for i in left if bounds[i][0] in (None, "0")), None)
    while start is not None:
        chain.append(start)
        left.remove(start)
        upper = bounds[start][1]
        start = next((i for i in left if upper is not None and bounds[i][0] == upper), None)
    if not chain or left or bounds[chain[-1]][1] is not None:
        raise Refused("the slices do not cut the channels into consecutive parts that cover them all: the part not "
                      "used would get contiguous zeros from PyTorch's own backward of a split too")
    if _statement_count(module) > 1:
        read = {n.value for p in parts for n in _find(p, lambda n: isinstance(n, cst.Name))}
        written = read & _assigned(module)
        if written:
            raise Refused(f"these statements assign {sorted(written)[0]}, which the slices read: they cannot be taken "
                          "together before them")
    sizes = []
    for i in chain:
        lo, hi = bounds[i][0] or "0", bounds[i][1]
        if hi is None:
            sizes.append(f"{base}.shape[1] - {lo}" if lo != "0" else f"{base}.shape[1]")
        else:
            sizes.append(hi if lo == "0" else f"{hi} - ({lo})")
    names = [facts.new_name(f"{base.split('.')[-1]}_{k}") for k in range(len(chain))]
    module = _replace_all(module, [(parts[i], cst.Name(name)) for name, i in zip(names, chain)])
    return _insert_before(module, f"{', '.join(names)}{',' if len(names) == 1 else ''} = "
                                  f"{base}.split([{', '.join(sizes)}], dim=1)\n", first=True)


def _statement_count(module: cst.Module) -> int:
    body, index = _statement_of(module)
    return index + 1


def _assigned(module: cst.Module) -> set[str]:
    """The names the statements of ``module`` bind (assignment targets, augmented and
    annotated ones, and walrus targets)."""
    names: set[str] = set()
    for node in _find(module, lambda n: isinstance(n, (cst.AssignTarget, cst.AugAssign, cst.AnnAssign,
                                                        cst.NamedExpr))):
        target = node.target
        names |= {n.value for n in _find(target, lambda n: isinstance(n, cst.Name))} if not isinstance(
            target, cst.Name) else {target.value}
    return names


def skip_the_whole_slice(module: cst.Module, facts: Facts) -> cst.Module:
    """A slice of the leading channels, ``x[:, :k]``, is skipped when it keeps them all
    (``x if x.shape[1] == k else x[:, :k]``): the same values in the same memory, without the
    slice whose backward writes the gradient contiguous, and without a view for a later
    in-place write to go through."""
    def leading_slice(node) -> bool:
        if not _channel_slice(node):
            return False
        second = node.slice[1].slice
        return second.upper is not None and (second.lower is None or _code(second.lower) == "0")

    node = _the_one(_find(module, leading_slice), "slice of the leading channels (x[:, :k])")
    if not _simple(node.value):
        raise Refused(f"the sliced tensor ({_code(node.value)}) is an expression, not a name: skip the slice by hand")
    base, k = _code(node.value), _code(node.slice[1].slice.upper)
    return _replace(module, node, _expr(f"({base} if {base}.shape[1] == {k} else {_code(node)})"))


def out_of_place(module: cst.Module, facts: Facts) -> cst.Module:
    """``y += z`` on a view becomes ``y = y + z`` (and ``y.add_(z)`` ``y = y.add(z)``): the same
    values, without the in-place write into a view whose gradient autograd copies into contiguous
    order (inplace_view). The caller checks that nothing reads the view's base afterwards."""
    aug = _find(module, lambda n: isinstance(n, cst.AugAssign))
    calls = _find(module, lambda n: isinstance(n, cst.Expr) and isinstance(n.value, cst.Call)
                  and isinstance(n.value.func, cst.Attribute) and n.value.func.attr.value.endswith("_")
                  and not n.value.func.attr.value.startswith("_"))
    node = _the_one(aug + calls, "in-place operation")
    if isinstance(node, cst.AugAssign):
        if not isinstance(node.target, cst.Name):
            raise Refused(f"the in-place target ({_code(node.target)}) is not a name: writing it out of place would "
                          "change what it writes into")
        op = _code(node.operator).strip().rstrip("=")
        text = f"{node.target.value} = {node.target.value} {op} {_code(node.value)}"
        return _replace(module, node, cst.parse_statement(text).body[0])
    call = node.value
    if not isinstance(call.func.value, cst.Name):
        raise Refused(f"the in-place target ({_code(call.func.value)}) is not a name")
    target = call.func.value.value
    text = f"{target} = {_code(call.with_deep_changes(call.func.attr, value=call.func.attr.value[:-1]))}"
    return _replace(module, node, cst.parse_statement(text).body[0])


def flatten_in_memory_order(module: cst.Module, facts: Facts) -> cst.Module:
    """A channels_last weight reshaped for a batch norm, ``F.batch_norm(w.reshape(1, O, -1),
    ...).reshape_as(w)``, is flattened in its memory order, ``w.permute(0, 2, 3, 1)`` (the
    reshape of which is a view), and permuted back after: the same statistics per output
    channel, no copy of the weight (weight_rebuilt). The order follows the weight's layout, so
    a contiguous weight is flattened as before and no copy is added there."""
    order = tuple([0, *range(2, facts.rank), 1])
    back = tuple([0, facts.rank - 1, *range(1, facts.rank - 1)])

    def is_norm(node) -> bool:
        return isinstance(node, cst.Call) and _callee(node) in ("batch_norm", "group_norm", "layer_norm",
                                                                  "instance_norm")

    def is_back(node) -> bool:
        return (isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute)
                and node.func.attr.value in ("reshape_as", "view_as") and is_norm(node.func.value))

    outer = _the_one(_find(module, is_back), "normalisation of a flattened weight shaped back (.reshape_as(w))")
    norm = outer.func.value
    w = outer.args[0].value if outer.args else None
    flat = _arg(norm, 0, "input")
    if w is None or flat is None or not _simple(w):
        raise Refused("the weight is not a name or attribute")
    # the weight's own layout picks the order: channels_last is flattened in NHWC order, a
    # contiguous weight (a model run contiguous through the same code) as it was
    ws, flag = _code(w), facts.new_name("_cl")
    is_cl = f"{ws}.stride(1) == 1 and ({ws}.shape[1] == 1 or {ws}.stride(-1) > 1)"
    permuted = f"({ws}.permute{order} if ({flag} := {is_cl}) else {ws})"

    def is_flattening(node) -> bool:
        return (isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute)
                and node.func.attr.value in ("reshape", "view") and _code(node.func.value) == _code(w))

    inner = flat.value
    if isinstance(inner, cst.Name):  # flattened into a name first: `flat = w.reshape(1, O, -1)`
        assigned = [n.value for n in _find(module, lambda n: isinstance(n, cst.Assign) and len(n.targets) == 1
                                           and _code(n.targets[0].target) == inner.value)]
        inner = assigned[-1] if assigned else None
    if inner is None or not is_flattening(inner):
        raise Refused("the normalised tensor is not a reshape of the weight")
    new_inner = inner.with_changes(func=_expr(f"{permuted}.{inner.func.attr.value}"))
    identity = tuple(range(facts.rank))
    shaped_back = (f".reshape({ws}.permute{order}.shape if {flag} else {ws}.shape)"
                   f".permute({back} if {flag} else {identity})")
    new_outer = _expr(f"{_code(norm)}{shaped_back}")
    if flat.value is inner:
        new_outer = _expr(f"{_code(norm.with_deep_changes(flat, value=new_inner))}{shaped_back}")
        return _replace(module, outer, new_outer)
    return _replace_all(module, [(inner, new_inner), (outer, new_outer)])


#: the steps of a channel shuffle written by hand, in order: a tensor split into (N, g, C/g, ...),
#: its two group dimensions swapped, made contiguous (optional before a reshape), merged back
_PLAIN, _SPLIT, _SWAPPED, _COPIED, _MERGED = range(5)


@dataclass(frozen=True)
class _Step:
    stage: int
    source: str = ""  #: the tensor shuffled (code), from the split on
    groups: str = ""  #: the number of groups (code): the split's second size
    rank: int = 0  #: of the split view


def _shuffle_step(node, names: dict[str, _Step], torch_name: str | None) -> _Step:
    """Which step of a channel shuffle ``node`` computes, given the steps ``names`` hold."""
    if isinstance(node, cst.Name) and node.value in names:
        return names[node.value]
    if not isinstance(node, cst.Call):
        return _Step(_PLAIN)
    name = _callee(node)
    positional = [a.value for a in node.args if a.keyword is None and not a.star]
    if len(positional) != len(node.args):
        return _Step(_PLAIN)
    if _is_method(node, torch_name):
        inner, args = _shuffle_step(node.func.value, names, torch_name), positional
    elif name in ("transpose", "flatten") and positional:  # torch.transpose(x, 1, 2)
        inner, args = _shuffle_step(positional[0], names, torch_name), positional[1:]
    else:
        return _Step(_PLAIN)
    if name in ("view", "reshape"):
        sizes = [e.value for e in args[0].elements] if len(args) == 1 and isinstance(args[0], cst.Tuple) else args
        if inner.stage == _PLAIN and len(sizes) >= 4:
            return _Step(_SPLIT, _code(node.func.value), _code(sizes[1]), len(sizes))
        if (inner.stage == _COPIED or (inner.stage == _SWAPPED and name == "reshape")) and len(sizes) == inner.rank - 1:
            return _Step(_MERGED, inner.source, inner.groups, inner.rank)
    elif name in ("transpose", "swapaxes", "swapdims") and inner.stage == _SPLIT:
        if len(args) == 2 and {_int(a) for a in args} == {1, 2}:
            return _Step(_SWAPPED, inner.source, inner.groups, inner.rank)
    elif name == "permute" and inner.stage == _SPLIT:
        order = [_int(a) for a in args] if len(args) > 1 else list(_ints(args[0]) or []) if args else []
        if order == [0, 2, 1, *range(3, inner.rank)]:
            return _Step(_SWAPPED, inner.source, inner.groups, inner.rank)
    elif name == "contiguous" and not args and inner.stage == _SWAPPED:
        return _Step(_COPIED, inner.source, inner.groups, inner.rank)
    elif name == "flatten" and inner.stage in (_SWAPPED, _COPIED) and [_int(a) for a in args] == [1, 2]:
        return _Step(_MERGED, inner.source, inner.groups, inner.rank)
    return _Step(_PLAIN)


def shuffle_by_torch(module: cst.Module, facts: Facts) -> cst.Module:
    """The rewrite of a channel shuffle written by hand (``x.view(n, g, c // g, h, w)``, then
    ``.transpose(1, 2)`` and ``.contiguous()``, then ``.view(n, c, h, w)``), in one statement or
    over consecutive ones, into one ``y = torch.nn.functional.channel_shuffle(x, g)``, whose
    values are the same and which keeps the format. The statements must be exactly the shuffle's:
    the first splits the tensor, each one after takes the step before it further, the last
    merges the channels back (or returns the merged name): a statement that does anything else
    refuses, so nothing but the shuffle is replaced. Whether the names the shuffle's steps bind
    are read after it is for the caller to check (:func:`shuffle_temporaries`)."""
    if facts.torch is None:
        raise Refused("torch is not imported where this line runs")
    body, last = _statement_of(module)
    statements = list(body.body)
    names: dict[str, _Step] = {}
    step = _Step(_PLAIN)
    target = None
    for k, line in enumerate(statements):
        if not isinstance(line, cst.SimpleStatementLine) or len(line.body) != 1:
            raise Refused("the shuffle's statements are not simple ones")
        small = line.body[0]
        if isinstance(small, cst.Return) and k == len(statements) - 1 and k > 0 \
                and isinstance(small.value, cst.Name) and small.value.value == target:
            target = None
            break
        if not (isinstance(small, cst.Assign) and len(small.targets) == 1
                and isinstance(small.targets[0].target, cst.Name)) and not (
                isinstance(small, cst.Return) and small.value is not None and k == len(statements) - 1):
            raise Refused("a statement of the shuffle is not an assignment to one name")
        new = _shuffle_step(small.value, names, facts.torch)
        if new.stage == _PLAIN or (k == 0) != (step.stage == _PLAIN) or new.stage <= step.stage \
                or (k > 0 and new.source != step.source):
            raise Refused("these statements are not a channel shuffle written view -> transpose -> .contiguous() "
                          "-> view, and only that")
        step = new
        target = small.targets[0].target.value if isinstance(small, cst.Assign) else None
        if target is not None:
            names[target] = step
    if step.stage != _MERGED:
        raise Refused("the channels are not merged back (view or reshape to the map's shape) in these statements")
    call = f"{facts.torch}.nn.functional.channel_shuffle({step.source}, {step.groups})"
    written = cst.parse_statement(f"{target} = {call}\n" if target is not None else f"return {call}\n")
    written = written.with_changes(leading_lines=statements[0].leading_lines,
                                   trailing_whitespace=statements[-1].trailing_whitespace)
    return module.with_deep_changes(body, body=[written]) if body is not module else module.with_changes(
        body=[written])


def shuffle_temporaries(module: cst.Module) -> set[str]:
    """The names a shuffle's statements bind other than its last one's: :func:`shuffle_by_torch`
    binds none of them, so none may be read after it."""
    body, _ = _statement_of(module)
    names: set[str] = set()
    for line in body.body[:-1]:
        for small in getattr(line, "body", ()):
            if isinstance(small, cst.Assign):
                names |= {t.target.value for t in small.targets if isinstance(t.target, cst.Name)}
    last = body.body[-1].body[0] if isinstance(body.body[-1], cst.SimpleStatementLine) else None
    if isinstance(last, cst.Assign):
        names -= {t.target.value for t in last.targets if isinstance(t.target, cst.Name)}
    return names


# -- joins: a token or row tensor made into a map, candidates that verification proves -------------


def _is_swap_of_last_two(node, rank: int) -> bool:
    """``y.transpose(a, b)`` or ``y.permute(...)`` that swaps the last two of ``rank``
    dimensions and nothing else."""
    if not isinstance(node, cst.Call) or not isinstance(node.func, cst.Attribute) or node.func.attr.value not in (
            "transpose", "permute", "swapaxes", "swapdims"):
        return False
    values = [_int(a.value) for a in node.args if a.keyword is None and not a.star]
    if len(values) == 1 and isinstance(node.args[0].value, (cst.Tuple, cst.List)):
        values = list(_ints(node.args[0].value) or [None])
    if None in values or any(a.keyword is not None for a in node.args):
        return False
    if node.func.attr.value == "permute":
        return len(values) == rank and [v % rank for v in values] == [*range(rank - 2), rank - 1, rank - 2]
    return len(values) == 2 and {v % rank for v in values} == {rank - 2, rank - 1}


def _reshape_args(call: cst.Call) -> list[cst.BaseExpression] | None:
    """The four sizes of ``x.reshape(a, b, c, d)`` (or ``x.view``, or one tuple of four)."""
    args = [a for a in call.args if a.keyword is None and not a.star]
    if len(args) != len(call.args):
        return None
    if len(args) == 1 and isinstance(args[0].value, cst.Tuple):
        args = list(args[0].value.elements)
    return [a.value for a in args] if len(args) == 4 else None


def format_of_weight(weight: str, facts: Facts) -> str:
    """An expression for the format ``weight`` (a convolution's, written as code) is laid out
    in: the format the model was put in, which a convolution computes in. A channels_last
    kernel has its input channels innermost (stride 1), whatever its size, where a contiguous
    one has them so only with a 1×1 kernel, and then its last stride is 1 too."""
    t = facts.torch
    if t is None:
        raise Refused("torch is not imported where this line runs, so the rewrite cannot name a memory format")
    return f"{t}.{facts.cl} if {weight_in_format(weight, facts)} else {t}.contiguous_format"


def weight_in_format(weight: str, facts: Facts) -> str:
    """An expression that is true where ``weight`` (a convolution's, as code) is laid out in
    the format (:func:`format_of_weight`)."""
    w = facts.new_name("_w")
    return f"(({w} := {weight}).stride(1) == 1 and ({w}.shape[1] == 1 or {w}.stride(-1) > 1))"


@functools.cache  # one rewrite for one argument: two causes of one statement rewrite it once
def map_in_nhwc_order(rank: int, weight: str | None = None) -> Callable[[cst.Module, Facts], cst.Module]:
    """The rewrite of ``x.reshape(B, C, H, W)`` of a tensor ``x`` of ``rank`` dimensions laid
    out (B, c1 .. ck, N), with N = H·W and c1·..·ck = C (as the recorded shapes show), into
    ``x.permute(0, rank - 1, 1 .. k).reshape(B, H, W, C).permute(0, 3, 1, 2)``: the same index
    permutation of the same values, written in NHWC order, so the map is a channels_last view
    and the reshape a view where ``x`` is a transposed view of tokens (joins). Where ``x`` is
    itself a swap of its last two dimensions, the two permutations are written as one. With
    ``weight`` (a convolution's weight, as code), the map is then made contiguous in that
    weight's format (:func:`format_of_weight`): no copy where the model runs channels_last, the
    copy it always made where it runs contiguous."""
    def rewrite(module: cst.Module, facts: Facts) -> cst.Module:
        def is_reshape(node) -> bool:
            return (isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute)
                    and node.func.attr.value in ("reshape", "view") and _reshape_args(node) is not None)

        call = _the_one(_find(module, is_reshape), "reshape into four dimensions (x.reshape(B, C, H, W))")
        b, ch, h, w = (_code(a) for a in _reshape_args(call))
        x = call.func.value
        if isinstance(x, cst.Call) and _is_swap_of_last_two(x, rank):  # x = y with its last two swapped
            y = _code(x.func.value)
            order = [0, rank - 2, *range(1, rank - 2), rank - 1]
            first = y if order == list(range(rank)) else f"{y}.permute({', '.join(map(str, order))})"
        else:
            order = [0, rank - 1, *range(1, rank - 1)]
            first = f"{_code(x)}.permute({', '.join(map(str, order))})"
        text = f"{first}.reshape({b}, {h}, {w}, {ch}).permute(0, 3, 1, 2)"
        if weight is not None:
            text += f".contiguous(memory_format={format_of_weight(weight, facts)})"
        return _replace(module, call, _expr(text))
    return rewrite


def _holds(node: cst.CSTNode, other: cst.CSTNode) -> bool:
    """Whether ``other`` is ``node`` or lies inside it."""
    return bool(_find(node, lambda n: n is other))


def _is_reshape_of(count: int) -> Callable[[cst.CSTNode], bool]:
    """``x.reshape(...)`` or ``x.view(...)`` of ``count`` sizes, written out one by one."""
    def test(node) -> bool:
        if not (isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute)
                and node.func.attr.value in ("reshape", "view")):
            return False
        return len(node.args) == count and all(a.keyword is None and not a.star for a in node.args)
    return test


@functools.cache  # one rewrite for one argument: two causes of one statement rewrite it once
def split_map_in_nhwc_order(k: int, rank: int) -> Callable[[cst.Module, Facts], cst.Module]:
    """The rewrite of ``x.reshape(B, c1 .. ck, s1 .. sm)`` of a map ``x`` (B, C, H, W), with
    c1·..·ck = C and s1·..·sm = H·W as the recorded shapes show, into ``x.permute(0, 2, 3,
    1).reshape(B, s1 .. sm, c1 .. ck).permute(...)`` back to the same order: the same view of
    the same elements, whose gradient, where the backward must copy it, is copied in NHWC order
    into a channels_last map; only where ``x`` is channels_last, so a contiguous map keeps its
    reshape (joins, the map made into tokens or windows)."""
    def rewrite(module: cst.Module, facts: Facts) -> cst.Module:
        calls = [c for n in range(k + 2, k + 9) for c in _find(module, _is_reshape_of(n))]
        # the reshape the others are applied to: the one whose receiver holds no other
        inner = [c for c in calls if not any(o is not c and _holds(c.func.value, o) for o in calls)]
        call = _the_one(inner, "reshape of a map into its channels and positions (x.reshape(B, c, .., s, ..))")
        args = [_code(a.value) for a in call.args]
        m = len(args) - 1 - k
        if m < 1:
            raise Refused("the reshape keeps no positions")
        to_nhwc = ", ".join(map(str, [0, *range(2, rank), 1]))
        back = ", ".join(map(str, [0, *range(m + 1, m + k + 1), *range(1, m + 1)]))
        x = call.func.value
        ref = _code(x) if _simple(x) else facts.new_name("_map")
        first = _code(x) if _simple(x) else f"({ref} := {_code(x)})"
        cl = _memory_format(facts)
        # the order the map is in decides: a contiguous map keeps the reshape it had
        text = (f"({ref}.permute({to_nhwc}).reshape({', '.join([args[0], *args[1 + k:], *args[1:1 + k]])})"
                f".permute({back}) if {first}.is_contiguous(memory_format={cl}) "
                f"else {ref}.{call.func.attr.value}({', '.join(args)}))")
        return _replace(module, call, _expr(text))
    return rewrite


@functools.cache  # one rewrite for one argument: two causes of one statement rewrite it once
def permuted_map_in_nhwc_order(rank: int, weight: str | None = None) -> Callable[[cst.Module, Facts], cst.Module]:
    """The rewrite of ``y.permute(p0, p1, .., pr).reshape(B, C, H, W)`` whose permuted second
    dimension alone is the channels (as the recorded shapes show) into ``y.permute(p0, p2, ..,
    pr, p1).reshape(B, H, W, C).permute(0, 3, 1, 2)``: the same values, gathered in NHWC order
    by the one copy the reshape always made, so the map is a channels_last view (joins, windows
    made into a map). The permute may be the statement before, ``y = z.permute(..)``, given
    with it. With ``weight``, the map is then made contiguous in that weight's format
    (:func:`format_of_weight`)."""
    def rewrite(module: cst.Module, facts: Facts) -> cst.Module:
        def is_permute(node) -> bool:
            return (isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute)
                    and node.func.attr.value == "permute" and len(node.args) > rank
                    and all(a.keyword is None and _int(a.value) is not None for a in node.args))

        def nhwc(permute: cst.Call) -> cst.Call:
            order = [a.value for a in permute.args]
            return permute.with_changes(args=[cst.Arg(v, comma=a.comma) for v, a in zip(
                [order[0], *order[2:], order[1]], permute.args)])

        back = ", ".join(map(str, [0, rank - 1, *range(1, rank - 1)]))
        fmt = f".contiguous(memory_format={format_of_weight(weight, facts)})" if weight is not None else ""
        gathers = _find(module, lambda n: _is_reshape_of(rank)(n) and is_permute(n.func.value))
        if gathers:
            call = _the_one(gathers, "reshape of a permuted tensor into a map (.permute(..).reshape(B, C, H, W))")
            b, ch, *space = (_code(a.value) for a in call.args)
            text = f"{_code(nhwc(call.func.value))}.reshape({', '.join([b, *space, ch])}).permute({back}){fmt}"
            return _replace(module, call, _expr(text))
        # the permute one statement before: ``y = z.permute(..)`` then ``y.reshape(B, C, H, W)``
        body, _ = _statement_of(module)
        if len(body.body) != 2:
            raise Refused("no permute before the reshape into a map")
        first, second = body.body
        assign = first.body[0] if isinstance(first, cst.SimpleStatementLine) and len(first.body) == 1 else None
        if not (isinstance(assign, cst.Assign) and len(assign.targets) == 1
                and isinstance(assign.targets[0].target, cst.Name) and is_permute(assign.value)):
            raise Refused("the statement before the reshape is no y = z.permute(...)")
        name = assign.targets[0].target.value
        calls = _find(second, lambda n: _is_reshape_of(rank)(n) and isinstance(n.func.value, cst.Name)
                      and n.func.value.value == name)
        call = _the_one(calls, f"reshape of {name} into a map ({name}.reshape(B, C, H, W))")
        b, ch, *space = (_code(a.value) for a in call.args)
        return _replace_all(module, [(assign.value, nhwc(assign.value)),
                                     (call, _expr(f"{name}.reshape({', '.join([b, *space, ch])}).permute({back}){fmt}"))])
    return rewrite


@functools.cache  # one rewrite for one argument: two causes of one statement rewrite it once
def copy_in_format_of(weight: str) -> Callable[[cst.Module, Facts], cst.Module]:
    """``.contiguous()`` (or a copy into ``contiguous_format``) of a map, made in the format of
    ``weight`` (a convolution's weight, as code; :func:`format_of_weight`) instead: no copy where
    the map is a dense view in the format already and the model runs channels_last, the same one
    copy into the format where its channels lie innermost but it is not dense, the copy it always
    made where the model runs contiguous (joins)."""
    def rewrite(module: cst.Module, facts: Facts) -> cst.Module:
        call = _the_one(_find(module, _is_copy_into_contiguous), "copy into contiguous order (.contiguous())")
        return _replace(module, call, _with_memory_format(call, _expr(format_of_weight(weight, facts))))
    return rewrite


@functools.cache
def call_in_format_of(name: str, weight: str) -> Callable[[cst.Module, Facts], cst.Module]:
    """The one call of ``name`` in the statement, its result made contiguous in the format of
    ``weight`` (:func:`format_of_weight`): the copy a function no longer makes, made where the
    caller, which knows the format, calls it (joins)."""
    def rewrite(module: cst.Module, facts: Facts) -> cst.Module:
        call = _the_one(_find(module, lambda n: isinstance(n, cst.Call) and _callee(n) == name), f"call of {name}")
        return _replace(module, call, _expr(f"{_code(call)}.contiguous(memory_format={format_of_weight(weight, facts)})"))
    return rewrite


def drop_copy_of_permuted(module: cst.Module, facts: Facts) -> cst.Module:
    """``x.permute(...).contiguous()`` (or ``.transpose``) written as the permuted view alone:
    the copy dropped, where the recorded strides show the view is already a dense map in the
    format (joins)."""
    def is_copy(node) -> bool:
        if not (isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute)
                and node.func.attr.value == "contiguous" and not node.args):
            return False
        inner = node.func.value
        return isinstance(inner, cst.Call) and isinstance(inner.func, cst.Attribute) and inner.func.attr.value in (
            "permute", "transpose")

    call = _the_one(_find(module, is_copy), ".contiguous() of a permuted view")
    return _replace(module, call, call.func.value)


_OPERATORS = {"add": (cst.Add, "+"), "mul": (cst.Multiply, "*"), "sub": (cst.Subtract, "-")}


@functools.cache  # one rewrite for one argument: two causes of one statement rewrite it once
def meet_in_format(op: str) -> Callable[[cst.Module, Facts], cst.Module]:
    """The one ``a + b`` (or ``*``, ``-``) of the statement, where ``a`` is a tensor made of no
    image and ``b`` an image, written ``a.contiguous(memory_format=<b's format>) + b``: the same
    values, ``a`` copied into the format ``b`` is in (no copy where ``b`` is contiguous), so the
    op meets two maps of one format (joins, a new map meeting the path)."""
    def rewrite(module: cst.Module, facts: Facts) -> cst.Module:
        kind, sign = _OPERATORS[op]
        node = _the_one(_find(module, lambda n: isinstance(n, cst.BinaryOperation) and isinstance(n.operator, kind)),
                        f"{op} of two operands (a {sign} b)")
        cl = _memory_format(facts)
        image = facts.new_name("_image")
        left = _code(node.left.with_changes(lpar=[], rpar=[]))
        atom = isinstance(node.left, (cst.Name, cst.Attribute, cst.Call, cst.Subscript)) or node.left.lpar
        text = (f"{left if atom else f'({left})'}.contiguous(memory_format={cl} if ({image} := {_code(node.right)})"
                f".is_contiguous(memory_format={cl}) else {facts.torch}.contiguous_format) {sign} {image}")
        return _replace(module, node, _expr(f"({text})" if node.lpar else text))
    return rewrite


def _product(module: cst.Module) -> cst.BinaryOperation:
    return _the_one(_find(module, lambda n: isinstance(n, cst.BinaryOperation)
                          and isinstance(n.operator, cst.MatrixMultiply)), "matrix product (a @ b)")


def _transposed_product(node: cst.BinaryOperation) -> str:
    """``a @ b`` as ``(b.mT @ a.mT).mT``, written with ``transpose(-2, -1)``; a factor that is
    itself ``z.transpose(-2, -1)`` is written ``z``."""
    def transposed(e: cst.BaseExpression) -> str:
        if isinstance(e, cst.Call) and isinstance(e.func, cst.Attribute) and e.func.attr.value == "transpose":
            values = [_int(a.value) for a in e.args]
            if len(values) == 2 and set(values) == {-1, -2} and all(a.keyword is None for a in e.args):
                return _code(e.func.value)
        text = _code(e)
        simple = _simple(e) or (isinstance(e, cst.Call) and _simple(e.func))
        return f"{text if simple else f'({text})'}.transpose(-2, -1)"
    return f"({transposed(node.right)} @ {transposed(node.left)}).transpose(-2, -1)"


def product_transposed(module: cst.Module, facts: Facts) -> cst.Module:
    """``a @ b`` computed transposed (:func:`_transposed_product`): each output element the same
    dot product, so the result is a transposed view whose last dimension (the positions of a
    map) lies across memory (joins)."""
    node = _product(module)
    return _replace(module, node, _expr(_transposed_product(node)))


@functools.cache  # one rewrite for one argument: two causes of one statement rewrite it once
def product_transposed_in_format_of(weight: str) -> Callable[[cst.Module, Facts], cst.Module]:
    """:func:`product_transposed` where ``weight`` (a convolution's weight, as code) is laid out
    in the format (:func:`weight_in_format`), the product as it was where it is not: the map
    that follows is a channels_last view where the model runs channels_last, and rows as before
    where it runs contiguous (joins)."""
    def rewrite(module: cst.Module, facts: Facts) -> cst.Module:
        node = _product(module)
        text = f"({_transposed_product(node)} if {weight_in_format(weight, facts)} else {_code(node)})"
        return _replace(module, node, _expr(text))
    return rewrite


# -- a chain of reshapes over statements ---------------------------------------------------------

#: the methods a chain of reshapes is made of: each moves elements, none computes
_CHAIN_METHODS = frozenset({"reshape", "view", "transpose", "permute", "contiguous"})


@dataclass(frozen=True)
class ChainStatement:
    """``target = base.m1(..).m2(..)``: a statement of a chain, its steps as written
    (``("reshape", [size as code, or None for -1])``, ``("permute", order)``, ``("transpose",
    a, b)``, ``("contiguous",)``), first to last."""

    target: str
    base: cst.BaseExpression
    steps: tuple


def _chain_statement(node: cst.CSTNode) -> ChainStatement | None:
    if not (isinstance(node, cst.SimpleStatementLine) and len(node.body) == 1 and isinstance(node.body[0], cst.Assign)):
        return None
    assign = node.body[0]
    if len(assign.targets) != 1 or not isinstance(assign.targets[0].target, cst.Name):
        return None
    steps, e = [], assign.value
    while isinstance(e, cst.Call) and isinstance(e.func, cst.Attribute) and e.func.attr.value in _CHAIN_METHODS:
        step = _chain_step(e)
        if step is None:
            return None
        steps.append(step)
        e = e.func.value
    if not steps:
        return None
    return ChainStatement(assign.targets[0].target.value, e, tuple(reversed(steps)))


def _chain_step(call: cst.Call) -> tuple | None:
    name = call.func.attr.value
    args = [a for a in call.args if a.keyword is None and not a.star]
    if len(args) != len(call.args):
        return None
    if name == "contiguous":
        return ("contiguous",) if not args else None
    if name in ("permute", "transpose"):
        values = [_int(a.value) for a in args]
        if len(values) == 1:
            values = list(_ints(args[0].value) or [None])
        if not values or None in values or (name == "transpose" and len(values) != 2):
            return None
        return (name, *values) if name == "transpose" else (name, tuple(values))
    if len(args) == 1:
        if not isinstance(args[0].value, (cst.Tuple, cst.List)):
            return None  # x.view(dtype), or a flat view
        values = [e.value for e in args[0].value.elements]
    else:
        values = [a.value for a in args]
    return ("reshape", tuple(None if _int(v) == -1 else _code(v) for v in values))


def _parsed(statement: Statement) -> list[cst.CSTNode]:
    indent = _indent(statement.text)
    module = cst.parse_module(_WRAPPER + statement.text if indent else statement.text)
    body, _ = _statement_of(module)
    return list(body.body)


def chain_around(path: str, line: int) -> tuple[Statement, list[ChainStatement]]:
    """The longest run of statements around ``line``, one after the other in its block, each
    ``x = x.<reshapes, transposes, permutes>`` of the name the one before assigns (the first of
    any tensor): a chain of moves of one tensor's elements, and its statements."""
    from libcst import ParserSyntaxError

    starts = statement_starts(path)
    here = statement_at(path, line)
    at = starts.index(here.first)

    def parts(k: int) -> ChainStatement | None:
        try:
            nodes = _parsed(statement_at(path, starts[k]))
        except (Refused, ParserSyntaxError):
            return None
        return _chain_statement(nodes[0]) if len(nodes) == 1 else None

    def follows(before: ChainStatement, after: ChainStatement) -> bool:
        return (isinstance(after.base, cst.Name) and after.base.value == before.target == after.target)

    own = parts(at)
    if own is None:
        raise Refused("this line is no x = x.reshape(..) / .transpose(..) / .permute(..) chain")
    chain, first = [own], at
    while first > 0 and (p := parts(first - 1)) is not None and follows(p, chain[0]):
        try:
            statements_from(path, starts[first - 1], len(chain) + 1)
        except Refused:
            break
        chain.insert(0, p)
        first -= 1
    while first + len(chain) < len(starts) and (n := parts(first + len(chain))) is not None and follows(chain[-1], n):
        try:
            statements_from(path, starts[first], len(chain) + 1)
        except Refused:
            break
        chain.append(n)
    return statements_from(path, starts[first], len(chain)), chain


@functools.cache  # one rewrite for one argument: two causes of one statement rewrite it once
def chain_in_format_of(nhwc: str, weight: str) -> Callable[[cst.Module, Facts], cst.Module]:
    """The statements of a chain (:func:`chain_around`) kept as they are where ``weight`` (a
    convolution's weight, as code) is contiguous, and replaced where it is in the format by
    ``nhwc``: the same map gathered from the chain's input in one copy in NHWC order, a
    channels_last view (joins: tokens folded into a map over several statements)."""
    return _chain_in_branch(nhwc, lambda facts, name: weight_in_format(weight, facts))


@functools.cache
def chain_read_in_format(text: str) -> Callable[[cst.Module, Facts], cst.Module]:
    """The statements of a chain whose input is a map kept as they are where the map is
    contiguous, and replaced where it is in the format by ``text``: the same tensor made by
    reading the map in its memory order, in the one copy the chain made (a reshape that merges
    the channels with another dimension: a map cut into patches of tokens)."""
    return _chain_in_branch(text, lambda facts, name: f"{name}.is_contiguous(memory_format={_memory_format(facts)})")


def _chain_in_branch(text: str, test: Callable[[Facts, str], str]) -> Callable[[cst.Module, Facts], cst.Module]:
    """The statements of a chain in the ``else`` of an ``if`` on ``test`` (of the facts and the
    name the chain's input goes by), whose branch assigns ``text`` to the chain's target. An
    input that is no name is first assigned to the target, so both branches read it."""
    def rewrite(module: cst.Module, facts: Facts) -> cst.Module:
        body, _ = _statement_of(module)
        nodes = list(body.body)
        parts = [_chain_statement(n) for n in nodes]
        if None in parts:
            raise Refused("the statements are no chain of reshapes")
        target, base = parts[-1].target, parts[0].base
        before, name = [], _code(base)
        if not _simple(base):
            before = [cst.parse_statement(f"{target} = {_code(base.with_changes(lpar=[], rpar=[]))}")]
            nodes[0] = _replace(cst.Module([nodes[0]]), base, cst.Name(target)).body[0]
            name = target
        branch = cst.parse_statement(f"if {test(facts, name)}:\n    {target} = {text}\nelse:\n    pass\n")
        first = nodes[0]
        branch = branch.with_changes(leading_lines=first.leading_lines,
                                     orelse=branch.orelse.with_changes(body=branch.orelse.body.with_changes(
                                         body=[first.with_changes(leading_lines=[]), *nodes[1:]])))
        new_body = [*before, branch]
        if before:
            new_body[0] = new_body[0].with_changes(leading_lines=first.leading_lines)
            branch = branch.with_changes(leading_lines=[])
            new_body[1] = branch
        return module.with_deep_changes(body, body=new_body) if body is not module else module.with_changes(body=new_body)
    return rewrite
