"""What to measure next: the search over one template's knobs (`KnobSearch`: the template's
first point (each knob's first value) and a seeded random sample first; once points are
measured, the neighbours of the fastest (one knob moved to its next smaller or larger value),
with a quarter of each draw left to fresh random points), and a batch drawn from all the
templates' searches (`next_batch`), picked by the cost model when there is one.

No trial goes where it cannot earn (issue 48): with a `Screen` a point the checker refuses is
dropped before it is proposed, and the cost model's picks leave out the points it predicts far
slower than the best measured (`CostModel.far_worse`); both are logged ("not built, ...")."""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from schedlang.checker.check import check
from schedlang.checker.pipeline import bind_knobs
from schedlang.core.diagnostics import SchedlangError
from schedlang.lang import nodes
from schedlang.lang.printer import format_schedule
from schedlang.tuning.costmodel import CostModel

if TYPE_CHECKING:
    from schedlang.core.ops import Op
    from schedlang.core.target import Target


class KnobSearch:
    """Seeded search over one template's knob space; never proposes a point twice."""

    def __init__(self, template: nodes.Schedule, rng: random.Random, log: Callable[[str], None]):
        self.template = template
        self.space = {p.name.text: list(p.choices) for p in template.params}
        self.size = template.knob_space_size()
        self.rng = rng
        self.log = log
        self.seen: set[tuple[int, ...]] = set()
        self.scores: dict[tuple[int, ...], float] = {}  # GFLOP/s of measured points
        self.dropped = 0  # points never built: refused by the checker, or predicted far worse

    def key(self, point: dict[str, int]) -> tuple[int, ...]:
        return tuple(point[name] for name in self.space)

    def exhausted(self) -> bool:
        return len(self.seen) >= self.size

    def random_point(self) -> dict[str, int]:
        return {name: self.rng.choice(values) for name, values in self.space.items()}

    def neighbours(self, point: dict[str, int]) -> list[tuple[dict[str, int], str]]:
        """The points one knob away: that knob moved to the next smaller or next larger of its
        values (a template lists them best first, not in order), every other knob kept; each
        with what moved."""
        found = []
        for name, values in self.space.items():
            ordered = sorted(set(values))
            index = ordered.index(point[name])
            for step in (-1, 1):
                if 0 <= index + step < len(ordered):
                    value = ordered[index + step]
                    found.append(({**point, name: value}, f"{name} {point[name]} to {value}"))
        return found

    def mutate(self, point: dict[str, int]) -> dict[str, int]:
        """One of the point's neighbours, at random (the point itself if it has none)."""
        near = self.neighbours(point)
        return self.rng.choice(near)[0] if near else dict(point)

    def next_points(self, count: int) -> list[dict[str, int]]:
        drawn = self.draw(count)
        self.take(drawn)
        return [point for point, _ in drawn]

    def draw(
        self, count: int, exclude: set[tuple[int, ...]] | None = None
    ) -> list[tuple[dict[str, int], str]]:
        """Up to `count` new points (none of `exclude`), each with how it was drawn; not yet
        taken (see `take`). Before anything is measured: the template's first point, then
        random ones. After: the neighbours of the fastest points (the fastest first, each's in
        a seeded order), a quarter of the slots left to random points so that the search
        still looks away from where it has been."""
        points: list[tuple[dict[str, int], str]] = []
        drawn: set[tuple[int, ...]] = set(exclude or ())

        def add(point: dict[str, int], how: str) -> bool:
            key = self.key(point)
            if key in self.seen or key in drawn:
                return False
            drawn.add(key)
            points.append((point, how))
            return True

        # A template's knob values are listed best first (the built-in recipes' measured
        # defaults): before anything of it is measured, its first point comes first.
        if count > 0 and not self.seen and self.size > 0:
            add({name: values[0] for name, values in self.space.items()}, self.FIRST)
        ranked = sorted(self.scores, key=lambda point: self.scores[point], reverse=True)[:4]
        wanted = count - (count // 4 if ranked else count)  # the neighbours' slots
        for parent_key in ranked:
            parent = dict(zip(self.space, parent_key, strict=True))
            moves = self.neighbours(parent)
            self.rng.shuffle(moves)
            for point, moved in moves:
                if len(points) >= wanted:
                    break
                add(point, f"neighbour of {parent_key}: {moved}")
        attempts = 0
        while len(points) < count and len(self.seen) + len(drawn) < self.size:
            attempts += 1
            if attempts > 50 * count:
                break
            add(self.random_point(), "random")
        return points

    FIRST = "the template's first point"

    def take(self, points: Sequence[tuple[dict[str, int], str]]) -> None:
        """Mark drawn points as proposed, and log each with how it was chosen."""
        for point, how in points:
            self.seen.add(self.key(point))
            self.log(f"{how} -> {json.dumps(point, sort_keys=True)}")

    def drop(self, point: dict[str, int], why: str) -> None:
        """A drawn point never to be built (the checker refuses it, or the cost model predicts
        it far slower than the best): not proposed again, and no trial spent on it."""
        self.seen.add(self.key(point))
        self.dropped += 1
        self.log(f"not built, {why} -> {json.dumps(point, sort_keys=True)}")

    def record(self, point: dict[str, int], gflops: float | None) -> None:
        key = self.key(point)
        self.seen.add(key)
        if gflops:
            self.scores[key] = gflops


@dataclass(frozen=True)
class Candidate:
    schedule: nodes.Schedule  # concrete
    knobs: dict[str, int]
    template: str | None
    proposer: str
    extra: dict = field(default_factory=dict)

    @property
    def text(self) -> str:
        return format_schedule(self.schedule)


def search_of(searches, candidate: Candidate) -> KnobSearch | None:
    """The search of the candidate's template; None when it has none among `searches` (a point
    proposed without its template)."""
    if not candidate.template:
        return None
    return next((s for s, _ in searches if format_schedule(s.template) == candidate.template), None)


class Screen:
    """The checker, asked before a point is proposed: a point it refuses (the unroll budget, an
    allocation past int32, a split that leaves a guard LLVM unrolls for minutes: every rule of
    schedlang.checker.kernel_rules is decided on the lowered TIR, before any build) is dropped
    from the search with its reason, and no trial is spent on it. The check is the one the
    measurer makes before building anyway: the function it lowers is kept (`take_lowered`, the
    measurer's `prelowered`), so an accepted point is not checked twice. In the 1,000-trial
    ResNet-18 run of issue 48, 124 trials went to points the unroll budget refused."""

    def __init__(self, op: Op, target: Target, keep: int = 256):
        self.op, self.target, self.keep = op, target, keep
        self.lowered: dict[str, Any] = {}  # text -> the lowered function, until measured
        self.refused = 0
        self.reasons: dict[str, int] = {}  # each refusal's first line, and how many had it
        self.checked = 0
        self.seconds = 0.0

    def refusal(self, schedule: nodes.Schedule, text: str) -> str | None:
        """None when the checker accepts the schedule; else its first error, one line."""
        started = time.perf_counter()
        self.checked += 1
        try:
            result = check(schedule, self.op.func, self.target, template_ok=False)
        except SchedlangError as err:
            result, why = None, err.message
        finally:
            self.seconds += time.perf_counter() - started
        if result is not None and result.lowered is not None:
            if len(self.lowered) < self.keep:
                self.lowered[text] = result.lowered.func
            return None
        if result is not None:
            why = next((d.message for d in result.diagnostics if d.is_error), "refused")
        self.refused += 1
        why = why.splitlines()[0] if why else "refused"
        self.reasons[why] = self.reasons.get(why, 0) + 1
        return why

    def peek_lowered(self, text: str) -> Any:
        return self.lowered.get(text)

    def take_lowered(self, text: str) -> Any:
        """The lowered function of `text` if the screen checked it (once: it is dropped)."""
        return self.lowered.pop(text, None)

    def forget(self, texts: Sequence[str]) -> None:
        for text in texts:
            self.lowered.pop(text, None)


def prelowered(screen: Screen | None, model: CostModel | None) -> Callable[[str], Any] | None:
    """What the measurer's `prelowered` is given: a candidate's function lowered already, by the
    screen or by the cost model's features (each handed over once); None with neither. With
    both, the model's features reuse the screen's functions (`Featurizer.known`)."""
    if model is not None and screen is not None:
        model.featurizer.known = screen.peek_lowered
    if screen is None:
        return model.featurizer.take_lowered if model is not None else None
    if model is None:
        return screen.take_lowered

    def either(text: str) -> Any:
        func = screen.take_lowered(text)
        model.featurizer.lowered.pop(text, None)
        return func if func is not None else model.featurizer.take_lowered(text)

    return either


def screened(
    search: KnobSearch, count: int, screen: Screen | None
) -> list[tuple[dict[str, int], str, nodes.Schedule]]:
    """Up to `count` drawn points of `search` (not yet taken) the checker accepts, each with how
    it was drawn and its schedule; the refused ones are dropped from the search and drawn for
    again, a few times."""
    kept: list[tuple[dict[str, int], str, nodes.Schedule]] = []
    for _ in range(4 if screen is not None else 1):
        if len(kept) >= count or search.exhausted():
            break
        exclude = {search.key(point) for point, _, _ in kept}
        for point, how in search.draw(count - len(kept), exclude):
            schedule = bind_knobs(search.template, point)
            if screen is not None:
                why = screen.refusal(schedule, format_schedule(schedule))
                if why is not None:
                    search.drop(point, f"the checker refuses it: {why}")
                    continue
            kept.append((point, how, schedule))
    return kept


def next_batch(
    searches,
    pending: list[Candidate],
    count: int,
    rng: random.Random,
    log,
    model: CostModel | None = None,
    pool: int = 4,
    screen: Screen | None = None,
) -> list[Candidate]:
    """Concrete proposals first; then knob points, most of them from the best template so far;
    chosen by the cost model from a larger pool once it has enough records (those it predicts
    far slower than the best are dropped, never built); with a `screen`, only points the
    checker accepts."""
    batch = pending[:count]
    del pending[:count]
    live = [(s, p) for s, p in searches if not s.exhausted()]
    if len(batch) >= count or not live:
        return batch
    live.sort(key=lambda sp: max(sp[0].scores.values(), default=0.0), reverse=True)
    share = {id(s): 0 for s, _ in live}
    for slot in range(count - len(batch)):
        lucky = live[0] if (slot % 2 == 0 or len(live) == 1) else rng.choice(live[1:])
        share[id(lucky[0])] += 1
    if model is not None and not model.ready():
        log(f"cost model: {model.status()}; the search picks alone")
    ranking = model is not None and model.ready()
    for search, proposal in live:
        template_text = format_schedule(search.template)
        wanted = share[id(search)]
        if wanted == 0:
            continue
        drawn = screened(search, wanted * (max(pool, 1) if ranking else 1), screen)
        chosen = drawn[:wanted]
        if ranking:
            assert model is not None
            picks = model.pick([(s, format_schedule(s)) for _, _, s in drawn], wanted, search.rng)
            if picks is not None:
                chosen = [(drawn[p.index][0], f"{drawn[p.index][1]}; {_pick_note(p)}",
                           drawn[p.index][2]) for p in picks]  # fmt: skip
                for index, predicted in model.pruned:
                    search.drop(drawn[index][0], f"{_far_note(predicted, model)}")
        if screen is not None:
            taken = {format_schedule(s) for _, _, s in chosen}
            screen.forget([t for _, _, s in drawn if (t := format_schedule(s)) not in taken])
        search.take([(point, how) for point, how, _ in chosen])
        for point, _, schedule in chosen:
            batch.append(
                Candidate(schedule, point, template_text, proposal.proposer, proposal.extra)
            )
    return batch


def _far_note(predicted: float, model: CostModel) -> str:
    return (
        f"the cost model predicts {predicted:.2f} GFLOP/s, under 1/{model.far_worse:g} of the "
        f"best measured ({model.best_gflops():.2f})"
    )


def _pick_note(pick) -> str:
    if pick.predicted_gflops is None:
        return pick.how
    return f"{pick.how}, predicted {pick.predicted_gflops:.2f} GFLOP/s"
