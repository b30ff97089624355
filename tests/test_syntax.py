"""Syntax: text → AST, and the diagnostics a malformed schedule gets.

Each statement kind parses to one exact AST node; each kind of mistake renders to a golden file in
tests/golden/syntax/ (caret line included); no input, however garbled, makes the parser raise
anything but a DiagnosticError.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from schedlang.core.diagnostics import NO_SPAN, DiagnosticError, Severity, Span, render_all
from schedlang.lang import nodes, statements
from schedlang.lang.printer import format_schedule
from schedlang.lang.statements.annotation import Annotate, AnnotationItem
from schedlang.lang.statements.blocks import (
    AddUnitLoop,
    Blockize,
    DecomposePadding,
    Pad,
    Reindex,
    ReindexCacheRead,
    ReindexCacheWrite,
)
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
from schedlang.lang.syntax import (
    _EXAMPLES,
    MAX_SYNTAX_ERRORS,
    parse,
    parse_file,
    parse_with_diagnostics,
)
from tests.strategies import token_soups

N = nodes.Name
INT = nodes.IntFactor
KNOB = nodes.KnobFactor
STAR = nodes.InferredFactor()


def only_statement(text: str) -> nodes.Stmt:
    (statement,) = parse(text).statements
    return statement


# --- one parse per statement kind ----------------------------------------------------------------

STATEMENTS = [
    ("block C:", nodes.BlockHeader(N("C"))),
    ("param TI in [8, 16, 32]", nodes.Param(N("TI"), nodes.ListChoices((8, 16, 32)))),
    ("param TJ in pow2(8, 256)", nodes.Param(N("TJ"), nodes.Pow2Choices(8, 256))),
    ("param U in range(1, 8)", nodes.Param(N("U"), nodes.RangeChoices(1, 8, 1))),
    ("param U in range(2, 16, 2)", nodes.Param(N("U"), nodes.RangeChoices(2, 16, 2))),
    ("split i by 32", Split(N("i"), (INT(32),))),
    ("split i.o by *, 4, TK", Split(N("i.o"), (STAR, INT(4), KNOB("TK")))),
    ("split k.0 by TK, *", Split(N("k.0"), (KNOB("TK"), STAR))),
    ("tile i, j by 32x32", Tile((N("i"), N("j")), (INT(32), INT(32)))),
    ("tile i, j, k by TI x 8 x TK",
     Tile((N("i"), N("j"), N("k")), (KNOB("TI"), INT(8), KNOB("TK")))),
    ("reorder i.o, j.o, i.i, j.i", Reorder((N("i.o"), N("j.o"), N("i.i"), N("j.i")))),
    ("fuse i.o, j.o", Fuse((N("i.o"), N("j.o")))),
    ("fuse i.o, j.o as ij", Fuse((N("i.o"), N("j.o")), N("ij"))),
    ("bind ij blockIdx.x", Bind(N("ij"), N("blockIdx.x"))),
    ("bind i.i.o vthread.z", Bind(N("i.i.o"), N("vthread.z"))),
    ("vectorize j.i", Vectorize(N("j.i"))),
    ("unroll k.1", Unroll(N("k.1"))),
    ("parallel i.o", Parallel(N("i.o"))),
    ("cache_read A shared", CacheRead(N("A"), N("shared"))),
    ("cache_read B shared.dyn at k.o as B_sh",
     CacheRead(N("B"), N("shared.dyn"), N("k.o"), N("B_sh"))),
    ("cache_write C local at j.o", CacheWrite(N("C"), N("local"), N("j.o"))),
    ("cache_write C warp as C_w", CacheWrite(N("C"), N("warp"), None, N("C_w"))),
    ("cache_read A global at j keep_unit_loops",
     CacheRead(N("A"), N("global"), N("j"), keep_unit_loops=True)),
    ("cache_write C global at j.o keep_unit_loops as C_g",
     CacheWrite(N("C"), N("global"), N("j.o"), N("C_g"), keep_unit_loops=True)),
    ("compute_at A_sh k.o", ComputeAt(N("A_sh"), N("k.o"))),
    ("compute_at pad w.0 keep_unit_loops", ComputeAt(N("pad"), N("w.0"), True)),
    ("reverse_compute_at C_local j.o", ReverseComputeAt(N("C_local"), N("j.o"))),
    ("reverse_compute_at C_local j.o keep_unit_loops",
     ReverseComputeAt(N("C_local"), N("j.o"), True)),
    ("compute_inline B", ComputeInline(N("B"))),
    ("reverse_compute_inline D", ReverseComputeInline(N("D"))),
    ("rfactor k.i", Rfactor(N("k.i"))),
    ("rfactor k.i as C_rf", Rfactor(N("k.i"), N("C_rf"))),
    ("rfactor k.i factor_axis 1", Rfactor(N("k.i"), factor_axis=INT(1))),
    ("rfactor j.1 factor_axis 0 as S_rf", Rfactor(N("j.1"), N("S_rf"), INT(0))),
    ("decompose_reduction at k.o", DecomposeReduction(None, N("k.o"))),
    ("decompose_reduction C at k.o", DecomposeReduction(N("C"), N("k.o"))),
    ("storage_align A_sh dim 0 factor 32 offset 1",
     StorageAlign(N("A_sh"), INT(0), INT(32), INT(1))),
    ("set_scope B local", SetScope(N("B"), N("local"))),
    ("set_scope A_sh shared.dyn", SetScope(N("A_sh"), N("shared.dyn"))),
    ("transform_layout B_g (k, j) -> (j // 16, k, j % 16) pad_value 0",
     TransformLayout(N("B_g"), (N("k"), N("j")),
                     (IndexOp("//", IndexVar("j"), IndexInt(16)), IndexVar("k"),
                      IndexOp("%", IndexVar("j"), IndexInt(16))), INT(0))),
    ("prepack B_global", Prepack(N("B_global"))),
    ("tensorize i.i with mma_f16f16f16", Tensorize(N("i.i"), N("mma_f16f16f16"))),
    ("fast_math exp", FastMath(N("exp"))),
    ("pragma i.o unroll_explicit=1",
     Pragma(N("i.o"), (PragmaItem(N("unroll_explicit"), INT(1)),))),
    # Issue 14's statements; tests/test_statements_new.py has more of each.
    ("annotate k.o software_pipeline_stage=[0, 1], software_pipeline_order=[1, 0]",
     Annotate(N("k.o"), None, (AnnotationItem(N("software_pipeline_stage"), (INT(0), INT(1))),
                               AnnotationItem(N("software_pipeline_order"), (INT(1), INT(0)))))),
    ("annotate block A_l double_buffer_scope=0",
     Annotate(None, N("A_l"), (AnnotationItem(N("double_buffer_scope"), INT(0)),))),
    ("blockize j.i as C_tile", Blockize(N("j.i"), N("C_tile"))),
    ("add_unit_loop block", AddUnitLoop(None)),
    ("reindex A", Reindex(N("A"))),
    ("pad by 16, 16, 1", Pad((INT(16), INT(16), INT(1)))),
    ("decompose_padding A_pad at i0", DecomposePadding(N("A_pad"), N("i0"))),
    ("compute_at B i index 0", ComputeAt(N("B"), N("i"), index=INT(0))),
    ("reindex_cache_read A global (i, j, k) -> (i, k)",
     ReindexCacheRead(N("A"), N("global"), (N("i"), N("j"), N("k")),
                      (IndexVar("i"), IndexVar("k")))),
    ("reindex_cache_write C local (i, j) -> (j, i) as C_l",
     ReindexCacheWrite(N("C"), N("local"), (N("i"), N("j")), (IndexVar("j"), IndexVar("i")),
                       N("C_l"))),
    ("cache_read B global for C, D",
     CacheRead(N("B"), N("global"), consumers=(N("C"), N("D")))),
    (
        "pragma i.o auto_unroll_max_step=U, unroll_explicit=0",
        Pragma(N("i.o"), (
            PragmaItem(N("auto_unroll_max_step"), KNOB("U")),
            PragmaItem(N("unroll_explicit"), INT(0)),
        )),
    ),
]  # fmt: skip


@pytest.mark.parametrize(("text", "expected"), STATEMENTS, ids=[t for t, _ in STATEMENTS])
def test_statement_parses_to_its_node(text, expected):
    assert only_statement(text) == expected


def test_every_statement_kind_has_a_parse_test():
    assert {type(node) for _, node in STATEMENTS} == set(statements.STATEMENT_KINDS)


def test_every_statement_kind_has_an_example_and_the_examples_parse():
    assert set(_EXAMPLES) == set(statements.KEYWORDS)
    for keyword, note in _EXAMPLES.items():
        for example in note.split("`")[1::2]:
            schedule = parse(example + ("\n  split i by 4" if keyword == "block" else ""))
            assert schedule.statements[0].keyword == keyword


def test_keywords_are_reserved_only_where_the_parser_expects_them():
    text = (
        "param x in [8]\nsplit at by x\ntile x, by by x x x\nfuse in, as as at\nbind x blockIdx.x"
    )
    assert parse(text).statements == (
        nodes.Param(N("x"), nodes.ListChoices((8,))),
        Split(N("at"), (KNOB("x"),)),
        Tile((N("x"), N("by")), (KNOB("x"), KNOB("x"))),
        Fuse((N("in"), N("as")), N("at")),
        Bind(N("x"), N("blockIdx.x")),
    )


def test_option_keywords_are_names_where_no_option_can_come():
    text = (
        "compute_at keep_unit_loops keep_unit_loops keep_unit_loops\n"
        "cache_read factor_axis global at keep_unit_loops as keep_unit_loops\n"
        "rfactor factor_axis factor_axis 2 as factor_axis\n"
    )
    assert parse(text).statements == (
        ComputeAt(N("keep_unit_loops"), N("keep_unit_loops"), True),
        CacheRead(N("factor_axis"), N("global"), N("keep_unit_loops"), N("keep_unit_loops")),
        Rfactor(N("factor_axis"), N("factor_axis"), INT(2)),
    )


def test_the_factor_axis_has_a_span_and_keep_unit_loops_needs_at():
    (rfactor,) = parse("rfactor k.i factor_axis 12", "r.sched").statements
    assert rfactor.factor_axis.span == Span("r.sched", 1, 25, 1, 27)
    assert rfactor.factor_position == 12 and Rfactor(N("k.i")).factor_position == 0
    with pytest.raises(ValueError, match="keep_unit_loops needs `at`"):
        CacheWrite(N("C"), N("local"), keep_unit_loops=True)


def test_statements_separated_by_semicolons_and_a_header_on_the_same_line():
    schedule = parse("block C: split i by 4; vectorize i.i;; unroll i.o\n")
    assert [type(s) for s in schedule.statements] == [
        nodes.BlockHeader, Split, Vectorize, Unroll,
    ]  # fmt: skip


def test_comments_are_items_in_source_order():
    schedule = parse("# first\nsplit i by 4  # why 4\n\n# last\n")
    assert schedule.items == (
        nodes.Comment("first"),
        Split(N("i"), (INT(4),)),
        nodes.Comment("why 4", trailing=True),
        nodes.Comment("last"),
    )
    assert schedule.blank_before == {3}


def test_statement_and_name_spans():
    schedule = parse("# header\n  split i.o by 32\n", "m.sched")
    (split,) = schedule.statements
    assert split.span == Span("m.sched", 2, 3, 2, 18)
    assert split.axis.span == Span("m.sched", 2, 9, 2, 12)
    assert split.factors[0].span == Span("m.sched", 2, 16, 2, 18)


def test_spans_after_a_semicolon_and_in_a_file_with_errors():
    # A broken line sends the parser line by line; later lines must keep their real line numbers.
    schedule, diagnostics = parse_with_diagnostics("split i by\n\nunroll j; bind k.o blockIdx.y\n")
    assert [d.span.line for d in diagnostics] == [1]
    unroll, bind = schedule.statements
    assert unroll.span == Span("<string>", 3, 1, 3, 9)
    assert bind.span == Span("<string>", 3, 11, 3, 30)
    assert bind.thread.span == Span("<string>", 3, 20, 3, 30)


def test_spans_do_not_take_part_in_equality():
    assert parse("split i by 4") == parse("\n\n   split   i  by   4  ")
    assert nodes.Name("i", span=Span("f", 1, 1, 1, 2)) == nodes.Name("i", span=NO_SPAN)


def test_a_statement_after_a_broken_one_on_the_same_line_still_parses():
    schedule, diagnostics = parse_with_diagnostics("split i by 4; bind i.o blockidx.x; unroll i.i")
    assert len(diagnostics) == 1
    assert schedule.statements == (Split(N("i"), (INT(4),)), Unroll(N("i.i")))


def test_error_count_is_capped():
    text = "split i by\n" * (MAX_SYNTAX_ERRORS + 10)
    _, diagnostics = parse_with_diagnostics(text)
    assert len(diagnostics) == MAX_SYNTAX_ERRORS + 1
    assert diagnostics[0].message == f"too many syntax errors; stopped after {MAX_SYNTAX_ERRORS}"


def test_warnings_do_not_stop_a_parse():
    schedule, diagnostics = parse_with_diagnostics("param T in [8, 8]\nblock C:\n")
    assert [d.severity for d in diagnostics] == [Severity.WARNING, Severity.WARNING]
    assert parse("param T in [8, 8]\nblock C:\n") == schedule


# --- diagnostics, rendered (golden files) --------------------------------------------------------

MALFORMED = {
    "unknown_keyword": "block C:\n  vectorise j.i\n",
    "unknown_keyword_far_from_any": "frobnicate i\n",
    "keyword_alias": "parallelize i.o\n",
    "keyword_runs_into_name": "spliti by 4\n",
    "missing_space_after_by": "split i by32\n",
    "missing_factor": "split i by\n",
    "missing_axis": "split by 4\n",
    "bad_thread_axis": "bind i blockidx.x\n",
    "unterminated_list": "param T in [8, 16\n",
    "stray_token": "split i by 4 )\n",
    "stray_character": "unroll k.i $\n",
    "stray_close_brace": "block C:\n  split i by 4\n}\n",
    "empty_block_header": "block :\n  split i by 4\n",
    "missing_colon": "block C\n  split i by 4\n",
    "empty_block": "block A_shared:\nblock C:\n  split i by 4\n",
    "duplicate_knob": "param T in [8, 16]\nparam T in pow2(8, 64)\nsplit i by T\n",
    "knob_lists_a_value_twice": "param T in [8, 16, 8]\n",
    "knob_value_not_positive": "param T in [0, 8]\n",
    "negative_knob_value": "param T in [-4, 8]\n",
    "knob_name_is_a_number": "param 8 in [1, 2]\n",
    "tile_one_factor": "tile i, j by 32\n",
    "tile_fewer_factors_than_axes": "tile i, j, k by 32x32\n",
    "tile_one_axis": "tile i by 32\n",
    "tile_star": "tile i, j by *x32\n",
    "split_two_stars": "split i by *, *, 4\n",
    "split_by_star": "split i by *\n",
    "split_trailing_comma": "split i by 4,\n",
    "pow2_not_power_of_two": "param T in pow2(8, 100)\n",
    "pow2_empty": "param T in pow2(64, 8)\n",
    "range_empty": "param T in range(8, 4)\n",
    "range_zero_step": "param T in range(1, 8, 0)\n",
    "choices_not_a_list": "param T in 8, 16\n",
    "bad_scope": "cache_read A sharde at k.o\n",
    "cache_read_missing_at_axis": "cache_read A shared at\n",
    "alias_missing": "fuse i.o, j.o as\n",
    "reorder_one_axis": "reorder i\n",
    "decompose_reduction_missing_at": "decompose_reduction C k.o\n",
    "keep_unit_loops_without_at": "cache_read A global keep_unit_loops\n",
    "keep_unit_loops_misspelled": "compute_at B k.o keep_unit_loop\n",
    "factor_axis_negative": "rfactor k.i factor_axis -1\n",
    "factor_axis_after_alias": "rfactor k.i as C_rf factor_axis 1\n",
    "storage_align_negative": "storage_align A dim -1 factor 32 offset 1\n",
    "bad_pragma_key": "pragma i auto_unrol=16\n",
    "pragma_missing_value": "pragma i unroll_explicit\n",
    "duplicate_pragma_key": "pragma i auto_unroll_max_step=16, auto_unroll_max_step=8\n",
    "several_errors": (
        "param T in [8, 16]\n"
        "block C:\n"
        "  vectorise j.i\n"
        "  split i by\n"
        "  reorder i.o, j.o\n"
        "  bind i.o threadIdx.w\n"
        "  cache_read A sharde\n"
    ),
    "error_in_the_middle_of_a_line": "split i by 4; bind i.o blockidx.x; unroll i.i\n",
    "two_errors_on_one_line": "split i by; unroll; vectorize j\n",
    "tab_indent": "block C:\n\tsplit @ by 3\n",
    "crlf_line_endings": "block C:\r\n  split i by 4\r\n  bind i.o foo\r\n",
    # Issue 17: integers beyond int32 reached TVM as ffi.BigInt (TypeError, OverflowError).
    "integer_too_large_factor": "split i by 9223372036854775808\n",
    "integers_too_large_everywhere": (
        "param T in [8, 9223372036854775808]\n"
        "param U in range(1, 99999999999999999999999999, 2147483648)\n"
        "param V in pow2(1, 4294967296)\n"
        "tile i, j by 2147483648x8\n"
        "storage_align C dim 0 factor 18446744073709551616 offset 0\n"
        "pragma i auto_unroll_max_step=9223372036854775808\n"
        "rfactor k factor_axis 2147483648\n"
        "split j by -9223372036854775809\n"
    ),
}


@pytest.mark.parametrize("name", sorted(MALFORMED))
def test_malformed_schedule_diagnostics(name, golden):
    text = MALFORMED[name]
    _, diagnostics = parse_with_diagnostics(text, f"{name}.sched")
    assert diagnostics
    if any(d.is_error for d in diagnostics):
        with pytest.raises(DiagnosticError) as info:
            parse(text, f"{name}.sched")
        assert info.value.diagnostics() == diagnostics
    rendered = render_all(diagnostics, text)
    golden(f"syntax/{name}.txt", f"{text.rstrip()}\n--- diagnostics ---\n{rendered}\n")


def test_no_golden_file_is_left_without_its_case():
    golden_dir = Path(__file__).parent / "golden" / "syntax"
    assert {path.stem for path in golden_dir.glob("*.txt")} <= set(MALFORMED)


def test_every_error_in_a_file_is_reported_in_one_run():
    _, diagnostics = parse_with_diagnostics(MALFORMED["several_errors"])
    assert [d.span.line for d in diagnostics] == [3, 4, 6, 7]


def test_regression_integer_limit_is_int32():
    """Issue 17: the largest integer a schedule may hold is TVM's int32 maximum."""
    assert only_statement("split i by 2147483647") == Split(N("i"), (INT(2147483647),))
    assert only_statement("split i by -2147483647") == Split(N("i"), (INT(-2147483647),))
    assert only_statement("split i by 000000000000000032") == Split(N("i"), (INT(32),))
    _, diagnostics = parse_with_diagnostics("split i by 2147483648; split j by -2147483648")
    assert [d.message for d in diagnostics] == [
        "integer 2147483648 is too large: the limit is 2^31-1 (2147483647)",
        "integer -2147483648 is too small: the limit is -2^31+1 (-2147483647)",
    ]
    assert [d.span.column for d in diagnostics] == [12, 35]


