"""The statement registry (schedlang.lang.statements) is the one definition of each statement: every
consumer that lists statements reads it, and this file fails when a keyword lacks a facet it needs
(syntax, checking, lowering, trace, decoding) or a consumer lacks a statement."""

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
from schedlang.lang.statements import STATEMENTS, StepPattern, args, facets

ROOT = Path(__file__).resolve().parent.parent
KEYWORDS = [spec.keyword for spec in STATEMENTS]


def _rule(keyword: str) -> str:
    match = re.search(rf"^{keyword}: (.*)$", syntax.grammar_text(), re.MULTILINE)
    assert match, f"grammar/schedlang.lark has no rule `{keyword}`"
    return match[1]


def _examples(spec: statements.Syntax) -> list[str]:
    return re.findall(r"`([^`]+)`", spec.example)


# The statements TVM's traces hold no instruction of (`tile` is a split per axis and a reorder;
# `fast_math` rewrites the function before scheduling), and those stepwise decoding does not offer.
NO_TRACE = {"tile", "fast_math"}
NO_STEPS = {
    "storage_align", "set_scope", "blockize", "add_unit_loop", "reindex", "pad",
    "decompose_padding", "reindex_cache_read", "reindex_cache_write", "prepack", "tensorize",
}  # fmt: skip


def test_keywords_are_unique_and_listed_once():
    assert len(set(KEYWORDS)) == len(KEYWORDS)
    assert ("block", "param", *KEYWORDS) == statements.KEYWORDS
    assert len(statements.BY_NODE) == len(STATEMENTS)


def test_every_keyword_has_every_facet_it_needs():
    """Each statement is checked and lowered; each has a trace instruction and steps unless it
    is named above as having none; no facet names a statement the registry lacks."""
    every = set(KEYWORDS)
    for kind in (facets.Checking, facets.Lowering, facets.Trace, facets.Decoding):
        assert set(facets.declared(kind)) <= every, f"a {kind.__name__} of no statement"
    assert set(statements.CHECKING) == every
    assert set(statements.LOWERING) == every
    assert set(statements.TRACE) == every - NO_TRACE
    assert set(statements.DECODING) == every - NO_STEPS
    for registry in (statements.CHECKING, statements.LOWERING, statements.TRACE):
        for keyword, facet in registry.items():
            assert facet.statement is statements.BY_KEYWORD[keyword]
            # A facet lives in its statement's family module, with the code it names.
            code = next(v for v in vars(facet).values() if inspect.isfunction(v))
            assert Path(code.__code__.co_filename).stem == facet.statement.family, keyword


@pytest.mark.parametrize("keyword", KEYWORDS)
def test_the_arguments_are_the_fields_of_the_node(keyword):
    """The arguments fill every field of the AST class, each once, and read every child of the
    grammar rule (the builder asserts that), so the parser and the printer follow from them."""
    spec = statements.BY_KEYWORD[keyword]
    filled = [arg.field for arg in spec.args]
    filled += ["outputs"] * sum(arg.field == "indices" for arg in spec.args)  # an index map
    assert sorted(filled) == sorted(
        f.name for f in dataclasses.fields(spec.node) if f.init and f.name != "span"
    )


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
    # Knobs are factors: a statement takes them where its rule takes a `factor` (or a pragma's
    # `value`), not the word "factor".
    takes_factor = re.search(r'(?<!")\b(factor|pragma_item)\b(?!")', _rule(keyword)) is not None
    assert spec.takes_knobs == takes_factor


def test_an_argument_kind_reads_what_it_writes():
    """Each kind's word and value, read back by the parser, are the value (the kinds the
    statements above do not reach alone: a word that is a named terminal, an absent option)."""
    (stmt,) = syntax.parse("transform_layout A (i, j) -> (j, i)").statements
    assert stmt.pad is None and format_stmt(stmt) == "transform_layout A (i, j) -> (j, i)"
    (stmt,) = syntax.parse("transform_layout A (i) -> (i) pad_value 3").statements
    assert stmt.pad.value == 3 and format_stmt(stmt).endswith(" pad_value 3")
    (stmt,) = syntax.parse("cache_read A shared at k keep_unit_loops").statements
    assert (stmt.consumers, stmt.alias, stmt.keep_unit_loops) == ((), None, True)
    assert args.Alias().write(stmt) is None
    assert args.KeepUnitLoops().write(stmt) == "keep_unit_loops"


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
                if (
                    isinstance(node, python_ast.Attribute)
                    and isinstance(node.value, python_ast.Name)
                    and node.value.id in checkers
                ):
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

    assert statements.instructions() == decompiler._STATEMENTS
    assert set(decompiler._STATEMENTS.values()) <= set(KEYWORDS)
    assert not hasattr(decompiler._Decompiler, "on_Split"), "handlers live in the registry"


@pytest.mark.parametrize("keyword", sorted(statements.TRACE))
def test_every_statement_with_an_instruction_reads_it_back(keyword):
    trace = statements.TRACE[keyword]
    assert callable(trace.decompile), f"{keyword} declares {trace.instruction} but no decompile"
    assert trace in statements.decompilers()[trace.instruction]


def test_statements_sharing_an_instruction_tell_its_attributes_apart():
    for instruction, traces in statements.decompilers().items():
        if len(traces) < 2:
            continue
        for key in ("pragma_auto_unroll_max_step", "software_pipeline_stage"):
            readers = [t.statement.keyword for t in traces if t.reads_instruction([key])]
            assert len(readers) == 1, f"{instruction} {key} is read by {readers}"


# The statements stepwise decoding offers, in the order it offers them (bind and unroll loop by
# loop, compute_at and reverse_compute_at block by block).
STEP_ORDER = (
    ("split",), ("tile",), ("reorder",), ("fuse",), ("bind", "unroll"), ("vectorize",),
    ("parallel",), ("cache_read",), ("cache_write",),
    ("compute_at", "reverse_compute_at", "compute_inline", "reverse_compute_inline"),
    ("rfactor",), ("decompose_reduction",),
    ("pragma",), ("annotate",), ("transform_layout",), ("fast_math",),
)  # fmt: skip


def test_stepwise_steps_are_the_registry():
    groups = statements.step_groups()
    assert tuple(tuple(d.statement.keyword for d in g.statements) for g in groups) == STEP_ORDER
    for group in groups:
        assert all(d.over == group.over for d in group.statements)


@pytest.mark.parametrize("keyword", [k for group in STEP_ORDER for k in group])
@pytest.mark.parametrize("target_name", ["llvm", "cuda"])
def test_each_step_is_its_statement(keyword, target_name):
    from schedlang.core.ops import load_op
    from schedlang.core.target import resolve_target
    from schedlang.llm.stepwise import StepDecoder, _View

    op = load_op(str(ROOT / "examples" / "softmax.py"), {"rows": "64", "cols": "64"})
    decoder = StepDecoder(op, resolve_target(target_name))
    view = _View(decoder, decoder.state([]))
    spec, decoding = statements.BY_KEYWORD[keyword], statements.DECODING[keyword]
    steps = [
        step
        for block in view.blocks
        for item in view.items(decoding.over, block)
        for step in decoding.write(view, block, item)
    ]
    assert steps or keyword in (
        "bind", "parallel", "rfactor", "decompose_reduction", "fast_math", "transform_layout",
        "pragma",  # on a GPU, of bound loops only
        "annotate",  # the loop-partition hint: CPU loops only
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
