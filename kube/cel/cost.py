"""Cost: an upper bound of what one evaluation of an expression may cost, in upstream's units.

The engine has no cost model and no step limit: a program, once started, runs to its end. So the
cost is bounded before it starts. `estimate` parses the (rewritten) source into a small syntax
tree and sums cel-go's unit costs over it: 1 per variable, field selection, index and function
call, nothing for a constant, 10 to build a list and 30 a map, string functions a tenth of a
unit per character, `in` on a list one per element, and a comprehension (`all`, `exists`,
`exists_one`, `map`, `filter`, and `cel.bind` as rewritten) its range's size times its body
plus 3 per iteration (loop condition and step). Sizes are bounded from what the expression
itself says (a literal list has as many elements as it is written with, a string literal its
length, `split`, `map`, `+` their arguments') and from the variables' `Shape`s: a DRA `device`
is bounded by the API's limits (`DEVICE_SHAPE`), a rule's variables by the values evaluated:
the largest list, map or string at each depth (`shape_of`); a rule's worst case by the largest
input the API server accepts at every depth (`Unbounded`).

An expression estimated over `COST_LIMIT` (upstream's `CELSelectorExpressionMaxCost`,
1,000,000) is refused with upstream's words, "cost limit exceeded". The estimate is an upper
bound of the same order as cel-go's: an expression upstream's estimator accepts near the limit
may be refused here, never the reverse for the patterns that matter (nested comprehensions over
bound lists). This module reads text: it must not call the engine.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any, Final

from dra_gateway.kube.cel.errors import Failure

COST_LIMIT: Final = 1_000_000
"""Upstream's per-expression cost limit for DRA selectors (estimated, and at runtime)."""

_SATURATED: Final = 10**15
_ITERATION: Final = 3  # loop condition and loop step of a comprehension, per element
_LIST: Final = 10
_MAP: Final = 30


class Shape:
    """Upper bounds of a value's size: `size` elements, entries, characters or bytes, and the
    shape of its elements (map keys and values alike)."""

    __slots__ = ("_item", "size")

    def __init__(self, size: int, item: Shape | None = None) -> None:
        self.size = size
        self._item = item

    @property
    def item(self) -> Shape:
        return self._item if self._item is not None else SCALAR

    @property
    def chars(self) -> int:
        """What per-character costs count: the size, unless only strings are meant."""
        return self.size

    def deepest(self) -> int:
        """The largest size at any depth."""
        return max(self.size, self._item.deepest() if self._item is not None else 0)

    def __repr__(self) -> str:
        return f"Shape({self.size}, {self._item!r})"


class Unbounded(Shape):
    """A value of unknown depth: no list or map in it has more than `size` elements, no string
    more than `text` characters (a long annotation must not make every list count as long)."""

    __slots__ = ("text",)

    def __init__(self, size: int, text: int | None = None) -> None:
        super().__init__(size)
        self.text = size if text is None else text

    @property
    def item(self) -> Shape:
        return self

    @property
    def chars(self) -> int:
        return max(self.size, self.text)

    def deepest(self) -> int:
        return self.size

    def __repr__(self) -> str:
        return f"Unbounded({self.size}, {self.text})"


SCALAR: Final = Shape(0)

# DRA's limits: a device has at most 32 attributes and capacities together, names of at most
# 63 characters, string attributes of at most 64; `device` has four fields.
DEVICE_SHAPE: Final = Shape(4, Shape(64, Shape(32, Shape(64))))


def _text(a: Shape, b: Shape) -> int:
    return max(a.text if isinstance(a, Unbounded) else a.deepest(),
               b.text if isinstance(b, Unbounded) else b.deepest())


def _join(a: Shape, b: Shape) -> Shape:
    if isinstance(a, Unbounded) or isinstance(b, Unbounded):
        return Unbounded(max(a.deepest(), b.deepest()), _text(a, b))
    if a._item is None and b._item is None:
        return a if a.size >= b.size else b
    return Shape(max(a.size, b.size), _join(a.item, b.item))


def _concat(a: Shape, b: Shape) -> Shape:
    if isinstance(a, Unbounded) or isinstance(b, Unbounded):
        return Unbounded(a.deepest() + b.deepest(), _text(a, b) * 2)
    if a._item is None and b._item is None:
        return Shape(a.size + b.size)
    return Shape(a.size + b.size, _join(a.item, b.item))


