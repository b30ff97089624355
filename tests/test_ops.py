"""Op files: loading, shape parameters, loop-nest introspection, and how bad files are reported."""

from __future__ import annotations

import signal
import textwrap
from pathlib import Path

import numpy as np
import pytest
import tvm
from tvm import te

from schedlang.core.diagnostics import SchedlangError
from schedlang.core.opinfo import BufferInfo, LoopInfo, describe, flop_count, render_show
from schedlang.core.ops import (
    default_tolerance,
    from_primfunc,
    load_op,
    parse_defines,
    random_inputs,
    reference_outputs,
    split_op_spec,
)

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
EXAMPLE_FILES = sorted(EXAMPLES.glob("*.py"))

# Shapes small enough to build and check against numpy in well under a second each.
SMALL = {
    "matmul": {"M": "16", "N": "24", "K": "8"},
    "matmul_4x4": {},
    "batch_matmul": {"batch": "2", "M": "8", "N": "12", "K": "4"},
    "conv2d": {"C": "4", "H": "8", "W": "10", "K": "6"},
    "depthwise_conv2d": {"C": "4", "H": "8", "W": "10"},
    "conv2d_winograd": {"C": "4", "K": "4", "H": "8", "W": "8"},
    "softmax": {"rows": "8", "cols": "16"},
    "layernorm": {"rows": "8", "cols": "16"},
}
# Winograd's transforms (F(4x4, 3x3)) add float32 rounding the direct sum does not have: the
# numpy reference computes them in float64, and one element in 256 is 2.6e-5 apart.
RTOL = {"conv2d_winograd": 1e-4}
STRIDED_CONV = {"C": "3", "H": "9", "W": "7", "K": "2", "stride": "2", "pad": "0"}


def write(tmp_path: Path, name: str, source: str) -> str:
    path = tmp_path / name
    path.write_text(textwrap.dedent(source))
    return str(path)


def loops(info, block: str) -> list[tuple[str, int, str]]:
    return [(loop.var, loop.extent, loop.kind) for loop in info.block(block).loops]


# --- the examples --------------------------------------------------------------------------------


def test_every_example_has_small_shapes_for_the_build_test():
    assert {f.stem for f in EXAMPLE_FILES} == set(SMALL)


@pytest.mark.parametrize("path", EXAMPLE_FILES, ids=lambda p: p.stem)
def test_example_loads_with_its_default_shapes(path: Path):
    op = load_op(str(path))
    assert op.name == path.stem
    assert op.path == str(path)
    assert op.inputs and op.outputs
    assert op.reference is not None
    assert all(isinstance(v, int | str) for v in op.params.values())
    assert flop_count(op.func) > 0


@pytest.mark.parametrize(
    "name, defines",
    [*SMALL.items(), ("conv2d", STRIDED_CONV)],
)
def test_example_builds_unscheduled_and_matches_numpy(name: str, defines: dict[str, str]):
    op = load_op(str(EXAMPLES / f"{name}.py"), defines)
    args = random_inputs(op, seed=1)
    expected = reference_outputs(op, args)
    tensors = [tvm.runtime.tensor(a, tvm.cpu()) for a in args]
    tvm.compile(op.func, target="llvm")(*tensors)
    outputs = tensors[len(op.inputs) :]
    assert expected is not None and len(expected) == len(outputs)
    for got, want in zip(outputs, expected, strict=True):
        np.testing.assert_allclose(got.numpy(), want, rtol=RTOL.get(name, 1e-5), atol=1e-6)


# --- describe / show -----------------------------------------------------------------------------


def test_describe_matmul():
    info = describe(load_op(str(EXAMPLES / "matmul.py")))
    assert [b.name for b in info.blocks] == ["C"]
    assert loops(info, "C") == [
        ("i", 1024, "spatial"),
        ("j", 1024, "spatial"),
        ("k", 1024, "reduce"),
    ]
    assert info.block("C").reads == ("A", "B") and info.block("C").writes == ("C",)
    assert info.block("C").axes == ("i", "j", "k")
    assert info.buffers == (
        BufferInfo("A", (1024, 1024), "float32", "input"),
        BufferInfo("B", (1024, 1024), "float32", "input"),
        BufferInfo("C", (1024, 1024), "float32", "output"),
    )


