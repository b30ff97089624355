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
a one-line `SchedlangError`. `describe` and `render_show` give the loop nest that `schedlang show`
prints and that a model is prompted with: blocks, their loops outer to inner (by loop variable name,
which is how the schedule language names axes), and the buffers.
"""

from __future__ import annotations

import functools
import inspect
import math
import re
import signal
import sys
import threading
import traceback
import types
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import tvm
from tvm.s_tir.analysis import estimate_tir_flops
from tvm.s_tir.stmt import SBlockRealize
from tvm.tirx import BufferStore, For, IfThenElse, PrimFunc, SeqStmt

from schedlang.core.diagnostics import SchedlangError, did_you_mean, one_of

DEFAULT_TIMEOUT_S = 60.0
# A shape parameter becomes a TVM int32 extent (schedlang.lang.syntax.INT_LIMIT bounds schedules
# alike).
INT_LIMIT = 2**31 - 1
NOTHING_USABLE = (
    "expected a function decorated with @schedlang.op returning a PrimFunc, "
    "or a module-level PrimFunc"
)
ParamValue = int | float | str


# --- the decorator -------------------------------------------------------------------------------


@dataclass(frozen=True)
class OpDefinition:
    """What `@schedlang.op` turns a function into; calling it calls the function."""

    fn: Callable[..., Any]
    name: str
    reference: Callable[..., Any] | None = None

    def __call__(self, *args: Any, **params: Any) -> Any:
        return self.fn(*args, **params)


def op(
    fn: Callable[..., Any] | None = None,
    *,
    name: str | None = None,
    reference: Callable[..., Any] | None = None,
) -> Any:
    """Mark a function returning a PrimFunc as an op: `@op` or `@op(name=..., reference=...)`.

    `reference` is a numpy implementation: it takes the input arrays (in argument order) and returns
    the output array (or a tuple of them). Its keyword-only parameters named like shape parameters
    receive their values.
    """

    def wrap(f: Callable[..., Any]) -> OpDefinition:
        return OpDefinition(f, name or f.__name__, reference)

    return wrap(fn) if fn is not None else wrap


# --- what loading gives --------------------------------------------------------------------------


@dataclass(frozen=True)
class BufferInfo:
    name: str
    shape: tuple[int | str, ...]
    dtype: str
    role: str  # "input" | "output" | "intermediate"

    @property
    def type_text(self) -> str:
        return f"{self.dtype}[{', '.join(map(str, self.shape))}]"


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
    prim_func = _single_primfunc(func)
    if prim_func is None:
        raise SchedlangError(f"expected a PrimFunc, got {type(func).__name__}")
    symbol = prim_func.attrs.get("global_symbol") if prim_func.attrs else None
    return _make_op(name or str(symbol or "main"), prim_func, None, {}, reference)


def _make_op(
    name: str,
    func: PrimFunc,
    path: str | None,
    params: dict[str, ParamValue],
    reference: Callable[..., Any] | None,
) -> Op:
    func = root_allocations(func)
    args = _arg_buffers(func)
    return Op(
        name,
        func,
        path,
        params,
        reference,
        inputs=tuple(b for b in args if b.role == "input"),
        outputs=tuple(b for b in args if b.role == "output"),
    )


def root_allocations(func: PrimFunc) -> PrimFunc:
    """`func` with its function-level `T.alloc_buffer` statements moved into the root block's
    allocations, where `te.create_prim_func` puts them. TVMScript in 0.27 writes them as
    `AllocBuffer` statements, which the schedule primitives do not see as intermediates:
    `cache_write` then drops the buffer, and `reverse_compute_inline` of an epilogue fails
    ("`acc_local` is an output block")."""
    realize = func.body
    if not isinstance(realize, SBlockRealize):
        return func
    block = realize.block
    stmts = list(block.body.seq) if isinstance(block.body, SeqStmt) else [block.body]
    moved = [s for s in stmts if isinstance(s, tvm.tirx.AllocBuffer) and not s.annotations]
    rest = [s for s in stmts if not any(s.same_as(m) for m in moved)]
    if not moved or not rest:
        return func
    root = tvm.s_tir.SBlock(
        block.iter_vars, block.reads, block.writes, block.name_hint,
        rest[0] if len(rest) == 1 else SeqStmt(rest), block.init,
        [*block.alloc_buffers, *(s.buffer for s in moved)], block.match_buffers,
        block.annotations,
    )  # fmt: skip
    return func.with_body(SBlockRealize(list(realize.iter_values), realize.predicate, root))


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
    code, file = compile_file(path)
    try:
        with time_limit(timeout_s):
            namespace = run_module(code, file, path)
            attr, candidate = _pick_candidate(namespace, path, name)
            if isinstance(candidate, OpDefinition):
                _check_reference(candidate, path)
                params = bind_params(candidate, defines or {}, path)
                func = _call_op(candidate, attr, params, code.co_filename, path)
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
    except LoadTimeout:
        raise SchedlangError(f"op file {path} took more than {timeout_s:g} s to load") from None


def compile_file(
    path: str, what: str = "op file", usable: str = NOTHING_USABLE
) -> tuple[types.CodeType, Path]:
    """A Python file's code, compiled under its real path (TVMScript reads its source back);
    `what` and `usable` word the errors (model files share this loader, schedlang.models.graph)."""
    file = Path(path)
    if not file.is_file():
        raise SchedlangError(f"{what} not found: {path}")
    if file.suffix != ".py":
        raise SchedlangError(f"{path}: {_article(what)} must be a Python file (.py)", usable)
    try:
        source = file.read_text(encoding="utf-8")
        return compile(source, str(file.resolve()), "exec"), file
    except UnicodeDecodeError:
        raise SchedlangError(f"{path}: not a Python file (not UTF-8 text)") from None
    except SyntaxError as e:
        where = f"{path}:{e.lineno}:{e.offset}" if e.offset else f"{path}:{e.lineno}"
        line = (e.text or "").strip()
        raise SchedlangError(f"{where}: syntax error: {e.msg}", line and f"line: {line}") from None


def _article(noun: str) -> str:
    return f"{'an' if noun[:1] in 'aeiou' else 'a'} {noun}"


class LoadTimeout(BaseException):
    """A BaseException so that an op file's own `except Exception` cannot swallow it."""


