"""One Diagnostic type for the whole project, rendered like a compiler.

    examples/matmul.sched:3:1: error: unknown statement `vectorise`
        3 | vectorise j.i
          | ^~~~~~~~~
          = note: did you mean `vectorize`?

Every stage (syntax, check, lower, op loading, measurement) reports problems with this type. A stage
records diagnostics as it goes and raises `DiagnosticError` once at the end, so the user (or a model
repairing its answer) sees every problem in one round.
"""

from __future__ import annotations

import difflib
import functools
import re
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any


@dataclass(frozen=True)
class Span:
    """A source range; lines and columns are 1-based, `end_column` one past the last character."""

    file: str
    line: int
    column: int
    end_line: int
    end_column: int

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.column}"


NO_SPAN = Span("<unknown>", 0, 0, 0, 0)


class Severity(StrEnum):
    ERROR = "error"
    WARNING = "warning"
    NOTE = "note"


@dataclass(frozen=True)
class Diagnostic:
    severity: Severity
    message: str
    span: Span | None = None
    notes: tuple[str, ...] = ()

    @property
    def is_error(self) -> bool:
        return self.severity is Severity.ERROR

    def render(self, source: str | None = None) -> str:
        """`file:line:col: error: message`, the source line with a `^~~~` underline, then notes."""
        if self.span is None or self.span.line <= 0:
            lines = [f"{self.severity.value}: {self.message}"]
        else:
            lines = [f"{self.span}: {self.severity.value}: {self.message}"]
            lines += _excerpt(self.span, source)
        # `= note` lines up under the `|` of the excerpt.
        pad = " " * (len(str(self.span.line)) + 2) if self.span and self.span.line > 0 else "  "
        lines += [f"{pad}= note: {note}" for note in self.notes]
        return "\n".join(lines)

    def to_json(self, source: str | None = None) -> dict[str, Any]:
        """The diagnostic as JSON (docs/cli.md); with the source, "fixits" holds the edits its
        "did you mean" note proposes."""
        span = self.span
        return {
            "severity": self.severity.value,
            "message": self.message,
            "file": span.file if span else None,
            "line": span.line if span else None,
            "column": span.column if span else None,
            "end_line": span.end_line if span else None,
            "end_column": span.end_column if span else None,
            "notes": list(self.notes),
            "fixits": self.fixits(source),
        }

    def fixits(self, source: str | None) -> list[dict[str, Any]]:
        """Replacements of the span's text that a "did you mean `x`?" note proposes: only where
        the span covers exactly the word the message quotes (`unknown statement `vectorise``), so
        applying one never rewrites more than the misspelling."""
        span = self.span
        if source is None or span is None or span.line <= 0 or span.end_line != span.line:
            return []
        lines = _lines(source)
        if span.line > len(lines):
            return []
        written = lines[span.line - 1][span.column - 1 : span.end_column - 1]
        if not written or f"`{written}`" not in self.message:
            return []
        fixes = []
        for note in self.notes:
            match = _DID_YOU_MEAN.fullmatch(note)
            if match and match.group(1) != written:
                where = {k: getattr(span, k) for k in ("line", "column", "end_line", "end_column")}
                fixes.append({"file": span.file, **where, "replacement": match.group(1)})
        return fixes


_DID_YOU_MEAN = re.compile(r"did you mean `([^`]+)`\?")


@functools.lru_cache(maxsize=4)
def _lines(source: str) -> list[str]:
    """The source's lines, as the parser counts them; split once per source, not once per
    diagnostic (a long file with many errors would render in quadratic time)."""
    return source.split("\n")


