"""Text → AST: the Lark grammar, one module-level LALR parser, and syntax diagnostics.

Errors are reported in words a person uses ("expected a factor like 32, a knob name or `*`"), with
"did you mean" for misspelled keywords, thread axes and scopes. A file with several broken lines
reports all of them: when the whole-file parse fails, each line is parsed on its own (the grammar
has no construct spanning lines), and within a line each `;`-separated part.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from lark import Lark, Token, Transformer, Tree, v_args
from lark.exceptions import UnexpectedCharacters, UnexpectedEOF, UnexpectedInput, UnexpectedToken
from lark.tree import Meta

from schedlang.core.diagnostics import (
    Diagnostic,
    DiagnosticError,
    Span,
    did_you_mean,
    error,
    warning,
)
from schedlang.lang import nodes, statements
from schedlang.lang.statements import annotation, fastmath, loops, pragmas
from schedlang.lang.statements.args import KEEP_UNIT_LOOPS, Aliased
from schedlang.lang.statements.facets import Syntax

MAX_SYNTAX_ERRORS = 50
# Every integer in a schedule (factors, knob values, pragma values, storage_align, factor_axis)
# becomes a TVM int32: loop extents, split factors and buffer indices are 32-bit in TIR, and a
# larger literal reaches TVM as an `ffi.BigInt` it cannot take.
INT_LIMIT = 2**31 - 1
INT_LIMIT_TEXT = f"2^31-1 ({INT_LIMIT})"
# Statement keywords people (and models) reach for that mean one of ours.
KEYWORD_ALIASES = {
    "annotate": "pragma",
    "vectorise": "vectorize",
    "parallelize": "parallel",
    "parallelise": "parallel",
    "cache": "cache_read",
    "inline": "compute_inline",
    "sblock": "block",
    "knob": "param",
}


@dataclass(frozen=True)
class ListRule:
    """What a statement's factors or keys must be beyond what grammar/schedlang.lark says (a
    context-free rule cannot count them): `validate` reports a schedule that breaks the rule, and
    the decoding grammar (schedlang.llm.grammar) is written from it, so that a model cannot."""

    inferred: int = 0  # how many factors may be `*` (never the only one: nothing would be split)
    per_axis: bool = False  # one factor per axis
    keys_once: bool = False  # each key at most once


LIST_RULES = {
    "split": ListRule(inferred=1),
    "tile": ListRule(per_axis=True),
    "pragma": ListRule(keys_once=True),
}


def grammar_path() -> Path:
    """grammar/schedlang.lark in a checkout; the packaged copy in an installed wheel."""
    in_checkout = Path(__file__).resolve().parents[2] / "grammar" / "schedlang.lark"
    if in_checkout.is_file():
        return in_checkout
    return Path(str(resources.files("schedlang.grammar").joinpath("schedlang.lark")))


def grammar_text() -> str:
    return grammar_path().read_text(encoding="utf-8")


class GluedWords(UnexpectedInput):
    """Two words with no space between them where one is a keyword: `spliti by 4`, `split i by4`.

    The contextual lexer only tries the terminals the parser can accept next, so at the start of
    a statement `split` matches the front of `spliti` and the rest would silently become the axis.
    """

    def __init__(self, left: Token, right: Token):
        super().__init__(f"no space between `{left}` and `{right}`")
        self.left, self.right = left, right
        self.line, self.column = _at(left.line), _at(left.column)
        self.pos_in_stream = left.start_pos  # type: ignore[assignment]  # lark declares it None, and sets ints
        self.state = None


class _RequireSpaces:
    """Post-lexer that rejects a keyword run into a neighbouring word. It looks only at tokens
    already lexed, so the contextual lexer still lexes each token in the right parser state."""

    always_accept = ()

    def process(self, stream: Iterator[Token]) -> Iterator[Token]:
        previous = None
        for token in stream:
            if previous is not None and _glued(previous, token):
                raise GluedWords(previous, token)
            previous = token
            yield token


def _glued(left: Token, right: Token) -> bool:
    # `tile i, j by 32x32`: the `x` of a tile is written between numbers on purpose.
    if left.end_pos != right.start_pos or "X" in (left.type, right.type):
        return False
    if left.type not in _KEYWORD_TERMINALS and right.type not in _KEYWORD_TERMINALS:
        return False
    return _is_word_char(str(left)[-1:]) and _is_word_char(str(right)[:1])


def _is_word_char(char: str) -> bool:
    return bool(char) and (char.isalnum() or char == "_")


PARSER = Lark(
    grammar_text(),
    parser="lalr",
    lexer="contextual",
    propagate_positions=True,
    postlex=_RequireSpaces(),
)
_KEYWORD_TERMINALS = {
    terminal.name
    for terminal in PARSER.terminals
    if terminal.pattern.type == "str" and _is_word_char(terminal.pattern.value[:1])
}

# What each terminal means, in words.
_TERMINAL_WORDS = {
    "AXIS": "a loop axis like `i` or `i.o`",
    "NAME": "a name",
    "INT": "a number",
    "SIGNED_INT": "a number",
    "STAR": "`*`",
    "THREAD": "a thread axis (blockIdx.x|y|z, threadIdx.x|y|z or vthread.x|y|z)",
    "SCOPE": "a storage scope (" + ", ".join(nodes.SCOPES) + ")",
    "PRAGMA_KEY": "a pragma key (" + ", ".join(nodes.PRAGMA_KEYS) + ")",
    "ANNOTATION_KEY": "an annotation key (" + ", ".join(annotation.KEYS) + ")",
    "INT_LIST": "a list of numbers like [0, 1]",
    "MATH_FN": "a function with a fast form ("
    + " or ".join(f"`{name}`" for name in fastmath.FUNCTIONS)
    + ")",
    "_SEP": "the end of the statement",
    "$END": "the end of the statement",
}
# The NAME a statement expects, by the keyword that came right before it.
_NAME_AFTER = {
    "block": "a block name",
    "param": "a knob name",
    "in": "a list like [8, 16, 32], pow2(8, 64) or range(1, 8)",
    **{
        spec.keyword: spec.name_after or f"a {spec.name_role} name"
        for spec in statements.STATEMENTS
        if spec.name_role
    },
    "as": "a new name",
}
_FACTOR_TERMINALS = {"INT", "SIGNED_INT", "NAME", "STAR"}
_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z0-9_]+)*|-?[0-9]+|\S")


def parse(text: str, file: str = "<string>") -> nodes.Schedule:
    """Parse a schedule; raise DiagnosticError with every syntax error found."""
    schedule, diagnostics = parse_with_diagnostics(text, file)
    if schedule is None or any(d.is_error for d in diagnostics):
        raise DiagnosticError(diagnostics, text)
    return schedule


def parse_file(path: str | Path) -> nodes.Schedule:
    return parse(read_source(path), str(path))


def read_source(path: str | Path) -> str:
    """The text of a .sched file, or a clear error for a missing, binary or non-UTF-8 file."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise DiagnosticError([error(f"cannot read {path}: {exc.strerror or exc}")]) from None
    if b"\0" in data[:8192]:
        raise DiagnosticError([error(f"{path} is a binary file, not a schedule")])
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise DiagnosticError(
            [error(f"{path}:{line}: not valid UTF-8 (byte 0x{data[exc.start]:02x})")]
        ) from None


