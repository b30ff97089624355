"""The report page: the contents (schedlang.report.contents) and their charts
(schedlang.report.charts) through one Jinja2 template, report.html.j2, into one HTML file that
needs nothing else: its styles inline, no script, no font, no image or request from elsewhere.

    write_report(Path("tune.db"), Path("report.html"))

The file is written whole or not at all: into a temporary file beside it, then renamed.
"""

from __future__ import annotations

import math
import os
import tempfile
from pathlib import Path

from schedlang.core.diagnostics import SchedlangError
from schedlang.core.units import format_seconds
from schedlang.report import charts
from schedlang.report.contents import Contents, ModelSection, OpSection, read_contents

TEMPLATE = Path(__file__).with_name("report.html.j2")


def render(contents: Contents, title: str) -> str:
    """The page's HTML."""
    from jinja2 import Environment, FileSystemLoader, StrictUndefined, select_autoescape
    from markupsafe import Markup
    from pygments import highlight
    from pygments.formatters import HtmlFormatter
    from pygments.lexers import PythonLexer

    from schedlang.lang.lexer import SchedlangLexer

    formatter = HtmlFormatter(nowrap=False, cssclass="code")

    def schedule_html(text: str) -> Markup:
        return Markup(highlight(text or "# the empty schedule\n", SchedlangLexer(), formatter))

    def tir_html(text: str) -> Markup:
        return Markup(highlight(text, PythonLexer(), formatter))  # TVMScript is Python

    environment = Environment(
        loader=FileSystemLoader(TEMPLATE.parent),
        autoescape=select_autoescape(["j2", "html"]),
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    environment.filters["seconds"] = format_seconds
    environment.filters["times"] = lambda before, after: (
        charts.speedup(before / after) if before and after else "-"
    )
    environment.filters["schedule"] = schedule_html
    environment.filters["tir"] = tir_html
    template = environment.get_template(TEMPLATE.name)
    return template.render(
        title=title,
        contents=contents,
        ops=[(f"op-{index}", op, Markup(_curve(op))) for index, op in enumerate(contents.ops)],
        models=[
            (f"model-{index}", model, *map(Markup, _model_charts(model)))
            for index, model in enumerate(contents.models)
        ],
        code_css=Markup(formatter.get_style_defs(".code")),
    )


def _curve(op: OpSection) -> str:
    series: dict[str, list[float | None]] = {}
    for record in op.records:
        value = record.gflops if record.is_ok and record.gflops else None
        series.setdefault(record.proposer, []).append(value)
    return charts.curve_svg(series, op.baselines, f"tuning curve of {op.title}")


def _model_charts(model: ModelSection) -> tuple[str, str, str, str]:
    """Its functions' times in the tuned model (the largest first), its estimated latency against
    trials, the trials each function got, and its end-to-end latencies ("" where nothing to
    draw)."""
    tasks = sorted(model.tasks, key=lambda task: -(task.after_s or 0))
    rows = [(task.name, task.before_s, task.after_s) for task in tasks]
    functions = charts.function_bars_svg(rows, f"time per function of {model.name}")
    curve = ""
    if model.curve:
        curve = charts.latency_curve_svg(
            model.curve, f"estimated latency of {model.name} against trials"
        )
    trials = ""
    if any(task.trials for task in tasks):
        by_trials = sorted(tasks, key=lambda task: -task.trials)
        trials = charts.trial_bars_svg(
            [(task.name, task.trials) for task in by_trials], f"trials per function of {model.name}"
        )
    latencies = [
        (label, median)
        for label, median, _ in model.timings
        if median is not None and math.isfinite(median)
    ]
    bars = charts.latency_bars_svg(latencies, f"end-to-end latency of {model.name}")
    return functions, curve, trials, bars if latencies else ""


def write_report(database: Path, output: Path, *, lower_best: bool = True) -> Contents:
    """Read `database` and write its report to `output`, whole or not at all; the contents."""
    contents = read_contents(database, lower_best=lower_best)
    html = render(contents, database.name)
    write_whole(output, html)
    return contents


def write_whole(path: Path, text: str) -> None:
    """`text` into `path` through a temporary file beside it and a rename: a reader (a browser
    reloading the page) sees the old file or the new one, never half of one."""
    folder = path.parent if str(path.parent) else Path(".")
    try:
        handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=folder)
    except OSError as err:
        raise SchedlangError(f"cannot write {path}: {err.strerror or err}") from None
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            out.write(text)
        os.chmod(temporary, 0o644)
        os.replace(temporary, path)
    except OSError as err:
        Path(temporary).unlink(missing_ok=True)
        raise SchedlangError(f"cannot write {path}: {err.strerror or err}") from None
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