def _excerpt(span: Span, source: str | None) -> list[str]:
    if source is None:
        return []
    source_lines = _lines(source)
    if not 1 <= span.line <= len(source_lines):
        return []
    line = source_lines[span.line - 1].removesuffix("\r").expandtabs(1)
    # One character for one: a control character shown as itself would move the caret.
    text = "".join(char if char.isprintable() else "\N{REPLACEMENT CHARACTER}" for char in line)
    # A span reaching past its first line is underlined to the end of that line.
    end = span.end_column if span.end_line == span.line else len(text) + 1
    width = max(1, end - span.column)
    gutter = str(span.line)
    blank = " " * len(gutter)
    marker = " " * (span.column - 1) + "^" + "~" * (width - 1)
    return [f" {gutter} | {text}", f" {blank} | {marker}"]


def error(message: str, span: Span | None = None, *notes: str) -> Diagnostic:
    return Diagnostic(Severity.ERROR, message, span, tuple(n for n in notes if n))


def warning(message: str, span: Span | None = None, *notes: str) -> Diagnostic:
    return Diagnostic(Severity.WARNING, message, span, tuple(n for n in notes if n))


def did_you_mean(word: str, candidates: Iterable[str]) -> str:
    """A "did you mean `x`?" note, or "" when nothing is close enough."""
    matches = difflib.get_close_matches(word, list(candidates), n=1, cutoff=0.6)
    if not matches:
        lowered = {c.lower(): c for c in candidates}
        if word.lower() in lowered:
            matches = [lowered[word.lower()]]
    return f"did you mean `{matches[0]}`?" if matches else ""


def one_of(candidates: Collection[str], what: str) -> str:
    """A note listing what exists, e.g. "axes of block C: i, j, k"."""
    return f"{what}: {', '.join(candidates)}" if candidates else f"{what}: (none)"


class SchedlangError(Exception):
    """A problem reported to the user as text (bad op file, bad target, …), never as a traceback."""

    def __init__(self, message: str, *notes: str):
        super().__init__(message)
        self.message = message
        self.notes = tuple(n for n in notes if n)

    def diagnostics(self) -> list[Diagnostic]:
        return [error(self.message, None, *self.notes)]

    def render(self) -> str:
        return "\n\n".join(d.render() for d in self.diagnostics())


class DiagnosticError(SchedlangError):
    """Raised once at the end of a stage that found at least one error."""

    def __init__(self, items: Iterable[Diagnostic], source: str | None = None):
        self.items = list(items)
        self.source = source
        first = next((d for d in self.items if d.is_error), None)
        super().__init__(first.message if first else "diagnostics reported")

    def diagnostics(self) -> list[Diagnostic]:
        return list(self.items)

    def render(self) -> str:
        return render_all(self.items, self.source)

    def __str__(self) -> str:
        return self.render()


def render_all(diagnostics: Iterable[Diagnostic], source: str | None = None) -> str:
    diagnostics = list(diagnostics)
    text = "\n\n".join(d.render(source) for d in diagnostics)
    errors = sum(d.is_error for d in diagnostics)
    warnings = sum(d.severity is Severity.WARNING for d in diagnostics)
    if errors or warnings > 1:
        counts = [f"{errors} error{'s' * (errors != 1)}"] if errors else []
        counts += [f"{warnings} warning{'s' * (warnings != 1)}"] if warnings else []
        text += "\n\n" + " and ".join(counts) + " generated."
    return text


def error_line(exc: BaseException, *, first: bool = False, with_type: bool = False) -> str:
    """An exception's message in one line, for a diagnostic: the one formatter of TVM's errors.

    TVM puts its reason last, after a backtrace or an IR dump whose underline lines (`^~~~`) are
    not words: by default the last line that has words. Other libraries (transformers, the hub)
    put it first: `first=True`. `with_type` keeps the exception's type (`TVMError: …`), which
    says which side failed when the error crossed a connection. An empty message gives the type.
    """
    lines = [line.strip() for line in str(exc).splitlines() if line.strip().strip("^~ ")]
    name = type(exc).__name__
    if not lines:
        return name
    line = lines[0] if first else lines[-1]
    return f"{name}: {line}" if with_type else line
