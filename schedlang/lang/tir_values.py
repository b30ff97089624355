"""TIR expressions evaluated with numpy over the values of their variables: the index and
condition arithmetic of a lowered kernel (schedlang.checker.dataflow), a block's `if`
(schedlang.checker.kernel_rules), and the instances a block moved by `reverse_compute_at` runs
(schedlang.lang.statements.moving)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from tvm import tirx
from tvm.ir.expr import Call

__all__ = [
    "Env",
    "Expr",
    "Instances",
    "Unsupported",
    "Value",
    "Var",
    "free_vars",
    "instances",
    "op_name",
    "points_where",
    "value",
]


# TVM's Python API is untyped: its expressions and variables are `Any` here, named for what they
# hold. A value is a Python int or bool or a numpy array over the loops' points, mixed freely by
# numpy's operators.
Expr = Any  # a tirx.PrimExpr
Var = Any  # a tirx.Var
Value = Any
Env = dict[Var, Value]  # variable → its value


class Unsupported(Exception):
    """An expression this module does not evaluate: the access is left out."""


def op_name(call: Expr) -> str:
    return str(getattr(call.op, "name", "")).rsplit(".", 1)[-1]


_BINARY: dict[type, Callable[[Value, Value], Value]] = {
    tirx.Add: np.add,
    tirx.Sub: np.subtract,
    tirx.Mul: np.multiply,
    tirx.FloorDiv: np.floor_divide,
    tirx.FloorMod: np.mod,
    tirx.Min: np.minimum,
    tirx.Max: np.maximum,
    tirx.LT: np.less,
    tirx.LE: np.less_equal,
    tirx.GT: np.greater,
    tirx.GE: np.greater_equal,
    tirx.EQ: np.equal,
    tirx.NE: np.not_equal,
    tirx.And: np.logical_and,
    tirx.Or: np.logical_or,
}


def value(e: Expr, env: Env) -> Value:
    """`e` evaluated with numpy, each variable from `env` (a number or an array); raises
    Unsupported for what is not integer arithmetic of them."""
    kind = type(e)
    if kind is tirx.IntImm:
        return int(e.value)
    if kind is tirx.Var:
        if e not in env:
            raise Unsupported(e.name)
        return env[e]
    operation = _BINARY.get(kind)
    if operation is not None:
        a, b = value(e.a, env), value(e.b, env)
        if kind in (tirx.FloorDiv, tirx.FloorMod) and np.any(np.asarray(b) == 0):
            raise Unsupported("division by zero")
        return operation(a, b)
    if kind is tirx.Div or kind is tirx.Mod:  # truncated, as in C
        a, b = np.asarray(value(e.a, env)), np.asarray(value(e.b, env))
        if np.any(b == 0):
            raise Unsupported("division by zero")
        quotient = np.sign(a) * np.sign(b) * (np.abs(a) // np.abs(b))
        return quotient if kind is tirx.Div else a - b * quotient
    if kind is tirx.Not:
        return np.logical_not(value(e.a, env))
    if kind is tirx.Select:
        return np.where(
            value(e.condition, env), value(e.true_value, env), value(e.false_value, env)
        )
    if kind is tirx.Cast and ("int" in str(e.ty) or "bool" in str(e.ty)):
        return value(e.value, env)
    if kind is Call and op_name(e) in ("if_then_else", "likely"):
        if len(e.args) == 1:
            return value(e.args[0], env)
        cond, then, other = e.args
        return np.where(value(cond, env), value(then, env), value(other, env))
    if kind is tirx.Let:
        return value(e.body, {**env, e.var: value(e.value, env)})
    raise Unsupported(kind.__name__)


def points_where(
    condition: Expr, grid: dict[Var, int], at_zero: set[Var], most: int = 1 << 16
) -> int | None:
    """How many points of `grid` (loop variable -> extent) satisfy `condition` with the
    variables of `at_zero` at 0 (outer loops at their first iteration, where a split's guard is
    the most often true); a conjunct testing any other variable counts as true. None past
    `most` points or where a conjunct cannot be evaluated."""
    if math.prod(grid.values()) > most:
        return None
    axes = np.indices(tuple(grid.values())).reshape(len(grid), math.prod(grid.values()))
    env: Env = {**dict(zip(grid, axes, strict=True)), **{v: 0 for v in at_zero}}
    holds = np.ones(axes.shape[1], dtype=bool)
    conjuncts: list[Expr] = []
    stack = [condition]
    while stack:
        e = stack.pop()
        if isinstance(e, tirx.And):
            stack += [e.a, e.b]
        else:
            conjuncts.append(e)
    for e in conjuncts:
        if not free_vars(e) <= env.keys():
            continue
        try:
            holds &= np.broadcast_to(np.asarray(value(e, env), dtype=bool), holds.shape)
        except Unsupported:
            return None
    return int(holds.sum())


def free_vars(e: Expr) -> set[Var]:
    return set(tirx.analysis.undefined_vars(e))


@dataclass(frozen=True)
class Instances:
    """What a block's loops run of its iteration domain: how many instances the domain holds,
    how many distinct ones the loops reach (inside it), and how many times the body runs."""

    domain: int
    reached: int
    runs: int


def instances(
    realize: Any, loops: dict[Var, tuple[int, int]], most: int = 1 << 20
) -> Instances | None:
    """The instances of the block `realize` that its loops (loop variable -> (min, extent), all
    of those around it) reach under its `if`, each loop over its whole range; None past `most`
    runs or domain points, or where a binding or the `if` cannot be evaluated."""
    block = realize.block
    extents = [
        int(iv.dom.extent) if isinstance(iv.dom.extent, tirx.IntImm) else None
        for iv in block.iter_vars
    ]
    known = [extent for extent in extents if extent is not None]
    if len(known) < len(extents):
        return None
    domain = math.prod(known)
    shape = [extent for _, extent in loops.values()]
    if domain > most or math.prod(shape) > most:
        return None
    env: Env = {}
    for axis, (var, (low, extent)) in enumerate(loops.items()):
        env[var] = (low + np.arange(extent)).reshape(
            [-1 if d == axis else 1 for d in range(len(loops))]
        )
    try:
        values = [
            np.broadcast_to(value(b, env), shape) - int(iv.dom.min)
            for iv, b in zip(block.iter_vars, realize.iter_values, strict=True)
        ]
        runs = np.broadcast_to(np.asarray(value(realize.predicate, env), dtype=bool), shape)
    except (Unsupported, TypeError, ValueError):
        return None
    inside = runs.copy()
    flat = np.zeros(shape, dtype=np.int64)
    for v, extent in zip(values, known, strict=True):
        inside &= (v >= 0) & (v < extent)
        flat = flat * extent + v
    reached = int(np.count_nonzero(np.bincount(flat[inside], minlength=domain)))
    return Instances(domain, reached, int(runs.sum()))
