"""Op files: what a schedule applies to, loaded from Python, and what its loop nest looks like.

An op file is Python that defines a computation the way TVM users do (`te.compute` +
`te.create_prim_func`, or TVMScript `@T.prim_func`). It offers either

* a function decorated with `@schedlang.op`, whose keyword parameters with int (or dtype string)
  defaults are shape parameters the CLI can set (`-D N=1024`), returning a PrimFunc (or an IRModule
  holding one PrimFunc); or
* a module-level PrimFunc.

    @schedlang.op(reference=lambda A, B: A @ B)
    def matmul(M: int = 1024, N: int = 1024, K: int = 1024, dtype: str = "float32"):
        A = te.placeholder((M, K), dtype, name="A")
        ...
        return te.create_prim_func([A, B, C])

`load_op` runs the file in this process under a time limit and turns every way it can go wrong into
a one-line `SchedlangError` (model files are loaded the same way: schedlang.core.loader). What its
loop nest looks like, as `schedlang show` prints it, is schedlang.core.opinfo's `describe`. The
rest of this module makes the arguments for checking a schedule of an op: random inputs, the
reference's outputs, the tolerance of the comparison.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import tvm
from tvm.tirx import PrimFunc

from schedlang.core.diagnostics import SchedlangError
from schedlang.core.loader import (
    DEFAULT_TIMEOUT_S,
    Definition,
    ParamValue,
    Reference,
    bind_params,
    bind_reference,
    call_user,
    decorate,
    pick_definition,
    running,
)
from schedlang.core.opinfo import (
    BufferInfo,
    arg_buffers,
    as_primfunc,
    function_name,
    index_limits,
    non_positive_extent,
    root_allocations,
    single_primfunc,
)

NOTHING_USABLE = (
    "expected a function decorated with @schedlang.op returning a PrimFunc, "
    "or a module-level PrimFunc"
)


# --- the decorator -------------------------------------------------------------------------------


@dataclass(frozen=True)
class OpDefinition(Definition):
    """An op file's function, marked by `@schedlang.op`."""


def op(
    fn: Callable[..., Any] | None = None, *, name: str | None = None, reference: Reference = None
) -> Any:
    """Mark a function returning a PrimFunc as an op: `@op` or `@op(name=..., reference=...)`.

    `reference` is a numpy implementation: it takes the input arrays (in argument order) and returns
    the output array (or a tuple of them). Its keyword-only parameters named like shape parameters
    receive their values.
    """
    return decorate(OpDefinition, fn, name, reference)


# --- what loading gives --------------------------------------------------------------------------


@dataclass(frozen=True)
class Op:
    name: str
    func: PrimFunc
    path: str | None = None
    params: dict[str, ParamValue] = field(default_factory=dict, hash=False)
    reference: Callable[..., Any] | None = None
    inputs: tuple[BufferInfo, ...] = ()
    outputs: tuple[BufferInfo, ...] = ()


def from_primfunc(
    func: PrimFunc | tvm.IRModule,
    name: str | None = None,
    reference: Callable[..., Any] | None = None,
) -> Op:
    """An Op for a PrimFunc built in Python (no file)."""
    prim_func = as_primfunc(func)
    return _make_op(name or function_name(prim_func), prim_func, None, {}, reference)


def _make_op(
    name: str,
    func: PrimFunc,
    path: str | None,
    params: dict[str, ParamValue],
    reference: Callable[..., Any] | None,
) -> Op:
    func = root_allocations(func)
    args = arg_buffers(func)
    return Op(
        name,
        func,
        path,
        params,
        reference,
        inputs=tuple(b for b in args if b.role == "input"),
        outputs=tuple(b for b in args if b.role == "output"),
    )


# --- loading an op file --------------------------------------------------------------------------


def split_op_spec(spec: str) -> tuple[str, str | None]:
    """`"examples/matmul.py:matmul"` -> `("examples/matmul.py", "matmul")`; no name -> None."""
    path, sep, name = spec.rpartition(":")
    if sep and path.endswith(".py") and name.isidentifier():
        return path, name
    return spec, None


def parse_defines(items: list[str]) -> dict[str, str]:
    """`["N=64", "dtype=float16"]` (the CLI's `-D` values) -> `{"N": "64", "dtype": "float16"}`."""
    defines = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip().isidentifier() or not value.strip():
            raise SchedlangError(f"bad define `{item}`", "write it as NAME=VALUE, e.g. -D N=1024")
        defines[key.strip()] = value.strip()
    return defines


