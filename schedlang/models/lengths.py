"""One schedule for a function whose extents are symbolic (a prompt's length, a cached
length), tuned at representative lengths: what `tune-model` does for such a function of any
model, and the decoder's tuning (schedlang.models.decoder.tuning) for its kernels.

    tuner = LengthTuner(task, target, db, settings, workers, max_length, every_var_at)
    choice = tuner.run((1, 16, 128, 512))     # a KernelChoice, recorded under task.key

The tuner measures static functions only: a function with a symbolic extent is measured on
copies of it specialized at representative lengths (`PrimFunc.specialize`). Its schedule is one
schedule for every length, chosen by a weighted sum:

1. at each length the built-in proposer's templates are tuned (`trials` candidates);
2. the best few schedules found at any length are the candidates; each is checked on the
   symbolic function itself (schedlang's checker and TVM's schedule take a split of a symbolic
   loop: the tail becomes a predicate), checked again on the function specialized at the bounds,
   at the lengths measured and at a length that no power-of-two factor divides, and measured at
   every length;
3. the candidate with the smallest sum of its times, each divided by the best time any
   candidate reached at that length (every length counts alike, whatever its scale), is
   verified at that odd length (run against the unscheduled function) and recorded under the
   symbolic function's key, where `ApplySchedlangDatabase` finds it in the build.

Why one schedule rather than kernels specialized by length with a dispatch: a dispatch would
build each function several times (LLVM's time is most of a model's build) and needs the Relax
call to branch on the length; a schedule that holds at every length keeps one function, and the
times at each length say what it costs (docs/llm-tuning.md).

What a length means is the caller's (`values`): for a model's function every symbolic variable
at that length (`every_var_at`); for a decoder's kernel, a prompt of that length or one token
after that many cached (decoder.tuning.length_values).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import tvm
from tvm import tirx

from schedlang.checker.pipeline import lower
from schedlang.core.diagnostics import SchedlangError, error_line
from schedlang.core.opinfo import schedule_names
from schedlang.core.ops import Op, from_primfunc
from schedlang.core.target import Target
from schedlang.lang.syntax import parse
from schedlang.models.graph import Task
from schedlang.propose.builtin import BuiltinProposer
from schedlang.propose.interface import Proposal
from schedlang.propose.rules.gemv import MOST_ROWS
from schedlang.run.sandbox import JobError, Worker, WorkerCrash, WorkerTimeout
from schedlang.store.db import Database
from schedlang.store.records import Record, Status, current_versions, op_key
from schedlang.tuning.tune import Settings, Workers, tune

DEFAULT_LENGTHS = (1, 16, 128, 512)
PROPOSER = "lengths"  # the proposer of the record a symbolic function's choice is
# Marks a function specialized for measurement (its own key). The decoder's name, kept: the
# records its tuning made are found by it.
LENGTH_ATTR = "schedlang.decoder_length"

Values = Callable[[tirx.PrimFunc, int], dict[str, int]]  # a function's variables at a length
Measured = Callable[[tirx.PrimFunc, Mapping[str, int]], tirx.PrimFunc]  # what is timed


def symbolic_vars(func: tirx.PrimFunc) -> dict[str, tirx.Var]:
    """The function's symbolic extents by name: those of its buffers' shapes (the token count)
    and its scalar parameters (the cached length), in parameter order."""
    found: dict[str, tirx.Var] = {}
    for param in func.params:
        if isinstance(param.ty, tvm.tirx.BufferType):
            for dim in param.shape:
                if isinstance(dim, tirx.Var):
                    found.setdefault(dim.name, dim)
        else:
            found.setdefault(param.name, param)
    return found


def specialize(func: tirx.PrimFunc, values: Mapping[str, int]) -> tirx.PrimFunc:
    """`func` with each symbolic extent named in `values` bound to that value: a scalar
    parameter is removed, a buffer whose shape holds one is given a static shape."""
    scalars = {p.name for p in func.params if not isinstance(p.ty, tvm.tirx.BufferType)}
    binds: dict[Any, Any] = {}
    bound: set[str] = set()
    for param in func.params:
        if param.name in scalars:
            if param.name in values:
                binds[param] = tirx.const(values[param.name], str(param.ty.dtype))
            continue
        dims = [d for d in param.shape if isinstance(d, tirx.Var) and d.name in values]
        # A var bound through one buffer is bound everywhere: the others keep theirs, or the
        # specialization would define it twice.
        if dims and not bound & {d.name for d in dims}:
            shape = [
                tirx.const(values[d.name], str(d.ty.dtype)) if d in dims else d for d in param.shape
            ]
            binds[param] = tirx.decl_buffer(shape, param.dtype, param.name)
            bound |= {d.name for d in dims}
    return func.specialize(binds)


def every_var_at(func: tirx.PrimFunc, length: int) -> dict[str, int]:
    """Every symbolic extent of `func` at `length` (a model's prompt length, wherever it is)."""
    return dict.fromkeys(symbolic_vars(func), length)


def specialized(func: tirx.PrimFunc, values: Mapping[str, int]) -> tirx.PrimFunc:
    """`func` at `values`, as a model's function is measured."""
    return specialize(func, values) if values else func


@dataclass(frozen=True)
class KernelChoice:
    """What one kernel got: its schedule, where it came from, and its times at each length."""

    name: str
    key: str
    variables: tuple[str, ...]  # its symbolic extents ("" for none)
    lengths: tuple[int, ...]  # measured at (() for a static kernel)
    family: str  # the template family of its schedule ("" when none)
    schedule: str
    times_s: tuple[float | None, ...]  # at each length (one: a static kernel)
    checked_at: tuple[int, ...] = ()  # lengths its schedule was checked at (symbolic)
    verified_at: int | None = None  # the odd length it was run and verified at
    notes: tuple[str, ...] = ()
    # The symbolic kernel itself, built once with its schedule (tails as predicates), timed at
    # each length: what the build runs, where `times_s` are the specialized copies' times.
    symbolic_times_s: tuple[float, ...] = ()

    def summary(self) -> str:
        times = ", ".join("-" if t is None else f"{t * 1e6:.1f}" for t in self.times_s)
        if not self.variables:
            return f"{self.name}: {self.family or 'no schedule'}, {times} us"
        if self.symbolic_times_s:
            built = ", ".join(f"{t * 1e6:.1f}" for t in self.symbolic_times_s)
            times += f" (the symbolic build: {built})"
        at = ", ".join(map(str, self.lengths))
        return (
            f"{self.name} [{', '.join(self.variables)} at {at}]: {self.family or 'no schedule'}, "
            f"{times} us; checked at {', '.join(map(str, self.checked_at))}"
        )


def measured_lengths(
    choices: Sequence[KernelChoice],
    variables: Sequence[str] | None = None,
    lengths: Sequence[int] = (),
) -> dict[str, tuple[int, ...]]:
    """Each symbolic variable's lengths measured, sorted: the union of the lengths of the
    choices that have it (a function with a token count tuned at a GEMV's lengths only is tuned
    at a prompt's too: `LengthTuner.prompt_lengths`); `variables` (default: the choices' own,
    in order of appearance) says which, `lengths` what one that no choice has is given."""
    found: dict[str, set[int]] = {}
    for choice in choices:
        for name in choice.variables:
            found.setdefault(name, set()).update(choice.lengths)
    names = list(found) if variables is None else variables
    return {name: tuple(sorted(found.get(name) or lengths)) for name in names}


def check_lengths(
    lengths: Sequence[Any], max_length: int, bound: str = "the cache's"
) -> tuple[int, ...]:
    """The lengths as positive integers up to `max_length` (`bound`'s), sorted; one error line
    if not."""
    checked = []
    for value in lengths:
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise SchedlangError(f"lengths must be positive integers, got {value!r}")
        checked.append(value)
    kept = sorted({v for v in checked if v <= max_length})
    if not kept:
        raise SchedlangError(f"no length up to {bound} {max_length} tokens: {list(checked)}")
    return tuple(kept)


def odd_length(max_length: int) -> int:
    """A length between the bounds that no power of two above 1 divides: a split by any
    power-of-two factor leaves a tail there."""
    for length in (13, 11, 7, 5, 3):
        if length < max_length:
            return length
    return max_length


def fallback_length(lengths: Sequence[int], max_length: int) -> int | None:
    """The length a function is tuned at too when no schedule found at `lengths` holds at every
    length: the first default length above them within the bound, else the bound; None when
    the lengths reach it already."""
    above = [n for n in DEFAULT_LENGTHS if max(lengths) < n <= max_length]
    if above:
        return above[0]
    return max_length if max(lengths) < max_length else None


class LengthTuner:
    """One function's tuning: at each length, then the candidates across lengths. `values`
    says what a length means for it, `measured` what is timed at those values; the choice is
    recorded as proposed by `proposer`."""

    def __init__(
        self,
        task: Task,
        target: Target,
        db: Database,
        settings: Settings,
        workers: Workers,
        max_length: int,
        values: Values = every_var_at,
        measured: Measured = specialized,
        proposer: str = PROPOSER,
    ) -> None:
        self.task, self.target, self.db = task, target, db
        self.settings, self.workers, self.max_length = settings, workers, max_length
        self.values, self.measured, self.proposer = values, measured, proposer
        self.ops: dict[int, Op] = {}

    def static(self) -> KernelChoice:
        """A kernel of static shapes: tuned once; the fastest schedule that lowers on it."""
        op = self.op_at(0)
        self._tune(op, self.settings.trials)
        notes: list[str] = []
        for text, record in self._candidates((0,)).items():
            if problem := self._check(text, ()):
                notes.append(f"{_family(record)}: {problem}")
                continue
            self._record(text, record, (), (record.median_s,))
            return KernelChoice(
                self.task.name, self.task.key, (), (), _family(record), text,
                (record.median_s,), notes=tuple(notes),
            )  # fmt: skip
        return KernelChoice(
            self.task.name, self.task.key, (), (), "", "", (None,), notes=tuple(notes)
        )

    def op_at(self, length: int) -> Op:
        """The kernel at `length` as the tuner measures it (0: a static kernel as it is)."""
        if length not in self.ops:
            values = self.values(self.task.op.func, length) if length else {}
            func = self.measured(self.task.op.func, values)
            # Its own key: decode's static copy of a kernel (n = 1) is another function, whose
            # names may differ from these (the records of one would be renamed for the other).
            func = func.with_attr(LENGTH_ATTR, f"{self.task.key}@{length}")
            self.ops[length] = from_primfunc(func, f"{self.task.name}@{length}")
        return self.ops[length]

    def run(self, lengths: tuple[int, ...]) -> KernelChoice:
        variables = tuple(symbolic_vars(self.task.op.func))
        lengths = self.prompt_lengths(lengths)
        for length in lengths:
            self._tune(self.op_at(length), self.settings.trials)
        odd = odd_length(self.max_length)
        checked_at = tuple(sorted({1, *lengths, odd, self.max_length}))
        notes: list[str] = []
        candidates, holding = self._holding(lengths, checked_at, notes)
        fallback = fallback_length(lengths, self.max_length)
        if not holding and fallback is not None:
            # Every schedule of these lengths is made for them alone (at 1 token a prefill GEMM
            # is a GEMV, whose schedule may not hold at 13): one of a longer prompt holds.
            self._tune(self.op_at(fallback), self.settings.trials)
            candidates, holding = self._holding((*lengths, fallback), checked_at, notes)
        columns = [self._times(holding, length) for length in lengths]
        table = {text: [column[text] for column in columns] for text in holding}
        for text in _ranked(table):
            if self._times([text], odd)[text] is None:
                notes.append(f"{_family(candidates[text])}: failed its run at {odd} tokens")
                continue
            times = tuple(table[text])
            symbolic = isolated_symbolic_times(
                self.task.op.func, text, lengths, self.target, self.values, notes
            )
            self._record(text, candidates[text], lengths, times, symbolic)
            return KernelChoice(
                self.task.name, self.task.key, variables, lengths, _family(candidates[text]),
                text, times, checked_at, odd, tuple(notes), symbolic,
            )  # fmt: skip
        return KernelChoice(
            self.task.name, self.task.key, variables, lengths, "", "",
            tuple(None for _ in lengths), checked_at, None, tuple(notes),
        )  # fmt: skip

    def prompt_lengths(self, lengths: tuple[int, ...]) -> tuple[int, ...]:
        """`lengths`, and `fallback_length` where the function has a token count (a var of a
        buffer's shape) and every length is a GEMV's (at most MOST_ROWS tokens): a prefill's
        GEMM tuned at one token would get a GEMV's schedule, and a prompt is more than a few
        tokens (one token is decode's)."""
        func = self.task.op.func
        scalars = {p.name for p in func.params if not isinstance(p.ty, tvm.tirx.BufferType)}
        has_tokens = any(name not in scalars for name in symbolic_vars(func))
        extra = fallback_length(lengths, self.max_length)
        if has_tokens and max(lengths) <= MOST_ROWS and extra is not None:
            return (*lengths, extra)
        return lengths

    def _holding(
        self, lengths: tuple[int, ...], checked_at: tuple[int, ...], notes: list[str]
    ) -> tuple[dict[str, Record], list[str]]:
        """The candidates found at `lengths`, and those that hold at every one of `checked_at`
        (a note for each that does not)."""
        candidates = self._candidates(lengths)
        holding = []
        for text in candidates:
            problem = self._check(text, checked_at)
            if problem:
                notes.append(f"{_family(candidates[text])}: {problem}")
            else:
                holding.append(text)
        return candidates, holding

    def _candidates(self, lengths: tuple[int, ...]) -> dict[str, Record]:
        """The fastest verified schedule of each template family at each length."""
        found: dict[str, Record] = {}
        for length in lengths:
            key = op_key(self.op_at(length).func)
            families: set[str] = set()
            for record in self.db.records(key, self.target.key, Status.OK, order="speed"):
                family = _family(record)
                if record.schedule.strip() and family not in families:
                    families.add(family)
                    found.setdefault(record.schedule, record)
        return found  # fastest first at each length

    def _tune(self, op: Op, trials: int, proposals: Sequence[Proposal] = ()) -> None:
        # Nothing to tune (a SchedlangError): the kernel keeps what the other lengths found.
        with contextlib.suppress(SchedlangError):
            tune(
                op, self.target, self.db,
                settings=replace(self.settings, trials=trials, baseline=False),
                templates=proposals, proposer=None if proposals else BuiltinProposer(),
                workers=self.workers,
            )  # fmt: skip

    def _check(self, text: str, lengths: Sequence[int]) -> str:
        """'' when `text` lowers on the symbolic function and at each of `lengths`."""
        schedule = parse(text, f"<{self.task.name}>")
        try:
            lower(schedule, self.task.op.func, self.target)
            for length in lengths:
                values = self.values(self.task.op.func, length)
                lower(schedule, specialize(self.task.op.func, values), self.target)
        except SchedlangError as err:
            return f"a candidate does not hold at every length: {err.message.splitlines()[0]}"
        except Exception as exc:  # a guard that reads a symbolic extent as a number
            return f"the checker cannot check a candidate: {error_line(exc)}"
        return ""

    def _times(self, texts: Sequence[str], length: int) -> dict[str, float | None]:
        """Each schedule's median at `length`, measured and verified now (one tuning run for
        all) or found in the database; None where it failed."""
        op = self.op_at(length)
        key = op_key(op.func)
        missing = [text for text in texts if not self.db.has(key, self.target.key, text)]
        if missing:
            note = "one schedule at every length"
            self._tune(op, len(missing), [Proposal(text, self.proposer, note) for text in missing])
        times: dict[str, float | None] = {}
        for text in texts:
            record = self.db.get(key, self.target.key, text)
            times[text] = record.median_s if record is not None and record.is_ok else None
        return times

    def _record(
        self,
        text: str,
        origin: Record,
        lengths: tuple[int, ...],
        times: tuple[float | None, ...],
        symbolic: tuple[float, ...] = (),
    ) -> None:
        """The choice, recorded under the symbolic function's key (its median: the sum of its
        times at the lengths, what a prefill of each length would spend in it)."""
        measured = tuple(t for t in times if t is not None)
        total = sum(measured)
        flops = self.task.flops if not lengths else None  # a symbolic one's is TVM's guess
        gflops = flops / total / 1e9 if flops and total else None
        schedlang_version, tvm_version = current_versions()
        extra = {
            "names": schedule_names(self.task.op.func),
            "family": _family(origin),
            "lengths": list(lengths),
            "times_s": list(times),
            "variables": list(symbolic_vars(self.task.op.func)),
            "measured_as": [op_key(self.op_at(length or 0).func) for length in lengths or (0,)],
            "from_record": origin.id,
            "symbolic_times_s": list(symbolic),
        }
        record = Record(
            self.task.key, self.task.name, self.target.key, self.target.tvm_config, text, {},
            origin.template, Status.OK, "", measured, total, gflops, self.proposer,
            self.settings.seed, time.time(), schedlang_version, tvm_version, extra,
        )  # fmt: skip
        if not self.db.has(self.task.key, self.target.key, text):
            self.db.add(record)


SYMBOLIC_TIMEOUT_S = 60.0  # the symbolic form timed at every length (seconds), in its worker
_worker: Worker | None = None


def isolated_symbolic_times(
    func: tirx.PrimFunc,
    text: str,
    lengths: Sequence[int],
    target: Target,
    values_at: Values,
    notes: list[str],
) -> tuple[float, ...]:
    """`symbolic_times` in a worker process (one for the whole run): a kernel that hangs or
    crashes there costs this figure, which is only reported, never the tuning (a note says
    why). The candidates themselves were measured in the tuner's sandbox already."""
    global _worker
    if _worker is None:
        threads = {k: v for k, v in os.environ.items() if k == "TVM_NUM_THREADS"}
        _worker = Worker("symbolic", threads, {"symbolic_times": f"{__name__}:symbolic_times_job"})
        atexit.register(_worker.close)
    try:
        times = _worker.call(
            "symbolic_times", SYMBOLIC_TIMEOUT_S, func_json=tvm.ir.save_json(func), text=text,
            lengths=list(lengths), target_json=json.dumps(target.to_json()), values_at=values_at,
        )  # fmt: skip
    except (WorkerTimeout, WorkerCrash, JobError) as exc:
        notes.append(f"the symbolic form was not timed: {exc}")
        return ()
    return tuple(times)


def symbolic_times_job(
    func_json: str, text: str, lengths: list[int], target_json: str, values_at: Values
) -> list[float]:
    """`symbolic_times`, as a worker runs it."""
    func = tvm.ir.load_json(func_json)
    return list(symbolic_times(func, text, lengths, Target.from_json(target_json), values_at))


def symbolic_times(
    func: tirx.PrimFunc,
    text: str,
    lengths: Sequence[int],
    target: Target,
    values_at: Values = every_var_at,
) -> tuple[float, ...]:
    """`func` lowered with `text` at its symbolic form, built once, and timed at each length
    (median of 3 repeats of at least 20 ms; random inputs, token ids 0)."""
    import numpy as np

    from schedlang.core.ops import numpy_dtype
    from schedlang.run.measure import device_for

    lowered = lower(parse(text, "<chosen>"), func, target).func.with_attr("global_symbol", "main")
    library = tvm.compile(lowered, target=target.to_tvm()).jit()
    device = device_for(target)
    rng = np.random.default_rng(0)
    times = []
    for length in lengths:
        # A time evaluator of its own at each length: one evaluator keeps the runs per repeat
        # it grew to at a short length (to fill min_repeat_ms) for the calls after it, and a
        # prefill's attention at 512 tokens, run as often as at 16, took minutes (issue 45).
        evaluator = library.time_evaluator("main", device, repeat=3, min_repeat_ms=20)
        values = values_at(func, length)
        args: list[Any] = []
        for param in func.params:
            if not isinstance(param.ty, tvm.tirx.BufferType):
                args.append(values[param.name])
                continue
            shape = [values[d.name] if isinstance(d, tirx.Var) else int(d) for d in param.shape]
            dtype = numpy_dtype(str(param.dtype))
            array = rng.uniform(-1, 1, shape) if np.issubdtype(dtype, np.floating) else 0
            args.append(tvm.runtime.tensor(np.full(shape, array, dtype), device))
        times.append(float(np.median(evaluator(*args).results)))
    return tuple(times)


def _ranked(table: Mapping[str, list[float | None]]) -> list[str]:
    """The candidates measured at every length, by the sum of their times each divided by the
    best at that length (every length counts alike)."""
    complete: dict[str, list[float]] = {
        text: [t for t in times if t is not None]
        for text, times in table.items()
        if None not in times
    }
    if not complete:
        return []
    columns = len(next(iter(complete.values())))
    best = [min(times[i] for times in complete.values()) for i in range(columns)]

    def score(text: str) -> float:
        return sum(t / b for t, b in zip(complete[text], best, strict=True))

    return sorted(complete, key=score)


def _family(record: Record | None) -> str:
    if record is None:
        return ""
    extra = record.extra if isinstance(record.extra, dict) else {}
    return str(extra.get("family") or ("template" if record.template else "schedule"))


def default_lengths(max_length: int) -> tuple[int, ...]:
    """The lengths tuned when none are given: 1, 16, 128 and 512 up to `max_length` (a cache's
    length, a symbolic variable's upper bound), and `max_length` itself when it is below 512
    (the longest prompt it takes)."""
    kept = [length for length in DEFAULT_LENGTHS if length <= max_length]
    if max_length < DEFAULT_LENGTHS[-1]:
        kept.append(max_length)
    return tuple(sorted(set(kept)))