@contextmanager
def _sigint_watch() -> Iterator[list[bool]]:
    """Yields a flag set when SIGINT arrives meanwhile: a KeyboardInterrupt with the flag set is
    the user pressing Ctrl-C (stop, exit 130); without it, user code raised it itself (an error
    in that code, reported like any other)."""
    seen = [False]
    if threading.current_thread() is not threading.main_thread():
        yield seen  # signals reach only the main thread: any KeyboardInterrupt here is raised
        return
    previous = signal.getsignal(signal.SIGINT)

    def on_sigint(signum: int, frame: Any) -> None:
        seen[0] = True
        if callable(previous):
            previous(signum, frame)  # Python's default handler raises KeyboardInterrupt
        elif previous != signal.SIG_IGN:
            raise KeyboardInterrupt

    signal.signal(signal.SIGINT, on_sigint)
    try:
        yield seen
    finally:
        signal.signal(signal.SIGINT, previous)


def _is_users_error(error: BaseException, sigint_seen: list[bool]) -> bool:
    """Whether an exception out of user code (an op file, its function, its reference) is that
    code's failure, rather than our time limit or the user's Ctrl-C."""
    if isinstance(error, LoadTimeout):
        return False
    return not (isinstance(error, KeyboardInterrupt) and sigint_seen[0])