def parse_with_diagnostics(
    text: str, file: str = "<string>"
) -> tuple[nodes.Schedule | None, list[Diagnostic]]:
    """Parse and validate; return the schedule (None if nothing parsed) and every diagnostic."""
    # Lines as lark counts them: only "\n" ends a line (str.splitlines also splits at \x0c, \x1e…).
    lines = text.split("\n")
    try:
        builder = _Builder(file, 0)
        statements = builder.transform(PARSER.parse(text + "\n")).children
        diagnostics: list[Diagnostic] = builder.diagnostics
    except UnexpectedInput:
        statements, diagnostics = _parse_line_by_line(lines, file)
    except RecursionError:
        return None, [error("schedule is nested too deeply to parse", Span(file, 1, 1, 1, 2))]
    items, blank_before = _attach_comments(statements, lines, file)
    schedule = nodes.Schedule(tuple(items), file, text, frozenset(blank_before))
    # Lines dropped by error recovery may have been a block's statements.
    diagnostics += validate(schedule, complete=not diagnostics)
    return schedule, sorted(diagnostics, key=_position)


def _position(diagnostic: Diagnostic) -> tuple[int, int]:
    span = diagnostic.span
    return (span.line, span.column) if span else (0, 0)


def _parse_line_by_line(
    lines: Sequence[str], file: str
) -> tuple[list[nodes.Stmt], list[Diagnostic]]:
    statements: list[nodes.Stmt] = []
    diagnostics: list[Diagnostic] = []
    for index, line in enumerate(lines):
        if len(diagnostics) >= MAX_SYNTAX_ERRORS:
            diagnostics.append(
                error(f"too many syntax errors; stopped after {MAX_SYNTAX_ERRORS}", None)
            )
            break
        text = line
        # Each failure blanks the `;`-separated part it happened in; a line has few parts.
        for _ in range(line.count(";") + 1):
            try:
                builder = _Builder(file, index)
                statements += builder.transform(PARSER.parse(text + "\n")).children
                diagnostics += builder.diagnostics
                break
            except UnexpectedInput as exc:
                diagnostics.append(_syntax_diagnostic(exc, text, file, index + 1))
                text = _blank_part(text, exc.column - 1 if exc.column > 0 else len(text))
    return statements, diagnostics


