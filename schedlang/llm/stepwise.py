"""Per-statement constrained decoding: the checker's state decides what a model may write next.

A model's answer is written one statement at a time. Before each statement the prefix written so
far is checked (`schedlang.checker.check.check_prefix`) and the live loop nest it leaves decides the
grammar of the next step: the op's blocks (a `block NAME:` header where the op has several), the
axes of each block as they exist now (derived names included, consumed ones gone), the buffers a
block reads, declared knobs, the statements and storage scopes the target allows (no `bind` or
`shared` on a CPU), and split factors that divide the axis's extent. Each step is sampled under
that grammar, and the prefix with the new statement is checked again: a statement the checker
rejects is resampled (at most `StepLimits.tries` times, each rejection logged), never kept.

The answer may end after any statement once the whole schedule checks clean. On a GPU a schedule
is only finished when every block runs on threads; when the statements left are about as many as
the blocks still unbound, the grammar narrows to what binds them (`bind`, inlining, computing a
block inside a bound one), each choice checked before it is offered.

    steps = StepDecoder(op, target)
    answers = steps.decode(backend, [messages] * 4, ["```schedlang\\n"] * 4)

The grammars are llguidance Lark text built from the checker's own state, so the decoder and the
checker cannot drift; the checker stays the judge of every statement kept.
"""

from __future__ import annotations

import json
import logging
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from schedlang.checker.check import PrefixCheck, check, check_prefix
from schedlang.core.diagnostics import SchedlangError, render_all
from schedlang.core.ops import Op
from schedlang.core.target import Target
from schedlang.lang import statements
from schedlang.lang.nest import Loop, LoopKind
from schedlang.lang.statements import StepPattern, fastmath
from schedlang.lang.syntax import parse_with_diagnostics

log = logging.getLogger(__name__)

END = "```"
# Knobs a model may declare at the start of a template, and the value lists it may give them.
KNOB_NAMES = ("TI", "TJ", "TK")
KNOB_CHOICES = ((2, 4, 8), (4, 8, 16), (8, 16, 32), (16, 32, 64))
# Split factors offered first: the sizes schedules use most.
_PREFERRED = (8, 16, 32, 4, 64, 2, 128, 256)


@dataclass(frozen=True)
class StepLimits:
    statements: int = 8  # statements per answer (block headers and knobs not counted)
    tries: int = 4  # samples per statement before giving up on it
    step_tokens: int = 48  # tokens per step (a header and a statement)
    factors: int = 16  # split and tile factors offered per axis
    knobs: bool = True  # a template may declare knobs (`param`) first
    finishing_choices: int = 4  # GPU: binding steps checked and offered when finishing
    backtracks: int = 8  # statements taken back when they leave a GPU block no way to be bound


@dataclass
class StepState:
    """What a prefix left: the blocks and their loops, and whether the schedule may end here."""

    lines: tuple[str, ...]  # the prefix
    statements: int  # statements so far (not headers, not knobs)
    knobs: dict[str, tuple[int, ...]]
    current: str | None  # the block a statement without header schedules; None: say which
    indent: str  # what starts a statement of the current block ("  " in a `block NAME:` section)
    blocks: list[str]
    loops: dict[str, list[Loop]]
    reads: dict[str, list[str]]
    math: dict[str, tuple[str, ...]]  # the functions `fast_math` would rewrite, by block
    pending: list[str]  # GPU blocks not bound to threads yet
    can_end: bool


@dataclass
class Rejection:
    step: int  # statements accepted before it
    text: str
    why: str
    lines: tuple[str, ...] = ()  # the prefix it followed