@contextmanager
def time_limit(seconds: float | None) -> Iterator[None]:
    """Raise LoadTimeout in the body after `seconds` (an op or model file that never returns)."""
    # SIGALRM only reaches the main thread; elsewhere the op file runs unguarded.
    if not seconds or threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_alarm(signum: int, frame: Any) -> None:
        raise LoadTimeout

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def run_module(
    code: types.CodeType, file: Path, path: str, what: str = "op file"
) -> dict[str, Any]:
    """Run a compiled op or model file as a module; its namespace. What the file raises becomes
    a SchedlangError naming its line (`raised_by_file`)."""
    module = types.ModuleType(f"schedlang_op_{file.stem}")
    module.__file__ = str(file.resolve())
    # Registered while it runs (dataclasses look their module up) with its folder importable.
    folder = str(file.resolve().parent)
    sys.modules[module.__name__] = module
    sys.path.insert(0, folder)
    try:
        with _sigint_watch() as sigint_seen:
            try:
                exec(code, module.__dict__)
            except BaseException as e:  # SystemExit, KeyboardInterrupt, its own kinds too
                if not _is_users_error(e, sigint_seen):
                    raise
                raise raised_by_file(e, what, code.co_filename, path) from None
    finally:
        sys.modules.pop(module.__name__, None)
        if folder in sys.path:
            sys.path.remove(folder)
    return module.__dict__


def raised_by_file(
    error: BaseException, what: str, filename: str, path: str, line: int | None = None
) -> SchedlangError:
    """One line: where in the op file (the last of its lines the exception passed, else `line`),
    what raised, and the exception's type and first line; the source line as a note."""
    frames = [f for f in traceback.extract_tb(error.__traceback__) if f.filename == filename]
    where = f"{path}:{frames[-1].lineno}" if frames else f"{path}:{line}" if line else path
    message = str(error).strip().removeprefix("error: ")
    if isinstance(error, ImportError) and error.path:  # "... from 'tvm.script' (/site-packages/…)"
        message = message.replace(f" ({error.path})", "")
    message = message.splitlines()
    text = f"{type(error).__name__}: {message[0]}" if message else type(error).__name__
    line = frames[-1].line if frames else ""
    hint = next((h for pattern, h in _OLD_TVM_HINTS if re.search(pattern, str(error))), "")
    return SchedlangError(f"{where}: {what} raised {text}", line and f"line: {line}", hint)


# What an op file written for TVM before 0.27 (or from online examples) trips on, and what to
# write instead: TVMScript's TIR dialect is `tirx`, blocks are `sblock`, schedules live in s_tir.
_OLD_TVM_HINTS = (
    (
        r"cannot import name 'tir' from 'tvm\.script'",
        "TVM 0.27 renamed TVMScript's TIR dialect: write `from tvm.script import tirx as T`, "
        "and `with T.sblock(...)` inside `@T.prim_func(s_tir=True)` for `T.block` "
        "(docs/ops.md)",
    ),
    (
        r"'tvm\.tirx\.script' has no attribute 'block'",
        'TVM 0.27 renamed T.block: write `with T.sblock("name"):` and decorate the function '
        "with `@T.prim_func(s_tir=True)` (docs/ops.md)",
    ),
    (
        r"does not support statement s_tir\.SBlockRealize",
        "functions with T.sblock need @T.prim_func(s_tir=True) in TVM 0.27",
    ),
    (
        r"cannot import name 'tir' from 'tvm'|No module named 'tvm\.tir'|"
        r"module 'tvm' has no attribute 'tir'",
        "TVM 0.27 split tvm.tir: IR nodes are in `tvm.tirx`, TVMScript is "
        "`from tvm.script import tirx as T`, schedules are `tvm.s_tir` (docs/ops.md)",
    ),
    (
        r"module 'tvm\.te' has no attribute 'create_schedule'",
        "TVM 0.27 has no te schedules: return `te.create_prim_func([inputs..., outputs...])` "
        "and write the schedule in schedlang (docs/ops.md)",
    ),
)