def test_describe_conv2d_has_a_pad_block_to_inline():
    info = describe(load_op(str(EXAMPLES / "conv2d.py")))
    assert [b.name for b in info.blocks] == ["pad", "conv2d"]
    assert loops(info, "pad") == [
        ("n", 1, "spatial"),
        ("c", 64, "spatial"),
        ("h", 58, "spatial"),
        ("w", 58, "spatial"),
    ]
    assert loops(info, "conv2d") == [
        ("n", 1, "spatial"), ("k", 64, "spatial"), ("h", 56, "spatial"), ("w", 56, "spatial"),
        ("rc", 64, "reduce"), ("ry", 3, "reduce"), ("rx", 3, "reduce"),
    ]  # fmt: skip
    assert info.block("conv2d").reads == ("pad", "weight")
    roles = {b.name: b.role for b in info.buffers}
    assert roles == {"data": "input", "weight": "input", "conv2d": "output", "pad": "intermediate"}


def test_describe_softmax_blocks_in_program_order():
    info = describe(load_op(str(EXAMPLES / "softmax.py"), {"rows": "32", "cols": "64"}))
    assert [b.name for b in info.blocks] == ["row_max", "exp", "row_sum", "normalize"]
    assert loops(info, "row_max") == [("i", 32, "spatial"), ("j", 64, "reduce")]
    assert loops(info, "exp") == [("i", 32, "spatial"), ("j", 64, "spatial")]
    assert loops(info, "row_sum") == [("i", 32, "spatial"), ("j", 64, "reduce")]
    assert loops(info, "normalize") == [("i", 32, "spatial"), ("j", 64, "spatial")]
    assert info.block("normalize").reads == ("exp", "row_sum")


def test_loop_kind_follows_the_bindings_after_scheduling():
    sch = tvm.s_tir.Schedule(load_op(str(EXAMPLES / "matmul.py"), {"K": "64"}).func)
    _i, _j, k = sch.get_loops(sch.get_sblock("C"))
    sch.split(k, factors=[None, 16])
    info = describe(sch.mod["main"])
    assert info.block("C").loops == (
        LoopInfo("i", 1024, "spatial"),
        LoopInfo("j", 1024, "spatial"),
        LoopInfo("k_0", 4, "reduce"),
        LoopInfo("k_1", 16, "reduce"),
    )


def test_flop_count_is_tvms_estimate():
    # estimate_tir_flops counts float arithmetic per block times the trip count: a multiply-add
    # is 2, so a matmul is exactly 2*M*N*K. The padding select and index arithmetic count nothing.
    assert flop_count(load_op(str(EXAMPLES / "matmul.py")).func) == 2 * 1024**3
    conv = load_op(str(EXAMPLES / "conv2d.py")).func
    assert flop_count(conv) == 2 * 64 * 56 * 56 * 64 * 3 * 3
    # Softmax: max, subtract, add, divide per element -- TVM does not count the exp.
    softmax = load_op(str(EXAMPLES / "softmax.py"), {"rows": "8", "cols": "16"}).func
    assert flop_count(softmax) == 4 * 8 * 16


def test_render_show():
    text = render_show(describe(load_op(str(EXAMPLES / "matmul.py"), {"N": "512"})))
    assert text == textwrap.dedent(f"""\
        op matmul ({EXAMPLES / "matmul.py"}, M=1024, N=512, K=1024, dtype=float32)
        buffers:
          A  float32[1024, 1024]  input
          B  float32[1024, 512]   input
          C  float32[1024, 512]   output
        block C  (reads A, B; writes C)
          i  1024  spatial
          j   512  spatial
          k  1024  reduce
        flops: 1.07 GFLOP""")


def test_from_primfunc():
    A = te.placeholder((8,), name="A")
    B = te.compute((8,), lambda i: A[i] * 2.0, name="B")
    op = from_primfunc(te.create_prim_func([A, B]), name="double")
    assert (op.name, op.path, op.params) == ("double", None, {})
    assert [b.name for b in op.inputs] == ["A"] and [b.name for b in op.outputs] == ["B"]
    assert loops(describe(op), "B") == [("i", 8, "spatial")]
    with pytest.raises(SchedlangError, match="expected a PrimFunc, got str"):
        from_primfunc("nope")  # type: ignore[arg-type]


def test_module_level_tvmscript_primfunc(tmp_path: Path):
    path = write(
        tmp_path,
        "scale.py",
        """\
        from tvm.script import tirx as T

        @T.prim_func(s_tir=True)
        def scale(A: T.Buffer((16,), "float32"), B: T.Buffer((16,), "float32")):
            for i in range(16):
                with T.sblock("B"):
                    vi = T.axis.spatial(16, i)
                    B[vi] = A[vi] * T.float32(2.0)
        """,
    )
    op = load_op(path)
    assert op.name == "scale" and op.params == {} and op.reference is None
    assert [b.role for b in describe(op).buffers] == ["input", "output"]
    with pytest.raises(SchedlangError, match="has no parameters to define"):
        load_op(path, {"N": "4"})


