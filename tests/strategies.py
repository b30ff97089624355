"""Hypothesis strategies shared by the test files: random schedule ASTs (test_printer), token soups
(test_syntax), and front-end fuzz cases (test_fuzz) drawn through fuzz/cases.py's generators.
"""

from __future__ import annotations

from hypothesis import strategies as st

from fuzz.cases import Case, generated_case, live_case, mutated_case
from fuzz.nests import Chooser
from schedlang.lang import nodes
from schedlang.lang.statements import annotation, blocks
from schedlang.lang.statements.buffers import CacheRead, CacheWrite, SetScope, StorageAlign
from schedlang.lang.statements.fastmath import FastMath
from schedlang.lang.statements.index_maps import IndexInt, IndexOp, IndexVar
from schedlang.lang.statements.layout import Prepack, TransformLayout
from schedlang.lang.statements.loop_kinds import Bind, Parallel, Unroll, Vectorize
from schedlang.lang.statements.loops import Fuse, Reorder, Split, Tile
from schedlang.lang.statements.moving import (
    ComputeAt,
    ComputeInline,
    ReverseComputeAt,
    ReverseComputeInline,
)
from schedlang.lang.statements.pragmas import Pragma, PragmaItem
from schedlang.lang.statements.reductions import DecomposeReduction, Rfactor
from schedlang.lang.statements.tensorize import Tensorize
from schedlang.lang.syntax import PARSER

# --- random valid schedules ----------------------------------------------------------------------

# Keywords are reserved only where the parser expects one, so they are fair names elsewhere.
_WORDS = ["i", "j", "k", "x", "at", "as", "by", "in", "block", "split", "shared", "blockIdx",
          "keep_unit_loops", "factor_axis"]  # fmt: skip
_name_text = st.sampled_from(_WORDS) | st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,7}", fullmatch=True)
names = _name_text.map(nodes.Name)
axes = st.builds(
    lambda base, parts: nodes.Name(".".join([base, *parts])),
    _name_text,
    st.lists(st.sampled_from(["o", "i", "0", "1", "12", "inner", "_"]), max_size=3),
)
ints = st.integers(min_value=0, max_value=2**20)
knobs = _name_text.map(nodes.KnobFactor)
factors = st.one_of(
    st.integers(-64, 4096).map(nodes.IntFactor), knobs, st.just(nodes.InferredFactor())
)
aliases = st.none() | names


def _positive_factors(count: int):
    return st.lists(st.one_of(st.integers(1, 4096).map(nodes.IntFactor), knobs), min_size=count,
                    max_size=count)  # fmt: skip


@st.composite
def choices(draw) -> nodes.Choices:
    kind = draw(st.sampled_from(["list", "pow2", "range"]))
    if kind == "list":
        return nodes.ListChoices(
            tuple(draw(st.lists(st.integers(1, 4096), min_size=1, max_size=6)))
        )
    if kind == "pow2":
        low = draw(st.integers(0, 12))
        return nodes.Pow2Choices(2**low, 2 ** draw(st.integers(low, 14)))
    low = draw(st.integers(1, 64))
    return nodes.RangeChoices(low, draw(st.integers(low, 256)), draw(st.integers(1, 8)))


@st.composite
def splits(draw) -> Split:
    parts = draw(st.lists(factors, min_size=1, max_size=4))
    first_star = next((n for n, f in enumerate(parts) if isinstance(f, nodes.InferredFactor)), None)
    # At most one `*`, and never `*` alone: the schedule must pass the parser's own checks.
    parts = [
        nodes.IntFactor(4) if isinstance(f, nodes.InferredFactor) and n != first_star else f
        for n, f in enumerate(parts)
    ]
    if parts == [nodes.InferredFactor()]:
        parts = [nodes.KnobFactor("T")]
    return Split(draw(axes), tuple(parts))


@st.composite
def tiles(draw) -> Tile:
    count = draw(st.integers(2, 4))
    return Tile(tuple(draw(st.lists(axes, min_size=count, max_size=count))),
                    tuple(draw(_positive_factors(count))))  # fmt: skip


@st.composite
def pragmas(draw) -> Pragma:
    keys = draw(st.lists(st.sampled_from(nodes.PRAGMA_KEYS), min_size=1, max_size=2, unique=True))
    values = st.one_of(st.integers(-64, 4096).map(nodes.IntFactor), knobs)  # no `*`
    items = tuple(PragmaItem(nodes.Name(key), draw(values)) for key in keys)
    return Pragma(draw(axes), items)