def _pick_candidate(namespace: dict[str, Any], path: str, name: str | None) -> tuple[str, Any]:
    decorated = {k: v for k, v in namespace.items() if isinstance(v, OpDefinition)}
    primfuncs = {k: f for k, v in namespace.items() if (f := _single_primfunc(v)) is not None}
    everything = decorated | primfuncs
    if name is not None:
        for attr, candidate in everything.items():
            if name in (attr, getattr(candidate, "name", attr)):
                return attr, candidate
        raise SchedlangError(
            f"{path} defines no op named `{name}`",
            one_of(list(everything), "ops it defines"),
            did_you_mean(name, everything),
        )
    for group in (decorated, primfuncs):
        if len(group) == 1:
            return next(iter(group.items()))
        if len(group) > 1:
            raise SchedlangError(
                f"{path} defines several ops: {', '.join(group)}",
                f"pick one with {path}:NAME (load_op(..., name=NAME))",
            )
    raise SchedlangError(f"{path} defines no op", NOTHING_USABLE)


def _single_primfunc(value: Any) -> PrimFunc | None:
    if isinstance(value, PrimFunc):
        return value
    if isinstance(value, tvm.IRModule):
        funcs = [f for f in value.functions.values() if isinstance(f, PrimFunc)]
        if len(funcs) == 1 and len(value.functions) == 1:
            return funcs[0]
    return None


def bind_params(
    definition: OpDefinition, defines: dict[str, str], path: str, what: str = "op"
) -> dict[str, ParamValue]:
    """The definition's shape parameters: its defaults, overridden by `-D NAME=VALUE` defines."""
    params: dict[str, ParamValue] = {}
    for p in inspect.signature(definition.fn).parameters.values():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        if (
            p.default is p.empty
            or isinstance(p.default, bool)
            or not isinstance(p.default, ParamValue)
        ):
            raise SchedlangError(
                f"{path}: parameter `{p.name}` of {what} `{definition.name}` needs an int, "
                "float or dtype string default",
                f"the {what}'s parameters are its shape parameters, set with -D NAME=VALUE",
            )
        params[p.name] = p.default
    for key, text in defines.items():
        if key not in params:
            raise SchedlangError(
                f"{path}: {what} `{definition.name}` has no parameter `{key}`",
                one_of(list(params), f"parameters of {what} {definition.name}"),
                did_you_mean(key, params),
            )
        params[key] = _parse_value(key, text, params[key])
    return params


def _parse_value(key: str, text: str, default: ParamValue) -> ParamValue:
    try:
        if isinstance(default, int):
            digits = text.strip().lstrip("+-").lstrip("0") or "0"
            if digits.isdigit() and (len(digits) > len(str(INT_LIMIT)) or int(digits) > INT_LIMIT):
                shown = text if len(text) <= 40 else f"{text[:20]}…{text[-4:]}"
                size = (
                    "small: the limit is -2^31+1" if "-" in text else "large: the limit is 2^31-1"
                )
                raise SchedlangError(
                    f"-D {key}={shown}: integer too {size}",
                    "TVM indexes loops and buffers with 32-bit integers",
                )
            return int(text)
        if isinstance(default, float):
            return float(text)
        if not re.fullmatch(r"bool|u?int\d+|b?float\d+(_\w+)?", text):
            raise ValueError(text)
        return str(tvm.DataType(text))
    except (ValueError, TypeError):
        kind = {int: "an integer", float: "a number"}.get(type(default), "a dtype like float16")
        raise SchedlangError(f"-D {key}={text}: expected {kind}") from None


def _call_op(
    definition: OpDefinition,
    attr: str,
    params: dict[str, ParamValue],
    filename: str,
    path: str,
) -> PrimFunc:
    with _sigint_watch() as sigint_seen:
        try:
            result = definition.fn(**params)
        except SchedlangError:
            raise
        except BaseException as e:
            if not _is_users_error(e, sigint_seen):
                raise
            raise raised_by_file(e, f"op function `{attr}`", filename, path) from None
    func = _single_primfunc(result)
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
    bad = _non_positive_extent(func)
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


