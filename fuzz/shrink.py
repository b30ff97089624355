"""Shrinking a differential finding to a small reproducer: the fewest statements, and for an
example op the smallest sizes, that still check clean and fail the same way.

    python fuzz/shrink.py fuzz/work/diff/findings.jsonl > fuzz/FINDINGS.md

reads the findings fuzz/diff_run.py wrote, shrinks each, groups those that shrink to the same
schedule shape, and writes them as Markdown: the op, the schedule, what went wrong, and the
commands that reproduce it.
"""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

if __package__ in (None, ""):  # run as a script
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fuzz.cases import Case, case_op  # noqa: E402
from fuzz.differential import Verdict, run_differential  # noqa: E402
from fuzz.sizes import define_flags  # noqa: E402
from schedlang import ast  # noqa: E402
from schedlang.printer import format_schedule  # noqa: E402

SMALLER = (1, 2, 3, 5, 7, 9, 11, 13, 17)


def verdict_of(case: Case) -> Verdict | None:
    """The differential verdict of `case` as written (no repairs); None unless it checks clean."""
    from fuzz.properties import target_of
    from schedlang.check import check
    from schedlang.diagnostics import DiagnosticError
    from schedlang.syntax import parse

    try:
        result = check(parse(case.text), case_op(case).func, target_of(False))
    except DiagnosticError:
        return None
    if result.lowered is None:
        return None
    return run_differential(case_op(case), result.lowered.func)


def fails_as(kind: str):
    """Whether a case checks clean and its verdict is `kind`."""

    def fails(candidate: Case) -> bool:
        try:
            verdict = verdict_of(candidate)
        except Exception:  # an op the sizes make invalid, say
            return False
        return verdict is not None and verdict.kind == kind

    return fails


def shrink(case: Case, fails) -> Case:
    """`case` with statements dropped, and an example op's sizes lowered, while `fails` holds
    (fails_as(kind): it checks clean and fails the same way)."""
    from schedlang.lower import bind_knobs
    from schedlang.syntax import parse

    schedule = parse(case.text)
    values = {p.name.text: next(iter(p.choices), 1) for p in schedule.params}
    concrete = bind_knobs(schedule, values)
    items = list(concrete.statements)
    candidate = replace(case, text=_text(items))
    if fails(candidate):
        case = candidate
    else:
        items = [*schedule.params, *schedule.statements]
    changed = True
    while changed:
        changed = False
        for index in range(len(items)):
            fewer = items[:index] + items[index + 1 :]
            candidate = replace(case, text=_text(fewer))
            if fewer and fails(candidate):
                items, case, changed = fewer, candidate, True
                break
    case = replace(case, text=_text(_without_empty_sections(items)))
    if case.example is not None:
        case = _smaller_sizes(case, fails)
    return case


def _text(items: list[ast.Stmt]) -> str:
    return format_schedule(ast.Schedule(tuple(items)))


def _without_empty_sections(items: list[ast.Stmt]) -> list[ast.Stmt]:
    kept = []
    for index, item in enumerate(items):
        following = items[index + 1] if index + 1 < len(items) else None
        if isinstance(item, ast.BlockHeader) and (
            following is None or isinstance(following, ast.BlockHeader)
        ):
            continue
        kept.append(item)
    return kept


def _smaller_sizes(case: Case, fails) -> Case:
    example = case.example
    for position in range(len(example.defines)):
        name, value = example.defines[position]
        if not value.isdigit():
            continue
        for smaller in (v for v in SMALLER if v < int(value)):
            defines = list(example.defines)
            defines[position] = (name, str(smaller))
            candidate = replace(case, example=replace(example, defines=tuple(defines)))
            if fails(candidate):
                case, example = candidate, candidate.example
                break
    return case


def reproducer(case: Case) -> str:
    """Commands that show the finding: `schedlang run` for an example op (which does not poison
    memory, so it may pass where the fuzzer's run fails), and the fuzzer's own check."""
    one_line = "; ".join(line.strip() for line in case.text.splitlines() if line.strip())
    check = (
        "TVM_NUM_THREADS=1 python - <<'EOF'\n"
        "from fuzz.cases import Case\nfrom fuzz.mutate import Example\n"
        "from fuzz.nests import NestSpec\nfrom fuzz.shrink import verdict_of\n\n"
        "if __name__ == '__main__':\n"
        f"    print(verdict_of({case!r}))\nEOF"
    )
    if case.example is not None:
        flags = define_flags(case.example)
        return f'schedlang run examples/{case.example.op_file} {flags} -s "{one_line}"\n{check}'
    return check


def report(findings: list[dict]) -> str:
    """FINDINGS.md: each finding shrunk, those of one shape together."""
    groups: dict[tuple, list[tuple[Case, dict, Verdict]]] = {}
    for finding in findings:
        case = case_from_record(finding)
        differential = finding["kind"] not in ("internal", "exception")
        small = shrink(case, fails_as(finding["kind"])) if differential else case
        verdict = verdict_of(small) if differential else None
        shape = (finding["kind"], tuple(line.split()[0] for line in small.text.splitlines()))
        groups.setdefault(shape, []).append((small, finding, verdict))
    lines = ["# Differential fuzzing: findings", ""]
    for number, members in enumerate(groups.values(), 1):
        small, finding, verdict = members[0]
        reason = verdict.describe() if verdict else finding["message"].splitlines()[0]
        lines += [
            f"## {number}. {reason.split(':')[0]} ({len(members)} input(s); classes: "
            f"{', '.join(finding.get('classes', [])) or 'none of A-D'})",
            "",
            f"op: `{small.op_text()}`",
            "",
            "```schedlang",
            small.text.rstrip(),
            "```",
            "",
            f"what went wrong: {reason}",
            "",
            "reproduce:",
            "",
            "```",
            reproducer(small),
            "```",
            "",
        ]
    return "\n".join(lines)


def case_from_record(finding: dict) -> Case:
    from fuzz.cases import live_case
    from fuzz.nests import ByteChooser

    case = live_case(ByteChooser(bytes.fromhex(finding["input"])))
    return replace(case, text=finding.get("schedule") or case.text)


if __name__ == "__main__":
    records = [json.loads(line) for line in Path(sys.argv[1]).read_text().splitlines() if line]
    print(report(records))