def _blank_part(line: str, column: int) -> str:
    """The line with the `;`-separated part around `column` replaced by spaces."""
    start = line.rfind(";", 0, column) + 1
    end = line.find(";", column)
    end = len(line) if end < 0 else end + 1
    return line[:start] + " " * (end - start) + line[end:]


def _syntax_diagnostic(exc: UnexpectedInput, line: str, file: str, line_no: int) -> Diagnostic:
    """A lark error as a Diagnostic whose words say what was expected."""
    if isinstance(exc, GluedWords):
        return _glued_diagnostic(exc, line, file, line_no)
    at = getattr(exc, "column", None)
    if isinstance(at, int) and (glued := _glued_function(line, at, file, line_no)):
        return glued
    if isinstance(exc, UnexpectedToken) and exc.token.type in ("_SEP", "$END"):
        column = exc.token.column if exc.token.type == "_SEP" and exc.token.value == ";" else None
        column = column or len(line.rstrip()) + 1
        found, width = ("`;`", 1) if exc.token.value == ";" else ("the end of the line", 1)
        expected: Collection[str] = exc.expected
    elif isinstance(exc, UnexpectedToken):
        column, found = _at(exc.token.column), f"`{exc.token.value}`"
        width = len(str(exc.token.value))
        expected = exc.expected
    elif isinstance(exc, UnexpectedCharacters):
        column = exc.column
        match = _WORD.match(line, column - 1)
        word = match.group(0) if match else line[column - 1 : column]
        # A control character (NUL, \x01, …) would print as nothing: show its code.
        shown = f"`{word}`" if word.isprintable() else f"the character {ascii(word)[1:-1]}"
        found, width = shown, max(1, len(word))
        expected = set(exc.allowed or ())
    else:  # UnexpectedEOF
        assert isinstance(exc, UnexpectedEOF)
        column, found, width, expected = len(line) + 1, "the end of the line", 1, exc.expected
    span = Span(file, line_no, column, line_no, column + width)
    word = found.strip("`")
    expected = _accepted_after(line[: column - 1]) or expected
    before = _word_before(line, column)

    if {"PARAM", "SPLIT", "BLOCK"} <= set(expected) and word[:1].isalpha():
        keyword = KEYWORD_ALIASES.get(word) or did_you_mean(word, statements.KEYWORDS)
        hint = f"did you mean `{keyword}`?" if keyword in statements.KEYWORDS else keyword
        return error(f"unknown statement `{word}`", span, hint, _statements_note())
    words = _expected_words(expected, before)
    notes = [_suggestion(expected, word)]
    if re.fullmatch(r"-[0-9]+", word) and "INT" in expected and "SIGNED_INT" not in expected:
        notes.append("a negative number is not allowed here")
    if len(expected) == 1 and _literal(next(iter(expected))) == before:
        notes.append(f"the `{before}` before it was read as a name: is a name missing?")
    if word == "keep_unit_loops" and "AT" in expected:
        notes.append("`keep_unit_loops` is an option of `at`: `at AXIS keep_unit_loops`")
    if word in ("{", "}"):
        notes.append("schedlang has no braces: `block C:` starts a section that runs to the next")
    if not any(notes):
        notes.append(_EXAMPLES.get(_statement_keyword(line[: column - 1]), ""))
    return error(f"expected {words}, found {found}", span, *notes)


