"""A fuzz case: a schedule's text, the op it schedules and the target; made from a chooser's
decisions (hypothesis draws, or a harness's bytes).
"""

from __future__ import annotations

from dataclasses import dataclass

from fuzz.mutate import Example, examples, mutate
from fuzz.nests import ByteChooser, Chooser, NestSpec, random_nest
from fuzz.schedules import random_schedule


@dataclass(frozen=True)
class Case:
    """One input to the front end: a schedule's text, the op it schedules, and the target."""

    text: str
    gpu: bool
    nest: NestSpec | None = None
    example: Example | None = None

    def describe(self) -> str:
        """Enough to rebuild the case by hand."""
        op = repr(self.nest) if self.nest else f"the op of example {self.example.name}"
        return f"target {'cuda' if self.gpu else 'llvm'}, {op}, schedule:\n{self.text}"


def generated_case(chooser: Chooser, gpu: bool | None = None) -> Case:
    """A random loop nest and a random schedule for it, for `gpu` (or one in four for a GPU)."""
    spec = random_nest(chooser)
    if gpu is None:
        gpu = chooser.integer(0, 3) == 0
    return Case(random_schedule(chooser, spec, gpu), gpu, nest=spec)


def mutated_case(chooser: Chooser) -> Case:
    example = chooser.choice(examples())
    return Case(mutate(chooser, example.text), example.gpu, example=example)


def text_case(chooser: Chooser) -> Case:
    """An example's op and target, and whatever text the bytes left over decode to."""
    example = chooser.choice(examples())
    rest = chooser.rest() if isinstance(chooser, ByteChooser) else b""
    return Case(rest.decode("utf-8", "replace"), example.gpu, example=example)


def case_from_bytes(data: bytes) -> Case:
    """The first decision picks the kind of case: 0 generated, 1 mutated, 2 text (a seed is then
    `bytes([2, example index]) + schedule text`)."""
    chooser = ByteChooser(data)
    kind = chooser.integer(0, 2)
    return (generated_case, mutated_case, text_case)[kind](chooser)
