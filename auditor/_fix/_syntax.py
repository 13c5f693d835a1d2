"""The syntax a fix edits: the statement a cause sits on, parsed with libcst (which keeps the
user's formatting and comments), and the helpers every rewrite uses to find the one expression
its pattern names and write the version that keeps the format.

A rewrite is a function ``(module, facts) -> module`` over the statement's tree; it lives beside
the detector that chooses it (:mod:`._generators`). Where the statement does not have the shape
the rewrite needs, or the rewrite would be ambiguous, it raises :class:`Refused` with the reason,
and the fix stays by hand: a wrong edit is worse than none.
"""

from __future__ import annotations

import functools
import linecache
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import libcst as cst
from libcst.metadata import MetadataWrapper, PositionProvider

#: The wrapper a statement is parsed in, so that its own indentation is kept.
WRAPPER = "if True:\n"


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
    margin = indent(lines[first.first - 1])
    for (_, end), (start, _) in zip(chosen, chosen[1:]):
        between = lines[end:start - 1]
        if any(t.strip() and not t.strip().startswith("#") for t in between) or indent(lines[start - 1]) != margin:
            raise Refused("the statements after this line are not in its block")
    if len(chosen) < count:
        raise Refused("the block ends before the statements the rewrite needs")
    return Statement(path, chosen[0][0], chosen[-1][1], "".join(lines[chosen[0][0] - 1:chosen[-1][1]]))


def indent(text: str) -> str:
    """The leading blanks of a line."""
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
    module = cst.parse_module(WRAPPER + statement.text if indent else statement.text)
    for fn, facts in rewrites:
        module = fn(module, facts)
    code = module.code
    return code[len(WRAPPER):] if indent else code


def code(node: cst.CSTNode) -> str:
    return cst.Module([]).code_for_node(node)


def expr(text: str) -> cst.BaseExpression:
    return cst.parse_expression(text)


def literal_int(node) -> int | None:
    if isinstance(node, cst.Integer):
        return int(node.value)
    if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.Minus) and isinstance(node.expression, cst.Integer):
        return -int(node.expression.value)
    return None


def literal_ints(node) -> tuple[int, ...] | None:
    """A literal int, or a tuple or list of them."""
    one = literal_int(node)
    if one is not None:
        return (one,)
    if isinstance(node, (cst.Tuple, cst.List)):
        values = [literal_int(e.value) for e in node.elements]
        return tuple(values) if values and None not in values else None
    return None


def literal_bool(node) -> bool | None:
    if isinstance(node, cst.Name) and node.value in ("True", "False"):
        return node.value == "True"
    return None


def simple(node) -> bool:
    """A name or a chain of attributes of one (``x``, ``self.weight``): reading it twice reads
    the same thing and costs nothing."""
    while isinstance(node, cst.Attribute):
        node = node.value
    return isinstance(node, cst.Name)


def callee(call: cst.Call) -> str:
    """The last name of what a call calls: ``mean`` for ``x.mean(...)`` and ``torch.mean(...)``."""
    f = call.func
    return f.attr.value if isinstance(f, cst.Attribute) else f.value if isinstance(f, cst.Name) else ""


#: Names a function is called through rather than a tensor: ``torch.mean(x)``, ``F.pad(x)``.
_NAMESPACES = frozenset({"torch", "F", "nn", "functional"})


def is_method(call: cst.Call, torch_name: str | None) -> bool:
    """``x.f(...)`` on a tensor, not ``torch.f(...)`` or ``F.f(...)``."""
    f = call.func
    if not isinstance(f, cst.Attribute):
        return False
    root = f.value
    while isinstance(root, cst.Attribute):
        root = root.value
    return not (isinstance(root, cst.Name) and root.value in _NAMESPACES | {torch_name})


def arg(call: cst.Call, position: int, keyword: str) -> cst.Arg | None:
    for a in call.args:
        if a.keyword is not None and a.keyword.value == keyword:
            return a
    positional = [a for a in call.args if a.keyword is None and not a.star]
    return positional[position] if len(positional) > position else None


def normal(dims: Iterable[int], ndim: int) -> set[int]:
    return {d % ndim for d in dims}


def memory_format(facts: Facts) -> str:
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


def find(module: cst.Module, keep: Callable[[cst.CSTNode], bool]) -> list[cst.CSTNode]:
    visitor = _Collect(keep)
    module.visit(visitor)
    return visitor.found


def the_one(found: list, what: str) -> cst.CSTNode:
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


def replace_node(module: cst.Module, old: cst.CSTNode, new: cst.CSTNode) -> cst.Module:
    return replace_nodes(module, [(old, new)])


def replace_nodes(module: cst.Module, pairs: list[tuple[cst.CSTNode, cst.CSTNode]]) -> cst.Module:
    """``module`` with each old node (found by identity, in one pass) replaced by its new one."""
    return module.visit(_Replace({id(old): new for old, new in pairs}))


def statement_of(module: cst.Module) -> tuple[cst.BaseSuite | cst.Module, int]:
    """(the block that holds the statement, the statement's index in it)."""
    body = module.body[0].body if isinstance(module.body[0], cst.If) and code(module.body[0].test) == "True" else module
    return body, len(body.body) - 1


def insert_before(module: cst.Module, text: str, first: bool = False) -> cst.Module:
    """``module`` with the statement ``text`` before the rewritten one (with ``first``, before
    the first of the statements rewritten together), at its indentation."""
    body, index = statement_of(module)
    if first:
        index = 0
    statement = cst.parse_statement(text)
    new_body = body.with_changes(body=[*body.body[:index], statement, *body.body[index:]])
    return new_body if body is module else module.with_deep_changes(body, body=new_body.body)


def is_copy_into_contiguous(node) -> bool:
    """``.contiguous()``, or a ``.contiguous``/``.to`` into ``contiguous_format``."""
    if not isinstance(node, cst.Call) or not isinstance(node.func, cst.Attribute):
        return False
    name, fmt = node.func.attr.value, arg(node, 99, "memory_format")
    if name == "contiguous":
        return not node.args or (fmt is not None and code(fmt.value).endswith("contiguous_format"))
    return name == "to" and fmt is not None and code(fmt.value).endswith("contiguous_format")


def with_memory_format(call: cst.Call, value: cst.BaseExpression) -> cst.Call:
    """``call`` with its ``memory_format=`` argument set to ``value`` (added where it has none)."""
    fmt = arg(call, 99, "memory_format")
    if fmt is not None:
        return call.with_deep_changes(fmt, value=value)
    return call.with_changes(args=[*call.args, cst.Arg(value, keyword=cst.Name("memory_format"), equal=cst.AssignEqual(
        cst.SimpleWhitespace(""), cst.SimpleWhitespace("")))])


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
    the format (:func:`format_of_weight`); false where an :func:`optional_weight` is None."""
    w = facts.new_name("_w")
    held = f"({w} := {weight}) is not None and {w}" if _is_optional(weight) else f"({w} := {weight})"
    return f"({held}.stride(1) == 1 and ({w}.shape[1] == 1 or {w}.stride(-1) > 1))"


def optional_weight(module: str) -> str:
    """``module``'s weight as code that is None where it has none (a line that runs in modules
    holding a convolution there in some instances and a pool in others)."""
    return f'getattr({module}, "weight", None)'


def _is_optional(weight: str) -> bool:
    """Whether ``weight`` is an :func:`optional_weight` (a ``getattr`` with the default None)."""
    node = cst.parse_expression(weight)
    return (isinstance(node, cst.Call) and code(node.func) == "getattr" and len(node.args) == 3
            and code(node.args[2].value) == "None")