# A correct instance of each statement, shown under an error inside one.
_EXAMPLES = {
    "block": "e.g. `block C:`",
    "param": "e.g. `param T in [8, 16, 32]`, `param T in pow2(8, 256)` or `param T in range(1, 8)`",
    **{spec.keyword: spec.example for spec in statements.STATEMENTS},
}
_HEADER_PREFIX = re.compile(r"\s*block\s+[A-Za-z_][A-Za-z0-9_]*\s*:")


def _statement_keyword(before_error: str) -> str:
    """The keyword of the statement an error is in, from the text before the error."""
    part = before_error[before_error.rfind(";") + 1 :]
    header = _HEADER_PREFIX.match(part)
    words = part[header.end() if header else 0 :].split()
    return words[0] if words else ""


def _glued_function(line: str, column: int, file: str, line_no: int) -> Diagnostic | None:
    """`fast_math erff`: the lexer read `erf` and stopped at `f`; the word is the error."""
    head = re.search(r"\bfast_math\s+([A-Za-z_][A-Za-z0-9_]*)$", line[: column - 1])
    match = _WORD.match(line, column - 1)
    if head is None or match is None or head.group(1) not in fastmath.FUNCTIONS:
        return None
    word = head.group(1) + match.group(0)
    span = Span(file, line_no, head.start(1) + 1, line_no, column + len(match.group(0)))
    functions = ", ".join(f"`{name}`" for name in fastmath.FUNCTIONS)
    hint = did_you_mean(word, fastmath.FUNCTIONS) or f"fast_math rewrites: {functions}"
    return error(f"fast_math has no fast `{word}`", span, hint)


def _glued_diagnostic(exc: GluedWords, line: str, file: str, line_no: int) -> Diagnostic:
    left, right = str(exc.left), str(exc.right)
    left_at, right_at = _at(exc.left.column), _at(exc.right.column)
    span = Span(file, line_no, left_at, line_no, _at(exc.right.end_column))
    spaced = line[: right_at - 1] + " " + line[right_at - 1 :]
    start = spaced.rfind(";", 0, left_at - 1) + 1
    end = spaced.find(";", right_at)
    part = spaced[start:] if end < 0 else spaced[start:end]
    try:
        PARSER.parse(part + "\n")
        spacing_fixes_it = True
    except UnexpectedInput:
        spacing_fixes_it = False
    if left not in statements.KEYWORDS:
        return error(f"missing space between `{left}` and `{right}`", span)
    word = left + right
    if spacing_fixes_it:
        hint = f"did you mean `{left} {right}`?"
    elif word in KEYWORD_ALIASES:
        hint = f"did you mean `{KEYWORD_ALIASES[word]}`?"
    else:
        hint = did_you_mean(word, statements.KEYWORDS)
    return error(f"unknown statement `{word}`", span, hint or _statements_note())


def _accepted_after(prefix: str) -> set[str]:
    """The terminals the parser accepts after `prefix`. LALR merges states, so the set an error
    carries can hold what other statements expect; replaying the prefix gives the exact one."""
    try:
        interactive = PARSER.parse_interactive(prefix)
        interactive.exhaust_lexer()
        return set(interactive.accepts())
    except UnexpectedInput:
        return set()


def _statements_note() -> str:
    return "statements: " + ", ".join(statements.KEYWORDS)


def _word_before(line: str, column: int) -> str:
    words = re.findall(r"[A-Za-z_][A-Za-z0-9_.]*|[^\sA-Za-z0-9_]", line[: column - 1])
    return words[-1] if words else ""