def depth_sizes(value: Any) -> tuple[int, ...]:
    """The largest list, map, string or bytes at each depth of `value` (its own size first).

    Per depth, so that a pod's long env list does not make its containers count as long.
    """
    sizes: list[int] = []
    level = [value]
    while level:
        size = 0
        below: list[Any] = []
        for item in level:
            if isinstance(item, (str, bytes)):
                size = max(size, len(item))
            elif isinstance(item, Mapping):
                size = max(size, len(item))
                below.extend(item.keys())
                below.extend(item.values())
            elif isinstance(item, (list, tuple)):
                size = max(size, len(item))
                below.extend(item)
        sizes.append(size)
        level = below
    return tuple(sizes)


def shape_of(sizes: tuple[int, ...]) -> Shape:
    """The shape whose depth d has at most sizes[d] elements or characters."""
    shape: Shape | None = None
    for size in reversed(sizes):
        shape = Shape(size, shape)
    return shape if shape is not None else SCALAR


# --- syntax -----------------------------------------------------------------------------------

_TOKEN: Final = re.compile(
    r"""(?P<space>\s+|//[^\n]*)
    |(?P<string>(?:[bB]?)(?:\"\"\"(?:\\.|[^\\])*?\"\"\"|'''(?:\\.|[^\\])*?'''
                          |"(?:\\.|[^"\\\n])*"|'(?:\\.|[^'\\\n])*'))
    |(?P<raw>(?:[rR][bB]?|[bB][rR])(?:\"\"\"[\s\S]*?\"\"\"|'''[\s\S]*?'''|"[^"\n]*"|'[^'\n]*'))
    |(?P<number>0[xX][0-9a-fA-F]+[uU]?|\d+\.\d+(?:[eE][+-]?\d+)?|\d+[eE][+-]?\d+|\.\d+(?:[eE][+-]?\d+)?
                |\d+[uU]?)
    |(?P<ident>[A-Za-z_][A-Za-z0-9_]*)
    |(?P<op>==|!=|<=|>=|&&|\|\||[-+*/%<>!?:.,()\[\]{}])
    """,
    re.X,
)
_COMPREHENSIONS: Final = frozenset({"all", "exists", "exists_one", "map", "filter"})
_RELATIONS: Final = frozenset({"<", "<=", ">", ">=", "==", "!=", "in"})

Node = tuple[Any, ...]
"""("lit", Shape) | ("ident", name) | ("select", operand, field) | ("index", operand, index) |
("call", name, args) | ("list", items) | ("map", entries) | ("cond", test, yes, no) |
("comp", macro, range, variable, bodies)."""


def _tokens(source: str) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    at = 0
    while at < len(source):
        match = _TOKEN.match(source, at)
        if match is None:
            raise Failure(f"cannot estimate the cost: unexpected {source[at]!r} at {at}")
        kind = match.lastgroup or ""
        if kind != "space":
            out.append((kind, match.group()))
        at = match.end()
    return out


