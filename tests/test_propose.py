"""The built-in proposer writes templates that parse, are canonical, check, build and compute right.

For every op in examples/ (at small shapes, to keep this quick) and for llvm and cuda: at least one
template; each one parses, is stored canonically, and checks without errors at its first knob
values and at five seeded random points; one point of each builds, and on llvm matches the op's
numpy reference. CUDA kernels are only built: this machine has no GPU.
"""

from __future__ import annotations

import random
import shutil
import subprocess
from pathlib import Path

import pytest

from schedlang.build import build, compile_func, source
from schedlang.check import check
from schedlang.diagnostics import render_all
from schedlang.measure import verify
from schedlang.ops import Op, load_op
from schedlang.printer import format_schedule
from schedlang.propose import (
    BuiltinProposer,
    Context,
    Draft,
    Proposal,
    Proposer,
    analyse,
    conv_roles,
    matmul_roles,
    pick,
)
from schedlang.syntax import parse
from schedlang.target import resolve_target

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
OP_FILES = sorted(EXAMPLES.glob("*.py"))
# Shapes small enough to build and verify in a moment; an op not listed runs at its defaults.
SMALL = {
    "matmul": {"M": "128", "N": "128", "K": "128"},
    "batch_matmul": {"batch": "2", "M": "64", "N": "64", "K": "64"},
    "conv2d": {"C": "16", "K": "16", "H": "16", "W": "16"},
    "depthwise_conv2d": {"C": "16", "H": "16", "W": "16"},
    "layernorm": {"rows": "64", "cols": "96"},
    "softmax": {"rows": "64", "cols": "128"},
}
RANDOM_POINTS = 5
TARGETS = ("llvm", "cuda")


@pytest.fixture(scope="module")
def targets():
    return {name: resolve_target(name) for name in TARGETS}


@pytest.fixture(scope="module")
def ops() -> dict[str, Op]:
    return {path.stem: load_op(str(path), SMALL.get(path.stem)) for path in OP_FILES}


def random_points(template: str, seed: int, count: int) -> list[dict[str, int]]:
    rng = random.Random(seed)
    space = {p.name.text: list(p.choices) for p in parse(template).params}
    return [{name: rng.choice(values) for name, values in space.items()} for _ in range(count)]


def first_point(template: str) -> dict[str, int]:
    return {p.name.text: next(iter(p.choices)) for p in parse(template).params}


def check_clean(proposal: Proposal, op: Op, target, knobs: dict[str, int]):
    result = check(parse(proposal.text), op.func, target, knobs=knobs, template_ok=False)
    rendered = render_all(result.diagnostics, proposal.text)
    assert result.ok, f"{proposal.note}\nknobs {knobs}:\n{rendered}"
    return result


@pytest.mark.parametrize("target_name", TARGETS)
@pytest.mark.parametrize("op_name", [p.stem for p in OP_FILES])
def test_every_template_checks_and_builds(op_name: str, target_name: str, ops, targets) -> None:
    op, target = ops[op_name], targets[target_name]
    proposer = BuiltinProposer()
    templates = proposer.templates(Context(op, target))
    assert templates, f"no template for {op_name} on {target_name}; dropped: " + "; ".join(
        p.note for p in proposer.dropped
    )
    for index, proposal in enumerate(templates):
        assert proposal.proposer == "builtin"
        assert proposal.note and "\n" not in proposal.note
        schedule = parse(proposal.text)
        assert format_schedule(schedule) == proposal.text, "not canonical:\n" + proposal.text
        assert schedule.is_template or not schedule.params
        for param in schedule.params:
            assert 2 <= len(param.choices) <= 6, f"knob {param.name.text}: {list(param.choices)}"
        assert 1 <= schedule.knob_space_size() <= 5000
        assert proposal.extra["space"] == schedule.knob_space_size()

        check_clean(proposal, op, target, first_point(proposal.text))
        points = random_points(proposal.text, seed=index, count=RANDOM_POINTS)
        results = [check_clean(proposal, op, target, knobs) for knobs in points]

        # One point per template, built: on llvm also run and compared with the reference.
        executable = compile_func(results[0].lowered.func, target)
        if not target.is_gpu:
            ok, reason = verify(op, executable, target)
            assert ok, f"{proposal.note} at {points[0]}: {reason}"


