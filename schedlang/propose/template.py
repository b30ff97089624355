"""Writing a template: the class every recipe is (`Rule`, and `MatchingRule` for one that finds
what it schedules), what it says about the templates it writes (`TemplateInfo`), the writer that
collects their knobs and sections (`Writer`), and the knob values that divide a loop (`pick`)."""

from __future__ import annotations

import contextlib
import contextvars
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Generic, TypeVar

if TYPE_CHECKING:
    from schedlang.core.target import Target
    from schedlang.propose.analysis import OpView


@dataclass(frozen=True)
class TemplateInfo:
    """One kind of template the built-in proposer writes (what `schedlang tune --list-templates`
    prints). `space` is the most knob points it has: at an op's own shape, knob values that do
    not divide a loop's extent are left out, so it may have fewer (and a widened one, more).
    With `per_block`, the knobs (and the space) repeat for each block the template schedules
    on its own."""

    name: str  # the family, as in a proposal's extra["family"]
    target: str  # "cpu" or "gpu"
    matches: str  # which op shapes
    knobs: str  # each knob: what it sets, and how many values it takes at most
    knob_names: tuple[str, ...]
    space: int
    per_block: bool = False


class Rule:
    """The recipe for one kind of op on one kind of target, as TVM's dlight writes one: `applies`
    says whether the op is of its kind, `write` writes its templates, best first (a None for a
    template that does not fit this op after all).

    The built-in proposer tries a target's rules by `rank`: the first that applies, other than a
    `fallback`, is the op's kind; after its templates come those of the fallback rules (the
    recipe for any op), unless the kind's rule writes `alone`."""

    target: str = "cpu"  # "cpu" or "gpu"
    rank: int = 50  # where it is tried among its target's rules, lowest first
    fallback: bool = False  # written for every op, after the templates of the op's kind
    alone: bool = False  # the op gets this rule's templates only, not the fallback's
    templates: tuple[TemplateInfo, ...] = ()  # the families it writes, in its order

    def applies(self, view: OpView, target: Target) -> bool:
        raise NotImplementedError

    def write(self, view: OpView, target: Target) -> list[Writer | None]:
        raise NotImplementedError


Found = TypeVar("Found")


class MatchingRule(Rule, Generic[Found]):
    """A rule that applies where `find` finds what it schedules in an op (its block and the roles
    of its loops, say); `write` takes that from `found`."""

    def find(self, view: OpView) -> Found | None:
        raise NotImplementedError

    def applies(self, view: OpView, target: Target) -> bool:
        return self.find(view) is not None

    def found(self, view: OpView) -> Found:
        """What `find` finds in an op the rule applies to (`write` is called only there)."""
        found = self.find(view)
        assert found is not None, "written only where it applies"
        return found


class FallbackRule(Rule):
    """A recipe for any op: it applies to every op, and its templates come after the kind's."""

    fallback = True

    def applies(self, view: OpView, target: Target) -> bool:
        return True


@dataclass(frozen=True)
class Draft:
    text: str
    note: str
    family: str
    space: int  # knob points
    serial: bool = False  # the template on one thread: its `parallel` statements left out


class Writer:
    """Collects knobs and sections, and prints a template the way `schedlang fmt` does."""

    def __init__(self, note: str, family: str):
        self.note = note
        self.family = family
        self.params: dict[str, list[int]] = {}
        self.sections: list[tuple[str, list[str]]] = []

    def factor(self, name: str, values: Sequence[int]) -> str:
        """A knob over `values`, or the literal when there is one value. Sections asking for the
        same knob over the same values share it."""
        values = list(dict.fromkeys(values))
        if len(values) == 1:
            return str(values[0])
        unique, n = name, 2
        while unique in self.params and self.params[unique] != values:
            unique, n = f"{name}{n}", n + 1
        self.params[unique] = values
        return unique

    def section(self, block: str) -> list[str]:
        lines: list[str] = []
        self.sections.append((block, lines))
        return lines

    def draft(self, serial: bool = False) -> Draft:
        """The template; `serial`: on one thread, its `parallel` statements left out (the loops
        they named stay, run in order)."""
        from schedlang.lang.printer import format_schedule
        from schedlang.lang.syntax import parse

        note = f"{self.note}, on one thread" if serial else self.note
        out = [f"# {note} (builtin proposer)"]
        out += [f"param {k} in [{', '.join(map(str, v))}]" for k, v in self.params.items()]
        for block, lines in self.sections:
            kept = [line for line in lines if not (serial and line.startswith("parallel "))]
            if kept:
                out += ["", f"block {block}:", *(f"  {line}" for line in kept)]
        text = format_schedule(parse("\n".join(out) + "\n", "<builtin>"))
        space = math.prod(len(v) for v in self.params.values())
        return Draft(text, note, self.family, space, serial)


# --- knob candidates ------------------------------------------------------------------------------

_WIDE: contextvars.ContextVar[bool] = contextvars.ContextVar("wide", default=False)


@contextlib.contextmanager
def widened(wide: bool = True) -> Iterator[None]:
    """While it lasts, `pick` offers more values per knob (for a run that measured every point)."""
    token = _WIDE.set(wide)
    try:
        yield
    finally:
        _WIDE.reset(token)


def divisors(n: int) -> list[int]:
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted({*small, *(n // d for d in small)})


def pick(
    extent: int,
    preferred: Sequence[int],
    *,
    multiple_of: int = 1,
    most: int = 4,
    widens: bool = True,
) -> list[int]:
    """Values of `preferred` that divide `extent` and are multiples of `multiple_of`, at most
    `most` of them, in the order given. When none is, the largest divisor of `extent` (a multiple
    of `multiple_of`) up to the largest preferred value, else `extent` itself: a template never
    needs a guard. In a widened template (`widened()`), up to two values more, unless `widens`
    is False (a register tile: more would spill)."""
    values = [v for v in preferred if v <= extent and extent % v == 0 and v % multiple_of == 0]
    if values and widens and _WIDE.get():
        # Widened: the preferred values left out, then other divisors up to twice the largest.
        others = [
            d
            for d in reversed(divisors(extent))
            if d % multiple_of == 0 and d <= 2 * max(preferred) and d not in values
        ]
        return [*values, *others][: most + 2]
    if values:
        return values[:most]
    fitting = [d for d in divisors(extent) if d % multiple_of == 0 and d <= max(preferred)]
    if fitting:
        return [fitting[-1]]
    return [extent]
