"""The formatter: `parse(format_schedule(s)) == s` for every schedule, formatting is idempotent, and
comments and blank lines (collapsed to one) survive.
"""

from __future__ import annotations

from hypothesis import given, settings

from schedlang.lang import nodes
from schedlang.lang import statements as registry
from schedlang.lang.printer import format_schedule
from schedlang.lang.syntax import parse
from tests.strategies import STATEMENT_STRATEGIES, schedules, statements

# --- properties ----------------------------------------------------------------------------------


def test_every_statement_kind_is_generated():
    assert set(STATEMENT_STRATEGIES) == set(registry.STATEMENT_KINDS)


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
    schedule = nodes.Schedule((statement,))
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


def test_options_print_after_what_they_modify():
    source = (
        "cache_write C global   at j.0   keep_unit_loops as C_g\n"
        "compute_at pad  w.0 keep_unit_loops ; reverse_compute_at D i\n"
        "rfactor k.i  factor_axis  1 as C_rf\n"
        "rfactor k.i factor_axis 0\n"
    )
    assert format_schedule(parse(source)) == (
        "cache_write C global at j.0 keep_unit_loops as C_g\n"
        "compute_at pad w.0 keep_unit_loops\n"
        "reverse_compute_at D i\n"
        "rfactor k.i factor_axis 1 as C_rf\n"
        "rfactor k.i factor_axis 0\n"  # as written: the default, but said
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