def test_matmul_gets_the_packed_recipe(ops, targets) -> None:
    templates = BuiltinProposer().templates(Context(ops["matmul"], targets["llvm"]))
    packed = templates[0]
    assert packed.extra["family"] == "matmul_packed"
    for line in (
        "cache_read B global at j.o",
        "cache_write C local at j.i.o",
        "vectorize j.i.i",
        "parallel tiles",
        "pragma tiles auto_unroll_max_step=U, unroll_explicit=1",
    ):
        assert line in packed.text
    statements = [s for s in packed.text.splitlines() if s.startswith("  ")]
    assert statements.index("  decompose_reduction at k.o") > statements.index("  parallel tiles")
    # The first point is the measured best register tile: 4 rows x 2 vectors of 8 fp32.
    assert first_point(packed.text)["RI"] == 4
    assert first_point(packed.text)["RJ"] == 2 * targets["llvm"].vector_lanes("float32")
    assert any(t.extra["family"] == "matmul_tiled" for t in templates)


def test_batch_axis_joins_the_parallel_loop(ops, targets) -> None:
    cpu = BuiltinProposer().templates(Context(ops["batch_matmul"], targets["llvm"]))[0]
    assert "fuse b, i.o, j.o as tiles" in cpu.text
    gpu = BuiltinProposer().templates(Context(ops["batch_matmul"], targets["cuda"]))[0]
    assert "bind b blockIdx.z" in gpu.text


def test_gpu_matmul_stages_tiles_in_shared_memory(ops, targets) -> None:
    gpu = BuiltinProposer().templates(Context(ops["matmul"], targets["cuda"]))[0]
    assert gpu.extra["family"] == "gpu_matmul"
    for line in ("cache_read A shared at k.o", "cache_read B shared at k.o", "block A_shared:"):
        assert line in gpu.text
    space = {p.name.text: list(p.choices) for p in parse(gpu.text).params}
    assert max(space["TY"]) * max(space["TX"]) <= targets["cuda"].max_threads_per_block


def test_row_reductions_reduce_across_threads_on_gpu(ops, targets) -> None:
    gpu = BuiltinProposer().templates(Context(ops["softmax"], targets["cuda"]))[0]
    assert "block row_max:\n  bind i blockIdx.x\n" in gpu.text
    assert "bind j.i threadIdx.x" in gpu.text


def test_row_wise_ops_compute_every_block_per_row_on_cpu(ops, targets) -> None:
    rows = BuiltinProposer().templates(Context(ops["layernorm"], targets["llvm"]))[0]
    assert rows.extra["family"] == "rows"
    for line in ("parallel i", "compute_at mean i", "compute_at var_rf i", "rfactor j.i"):
        assert line in rows.text


def test_conv_pads_per_task_and_depthwise_skips_the_accumulator(ops, targets) -> None:
    conv = BuiltinProposer().templates(Context(ops["conv2d"], targets["llvm"]))
    assert [t.extra["family"] for t in conv] == ["conv", "conv_inline_pad"]
    assert "compute_at pad tasks" in conv[0].text and "cache_write conv2d local" in conv[0].text
    assert "compute_inline pad" in conv[1].text
    depthwise = BuiltinProposer().templates(Context(ops["depthwise_conv2d"], targets["llvm"]))[0]
    assert "cache_write" not in depthwise.text and "fuse n, c as tasks" in depthwise.text


def test_roles(ops) -> None:
    view = analyse(ops["batch_matmul"])
    roles = matmul_roles(view.blocks[0])
    assert (roles.a, roles.b, roles.i, roles.j, roles.k) == ("A", "B", "i", "j", "k")
    assert roles.outer == ("b",)
    conv = analyse(ops["conv2d"])
    conv_block = conv.blocks[1]
    assert matmul_roles(conv_block) is None
    roles = conv_roles(conv, conv_block)
    assert (roles.pad, roles.channel, roles.row, roles.col) == ("pad", "k", "h", "w")
    depthwise = analyse(ops["depthwise_conv2d"])
    assert conv_roles(depthwise, depthwise.blocks[1]).channel is None


def test_knob_values_divide_the_extent() -> None:
    assert pick(1024, [256, 128, 64]) == [256, 128, 64]
    assert pick(96, [64, 32, 128]) == [32]
    assert pick(56, [8, 16], multiple_of=8) == [8]
    # Nothing preferred fits: the largest divisor up to the largest preferred value, never a guard.
    assert pick(30, [16, 8]) == [15]
    assert pick(7, [4, 8]) == [7]


