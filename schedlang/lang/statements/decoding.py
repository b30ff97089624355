"""What a statement's `Decoding` facet writes its steps from (schedlang.lang.statements.facets):
the live nest as stepwise decoding (schedlang.llm.stepwise) sees it, `StepView`, and a step too
many to list, `StepPattern`."""

from __future__ import annotations

import json
import random
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from schedlang.lang.loop import Loop


class StepView(Protocol):
    """What a statement's steps are written from (schedlang.llm.stepwise): the live nest after
    the prefix the model wrote, and the decoder's limits."""

    gpu: bool
    blocks: list[str]
    pending: list[str]  # GPU blocks not bound to threads yet
    limits: Any  # schedlang.llm.stepwise.StepLimits

    def loops(self, block: str) -> list[Loop]: ...

    def free(self, block: str) -> list[Loop]:
        """The block's loops not bound to a thread nor annotated."""

    def reads(self, block: str) -> list[str]: ...

    def factors(self, loop: Loop, count: int, knobs: bool = True) -> list[str]:
        """Split factors of the loop's extent worth offering (knobs whose values all divide it)."""

    def thread_fits(self, thread: str, extent: int) -> bool: ...

    def math(self, block: str) -> tuple[str, ...]:
        """The functions `fast_math` would rewrite in the block."""


@dataclass(frozen=True)
class Choice:
    """One of `options`, or (`most` > 1) `least` to `most` of them, distinct, joined by `sep`."""

    options: tuple[str, ...]
    least: int = 1
    most: int = 1
    sep: str = ", "


@dataclass(frozen=True)
class _Notation:
    """How a pattern is written: a text (`literal`), a choice (its literals between `open` and
    `close`, separated by `bar`), the repeats after a choice's first (`repeat`, a format of `one`,
    `sep`, `least` and `most`), and what joins the parts."""

    literal: Callable[[str], str]
    open: str
    bar: str
    close: str
    repeat: str
    joiner: str


_LARK = _Notation(json.dumps, "(", " | ", ")", "{one} ({sep} {one}){{{least},{most}}}", " ")
_READ = _Notation(str, "{", "|", "}", "{one}{sep}…", "")
_REGEX = _Notation(re.escape, "(?:", "|", ")", "{one}(?:{sep}{one}){{{least},{most}}}", "")


@dataclass(frozen=True)
class StepPattern:
    """A step offered as a small grammar where its texts are too many to list: its `parts` in
    order, each a text or a `Choice` (`reorder` of any order of eight loops has 40,320 texts; a
    `tile` of two axes, every pair of their factors). Whatever the model writes under it is
    checked, as every step is; a repeated choice's distinctness is left to that check."""

    parts: tuple[str | Choice, ...]

    def under(self, header: str) -> StepPattern:
        """The same step after a block header (or an indent)."""
        return StepPattern((header, *self.parts)) if header else self

    def lark(self, name: str) -> str:
        """An llguidance Lark terminal `name` (upper case) that matches exactly these texts."""
        return f"{name}: {self._written(_LARK)}"

    def __str__(self) -> str:
        """As a person reads it: `reorder {i|j|k}, …` (a choice in braces, a repeat with `, …`)."""
        return self._written(_READ)

    def matches(self, text: str) -> bool:
        return re.fullmatch(self._written(_REGEX), text) is not None

    def _written(self, notation: _Notation) -> str:
        """The parts in one notation."""
        out = []
        for part in self.parts:
            if isinstance(part, str):
                out.append(notation.literal(part))
                continue
            options = notation.bar.join(notation.literal(option) for option in part.options)
            one = notation.open + options + notation.close
            if part.most > 1:
                sep, least, most = notation.literal(part.sep), part.least - 1, part.most - 1
                one = notation.repeat.format(one=one, sep=sep, least=least, most=most)
            out.append(one)
        return notation.joiner.join(out)

    def sample(self, rng: random.Random) -> str:
        """A text of the pattern, each choice uniform (a repeat's items distinct)."""
        out = []
        for part in self.parts:
            if isinstance(part, str):
                out.append(part)
            else:
                count = rng.randint(part.least, min(part.most, len(part.options)))
                out.append(part.sep.join(rng.sample(part.options, count)))
        return "".join(out)