# --- shape parameters ----------------------------------------------------------------------------


def test_defines_override_shapes():
    op = load_op(str(EXAMPLES / "matmul.py"), {"N": "64"})
    assert op.params == {"M": 1024, "N": 64, "K": 1024, "dtype": "float32"}
    assert op.outputs == (BufferInfo("C", (1024, 64), "float32", "output"),)


def test_dtype_define():
    op = load_op(str(EXAMPLES / "matmul.py"), {"dtype": "float16", "M": "4", "N": "4", "K": "4"})
    assert {b.dtype for b in (*op.inputs, *op.outputs)} == {"float16"}
    with pytest.raises(SchedlangError, match=r"-D dtype=flaot16: expected a dtype"):
        load_op(str(EXAMPLES / "matmul.py"), {"dtype": "flaot16"})


def test_define_that_is_not_an_int():
    with pytest.raises(SchedlangError, match=r"-D N=big: expected an integer"):
        load_op(str(EXAMPLES / "matmul.py"), {"N": "big"})


def test_unknown_define_lists_the_parameters():
    path = str(EXAMPLES / "matmul.py")
    with pytest.raises(SchedlangError) as e:
        load_op(path, {"n": "64"})
    assert e.value.message == f"{path}: op `matmul` has no parameter `n`"
    assert e.value.notes == ("parameters of op matmul: M, N, K, dtype", "did you mean `N`?")


def test_reference_receives_shape_parameters_by_keyword():
    op = load_op(str(EXAMPLES / "conv2d.py"), {"stride": "2", "pad": "0"})
    assert op.reference.keywords == {"R": 3, "stride": 2, "pad": 0}  # type: ignore[union-attr]


def test_parse_defines_and_op_specs():
    assert parse_defines(["N=64", " dtype = float16 "]) == {"N": "64", "dtype": "float16"}
    with pytest.raises(SchedlangError, match="bad define `N`"):
        parse_defines(["N"])
    assert split_op_spec("examples/matmul.py:matmul") == ("examples/matmul.py", "matmul")
    assert split_op_spec("examples/matmul.py") == ("examples/matmul.py", None)


# --- arguments for verification ------------------------------------------------------------------


def test_random_inputs_are_seeded_and_outputs_zero():
    op = load_op(str(EXAMPLES / "layernorm.py"), {"rows": "4", "cols": "8"})
    first, again = random_inputs(op, seed=3), random_inputs(op, seed=3)
    assert [a.shape for a in first] == [(4, 8), (8,), (8,), (4, 8)]
    for a, b in zip(first, again, strict=True):
        np.testing.assert_array_equal(a, b)
    assert not np.array_equal(first[0], random_inputs(op, seed=4)[0])
    assert np.all(first[-1] == 0) and np.abs(first[0]).max() <= 1


def test_random_inputs_follow_the_dtype():
    A = te.placeholder((64,), "int8", name="A")
    M = te.placeholder((64,), "bool", name="M")
    H = te.placeholder((64,), "float16", name="H")
    B = te.compute((64,), lambda i: te.if_then_else(M[i], A[i], A[i] * A[i]), name="B")
    G = te.compute((64,), lambda i: H[i] * H[i], name="G")
    args = random_inputs(from_primfunc(te.create_prim_func([A, M, H, B, G])), seed=0)
    assert [a.dtype for a in args] == [np.int8, np.bool_, np.float16, np.int8, np.float16]
    assert np.abs(args[0]).max() <= 4 and args[1].any() and not args[1].all()


def test_default_tolerance():
    assert default_tolerance("float32") == (1e-3, 1e-4)
    assert default_tolerance("float16") == (1e-2, 1e-2)
    assert default_tolerance("int32") == (0.0, 0.0)
    assert default_tolerance("float64")[0] < default_tolerance("float32")[0]


# --- bad op files --------------------------------------------------------------------------------


def test_file_not_found(tmp_path: Path):
    with pytest.raises(SchedlangError, match=r"op file not found: .*missing\.py"):
        load_op(str(tmp_path / "missing.py"))


def test_not_a_python_file(tmp_path: Path):
    path = write(tmp_path, "matmul.sched", "split i 32\n")
    with pytest.raises(SchedlangError, match=r"matmul\.sched: an op file must be a Python file"):
        load_op(path)