@dataclass
class StepAnswer:
    """One answer being written: its lines so far and what happened on the way."""

    lines: list[str] = field(default_factory=list)
    state: StepState | None = None
    rejected: list[Rejection] = field(default_factory=list)
    tries_left: int = 0
    finishing: bool = False
    done: bool = False
    # "model" (it chose to end), "limit", "tries", "rewound" (to its last finished prefix),
    # "stuck" (no statement it may write next is accepted)
    ended: str = ""
    tokens: int = 0
    steps: int = 0
    earlier: list[StepState] = field(default_factory=list)  # the states before this one
    backtracks: int = 0

    @property
    def written(self) -> str:
        """Every line so far, as the model wrote them (what the next step follows)."""
        return "\n".join(self.lines) + ("\n" if self.lines else "")

    @property
    def text(self) -> str:
        """The answer, without the knobs it declared and never used (they would only repeat
        the same schedule under different knob values)."""
        body = [line for line in self.lines if not line.startswith("param ")]
        lines = [
            line
            for line in self.lines
            if not line.startswith("param ")
            or any(re.search(rf"\b{line.split()[1]}\b", other) for other in body)
        ]
        return "\n".join(lines) + ("\n" if lines else "")

    def to_json(self) -> dict:
        return {
            "steps": self.steps,
            "ended": self.ended,
            "tokens": self.tokens,
            "backtracks": self.backtracks,
            "rejected": [{"step": r.step, "text": r.text, "why": r.why} for r in self.rejected],
        }


