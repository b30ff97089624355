"""The formatter: `parse(format_schedule(s)) == s` for every schedule, formatting is idempotent, and
comments and blank lines (collapsed to one) survive.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from schedlang import ast
from schedlang.printer import format_schedule
from schedlang.syntax import parse

# --- random valid schedules ----------------------------------------------------------------------

# Keywords are reserved only where the parser expects one, so they are fair names elsewhere.
_WORDS = ["i", "j", "k", "x", "at", "as", "by", "in", "block", "split", "shared", "blockIdx"]
_name_text = st.sampled_from(_WORDS) | st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,7}", fullmatch=True)
names = _name_text.map(ast.Name)
axes = st.builds(
    lambda base, parts: ast.Name(".".join([base, *parts])),
    _name_text,
    st.lists(st.sampled_from(["o", "i", "0", "1", "12", "inner", "_"]), max_size=3),
)
ints = st.integers(min_value=0, max_value=2**20)
knobs = _name_text.map(ast.KnobFactor)
factors = st.one_of(st.integers(-64, 4096).map(ast.IntFactor), knobs, st.just(ast.InferredFactor()))
aliases = st.none() | names


def _positive_factors(count: int):
    return st.lists(st.one_of(st.integers(1, 4096).map(ast.IntFactor), knobs), min_size=count,
                    max_size=count)  # fmt: skip


@st.composite
def choices(draw) -> ast.Choices:
    kind = draw(st.sampled_from(["list", "pow2", "range"]))
    if kind == "list":
        return ast.ListChoices(tuple(draw(st.lists(st.integers(1, 4096), min_size=1, max_size=6))))
    if kind == "pow2":
        low = draw(st.integers(0, 12))
        return ast.Pow2Choices(2**low, 2 ** draw(st.integers(low, 14)))
    low = draw(st.integers(1, 64))
    return ast.RangeChoices(low, draw(st.integers(low, 256)), draw(st.integers(1, 8)))


@st.composite
def splits(draw) -> ast.Split:
    parts = draw(st.lists(factors, min_size=1, max_size=4))
    first_star = next((n for n, f in enumerate(parts) if isinstance(f, ast.InferredFactor)), None)
    # At most one `*`, and never `*` alone: the schedule must pass the parser's own checks.
    parts = [
        ast.IntFactor(4) if isinstance(f, ast.InferredFactor) and n != first_star else f
        for n, f in enumerate(parts)
    ]
    if parts == [ast.InferredFactor()]:
        parts = [ast.KnobFactor("T")]
    return ast.Split(draw(axes), tuple(parts))


@st.composite
def tiles(draw) -> ast.Tile:
    count = draw(st.integers(2, 4))
    return ast.Tile(tuple(draw(st.lists(axes, min_size=count, max_size=count))),
                    tuple(draw(_positive_factors(count))))  # fmt: skip


@st.composite
def pragmas(draw) -> ast.Pragma:
    keys = draw(st.lists(st.sampled_from(ast.PRAGMA_KEYS), min_size=1, max_size=2, unique=True))
    values = st.one_of(st.integers(-64, 4096).map(ast.IntFactor), knobs)  # no `*`
    items = tuple(ast.PragmaItem(ast.Name(key), draw(values)) for key in keys)
    return ast.Pragma(draw(axes), items)


def _cache(kind):
    return st.builds(kind, names, st.sampled_from(ast.SCOPES).map(ast.Name), st.none() | axes,
                     aliases)  # fmt: skip


# `decompose_reduction at at i` cannot work: where a block name or `at` may come, `at` is `at`.
_decompose_blocks = st.none() | names.filter(lambda name: name.text != "at")

STATEMENT_STRATEGIES = {
    ast.BlockHeader: st.builds(ast.BlockHeader, names),
    ast.Param: st.builds(ast.Param, names, choices()),
    ast.Split: splits(),
    ast.Tile: tiles(),
    ast.Reorder: st.lists(axes, min_size=2, max_size=4).map(lambda a: ast.Reorder(tuple(a))),
    ast.Fuse: st.builds(lambda a, alias: ast.Fuse(tuple(a), alias),
                        st.lists(axes, min_size=2, max_size=3), aliases),
    ast.Bind: st.builds(ast.Bind, axes, st.sampled_from(ast.THREAD_AXES).map(ast.Name)),
    ast.Vectorize: st.builds(ast.Vectorize, axes),
    ast.Unroll: st.builds(ast.Unroll, axes),
    ast.Parallel: st.builds(ast.Parallel, axes),
    ast.CacheRead: _cache(ast.CacheRead),
    ast.CacheWrite: _cache(ast.CacheWrite),
    ast.ComputeAt: st.builds(ast.ComputeAt, names, axes),
    ast.ReverseComputeAt: st.builds(ast.ReverseComputeAt, names, axes),
    ast.ComputeInline: st.builds(ast.ComputeInline, names),
    ast.ReverseComputeInline: st.builds(ast.ReverseComputeInline, names),
    ast.Rfactor: st.builds(ast.Rfactor, axes, aliases),
    ast.DecomposeReduction: st.builds(ast.DecomposeReduction, _decompose_blocks, axes),
    ast.StorageAlign: st.builds(ast.StorageAlign, names, ints.map(ast.IntFactor),
                                ints.map(ast.IntFactor), ints.map(ast.IntFactor)),
    ast.Pragma: pragmas(),
}  # fmt: skip
statements = st.one_of(*STATEMENT_STRATEGIES.values())

# Any printable text on one line; the parser strips what surrounds a comment's text.
comment_texts = st.text(
    st.characters(blacklist_categories=("Cs", "Cc")), max_size=30
).map(str.strip)  # fmt: skip


@st.composite
def schedules(draw) -> ast.Schedule:
    items: list[ast.Stmt | ast.Comment] = []
    blank_before: set[int] = set()
    declared_knobs: set[str] = set()
    for _ in range(draw(st.integers(0, 12))):
        if items and draw(st.booleans()) and draw(st.booleans()):
            blank_before.add(len(items))
        if draw(st.integers(0, 4)) == 0:
            items.append(ast.Comment(draw(comment_texts)))
            continue
        statement = draw(statements)
        if isinstance(statement, ast.Param):
            if statement.name.text in declared_knobs:  # a knob is declared once
                continue
            declared_knobs.add(statement.name.text)
        items.append(statement)
        if draw(st.integers(0, 3)) == 0:
            items.append(ast.Comment(draw(comment_texts), trailing=True))
    blank_before = {index for index in blank_before if index < len(items)}
    return ast.Schedule(tuple(items), blank_before=frozenset(blank_before))


# --- properties ----------------------------------------------------------------------------------


def test_every_statement_kind_is_generated():
    assert set(STATEMENT_STRATEGIES) == set(ast.STATEMENT_KINDS)


@settings(max_examples=400, deadline=None)
@given(schedules())
def test_parse_of_format_is_identity(schedule):
    text = format_schedule(schedule)
    reparsed = parse(text)
    assert reparsed == schedule, text
    # Comments (leading and trailing) are items, so equality covers them; blank lines are not.
    assert reparsed.blank_before == schedule.blank_before, text
    assert format_schedule(reparsed) == text


@settings(max_examples=300, deadline=None)
@given(statements)
def test_every_statement_round_trips_on_its_own(statement):
    schedule = ast.Schedule((statement,))
    text = format_schedule(schedule)
    assert text.count("\n") == 1
    assert parse(text) == schedule


# --- layout --------------------------------------------------------------------------------------


def test_canonical_layout():
    source = (
        "\n\n# matmul, tiled\nparam   TI in [ 8,16 ,32 ]\n"
        "block C :   # the output\n"
        "split i by TI;split j by 32\n"
        "# tile the rest\n"
        "tile  i.i ,j.i by 4 x 4\n"
        "tile i.o, j.o by TI x 2\n\n\n\n"
        "bind i.o   blockIdx.x#x\n"
        "cache_read A shared at k.o as A_sh\n"
        "block A_sh:\n"
        "  storage_align A_sh dim 0 factor 32 offset 1\n"
        "pragma i auto_unroll_max_step = 16 , unroll_explicit=0\n\n\n"
    )
    assert format_schedule(parse(source)) == (
        "# matmul, tiled\n"
        "param TI in [8, 16, 32]\n"
        "block C:  # the output\n"
        "  split i by TI\n"
        "  split j by 32\n"
        "  # tile the rest\n"
        "  tile i.i, j.i by 4x4\n"
        "  tile i.o, j.o by TI x 2\n"
        "\n"
        "  bind i.o blockIdx.x  # x\n"
        "  cache_read A shared at k.o as A_sh\n"
        "block A_sh:\n"
        "  storage_align A_sh dim 0 factor 32 offset 1\n"
        "  pragma i auto_unroll_max_step=16, unroll_explicit=0\n"
    )


def test_blank_lines_are_kept_and_collapsed_to_one():
    source = "split i by 4\n\n\n\nsplit j by 4\nsplit k by 4\n   \n\t\nunroll k.i\n"
    assert format_schedule(parse(source)) == (
        "split i by 4\n\nsplit j by 4\nsplit k by 4\n\nunroll k.i\n"
    )


def test_a_blank_line_around_comments_is_kept():
    source = "split i by 4\n\n# about j\n\nsplit j by 4  # why 4\n\n# the end\n"
    assert format_schedule(parse(source)) == source


def test_a_comment_before_a_block_header_is_not_indented():
    source = "block C:\n  split i by 4\n# next block\nblock D:\n  # first\n  unroll j\n"
    assert format_schedule(parse(source)) == source


def test_crlf_and_semicolons_become_one_statement_per_line():
    assert format_schedule(parse("split i by 4; unroll i.i\r\n;;vectorize j\r\n")) == (
        "split i by 4\nunroll i.i\nvectorize j\n"
    )


def test_empty_and_comment_only_schedules():
    assert format_schedule(parse("")) == ""
    assert format_schedule(parse("\n\n  \n")) == ""
    assert format_schedule(parse("#\n#   spaced   \n")) == "#\n# spaced\n"
