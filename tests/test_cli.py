"""The command line: what each command prints, where, and with which exit code."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import pytest
import typer
from typer.testing import CliRunner

from schedlang import __version__, cli

FORMATTED = "param T in [8, 16]\nblock C:\n  split i by T  # knob\n  vectorize i.i\n"
UNFORMATTED = "param T in [ 8,16 ]\nblock C:\nsplit i by T # knob\n\n\nvectorize  i.i\n"
BROKEN = "block C:\n  vectorise i\n  split j by\n"


@pytest.fixture
def run():
    runner = CliRunner()

    def invoke(*args: str, input: str | bytes | None = None):
        return runner.invoke(cli.app, list(args), input=input)

    return invoke


def write(tmp_path, name: str, text: str):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_version(run):
    result = run("--version")
    assert result.exit_code == 0
    lines = result.stdout.splitlines()
    assert lines[0] == f"schedlang {__version__}"
    assert lines[1].startswith("TVM ")


def test_no_arguments_shows_help(run):
    result = run()
    assert "fmt" in result.output and "parse" in result.output


# --- fmt -----------------------------------------------------------------------------------------


def test_fmt_rewrites_a_file_in_place(run, tmp_path):
    path = write(tmp_path, "m.sched", UNFORMATTED)
    result = run("fmt", str(path))
    assert result.exit_code == 0, result.output
    assert path.read_text(encoding="utf-8") == (
        "param T in [8, 16]\nblock C:\n  split i by T  # knob\n\n  vectorize i.i\n"
    )
    assert result.stderr == f"reformatted {path}\n"
    assert result.stdout == ""


def test_fmt_leaves_a_formatted_file_alone(run, tmp_path):
    path = write(tmp_path, "m.sched", FORMATTED)
    modified = path.stat().st_mtime_ns
    result = run("fmt", str(path))
    assert result.exit_code == 0
    assert result.output == ""
    assert path.stat().st_mtime_ns == modified


def test_fmt_check_on_a_formatted_file_exits_0(run, tmp_path):
    path = write(tmp_path, "m.sched", FORMATTED)
    result = run("fmt", "--check", str(path))
    assert result.exit_code == 0
    assert result.output == ""


def test_fmt_check_names_the_files_that_would_change_and_exits_1(run, tmp_path):
    formatted = write(tmp_path, "a.sched", FORMATTED)
    unformatted = write(tmp_path, "b.sched", UNFORMATTED)
    result = run("fmt", "--check", str(formatted), str(unformatted))
    assert result.exit_code == 1
    assert result.stderr == f"would reformat {unformatted}\n"
    assert unformatted.read_text(encoding="utf-8") == UNFORMATTED  # --check writes nothing


def test_fmt_diff_prints_a_unified_diff_and_writes_nothing(run, tmp_path):
    path = write(tmp_path, "m.sched", UNFORMATTED)
    result = run("fmt", "--diff", str(path))
    assert result.exit_code == 0
    assert f"--- {path} (original)\n+++ {path} (formatted)\n" in result.stdout
    assert "-split i by T # knob\n+  split i by T  # knob\n" in result.stdout
    assert path.read_text(encoding="utf-8") == UNFORMATTED
    assert run("fmt", "--check", "--diff", str(path)).exit_code == 1


def test_fmt_stdin_to_stdout(run):
    result = run("fmt", "-", input=UNFORMATTED)
    assert result.exit_code == 0
    assert (
        result.stdout == "param T in [8, 16]\nblock C:\n  split i by T  # knob\n\n  vectorize i.i\n"
    )
    assert run("fmt", "--check", "-", input=UNFORMATTED).exit_code == 1
    assert run("fmt", "--check", "-", input=FORMATTED).exit_code == 0


def test_fmt_of_a_broken_file_reports_every_error_and_exits_1(run, tmp_path):
    path = write(tmp_path, "broken.sched", BROKEN)
    result = run("fmt", str(path))
    assert result.exit_code == 1
    assert result.stdout == ""
    assert result.stderr.startswith(f"{path}:2:3: error: unknown statement `vectorise`\n")
    assert f"{path}:3:13: error: expected a factor" in result.stderr
    assert " 2 |   vectorise i\n   |   ^~~~~~~~~\n" in result.stderr
    assert result.stderr.endswith("2 errors generated.\n")
    assert "Traceback" not in result.output
    assert "\x1b[" not in result.stderr  # no colour outside a terminal
    assert path.read_text(encoding="utf-8") == BROKEN


def test_fmt_formats_the_good_files_even_when_one_is_broken(run, tmp_path):
    broken = write(tmp_path, "broken.sched", BROKEN)
    good = write(tmp_path, "good.sched", UNFORMATTED)
    result = run("fmt", str(broken), str(good))
    assert result.exit_code == 1
    assert good.read_text(encoding="utf-8") != UNFORMATTED


def test_fmt_of_a_missing_and_a_binary_file(run, tmp_path):
    binary = tmp_path / "x.bin"
    binary.write_bytes(b"\x00\x01\x02")
    result = run("fmt", str(tmp_path / "missing.sched"), str(binary))
    assert result.exit_code == 1
    assert f"error: cannot read {tmp_path / 'missing.sched'}: No such file" in result.stderr
    assert f"error: {binary} is a binary file, not a schedule" in result.stderr
    assert "Traceback" not in result.output


def test_fmt_of_non_utf8_stdin(run):
    result = run("fmt", "-", input=b"split i by 4 # caf\xe9\n")
    assert result.exit_code == 1
    assert result.stderr.startswith("error: <stdin> is not valid UTF-8 (byte 0xe9)\n")


# --- parse ---------------------------------------------------------------------------------------


def test_parse_emit_ast_prints_the_ast_as_json(run, tmp_path):
    path = write(tmp_path, "m.sched", "block C:\n  split i by *, 4  # two ways\n")
    result = run("parse", str(path), "--emit", "ast")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["kind"] == "Schedule"
    assert data["file"] == str(path)
    header, split, comment = data["items"]
    assert header == {
        "kind": "BlockHeader",
        "block": {"kind": "Name", "text": "C", "span": [1, 7, 1, 8]},
        "span": [1, 1, 1, 9],
    }
    assert split["kind"] == "Split"
    assert split["axis"]["text"] == "i"
    assert [f["kind"] for f in split["factors"]] == ["InferredFactor", "IntFactor"]
    assert split["factors"][1]["value"] == 4
    assert split["span"] == [2, 3, 2, 18]
    assert comment["kind"] == "Comment"
    assert comment["text"] == "two ways"
    assert comment["trailing"] is True
    assert '"span": [2, 3, 2, 18]' in result.stdout  # number lists stay on one line


def test_parse_emits_ast_by_default_and_reads_stdin(run):
    result = run("parse", "-", input="unroll k\n")
    assert result.exit_code == 0
    data = json.loads(result.stdout)
    assert data["file"] == "<stdin>"
    assert data["items"][0]["kind"] == "Unroll"


def test_parse_prints_warnings_on_stderr_and_still_succeeds(run):
    result = run("parse", "-", input="param T in [8, 8]\n")
    assert result.exit_code == 0
    assert "warning: knob `T` lists a value twice" in result.stderr
    assert json.loads(result.stdout)["items"][0]["kind"] == "Param"


def test_parse_of_a_broken_file(run, tmp_path):
    path = write(tmp_path, "broken.sched", BROKEN)
    result = run("parse", str(path))
    assert result.exit_code == 1
    assert result.stdout == ""
    assert "2 errors generated." in result.stderr
    assert "Traceback" not in result.output


def test_parse_rejects_an_unknown_emit_value(run, tmp_path):
    path = write(tmp_path, "m.sched", FORMATTED)
    result = run("parse", str(path), "--emit", "tir-soup")
    assert result.exit_code == 2
    assert "tir-soup" in result.output


# --- errors never become tracebacks --------------------------------------------------------------


def test_an_unexpected_exception_is_an_internal_error(run, tmp_path, monkeypatch):
    def explode(schedule):
        raise ZeroDivisionError("division by zero")

    monkeypatch.setattr("schedlang.lang.printer.format_schedule", explode)
    path = write(tmp_path, "m.sched", FORMATTED)
    result = run("fmt", str(path))
    assert result.exit_code == 2
    assert result.stderr.startswith("internal error: ZeroDivisionError: division by zero\n")
    assert "please report it" in result.stderr
    assert "Traceback" not in result.output


def test_a_schedlang_error_from_any_command_exits_1(run):
    @cli.reports_errors
    def failing() -> None:
        raise cli.SchedlangError("the op file defines no PrimFunc", "define one with @schedlang.op")

    with pytest.raises(cli.typer.Exit) as info:
        failing()
    assert info.value.exit_code == 1


def test_console_script_reports_a_broken_file_without_a_traceback(tmp_path):
    path = write(tmp_path, "broken.sched", BROKEN)
    code = "import sys; from schedlang.cli import main; sys.argv[0] = 'schedlang'; main()"
    result = subprocess.run(
        [sys.executable, "-c", code, "fmt", str(path)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 1
    assert "error: unknown statement `vectorise`" in result.stderr
    assert "Traceback" not in result.stderr


def test_fmt_and_version_do_not_import_tvm():
    code = (
        "import sys; from typer.testing import CliRunner; from schedlang import cli; "
        "CliRunner().invoke(cli.app, ['--version']); "
        "CliRunner().invoke(cli.app, ['fmt', '-'], input='split i by 4'); "
        "assert 'tvm' not in sys.modules, 'tvm was imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


# --- issue 17: inputs that ended in an internal error (exit 2), a traceback or a signal ----------

MATMUL = str(Path(__file__).resolve().parent.parent / "examples" / "matmul.py")
SMALL = ("-D", "M=16", "-D", "N=16", "-D", "K=16")
SKYLAKE = '{"kind": "llvm", "mcpu": "skylake-avx512"}'


@pytest.fixture
def avx2_host(monkeypatch):
    """This machine as an AVX2 host without AVX-512, whatever it really is."""
    from schedlang.core import target as target_module

    flags = "fpu sse sse2 pni ssse3 sse4_1 sse4_2 popcnt abm movbe bmi1 bmi2 f16c fma avx avx2"
    monkeypatch.setattr(target_module, "_host_cpu_flags", lambda: frozenset(flags.split()))
    target_module._missing_host_features.cache_clear()
    yield
    target_module._missing_host_features.cache_clear()


def test_regression_run_and_tune_refuse_a_cpu_this_machine_is_not(run, avx2_host, tmp_path):
    """It died of SIGILL, exit 132, with no message; building for that CPU is still fine."""
    for command in (
        ("run", MATMUL, *SMALL),
        ("tune", MATMUL, *SMALL, "--db", str(tmp_path / "t.db")),
    ):
        result = run(*command, "-t", SKYLAKE)
        assert result.exit_code == 1, result.output
        assert result.stderr.startswith(
            "error: kernels built for CPU `skylake-avx512` may use avx512bw, avx512cd, avx512dq, "
            "avx512f, avx512vl, which this machine's CPU"
        )
    assert not (tmp_path / "t.db").exists()  # refused before anything was started
    result = run("compile", MATMUL, *SMALL, "-t", SKYLAKE, "-s", "split i by 4", "--emit", "tir")
    assert result.exit_code == 0, result.output


def test_regression_a_negative_shape_parameter_exits_1_naming_it(run):
    result = run("run", MATMUL, "-D", "M=-4", "-s", "split j by 4")
    assert result.exit_code == 1
    assert result.stderr.startswith("error: -D M=-4: shape parameter `M` must be positive\n")
    result = run("show", MATMUL, "-D", "N=-5")
    assert result.exit_code == 1 and "`N` must be positive" in result.stderr


@pytest.mark.parametrize(
    "schedule",
    [
        "storage_align C dim 0 factor 9223372036854775808 offset 0",
        "param T in range(1, 9223372036854775808); split i by T",
        "pragma i auto_unroll_max_step=9223372036854775808",
        "split i by 1" + "0" * 5000,
    ],
)
def test_regression_an_integer_beyond_int32_exits_1_with_the_limit(run, schedule):
    result = run("check", MATMUL, *SMALL, "-s", schedule)
    assert result.exit_code == 1, result.output
    assert "is too large: the limit is 2^31-1 (2147483647)" in result.stderr


def test_regression_a_knob_value_beyond_int32_exits_1(run):
    result = run("check", MATMUL, *SMALL, "-s", "split i by T", "-k", "T=" + "9" * 31)
    assert result.exit_code == 1
    assert result.stderr.startswith("error: -k T: integer too large: the limit is 2^31-1")


def test_regression_a_deeply_nested_target_exits_1(run):
    deep = '{"kind": "llvm", "x": ' + "[" * 50_000 + "]" * 50_000 + "}"
    result = run("check", MATMUL, *SMALL, "-s", "split i by 4", "-t", deep)
    assert result.exit_code == 1
    assert result.stderr.startswith("error: target spec is nested 50001 levels deep")


def test_regression_an_op_file_raising_keyboard_interrupt_exits_1_not_130(run, tmp_path):
    path = write(tmp_path, "interrupt.py", "import schedlang\n\nraise KeyboardInterrupt\n")
    result = run("show", str(path))
    assert result.exit_code == 1
    assert result.stderr == f"error: {path}:3: op file raised KeyboardInterrupt\n" + (
        "  = note: line: raise KeyboardInterrupt\n"
    )


# --- issue 15: one command shape, --json, --quiet/--verbose, python -m, completion -------------

SCHEDULE = "split j by 4\nreorder i, k, j.o, j.i\nvectorize j.i\n"


@pytest.mark.parametrize(
    "command",
    [
        ("check",),
        ("compile", "--emit", "tir"),
        ("export", "--trace-json", "TRACE"),
    ],
)
def test_a_schedule_is_taken_the_same_way_by_every_command(run, tmp_path, command):
    """`OP SCHEDULE`, `OP --schedule SCHEDULE` and `OP -s TEXT` mean the same everywhere."""
    path = write(tmp_path, "m.sched", SCHEDULE)
    name, *options = command
    options = [str(tmp_path / "t.json") if o == "TRACE" else o for o in options]
    outputs = []
    for form in ([str(path)], ["--schedule", str(path)], ["-s", SCHEDULE]):
        result = run(name, MATMUL, *form, *SMALL, *options)
        assert result.exit_code == 0, (form, result.output)
        outputs.append(result.stdout.replace(str(path), "FILE").replace("<-s>", "FILE"))
    assert outputs[0] == outputs[1] == outputs[2]


def test_run_takes_the_schedule_as_its_second_argument(run, tmp_path):
    path = write(tmp_path, "m.sched", SCHEDULE)
    result = run("run", MATMUL, str(path), *SMALL, "--repeat", "1", "--no-baseline")
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("matmul on llvm") and str(path) in result.stdout


def test_a_schedule_given_twice_is_refused_naming_both(run, tmp_path):
    path = write(tmp_path, "m.sched", SCHEDULE)
    for twice in (
        [str(path), "-s", "split i by 4"],
        [str(path), "--schedule", str(path)],
        ["--schedule", str(path), "-s", "split i by 4"],
    ):
        result = run("compile", MATMUL, *twice, *SMALL, "--emit", "tir")
        assert result.exit_code == 1
        assert result.stderr.startswith("error: give the schedule once, not ")
        assert "Traceback" not in result.output


def test_python_dash_m_schedlang_is_the_command(tmp_path):
    path = write(tmp_path, "broken.sched", BROKEN)
    result = subprocess.run(
        [sys.executable, "-m", "schedlang", "fmt", "--check", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1
    assert "error: unknown statement `vectorise`" in result.stderr
    result = subprocess.run(
        [sys.executable, "-m", "schedlang", "--help"], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0 and "python -m schedlang [OPTIONS] COMMAND" in result.stdout


def _complete(words: str) -> list[str]:
    """What the shell script of `schedlang --install-completion` (bash) gets offered."""
    env = {
        "_SCHEDLANG_COMPLETE": "complete_bash",
        "COMP_WORDS": words,
        "COMP_CWORD": str(len(words.split()) - (0 if words.endswith(" ") else 1)),
    }
    result = CliRunner().invoke(cli.app, [], prog_name="schedlang", env=env)
    assert result.exit_code == 0, result.output
    return result.stdout.split()


def test_shell_completion_of_commands_options_and_targets():
    assert _complete("schedlang tu") == ["tune", "tune-model"]
    assert "--target" in _complete("schedlang check --ta")
    assert _complete("schedlang check x.py --target l") == ["llvm"]
    # A file argument offers no words: the shell completes it as a file (`complete -o default`).
    assert _complete("schedlang check examples/ma") == []
    result = CliRunner().invoke(cli.app, ["--help"])
    assert "--install-completion" in result.stdout


def test_check_json_on_success(run):
    result = run("check", MATMUL, *SMALL, "-s", "param T in [2, 4]\nsplit i by T", "--json")
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert document == {
        "schema": 1,
        "command": "check",
        "ok": True,
        "file": "<-s>",
        "op": "matmul",
        "target": "llvm",
        "kind": "template",
        "knob_settings": 2,
        "diagnostics": [],
    }


def test_check_json_lists_every_diagnostic_with_position_notes_and_fixits(run):
    result = run(
        "check", MATMUL, *SMALL, "-s", "split i by 4\nvectorise i.i\nsplit q by 2", "--json"
    )
    assert result.exit_code == 1
    assert result.stderr == ""
    document = json.loads(result.stdout)
    assert (document["schema"], document["command"], document["ok"]) == (1, "check", False)
    [misspelt] = [d for d in document["diagnostics"] if "vectorise" in d["message"]]
    assert misspelt == {
        "severity": "error",
        "message": "unknown statement `vectorise`",
        "file": "<-s>",
        "line": 2,
        "column": 1,
        "end_line": 2,
        "end_column": 10,
        "notes": misspelt["notes"],
        "fixits": [
            {
                "file": "<-s>",
                "line": 2,
                "column": 1,
                "end_line": 2,
                "end_column": 10,
                "replacement": "vectorize",
            }
        ],
    }
    assert misspelt["notes"][0] == "did you mean `vectorize`?"


def test_check_json_of_a_checker_error_has_no_fixit_without_a_suggestion(run):
    result = run("check", MATMUL, *SMALL, "-s", "split q by 2", "--json")
    assert result.exit_code == 1
    [diagnostic] = json.loads(result.stdout)["diagnostics"]
    assert diagnostic["message"] == "unknown axis `q` in block C"
    assert (diagnostic["line"], diagnostic["column"]) == (1, 7)
    assert diagnostic["notes"] == ["axes of block C: i, j, k"] and diagnostic["fixits"] == []


def test_a_fixit_replaces_only_the_quoted_word():
    from schedlang.core.diagnostics import Span, error

    source = "split i by 4; vectorize i.ii\n"
    span = Span("f", 1, 25, 1, 29)
    axis = error("unknown axis `i.ii` in block C", span, "did you mean `i.i`?")
    assert axis.fixits(source) == [
        {
            "file": "f",
            "line": 1,
            "column": 25,
            "end_line": 1,
            "end_column": 29,
            "replacement": "i.i",
        }
    ]
    # The span covers more than the quoted word: applying the note would rewrite too much.
    wide = error("unknown axis `i.ii` in block C", Span("f", 1, 15, 1, 29), "did you mean `i.i`?")
    assert wide.fixits(source) == [] and axis.fixits(None) == []


def test_json_errors_before_the_check_are_json_too(run, tmp_path):
    result = run("check", MATMUL, "-D", "N=-5", "-s", "split i by 4", "--json")
    assert result.exit_code == 1 and result.stderr == ""
    document = json.loads(result.stdout)
    assert document["ok"] is False
    [diagnostic] = document["diagnostics"]
    assert diagnostic["message"] == "-D N=-5: shape parameter `N` must be positive"
    assert diagnostic["file"] is None and diagnostic["fixits"] == []
    result = run("best", MATMUL, *SMALL, "--db", str(tmp_path / "none.db"), "--json")
    assert result.exit_code == 1
    assert json.loads(result.stdout)["command"] == "best"


def test_json_of_an_internal_error_is_json_and_exits_2(run, monkeypatch):
    def explode(*args, **kwargs):
        raise ZeroDivisionError("division by zero")

    monkeypatch.setattr("schedlang.checker.check.check", explode)
    result = run("check", MATMUL, *SMALL, "-s", "split i by 4", "--json")
    assert result.exit_code == 2
    [diagnostic] = json.loads(result.stdout)["diagnostics"]
    assert diagnostic["message"] == "internal error: ZeroDivisionError: division by zero"
    assert "Traceback" not in result.stderr


def test_verbose_shows_the_traceback_of_an_internal_error(run, monkeypatch):
    def explode(*args, **kwargs):
        raise ZeroDivisionError("division by zero")

    monkeypatch.setattr("schedlang.checker.check.check", explode)
    result = run("check", MATMUL, *SMALL, "-s", "split i by 4", "--verbose")
    assert result.exit_code == 2 and "Traceback" in result.stderr
    assert "internal error: ZeroDivisionError" in result.stderr


def test_quiet_prints_errors_only(run):
    warned = "split i by 3"  # a split that does not divide: a guard warning
    result = run("check", MATMUL, *SMALL, "-s", warned)
    assert result.exit_code == 0 and "warning" in result.stderr and "ok for matmul" in result.stdout
    for quiet in (["check", "-q"], ["-q", "check"], ["--quiet", "check"]):
        result = run(*quiet, MATMUL, *SMALL, "-s", warned)
        assert result.exit_code == 0 and result.output == "", quiet
    result = run("check", "-q", MATMUL, *SMALL, "-s", "vectorise i")
    assert result.exit_code == 1 and "unknown statement `vectorise`" in result.stderr


def test_quiet_and_verbose_together_are_refused(run):
    result = run("check", MATMUL, *SMALL, "-s", "split i by 4", "-q", "-v")
    assert result.exit_code == 1 and result.stderr == "error: give --quiet or --verbose, not both\n"
    result = run("-q", "-v", "check", MATMUL)
    assert result.exit_code == 1 and "not both" in result.stderr


def test_compile_quiet_writes_only_what_was_written(run, tmp_path):
    out = tmp_path / "m.so"
    warned = ["-s", "split i by 3", "--no-verify"]  # a guard warning
    result = run("compile", MATMUL, *SMALL, *warned, "-o", str(out), "-q")
    assert result.exit_code == 0, result.output
    assert result.stdout == f"wrote {out}\n" and result.stderr == ""  # the guard warning too


def test_check_json_keeps_the_warnings_of_a_schedule_that_passes(run):
    result = run("check", MATMUL, *SMALL, "-s", "split i by 3", "--json")
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert document["ok"] is True and result.stderr == ""
    [warned] = document["diagnostics"]
    assert warned["severity"] == "warning" and (warned["line"], warned["column"]) == (1, 1)


def test_fmt_quiet_rewrites_without_a_word(run, tmp_path):
    path = write(tmp_path, "m.sched", UNFORMATTED)
    result = run("-q", "fmt", str(path))
    assert result.exit_code == 0 and result.output == ""
    assert path.read_text(encoding="utf-8") != UNFORMATTED


@dataclass(frozen=True)
class _Pair:
    first: Annotated[int, typer.Option("--first")] = 1
    second: Annotated[int, typer.Option("--second")] = 2


def test_an_options_group_is_spread_into_the_command_line():
    """`@expands_options`: a group's fields are options where the group parameter stands, and
    the command gets the group built from them."""
    from schedlang.cli.options import expands_options

    app = typer.Typer()

    @app.command()
    @expands_options
    def add(label: Annotated[str, typer.Argument()], *, pair: _Pair) -> None:
        typer.echo(f"{label} {pair.first + pair.second} {type(pair).__name__}")

    assert CliRunner().invoke(app, ["sum", "--second", "5"]).stdout == "sum 6 _Pair\n"
    assert "--first" in CliRunner().invoke(app, ["--help"]).stdout


def test_seconds_read_in_their_unit():
    from schedlang.core.units import format_seconds

    assert [format_seconds(s) for s in (2.5, 1.5e-3, 2e-6, 3e-9)] == [
        "2.5 s",
        "1.5 ms",
        "2 us",
        "3 ns",
    ]
    assert (format_seconds(None), format_seconds(None, "—")) == ("-", "—")


# --- the build spinner ---------------------------------------------------------------------------


class _Status:
    """A stand-in for rich's Status: what DelayedStatus did with it."""

    def __init__(self, text):
        self.text, self.events = text, []

    def start(self):
        self.events.append("start")

    def stop(self):
        self.events.append("stop")