def _expected_words(terminals: Collection[str], before: str) -> str:
    expected = set(terminals)
    if "SPLIT" in expected:  # at the start of a statement
        return "a statement"
    phrases = []
    if expected >= _FACTOR_TERMINALS:
        phrases.append("a factor like 32, a knob name or `*`")
        expected -= _FACTOR_TERMINALS
    elif {"INT", "SIGNED_INT", "NAME"} <= expected:
        phrases.append("a value like 16 or a knob name")
        expected -= {"INT", "SIGNED_INT", "NAME"}
    if "$END" in expected and "_SEP" in expected:
        expected.discard("$END")
    for terminal in sorted(expected, key=_terminal_order):
        if terminal == "NAME":
            phrases.append(_NAME_AFTER.get(before, "a name"))
        elif terminal in _TERMINAL_WORDS:
            phrases.append(_TERMINAL_WORDS[terminal])
        else:
            phrases.append(f"`{_literal(terminal)}`")
    phrases = list(dict.fromkeys(phrases))
    if len(phrases) > 1:
        return ", ".join(phrases[:-1]) + " or " + phrases[-1]
    return phrases[0] if phrases else "something else"


def _terminal_order(terminal: str) -> tuple[int, str]:
    return (terminal in ("_SEP", "$END"), terminal)


def _literal(terminal: str) -> str:
    try:
        pattern = PARSER.get_terminal(terminal).pattern
    except KeyError:
        return terminal.lower()
    return pattern.value if pattern.type == "str" else terminal.lower()


def _suggestion(expected: Collection[str], word: str) -> str:
    if "THREAD" in expected:
        return did_you_mean(word, nodes.THREAD_AXES)
    if "SCOPE" in expected:
        return did_you_mean(word, nodes.SCOPES)
    if "PRAGMA_KEY" in expected:
        return did_you_mean(word, nodes.PRAGMA_KEYS)
    if "MATH_FN" in expected:
        return did_you_mean(word, fastmath.FUNCTIONS)
    keywords = [_literal(t) for t in expected if t.isupper() and t not in _TERMINAL_WORDS]
    keywords = [k for k in keywords if _is_keyword_like(k)]
    return did_you_mean(word, keywords) if _is_keyword_like(word) else ""


def _is_keyword_like(word: str) -> bool:
    """Letters and underscores, like `by` or `keep_unit_loops`."""
    return word.replace("_", "").isalpha()


# --- tree → AST ----------------------------------------------------------------------------------


def _at(position: int | None) -> int:
    """A token's line or column: lark types them optional, and sets them on every token it lexes."""
    return position if position is not None else 0


def _span(file: str, line_offset: int, item: Token | Tree[Token]) -> Span:
    if isinstance(item, Token):
        return Span(
            file,
            _at(item.line) + line_offset,
            _at(item.column),
            _at(item.end_line) + line_offset,
            _at(item.end_column),
        )
    meta = item.meta
    return Span(
        file,
        meta.line + line_offset,
        meta.column,
        meta.end_line + line_offset,
        meta.end_column,
    )


