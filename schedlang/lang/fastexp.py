"""Fast float32 `exp` and `erf` written in TIR, and the rewrite of a block's calls into them.

`tvm.topi.fast_exp` exists only as a `te` compute; TVM 0.27 has no TIR pass that rewrites `exp`.
LLVM turns `T.exp` into one `expf` call per lane, so a loop around it never vectorizes: softmax
spent its time there. This is the same range reduction and polynomial as TVM's
`topi/elemwise.h::fast_exp_float32` (Cephes' expf), in plain arithmetic, `floor`, `max`/`min`,
a shift and a `reinterpret`, all of which TVM vectorizes and LLVM emits as vector instructions.

    exp(x) = 2**n * exp(r),  n = floor(x * log2(e) + 1/2),  r = x - n * ln 2  (|r| <= ln2 / 2)
    exp(r) ≈ 1 + r + r² · P(r),  P of degree 5

Two changes from TVM's version, both at the ends of the range, where TVM's is wrong:
- ln 2 is subtracted in two parts (Cody and Waite, as Cephes does), so r keeps its precision
  when n is large: relative error ~1e-7 over the whole range instead of ~3e-6 near ±88.
- 2**n is built as 2**(n-1) · 2, so n = 128 (x in (88.38, 88.72]) gives a finite result where
  TVM's gives inf; x below -87 gives 0 (the true value is under 1.6e-38, a denormal), x above
  88.72 gives inf, as `expf` does.

A NaN input does not give NaN (it gives inf): TVM compiles with LLVM's fast-math flags, under
which a NaN test (`x != x`) folds to false, and `T.isnan` would stop the loop from vectorizing.

`erf` (GELU's) is the same story: LLVM calls libm's `erff` once per lane. `fast_erf` is the
rational approximation Eigen and TVM's `topi::fast_erf_float32` use: x clamped to [-4, 4] (erf
is +-1 in float32 beyond), an odd polynomial of degree 13 over an even one of degree 8; absolute
error ~1e-7 (tests/test_fastmath.py measures it against math.erf).
"""

from __future__ import annotations

from typing import Any

import tvm
import tvm_ffi
from tvm import s_tir, tirx

_F32 = "float32"
# Cephes expf's polynomial for exp(r) on |r| <= ln2/2, highest degree first.
_P = (1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1, 5.0000001201e-1)  # noqa: E501  # fmt: skip
_LOG2E = 1.44269504088896341
_LN2_HI = 0.693359375  # ln 2 = _LN2_HI + _LN2_LO; _LN2_HI has few bits, so n * _LN2_HI is exact
_LN2_LO = -2.12194440e-4
# Below _X_LO, 2**(n-1) would need an exponent field under 1: the result is 0 there.
_X_LO = -86.9
# Above ln(FLT_MAX) = 88.7228 the result overflows to inf; clamping at 89 keeps n at 128.
_X_HI = 89.0

# Eigen's generic_fast_erf_float: the numerator's odd coefficients (x^13 down to x^1) and the
# denominator's even ones (x^8 down to x^0).
_ERF_P = (-2.72614225801306e-10, 2.77068142495902e-08, -2.10102402082508e-06, -5.69250639462346e-05, -7.34990630326855e-04, -2.95459980854025e-03, -1.60960333262415e-02)  # noqa: E501  # fmt: skip
_ERF_Q = (-1.45660718464996e-05, -2.13374055278905e-04, -1.68282697438203e-03, -7.37332916720468e-03, -1.42647390514189e-02)  # noqa: E501  # fmt: skip


def _const(value: float) -> tirx.FloatImm:
    return tirx.const(value, _F32)


def fast_exp(arg: tvm.ir.PrimExpr) -> tvm.ir.PrimExpr:
    """exp(arg) for a float32 expression, as vectorizable TIR (a few `T.Let`s, no calls)."""
    x = tirx.Var("fexp_x", _F32)
    n = tirx.Var("fexp_n", _F32)
    r = tirx.Var("fexp_r", _F32)
    poly = _const(_P[0])
    for coefficient in _P[1:]:
        poly = poly * r + _const(coefficient)
    exp_r = poly * r * r + r + _const(1.0)
    # 2**(n - 1): the exponent field is n - 1 + 127, in [1, 254] for n in [-125, 128].
    half_scale = tirx.reinterpret(
        _F32, tirx.shift_left(tirx.Cast("int32", n + _const(126.0)), tirx.const(23, "int32"))
    )
    value = half_scale * exp_r * _const(2.0)
    value = tirx.Select(arg < _const(_X_LO), _const(0.0), value)
    reduced = tirx.Let(r, x - n * _const(_LN2_HI) - n * _const(_LN2_LO), value)
    with_n = tirx.Let(n, tirx.floor(x * _const(_LOG2E) + _const(0.5)), reduced)
    clamped = tirx.Max(tirx.Min(arg, _const(_X_HI)), _const(_X_LO))
    return tirx.Let(x, clamped, with_n)