def test_propose_never_repeats_and_runs_dry(ops, targets) -> None:
    proposer: Proposer = BuiltinProposer()
    context = Context(ops["matmul"], targets["llvm"])
    everything = BuiltinProposer().templates(context)
    seen: list[str] = []
    while batch := proposer.propose(context, [], count=1):
        assert len(batch) == 1
        seen += [p.text for p in batch]
    assert seen == [t.text for t in everything]
    assert proposer.propose(context, [], count=4) == []
    # Another target is another context: its templates are new.
    assert proposer.propose(Context(ops["matmul"], targets["cuda"]), [], count=8)


def test_a_template_failing_its_check_is_dropped_with_the_reason(
    ops, targets, monkeypatch, caplog
) -> None:
    import schedlang.propose as propose

    broken = Draft("block C:\n  split q by 4\n", "broken", "test", 1)
    good = propose.write_templates(ops["matmul"], targets["llvm"])[0]
    monkeypatch.setattr(propose, "write_templates", lambda op, target: [broken, good])
    proposer = BuiltinProposer()
    with caplog.at_level("WARNING", logger="schedlang.propose"):
        templates = proposer.templates(Context(ops["matmul"], targets["llvm"]))
    assert [t.text for t in templates] == [good.text]
    assert len(proposer.dropped) == 1
    assert "`q`" in proposer.dropped[0].note and "line 2" in proposer.dropped[0].note
    assert "dropped builtin template test" in caplog.text


def _matmul_bias_relu() -> Op:
    import numpy as np
    from tvm import te

    from schedlang.ops import from_primfunc

    a = te.placeholder((64, 32), "float32", name="A")
    b = te.placeholder((32, 48), "float32", name="B")
    bias = te.placeholder((48,), "float32", name="bias")
    k = te.reduce_axis((0, 32), name="k")
    c = te.compute((64, 48), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="C")
    d = te.compute((64, 48), lambda i, j: te.max(c[i, j] + bias[j], 0.0), name="D")
    func = te.create_prim_func([a, b, bias, d])
    return from_primfunc(func, "matmul_bias_relu", lambda x, y, z: np.maximum(x @ y + z, 0))


def _row_sums() -> Op:
    from tvm import te

    from schedlang.ops import from_primfunc

    x = te.placeholder((3, 4096), "float32", name="x")
    k = te.reduce_axis((0, 4096), name="k")
    total = te.compute((3,), lambda i: te.sum(x[i, k], axis=k), name="total")
    return from_primfunc(te.create_prim_func([x, total]), "row_sums", lambda x: x.sum(axis=1))


@pytest.mark.parametrize(
    ("make_op", "family", "line"),
    [
        (_matmul_bias_relu, "matmul_packed", "reverse_compute_inline D"),
        (_row_sums, "generic_rfactor", "rfactor k.i"),
    ],
)
def test_ops_beyond_the_examples(make_op, family: str, line: str, targets) -> None:
    op = make_op()
    for target in targets.values():
        templates = BuiltinProposer().templates(Context(op, target))
        assert templates
        for proposal in templates:
            check_clean(proposal, op, target, first_point(proposal.text))
    first = BuiltinProposer().templates(Context(op, targets["llvm"]))[0]
    assert first.extra["family"] == family and line in first.text
    result = check_clean(first, op, targets["llvm"], first_point(first.text))
    ok, reason = verify(op, compile_func(result.lowered.func, targets["llvm"]), targets["llvm"])
    assert ok, reason


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
@pytest.mark.parametrize("op_name", [p.stem for p in OP_FILES])
def test_cuda_source_compiles_with_nvcc(op_name: str, ops, targets, tmp_path) -> None:
    """TVM only generates CUDA C here (it compiles it when the module is loaded on a GPU), so
    nvcc compiles it to find what codegen does not: shared memory, registers, syntax."""
    op, cuda = ops[op_name], targets["cuda"]
    for index, proposal in enumerate(BuiltinProposer().templates(Context(op, cuda))):
        executable = build(op.func, proposal.text, cuda, knobs=first_point(proposal.text))
        kernel = tmp_path / f"{op_name}_{index}.cu"
        kernel.write_text(source(executable, cuda))
        arch = cuda.arch or "sm_90"
        compiled = subprocess.run(
            ["nvcc", f"-arch={arch}", "-cubin", "-o", str(kernel.with_suffix(".cubin")), kernel],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert compiled.returncode == 0, f"{proposal.note}:\n{compiled.stderr[-2000:]}"