def test_syntax_error_gives_file_and_line(tmp_path: Path):
    path = write(tmp_path, "bad.py", "from tvm import te\n\ndef f(:\n    pass\n")
    with pytest.raises(SchedlangError) as e:
        load_op(path)
    assert e.value.message.startswith(f"{path}:3:7: syntax error: ")
    assert e.value.notes == ("line: def f(:",)


def test_file_raising_at_import_names_exception_and_line(tmp_path: Path):
    path = write(
        tmp_path,
        "boom.py",
        """\
        import numpy as np

        def helper():
            raise ValueError("no shapes today\\nsecond line")

        helper()
        """,
    )
    with pytest.raises(SchedlangError) as e:
        load_op(path)
    assert e.value.message == f"{path}:4: op file raised ValueError: no shapes today"
    assert e.value.notes == ('line: raise ValueError("no shapes today\\nsecond line")',)


def test_file_defining_nothing(tmp_path: Path):
    path = write(tmp_path, "empty.py", "from tvm import te\nN = 1024\n")
    with pytest.raises(SchedlangError) as e:
        load_op(path)
    assert e.value.message == f"{path} defines no op"
    assert e.value.notes == (
        "expected a function decorated with @schedlang.op returning a PrimFunc, "
        "or a module-level PrimFunc",
    )


def test_decorated_function_returning_a_string(tmp_path: Path):
    path = write(
        tmp_path,
        "str_op.py",
        """\
        import schedlang

        @schedlang.op
        def not_a_func(N: int = 4):
            return "matmul"
        """,
    )
    with pytest.raises(
        SchedlangError, match=r"op function `not_a_func` in .*str_op\.py returned str"
    ):
        load_op(path)


def test_decorated_function_raising(tmp_path: Path):
    path = write(
        tmp_path,
        "raising.py",
        """\
        import schedlang
        from tvm import te

        @schedlang.op
        def broken(N: int = 4):
            A = te.placeholder((N,), name="A")
            return te.create_prim_func([A, A.missing])
        """,
    )
    with pytest.raises(SchedlangError) as e:
        load_op(path)
    assert e.value.message.startswith(f"{path}:7: op function `broken` raised AttributeError: ")


def test_parameter_without_default(tmp_path: Path):
    path = write(
        tmp_path,
        "nodefault.py",
        """\
        import schedlang

        @schedlang.op
        def f(N):
            return None
        """,
    )
    with pytest.raises(
        SchedlangError, match=r"nodefault\.py: parameter `N` of op `f` needs an int"
    ):
        load_op(path)


def test_file_looping_forever_times_out(tmp_path: Path):
    path = write(
        tmp_path,
        "forever.py",
        """\
        while True:
            try:
                pass
            except Exception:
                pass
        """,
    )
    handler = signal.getsignal(signal.SIGALRM)
    with pytest.raises(SchedlangError, match=rf"op file {path} took more than 2 s to load"):
        load_op(path, timeout_s=2)
    assert signal.getsignal(signal.SIGALRM) is handler
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


SEVERAL = """\
    from tvm import te
    import schedlang

    def build(N):
        A = te.placeholder((N,), name="A")
        return te.create_prim_func([A, te.compute((N,), lambda i: A[i] + 1.0, name="B")])

    plain = build(8)

    @schedlang.op(name="add_one")
    def first(N: int = 16):
        return build(N)

    @schedlang.op
    def second(N: int = 32):
        return build(N)
    """


def test_several_decorated_functions_need_a_name(tmp_path: Path):
    path = write(tmp_path, "several.py", SEVERAL)
    with pytest.raises(SchedlangError, match=r"several\.py defines several ops: first, second"):
        load_op(path)
    assert load_op(path, name="second").params == {"N": 32}
    assert load_op(path, name="add_one").name == "add_one"  # the op's name= works too
    assert load_op(path, name="plain").params == {}
    with pytest.raises(SchedlangError) as e:
        load_op(path, name="secnd")
    assert e.value.notes == ("ops it defines: first, second, plain", "did you mean `second`?")


def test_one_decorated_function_wins_over_module_level_primfuncs(tmp_path: Path):
    source = SEVERAL[: SEVERAL.index("    @schedlang.op\n    def second")]
    assert load_op(write(tmp_path, "one.py", source)).name == "add_one"