@st.composite
def _cache(draw, kind):
    target, scope = draw(names), nodes.Name(draw(st.sampled_from(nodes.SCOPES)))
    at = draw(st.none() | axes)
    keep_unit_loops = at is not None and draw(st.booleans())  # an option of `at`
    if kind is CacheRead:
        consumers = tuple(draw(st.lists(names, max_size=3)))
        return kind(target, scope, at, draw(aliases), keep_unit_loops, consumers)
    return kind(target, scope, at, draw(aliases), keep_unit_loops)


# `add_unit_loop block` and `annotate block …` name the block, not an axis called `block`.
_loop_axes = axes.filter(lambda name: name.text != "block")
_indices = st.none() | st.integers(0, 64).map(nodes.IntFactor)
_annotation_values = st.one_of(
    st.integers(-64, 4096).map(nodes.IntFactor),
    st.lists(st.integers(-8, 64).map(nodes.IntFactor), min_size=1, max_size=4).map(tuple),
)


_scopes = st.sampled_from(nodes.SCOPES).map(nodes.Name)
_map_indices = st.lists(
    _name_text.filter(lambda n: n not in ("pad_value",)), min_size=1, max_size=3, unique=True
).map(lambda n: tuple(map(nodes.Name, n)))
_map_outputs = st.lists(
    _name_text.map(IndexVar) | st.integers(0, 64).map(IndexInt), min_size=1, max_size=3
).map(tuple)


@st.composite
def annotates(draw) -> annotation.Annotate:
    keys = draw(st.lists(st.sampled_from(list(annotation.KEYS)), min_size=1, max_size=3,
                         unique=True))  # fmt: skip
    items = tuple(annotation.AnnotationItem(nodes.Name(k), draw(_annotation_values)) for k in keys)
    if draw(st.booleans()):
        return annotation.Annotate(draw(_loop_axes), None, items)
    return annotation.Annotate(None, draw(names), items)


# transform_layout: index expressions over the map's own indices (any names the lexer takes).
_index_names = st.from_regex(r"[a-z][a-z0-9_]{0,3}", fullmatch=True)


@st.composite
def transform_layouts(draw) -> TransformLayout:
    indices = draw(st.lists(_index_names, min_size=1, max_size=3, unique=True))
    leaves = st.sampled_from(indices).map(IndexVar) | st.integers(0, 64).map(IndexInt)
    exprs = st.recursive(
        leaves,
        lambda inner: st.builds(IndexOp, st.sampled_from(["+", "-", "*", "//", "%"]), inner, inner),
        max_leaves=6,
    )
    outputs = tuple(draw(st.lists(exprs, min_size=1, max_size=4)))
    pad = draw(st.none() | st.integers(0, 9).map(nodes.IntFactor))
    return TransformLayout(draw(names), tuple(nodes.Name(i) for i in indices), outputs, pad)


# `decompose_reduction at at i` cannot work: where a block name or `at` may come, `at` is `at`.
_decompose_blocks = st.none() | names.filter(lambda name: name.text != "at")

STATEMENT_STRATEGIES = {
    nodes.BlockHeader: st.builds(nodes.BlockHeader, names),
    nodes.Param: st.builds(nodes.Param, names, choices()),
    Split: splits(),
    Tile: tiles(),
    Reorder: st.lists(axes, min_size=2, max_size=4).map(lambda a: Reorder(tuple(a))),
    Fuse: st.builds(lambda a, alias: Fuse(tuple(a), alias),
                        st.lists(axes, min_size=2, max_size=3), aliases),
    Bind: st.builds(Bind, axes, st.sampled_from(nodes.THREAD_AXES).map(nodes.Name)),
    Vectorize: st.builds(Vectorize, axes),
    Unroll: st.builds(Unroll, axes),
    Parallel: st.builds(Parallel, axes),
    CacheRead: _cache(CacheRead),
    CacheWrite: _cache(CacheWrite),
    ComputeAt: st.builds(ComputeAt, names, axes, st.booleans(), _indices),
    ReverseComputeAt: st.builds(ReverseComputeAt, names, axes, st.booleans(), _indices),
    ComputeInline: st.builds(ComputeInline, names),
    ReverseComputeInline: st.builds(ReverseComputeInline, names),
    Rfactor: st.builds(Rfactor, axes, aliases, st.none() | ints.map(nodes.IntFactor)),
    DecomposeReduction: st.builds(DecomposeReduction, _decompose_blocks, axes),
    StorageAlign: st.builds(StorageAlign, names, ints.map(nodes.IntFactor),
                                ints.map(nodes.IntFactor), ints.map(nodes.IntFactor)),
    Pragma: pragmas(),
    SetScope: st.builds(SetScope, names, st.sampled_from(nodes.SCOPES).map(nodes.Name)),
    annotation.Annotate: annotates(),
    blocks.Blockize: st.builds(blocks.Blockize, axes, aliases),
    blocks.AddUnitLoop: st.builds(blocks.AddUnitLoop, st.none() | _loop_axes, aliases),
    blocks.Reindex: st.builds(blocks.Reindex, names, aliases),
    blocks.Pad: st.lists(st.integers(1, 4096).map(nodes.IntFactor), min_size=1, max_size=4).map(
        lambda m: blocks.Pad(tuple(m))),
    blocks.DecomposePadding: st.builds(blocks.DecomposePadding, _decompose_blocks, axes),
    blocks.ReindexCacheRead: st.builds(blocks.ReindexCacheRead, names, _scopes, _map_indices,
                                       _map_outputs, aliases),
    blocks.ReindexCacheWrite: st.builds(blocks.ReindexCacheWrite, names, _scopes, _map_indices,
                                        _map_outputs, aliases),
    TransformLayout: transform_layouts(),
    Prepack: st.builds(Prepack, names),
    Tensorize: st.builds(Tensorize, axes,
                         st.from_regex(r"[a-z][a-z0-9_]{0,12}", fullmatch=True).map(nodes.Name)),
    FastMath: st.just(FastMath(nodes.Name("exp"))),
}  # fmt: skip
statements = st.one_of(*STATEMENT_STRATEGIES.values())

