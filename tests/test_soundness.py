"""A clean check never builds a wrong kernel (issue 17).

Each `test_regression_*` below is an input that once checked clean and then computed wrong values,
wrote out of bounds, or could not build; each now gets a clean error from `schedlang check`, with
the golden diagnostics in tests/test_check.py. The second half is the safety net under the
checker: verified builds. `compile`, `run` and `schedlang.build` run the kernel once in a worker,
on poisoned buffers, before anyone gets it; the tests switch a checker guard off to show that the
net alone stops the wrong kernel.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from typer.testing import CliRunner

import schedlang
from schedlang import cli
from schedlang.checker import kernel_rules
from schedlang.core.diagnostics import SchedlangError
from schedlang.lang import statements
from schedlang.lang.nest import Nest
from schedlang.lang.statements import moving
from tests.test_check import ALIGN_THEN_RFACTOR, UNROLL_OVER_PRAGMA, padded

runner = CliRunner()

CLASS_A = ["examples/matmul.py", "-D", "M=67", "-D", "N=45", "-D", "K=33"]
CLASS_A_SCHEDULE = "split i by 17; rfactor k"


def without_covers_domain(monkeypatch: pytest.MonkeyPatch) -> None:
    """compute_at and reverse_compute_at without their soundness rule (moving.covers_domain)."""
    for keyword in ("compute_at", "reverse_compute_at"):
        checking = replace(statements.CHECKING[keyword], soundness=None)
        monkeypatch.setitem(statements.CHECKING, keyword, checking)


def check(*args: str) -> str:
    result = runner.invoke(cli.app, ["check", *args])
    assert result.exit_code == 1, result.output
    assert "internal error" not in result.output
    return result.output


# --- the reproducers of issue 17 -----------------------------------------------------------------


def test_regression_rfactor_after_non_divisible_split() -> None:
    """A: TVM's rfactor dropped the guard of the final reduction block: heap corruption."""
    output = check(*CLASS_A, "-s", CLASS_A_SCHEDULE)
    assert "TVM drops the `if` on `i.o`, `i.i`" in output


def test_regression_cache_write_at_strided_tiles() -> None:
    """B: the write-back copied a box holding rows computed in other iterations: NaN."""
    output = check(
        "examples/matmul.py",
        *("-D", "M=1000", "-D", "N=999", "-D", "K=997"),
        "-s",
        "tile i, j by 50x333; reorder i.i, j.o, j.i, i.o; cache_write C global at j.o",
    )
    assert "`i.i` steps by less than `i.o` inside it, so an iteration of `j.o` covers" in output


@pytest.mark.parametrize("shape", [["-D", "C=5", "-D", "H=9", "-D", "W=11"], []])
def test_regression_reverse_compute_at_of_padding(shape: list[str]) -> None:
    """C: the padding block lost its border (NaN at odd shapes; uninitialised reads at the
    default shape, where verification used to pass)."""
    output = check(
        "examples/depthwise_conv2d.py",
        *shape,
        "-s",
        "block pad: cache_read data global; block data_global: reverse_compute_at pad ax0",
    )
    assert "instances of its iteration domain: TVM gives it loops over too small" in output