def fast_erf(arg: tvm.ir.PrimExpr) -> tvm.ir.PrimExpr:
    """erf(arg) for a float32 expression, as vectorizable TIR (two `T.Let`s, one divide)."""
    x = tirx.Var("ferf_x", _F32)
    x2 = tirx.Var("ferf_x2", _F32)
    p = _const(_ERF_P[0])
    for coefficient in _ERF_P[1:]:
        p = p * x2 + _const(coefficient)
    q = _const(_ERF_Q[0])
    for coefficient in _ERF_Q[1:]:
        q = q * x2 + _const(coefficient)
    clamped = tirx.Max(tirx.Min(arg, _const(4.0)), _const(-4.0))
    return tirx.Let(x, clamped, tirx.Let(x2, x * x, x * p / q))


# What `fast_math` rewrites: the function's TIR op, its fast form, the first `T.Let` of that
# form (how a rewritten body is recognised).
FAST = {
    "exp": ("tirx.exp", fast_exp, "fexp_x"),
    "erf": ("tirx.erf", fast_erf, "ferf_x"),
}


def calls(stmt: tirx.Stmt, function: str = "exp") -> list[str]:
    """The dtypes of the calls of `function` in a statement (a block's body), in order."""
    found: list[str] = []

    def visit(call: Any) -> Any:  # structural_map's callbacks take and return TVM objects
        if _is_call(call, function):
            found.append(str(call.ty))
        return call

    tvm_ffi.structural_map(stmt, [(tvm.ir.Call, visit)])
    return found


def blocks_computing(func: tirx.PrimFunc, function: str = "exp") -> list[str]:
    """The innermost blocks of `func` whose body calls `function` in float32, in program order."""
    found: list[str] = []

    def visit(block: Any) -> Any:
        inner: list[bool] = []

        def mark(b: Any) -> Any:
            inner.append(True)
            return b

        tvm_ffi.structural_map(block.body, [(s_tir.SBlock, mark)])
        if not inner and _F32 in calls(block.body, function):
            found.append(block.name_hint)
        return block

    tvm_ffi.structural_map(func.body, [(s_tir.SBlock, visit)])
    return found


def is_rewritten(stmt: tirx.Stmt, function: str = "exp") -> bool:
    """Whether the fast form of `function` is already in the statement (by its first `T.Let`)."""
    found: list[bool] = []
    first = FAST[function][2]

    def visit(let: Any) -> Any:
        found.append(let.var.name == first)
        return let

    tvm_ffi.structural_map(stmt, [(tirx.Let, visit)])
    return any(found)


def _is_call(call: Any, function: str) -> bool:
    return isinstance(call.op, tvm.ir.Op) and call.op.name == FAST[function][0]


def rewrite(stmt: tirx.Stmt, function: str = "exp") -> tirx.Stmt:
    """`stmt` with every float32 call of `function` replaced by its fast form (other dtypes left
    as they are)."""
    fast = FAST[function][1]

    def replace(call: Any) -> Any:
        if _is_call(call, function) and str(call.ty) == _F32:
            return fast(call.args[0])
        return call

    return tvm_ffi.structural_map(stmt, [(tvm.ir.Call, replace)])


def rewrite_block(sch: s_tir.Schedule, block: s_tir.SBlockRV, function: str = "exp") -> None:
    """Replace the block's calls of `function` (body and init) in the live schedule.

    The block keeps its iteration variables, regions and identity (its sref is reused), so the
    schedule's loop and block references stay valid and later primitives apply as before.
    """
    sref = sch.get_sref(block)
    old = sref.stmt
    new = s_tir.SBlock(
        old.iter_vars,
        old.reads,
        old.writes,
        old.name_hint,
        rewrite(old.body, function),
        rewrite(old.init, function) if old.init is not None else None,
        old.alloc_buffers,
        old.match_buffers,
        old.annotations,
    )
    sch.state.replace(sref, new, {old: new})
