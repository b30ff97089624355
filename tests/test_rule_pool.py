"""The pooling rule (schedlang/propose/rules/pool.py): a window reduction of one input with no
weight (max_pool2d, avg_pool2d, as Relax legalizes them through TOPI) gets `pool_rows` (the
window's last axis unrolled inside the output row, which LLVM vectorizes; padding inlined), then
`pool_vector` (whole vectors accumulated in registers; padding per parallel task), then the
generic template.

It ranks before the conv rule, which keeps the window reductions that read a weight; every knob
point of both templates checks, and the first point of each builds and matches numpy, for max
and avg pooling, padded or not, channels first or last.
"""

from __future__ import annotations

import numpy as np
import pytest
from numpy.lib.stride_tricks import sliding_window_view
from tvm import te, topi

from schedlang.core.ops import Op, from_primfunc, load_op
from schedlang.core.target import resolve_target
from schedlang.propose.analysis import analyse
from schedlang.propose.builtin import BuiltinProposer, op_kind
from schedlang.propose.interface import Context
from schedlang.propose.rules.pool import Pool, pool_of
from tests.rule_points import check_every_point
from tests.rule_points import families as rule_families

CPU = resolve_target("llvm")


def pool(kind: str, size: int = 16, pad: int = 1, layout: str = "NCHW") -> Op:
    """A 3 x 3 window, stride 2, over 1 x 8 x size x size (or its NHWC layout)."""
    shape = (1, 8, size, size) if layout == "NCHW" else (1, size, size, 8)
    x = te.placeholder(shape, "float32", name="X")
    y = topi.nn.pool2d(x, (3, 3), (2, 2), (1, 1), (pad,) * 4, kind, False, layout, True)
    axes = (2, 3) if layout == "NCHW" else (1, 2)

    def reference(x: np.ndarray) -> np.ndarray:
        fill = -np.inf if kind == "max" else 0.0
        widths = [(pad, pad) if a in axes else (0, 0) for a in range(4)]
        padded = np.pad(x, widths, constant_values=fill)
        windows = sliding_window_view(padded, (3, 3), axis=axes)
        strided = windows[:, :, ::2, ::2] if layout == "NCHW" else windows[:, ::2, ::2]
        reduced = strided.max(axis=(-2, -1)) if kind == "max" else strided.mean(axis=(-2, -1))
        return reduced.astype("float32")

    name = f"{kind}_pool_{layout}_pad{pad}"
    return from_primfunc(te.create_prim_func([x, y]), name, reference)


def families(op: Op) -> dict[str, str]:
    return rule_families(op, CPU)


def test_applies_to_pooling_not_to_a_conv() -> None:
    """A conv reads a weight besides its window: it stays the conv rule's."""
    conv = load_op("examples/conv2d.py", {"C": "8", "K": "16", "H": "8", "W": "16"})
    assert Pool().applies(analyse(pool("max")), CPU)
    assert not Pool().applies(analyse(conv), CPU)
    assert op_kind(pool("max"), CPU) == "pool" and op_kind(conv, CPU) == "conv"
    assert not any(name.startswith("pool") for name in families(conv))


def test_roles_of_a_padded_max_pool() -> None:
    block, roles = pool_of(analyse(pool("max")))
    assert block.name == "pool_max" and roles.pad == "pad_temp"
    assert roles.col == "ax3" and roles.outer == ("ax0", "ax1", "ax2")
    assert roles.reduce == ("rv0", "rv1")


def test_pooling_gets_the_row_template_first_then_the_vector_one() -> None:
    written = families(pool("max"))
    assert list(written) == ["pool_rows", "pool_vector", "generic"]
    rows, vector = written["pool_rows"], written["pool_vector"]
    assert "reorder ax0, ax1, ax2, rv0, ax3, rv1" in rows
    assert "compute_inline pad_temp" in rows and "unroll rv1" in rows
    assert "compute_at pad_temp tasks" in vector and "vectorize ax3.i" in vector
    assert "reverse_compute_inline pool_avg" in families(pool("avg"))["pool_vector"]


@pytest.mark.parametrize(
    ("kind", "pad", "layout"),
    [("max", 1, "NCHW"), ("avg", 1, "NCHW"), ("max", 0, "NCHW"), ("avg", 1, "NHWC")],
)
def test_every_knob_point_checks_and_the_first_matches_numpy(kind, pad, layout) -> None:
    op = pool(kind, pad=pad, layout=layout)
    written = {k: v for k, v in families(op).items() if k.startswith("pool")}
    assert set(written) == {"pool_rows", "pool_vector"}
    check_every_point(op, written, CPU)


def test_a_small_pool_comes_on_one_thread_first() -> None:
    """Little work (Target.serial_work): each template first without its `parallel`."""
    op = pool("max", size=8)
    assert analyse(op).work < CPU.serial_work
    templates = BuiltinProposer().templates(Context(op, CPU))
    assert templates[0].extra["family"] == "pool_rows" and templates[0].extra.get("serial")
    assert "\n  parallel " not in templates[0].text