def test_tvmscript_sblock_without_s_tir_gets_a_hint(tmp_path: Path):
    # TVM 0.27 rejects T.sblock in a plain @T.prim_func; the error alone does not say what to do.
    path = write(
        tmp_path,
        "no_s_tir.py",
        """\
        from tvm.script import tirx as T

        @T.prim_func
        def scale(A: T.Buffer((16,), "float32"), B: T.Buffer((16,), "float32")):
            for i in range(16):
                with T.sblock("B"):
                    vi = T.axis.spatial(16, i)
                    B[vi] = A[vi] * T.float32(2.0)
        """,
    )
    with pytest.raises(SchedlangError) as e:
        load_op(path)
    assert e.value.message.startswith(f"{path}:3: op file raised DiagnosticError: ")
    assert e.value.notes == (
        "line: @T.prim_func",
        "functions with T.sblock need @T.prim_func(s_tir=True) in TVM 0.27",
    )


# --- issue 17: every way user code fails is the user's error, with its line ----------------------

IDENT = """\
    from tvm import te
    import schedlang

    {before}

    @schedlang.op(reference={reference})
    def ident(N: int = 8):
        A = te.placeholder((N,), "float32", name="A")
        return te.create_prim_func([A, te.compute((N,), lambda i: A[i] + 1.0, name="B")])
    """


def ident_op(tmp_path: Path, reference: str, before: str = "") -> str:
    source = textwrap.dedent(IDENT).format(reference=reference, before=before)
    return write(tmp_path, "ident.py", source)


@pytest.mark.parametrize(
    "define, message, note",
    [
        ("M=-4", "-D M=-4: shape parameter `M` must be positive", "buffer `A` float32[-4, 8]"),
        ("N=-5", "-D N=-5: shape parameter `N` must be positive", "buffer `B` float32[8, -5]"),
        ("K=0", "-D K=0: shape parameter `K` must be positive", "buffer `A` float32[8, 0]"),
    ],
)
def test_regression_a_non_positive_shape_parameter_is_named(define, message, note):
    defines = {"M": "8", "N": "8", "K": "8"} | parse_defines([define])
    with pytest.raises(SchedlangError) as e:
        load_op(str(EXAMPLES / "matmul.py"), defines)
    assert e.value.message == message
    assert e.value.notes == (f"with it, op `matmul` ({EXAMPLES / 'matmul.py'}) has {note}",)


def test_a_non_positive_extent_the_op_computes_names_the_buffer(tmp_path: Path):
    path = write(
        tmp_path,
        "shrink.py",
        """\
        from tvm import te
        import schedlang

        @schedlang.op
        def shrink(N: int = 4, R: int = 3):
            A = te.placeholder((N,), "float32", name="A")
            return te.create_prim_func([A, te.compute((N - R,), lambda i: A[i], name="B")])
        """,
    )
    with pytest.raises(SchedlangError) as e:
        load_op(path, {"N": "2"})
    assert e.value.message == (
        f"{path}: op `shrink` has buffer `B` float32[-1]: every extent must be positive"
    )
    assert e.value.notes == ("its shape parameters: N=2, R=3 (set with -D NAME=VALUE)",)
    load_op(path, {"N": "4"})  # a parameter of 0 or less is fine when every extent is positive


@pytest.mark.parametrize(
    "value, size",
    [("9223372036854775808", "large: the limit is 2^31-1"), ("-1" + "0" * 5000, "small")],
)
def test_regression_a_huge_shape_parameter_is_refused_with_the_limit(value, size):
    with pytest.raises(SchedlangError) as e:
        load_op(str(EXAMPLES / "matmul.py"), {"M": value})
    assert e.value.message.startswith("-D M=")
    assert f": integer too {size}" in e.value.message


def test_regression_a_reference_that_raises_is_the_users_error_with_its_line(tmp_path: Path):
    path = ident_op(tmp_path, "broken", "def broken(A):\n    raise RuntimeError('boom')\n")
    assert Path(path).read_text().splitlines()[4] == "    raise RuntimeError('boom')"
    op = load_op(path)
    with pytest.raises(SchedlangError) as e:
        reference_outputs(op, random_inputs(op))
    assert e.value.message == f"{path}:5: the reference of op `ident` raised RuntimeError: boom"
    assert e.value.notes == ("line: raise RuntimeError('boom')",)


def test_a_reference_called_with_the_wrong_arguments_names_its_definition(tmp_path: Path):
    path = ident_op(tmp_path, "lambda A, B: A")
    op = load_op(path)
    with pytest.raises(SchedlangError) as e:
        reference_outputs(op, random_inputs(op))
    assert e.value.message.startswith(
        f"{path}:6: the reference of op `ident` raised TypeError: <lambda>() missing 1 required"
    )