class _Parser:
    def __init__(self, source: str) -> None:
        self.tokens = _tokens(source)
        self.at = 0

    def peek(self, offset: int = 0) -> str:
        at = self.at + offset
        return self.tokens[at][1] if at < len(self.tokens) else ""

    def take(self, expected: str | None = None) -> tuple[str, str]:
        if self.at >= len(self.tokens):
            raise Failure("cannot estimate the cost: unexpected end of expression")
        token = self.tokens[self.at]
        if expected is not None and token[1] != expected:
            raise Failure(f"cannot estimate the cost: expected {expected!r}, got {token[1]!r}")
        self.at += 1
        return token

    def parse(self) -> Node:
        node = self.expr()
        if self.at != len(self.tokens):
            raise Failure(f"cannot estimate the cost: unexpected {self.peek()!r}")
        return node

    def expr(self) -> Node:
        test = self.binary(0)
        if self.peek() != "?":
            return test
        self.take("?")
        yes = self.binary(0)
        self.take(":")
        return ("cond", test, yes, self.expr())

    _LEVELS: Final = (("||",), ("&&",), tuple(_RELATIONS), ("+", "-"), ("*", "/", "%"))

    def binary(self, level: int) -> Node:
        if level == len(self._LEVELS):
            return self.unary()
        node = self.binary(level + 1)
        while self.peek() in self._LEVELS[level] and self.tokens[self.at][0] in ("op", "ident"):
            op = self.take()[1]
            node = ("call", f"_{op}_", [node, self.binary(level + 1)])
        return node

    def unary(self) -> Node:
        if self.peek() in ("!", "-"):
            op = self.take()[1]
            return ("call", f"{op}_", [self.unary()])
        return self.member()

    def member(self) -> Node:
        node = self.primary()
        while True:
            if self.peek() == ".":
                self.take(".")
                name = self.take()[1]
                if self.peek() == "(":
                    args = self.arguments(")")
                    node = self.call(name, node, args)
                else:
                    node = ("select", node, name)
            elif self.peek() == "[":
                self.take("[")
                index = self.expr()
                self.take("]")
                node = ("index", node, index)
            else:
                return node

    def call(self, name: str, target: Node | None, args: list[Node]) -> Node:
        if target is not None and name in _COMPREHENSIONS and args and args[0][0] == "ident":
            return ("comp", name, target, args[0][1], args[1:])
        if target is None and name == "has" and len(args) == 1:
            return ("call", "has", [args[0][1]] if args[0][0] == "select" else args)
        return ("call", name, [target, *args] if target is not None else args)

    def arguments(self, close: str) -> list[Node]:
        self.take({")": "(", "]": "[", "}": "{"}[close])
        args: list[Node] = []
        while self.peek() != close:
            args.append(self.expr())
            if self.peek() != ",":
                break
            self.take(",")
        self.take(close)
        return args

    def primary(self) -> Node:
        kind, text = self.take()
        if kind in ("string", "raw"):
            body = text.lstrip("rRbB")
            quote = 3 if body[:3] in ('"""', "'''") else 1
            return ("lit", Shape(max(0, len(body) - 2 * quote)))
        if kind == "number":
            return ("lit", SCALAR)
        if kind == "ident":
            if text in ("true", "false", "null"):
                return ("lit", SCALAR)
            if self.peek() == "(":
                return self.call(text, None, self.arguments(")"))
            if self.peek() == "{" and text[:1].isupper():  # a message literal: Type{field: v}
                return ("map", self.entries())
            return ("ident", text)
        if text == ".":
            return self.primary()
        if text == "(":
            node = self.expr()
            self.take(")")
            return node
        if text == "[":
            self.at -= 1
            return ("list", self.arguments("]"))
        if text == "{":
            self.at -= 1
            return ("map", self.entries())
        raise Failure(f"cannot estimate the cost: unexpected {text!r}")

    def entries(self) -> list[Node]:
        self.take("{")
        out: list[Node] = []
        while self.peek() != "}":
            out.append(self.expr())
            self.take(":")
            out.append(self.expr())
            if self.peek() != ",":
                break
            self.take(",")
        self.take("}")
        return out


def parse(source: str) -> Node:
    """The syntax tree the estimate walks; Failure for what it cannot read."""
    try:
        return _Parser(source).parse()
    except RecursionError:
        raise Failure("cannot estimate the cost: nested too deeply") from None


# --- cost -------------------------------------------------------------------------------------

_PER_CHARACTER: Final = frozenset({
    "contains", "startsWith", "endsWith", "lowerAscii", "upperAscii", "trim", "indexOf",
    "lastIndexOf", "substring", "charAt", "_==_", "_!=_", "_+_", "string", "bytes", "quantity",
    "isQuantity", "semver", "isSemver", "_<_", "_<=_", "_>_", "_>=_",
})
_SAME_SIZE: Final = frozenset({"lowerAscii", "upperAscii", "trim", "substring", "dyn"})


def _tenth(size: int) -> int:
    return math.ceil(size / 10)