@v_args(meta=True)
class _Builder(Transformer[Token, Any]):
    """Builds AST nodes; any rule without a method here is a bug and fails loudly."""

    def __init__(self, file: str, line_offset: int):
        super().__init__()
        self.file = file
        self.line_offset = line_offset
        self.diagnostics: list[Diagnostic] = []  # integers out of range

    def __default__(self, data: str, children: list[Any], meta: Meta) -> Any:
        raise NotImplementedError(f"no AST node for grammar rule `{data}`")

    def _at(self, meta: Meta) -> Span:
        return Span(
            self.file,
            meta.line + self.line_offset,
            meta.column,
            meta.end_line + self.line_offset,
            meta.end_column,
        )

    def _name(self, token: Token) -> nodes.Name:
        return nodes.Name(str(token), span=_span(self.file, self.line_offset, token))

    def _int(self, token: Token) -> nodes.IntFactor:
        return nodes.IntFactor(self._bounded(token), span=_span(self.file, self.line_offset, token))

    def _bounded(self, token: Token) -> int:
        """The literal's value; one beyond the limit, with an error recorded, when out of range
        (the schedule is rejected then, so that value reaches nothing)."""
        sign = -1 if token.startswith("-") else 1
        digits = token.lstrip("-").lstrip("0") or "0"
        # Python refuses to convert more than 4300 digits; no more than 10 are ever in range.
        if len(digits) <= len(str(INT_LIMIT)) and int(digits) <= INT_LIMIT:
            return sign * int(digits)
        shown = str(token) if len(token) <= 40 else f"{token[:20]}…{token[-4:]}"
        shown += f" ({len(digits)} digits)" * (len(token) > 40)
        size, limit = (
            ("large", INT_LIMIT_TEXT) if sign > 0 else ("small", f"-2^31+1 ({-INT_LIMIT})")
        )
        self.diagnostics.append(
            error(
                f"integer {shown} is too {size}: the limit is {limit}",
                _span(self.file, self.line_offset, token),
                "TVM indexes loops and buffers with 32-bit integers",
            )
        )
        return sign * (INT_LIMIT + 1)

    def _names(self, children: list[Any]) -> tuple[nodes.Name, ...]:
        return tuple(c for c in children if isinstance(c, nodes.Name))

    def start(self, meta: Meta, children: list[Any]) -> Tree[Token]:
        return Tree("start", children)

    def axis(self, meta: Meta, children: list[Any]) -> nodes.Name:
        return self._name(children[0])

    def alias(self, meta: Meta, children: list[Any]) -> Aliased:
        return Aliased(self._name(children[0]))

    def factor(self, meta: Meta, children: list[Any]) -> nodes.Factor:
        token = children[0]
        span = _span(self.file, self.line_offset, token)
        if token.type in ("INT", "SIGNED_INT"):
            return nodes.IntFactor(self._bounded(token), span=span)
        if token.type == "STAR":
            return nodes.InferredFactor(span=span)
        return nodes.KnobFactor(str(token), span=span)

    value = factor  # a pragma value: a factor without `*`

    def block_header(self, meta: Meta, children: list[Any]) -> nodes.BlockHeader:
        return nodes.BlockHeader(self._name(children[0]), span=self._at(meta))

    def param(self, meta: Meta, children: list[Any]) -> nodes.Param:
        return nodes.Param(self._name(children[0]), children[1], span=self._at(meta))

    def choice_list(self, meta: Meta, children: list[Any]) -> nodes.ListChoices:
        return nodes.ListChoices(tuple(self._bounded(c) for c in children), span=self._at(meta))

    def choice_pow2(self, meta: Meta, children: list[Any]) -> nodes.Pow2Choices:
        low, high = (self._bounded(c) for c in children)
        return nodes.Pow2Choices(low, high, span=self._at(meta))

    def choice_range(self, meta: Meta, children: list[Any]) -> nodes.RangeChoices:
        return nodes.RangeChoices(*(self._bounded(c) for c in children), span=self._at(meta))

    def keep_unit_loops(self, meta: Meta, children: list[Any]) -> object:
        return KEEP_UNIT_LOOPS

    def factor_axis(self, meta: Meta, children: list[Any]) -> nodes.IntFactor:
        return self._int(children[0])

    def pragma_item(self, meta: Meta, children: list[Any]) -> pragmas.PragmaItem:
        return pragmas.PragmaItem(self._name(children[0]), children[1], span=self._at(meta))


def _add_statement_builders() -> None:
    """One `_Builder` method per registered statement, named after its grammar rule."""
    for spec in statements.STATEMENTS:

        def build(
            self: _Builder, meta: Meta, children: list[Any], spec: Syntax = spec
        ) -> nodes.Stmt:
            return spec.build(self, meta, children)

        setattr(_Builder, spec.rule, v_args(meta=True)(build))


_add_statement_builders()


# --- comments, blank lines, validation -----------------------------------------------------------

_COMMENT = re.compile(r"#.*$")


def _attach_comments(
    statements: list[nodes.Stmt], lines: Sequence[str], file: str
) -> tuple[list[nodes.Stmt | nodes.Comment], set[int]]:
    """Merge `#` comments (found by position; nothing else in the language uses `#`) into the
    statement sequence, and note which items follow a blank line."""
    comments = []
    for index, line in enumerate(lines):
        match = _COMMENT.search(line)
        if match:
            column = match.start() + 1
            # `split i by 4  # why` trails a statement; `; # why` trails only a separator.
            trailing = bool(line[: match.start()].replace(";", " ").strip())
            span = Span(file, index + 1, column, index + 1, len(line) + 1)
            comments.append(nodes.Comment(match.group(0)[1:].strip(), trailing, span=span))
    items: list[nodes.Stmt | nodes.Comment] = sorted(
        [*statements, *comments], key=lambda item: (item.span.line, item.span.column)
    )
    blank_before = set()
    previous_line = 0
    for index, item in enumerate(items):
        first = item.span.line
        if index and any(not lines[n - 1].strip() for n in range(previous_line + 1, first)):
            blank_before.add(index)
        previous_line = max(previous_line, item.span.end_line)
    return items, blank_before