def _non_positive_extent(func: PrimFunc) -> tuple[str, int] | None:
    """("buffer `A` float32[-4, 1024]", -4), or the same for a loop; None when all are positive."""
    buffers = _arg_buffers(func) + [_buffer_info(b, "intermediate") for b in _alloc_buffers(func)]
    for buffer in buffers:
        for dim in buffer.shape:
            if isinstance(dim, int) and dim <= 0:
                return f"buffer `{buffer.name}` {buffer.type_text}", dim
    blocks: list[BlockInfo] = []
    _collect_blocks(func.body, [], blocks, set(), is_root=True)
    for block in blocks:
        for loop in block.loops:
            if isinstance(loop.extent, int) and loop.extent <= 0:
                return f"loop `{loop.var}` of block `{block.name}` with extent {loop.extent}", (
                    loop.extent
                )
    return None


def bind_reference(
    reference: Callable[..., Any] | None, params: dict[str, ParamValue]
) -> Callable[..., Any] | None:
    """The reference with the shape parameters it names bound, so it takes only the inputs."""
    if reference is None:
        return None
    try:
        signature = inspect.signature(reference)
    except (TypeError, ValueError):
        return reference
    wanted = {
        k: params[k]
        for k, p in signature.parameters.items()
        if p.kind is p.KEYWORD_ONLY and k in params
    }
    return functools.partial(reference, **wanted) if wanted else reference


# --- loop-nest introspection ---------------------------------------------------------------------


@dataclass(frozen=True)
class LoopInfo:
    var: str
    extent: int | str  # str only for a symbolic extent
    kind: str  # "spatial" | "reduce"


@dataclass(frozen=True)
class BlockInfo:
    name: str
    loops: tuple[LoopInfo, ...]  # outer to inner, up to the enclosing block
    reads: tuple[str, ...]
    writes: tuple[str, ...]

    @property
    def axes(self) -> tuple[str, ...]:
        return tuple(loop.var for loop in self.loops)


@dataclass(frozen=True)
class OpInfo:
    name: str
    path: str | None
    params: dict[str, ParamValue] = field(hash=False)
    buffers: tuple[BufferInfo, ...]
    blocks: tuple[BlockInfo, ...]
    flops: int | None

    def block(self, name: str) -> BlockInfo:
        for block in self.blocks:
            if block.name == name:
                return block
        raise KeyError(name)


def describe(op_or_func: Op | PrimFunc) -> OpInfo:
    """Blocks (every `T.sblock` but the root, in program order) with their loops, and buffers."""
    op_ = op_or_func if isinstance(op_or_func, Op) else from_primfunc(op_or_func)
    func = op_.func
    blocks: list[BlockInfo] = []
    _collect_blocks(func.body, [], blocks, set(), is_root=True)
    try:
        flops: int | None = flop_count(func)
    except SchedlangError:
        flops = None
    buffers = _arg_buffers(func) + [_buffer_info(b, "intermediate") for b in _alloc_buffers(func)]
    return OpInfo(op_.name, op_.path, op_.params, tuple(buffers), tuple(blocks), flops)


def schedule_names(func: PrimFunc) -> dict[str, list[str]]:
    """The names a schedule of `func` may use: its blocks, each block's loop variables (outer to
    inner, block by block) and its buffers, in program order."""
    info = describe(func)
    return {
        "blocks": [block.name for block in info.blocks],
        "loops": [loop.var for block in info.blocks for loop in block.loops],
        "buffers": [buffer.name for buffer in info.buffers],
    }


