"""Shrinking a differential finding to a small reproducer: the fewest statements, and for an
example op the smallest sizes, that still check clean and fail the same way.

    python fuzz/shrink.py fuzz/work/diff/findings.jsonl [more.jsonl …] > fuzz/FINDINGS.md

reads the findings fuzz/diff_run.py wrote, checks each again with the checker as it is now, shrinks
each that still fails, groups those that shrink to the same schedule shape, and writes them as
Markdown: the op, the schedule, what went wrong, and the commands that reproduce it. A hang is not
shrunk (each try could take minutes).
"""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

if __package__ in (None, ""):  # run as a script
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fuzz.cases import Case, case_op
from fuzz.differential import Verdict, run_differential
from fuzz.sizes import define_flags
from schedlang.lang import nodes
from schedlang.lang.printer import format_schedule

SMALLER = (1, 2, 3, 5, 7, 9, 11, 13, 17)


def verdict_of(case: Case) -> Verdict | None:
    """The differential verdict of `case` as written (no repairs); None unless it checks clean."""
    from fuzz.properties import target_of
    from schedlang.checker.check import check
    from schedlang.core.diagnostics import DiagnosticError
    from schedlang.lang.syntax import parse

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
    from schedlang.checker.pipeline import bind_knobs
    from schedlang.lang.syntax import parse

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


def _text(items: list[nodes.Stmt]) -> str:
    return format_schedule(nodes.Schedule(tuple(items)))


def _without_empty_sections(items: list[nodes.Stmt]) -> list[nodes.Stmt]:
    kept = []
    for index, item in enumerate(items):
        following = items[index + 1] if index + 1 < len(items) else None
        if isinstance(item, nodes.BlockHeader) and (
            following is None or isinstance(following, nodes.BlockHeader)
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
    one_line = _one_line(case.text)
    check = (
        'TVM_NUM_THREADS=1 python -c "from fuzz.cases import Case; '
        "from fuzz.mutate import Example; from fuzz.nests import NestSpec; "
        "from fuzz.shrink import verdict_of; "
        f'print(verdict_of({case!r}))"'
    )
    if case.example is not None:
        flags = define_flags(case.example)
        return f'schedlang run examples/{case.example.op_file} {flags} -s "{one_line}"\n{check}'
    return check


SHRINKABLE = ("wrong", "out_of_bounds", "crash", "run_error", "build_error", "timeout")


def report(findings: list[dict]) -> str:
    """FINDINGS.md: each finding that still fails shrunk, those of one shape together; then those
    the checker now rejects or that now compute the right values."""
    groups: dict[tuple, list[tuple[Case, dict, str]]] = {}
    settled: list[tuple[Case, dict, str]] = []
    for finding in findings:
        case = case_from_record(finding)
        status = finding["message"].splitlines()[0]
        if finding["kind"] in SHRINKABLE:
            now = verdict_of(case)
            if now is None or now.ok:
                why = "the checker now rejects it" if now is None else "now verified"
                settled.append((case, finding, why))
                continue
            case = shrink(case, fails_as(finding["kind"]))
            status = (verdict_of(case) or now).describe()
        lines = tuple(x.split()[0] for x in case.text.split("\n") if x.strip())
        groups.setdefault((finding["kind"], _op_kind(case), lines), []).append(
            (case, finding, status)
        )
    checker = _checker_version()
    lines = ["# Differential fuzzing: findings", "", f"Checked again with {checker}.", ""]
    for number, members in enumerate(groups.values(), 1):
        small, finding, status = members[0]
        lines += [
            f"## {number}. {status.split(':')[0]} ({len(members)} input(s); shapes of issue 17: "
            f"{', '.join(finding.get('classes', [])) or 'none'})",
            "",
            f"op: `{small.op_text()}`",
            "",
            "```schedlang",
            small.text.rstrip(),
            "```",
            "",
            f"what went wrong: {status}",
            "",
            "reproduce:",
            "",
            "```",
            reproducer(small),
            "```",
            "",
        ]
        for other, _, other_status in members[1:]:
            lines += [f"- also `{other.op_text()}`: `{_one_line(other.text)}` ({other_status})"]
        lines += [""] if len(members) > 1 else []
    if settled:
        lines += ["## Found in the run, settled since", ""]
        for case, finding, why in settled:
            first = finding["message"].splitlines()[0]
            lines += [f"- {why}: `{case.op_text()}`: `{_one_line(case.text)}` (was: {first})"]
        lines += [""]
    return "\n".join(lines)


def _checker_version() -> str:
    """The commit, and whether schedlang/checker/check.py differs from it."""
    import subprocess

    root = Path(__file__).resolve().parent.parent
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, text=True,
                              capture_output=True, check=True).stdout.strip()  # fmt: skip
        dirty = subprocess.run(
            ["git", "diff", "--quiet", "--", "schedlang/checker/check.py"], cwd=root
        )
    except (OSError, subprocess.CalledProcessError):
        return "the working tree's checker"
    return f"the checker of commit {head}" + (
        " (schedlang/checker/check.py with changes not yet committed)" if dirty.returncode else ""
    )


def _op_kind(case: Case) -> str:
    return case.example.op_file if case.example is not None else case.nest.kind


def _one_line(text: str) -> str:
    return "; ".join(line.strip() for line in text.splitlines() if line.strip())


def case_from_record(finding: dict) -> Case:
    from fuzz.cases import live_case
    from fuzz.nests import ByteChooser

    case = live_case(ByteChooser(bytes.fromhex(finding["input"])))
    return replace(case, text=finding.get("schedule") or case.text)


def is_finding(record: dict) -> bool:
    """Not the worker failing to import or start schedlang while the tree was being edited."""
    message = record["message"]
    broken = ("ImportError", "ModuleNotFoundError", "did not start")
    return not (record["kind"] in ("run_error", "exception") and any(b in message for b in broken))


if __name__ == "__main__":
    records = [json.loads(line) for path in sys.argv[1:]
               for line in Path(path).read_text().splitlines() if line]  # fmt: skip
    print(report([r for r in records if is_finding(r)]))