def validate(schedule: nodes.Schedule, complete: bool = True) -> list[Diagnostic]:
    """Checks that need nothing but the schedule itself: knob declarations, factor counts.
    `complete=False` (statements were lost to syntax errors) skips the empty-block warning."""
    diagnostics: list[Diagnostic] = []
    declared: dict[str, nodes.Param] = {}
    statements = schedule.statements
    for index, stmt in enumerate(statements):
        match stmt:
            case nodes.Param(name=name, choices=choices):
                if name.text in declared:
                    first = declared[name.text].span.line
                    diagnostics.append(
                        error(
                            f"knob `{name.text}` is declared twice",
                            name.span,
                            f"first declared at line {first}",
                        )
                    )
                declared.setdefault(name.text, stmt)
                diagnostics += _validate_choices(name.text, choices)
            case loops.Split(factors=factors):
                diagnostics += _inferred_factors("split", factors)
            case loops.Tile(axes=axes, factors=factors):
                if LIST_RULES["tile"].per_axis and len(axes) != len(factors):
                    diagnostics.append(
                        error(
                            f"tile names {len(axes)} axes but gives {len(factors)} factors",
                            stmt.span,
                            "one factor per axis, e.g. `tile i, j by 32x32`",
                        )
                    )
                diagnostics += _inferred_factors("tile", factors)
            case pragmas.Pragma(items=pragma_items) if LIST_RULES["pragma"].keys_once:
                seen: set[str] = set()
                for item in pragma_items:
                    if item.key.text in seen:
                        diagnostics.append(
                            error(f"pragma key `{item.key.text}` given twice", item.key.span)
                        )
                    seen.add(item.key.text)
            case nodes.BlockHeader(block=block) if complete:
                following = statements[index + 1] if index + 1 < len(statements) else None
                if following is None or isinstance(following, nodes.BlockHeader):
                    diagnostics.append(
                        warning(f"block `{block.text}` has no statements", stmt.span)
                    )
    return diagnostics


def _inferred_factors(keyword: str, factors: Sequence[nodes.Factor]) -> list[Diagnostic]:
    """The `*` factors of a split or tile that `LIST_RULES` does not allow."""
    allowed = LIST_RULES[keyword].inferred
    inferred = [f for f in factors if isinstance(f, nodes.InferredFactor)]
    if not allowed:
        return [error(f"a {keyword} factor cannot be `*`", factor.span) for factor in inferred]
    if len(inferred) > allowed:
        most = "one factor" if allowed == 1 else f"{allowed} factors"
        return [error(f"at most {most} of a {keyword} can be `*`", inferred[allowed].span)]
    if len(factors) == 1 and inferred:
        return [
            error(
                f"`{keyword} … by *` leaves nothing to split",
                inferred[0].span,
                "give the inner factor, e.g. `split i by 32`",
            )
        ]
    return []


def _validate_choices(name: str, choices: nodes.Choices) -> list[Diagnostic]:
    span = choices.span
    match choices:
        case nodes.ListChoices(values=values):
            if any(v <= 0 for v in values):
                return [error(f"knob `{name}` has a value that is not positive", span)]
            if len(set(values)) != len(values):
                return [warning(f"knob `{name}` lists a value twice", span)]
        case nodes.Pow2Choices(low=low, high=high):
            for bound in (low, high):
                if bound <= 0 or bound & (bound - 1):
                    return [
                        error(
                            f"pow2 bound {bound} is not a power of two",
                            span,
                            "e.g. `pow2(8, 256)` gives 8, 16, 32, 64, 128, 256",
                        )
                    ]
            if low > high:
                return [error(f"pow2({low}, {high}) is empty: {low} > {high}", span)]
        case nodes.RangeChoices(low=low, high=high, step=step):
            if step <= 0:
                return [error(f"range step must be positive, got {step}", span)]
            if low <= 0:
                return [error(f"knob `{name}` has a value that is not positive", span)]
            if low > high:
                return [error(f"range({low}, {high}) is empty: {low} > {high}", span)]
    return []