def load_op(
    path: str,
    defines: dict[str, str] | None = None,
    name: str | None = None,
    timeout_s: float | None = DEFAULT_TIMEOUT_S,
) -> Op:
    """Run an op file and build its PrimFunc with `defines` applied to its shape parameters."""
    with running(path, "op file", NOTHING_USABLE, timeout_s) as (namespace, filename):
        attr, candidate = pick_definition(
            namespace,
            path,
            name,
            OpDefinition,
            single_primfunc,
            "op",
            " (load_op(..., name=NAME))",
            (NOTHING_USABLE,),
        )
        if isinstance(candidate, OpDefinition):
            _check_reference(candidate, path)
            params = bind_params(candidate, defines or {}, path)
            func = _call_op(candidate, attr, params, filename, path)
            _check_extents(func, candidate.name, path, params, defines or {})
            reference = bind_reference(candidate.reference, params)
            return _make_op(candidate.name, func, path, params, reference)
        if defines:
            raise SchedlangError(
                f"{path}: `{attr}` is a PrimFunc and has no parameters to define",
                f"cannot set {', '.join(defines)}; "
                "use a function decorated with @schedlang.op for shape parameters",
            )
        return _make_op(attr, candidate, path, {}, None)


def _call_op(
    definition: OpDefinition,
    attr: str,
    params: dict[str, ParamValue],
    filename: str,
    path: str,
) -> PrimFunc:
    result = call_user(definition.fn, f"op function `{attr}`", filename, path)(**params)
    func = single_primfunc(result)
    if func is None:
        raise SchedlangError(
            f"op function `{attr}` in {path} returned {type(result).__name__}, "
            "expected a PrimFunc (or an IRModule with one PrimFunc)",
            "end it with `return te.create_prim_func([inputs..., outputs...])`",
        )
    return func


def _check_reference(definition: OpDefinition, path: str) -> None:
    reference = definition.reference
    if reference is None or callable(reference):
        return
    shown = repr(reference)
    shown = shown if len(shown) <= 40 else shown[:37] + "..."
    line = definition.fn.__code__.co_firstlineno  # the decorator's line
    raise SchedlangError(
        f"{path}:{line}: the reference of op `{definition.name}` is {shown} "
        f"({type(reference).__name__}), not a function",
        "give @schedlang.op(reference=...) a function taking the input arrays (numpy) and "
        "returning the output array, or a tuple of them",
    )


def _check_extents(
    func: PrimFunc, name: str, path: str, params: dict[str, ParamValue], defines: dict[str, str]
) -> None:
    """Refuse a buffer dimension or loop extent below 1 (`-D M=-4`): numpy cannot allocate the
    buffer, and a negative count of flops makes no sense."""
    bad = non_positive_extent(func)
    if bad is None:
        return
    what, value = bad
    given = [k for k in defines if k in params and type(params[k]) is int]
    blamed = [k for k in given if params[k] == value]
    if blamed:
        settings = ", ".join(f"-D {k}={params[k]}" for k in blamed)
        names = ", ".join(f"`{k}`" for k in blamed)
        plural = "s" * (len(blamed) > 1)
        raise SchedlangError(
            f"{settings}: shape parameter{plural} {names} must be positive",
            f"with it, op `{name}` ({path}) has {what}",
        )
    shape_params = ", ".join(f"{k}={v}" for k, v in params.items() if type(v) is int)
    raise SchedlangError(
        f"{path}: op `{name}` has {what}: every extent must be positive",
        f"its shape parameters: {shape_params} (set with -D NAME=VALUE)" if shape_params else "",
    )


# --- arguments for checking a schedule -----------------------------------------------------------


def numpy_dtype(dtype: str) -> np.dtype:
    """The numpy dtype for a TVM dtype string (bfloat16 and float8 via ml_dtypes)."""
    try:
        return np.dtype(dtype)
    except TypeError:
        import ml_dtypes

        found: np.dtype[Any] = np.dtype(getattr(ml_dtypes, dtype))
        return found