def test_regression_integer_with_thousands_of_digits_is_diagnosed_not_converted():
    """Issue 17: Python refuses to convert a 5,000-digit literal (a lark VisitError, exit 2)."""
    text = "split i by 1" + "0" * 5000 + "\nparam T in [" + "9" * 5000 + "]\n"
    _, diagnostics = parse_with_diagnostics(text)
    assert [d.message for d in diagnostics] == [
        f"integer 1{'0' * 19}…0000 (5001 digits) is too large: the limit is 2^31-1 (2147483647)",
        f"integer {'9' * 20}…9999 (5000 digits) is too large: the limit is 2^31-1 (2147483647)",
    ]
    assert [(d.span.line, d.span.column, d.span.end_column) for d in diagnostics] == [
        (1, 12, 5013),
        (2, 13, 5013),
    ]
    with pytest.raises(DiagnosticError):
        parse(text)


# --- fuzzing: any input parses or gets diagnostics -----------------------------------------------


def _parses_or_diagnoses(text: str) -> None:
    schedule, diagnostics = parse_with_diagnostics(text, "fuzz.sched")
    render_all(diagnostics, text)
    errors = [d for d in diagnostics if d.is_error]
    line_count = max(1, text.count("\n") + 1)
    for diagnostic in errors:
        assert diagnostic.span is None or 1 <= diagnostic.span.line <= line_count, diagnostic
    if errors:
        with pytest.raises(DiagnosticError):
            parse(text)
        return
    assert schedule is not None
    # Whatever parses also survives formatting.
    formatted = format_schedule(schedule)
    assert parse(formatted) == schedule
    assert format_schedule(parse(formatted)) == formatted


