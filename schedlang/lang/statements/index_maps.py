"""Index maps, as `transform_layout` and the reindexing caches write them: `(i, j) -> (j // 16, i,
j % 16)`, the buffer's (or the block's) indices, then one expression per dimension over
`+ - * // %`, integers and parentheses (`//` and `%` floor, as TVM's). Their AST, their argument
kind (`IndexMap`), their check, and their conversion to and from TVM's `IndexMap`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from lark import Token

from schedlang.lang import nodes
from schedlang.lang.statements.args import Arg, Children
from schedlang.lang.statements.decompiling import Untranslatable

if TYPE_CHECKING:
    from schedlang.lang.statements.facade import Checker


@dataclass(frozen=True)
class IndexVar(nodes.Node):
    name: str


@dataclass(frozen=True)
class IndexInt(nodes.Node):
    value: int


@dataclass(frozen=True)
class IndexOp(nodes.Node):
    op: str  # + - * // %
    left: IndexExpr
    right: IndexExpr


IndexExpr = IndexVar | IndexInt | IndexOp


_PRECEDENCE = {"+": 1, "-": 1, "*": 2, "//": 2, "%": 2}


def format_index(expr: IndexExpr, parent: int = 0, right: bool = False) -> str:
    """Canonical text: parentheses only where precedence or left-to-right order needs them."""
    match expr:
        case IndexVar(name=name):
            return name
        case IndexInt(value=value):
            return str(value)
        case IndexOp(op=op, left=left, right=rhs):
            level = _PRECEDENCE[op]
            text = f"{format_index(left, level)} {op} {format_index(rhs, level, right=True)}"
            needs = level < parent or (right and level == parent)
            return f"({text})" if needs else text
    raise TypeError(f"not an index expression: {expr!r}")


class ExpressionTokens(Children):
    """The map's tokens as the grammar leaves them (its rules are inlined, so the statement gets
    them flat): the indices, `->`, then the expressions back to back. A new expression starts
    where an operand follows an operand, since every operator is binary."""

    def expressions(self) -> tuple[IndexExpr, ...]:
        found = []
        while self.peek() is not None and self.peek() != "pad_value":
            found.append(self.sum())
        return tuple(found)

    def sum(self) -> IndexExpr:
        return self._left_to_right("INDEX_ADD", self.product)

    def product(self) -> IndexExpr:
        return self._left_to_right("INDEX_MUL", self.operand)

    def _left_to_right(self, operator: str, operand: Callable[[], IndexExpr]) -> IndexExpr:
        """Operands joined by operators of one precedence, grouped from the left."""
        expr = operand()
        while self.peek() is not None and self.peek().type == operator:
            op = str(self.take())
            expr = IndexOp(op, expr, operand(), span=expr.span)
        return expr

    def operand(self) -> IndexExpr:
        token = self.take()
        if token.type == "INDEX_OPEN":
            expr = self.sum()
            self.take()  # INDEX_CLOSE: the grammar paired them
            return expr
        span = self.name(token).span
        if token.type == "INT":
            return IndexInt(self.int(token).value, span=span)
        return IndexVar(str(token), span=span)


def index_vars(expr: IndexExpr) -> list[IndexVar]:
    match expr:
        case IndexVar():
            return [expr]
        case IndexOp(left=left, right=right):
            return index_vars(left) + index_vars(right)
    return []


def _divisors(expr: IndexExpr) -> list[IndexOp]:
    if isinstance(expr, IndexOp):
        own = [expr] if expr.op in ("//", "%") else []
        return own + _divisors(expr.left) + _divisors(expr.right)
    return []


def to_tvm(expr: IndexExpr, variables: dict[str, Any]) -> Any:
    from tvm import tirx

    match expr:
        case IndexVar(name=name):
            return variables[name]
        case IndexInt(value=value):
            return tirx.IntImm(str(next(iter(variables.values())).ty), value)
        case IndexOp(op=op, left=left, right=right):
            a, b = to_tvm(left, variables), to_tvm(right, variables)
            if op == "+":
                return a + b
            if op == "-":
                return a - b
            if op == "*":
                return a * b
            return tirx.floordiv(a, b) if op == "//" else tirx.floormod(a, b)
    raise TypeError(f"not an index expression: {expr!r}")


def from_tvm(expr: Any) -> IndexExpr:
    """An index expression of a TVM IndexMap, or ValueError when the language cannot say it."""
    from tvm import tirx

    ops = {tirx.Add: "+", tirx.Sub: "-", tirx.Mul: "*", tirx.FloorDiv: "//", tirx.FloorMod: "%"}
    if isinstance(expr, tirx.Var):
        return IndexVar(expr.name)
    if isinstance(expr, tirx.IntImm) and int(expr.value) >= 0:
        return IndexInt(int(expr.value))
    if type(expr) in ops:
        return IndexOp(ops[type(expr)], from_tvm(expr.a), from_tvm(expr.b))
    raise ValueError(f"`{expr}` uses what schedlang's index maps cannot say (+ - * // %)")


def map_ok(
    c: Checker,
    stmt: Any,
    expected: int,
    mismatch: str,
    unknown: Callable[[IndexVar, set[str]], tuple[str, ...]],
) -> bool:
    """The index map `(indices) -> (outputs)` of `stmt`: `expected` indices (else the error
    `mismatch`), each named once, each variable of the outputs one of them (`unknown(var,
    indices)` says what is wrong with one that is not: the message, then its notes), no division
    by zero."""
    indices, outputs = stmt.indices, stmt.outputs
    ok = c.require(len(indices) == expected, mismatch, indices[0].span if indices else stmt.span)
    seen: set[str] = set()
    for name in indices:
        ok &= c.require(name.text not in seen, f"index `{name.text}` is named twice", name.span)
        seen.add(name.text)
    for output in outputs:
        for var in index_vars(output):
            if var.name not in seen:
                message, *notes = unknown(var, seen)
                c.error(message, var.span, *notes)
                ok = False
        for op in _divisors(output):
            if isinstance(op.right, IndexInt):
                ok &= c.require(op.right.value != 0, f"`{op.op} 0` divides by zero", op.right.span)
    return ok


def read_index_map(mapping: Any) -> tuple[tuple[nodes.Name, ...], tuple[IndexExpr, ...]]:
    """A TVM IndexMap of a trace as schedlang's index variables and expressions."""
    try:
        outputs = tuple(from_tvm(e) for e in mapping.final_indices)
    except ValueError as exc:
        raise Untranslatable(str(exc)) from None
    return tuple(nodes.Name(v.name) for v in mapping.initial_indices), outputs


@dataclass(frozen=True)
class IndexMap(Arg):
    """An index map, `(i, j) -> (j, i // 4)`: the fields `indices` and `outputs`."""

    field: str = "indices"

    def matches(self, child: Any) -> bool:
        return isinstance(child, Token) and child.type == "INDEX_VAR"

    def take(self, children: Children) -> dict[str, Any]:
        indices = []
        while self.matches(children.peek()):
            indices.append(children.name(children.take()))
        expression = []  # the grammar leaves the expressions' tokens flat, up to `pad_value`
        while isinstance(children.peek(), Token) and children.peek().type != "PAD_VALUE":
            expression.append(children.take())
        outputs = ExpressionTokens(children.builder, expression).expressions()
        return {"indices": tuple(indices), "outputs": outputs}

    def write(self, stmt: Any) -> str:
        indices = ", ".join(n.text for n in stmt.indices)
        return f"({indices}) -> ({', '.join(format_index(e) for e in stmt.outputs)})"