def flop_count(func: PrimFunc) -> int:
    """Floating point operations, by TVM's estimator (s_tir.analysis.estimate_tir_flops).

    It counts float arithmetic per block times the loop trip counts: a matmul's multiply-add is 2,
    a max reduction 1. Calls (exp, rsqrt), integer index arithmetic and padding selects count
    nothing, so softmax is 4 flops per element, not 5.
    """
    try:
        return int(estimate_tir_flops(tvm.IRModule({"main": func})))
    except Exception as e:  # symbolic extents, or IR the estimator does not know
        raise SchedlangError(f"cannot count flops: {str(e).strip().splitlines()[0]}") from None


def render_show(info: OpInfo) -> str:
    """The text `schedlang show` prints."""
    where = [info.path] if info.path else []
    where += [f"{k}={v}" for k, v in info.params.items()]
    lines = [f"op {info.name}" + (f" ({', '.join(where)})" if where else ""), "buffers:"]
    name_width = max((len(b.name) for b in info.buffers), default=0)
    type_width = max((len(b.type_text) for b in info.buffers), default=0)
    for b in info.buffers:
        lines.append(f"  {b.name:<{name_width}}  {b.type_text:<{type_width}}  {b.role}")
    for block in info.blocks:
        access = [f"reads {', '.join(block.reads)}"] if block.reads else []
        access += [f"writes {', '.join(block.writes)}"] if block.writes else []
        lines.append(f"block {block.name}  ({'; '.join(access)})")
        var_width = max((len(loop.var) for loop in block.loops), default=0)
        extent_width = max((len(str(loop.extent)) for loop in block.loops), default=0)
        for loop in block.loops:
            lines.append(f"  {loop.var:<{var_width}}  {loop.extent!s:>{extent_width}}  {loop.kind}")
    lines.append(f"flops: {format_flops(info.flops) if info.flops is not None else 'unknown'}")
    return "\n".join(lines)


def format_flops(flops: float) -> str:
    for scale, unit in ((1e12, "TFLOP"), (1e9, "GFLOP"), (1e6, "MFLOP"), (1e3, "KFLOP")):
        if flops >= scale:
            return f"{flops / scale:.3g} {unit}"
    return f"{flops:g} FLOP"


def _collect_blocks(
    stmt: Any, loops: list[For], out: list[BlockInfo], stored: set[str], is_root: bool = False
) -> None:
    """Walk statements, tracking the loops since the enclosing block; `stored` gets the names of
    buffers written outside any block (TIR without blocks)."""
    if isinstance(stmt, For):
        _collect_blocks(stmt.body, [*loops, stmt], out, stored)
    elif isinstance(stmt, SBlockRealize):
        block = stmt.block
        if not (is_root and block.name_hint == "root"):
            out.append(_block_info(stmt, loops))
        _collect_blocks(block.body, [], out, stored)
    elif isinstance(stmt, SeqStmt):
        for child in stmt.seq:
            _collect_blocks(child, loops, out, stored)
    elif isinstance(stmt, IfThenElse):
        _collect_blocks(stmt.then_case, loops, out, stored)
        _collect_blocks(stmt.else_case, loops, out, stored)
    elif isinstance(stmt, BufferStore):
        stored.add(stmt.buffer.name)
    elif getattr(stmt, "body", None) is not None:
        _collect_blocks(stmt.body, loops, out, stored)


def _block_info(realize: SBlockRealize, loops: list[For]) -> BlockInfo:
    block = realize.block
    reduce_vars = [
        var
        for iv, value in zip(block.iter_vars, realize.iter_values, strict=True)
        if iv.iter_type != 0  # anything but a data-parallel (spatial) iterator
        for var in tvm.tirx.analysis.undefined_vars(value)
    ]
    return BlockInfo(
        block.name_hint,
        tuple(
            LoopInfo(
                loop.loop_var.name,
                _int_or_text(loop.extent),
                "reduce" if any(loop.loop_var.same_as(v) for v in reduce_vars) else "spatial",
            )
            for loop in loops
        ),
        _unique(_region_buffer(r).name for r in block.reads),
        _unique(_region_buffer(r).name for r in block.writes),
    )


