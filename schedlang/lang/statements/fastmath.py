"""Fast math: `fast_math exp` (or `erf`) rewrites a block's float32 `exp` (`erf`) into a
vectorizable polynomial.

TVM has no schedule primitive for this: the lowering replaces the block in the live schedule
(`ScheduleState.replace`, the block's sref reused), so the statements after it see the new body
and the loops around it vectorize. schedlang.lang.fastexp holds the polynomial and its error bounds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from schedlang.lang import nodes
from schedlang.lang.statements import facets
from schedlang.lang.statements.args import MathFunction
from schedlang.lang.statements.decoding import StepView
from schedlang.lang.statements.facets import Syntax

if TYPE_CHECKING:
    from tvm import tirx

    from schedlang.lang.nest import Nest
    from schedlang.lang.statements.facade import Checker

# The functions `fast_math` rewrites (the grammar's MATH_FN), and the dtypes each one handles.
FUNCTIONS: dict[str, tuple[str, ...]] = {"exp": ("float32",), "erf": ("float32",)}


@dataclass(frozen=True)
class FastMath(nodes.Stmt, keyword="fast_math"):
    """`fast_math exp`: every float32 `exp` in the current block's body becomes `fastexp`'s
    polynomial (`fast_math erf`: every float32 `erf`)."""

    function: nodes.Name


def _body_and_init(nest: Nest, block: str) -> list[tirx.Stmt]:
    node = nest.sch.get(nest.block(block))
    return [node.body] + ([node.init] if node.init is not None else [])


def _dtypes(nest: Nest, block: str, function: str) -> list[str]:
    # TVM is imported only when a schedule is checked: `schedlang fmt` and `--version` stay fast.
    from schedlang.lang import fastexp

    return [
        dtype for stmt in _body_and_init(nest, block) for dtype in fastexp.calls(stmt, function)
    ]


# fmt: off
FAST_MATH = Syntax("fast_math", FastMath, "fastmath",
    (MathFunction("function"),),
    example="e.g. `fast_math exp`, `fast_math erf`",
    description="replace every float32 exp (or erf) in the current block with a vectorizable "
    "polynomial (error ~1e-7), so the loop around it vectorizes.",
    summary=("`fast_math exp`, `fast_math erf`",
        "— (the block's body rewritten: `ScheduleState.replace`)", "—"))
# fmt: on

STATEMENTS = (FAST_MATH,)


@facets.guard(FAST_MATH)
def guard_fast_math(c: Checker, stmt: FastMath, block: str) -> None:
    function = stmt.function.text
    # The grammar admits only the functions above; a schedule built as an AST is checked too.
    if not c.require(
        function in FUNCTIONS,
        f"fast_math has no fast `{function}`",
        stmt.function.span,
        "it rewrites: " + ", ".join(f"`{f}`" for f in FUNCTIONS),
    ):
        return
    if not c.require(
        not c.nest.sch.get_child_blocks(c.nest.block(block)),
        f"block `{block}` holds other blocks: fast_math rewrites the body of one innermost block",
        stmt.span,
        "name the inner block that computes the exp in a `block NAME:` section",
    ):
        return
    from schedlang.lang import fastexp

    dtypes = _dtypes(c.nest, block, function)
    rewritten = (fastexp.is_rewritten(s, function) for s in _body_and_init(c.nest, block))
    if not dtypes and any(rewritten):
        c.error(
            f"block `{block}`'s `{function}` is already rewritten by an earlier fast_math",
            stmt.span,
            "remove this one",
        )
        return
    if not dtypes:
        with_exp = [
            name
            for name in (*c.nest.block_names(), *c.nest.nested_block_names())
            if name != block
            and not c.nest.sch.get_child_blocks(c.nest.block(name))
            and _dtypes(c.nest, name, function)
        ]
        c.error(
            f"block `{block}` computes no `{function}`: nothing to rewrite",
            stmt.span,
            (
                f"`{function}` is computed in block " + ", ".join(f"`{b}`" for b in with_exp)
                if with_exp
                else f"no block of this op computes `{function}`"
            ),
        )
        return
    wrong = sorted(set(dtypes) - set(FUNCTIONS[function]))
    c.require(
        not wrong,
        f"fast_math {function} handles {', '.join(FUNCTIONS[function])} only; block `{block}` "
        f"computes `{function}` in {', '.join(wrong)}",
        stmt.function.span,
        f"leave this block's {function} to the libm call (remove the statement), or compute in "
        "float32",
    )


def rewritable(nest: Nest, block: str) -> tuple[str, ...]:
    """The functions `fast_math` would rewrite in `block` now (an innermost block's float32
    calls not rewritten yet)."""
    if nest.sch.get_child_blocks(nest.block(block)):
        return ()
    return tuple(
        function
        for function, dtypes in FUNCTIONS.items()
        if set(_dtypes(nest, block, function)) & set(dtypes)
    )


@facets.steps(FAST_MATH)
def _fast_math_steps(view: StepView, block: str, _: None) -> list[str]:
    return [f"fast_math {function}" for function in view.math(block)]


@facets.lower(FAST_MATH)
def lower_fast_math(nest: Nest, block: str, stmt: FastMath) -> None:
    from schedlang.lang import fastexp

    fastexp.rewrite_block(nest.sch, nest.block(block), stmt.function.text)
