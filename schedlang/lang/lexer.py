"""Highlighting schedlang: a Pygments lexer, and the TextMate grammar of editors/ written from the
same word lists.

    pygmentize -l schedlang examples/matmul.sched      # the lexer, found by its entry point
    python -m schedlang.lang.lexer > editors/vscode/syntaxes/schedlang.tmLanguage.json

The words are those of grammar/schedlang.lark, listed here rather than read from it at import, so
that highlighting (every `schedlang best` on a terminal) does not load the grammar;
tests/test_highlight.py reads the grammar and fails when a keyword or a scope is missing from
either highlighter, and when the TextMate file is not what `textmate_grammar` writes.

Highlighting is lexical: a statement's keyword counts only at the start of a statement (so a block
called `pad` in `compute_at pad nh` stays a name, as the grammar reads it), the other keywords
wherever they stand as a word.
"""

from __future__ import annotations

import json
import re
from typing import Any, ClassVar

from pygments.lexer import RegexLexer, bygroups
from pygments.token import (
    Comment,
    Keyword,
    Name,
    Number,
    Operator,
    Punctuation,
    Whitespace,
)

# The first word of every statement (grammar: `_stmt`), and `block` and `param`.
STATEMENTS = (
    "block", "param", "split", "tile", "reorder", "fuse", "bind", "vectorize", "unroll",
    "parallel", "cache_read", "cache_write", "compute_at", "reverse_compute_at", "compute_inline",
    "reverse_compute_inline", "rfactor", "decompose_reduction", "storage_align", "pragma",
    "annotate", "blockize", "add_unit_loop", "reindex", "pad", "decompose_padding",
    "reindex_cache_read", "reindex_cache_write", "set_scope", "fast_math", "transform_layout",
    "prepack", "tensorize",
)  # fmt: skip
# The grammar's other words: options, the parts of a statement, the forms of a knob's choices.
WORDS = (
    "by", "x", "at", "as", "in", "for", "with", "index", "dim", "factor", "offset",
    "keep_unit_loops", "factor_axis", "pad_value", "pow2", "range", "block",
)  # fmt: skip
# The grammar's named terminals made of fixed words (SCOPE, PRAGMA_KEY, the keys of
# ANNOTATION_KEY, MATH_FN); THREAD is a pattern.
SCOPES = ("global", "shared.dyn", "shared", "local", "warp")
THREAD = r"(?:blockIdx|threadIdx|vthread)\.[xyz]"
KEYS = (
    "auto_unroll_max_step", "unroll_explicit", "software_pipeline_stage",
    "software_pipeline_order", "software_pipeline_async_stages", "pragma_auto_unroll_max_step",
    "pragma_unroll_explicit", "pragma_loop_partition_hint", "double_buffer_scope",
)  # fmt: skip
MATH_FNS = ("exp", "erf")

_NAME = r"[A-Za-z_][A-Za-z0-9_]*"
_AXIS = rf"{_NAME}(?:\.[A-Za-z0-9_]+)*"
# A word standing alone: not part of a dotted axis (`i.o`) or of a longer name.
_ALONE_BEFORE, _ALONE_AFTER = r"(?<![\w.])", r"(?![\w.])"


def _words(words: tuple[str, ...]) -> str:
    """One alternation, the longest first (`shared.dyn` before `shared`), dots literal."""
    ordered = sorted(set(words), key=lambda word: (-len(word), word))
    return "(?:" + "|".join(re.escape(word) for word in ordered) + ")"


def _alone(words: tuple[str, ...]) -> str:
    return f"{_ALONE_BEFORE}{_words(words)}{_ALONE_AFTER}"


# A statement starts a line or follows a `;`; its indent is matched with it.
_STATEMENT_START = r"(?:^|(?<=;))"