def test_a_quick_build_shows_no_spinner():
    from schedlang.cli.spinner import DelayedStatus

    made = []
    with DelayedStatus("building", lambda text: made.append(_Status(text)), delay_s=60):
        pass
    assert made == []


def test_a_long_build_shows_the_spinner_until_it_ends():
    import time

    from schedlang.cli.spinner import DelayedStatus

    made: list[_Status] = []

    def start(text):
        made.append(_Status(text))
        return made[-1]

    with DelayedStatus("building for llvm", start, delay_s=0.01):
        deadline = time.monotonic() + 5
        while not made and time.monotonic() < deadline:
            time.sleep(0.01)
        assert made and made[0].events == ["start"]
    assert made[0].events == ["start", "stop"]


def test_the_spinner_shows_the_time_elapsed():
    from schedlang.cli.spinner import Elapsed

    now = [100.0]
    text = Elapsed("building for llvm", clock=lambda: now[0])
    now[0] += 3.25
    assert text.__rich__() == "building for llvm (3.25 s)"


def test_each_build_runs_inside_the_watcher():
    from contextlib import contextmanager

    from schedlang.core.ops import load_op
    from schedlang.core.target import resolve_target
    from schedlang.run.build import compile_func, watching_builds

    seen = []

    @contextmanager
    def watcher(target):
        seen.append(target.kind)
        yield

    op = load_op(MATMUL, dict(d.split("=") for d in SMALL[1::2]))
    with watching_builds(watcher):
        compile_func(op.func, resolve_target("llvm"))
    compile_func(op.func, resolve_target("llvm"))  # no longer watched
    assert seen == ["llvm"]


def test_compile_shows_no_spinner_when_stderr_is_not_a_terminal(run, tmp_path):
    result = run("compile", MATMUL, *SMALL, "-s", "split i by 4", "--emit", "source")
    assert result.exit_code == 0, result.output
    assert "building for" not in result.stderr


def test_compile_and_run_show_the_spinner_on_a_terminal(run, monkeypatch):
    from schedlang.cli import spinner

    monkeypatch.setattr(spinner, "shows_spinner", lambda: True)
    monkeypatch.setattr(spinner, "DELAY_S", 0.0)
    shown = []
    monkeypatch.setattr(spinner.DelayedStatus, "_show", lambda self, text: shown.append(text))
    result = run("compile", MATMUL, *SMALL, "-s", "split i by 4", "--emit", "source")
    assert result.exit_code == 0, result.output
    result = run("run", MATMUL, *SMALL, "-s", "split i by 4", "--repeat", "1")
    assert result.exit_code == 0, result.output
    assert [text.what for text in shown][:1] == ["building for llvm"]
