"""Loading a user's Python file (an op file, schedlang.core.ops, or a model file,
schedlang.models.model_file): both are loaded the same way, by the pieces here.

    with running(path, "op file", NOTHING_USABLE, timeout_s) as (namespace, filename):
        attr, candidate = pick_definition(namespace, path, name, OpDefinition, single_primfunc, ...)
        params = bind_params(candidate, defines, path, "op")

A file runs in this process, with its folder importable, under a time limit (`time_limit`:
SIGALRM, main thread only). What it raises becomes a one-line `SchedlangError` naming the line
(`raised_by_file`), with a hint when it is code written for TVM before 0.27; a Ctrl-C while it
runs still stops the program (`call_user`). `@schedlang.op` and `@schedlang.model` make a
`Definition` (`decorate`), whose keyword parameters with int, float or dtype string defaults are
the shape parameters `-D NAME=VALUE` sets (`bind_params`).
"""

from __future__ import annotations

import functools
import inspect
import re
import signal
import sys
import threading
import traceback
import types
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import tvm

from schedlang.core.diagnostics import SchedlangError, did_you_mean, one_of
from schedlang.core.imports import allow_torch

DEFAULT_TIMEOUT_S = 60.0
# A shape parameter becomes a TVM int32 extent (schedlang.lang.syntax.INT_LIMIT bounds schedules
# alike).
INT_LIMIT = 2**31 - 1
ParamValue = int | float | str
Reference = Callable[..., Any] | None  # a numpy implementation: input arrays in, outputs out
Decorated = TypeVar("Decorated", bound="Definition")


@dataclass(frozen=True)
class Definition:
    """What a decorator (`@schedlang.op`, `@schedlang.model`) turns a function into; calling it
    calls the function."""

    fn: Callable[..., Any]
    name: str
    reference: Reference = None

    def __call__(self, *args: Any, **params: Any) -> Any:
        return self.fn(*args, **params)


def decorate(
    kind: type[Decorated], fn: Callable[..., Any] | None, name: str | None, reference: Reference
) -> Any:
    """`@decorator` (`fn` given) or `@decorator(name=..., reference=...)` (`fn` None) as a
    `kind` of Definition."""

    def wrap(f: Callable[..., Any]) -> Decorated:
        return kind(f, name or f.__name__, reference)

    return wrap(fn) if fn is not None else wrap


# --- running the file ----------------------------------------------------------------------------


def compile_file(path: str, what: str, usable: str) -> tuple[types.CodeType, Path]:
    """A Python file's code, compiled under its real path (TVMScript reads its source back);
    `what` ("op file") and `usable` (what the file should define) word the errors."""
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
def running(
    path: str, what: str, usable: str, timeout_s: float | None
) -> Iterator[tuple[dict[str, Any], str]]:
    """The file at `path` compiled and run as a module under a time limit of `timeout_s`: its
    namespace, and the filename its code carries (for `raised_by_file`). The limit holds until
    the block ends: the file's own functions, called there, are under it too."""
    code, file = compile_file(path, what, usable)
    with _time_limit_of(path, what, timeout_s):
        yield run_module(code, file, path, what), code.co_filename


@contextmanager
def _time_limit_of(path: str, what: str, seconds: float | None) -> Iterator[None]:
    """`time_limit`, its timeout told as "{what} {path} took more than {seconds} s to load"."""
    try:
        with time_limit(seconds):
            yield
    except LoadTimeout:
        raise SchedlangError(f"{what} {path} took more than {seconds:g} s to load") from None


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


def run_module(code: types.CodeType, file: Path, path: str, what: str) -> dict[str, Any]:
    """Run a compiled op or model file as a module; its namespace. What the file raises becomes
    a SchedlangError naming its line (`raised_by_file`)."""
    module = types.ModuleType(f"schedlang_op_{file.stem}")
    module.__file__ = str(file.resolve())
    # Registered while it runs (dataclasses look their module up) with its folder importable.
    folder = str(file.resolve().parent)
    sys.modules[module.__name__] = module
    sys.path.insert(0, folder)
    allow_torch()  # the user's file may import torch (or anything that does)
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
    first = message.splitlines()
    text = f"{type(error).__name__}: {first[0]}" if first else type(error).__name__
    source = (frames[-1].line if frames else "") or ""
    hint = next((h for pattern, h in _OLD_TVM_HINTS if re.search(pattern, str(error))), "")
    return SchedlangError(f"{where}: {what} raised {text}", source and f"line: {source}", hint)


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


def call_user(
    fn: Callable[..., Any], what: str, filename: str, path: str, line: int | None = None
) -> Callable[..., Any]:
    """`fn` (the file's function, or its reference) wrapped so that what it raises becomes
    `raised_by_file` (a SchedlangError it raises passes as it is), while a Ctrl-C meanwhile or
    the time limit still stop the load."""

    def called(*args: Any, **kwargs: Any) -> Any:
        with _sigint_watch() as sigint_seen:
            try:
                return fn(*args, **kwargs)
            except SchedlangError:
                raise
            except BaseException as e:
                if not _is_users_error(e, sigint_seen):
                    raise
                raise raised_by_file(e, what, filename, path, line) from None

    return called


# --- what the file defines -----------------------------------------------------------------------


def pick_definition(
    namespace: dict[str, Any],
    path: str,
    name: str | None,
    kind: type[Definition],
    plain: Callable[[Any], Any],
    noun: str,
    several_note: str,
    nothing_notes: tuple[str, ...],
) -> tuple[str, Any]:
    """(attribute, what it holds): the `kind` of Definition, or the plain value `plain` makes of
    an attribute (None for one that is not a `noun`), named `name`, else the only one; a
    decorated definition comes before plain values."""
    decorated = {k: v for k, v in namespace.items() if isinstance(v, kind)}
    plains = {k: p for k, v in namespace.items() if (p := plain(v)) is not None}
    everything = decorated | plains
    if name is not None:
        for attr, candidate in everything.items():
            if name in (attr, getattr(candidate, "name", attr)):
                return attr, candidate
        raise SchedlangError(
            f"{path} defines no {noun} named `{name}`",
            one_of(list(everything), f"{noun}s it defines"),
            did_you_mean(name, everything),
        )
    for group in (decorated, plains):
        if len(group) == 1:
            return next(iter(group.items()))
        if len(group) > 1:
            raise SchedlangError(
                f"{path} defines several {noun}s: {', '.join(group)}",
                f"pick one with {path}:NAME{several_note}",
            )
    raise SchedlangError(f"{path} defines no {noun}", *nothing_notes)


def bind_params(
    definition: Definition, defines: dict[str, str], path: str, what: str = "op"
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
