"""What to measure next: the search over one template's knobs (`KnobSearch`: the template's
first point (each knob's first value) and a seeded random sample first, then an evolutionary
step, the fastest points so far mutated one knob at a time, mixed with fresh random points), and
a batch drawn from all the templates' searches (`next_batch`), picked by the cost model when
there is one."""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from schedlang.checker.pipeline import bind_knobs
from schedlang.lang import nodes
from schedlang.lang.printer import format_schedule
from schedlang.tuning.costmodel import CostModel


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

    def key(self, point: dict[str, int]) -> tuple[int, ...]:
        return tuple(point[name] for name in self.space)

    def exhausted(self) -> bool:
        return len(self.seen) >= self.size

    def random_point(self) -> dict[str, int]:
        return {name: self.rng.choice(values) for name, values in self.space.items()}

    def mutate(self, point: dict[str, int]) -> dict[str, int]:
        """One knob moved to a neighbouring value (or, sometimes, any value)."""
        name = self.rng.choice(list(self.space))
        values = self.space[name]
        index = values.index(point[name])
        if self.rng.random() < 0.8 and len(values) > 1:
            index = min(len(values) - 1, max(0, index + self.rng.choice((-1, 1))))
        else:
            index = self.rng.randrange(len(values))
        return {**point, name: values[index]}

    def next_points(self, count: int) -> list[dict[str, int]]:
        drawn = self.draw(count)
        self.take(drawn)
        return [point for point, _ in drawn]

    def draw(self, count: int) -> list[tuple[dict[str, int], str]]:
        """Up to `count` new points, each with how it was drawn; not yet taken (see `take`)."""
        points: list[tuple[dict[str, int], str]] = []
        drawn: set[tuple[int, ...]] = set()
        # A template's knob values are listed best first (the built-in recipes' measured
        # defaults): before anything of it is measured, its first point comes first.
        first = {name: values[0] for name, values in self.space.items()}
        if count > 0 and not self.seen and self.size > 0:
            points.append((first, "the template's first point"))
            drawn.add(self.key(first))
        ranked = sorted(self.scores, key=lambda point: self.scores[point], reverse=True)[:4]
        attempts = 0
        while (
            len(points) < count
            and len(self.seen) + len(drawn) < self.size
            and attempts < 50 * count
        ):
            attempts += 1
            if ranked and self.rng.random() < 0.6:
                parent = dict(zip(self.space, self.rng.choice(ranked), strict=True))
                point, how = self.mutate(parent), f"mutate {self.key(parent)}"
            else:
                point, how = self.random_point(), "random"
            key = self.key(point)
            if key in self.seen or key in drawn:
                continue
            drawn.add(key)
            points.append((point, how))
        return points

    def take(self, points: Sequence[tuple[dict[str, int], str]]) -> None:
        """Mark drawn points as proposed, and log each with how it was chosen."""
        for point, how in points:
            self.seen.add(self.key(point))
            self.log(f"{how} -> {json.dumps(point, sort_keys=True)}")

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


def next_batch(
    searches,
    pending: list[Candidate],
    count: int,
    rng: random.Random,
    log,
    model: CostModel | None = None,
    pool: int = 4,
) -> list[Candidate]:
    """Concrete proposals first; then knob points, most of them from the best template so far;
    chosen by the cost model from a larger pool once it has enough records."""
    batch = pending[:count]
    del pending[:count]
    live = [(s, p) for s, p in searches if not s.exhausted()]
    if len(batch) >= count or not live:
        return batch
    live.sort(key=lambda sp: max(sp[0].scores.values(), default=0.0), reverse=True)
    share = {id(s): 0 for s, _ in live}
    for slot in range(count - len(batch)):
        chosen = live[0] if (slot % 2 == 0 or len(live) == 1) else rng.choice(live[1:])
        share[id(chosen[0])] += 1
    if model is not None and not model.ready():
        log(f"cost model: {model.status()}; the search picks alone")
    for search, proposal in live:
        template_text = format_schedule(search.template)
        wanted = share[id(search)]
        if wanted == 0:
            continue
        if model is None or not model.ready():
            points = search.next_points(wanted)
            schedules = [bind_knobs(search.template, point) for point in points]
        else:
            drawn = search.draw(wanted * max(pool, 1))
            schedules = [bind_knobs(search.template, point) for point, _ in drawn]
            picks = model.pick([(s, format_schedule(s)) for s in schedules], wanted, search.rng)
            if picks is None:  # too few records with features: the search's own order
                taken = drawn[:wanted]
                schedules = schedules[:wanted]
            else:
                taken = [
                    (drawn[p.index][0], f"{drawn[p.index][1]}; {_pick_note(p)}") for p in picks
                ]
                schedules = [schedules[p.index] for p in picks]
            search.take(taken)
            points = [point for point, _ in taken]
        for point, schedule in zip(points, schedules, strict=True):
            batch.append(
                Candidate(schedule, point, template_text, proposal.proposer, proposal.extra)
            )
    return batch


def _pick_note(pick) -> str:
    if pick.predicted_gflops is None:
        return pick.how
    return f"{pick.how}, predicted {pick.predicted_gflops:.2f} GFLOP/s"
