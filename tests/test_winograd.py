"""Winograd F(4x4, 3x3) for a model's 3x3 convolutions (schedlang.models.winograd, the
`winograd` recipe in schedlang.propose.rules.winograd): the function computes the convolution
(batch, odd sizes), only the convolutions it suits are rewritten and each says why not, the
epilogue fuses into it, its template checks clean and verifies, and a model built with it
matches its reference."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tvm
from tvm import relax

from schedlang.core.target import resolve_target
from schedlang.models import winograd
from schedlang.models.graph import build_model, compare_outputs, extract_tasks, run_model
from schedlang.models.model_file import load_model
from schedlang.propose.builtin import write_templates
from schedlang.run.build import apply, compile_func
from schedlang.run.measure import set_runtime_threads, verify
from schedlang.store.db import Database
from tests.test_model import add_record
from tests.test_prepack import _first_point

LLVM = resolve_target("llvm")
CONVNET = str(Path(__file__).resolve().parent.parent / "examples" / "models" / "convnet.py")
set_runtime_threads()


def direct_conv(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """A 3x3 convolution, padding 1, stride 1, NCHW x OIHW, in float64."""
    n, _, h, wd = x.shape
    padded = np.pad(x.astype("float64"), ((0, 0), (0, 0), (1, 1), (1, 1)))
    out = np.zeros((n, w.shape[0], h, wd))
    for dy in range(3):
        for dx in range(3):
            window = padded[:, :, dy : dy + h, dx : dx + wd]
            out += np.einsum("nchw,oc->nohw", window, w[:, :, dy, dx].astype("float64"))
    return out


@pytest.mark.parametrize("shape", [(1, 64, 64, 14, 14), (2, 16, 32, 16, 16), (1, 16, 16, 9, 11)])
def test_the_winograd_function_computes_the_convolution(shape) -> None:
    n, ci, co, h, w = shape
    rng = np.random.default_rng(0)
    x = rng.standard_normal((n, ci, h, w)).astype("float32")
    weight = (rng.standard_normal((co, ci, 3, 3)) / np.sqrt(9 * ci)).astype("float32")
    func = winograd.conv_function(n, ci, co, h, w)
    out = tvm.runtime.tensor(np.zeros((n, co, h, w), "float32"))
    u = winograd.transformed_weight(weight)
    assert u.shape == (6, 6, ci, co) and u.dtype == np.float32
    compile_func(func, LLVM)(tvm.runtime.tensor(x), tvm.runtime.tensor(u), out)
    want = direct_conv(x, weight)
    # F(4x4, 3x3) in float32: a few 1e-6 of the output's scale.
    assert np.abs(out.numpy() - want).max() < 1e-4 * np.abs(want).max()


def _conv_module(
    channels: int = 64, size: int = 14, stride: int = 1, kernel: int = 3, constant: bool = True
) -> tvm.IRModule:
    rng = np.random.default_rng(0)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, channels, size, size), "float32"))
    shape = (channels, channels, kernel, kernel)
    w = relax.Var("w", relax.TensorType(shape, "float32"))
    params = [x] if constant else [x, w]
    with bb.function("main", params):
        with bb.dataflow():
            weight = relax.const(rng.standard_normal(shape).astype("float32")) if constant else w
            conv = relax.op.nn.conv2d(x, weight, strides=stride, padding=kernel // 2)
            out = bb.emit_output(bb.emit(relax.op.nn.relu(bb.emit(conv))))
        bb.emit_func_output(out)
    return bb.get()


def _convs(mod: tvm.IRModule) -> list[relax.Call]:
    conv2d = tvm.ir.Op.get("relax.nn.conv2d")
    found: list[relax.Call] = []

    def visit(expr) -> None:
        if isinstance(expr, relax.Call) and expr.op.same_as(conv2d):
            found.append(expr)

    relax.analysis.post_order_visit(mod["main"], visit)
    return found


@pytest.mark.parametrize(
    ("module", "why"),
    [
        (dict(), None),
        (dict(stride=2), "strided or dilated"),
        (dict(kernel=5), "padding other than 1"),
        (dict(constant=False), "its weight is not a constant"),
        (dict(size=7), "smaller than 14x14 or 64 channels"),
        (dict(channels=32), "smaller than 14x14 or 64 channels"),
        (dict(channels=72), "channels not a multiple of 16"),
        (dict(channels=512), "its transformed weight would pass 16 MB"),
    ],
)
def test_only_the_convolutions_winograd_suits_are_rewritten(module, why) -> None:
    mod = _conv_module(**module)
    [conv] = _convs(mod)
    assert winograd.unsuitable(conv) == why
    rewritten = winograd.winograd_conv2d(mod)
    names = [gv.name_hint for gv in rewritten.functions]
    assert ("conv2d_winograd" in names) == (why is None)
    assert len(_convs(rewritten)) == (why is not None)


@pytest.fixture(scope="module")
def convnet():
    # The residual block's conv: 64 channels at 14 x 14 (after the pool); the stem's 3 input
    # channels stay a direct convolution.
    return load_model(CONVNET, {"size": "28", "channels": "64"})


def test_the_epilogue_fuses_into_the_winograd_function(convnet) -> None:
    tasks = {t.name: t for t in extract_tasks(convnet.mod, LLVM)}
    [name] = [n for n in tasks if "winograd" in n]
    assert name.startswith("fused_conv2d_winograd_add")  # the bias, the residual, the ReLU
    drafts = write_templates(tasks[name].op, LLVM)
    assert [d.family for d in drafts] == ["winograd"]
    # Every block is scheduled by the recipe: the epilogue folded into the inverse transform.
    assert "reverse_compute_inline" in drafts[0].text
    plain = [t.name for t in extract_tasks(convnet.mod, LLVM, winograd=False)]
    assert not any("winograd" in n for n in plain)
    assert sum(n.startswith("fused_conv2d") for n in plain) == 2


def test_a_model_built_with_the_winograd_template_matches_its_reference(convnet, tmp_path) -> None:
    task = next(t for t in extract_tasks(convnet.mod, LLVM) if "winograd" in t.name)
    schedule = _first_point(task, "winograd")
    assert verify(task.op, compile_func(apply(task.op.func, schedule, LLVM), LLVM), LLVM)[0]
    db = Database(tmp_path / "records.db")
    add_record(db, task.op.func, schedule)
    executable, applied = build_model(convnet.mod, LLVM, db)
    assert {item.function: item.how for item in applied}[task.name] == "schedlang"
    outputs = run_model(executable, convnet.inputs, LLVM)
    ok, reason = compare_outputs(outputs, convnet.expected_outputs())
    assert ok, reason


# --- the op a user tunes: examples/conv2d_winograd.py ---------------------------------------------

WINOGRAD_OP = Path(__file__).resolve().parent.parent / "examples" / "conv2d_winograd.py"


def test_the_winograd_ops_reference_is_the_convolution_of_a_transformed_weight() -> None:
    """The op's numpy reference computes Winograd's algorithm for any U; for U made from a 3x3
    weight it is that weight's convolution."""
    from schedlang.core.ops import load_op

    op = load_op(str(WINOGRAD_OP), defines={"C": "8", "K": "16", "H": "10", "W": "9"})
    rng = np.random.default_rng(1)
    x = rng.standard_normal((1, 8, 10, 9)).astype("float32")
    weight = rng.standard_normal((16, 8, 3, 3)).astype("float32")
    got = op.reference(x, winograd.transformed_weight(weight))
    want = direct_conv(x, weight)
    assert got.shape == want.shape and np.abs(got - want).max() < 1e-4 * np.abs(want).max()


def _pt_values(target_spec: str, channels: int) -> list[int]:
    from schedlang.core.ops import load_op
    from schedlang.lang.syntax import parse

    size = {"C": str(channels), "K": str(channels), "H": "14", "W": "14"}
    op = load_op(str(WINOGRAD_OP), defines=size)
    (draft,) = write_templates(op, resolve_target(target_spec))
    params = {p.name.text: list(p.choices) for p in parse(draft.text).params}
    return params["PT"]


def test_the_tiles_per_register_tile_keep_their_input_block_in_half_of_l1() -> None:
    """PT tiles x CI input channels of V stay within half of L1: at 512 channels the Pi 5's
    64 KiB allows 16 tiles (32 KiB), the same board told its L1 is 32 KiB only 8."""
    assert _pt_values("rpi5", 512) == [8, 4, 16]
    assert _pt_values('{"preset": "rpi5", "l1_bytes": 32768}', 512) == [8, 4]
    assert _pt_values('{"preset": "rpi5", "l1_bytes": 32768}', 64) == [8, 4, 16]
