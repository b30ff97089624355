"""The statement registry (schedlang.lang.statements) is the one definition of each statement: every
consumer that lists statements reads it, and this file fails when one lacks a statement."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from schedlang.lang import statements, syntax
from schedlang.lang.printer import format_stmt
from schedlang.lang.statements import STATEMENTS, base

ROOT = Path(__file__).resolve().parent.parent
KEYWORDS = [spec.keyword for spec in STATEMENTS]


def _rule(keyword: str) -> str:
    match = re.search(rf"^{keyword}: (.*)$", syntax.grammar_text(), re.MULTILINE)
    assert match, f"grammar/schedlang.lark has no rule `{keyword}`"
    return match[1]


def _examples(spec: statements.Statement) -> list[str]:
    return re.findall(r"`([^`]+)`", spec.example)


def test_keywords_are_unique_and_listed_once():
    assert len(set(KEYWORDS)) == len(KEYWORDS)
    assert statements.KEYWORDS == ("block", "param", *KEYWORDS)
    assert len(statements.BY_NODE) == len(STATEMENTS)


@pytest.mark.parametrize("keyword", KEYWORDS)
def test_grammar_parser_and_printer_know_the_statement(keyword):
    spec = statements.BY_KEYWORD[keyword]
    rule = _rule(keyword)
    assert rule.startswith(f'"{keyword}"'), "the rule starts with its keyword"
    assert f"| {keyword}\n" in syntax.grammar_text() or f"_stmt: {keyword}\n" in (
        syntax.grammar_text()
    ), "the rule is one of `_stmt`'s alternatives"
    assert callable(getattr(syntax._Builder, spec.rule, None)), "the parser builds it"
    assert syntax._EXAMPLES[keyword] == spec.example
    examples = _examples(spec)
    assert examples, "the example shows the statement"
    for text in examples:
        (stmt,) = syntax.parse(text).statements
        assert type(stmt) is spec.node
        assert format_stmt(stmt) == text, "the example is in canonical form"
        assert syntax.parse(format_stmt(stmt)).statements == (stmt,)


@pytest.mark.parametrize("keyword", KEYWORDS)
def test_roles_name_fields_of_the_node(keyword):
    spec = statements.BY_KEYWORD[keyword]
    fields = {f.name for f in dataclasses.fields(spec.node)}
    assert set(spec.roles) <= fields
    # A rule whose bare NAME is not a role the decoding grammar knows would accept any name.
    takes_name = re.search(r"\bNAME\b", _rule(keyword)) is not None
    assert takes_name == (spec.name_role is not None)
    if spec.name_role:
        assert syntax._NAME_AFTER[keyword]


@pytest.mark.parametrize("keyword", KEYWORDS)
def test_checker_lowering_and_bookkeeping_are_declared(keyword):
    spec = statements.BY_KEYWORD[keyword]
    assert callable(spec.guard) and callable(spec.lower) and callable(spec.format)
    assert spec.family == Path(spec.guard.__code__.co_filename).stem
    # A statement that takes knobs says where, and how to put their values in.
    assert (spec.bind_factors is None) == (spec.factors is base._nothing)


def test_decoding_grammar_and_model_reference_know_every_statement():
    from schedlang.llm import grammar, proposer

    for rule, role in statements.name_roles().items():
        assert grammar._NAME_ROLES[rule] == f"{role.upper()}_NAME"
        assert proposer._NAME_WORDS[rule] == role.upper()
    descriptions = proposer.statement_descriptions()
    reference = proposer.schedlang_reference()
    for spec in STATEMENTS:
        assert descriptions[spec.keyword] == spec.description
        assert f"- `{spec.keyword}" in reference


def test_decompiler_table_is_the_registry():
    from schedlang.interop import metaschedule as interop

    assert interop._STATEMENTS == statements.instructions()
    assert set(interop._STATEMENTS.values()) <= set(KEYWORDS)
    source = Path(interop.__file__).read_text(encoding="utf-8")
    for instruction in interop._STATEMENTS:
        handled = getattr(interop._Decompiler, f"on_{instruction}", None) or (
            f'"{instruction}"' in source  # handled in on_instruction (Annotate)
        )
        assert handled, f"the decompiler has no handler for {instruction}"


def test_docs_summary_table_and_sections():
    text = (ROOT / "docs" / "language.md").read_text(encoding="utf-8")
    assert statements.summary_table() in text, (
        "docs/language.md's summary table differs from statements.summary_table()"
    )
    for keyword in KEYWORDS:
        heading = rf"^(### {keyword}|## .*`{keyword}`.*)$"
        assert re.search(heading, text, re.MULTILINE), f"no `{keyword}` section in docs"
