"""A model with a symbolic dimension (issue 45, item 2): a model file declares it the way
torch.export does (`dynamic_shapes`, a third item beside the module and its example inputs),
`tune-model` tunes each function whose extents are symbolic at `--lengths` (one schedule for every
length, recorded under the symbolic function's key), lists the symbolic variables and the lengths
it measured, and `build-model` applies those schedules and verifies the build at two lengths.
"""

from __future__ import annotations

import importlib.util
import re

import pytest
from typer.testing import CliRunner

from schedlang.cli import app

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("torch") is None, reason="torch is not installed"
)

MODEL = """
import torch
import schedlang


class Mlp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up = torch.nn.Linear(16, 32)
        self.down = torch.nn.Linear(32, 8)

    def forward(self, x):
        return self.down(torch.relu(self.up(x)))


@schedlang.model
def mlp(max_rows: int = 64):
    torch.manual_seed(0)
    x = torch.randn(6, 16)
    return Mlp().eval(), (x,), {"x": {0: torch.export.Dim("rows", max=max_rows)}}
"""


@pytest.fixture
def model_file(tmp_path):
    path = tmp_path / "rows.py"
    path.write_text(MODEL)
    return str(path)


def test_a_model_file_declares_a_symbolic_dimension_with_dynamic_shapes(model_file):
    from schedlang.models.model_file import load_model, symbolic_lengths
    from schedlang.models.tune_model import model_lengths

    model = load_model(model_file)
    ((_, bounds),) = symbolic_lengths(model.mod).items()
    assert bounds == (1, 64)  # at least one row, at most torch.export's max
    assert model_lengths(model) == (1, 16, 64)  # derived from the maximum
    assert model_lengths(model, (4, 1, 200)) == (1, 4)  # beyond the maximum: left out


def test_symbolic_functions_are_tuned_at_the_lengths_and_the_build_uses_them(model_file, tmp_path):
    db = str(tmp_path / "rows.db")
    common = [model_file, "--target", "llvm", "--db", db]
    tuned = CliRunner().invoke(app, ["tune-model", *common, "--trials", "4", "--lengths", "1,4"])
    assert tuned.exit_code == 0, tuned.output
    # 16 too: lengths of at most 4 rows are a GEMV's, and a function with a token count is
    # tuned at a prompt's length as well (LengthTuner.prompt_lengths)
    assert re.search(r"symbolic variable \w+: measured at 1, 4, 16", tuned.output)
    assert "not tuned" not in tuned.output
    assert re.search(
        r"(\d+) of \1 symbolic functions got one schedule for every length", tuned.output
    )

    from schedlang.core.target import resolve_target
    from schedlang.models.graph import extract_tasks
    from schedlang.models.lengths import symbolic_vars
    from schedlang.models.model_file import load_model
    from schedlang.store.db import Database

    target = resolve_target("llvm")
    tasks = extract_tasks(load_model(model_file).mod, target)
    assert tasks and all(symbolic_vars(task.op.func) for task in tasks)
    with Database(db) as opened:
        for task in tasks:  # under the symbolic function's own key, measured at each length
            (best,) = opened.best(task.key, target.key, n=1) or [None]
            assert best is not None and best.extra["lengths"] == [1, 4, 16]

    built = CliRunner().invoke(app, ["build-model", *common])
    assert built.exit_code == 0, built.output
    assert f"{len(tasks)} of {len(tasks)} functions scheduled from the database" in built.output
    # verified at the example's 6 rows and at another length, with a tail a split leaves
    assert re.search(
        r"outputs agree with the reference \(PyTorch\), at the example's lengths "
        r"and at \w+ = 13",
        built.output,
    )


@pytest.mark.parametrize(
    ("lengths", "message"),
    [
        ("1,0", "--lengths: `0` is not a positive integer"),
        ("100,200", "no length up to the model's maximum of 64 tokens"),
    ],
)
def test_bad_lengths_are_one_error_line(model_file, tmp_path, lengths, message):
    result = CliRunner().invoke(
        app,
        [
            "tune-model",
            model_file,
            "--target",
            "llvm",
            "--db",
            str(tmp_path / "x.db"),
            "--lengths",
            lengths,
        ],
    )
    assert result.exit_code == 1
    assert message in result.output
    assert "Traceback" not in result.output


def _double():
    """B = 2 A over [n, 64], n symbolic: a kernel whose symbolic form the timing tests time."""
    from tvm.script import tirx as T

    @T.prim_func(s_tir=True)
    def double(a: T.handle, b: T.handle):
        n = T.int32()
        A = T.match_buffer(a, (n, 64), "float32")
        B = T.match_buffer(b, (n, 64), "float32")
        for i, j in T.grid(n, 64):
            with T.sblock("B"):
                vi, vj = T.axis.remap("SS", [i, j])
                B[vi, vj] = A[vi, vj] * T.float32(2)

    return double


def test_the_symbolic_form_is_timed_in_a_worker_that_may_hang(monkeypatch):
    """The chosen schedule's symbolic form is timed in a worker process: a kernel that hangs
    there (here: a timeout no run can meet) costs that figure and a note, not the tuning."""
    from schedlang.core.target import resolve_target
    from schedlang.models import lengths

    double = _double()
    target = resolve_target("llvm")
    notes: list[str] = []
    text = "split i by *, 4"
    times = lengths.isolated_symbolic_times(
        double, text, (1, 16), target, lengths.every_var_at, notes
    )
    assert len(times) == 2 and all(t > 0 for t in times) and not notes
    monkeypatch.setattr(lengths, "SYMBOLIC_TIMEOUT_S", 1e-4)
    times = lengths.isolated_symbolic_times(
        double, text, (1, 16), target, lengths.every_var_at, notes
    )
    assert times == ()
    assert notes == ["the symbolic form was not timed: symbolic_times took more than 0.0001 s"]


def test_each_variable_is_measured_at_the_union_of_its_functions_lengths():
    """What `tune-model` and a decoder's tuning report per symbolic variable (one helper):
    the lengths of every function that has it; a variable none has, at the lengths given."""
    from schedlang.models.lengths import KernelChoice, measured_lengths

    def choice(variables, at):
        return KernelChoice("f", "k", variables, at, "", "", (None,) * len(at))

    choices = [choice(("n",), (1, 4, 16)), choice(("n", "past"), (1, 4)), choice((), ())]
    assert measured_lengths(choices) == {"n": (1, 4, 16), "past": (1, 4)}
    assert measured_lengths(choices, ("m", "n"), (2, 8)) == {"m": (2, 8), "n": (1, 4, 16)}


def test_the_symbolic_form_is_timed_at_each_length_as_if_alone(monkeypatch):
    """Each length gets its own time evaluator: one evaluator kept the runs per repeat it grew
    to at the short length (hundreds of thousands, to fill min_repeat_ms at 64 elements) and ran
    the long one as often (a prefill's attention: minutes, the timeout; issue 45). Here that
    is hours against a fraction of a second: the timeout and a note."""
    from schedlang.core.target import resolve_target
    from schedlang.models import lengths

    double = _double()
    monkeypatch.setattr(lengths, "SYMBOLIC_TIMEOUT_S", 30.0)
    notes: list[str] = []
    times = lengths.isolated_symbolic_times(
        double, "vectorize j", (1, 1 << 16), resolve_target("llvm"), lengths.every_var_at, notes
    )
    assert not notes and len(times) == 2 and times[0] < times[1]