def _region_buffer(region: Any) -> Any:
    # 0.27 spells a block's read/write region `TensorRegion(source=buffer, region=...)`.
    return region.source if hasattr(region, "source") else region.buffer


def _written_buffers(func: PrimFunc) -> set[str]:
    blocks: list[BlockInfo] = []
    stored: set[str] = set()
    _collect_blocks(func.body, [], blocks, stored, is_root=True)
    return stored | {name for block in blocks for name in block.writes}


def read_buffers(func: PrimFunc) -> set[str]:
    """The buffers some block of `func` reads, at any depth."""
    blocks: list[BlockInfo] = []
    _collect_blocks(func.body, [], blocks, set(), is_root=True)
    return {name for block in blocks for name in block.reads}


def _arg_buffers(func: PrimFunc) -> list[BufferInfo]:
    written = _written_buffers(func)
    # 0.27 has no buffer_map: a buffer argument is a Var of BufferType that acts as the buffer.
    buffers = [p for p in func.params if isinstance(p.ty, tvm.tirx.BufferType)]
    return [_buffer_info(b, "output" if b.name in written else "input") for b in buffers]


def _alloc_buffers(func: PrimFunc) -> list[Any]:
    found: list[Any] = []

    def visit(stmt: Any) -> None:
        if isinstance(stmt, SBlockRealize):
            found.extend(stmt.block.alloc_buffers)
            visit(stmt.block.body)
        elif isinstance(stmt, SeqStmt):
            for child in stmt.seq:
                visit(child)
        elif isinstance(stmt, IfThenElse):
            visit(stmt.then_case)
            visit(stmt.else_case)
        elif getattr(stmt, "body", None) is not None:
            visit(stmt.body)

    visit(func.body)
    return found


def _buffer_info(buffer: Any, role: str) -> BufferInfo:
    return BufferInfo(
        buffer.name, tuple(_int_or_text(d) for d in buffer.shape), str(buffer.dtype), role
    )


def _int_or_text(expr: Any) -> int | str:
    return int(expr) if isinstance(expr, tvm.tirx.IntImm | int) else str(expr)


def _unique(names: Iterator[str] | Any) -> tuple[str, ...]:
    return tuple(dict.fromkeys(names))


# --- arguments for checking a schedule -----------------------------------------------------------


def numpy_dtype(dtype: str) -> np.dtype:
    """The numpy dtype for a TVM dtype string (bfloat16 and float8 via ml_dtypes)."""
    try:
        return np.dtype(dtype)
    except TypeError:
        import ml_dtypes

        return np.dtype(getattr(ml_dtypes, dtype))


def random_inputs(op: Op, seed: int = 0) -> list[np.ndarray]:
    """One array per argument of `op.func`: inputs random (floats in [-1, 1), ints in [-4, 4],
    bools either), outputs zeros."""
    rng = np.random.default_rng(seed)
    arrays = []
    for b in _arg_buffers(op.func):
        if any(isinstance(d, str) for d in b.shape):
            raise SchedlangError(f"buffer {b.name} has a symbolic shape {b.type_text}")
        shape, dtype = tuple(int(d) for d in b.shape), numpy_dtype(b.dtype)
        if b.role == "output":
            arrays.append(np.zeros(shape, dtype))
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
    roles = [b.role for b in _arg_buffers(op.func)]
    inputs = [a for a, role in zip(args, roles, strict=True) if role == "input"]
    what = f"the reference of op `{op.name}`"
    path = op.path or "<python>"
    with _sigint_watch() as sigint_seen:
        try:
            result = op.reference(*inputs)
        except SchedlangError:
            raise
        except BaseException as e:
            if not _is_users_error(e, sigint_seen):
                raise
            filename = str(Path(op.path).resolve()) if op.path else ""
            raise raised_by_file(e, what, filename, path, _first_line(op.reference)) from None
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
        shape = tuple(b.shape)
        got = arrays[-1].shape
        if all(isinstance(d, int) for d in shape) and got != shape:
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