_FUZZ = settings(
    max_examples=1000, deadline=None, database=None,
    suppress_health_check=[HealthCheck.too_slow],
)  # fmt: skip


@_FUZZ
@given(st.text(max_size=120))
def test_random_text_parses_or_gets_diagnostics(text):
    _parses_or_diagnoses(text)


@_FUZZ
@given(token_soups)
def test_token_soup_parses_or_gets_diagnostics(text):
    _parses_or_diagnoses(text)


def test_a_long_file_parses_quickly():
    text = "block C:\n" + "  split i by 4; vectorize i.i  # a comment\n" * 2000
    start = time.perf_counter()
    assert len(parse(text).statements) == 4001
    broken = text + "  split i by\n"
    _, diagnostics = parse_with_diagnostics(broken)
    assert len(diagnostics) == 1
    assert time.perf_counter() - start < 10


# --- files ---------------------------------------------------------------------------------------


def test_parse_file_reads_a_schedule(tmp_path):
    path = tmp_path / "ok.sched"
    path.write_text("split i by 4\n", encoding="utf-8")
    schedule = parse_file(path)
    assert schedule.file == str(path)
    assert schedule.statements[0].span.file == str(path)


def test_parse_file_missing(tmp_path):
    path = tmp_path / "missing.sched"
    with pytest.raises(DiagnosticError) as info:
        parse_file(path)
    assert info.value.render().startswith(f"error: cannot read {path}: No such file")


def test_parse_file_directory(tmp_path):
    with pytest.raises(DiagnosticError) as info:
        parse_file(tmp_path)
    assert f"cannot read {tmp_path}" in info.value.render()


def test_parse_file_binary(tmp_path):
    path = tmp_path / "model.bin"
    path.write_bytes(b"\x7fELF\x02\x01\x01\x00\x00\x00split")
    with pytest.raises(DiagnosticError) as info:
        parse_file(path)
    assert info.value.render().startswith(f"error: {path} is a binary file, not a schedule")


def test_parse_file_not_utf8(tmp_path):
    path = tmp_path / "latin1.sched"
    path.write_bytes("split i by 4\n# café\n".encode("latin-1"))
    with pytest.raises(DiagnosticError) as info:
        parse_file(path)
    assert info.value.render().startswith(f"error: {path}:2: not valid UTF-8 (byte 0xe9)")
