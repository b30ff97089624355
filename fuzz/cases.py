"""A fuzz case: a schedule's text, the op it schedules and the target; made from a chooser's
decisions (hypothesis draws, or a harness's bytes).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cache, lru_cache

from fuzz.live import live_schedule
from fuzz.mutate import ROOT, Example, examples, mutate
from fuzz.nests import ByteChooser, Chooser, NestSpec, build_nest, random_nest
from fuzz.schedules import random_schedule
from fuzz.sizes import define_flags, odd_sized_example


@dataclass(frozen=True)
class Case:
    """One input to the front end: a schedule's text, the op it schedules, and the target."""

    text: str
    gpu: bool
    nest: NestSpec | None = None
    example: Example | None = None

    def describe(self) -> str:
        """Enough to rebuild the case by hand."""
        return f"target {'cuda' if self.gpu else 'llvm'}, {self.op_text()}, schedule:\n{self.text}"

    def op_text(self) -> str:
        if self.nest is not None:
            return repr(self.nest)
        assert self.example is not None
        if self.example.op_file is None:
            return f"the op of example {self.example.name}"
        return f"examples/{self.example.op_file} {define_flags(self.example)}".rstrip()


def case_op(case: Case):
    """The schedlang Op (a PrimFunc and its reference) a case schedules."""
    if case.nest is not None:
        return _nest_op(case.nest)
    assert case.example is not None
    return _example_op(case.example.op_file, case.example.defines)


@lru_cache(maxsize=256)
def _nest_op(spec):
    from schedlang.core.ops import from_primfunc

    nest = build_nest(spec)
    return from_primfunc(nest.func, "fuzz", nest.reference)


@lru_cache(maxsize=256)
def _example_op(op_file: str | None, defines: tuple[tuple[str, str], ...]):
    if op_file is not None:
        from schedlang.core.ops import load_op

        return load_op(str(ROOT / "examples" / op_file), dict(defines))
    return _elementwise()


@cache
def _elementwise():
    """The prompts' `elementwise`: C[i, j] = max(A[i, j] + B[i, j], 0)."""
    import numpy as np
    from tvm import te

    from schedlang.core.ops import from_primfunc

    a = te.placeholder((256, 256), name="A")
    b = te.placeholder((256, 256), name="B")
    c = te.compute((256, 256), lambda i, j: te.max(a[i, j] + b[i, j], 0.0), name="C")
    return from_primfunc(te.create_prim_func([a, b, c]), "elementwise",
                         lambda x, y: np.maximum(x + y, 0))  # fmt: skip


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


def live_case(chooser: Chooser, op_file: str | None = None) -> Case:
    """An llvm case for differential runs: an example op at odd sizes (`op_file`, or half the
    time one drawn) or a random loop nest, and a schedule written over its live loop nest."""
    if op_file is not None or chooser.boolean():
        case = Case("", False, example=odd_sized_example(chooser, op_file))
    else:
        case = Case("", False, nest=random_nest(chooser))
    return replace(case, text=live_schedule(chooser, case_op(case).func))


def case_from_bytes(data: bytes) -> Case:
    """The first decision picks the kind of case: 0 generated, 1 mutated, 2 text (a seed is then
    `bytes([2, example index]) + schedule text`), 3 live."""
    chooser = ByteChooser(data)
    kind = chooser.integer(0, 3)
    return (generated_case, mutated_case, text_case, live_case)[kind](chooser)