# Any printable text on one line; the parser strips what surrounds a comment's text.
comment_texts = st.text(
    st.characters(blacklist_categories=("Cs", "Cc")), max_size=30
).map(str.strip)  # fmt: skip


@st.composite
def schedules(draw) -> nodes.Schedule:
    items: list[nodes.Stmt | nodes.Comment] = []
    blank_before: set[int] = set()
    declared_knobs: set[str] = set()
    for _ in range(draw(st.integers(0, 12))):
        if items and draw(st.booleans()) and draw(st.booleans()):
            blank_before.add(len(items))
        if draw(st.integers(0, 4)) == 0:
            items.append(nodes.Comment(draw(comment_texts)))
            continue
        statement = draw(statements)
        if isinstance(statement, nodes.Param):
            if statement.name.text in declared_knobs:  # a knob is declared once
                continue
            declared_knobs.add(statement.name.text)
        items.append(statement)
        if draw(st.integers(0, 3)) == 0:
            items.append(nodes.Comment(draw(comment_texts), trailing=True))
    blank_before = {index for index in blank_before if index < len(items)}
    return nodes.Schedule(tuple(items), blank_before=frozenset(blank_before))


# --- token soups ---------------------------------------------------------------------------------

KEYWORD_TOKENS = sorted(
    t.pattern.value for t in PARSER.terminals if t.pattern.type == "str"
)  # fmt: skip
OTHER_TOKENS = [
    "i", "j", "i.o", "k.0", "i.o.i", "A", "C", "A_sh", "T", "TK", "x", "at", "_",
    "0", "1", "32", "-4", "99999999999999999999", "*", "=", "-", ".", "@", "{", "}", "\"",
    *nodes.THREAD_AXES, "blockidx.x", *nodes.SCOPES, *nodes.PRAGMA_KEYS,
    ";", "\n", "\r\n", "\t", "# note", "#", "vectorise", "λ", "\x00", "\x0c",
]  # fmt: skip
GLUE = st.sampled_from(["", " ", " ", "  ", "\n", "; "])
token_soups = st.lists(
    st.tuples(st.sampled_from(KEYWORD_TOKENS + OTHER_TOKENS), GLUE), max_size=40
).map(lambda pairs: "".join(token + glue for token, glue in pairs))


# --- front-end fuzz cases ------------------------------------------------------------------------


class HypothesisChooser(Chooser):
    """The generator's decisions as hypothesis draws, so a failing case shrinks."""

    def __init__(self, draw):
        self.draw = draw

    def integer(self, low: int, high: int) -> int:
        return self.draw(st.integers(low, high))

    def choice(self, options):
        return self.draw(st.sampled_from(options))

    def boolean(self) -> bool:
        return self.draw(st.booleans())


@st.composite
def generated_cases(draw, gpu: bool) -> Case:
    """A random loop nest and a mostly-right random schedule for it, for llvm or cuda."""
    return generated_case(HypothesisChooser(draw), gpu)


@st.composite
def live_cases(draw) -> Case:
    """An example op at odd sizes or a random loop nest, and a schedule written over its live
    loop nest (llvm, for differential runs)."""
    return live_case(HypothesisChooser(draw))


@st.composite
def mutated_cases(draw) -> Case:
    """An example schedule, mutated, against its op at a small size."""
    return mutated_case(HypothesisChooser(draw))