class SchedlangLexer(RegexLexer):
    """schedlang schedules and templates (`.sched`)."""

    name = "schedlang"
    aliases = ("schedlang", "sched")
    filenames = ("*.sched",)
    mimetypes = ("text/x-schedlang",)
    url = "https://tvm.apache.org"
    flags = re.MULTILINE

    # Pygments' own type (its stubs' `Incomplete`): a rule is a (pattern, token or callback) pair.
    tokens: ClassVar[dict[str, list[Any]]] = {
        "root": [
            (r"#[^\n]*", Comment.Single),
            (r"\n", Whitespace),  # alone, so that the next line's start is seen as one
            (
                rf"{_STATEMENT_START}([ \t]*)(block)([ \t]+)({_NAME})([ \t]*)(:)",
                bygroups(Whitespace, Keyword, Whitespace, Name.Class, Whitespace, Punctuation),
            ),
            (
                rf"{_STATEMENT_START}([ \t]*)(param)([ \t]+)({_NAME})",
                bygroups(Whitespace, Keyword, Whitespace, Name.Variable),
            ),
            (
                rf"{_STATEMENT_START}([ \t]*)({_words(STATEMENTS)})\b",
                bygroups(Whitespace, Keyword),
            ),
            (r"[ \t\f\r]+", Whitespace),
            (_ALONE_BEFORE + THREAD + _ALONE_AFTER, Name.Builtin),
            (_alone(SCOPES), Name.Builtin),
            (_alone(KEYS), Name.Attribute),
            (_alone(MATH_FNS), Name.Function),
            (r"(?<=[0-9])x(?=[0-9A-Za-z_])", Keyword.Pseudo),  # `64x64`
            (_alone(WORDS), Keyword.Pseudo),
            (r"-?[0-9]+", Number.Integer),
            (_AXIS, Name),
            (r"->", Operator),
            (r"//|[+\-*/%=]", Operator),
            (r"[:;,()\[\]]", Punctuation),
        ]
    }


def textmate_grammar() -> dict[str, object]:
    """The TextMate grammar of editors/vscode (VS Code and the editors that read its grammars):
    the lexer's rules in Oniguruma's syntax, which reads these patterns as Python's re does."""
    scope = "schedlang"
    statement_start = r"(?:^|(?<=;))"
    return {
        "$schema": "https://raw.githubusercontent.com/martinring/tmlanguage/master/tmlanguage.json",
        "name": "schedlang",
        "scopeName": "source.schedlang",
        "fileTypes": ["sched"],
        "comment": "Written by `python -m schedlang.lang.lexer`; do not edit by hand.",
        "patterns": [
            {"name": f"comment.line.number-sign.{scope}", "match": r"#.*$"},
            {
                "match": rf"{statement_start}\s*(block)\s+({_NAME})\s*(:)",
                "captures": {
                    "1": {"name": f"keyword.control.{scope}"},
                    "2": {"name": f"entity.name.section.{scope}"},
                    "3": {"name": f"punctuation.separator.{scope}"},
                },
            },
            {
                "match": rf"{statement_start}\s*(param)\s+({_NAME})",
                "captures": {
                    "1": {"name": f"keyword.control.{scope}"},
                    "2": {"name": f"variable.parameter.{scope}"},
                },
            },
            {
                "match": rf"{statement_start}\s*({_words(STATEMENTS)})\b",
                "captures": {"1": {"name": f"keyword.control.{scope}"}},
            },
            {
                "name": f"support.constant.{scope}",
                "match": _ALONE_BEFORE + THREAD + _ALONE_AFTER,
            },
            {"name": f"support.constant.{scope}", "match": _alone(SCOPES)},
            {"name": f"entity.other.attribute-name.{scope}", "match": _alone(KEYS)},
            {"name": f"support.function.{scope}", "match": _alone(MATH_FNS)},
            {"name": f"keyword.other.{scope}", "match": r"(?<=[0-9])x(?=[0-9A-Za-z_])"},
            {"name": f"keyword.other.{scope}", "match": _alone(WORDS)},
            {"name": f"constant.numeric.integer.{scope}", "match": r"-?[0-9]+"},
            {"name": f"keyword.operator.{scope}", "match": r"->|//|[+\-*/%=]"},
        ],
    }


def textmate_json() -> str:
    return json.dumps(textmate_grammar(), indent=2) + "\n"


if __name__ == "__main__":
    print(textmate_json(), end="")