class StepDecoder:
    """Writes answers for one op on one target, a statement at a time (see the module)."""

    def __init__(
        self,
        op: Op,
        target: Target,
        limits: StepLimits = StepLimits(),
        *,
        templates: bool = True,
    ):
        self.op = op
        self.target = target
        self.limits = limits
        self.templates = templates and limits.knobs
        self._states: dict[tuple[str, ...], StepState | str] = {}

    # --- the state after a prefix ----------------------------------------------------------------

    def state(self, lines: Sequence[str]) -> StepState | str:
        """The state after `lines`, or why the checker rejects them (rendered diagnostics)."""
        key = tuple(lines)
        if key not in self._states:
            self._states[key] = self._state(key)
        return self._states[key]

    def _state(self, lines: tuple[str, ...]) -> StepState | str:
        text = "\n".join(lines) + "\n"
        schedule, diagnostics = parse_with_diagnostics(text, "<answer>")
        if schedule is None or any(d.is_error for d in diagnostics):
            return render_all(diagnostics, text) or "does not parse"
        try:
            found = check_prefix(schedule, self.op.func, self.target)
        except SchedlangError as err:
            return err.render()
        if not found.statements_ok:
            return render_all(found.diagnostics, text)
        if found.blocking:
            return render_all(found.blocking, text)
        if self.target.is_gpu and found.unbound:
            # Unbound blocks aside, does the kernel lower? (A cross-thread reduction over some
            # of a block's reduction loops does not: no later `bind` fixes that.)
            problem = _lowering_problem(found, self.target)
            if problem:
                return f"error: TVM cannot lower the schedule for the GPU: {problem}"
        statements = [s for s in schedule.statements if s.keyword not in ("block", "param")]
        can_end = bool(statements) and not found.unbound
        if can_end:  # lowering and, on a GPU, TVM's verifier: the whole check
            result = check(schedule, self.op.func, self.target, template_ok=True)
            if not result.ok:
                return render_all(result.diagnostics, text)
        nest = found.nest
        blocks = nest.block_names()
        return StepState(
            lines=lines,
            statements=len(statements),
            knobs={p.name.text: tuple(p.choices) for p in schedule.params},
            current=found.block or _default_block(found),
            indent="  " if any(s.keyword == "block" for s in schedule.statements) else "",
            blocks=blocks,
            loops={b: nest.loops(b) for b in blocks},
            reads={b: list(dict.fromkeys(nest.reads(b))) for b in blocks},
            math={b: fastmath.rewritable(nest, b) for b in blocks},
            pending=list(found.unbound),
            can_end=can_end,
        )

    # --- what may come next ----------------------------------------------------------------------

    def candidates(self, state: StepState, finishing: bool = False) -> list[str | StepPattern]:
        """Every step offered after `state` (a text, or a pattern of texts): a statement, with
        its block's header first when it schedules another block than the current one, indented
        as the printer indents it under a header."""
        if finishing:
            return self._finishing(state)
        steps: list[str | StepPattern] = []
        if self.templates and state.statements == 0 and len(state.knobs) < len(KNOB_NAMES):
            name = KNOB_NAMES[len(state.knobs)]
            steps += [f"param {name} in {list(values)}" for values in KNOB_CHOICES]
        for block in state.blocks:
            header = _header(state, block)
            steps += [
                s.under(header) if isinstance(s, StepPattern) else header + s
                for s in self.block_statements(state, block)
            ]
        return list(dict.fromkeys(steps))

    def block_statements(self, state: StepState, block: str) -> list[str | StepPattern]:
        """The statements offered for `block`, as the registry's statements write their steps
        (schedlang.lang.statements, `Statement.steps`)."""
        view = _View(self, state)
        out: list[str | StepPattern] = []
        for group in statements.step_groups():
            for item in view.items(group.over, block):
                for decoding in group.statements:
                    out += decoding.write(view, block, item)
        return out

    def _factors(self, loop: Loop, state: StepState, count: int, knobs: bool = True) -> list[str]:
        extent = loop.extent or 0
        divisors = [d for d in range(2, extent // 2 + 1) if extent % d == 0] if extent else []
        preferred = [d for d in _PREFERRED if d in divisors]
        others = [d for d in divisors if d not in preferred]
        chosen = sorted((preferred + others)[:count])
        factors = [str(d) for d in chosen]
        if knobs:
            factors += [
                name
                for name, values in state.knobs.items()
                if values and all(v in divisors for v in values)
            ]
        return factors

    def _thread_fits(self, thread: str, extent: int) -> bool:
        target = self.target
        if extent <= 1:
            return False
        if thread.startswith("vthread"):
            return extent <= 8
        axis = "xyz".index(thread[-1])
        if thread.startswith("blockIdx"):
            return extent <= (target.max_grid_extent or (2**31 - 1,) * 3)[axis]
        threads = target.max_thread_extent or (1024, 1024, 64)
        return extent <= min(threads[axis], target.max_threads_per_block or 1024)

    def _finishing(self, state: StepState) -> list[str | StepPattern]:
        """GPU: only steps that bind a block still unbound, each checked before it is offered."""
        steps = []
        for block in state.pending[:1]:  # one block at a time
            header = _header(state, block)
            loops = state.loops.get(block, [])
            free = [loop for loop in loops if loop.thread is None and loop.annotation is None]
            for loop in free:
                if loop.kind is LoopKind.SPATIAL:
                    steps += [
                        f"{header}bind {loop.name} {thread}"
                        for thread in ("blockIdx.x", "threadIdx.x")
                        if self._thread_fits(thread, loop.extent or 0)
                    ]
            steps.append(f"{state.indent}compute_inline {block}")
            steps.append(f"{state.indent}reverse_compute_inline {block}")
            for other in state.blocks:
                if other in state.pending:
                    continue
                other_header = _header(state, other)
                for loop in state.loops.get(other, []):
                    if loop.thread:
                        steps.append(f"{other_header}compute_at {block} {loop.name}")
                        steps.append(f"{other_header}reverse_compute_at {block} {loop.name}")
        kept: list[str | StepPattern] = []
        for step in dict.fromkeys(steps):  # binds first: they are the likeliest to pass
            if len(kept) >= self.limits.finishing_choices:
                break
            if self._progresses(state, step):
                kept.append(step)
        return kept

    def _progresses(self, state: StepState, step: str) -> bool:
        after = self.state([*state.lines, *step.split("\n")])
        return isinstance(after, StepState) and len(after.pending) < len(state.pending)

    # --- grammars --------------------------------------------------------------------------------

    @staticmethod
    def grammar(steps: Sequence[str | StepPattern], can_end: bool) -> str:
        """llguidance Lark text: one of `steps` and a newline, or (`can_end`) the closing fence;
        a pattern is a terminal of its own (`STEP0`, …) after the start rule."""
        options: list[str] = []
        terminals: list[str] = []
        for step in steps:
            if isinstance(step, StepPattern):
                name = f"STEP{len(terminals)}"
                terminals.append(step.lark(name) + "\n")
                options.append(f'{name} "\\n"')
            else:
                options.append(json.dumps(step + "\n"))
        if can_end:
            options.append(json.dumps(END))
        if not options:
            raise ValueError("no step to offer")
        return "%llguidance {}\nstart: " + "\n     | ".join(options) + "\n" + "".join(terminals)

    def offers(self, state: StepState, text: str) -> bool:
        """Whether the grammar after `state` admits `text` (a step, without its newline)."""
        return any(
            step.matches(text) if isinstance(step, StepPattern) else step == text
            for step in self.candidates(state)
        )

    # --- decoding --------------------------------------------------------------------------------

    def decode(
        self,
        backend,
        messages: Sequence[Sequence[dict[str, str]]],
        prefixes: Sequence[str],
        *,
        seed: int | None = None,
    ) -> list[StepAnswer]:
        """One answer per row: its chat and what its reply has written so far (reasoning and
        the opening fence); decoded together, a step of every unfinished answer per batched
        call of the backend's `continue_batch`."""
        from schedlang.llm.backend import Continuation

        self._states.clear()  # each state holds a live schedule: keep only this round's
        answers = [StepAnswer(tries_left=self.limits.tries) for _ in prefixes]
        rng = random.Random(seed)
        for answer in answers:
            answer.state = self._initial()
        step = 0
        while True:
            rows, live = [], []
            for answer, chat, prefix in zip(answers, messages, prefixes, strict=True):
                if answer.done:
                    continue
                steps = self._offer(answer)
                if steps is None:
                    continue
                live.append(answer)
                assert answer.state is not None  # _offer returns steps only for a live state
                lark = self.grammar(steps, answer.state.can_end and not answer.finishing)
                rows.append(
                    Continuation(
                        tuple(chat),
                        prefix + answer.written,
                        lark,
                        self.limits.step_tokens,
                    )
                )
            if not rows:
                break
            step += 1
            samples = backend.continue_batch(
                rows, seed=None if seed is None else rng.randrange(2**31)
            )
            for answer, sample in zip(live, samples, strict=True):
                answer.steps += 1
                answer.tokens += sample.tokens
                self._take(answer, sample.text, step)
        return answers

    def _initial(self) -> StepState:
        state = self.state([])
        if isinstance(state, str):
            raise SchedlangError(f"the op {self.op.name} does not check unscheduled", state)
        return state

    def _offer(self, answer: StepAnswer) -> list[str | StepPattern] | None:
        """The steps offered next, or None when the answer is finished."""
        state = answer.state
        assert state is not None
        left = self.limits.statements - state.statements
        if left <= 0:
            if state.can_end:
                return self._stop(answer, "limit")
            self._rewind(answer)
            return None
        if state.pending and left <= len(state.pending) + 1:
            answer.finishing = True
        if answer.tries_left <= 0:
            if state.can_end:
                return self._stop(answer, "tries")
            if state.pending and not answer.finishing:
                answer.finishing, answer.tries_left = True, self.limits.tries
            else:
                return self._back(answer)
        rejected = {r.text for r in answer.rejected if r.lines == state.lines}
        steps = [s for s in self.candidates(state, answer.finishing) if s not in rejected]
        # (a pattern stays offered after a text of it is rejected: `tries` bounds the retries)
        if not steps:
            if state.can_end:
                return self._stop(answer, "tries")
            return self._back(answer)
        return steps

    def _back(self, answer: StepAnswer) -> list[str | StepPattern] | None:
        """Take the last statement back (a GPU block can no longer be bound after it); when
        that is no longer allowed, end at the last prefix that was a finished schedule."""
        if not answer.earlier or answer.backtracks >= self.limits.backtracks:
            self._rewind(answer)
            return None
        state = answer.state
        assert state is not None
        previous = answer.earlier.pop()
        taken = "\n".join(state.lines[len(previous.lines) :])
        why = f"left no way to bind {', '.join(state.pending)} to GPU threads"
        answer.rejected.append(Rejection(previous.statements, taken, why, previous.lines))
        answer.lines, answer.state = list(previous.lines), previous
        answer.backtracks += 1
        answer.tries_left, answer.finishing = self.limits.tries, False
        return self._offer(answer)

    def _rewind(self, answer: StepAnswer) -> None:
        """End the answer at its last state that checks clean as a whole, if there is one."""
        finished = [state for state in answer.earlier if state.can_end]
        if answer.state is not None and answer.state.can_end:
            return self._stop(answer, "stuck")
        if not finished:
            return self._stop(answer, "stuck")
        state = finished[-1]
        answer.lines, answer.state = list(state.lines), state
        return self._stop(answer, "rewound")

    @staticmethod
    def _stop(answer: StepAnswer, why: str) -> None:
        answer.done, answer.ended = True, why
        return None

    def _take(self, answer: StepAnswer, text: str, step: int) -> None:
        state = answer.state
        assert state is not None
        written = text.rstrip("\n")
        if written.strip() == END or not written.strip():
            if state.can_end and written.strip() == END:
                self._stop(answer, "model")
            else:
                answer.tries_left -= 1
                answer.rejected.append(
                    Rejection(state.statements, written, "no statement", state.lines)
                )
            return
        lines = [*answer.lines, *written.split("\n")]
        after = self.state(lines)
        if isinstance(after, str):
            answer.tries_left -= 1
            answer.rejected.append(
                Rejection(state.statements, written, _first_line(after), state.lines)
            )
            log.info("step %d: rejected %r: %s", step, written, _first_line(after))
            return
        left = self.limits.statements - after.statements
        if len(after.pending) > left:  # each unbound block takes a statement to bind
            answer.tries_left -= 1
            why = f"leaves {len(after.pending)} blocks unbound with {left} statements left"
            answer.rejected.append(Rejection(state.statements, written, why, state.lines))
            return
        answer.earlier.append(state)
        answer.lines, answer.state = lines, after
        answer.tries_left = self.limits.tries
        if not after.pending:
            answer.finishing = False


class _View:
    """A state as the registry's statements write their steps from it (`statements.StepView`)."""

    def __init__(self, decoder: StepDecoder, state: StepState):
        self.decoder = decoder
        self.state = state
        self.gpu = decoder.target.is_gpu
        self.blocks = state.blocks
        self.pending = state.pending
        self.limits = decoder.limits

    def loops(self, block: str) -> list[Loop]:
        return self.state.loops.get(block, [])

    def free(self, block: str) -> list[Loop]:
        return [
            loop for loop in self.loops(block) if loop.thread is None and loop.annotation is None
        ]

    def reads(self, block: str) -> list[str]:
        return self.state.reads.get(block, [])

    def factors(self, loop: Loop, count: int, knobs: bool = True) -> list[str]:
        return self.decoder._factors(loop, self.state, count, knobs)

    def thread_fits(self, thread: str, extent: int) -> bool:
        return self.decoder._thread_fits(thread, extent)

    def math(self, block: str) -> tuple[str, ...]:
        return self.state.math.get(block, ())

    def items(self, over: statements.StepsOver, block: str) -> list:
        """What a group of statements ranges over in `block` (see `statements.Steps`)."""
        if over == "free loop":
            return self.free(block)
        if over == "other block":
            return [other for other in self.blocks if other != block]
        return [None]


def _header(state: StepState, block: str) -> str:
    """What starts a statement of `block` after `state`: its header, unless it is current."""
    return state.indent if block == state.current else f"block {block}:\n  "


def _default_block(found: PrefixCheck) -> str | None:
    """As the checker picks a block for statements before any header: the only block, else the
    only reduction block."""
    blocks = found.nest.block_names()
    if len(blocks) == 1:
        return blocks[0]
    reductions = found.nest.reduction_blocks()
    return reductions[0] if len(reductions) == 1 else None


def _lowering_problem(found: PrefixCheck, target: Target) -> str:
    from schedlang.checker.check import lower_for_verification
    from schedlang.checker.pipeline import tvm_reason

    try:
        lower_for_verification(found.nest.sch.mod["main"], target)
    except (RuntimeError, ValueError) as err:  # the passes' own refusals
        return tvm_reason(err)
    return ""


def _first_line(text: str) -> str:
    for line in text.splitlines():
        if "error" in line:
            return line.split("error:", 1)[-1].strip()
    return text.strip().splitlines()[0] if text.strip() else ""