def test_a_reference_returning_no_array_is_the_users_error(tmp_path: Path):
    path = ident_op(tmp_path, "lambda A: 'not an array'")
    op = load_op(path)
    with pytest.raises(SchedlangError) as e:
        reference_outputs(op, random_inputs(op))
    assert e.value.message.startswith(
        f"{path}: the reference of op `ident` returned str for output `B`, "
        "not an array of float32[8] (could not convert"
    )


def test_a_reference_returning_the_wrong_shape_is_the_users_error(tmp_path: Path):
    """It failed verification as "a bug in schedlang's checker"; the reference is named now. The
    same elements in another shape ((8, 1) for (8,)) are reshaped, not refused."""
    op = load_op(ident_op(tmp_path, "lambda A: A[:4] + 1"))
    with pytest.raises(SchedlangError) as e:
        reference_outputs(op, random_inputs(op))
    assert e.value.message == (
        f"{op.path}: the reference of op `ident` returned an array of shape (4,) for output `B`, "
        "which is float32[8]"
    )
    op = load_op(ident_op(tmp_path, "lambda A: (A + 1).reshape(8, 1)"))
    [out] = reference_outputs(op, random_inputs(op))
    assert out.shape == (8,)


def test_regression_a_reference_that_is_not_callable_is_refused_on_loading(tmp_path: Path):
    path = ident_op(tmp_path, "42")
    with pytest.raises(SchedlangError) as e:
        load_op(path)
    assert e.value.message == f"{path}:6: the reference of op `ident` is 42 (int), not a function"


@pytest.mark.parametrize(
    "statement, raised",
    [
        ("raise Weird('not an Exception')", "Weird: not an Exception"),
        ("raise KeyboardInterrupt", "KeyboardInterrupt"),
        ("raise GeneratorExit('odd')", "GeneratorExit: odd"),
    ],
)
def test_regression_an_op_file_raising_a_base_exception_is_the_users_error(
    tmp_path: Path, statement: str, raised: str
):
    path = write(tmp_path, "base.py", f"class Weird(BaseException):\n    pass\n\n{statement}\n")
    with pytest.raises(SchedlangError) as e:
        load_op(path)
    assert e.value.message == f"{path}:4: op file raised {raised}"
    assert e.value.notes == (f"line: {statement}",)


def test_regression_an_op_function_raising_keyboard_interrupt_is_the_users_error(tmp_path: Path):
    path = write(
        tmp_path,
        "interrupts.py",
        """\
        import schedlang

        @schedlang.op
        def f(N: int = 4):
            raise KeyboardInterrupt
        """,
    )
    with pytest.raises(SchedlangError) as e:
        load_op(path)
    assert e.value.message == f"{path}:5: op function `f` raised KeyboardInterrupt"


def test_ctrl_c_while_an_op_file_loads_still_interrupts(tmp_path: Path):
    path = write(tmp_path, "ctrl_c.py", "import os, signal\nos.kill(os.getpid(), signal.SIGINT)\n")
    # Python's own handler, whatever started the tests: a shell's background job ignores SIGINT.
    launched_with = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            load_op(path)
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, launched_with)


@pytest.mark.skipif(
    __import__("importlib").util.find_spec("torch") is None, reason="torch is not installed"
)
def test_an_op_file_that_imports_torch_runs_from_the_command_line() -> None:
    """The CLI keeps torch out of its own start-up (tvm_ffi would import it: seconds), never out
    of a user's file: `import torch` in an op file, and its PyTorch reference, run in the command
    and in the sandboxed worker that verifies the kernel (issue 28)."""
    import subprocess
    import sys

    op = Path(__file__).resolve().parent / "ops" / "torch_scale.py"
    command = [sys.executable, "-m", "schedlang", "run", str(op), "-s", "parallel i"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "verified, matches the reference" in result.stdout


def test_the_cli_defers_torch_and_a_users_file_lifts_it() -> None:
    import sys

    from schedlang.core.imports import allow_torch, defer_torch

    saved = sys.modules.pop("torch", "absent")
    try:
        defer_torch()
        assert "torch" in sys.modules and sys.modules["torch"] is None
        allow_torch()
        assert "torch" not in sys.modules
    finally:
        sys.modules.pop("torch", None)
        if saved != "absent":
            sys.modules["torch"] = saved