def random_inputs(op: Op, seed: int = 0) -> list[np.ndarray]:
    """One array per argument of `op.func`: inputs random (floats in [-1, 1), ints in [-4, 4],
    bools either), outputs zeros; ints that index another buffer (a gather's indices) in
    [0, the extent they index)."""
    rng = np.random.default_rng(seed)
    arrays = []
    limits = index_limits(op.func)
    for b in arg_buffers(op.func):
        if any(isinstance(d, str) for d in b.shape):
            raise SchedlangError(f"buffer {b.name} has a symbolic shape {b.type_text}")
        shape, dtype = tuple(int(d) for d in b.shape), numpy_dtype(b.dtype)
        if b.role == "output":
            arrays.append(np.zeros(shape, dtype))
        elif np.issubdtype(dtype, np.integer) and b.name in limits:
            arrays.append(rng.integers(0, max(limits[b.name], 1), shape).astype(dtype))
        elif dtype == np.bool_:
            arrays.append(rng.integers(0, 2, shape).astype(np.bool_))
        elif np.issubdtype(dtype, np.unsignedinteger):
            arrays.append(rng.integers(0, 5, shape).astype(dtype))
        elif np.issubdtype(dtype, np.integer):
            arrays.append(rng.integers(-4, 5, shape).astype(dtype))
        else:
            arrays.append(rng.uniform(-1.0, 1.0, shape).astype(dtype))
    return arrays


def default_tolerance(dtype: str) -> tuple[float, float]:
    """(rtol, atol) for comparing a scheduled build with the unscheduled one: reordered float
    reductions differ in the last bits; integer results must match exactly."""
    kind, bits = numpy_dtype(dtype).kind, tvm.DataType(dtype).bits
    if kind in "biu":
        return 0.0, 0.0
    if bits <= 8:
        return 1e-1, 1e-1
    if bits == 16:
        return (5e-2, 5e-2) if dtype == "bfloat16" else (1e-2, 1e-2)
    if bits == 32:
        # A 1024-long fp32 dot product of [-1, 1) values differs by up to ~7e-5 between summation
        # orders; near-zero results need the atol, softmax's ~1e-3 outputs need it no larger.
        return 1e-3, 1e-4
    return 1e-7, 1e-9


def reference_outputs(op: Op, args: list[np.ndarray]) -> list[np.ndarray] | None:
    """Run `op.reference` on the input arrays of `args` (as from `random_inputs`); None when the
    op has no reference. Results come back as a list in the outputs' dtypes."""
    if op.reference is None:
        return None
    roles = [b.role for b in arg_buffers(op.func)]
    inputs = [a for a, role in zip(args, roles, strict=True) if role == "input"]
    what = f"the reference of op `{op.name}`"
    path = op.path or "<python>"
    filename = str(Path(op.path).resolve()) if op.path else ""
    result = call_user(op.reference, what, filename, path, _first_line(op.reference))(*inputs)
    results = list(result) if isinstance(result, tuple | list) else [result]
    if len(results) != len(op.outputs):
        raise SchedlangError(
            f"reference of op {op.name} returned {len(results)} arrays, "
            f"the op has {len(op.outputs)} outputs"
        )
    arrays = []
    for r, b in zip(results, op.outputs, strict=True):
        try:
            arrays.append(np.asarray(r).astype(numpy_dtype(b.dtype)))
        except (TypeError, ValueError) as e:
            raise SchedlangError(
                f"{path}: {what} returned {type(r).__name__} for output `{b.name}`, "
                f"not an array of {b.type_text} ({str(e).strip().splitlines()[0]})"
            ) from None
        shape = tuple(d for d in b.shape if isinstance(d, int))  # all of them, unless symbolic
        got = arrays[-1].shape
        if len(shape) == len(b.shape) and got != shape:
            if arrays[-1].size == math.prod(shape):  # e.g. (N,) for an (N, 1) output
                arrays[-1] = arrays[-1].reshape(shape)
                continue
            raise SchedlangError(
                f"{path}: {what} returned an array of shape {got} for output `{b.name}`, which "
                f"is {b.type_text}",
                "the reference must return each output in the op's own shape",
            )
    return arrays


def _first_line(function: Any) -> int | None:
    """The line a function (or a partial of one) is defined on, if it has Python code."""
    function = getattr(function, "func", function)  # functools.partial
    code = getattr(function, "__code__", None)
    return code.co_firstlineno if code is not None else None