@pytest.mark.parametrize(
    ("shape", "schedule"),
    [
        (
            ["-D", "H=2", "-D", "W=1"],
            "block pad: reverse_compute_at depthwise_conv2d n keep_unit_loops",
        ),
        (
            ["-D", "H=1", "-D", "W=2"],
            "cache_read pad global; block pad_global: reverse_compute_at depthwise_conv2d ax2",
        ),
    ],
)
def test_regression_reverse_compute_at_shortens_a_strided_reduction(
    shape: list[str], schedule: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by the differential fuzzer: moved into its producer's loop, a 3x3 window at stride 3
    got reduction loops over 1 row of 3 (partial sums, no warning). The window guard stops it
    first now; without it, the count of reduction points still does."""
    window = ["-D", "N=1", "-D", "C=1", "-D", "R=3", "-D", "stride=3", "-D", "pad=1"]
    output = check("examples/depthwise_conv2d.py", *window, *shape, "-s", schedule)
    assert WINDOW in output
    monkeypatch.setattr(moving, "reads_whole_elements", lambda *_: True)
    output = check("examples/depthwise_conv2d.py", *window, *shape, "-s", schedule)
    assert "reducing over 3 of its 9 reduction points" in output


def test_regression_computed_inside_a_vectorized_loop(tmp_path) -> None:
    """D: a loop moved inside a vectorized one by reorder, then a block computed in it."""
    op = tmp_path / "dense.py"
    op.write_text(DENSE_BIAS_RELU)
    output = check(
        str(op),
        "-s",
        "block E: split j by 8; vectorize j.i; cache_write E global; reorder j.i, j.o; "
        "reverse_compute_at E_global j.o",
    )
    assert "inside vectorized loop `j.i`" in output


def test_regression_storage_align_overflows_int32() -> None:
    output = check(
        "examples/matmul.py",
        "-s",
        "cache_write C global; storage_align C dim 0 factor 1073741824 offset 0",
    )
    assert "TVM's int32 indices reach" in output


@pytest.mark.parametrize(
    ("shape", "message"),
    [
        (["-D", "M=4096", "-D", "N=4096", "-D", "K=4096"], "TVM's int32 indices reach"),
        (["-D", "M=1000", "-D", "N=999", "-D", "K=997"], "would take 3.71 GiB"),
    ],
)
def test_regression_rfactor_buffer_too_large(shape: list[str], message: str) -> None:
    assert message in check("examples/matmul.py", *shape, "-s", "rfactor k")


def test_regression_cuda_unroll_blow_up() -> None:
    """The CPU bound on unrolled copies holds on CUDA too (it compiled for over 5 minutes)."""
    output = check(
        "examples/matmul.py",
        *("-t", "cuda", "-D", "M=4", "-D", "N=4", "-D", "K=1000000"),
        "-s",
        "bind i blockIdx.x; bind j threadIdx.x; unroll k",
    )
    assert "makes 1000000 copies" in output


# --- the reproducers of issue 33 -----------------------------------------------------------------

# A fixed CPU, so no test depends on this machine's memory; the second one has 1 GiB of it.
FIXED_CPU = '{"kind": "llvm", "mcpu": "skylake", "num-cores": 4}'
SMALL_MEMORY = '{"kind": "llvm", "mcpu": "skylake", "schedlang": {"memory_bytes": 1073741824}}'


def checks_clean(*args: str) -> None:
    result = runner.invoke(cli.app, ["check", *args])
    assert result.exit_code == 0, result.output


def test_regression_storage_align_carried_by_rfactor() -> None:
    """SIGSEGV: rfactor gave D_rf the storage_align of D, which pads D_rf's dim 1 to 2^30 + 1
    elements; its 512 x 1073741825 elements wrapped in int32 to a buffer of 512."""
    schedule = ALIGN_THEN_RFACTOR.format(factor=1073741824)
    output = check("tests/ops/dense_relu_rf.py", "-t", FIXED_CPU, "-s", schedule)
    assert "needs 549755814400 elements (2 TiB), more than the 2147483647" in output
    assert ":3:3: error" in output  # at the rfactor


def test_storage_align_carried_by_rfactor_near_the_int32_limit() -> None:
    """Padded to 4194303, D_rf's 512 x 4194303 elements are 511 short of 2^31 - 1; one more
    reaches 2^31."""
    op = ("tests/ops/dense_relu_rf.py", "-t", FIXED_CPU, "-s")
    checks_clean(*op, ALIGN_THEN_RFACTOR.format(factor=4194302))
    output = check(*op, ALIGN_THEN_RFACTOR.format(factor=4194303))
    assert "needs 2147483648 elements (8 GiB), more than the 2147483647" in output


def test_allocation_past_the_targets_memory() -> None:
    """A buffer int32 indices reach, but the target's memory does not hold (the limit is
    `memory_bytes`, overridable in the target's JSON)."""
    op = ("tests/ops/dense_relu_rf.py", "-s", ALIGN_THEN_RFACTOR.format(factor=1048576))
    checks_clean(*op, "-t", FIXED_CPU)
    output = check(*op, "-t", SMALL_MEMORY)
    assert "takes 2 GiB, more than the 1 GiB of memory of the target" in output


def test_rfactor_of_a_block_named_by_as_checks() -> None:
    """rfactor names its new block after the TVM name of the block (`C_rf_rf` here, not
    `C_x1_rf`); remembering its storage_align looked for the other (found by the short
    differential run of issue 33: an internal error)."""
    schedule = "split k by 4; rfactor k.i as C_x1; block C_x1: rfactor k.o"
    checks_clean("examples/matmul.py", *("-D", "M=64", "-D", "N=64", "-D", "K=64"), "-s", schedule)


def _long_run_findings() -> list:
    from tests.findings_20261203 import FINDINGS as found

    return found


@pytest.mark.parametrize(
    ("case", "message"), _long_run_findings(), ids=["wrapped_strides", "guarded_unroll"]
)
def test_regression_long_run_findings(case, message: str) -> None:
    """The long differential run of issue 33 (12,273 inputs): a storage_align carried by
    rfactor whose strides wrapped in int32 (negative, so the size rule passed them), and an
    unroll under the same `if` in every copy, which LLVM builds several times as slowly."""
    from fuzz.properties import target_of
    from fuzz.shrink import case_op
    from schedlang.checker.check import check
    from schedlang.lang.syntax import parse

    result = check(parse(case.text), case_op(case).func, target_of(False))
    errors = [d.message for d in result.diagnostics if d.is_error]
    assert errors and message in errors[0], errors


def test_regression_second_long_run_slow_build() -> None:
    """The second long run's one finding: 1024 short guarded iterations that LLVM unrolls by
    itself, with no `unroll` statement (71 s of CPU), refused with the unroll budget's numbers
    at the split that made them (the check alone: no build)."""
    from fuzz.properties import target_of
    from fuzz.shrink import case_op
    from schedlang.checker.check import check
    from schedlang.lang.syntax import parse
    from tests.findings_20261204 import SLOW_BUILD

    result = check(parse(SLOW_BUILD.text), case_op(SLOW_BUILD).func, target_of(False))
    errors = [d for d in result.diagnostics if d.is_error]
    assert len(errors) == 1, errors
    assert "LLVM unrolls 1024 copies of block pre (`s.0`, `s.2`, `s.3`)" in errors[0].message
    assert "4096, more than the 2048" in errors[0].message
    assert errors[0].span.line == 4  # split s by 4, *, 8, 32


def test_regression_third_long_run_slow_build() -> None:
    """Seed 3350 of the third long run (31.5 s of CPU): `unroll`ed loops around short loops that
    a split's guard folds, 17 of 68 copies kept, which the unroll rules counted as 256."""
    from fuzz.properties import target_of
    from fuzz.shrink import case_op
    from schedlang.checker.check import check
    from schedlang.lang.syntax import parse
    from tests.findings_20261204 import UNROLLED_AROUND_FOLDED as case

    result = check(parse(case.text), case_op(case).func, target_of(False))
    errors = [d.message for d in result.diagnostics if d.is_error]
    assert errors and "LLVM unrolls 4352 copies of block out_init" in errors[0], errors
    without = case.text.replace("  unroll z\n", "")  # 0.1 s
    result = check(parse(without), case_op(case).func, target_of(False))
    assert not any(d.is_error for d in result.diagnostics)


def test_regression_unrolled_vectors_of_strided_lanes() -> None:
    """The hang of the differential run of 2026-12-05 (seed 5200; 120 s of LLVM): a pragma
    unrolls 198 vector statements of 33 strided lanes. Each weighs its lanes: refused at 198 and
    at 88 (6 s); 44 of 33 lanes (1.9 s) and adjacent lanes (0.1 s) check clean."""
    from dataclasses import replace

    from fuzz.properties import target_of
    from fuzz.shrink import case_op
    from schedlang.checker.check import check
    from schedlang.lang.syntax import parse
    from tests.findings_20261205 import UNROLLED_STRIDED_LANES as case

    def errors(case) -> list[str]:
        result = check(parse(case.text), case_op(case).func, target_of(False))
        return [d.message for d in result.diagnostics if d.is_error]

    found = errors(case)
    assert (
        found and "unrolling `at2` lays out 198 vector statements of 33 strided lanes" in found[0]
    )
    assert "6534, more than the 2048" in found[0]

    def at(x: int):
        spatial = (*case.nest.spatial[:2], ("x", x))
        return replace(case, nest=replace(case.nest, spatial=spatial))

    assert "88 vector statements" in errors(at(8))[0]
    assert not errors(at(4))
    assert not errors(replace(case, text=case.text.replace("by2", "x2")))


def test_regression_late_init_past_the_point_limit() -> None:
    """Seed 3361 of the third long run (wrong values): a late init among 2 million update points,
    more than the rule lists at once; found in a slice (the loops of `i` and `l`)."""
    from fuzz.properties import target_of
    from fuzz.shrink import case_op
    from schedlang.checker.check import check
    from schedlang.lang.syntax import parse
    from tests.findings_20261204 import LATE_INIT_MANY_POINTS as case

    result = check(parse(case.text), case_op(case).func, target_of(False))
    errors = [d.message for d in result.diagnostics if d.is_error]
    assert errors and "block C's reduction starts `C[" in errors[0], errors
    assert "(its init) after it has added terms to it" in errors[0]


# The finding's split of `s` (extent 1), what its block A_global does to `p`, and the start of the
# error or None. Measured alone (CPU seconds of LLVM, 2-core Zen 4): 1024 copies 32-44 s under a
# split p, 512 copies 6.3 s, 256 copies 1.6 s; a tile that does not fold (600 split by 10, 8, 8:
# a guard true in 600 of 640 copies) is not unrolled by LLVM past its inner 64.
SELF_UNROLLED = [
    ("4, *, 8, 32", "split p by 5, 4", "LLVM unrolls 1024 copies"),
    ("4, *, 8, 32", "split p by 9", "LLVM unrolls 1024 copies"),
    ("2, *, 8, 32", "split p by 5, 4", None),
    ("*, 8, 32", "split p by 5, 4", None),
]


@pytest.mark.parametrize(("split", "outer", "message"), SELF_UNROLLED)
def test_what_llvm_unrolls_by_itself(split: str, outer: str, message: str | None) -> None:
    from fuzz.properties import target_of
    from fuzz.shrink import case_op
    from schedlang.checker.check import check
    from schedlang.lang.syntax import parse
    from tests.findings_20261204 import SLOW_BUILD

    text = SLOW_BUILD.text.replace("split s by 4, *, 8, 32", f"split s by {split}")
    text = text.replace("split p by 5, 4", outer)
    result = check(parse(text), case_op(SLOW_BUILD).func, target_of(False))
    errors = [d.message for d in result.diagnostics if d.is_error]
    assert (message is None and not errors) or (errors and message in errors[0]), errors


def test_a_guard_that_does_not_fold_is_not_counted() -> None:
    """600 split by 10, 8, 8: the guard holds in 600 of the 640 copies, so LLVM unrolls only the
    inner 64; a tiling like this one is not refused."""
    checks_clean("examples/matmul.py", "-t", FIXED_CPU, "-D", "N=600", "-s", "split j by 10, 8, 8")


# (the reduction's extent, B_local's schedule, the start of its first error or None): under the
# guard of `split p by 3` (p of 7), the same in every copy. Measured alone on 2 cores: 1024 copies
# of q, or 256 of q.o around a q.i of 4 that LLVM unrolls itself, built in 36 s; 512 in 6 s.
GUARDED_UNROLLS = [
    (512, "unroll q\nsplit p by 3", None),
    (
        1024,
        "split q by 4\nunroll q.o\nsplit p by 3",
        "makes 1024 copies of the loop body, weighing",
    ),
    (1024, "pragma q auto_unroll_max_step=1024\nsplit p by 3", "lays out 1024 statements under"),
    # A guard that tests the unrolled loop differs in every copy: 1024 of them built in 0.7 s.
    (2047, "split q by 1024\nunroll q.i", None),
]


@pytest.mark.parametrize(("k", "schedule", "message"), GUARDED_UNROLLS)
def test_unroll_under_the_same_guard(k: int, schedule: str, message: str | None) -> None:
    """An unrolled copy under an `if` that tests only loops outside the copies weighs
    unroll_guard_weight (4): 512 such copies are the budget of 2048."""
    from fuzz.nests import build_nest
    from fuzz.properties import target_of
    from schedlang.checker.check import check
    from schedlang.lang.syntax import parse
    from tests.findings_20261203 import GUARDED_UNROLL

    func = build_nest(replace(GUARDED_UNROLL, reduce=(("k", k),))).func
    result = check(parse(f"block B_local:\n{schedule}\n"), func, target_of(False))
    errors = [d.message for d in result.diagnostics if d.is_error]
    assert (message is None and not errors) or (errors and message in errors[0]), errors


def test_regression_unroll_over_a_pragma() -> None:
    """LLVM past 120 s: `unroll a` (256) around a loop whose pragma unrolls the 512 iterations of
    `b` inside: 131072 statements, which neither the unroll's nor the pragma's count saw."""
    output = check("tests/ops/sum_middle.py", "-t", FIXED_CPU, "-s", UNROLL_OVER_PRAGMA)
    assert "unrolling `a` lays out 131072 statements, more than the 2048" in output
    assert ":7:3: error" in output  # at the unroll


def test_unroll_over_a_pragma_within_the_budget() -> None:
    """4 x 512 statements are the budget (unroll_max_copies); 5 x 512 are past it."""
    op = ("tests/ops/sum_middle.py", "-t", FIXED_CPU, "-s", UNROLL_OVER_PRAGMA)
    checks_clean(*op, "-D", "A=4")
    assert "lays out 2560 statements, more than the 2048" in check(*op, "-D", "A=5")


# The differential fuzzer's reproducers (the first long run's fuzz/FINDINGS.md, sections 1-11, as
# of commit 8851681; then the second run's): each checked clean and then computed wrong values,
# wrote out of bounds, failed to build or built for minutes.
WINDOW = "too small a region of what block pad"
PARTIAL = "is still reducing"
FINDINGS = [
    # Seed 17: C moved into its cache's loop, then a tile of the loops above put a loop that comes
    # back to C's points inside its reduction.
    (
        "matmul:M=17,N=5,K=13",
        "block C:\nsplit k by 3\ntile k.i, i, j by 2x4x2\nfuse k.i.o, i.o\n"
        "cache_read B global at k.o as B_rf1\nblock B_rf1:\nreverse_compute_at C ax0\n"
        "tile j.o, k.o, k.i.o_i.o by 2x3x6\n",
        "block C adds the same terms to `C[0, 0]` twice",
    ),
    # Seed 18: out moved into its cache's loop over `fuse r, j`: each (r, k) term added once per
    # j, 13 times, under one init (TVM 0.27 accepts it).
    (
        "nest:dense_rj",
        "block out:\nreorder r, l, i, k\nfuse r, j\ncache_read B local at r_j as B_c1\n"
        "block B_c1:\nreverse_compute_at out ax0 keep_unit_loops\n",
        "block out adds the same terms to `out[0, 0, 0]` twice",
    ),
    # Seed 18: var computed per point of normalize's fused loop and decomposed there: each row's
    # variance summed once per column.
    (
        "layernorm:rows=67,cols=5",
        "block normalize:\nfuse i, j\ncompute_at var i_j\ndecompose_reduction var at i_j\n",
        "block var adds the same terms to `var[0]` twice",
    ),
    # Seed 17 (the fourth run): row_sum computed per point of normalize's fused loop, then
    # decomposed inside it: the init ran once for a row, and the whole row sum twice.
    (
        "softmax:rows=3,cols=3",
        "block normalize:\nfuse i, j\ncompute_at row_sum i_j\nsplit i_j by 16, *, 8, 2\n"
        "block row_max:\ndecompose_reduction at i\nsplit j by 2, *, 4, 2\nblock exp:\n"
        "decompose_reduction row_sum at i_j.3\n",
        "block row_sum adds the same terms to `row_sum[0]` twice",
    ),
    # Seed 17: C recomputed under C_rf1's guarded j loops; the copy back ran in every iteration
    # and copied a fresh (compacted) C_local in the iterations the guard skips.
    (
        "matmul:M=33,N=45,K=5",
        "block C:\ncache_read A local at j keep_unit_loops\nblock A_local:\n"
        "reverse_compute_at C ax1\nreorder ax0, i, ax1\nreorder ax0, ax1\nsplit i by 8, *, 4\n"
        "block C:\nsplit j by *, 2, 5\ncache_write C local at i.1 keep_unit_loops as C_rf1\n",
        "block C_rf1 reads `C_local[0, 0]` at ax0 = 0, j.0 = 4, j.1 = 1",
    ),
    # Seed 18 (the fourth run): decompose_reduction put A_global's init under `p.i`, a guarded
    # loop of P that feeds none of A_global's iterators; every p.i zeroed the sums again.
    (
        "nest:matmul_wiped",
        "block P:\nsplit s by *, 2\nreverse_compute_at A_global u keep_unit_loops\n"
        "tile q, p by 45x16\nreorder p.i, p.o\ndecompose_reduction A_global at p.o\n",
        "block A_global_init starts `A_global[0, 0, 0, 0]` over again",
    ),
    # Seed 15 (2026-12-02, the third run): normalize moved to the outer part of a split of the
    # loop row_sum was computed at, so it read partial row sums.
    (
        "softmax:rows=1,cols=64",
        "block exp:\ntile i, j by 3x46\nreverse_compute_at row_sum j.o\nsplit j.o by 8, *\n"
        "reverse_compute_at normalize j.o.o\nblock row_sum:\nparallel i.o\n",
        "over which block row_sum still reduces",
    ),
    # Seed 16: C moved back and forth; two loops named ax0 made the checker take the one C does
    # not use for the one it does, and miss that C was replayed under it.
    (
        "nest:matmul_pq",
        "block P:\nreverse_compute_at C p\nblock C:\ncompute_at P x\nblock P:\nsplit q by 6\n"
        "reverse_compute_at C q.i\n",
        "adds the same terms again",
    ),
    # 1: the rf block of a strided window moved into the padding block's loop.
    (
        "depthwise_conv2d:N=1,C=1,H=2,W=3,R=2,stride=2,pad=0",
        "rfactor ry\nblock pad:\nreverse_compute_at depthwise_conv2d_rf w\n",
        WINDOW,
    ),
    (
        "depthwise_conv2d:N=1,C=1,H=1,W=1,R=3,stride=1,pad=1",
        "rfactor ry\nblock depthwise_conv2d_rf:\nreverse_compute_at depthwise_conv2d rx\n",
        PARTIAL,
    ),
    # 2, 7: a strided window moved into the padding block's loop.
    (
        "depthwise_conv2d:N=1,C=1,H=2,W=1,R=3,stride=3,pad=1",
        "block pad:\nreverse_compute_at depthwise_conv2d w\n",
        WINDOW,
    ),
    (
        "conv2d:N=1,C=1,H=2,W=1,R=3,stride=3,pad=1,K=1",
        "block pad:\nreverse_compute_at conv2d h\n",
        WINDOW,
    ),
    # 3: a 1-lane vector (Check failed: lanes > 1).
    (
        "nest:matmul",
        "block D:\nvectorize at2\npragma at2 auto_unroll_max_step=0\n",
        "its extent is 1",
    ),
    # 4: Buffer exp is used before its definition.
    (
        "softmax:rows=1,cols=1",
        "block row_sum:\nrfactor j\nreverse_compute_inline row_sum_rf\n",
        "block normalize reads `exp` too",
    ),
    # 5, 9, 11: a block moved into a reduction loop, then decompose_reduction.
    (
        "layernorm:rows=2,cols=2",
        "block mean:\nsplit i by 2, *\nreverse_compute_at var j\ndecompose_reduction var at i.o\n",
        PARTIAL,
    ),
    (
        "nest:dense_pde",
        "tile as, in by 3x6\nreverse_compute_at D as.i keep_unit_loops\nblock D:\n"
        "compute_at C ax0\ndecompose_reduction C at j\n",
        PARTIAL,
    ),
    (
        "matmul_4x4:M=2,N=1,K=2",
        "cache_write C global at k keep_unit_loops\ntile i, k by 2x1\nblock C_global:\n"
        "compute_at C ax1\ndecompose_reduction C at i.o\n",
        PARTIAL,
    ),
    # 6: the final block moved into the rf block's reduction loop.
    ("nest:dense", "rfactor k\nblock C_rf:\nreverse_compute_at C r\n", PARTIAL),
    # 8: the cache sized past the output, copied back out of bounds.
    (
        "layernorm:rows=11,cols=3",
        "block normalize:\nsplit i by 3\nfuse i.o, i.i, j\nsplit i.o_i.i_j by 32\n"
        "fuse i.o_i.i_j.o, i.o_i.i_j.i\ncache_write normalize global\n",
        "larger than the 11 x 3 of `normalize`",
    ),
    # 10: 154 s of LLVM.
    (
        "layernorm:rows=64,cols=97",
        "block normalize:\ncompute_at var i keep_unit_loops\nblock mean:\nunroll i\n"
        "split j by 2, 4, *\nblock normalize:\nparallel i\n",
        "makes 6656 copies",
    ),
    # The differential run of 2026-12-02 (seeds 11 and 12; docs/reliability.md). A split's inner
    # part reordered outside its outer part, then a block computed at a loop between them: NaN,
    # or values from other iterations.
    (
        "nest:dense_ebr",
        "split j by *, 8, 4\nreorder l, j.0, j.2, j.1\nreverse_compute_at bias j.2\n",
        "`j.2` steps by less than `j.1` inside it",
    ),
    (
        "matmul:M=64,N=64,K=8",
        "tile i, j by 16x16\nreorder i.o, j.i, j.o, i.i\ncache_write C global at j.i\n",
        "`j.i` steps by less than `j.o` inside it",
    ),
    # Loops whose steps overlap, kept apart only by the block's `if`: the write-back copied
    # garbage over finished points (NaN).
    (
        "matmul_4x4:M=2,N=1,K=1",
        "split i by 1\ntile i.i, i.o by 8x3\ncache_write C global at i.i.o\n"
        "reverse_compute_at C_global i.o.i\n",
        "overlap, and only block C's `if` keeps them",
    ),
    # decompose_reduction at a loop the block was computed at: the init is hoisted above it and
    # the update repeats the whole reduction in every iteration (layernorm's mean, wrong values).
    (
        "layernorm:rows=1,cols=2",
        "block normalize:\ncompute_at var j\nfuse i, j\ncompute_at mean i_j\n"
        "decompose_reduction mean at i_j\n",
        "which repeats the whole reduction",
    ),
    # `parallel` of a loop holding another block's parallel loop (a cache computed at it): "Nested
    # parallel loop is not supported by threadpool" (does not build).
    (
        "layernorm:rows=31,cols=64",
        "block mean:\ncache_read x global as x_rf1\nblock x_rf1:\n"
        "cache_write x_rf1 global at ax0 keep_unit_loops\nblock x_rf1_global:\n"
        "split ax0_1 by 1, 8\nparallel ax0_1.i\nblock x_rf1:\nparallel ax0\n",
        "`ax0` holds parallel loop `ax0_1.i`",
    ),
    # A loop fused from a spatial and a reduction loop, split, and its parts reordered (by reorder
    # or tile): an output's reduction init runs after some of its updates (wrong sums).
    (
        "layernorm:rows=5,cols=7",
        "block mean:\nfuse i, j as f0\nsplit f0 by 29\ntile f0.o, f0.i by 2x8\n",
        "makes the reduction's init run after some of its updates",
    ),
    (
        "layernorm:rows=5,cols=45",
        "block var:\nfuse i, j\nsplit i_j by 176\nreorder i_j.i, i_j.o\n",
        "`i_j.i` and `i_j.o` both run spatial and reduction iterations",
    ),
    # Two vectorized loops in one nest: "VectorizeLoop before LiftStorageAlloc" (does not build).
    (
        "depthwise_conv2d:N=1,C=2,H=1,W=1,R=1,stride=1,pad=1",
        "block pad:\nvectorize w\nvectorize c\n",
        "`w` in the same nest is vectorized already",
    ),
    # `unroll i` over 67 rows around k of 3 split by *, 8, 16: LLVM unrolls the guarded loops
    # too and built for 4.5 minutes.
    ("matmul_4x4:M=67,N=3,K=3", "unroll i\nsplit k by *, 8, 16\n", "makes 8576 copies"),
]


def _finding_op(op: str):
    """An example op at a size, or one of the fuzzer's generated nests."""
    from fuzz.nests import NestSpec, build_nest
    from schedlang.core.ops import load_op
    from tests.findings_20261202 import WIPED_NEST

    name, _, sizes = op.partition(":")
    if name != "nest":
        return load_op(f"examples/{name}.py", dict(kv.split("=") for kv in sizes.split(","))).func
    specs = {
        "matmul": NestSpec(
            "matmul",
            (("at", 1),),
            (("k", 1024), ("r", 13)),
            "sum",
            "int32",
            "C_rf",
            None,
            "D",
            0,
            (),
        ),
        "dense": NestSpec(
            "dense",
            (("x", 67), ("y", 2)),
            (("k", 13), ("r", 12)),
            "sum",
            "int32",
            "C",
            None,
            None,
            0,
            ("bias", "relu"),
        ),
        "dense_ebr": NestSpec(
            "dense",
            (("i", 11), ("j", 64), ("l", 2)),
            (("k", 20),),
            "sum",
            "int32",
            "C_rf",
            "pre",
            None,
            0,
            ("bias", "relu"),
        ),
        "matmul_pq": NestSpec(
            "matmul", (("x", 12),), (("in", 14), ("as", 19)), "sum", "int32", "C", "P", None, 0, ()
        ),
        "dense_rj": NestSpec(
            "dense",
            (("i", 14), ("j", 13), ("l", 4)),
            (("k", 8), ("r", 3)),
            "sum",
            "float32",
            "out",
            None,
            None,
            0,
            ("bias", "relu"),
        ),
        "matmul_wiped": WIPED_NEST,
        "dense_pde": NestSpec(
            "dense",
            (("i", 3), ("j", 8)),
            (("in", 7), ("as", 33)),
            "sum",
            "int32",
            "C",
            "P",
            None,
            0,
            ("D", "E"),
        ),
    }
    return build_nest(specs[sizes]).func


@pytest.mark.parametrize(("op", "schedule", "message"), FINDINGS)
def test_regression_differential_findings(op: str, schedule: str, message: str) -> None:
    from schedlang.checker.check import check
    from schedlang.core.target import resolve_target
    from schedlang.lang.syntax import parse

    result = check(parse(schedule), _finding_op(op), resolve_target("llvm"))
    errors = [d.message for d in result.diagnostics if d.is_error]
    assert errors and message in errors[0], errors  # the first error; others may follow from it


DENSE_BIAS_RELU = """
import numpy as np
from tvm import te
import schedlang


def reference(X, W, b):
    return np.maximum(X @ W.T + b, 0)


@schedlang.op(reference=reference)
def dense(M: int = 64, N: int = 48, K: int = 32):
    X = te.placeholder((M, K), name="X")
    W = te.placeholder((N, K), name="W")
    b = te.placeholder((N,), name="b")
    k = te.reduce_axis((0, K), name="k")
    D = te.compute((M, N), lambda i, j: te.sum(X[i, k] * W[j, k], axis=k), name="D")
    E = te.compute((M, N), lambda i, j: te.max(D[i, j] + b[j], 0.0), name="E")
    return te.create_prim_func([X, W, b, E])
"""


# --- verified builds: the net under the checker --------------------------------------------------


@pytest.fixture
def without_rfactor_guard(monkeypatch: pytest.MonkeyPatch) -> None:
    """The checker as it was before class A's guard: the wrong kernel checks clean."""
    monkeypatch.setattr(Nest, "guarded_spatial_loops", lambda self, name: [])
    monkeypatch.setattr(kernel_rules, "sound_dataflow", lambda c: None)


@pytest.mark.usefixtures("without_rfactor_guard")
def test_compile_refuses_to_write_a_kernel_that_fails_verification(tmp_path) -> None:
    library = tmp_path / "matmul.so"
    args = ["compile", *CLASS_A, "-s", CLASS_A_SCHEDULE, "-o", str(library)]
    result = runner.invoke(cli.app, args)
    assert result.exit_code == 1, result.output
    assert "the built kernel is wrong: wrote out of bounds" in result.output
    assert not library.exists()
    result = runner.invoke(cli.app, [*args, "--no-verify"])
    assert result.exit_code == 0, result.output
    assert library.exists()


@pytest.mark.usefixtures("without_rfactor_guard")
def test_run_verifies_in_a_worker_before_running_here() -> None:
    """`run` used to run the kernel in its own process first: free(): invalid next size."""
    result = runner.invoke(cli.app, ["run", *CLASS_A, "-s", CLASS_A_SCHEDULE])
    assert result.exit_code == 1, result.output
    assert "wrote out of bounds" in result.output


@pytest.mark.usefixtures("without_rfactor_guard")
def test_build_verifies_unless_told_not_to() -> None:
    func = schedlang.core.ops.load_op("examples/matmul.py", {"M": "67", "N": "45", "K": "33"}).func
    with pytest.raises(SchedlangError, match="wrote out of bounds"):
        schedlang.build(func, CLASS_A_SCHEDULE, "llvm")
    assert schedlang.build(func, CLASS_A_SCHEDULE, "llvm", verify=False) is not None


def test_uninitialised_intermediate_reads_fail_verification(monkeypatch) -> None:
    """Class C without its guard: the border of P is never written and B reads it. The heap of
    the verifier is poisoned, so this fails even where leftover memory happened to hold zeros."""
    without_covers_domain(monkeypatch)
    monkeypatch.setattr(kernel_rules, "sound_dataflow", lambda c: None)
    schedule = "block P: cache_read A global; block A_global: reverse_compute_at P ax0"
    with pytest.raises(SchedlangError, match="kernel is wrong: B has NaN or infinite values"):
        schedlang.build(padded(62), schedule, "llvm")


def test_unwritten_outputs_fail_verification() -> None:
    """Outputs are NaN before the run: a kernel that skips part of one cannot pass on zeros."""
    from schedlang.run.sandbox import _poisoned

    assert np.isnan(_poisoned(np.zeros(3, "float32"))).all()
    assert (_poisoned(np.zeros(3, "int32")) == 0x7F7F7F7F).all()


def test_regression_cache_write_at_strided_fused_loops() -> None:
    """Found by the differential fuzzer: after fuse, a non-dividing split and a reorder, the
    write-back's loop extent depends on the outer loop; its largest value (997 rows of 19) is
    what is copied in some iteration, against the 87 elements computed there."""
    from tvm import te

    from schedlang.checker.check import check
    from schedlang.core.target import resolve_target
    from schedlang.lang.syntax import parse

    a = te.placeholder((1000, 19), "int32", name="A")
    d = te.compute((1000, 19), lambda i, j: a[i, j] + 1, name="D")
    schedule = "fuse i, j as f\nsplit f by 87, 220\nreorder f.i, f.o\ncache_write D global at f.i\n"
    result = check(parse(schedule), te.create_prim_func([a, d]), resolve_target("llvm"))
    assert [d.message for d in result.diagnostics if d.is_error] == [
        "`cache_write … at f.i` would copy back 18943 elements per iteration of `f.i` while "
        "block D computes only 87 there: the rest would be garbage"
    ]


# --- legal schedules the checker once refused: warnings now, and TVM builds them right ----------

# (op file and shape, schedule, what the author is warned about): each builds and verifies.
DOWNGRADED = [
    # A factor past the extent (outer loop of 1, the inner one guarded) and the README's
    # showcase, `vectorize j.i` around the reduction loop, at an odd shape.
    (
        ["examples/matmul.py", "M=13", "N=13", "K=13"],
        "tile i, j by 32x32; vectorize j.i",
        ["factor 32 is larger than the extent 13 of `i`"],
    ),
    # vectorize of a loop with a spatial loop inside.
    (["examples/softmax.py", "rows=5", "cols=7"], "block exp: vectorize i", ["`j` inside it"]),
    # rfactor of a loop of extent 1.
    (["examples/matmul.py", "M=3", "N=5", "K=1"], "rfactor k", []),
]


@pytest.mark.parametrize(("op", "schedule", "warnings"), DOWNGRADED, ids=["tile", "vec", "rf1"])
def test_downgraded_rule_builds_and_verifies(op: list[str], schedule: str, warnings) -> None:
    from schedlang.checker.check import check
    from schedlang.core.ops import load_op
    from schedlang.core.target import resolve_target
    from schedlang.lang.syntax import parse

    func = load_op(op[0], dict(d.split("=") for d in op[1:])).func
    result = check(parse(schedule), func, resolve_target("llvm"))
    assert result.ok
    messages = " ".join(d.message for d in result.diagnostics)
    assert all(w in messages for w in warnings), messages
    schedlang.build(func, schedule, "llvm")  # verified in a worker: raises if wrong


def test_downgraded_gpu_rules_build() -> None:
    """bind of a bound loop replaces its binding; unroll of a bound loop runs it in each thread.
    Nothing here runs CUDA: this builds the kernel and reads the binding in its source."""
    from schedlang.core.ops import load_op
    from schedlang.core.target import resolve_target
    from schedlang.run.codegen import source

    func = load_op("examples/matmul.py", {"M": "4", "N": "64", "K": "8"}).func
    schedule = (
        "split j by 32; bind i blockIdx.x; bind j.o threadIdx.x; bind j.o threadIdx.y; "
        "bind j.i threadIdx.x; unroll j.o"
    )
    cuda = resolve_target("cuda")
    text = source(schedlang.build(func, schedule, cuda, verify=False), cuda)
    assert "threadIdx.y" not in text  # unroll replaced the binding that replaced threadIdx.x
    assert "__launch_bounds__(32)" in text


def _dataflow_findings() -> list:
    from tests.findings_20261202 import FINDINGS as found

    return found


@pytest.mark.parametrize(
    ("case", "message"), _dataflow_findings(), ids=[f"finding{n}" for n in range(39)]
)
def test_regression_dataflow_findings(case, message: str, monkeypatch) -> None:
    """The differential run of 2026-12-02 (seeds 13, 14): each of these checked clean and then
    computed wrong values or crashed. The whole-kernel rules (schedlang.checker.dataflow, and the
    replayed reduction) reject them. A padding block moved into a cache's loops is refused
    first, at its `reverse_compute_at`, by the count of the instances it runs; the whole-kernel
    rules still find it without that count."""
    from fuzz.properties import target_of
    from fuzz.shrink import case_op
    from schedlang.checker.check import check
    from schedlang.lang.syntax import parse

    def first_error() -> str:
        result = check(parse(case.text), case_op(case).func, target_of(False))
        errors = [d.message for d in result.diagnostics if d.is_error]
        assert errors, case.text
        return errors[0]

    error = first_error()
    if "instances of its iteration domain: TVM gives it loops over too small" in error:
        monkeypatch.setattr(moving, "instances_run", lambda *_: None)
        error = first_error()
    assert message in error


def test_dataflow_finds_class_a_and_c_without_their_guards(monkeypatch) -> None:
    """A second line of defence: with the per-statement guards of classes A and C removed, the
    whole-kernel analysis still rejects both schedules, naming the point written out of bounds
    (A) and the point read before it is written (C)."""
    from schedlang.checker.check import check
    from schedlang.core.target import resolve_target
    from schedlang.lang.syntax import parse

    monkeypatch.setattr(Nest, "guarded_spatial_loops", lambda self, name: [])
    without_covers_domain(monkeypatch)
    from schedlang.core.ops import load_op

    func = load_op("examples/matmul.py", {"M": "67", "N": "45", "K": "33"}).func
    result = check(parse(CLASS_A_SCHEDULE), func, resolve_target("llvm"))
    errors = [d.message for d in result.diagnostics if d.is_error]
    assert len(errors) == 1 and errors[0].startswith(
        "block C reaches `C[67, 0]` at i.o = 3, outside the buffer (67 x 45)"
    ), errors
    schedule = "block P: cache_read A global; block A_global: reverse_compute_at P ax0"
    result = check(parse(schedule), padded(62), resolve_target("llvm"))
    errors = [d.message for d in result.diagnostics if d.is_error]
    assert len(errors) == 1 and errors[0].startswith("block B reads `P["), errors


def test_the_instances_a_block_runs_are_counted_over_its_loops_and_if() -> None:
    """tir_values.instances: `vi = 2 i + j` over i < 4, j < 3 under `2 i + j < 8` reaches each
    of the 8 instances, in 11 runs (three of them again); without the `if`, 9 values, one of
    them outside the domain."""
    from tvm import s_tir, tirx
    from tvm.script import tirx as T

    from schedlang.lang.tir_values import Instances, instances

    @T.prim_func(s_tir=True)
    def overlapping(a: T.Buffer((8,), "float32"), b: T.Buffer((8,), "float32")):
        for i, j in T.grid(4, 3):
            with T.sblock("B"):
                vi = T.axis.spatial(8, i * 2 + j)
                T.where(i * 2 + j < 8)
                b[vi] = a[vi] + T.float32(1.0)

    sch = s_tir.Schedule(overlapping)
    block = sch.get_sblock("B")
    loops = {sch.get(x).loop_var: (0, int(sch.get(x).extent)) for x in sch.get_loops(block)}
    realize = sch.get(sch.get_loops(block)[1]).body
    assert instances(realize, loops) == Instances(domain=8, reached=8, runs=11)
    unguarded = s_tir.SBlockRealize(
        list(realize.iter_values), tirx.const(True, "bool"), realize.block
    )
    assert instances(unguarded, loops) == Instances(domain=8, reached=8, runs=12)
    assert instances(realize, loops, most=8) is None  # 12 loop points: too many to count


def test_a_function_that_reaches_outside_its_buffers_as_written_is_refused() -> None:
    """Two of TVM's own schedule tests schedule functions whose indices reach past their
    buffers (issue 32 counted them as false refusals): `i = v0 * v0 + v1` over 6 x 4 into 14
    rows (test_reorder_with_partial_affineness), and three loads up to `B[i, j + 2]` of a B as
    wide as the output (test_compute_inline_multi_loads). TVM builds both; the kernels access
    memory outside the buffers. Refused, saying the function does so as written; the same
    schedules on in-bounds functions check clean."""
    from tvm.script import tirx as T

    from schedlang.checker.check import check
    from schedlang.core.target import resolve_target
    from schedlang.lang.syntax import parse
    from tests.test_check import three_loads

    def squares(rows: int):
        @T.prim_func(s_tir=True)
        def func(A: T.Buffer((rows, 4), "float32"), B: T.Buffer((rows, 4), "float32")):
            for v0, v1, v2 in T.grid(6, 4, 4):
                with T.sblock("B"):
                    i = T.axis.spatial(rows, v0 * v0 + v1)
                    j = T.axis.spatial(4, v2)
                    B[i, j] = A[i, j] + T.float32(1.0)

        return func

    def errors(schedule: str, func) -> list[str]:
        result = check(parse(schedule), func, resolve_target("llvm"))
        return [d.message for d in result.diagnostics if d.is_error]

    as_written = "the function reaches outside it as written, before any statement"
    for schedule, outside, inside in [
        ("reorder v2, v1", squares(14), squares(29)),
        ("block B:\ncompute_inline B", three_loads(16), three_loads(14)),
    ]:
        found = errors(schedule, outside)
        assert len(found) == 1 and as_written in found[0], found
        assert not errors(schedule, inside)
