"""The statement registry (schedlang.lang.statements) is the one definition of each statement: every
consumer that lists statements reads it, and this file fails when one lacks a statement."""

from __future__ import annotations

import ast as python_ast
import dataclasses
import inspect
import random
import re
from pathlib import Path

import pytest

from schedlang.lang import statements, syntax
from schedlang.lang.printer import format_stmt
from schedlang.lang.statements import STATEMENTS, StepPattern, base

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


def _checker_members_used() -> dict[str, str]:
    """Member of the checker → a statement module's function that uses it: every `c.X` where `c`
    is a parameter annotated `Checker`, or the checker parameter of a bookkeeping lambda."""
    used: dict[str, str] = {}
    for path in sorted((ROOT / "schedlang/lang/statements").glob("*.py")):
        tree = python_ast.parse(path.read_text())
        for function in python_ast.walk(tree):
            if isinstance(function, python_ast.FunctionDef):
                checkers = {
                    a.arg
                    for a in function.args.args
                    if isinstance(a.annotation, python_ast.Name) and a.annotation.id == "Checker"
                }
            elif isinstance(function, python_ast.Lambda):
                checkers = {a.arg for a in function.args.args if a.arg == "c"}
            else:
                continue
            for node in python_ast.walk(function):
                attribute = isinstance(node, python_ast.Attribute)
                if attribute and isinstance(node.value, python_ast.Name):
                    if node.value.id in checkers:
                        used.setdefault(node.attr, f"{path.name}:{node.lineno}")
    return used


def test_checker_facade_is_what_the_statements_use():
    """The `Checker` Protocol (lang/statements/facade.py) lists exactly the members of the checker
    that guards, soundness rules and bookkeeping use, and the checker has each of them."""
    from schedlang.checker import check, names
    from schedlang.lang.statements.facade import Checker

    methods = {n for n, v in vars(Checker).items() if callable(v) and not n.startswith("_")}
    declared = set(Checker.__annotations__) | methods
    used = _checker_members_used()
    unlisted = {name: used[name] for name in set(used) - declared}
    assert not unlisted, f"used but not in the Protocol: {unlisted}"
    assert not declared - set(used), (
        f"in the Protocol, used by no statement: {declared - set(used)}"
    )
    source = inspect.getsource(check) + inspect.getsource(names)
    assigned = set(re.findall(r"^ +self\.(\w+)(?:: [^=]+)? = ", source, re.MULTILINE))
    for name in declared:
        present = (
            name in assigned if name in Checker.__annotations__ else hasattr(check._Checker, name)
        )
        assert present, f"the checker has no `{name}`"


def test_decoding_grammar_and_model_reference_know_every_statement():
    from schedlang.llm import grammar, messages

    for rule, role in statements.name_roles().items():
        assert grammar._NAME_ROLES[rule] == f"{role.upper()}_NAME"
        assert messages._NAME_WORDS[rule] == role.upper()
    descriptions = messages.statement_descriptions()
    reference = messages.schedlang_reference()
    for spec in STATEMENTS:
        assert descriptions[spec.keyword] == spec.description
        assert f"- `{spec.keyword}" in reference


def test_decompiler_table_is_the_registry():
    from schedlang.interop import decompiler

    assert decompiler._STATEMENTS == statements.instructions()
    assert set(decompiler._STATEMENTS.values()) <= set(KEYWORDS)
    assert not hasattr(decompiler._Decompiler, "on_Split"), "handlers live in the registry"


@pytest.mark.parametrize("keyword", [s.keyword for s in STATEMENTS if s.instruction])
def test_every_statement_with_an_instruction_reads_it_back(keyword):
    spec = statements.BY_KEYWORD[keyword]
    assert callable(spec.decompile), f"{keyword} declares {spec.instruction} but no decompile"
    assert spec.family == Path(spec.decompile.__code__.co_filename).stem
    assert spec in statements.decompilers()[spec.instruction]


def test_statements_sharing_an_instruction_tell_its_attributes_apart():
    for instruction, specs in statements.decompilers().items():
        if len(specs) < 2:
            continue
        for key in ("pragma_auto_unroll_max_step", "software_pipeline_stage"):
            readers = [s.keyword for s in specs if s.reads_instruction([key])]
            assert len(readers) == 1, f"{instruction} {key} is read by {readers}"


# The statements stepwise decoding offers, in the order it offers them (bind and unroll loop by
# loop, compute_at and reverse_compute_at block by block).
STEP_ORDER = (
    ("split",), ("tile",), ("reorder",), ("fuse",), ("bind", "unroll"), ("vectorize",),
    ("parallel",), ("cache_read",), ("cache_write",),
    ("compute_at", "reverse_compute_at", "compute_inline", "reverse_compute_inline"),
    ("rfactor",), ("decompose_reduction",),
    ("pragma",), ("transform_layout",), ("fast_math",),
)  # fmt: skip


def test_stepwise_steps_are_the_registry():
    groups = statements.step_groups()
    assert tuple(tuple(s.keyword for s in g.statements) for g in groups) == STEP_ORDER
    for group in groups:
        assert all(s.steps.over == group.over for s in group.statements)


@pytest.mark.parametrize("keyword", [k for group in STEP_ORDER for k in group])
@pytest.mark.parametrize("target_name", ["llvm", "cuda"])
def test_each_step_is_its_statement(keyword, target_name):
    from schedlang.core.ops import load_op
    from schedlang.core.target import resolve_target
    from schedlang.llm.stepwise import StepDecoder, _View

    op = load_op(str(ROOT / "examples" / "softmax.py"), {"rows": "64", "cols": "64"})
    decoder = StepDecoder(op, resolve_target(target_name))
    view = _View(decoder, decoder.state([]))
    spec = statements.BY_KEYWORD[keyword]
    steps = [
        step
        for block in view.blocks
        for item in view.items(spec.steps.over, block)
        for step in spec.steps.write(view, block, item)
    ]
    assert steps or keyword in (
        "bind", "parallel", "rfactor", "decompose_reduction", "fast_math", "transform_layout",
        "pragma",  # on a GPU, of bound loops only
    )  # fmt: skip
    rng = random.Random(0)
    for step in steps:
        # A pattern's texts: a few of them, each one the pattern matches.
        texts = [step.sample(rng) for _ in range(5)] if isinstance(step, StepPattern) else [step]
        for text in texts:
            assert not isinstance(step, StepPattern) or step.matches(text)
            (stmt,) = syntax.parse(text).statements
            assert type(stmt) is spec.node and format_stmt(stmt) == text


def test_docs_summary_table_and_sections():
    text = (ROOT / "docs" / "language.md").read_text(encoding="utf-8")
    assert statements.summary_table() in text, (
        "docs/language.md's summary table differs from statements.summary_table()"
    )
    for keyword in KEYWORDS:
        heading = rf"^(### {keyword}|## .*`{keyword}`.*)$"
        assert re.search(heading, text, re.MULTILINE), f"no `{keyword}` section in docs"