def _call(name: str, args: list[tuple[int, Shape]]) -> tuple[int, Shape]:
    cost = 1 + sum(c for c, _ in args)
    shapes = [s for _, s in args]
    first = shapes[0] if shapes else SCALAR
    if name in _PER_CHARACTER:
        cost += _tenth(sum(s.chars for s in shapes))
    if name == "_+_" and len(shapes) == 2:
        return cost, _concat(shapes[0], shapes[1])
    if name == "_in_":
        return cost + (shapes[1].size if len(shapes) == 2 else 0), SCALAR
    if name == "matches" and len(shapes) == 2:
        return cost + _tenth(shapes[0].chars) * (1 + math.ceil(shapes[1].chars / 4)), SCALAR
    if name in _SAME_SIZE:
        return cost, first
    if name == "charAt":
        return cost, Shape(1)
    if name == "string":
        return cost, Shape(max(first.chars, 32))
    if name == "bytes":
        return cost, Shape(4 * first.chars)
    if name == "type":
        return cost, Shape(32)
    if name == "split":
        return cost + _tenth(first.chars), Shape(first.chars + 1, Shape(first.chars))
    if name == "join":
        separator = shapes[1].chars if len(shapes) > 1 else 0
        size = first.size * (first.item.chars + separator)
        return cost + _tenth(size), Shape(size)
    if name == "replace" and len(shapes) >= 3:
        size = (first.chars + 1) * max(1, shapes[2].chars) + first.chars
        return cost + _tenth(size), Shape(size)
    return cost, SCALAR


class _Estimator:
    def __init__(self, variables: Mapping[str, Shape], default: Shape) -> None:
        self.scopes: list[dict[str, Shape]] = [dict(variables)]
        self.default = default

    def lookup(self, name: str) -> Shape:
        for scope in reversed(self.scopes):
            if name in scope:
                return scope[name]
        return self.default

    def cost(self, node: Node) -> tuple[int, Shape]:
        kind = node[0]
        if kind == "lit":
            return 0, node[1]
        if kind == "ident":
            return 1, self.lookup(node[1])
        if kind == "select":
            cost, shape = self.cost(node[1])
            return cost + 1, shape.item
        if kind == "index":
            cost, shape = self.cost(node[1])
            index_cost, _ = self.cost(node[2])
            return cost + index_cost + 1, shape.item
        if kind == "call":
            return _call(node[1], [self.cost(a) for a in node[2]])
        if kind == "list":
            items = [self.cost(a) for a in node[1]]
            item: Shape | None = None
            for _, shape in items:
                item = shape if item is None else _join(item, shape)
            return _LIST + sum(c for c, _ in items), Shape(len(items), item)
        if kind == "map":
            entries = [self.cost(a) for a in node[1]]
            joined: Shape | None = None
            for _, shape in entries:
                joined = shape if joined is None else _join(joined, shape)
            return _MAP + sum(c for c, _ in entries), Shape(len(entries) // 2, joined)
        if kind == "cond":
            test, (yes, yes_shape), (no, no_shape) = (self.cost(node[1])[0], self.cost(node[2]),
                                                      self.cost(node[3]))
            return test + max(yes, no), _join(yes_shape, no_shape)
        if kind == "comp":
            return self.comprehension(node)
        raise Failure(f"cannot estimate the cost of {kind!r}")

    def comprehension(self, node: Node) -> tuple[int, Shape]:
        _, macro, range_node, variable, bodies = node
        range_cost, range_shape = self.cost(range_node)
        self.scopes.append({variable: range_shape.item})
        try:
            results = [self.cost(b) for b in bodies]
        finally:
            self.scopes.pop()
        per_element = sum(c for c, _ in results) + _ITERATION
        cost = min(_SATURATED, range_cost + 1 + range_shape.size * per_element)
        if macro == "map":
            return cost, Shape(range_shape.size, results[-1][1] if results else SCALAR)
        if macro == "filter":
            return cost, Shape(range_shape.size, range_shape.item)
        return cost, SCALAR


def estimate(tree: Node, variables: Mapping[str, Shape], *, default: Shape = SCALAR) -> int:
    """An upper bound of one evaluation's cost; names not in `variables` take `default`."""
    try:
        cost, _ = _Estimator(variables, default).cost(tree)
    except RecursionError:
        raise Failure("cannot estimate the cost: nested too deeply") from None
    return min(cost, _SATURATED)


def over_limit(cost: int, limit: int = COST_LIMIT) -> str | None:
    """Upstream's reason for an expression over the limit, or None."""
    if cost <= limit:
        return None
    return (f"cost limit exceeded: estimated cost {cost} exceeds the limit of {limit} "
            "(nested comprehensions over large lists)")


__all__ = [
    "COST_LIMIT",
    "DEVICE_SHAPE",
    "SCALAR",
    "Shape",
    "Unbounded",
    "depth_sizes",
    "estimate",
    "over_limit",
    "parse",
    "shape_of",
]
