"""Fuzzing the front end (parse → check → lower → build), as a spec.

For any input the front end returns a scheduled function or Diagnostics, never another exception
and never a hang; and a schedule that checks clean builds, and on llvm computes what the reference
computes, with its outputs and scratch buffers poisoned and guard bytes around every argument, in a
sandbox worker (fuzz/properties.py, fuzz/differential.py). Inputs: random loop nests with
mostly-right random schedules, schedules written over the live loop nest of the example ops at odd
sizes and of random nests (fuzz/live.py), the example schedules mutated, and the atheris harnesses'
seed corpora plus random bytes. Every failure these found is a named regression test below, with
what was wrong; the shapes of issue 17's wrong kernels are shown reachable (fuzz/classes.py).

The hypothesis tests are derandomized (CI sees the same inputs every run) and bounded: set
SCHEDLANG_FUZZ_EXAMPLES=N to run N new random examples each instead (a long run:
`--hypothesis-show-statistics` prints how far the inputs got). fuzz/README.md runs the harnesses.
"""

from __future__ import annotations

import dataclasses
import os
import random
import sys
import time
from datetime import timedelta

import pytest
from hypothesis import HealthCheck, event, given, note, settings
from typer.testing import CliRunner

from fuzz import diff_run, driver, fuzz_check, fuzz_parse, properties
from fuzz.cases import Case, live_case
from fuzz.classes import CLASSES, classify
from fuzz.differential import run_differential
from fuzz.live import apply_unchecked
from fuzz.mutate import examples
from fuzz.nests import ByteChooser, NestSpec
from fuzz.properties import case_op, hard_cap, run_case, target_of
from fuzz.shrink import shrink
from fuzz.sizes import odd_sized_example
from schedlang import cli
from schedlang.checker.check import check
from schedlang.lang.syntax import parse
from tests.strategies import generated_cases, live_cases, mutated_cases

SCALE = int(os.environ.get("SCHEDLANG_FUZZ_EXAMPLES", "0"))


def fuzz_settings(examples: int) -> settings:
    """`examples` inputs, the same ones every run (or SCHEDLANG_FUZZ_EXAMPLES inputs, new ones each
    run: `--hypothesis-seed` repeats one); an input taking over 30 s fails (a build that slow is a
    hang in all but name), one over HARD_CAP_S ends the run, leaving the input and the stacks in
    fuzz/crashes/hang-<pid>.txt (hard_cap)."""
    return settings(
        max_examples=SCALE or examples,
        deadline=timedelta(seconds=30),
        derandomize=not SCALE,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


def check_case(case: Case) -> None:
    note(case.describe())
    with hard_cap(case.describe()):
        outcome = run_case(case)
    event(f"{'cuda' if case.gpu else 'llvm'}: {outcome.stage}")
    if outcome.repairs:
        event(f"repaired {outcome.repairs} times")


# --- properties over random inputs ---------------------------------------------------------------


@fuzz_settings(30)  # was 50: the live schedules below cover llvm at lower cost per bug found
@given(generated_cases(gpu=False))
def test_random_schedules_on_random_loop_nests_llvm(case: Case) -> None:
    check_case(case)


@fuzz_settings(30)
@given(generated_cases(gpu=True))
def test_random_schedules_on_random_loop_nests_cuda(case: Case) -> None:
    check_case(case)


@fuzz_settings(40)
@given(mutated_cases())
def test_mutated_example_schedules(case: Case) -> None:
    check_case(case)


@fuzz_settings(45)
@given(live_cases())
def test_live_schedules_on_odd_sized_ops_compute_what_the_reference_does(case: Case) -> None:
    check_case(case)


# --- differential runs: what they catch, and what the generators reach ---------------------------

# Issue 17's four wrong kernels, each from a schedule that checked clean before the checker had a
# guard for it, here applied without the checker (at sizes that run in milliseconds), and what the
# differential run says of each.
ISSUE_17 = {
    "A": ("matmul.py", {"M": "67", "N": "45", "K": "33"}, "split i by 17; rfactor k",
          "out_of_bounds", "wrote out of bounds: 180 bytes after output 2"),
    "B": ("matmul.py", {"M": "100", "N": "99", "K": "97"},
          "tile i, j by 50x33; reorder i.i, j.o, j.i, i.o; cache_write C global at j.o",
          "wrong", "output 2 has NaN or infinite values"),
    "C": ("depthwise_conv2d.py", {"C": "5", "H": "9", "W": "11"},
          "block pad: cache_read data global; block data_global: reverse_compute_at pad ax0",
          "wrong", "output 2 has NaN or infinite values"),
    "D": ("matmul.py", {"M": "64", "N": "48", "K": "32"}, "block C: split j by 8; vectorize j.i; "
          "cache_write C global; reorder j.i, j.o; reverse_compute_at C_global j.o",
          "wrong", "output 2 differs from the reference"),
}  # fmt: skip


def issue_17_case(name: str) -> Case:
    op_file, defines, text, _, _ = ISSUE_17[name]
    example = odd_sized_example(ByteChooser(b""), op_file)
    example = dataclasses.replace(example, defines=tuple(defines.items()))
    return Case(text.replace("; ", "\n"), False, example=example)


@pytest.mark.parametrize("name", sorted(ISSUE_17))
def test_the_differential_run_catches_each_wrong_kernel_of_issue_17(name: str) -> None:
    case = issue_17_case(name)
    op = case_op(case)
    verdict = run_differential(op, apply_unchecked(case.text, op.func))
    assert (verdict.kind, verdict.reason[: len(ISSUE_17[name][4])]) == ISSUE_17[name][3:]
    assert classify(case) == {name}


def test_a_poisoned_build_llvm_rejects_runs_as_tvm_builds_it(monkeypatch) -> None:
    """LLVM's verifier rejected a poisoned build that TVM's own pipeline makes (the third long
    run): the kernel then runs unpoisoned, still compared with the reference; a kernel that
    builds in neither way is the build_error finding."""
    import fuzz.differential as differential

    case = issue_17_case(sorted(ISSUE_17)[0])
    op = case_op(case)

    def rejected(func, target):
        raise RuntimeError("Instruction does not dominate all uses!")

    monkeypatch.setattr(differential, "build_poisoned", rejected)
    assert run_differential(op, op.func).kind == "verified"  # the unscheduled function
    monkeypatch.setattr(differential, "_unpoisoned_build", lambda func, target: None)
    verdict = run_differential(op, op.func)
    assert (verdict.kind, verdict.reason) == (
        "build_error",
        "Instruction does not dominate all uses!",
    )


# How many live cases, at most, the generator needs to write each shape (fuzz/classes.py): on the
# op kind where the shape lives, with fixed seeds, so the count is the same every run. Measured
# first occurrences: A 42, B 27, D 41 (matmul), C 30 (depthwise_conv2d).
REACH_LIMIT = 120
REACHED_ON = {"A": "matmul.py", "B": "matmul.py", "C": "depthwise_conv2d.py", "D": "matmul.py"}
_reached: dict[str, list[set[str]]] = {}


def classes_of_seeds(op_file: str, limit: int):
    """The classes of the live cases of seeds 0, 1, … on `op_file` (cached across the tests)."""
    found = _reached.setdefault(op_file, [])
    for seed in range(limit):
        if seed == len(found):
            data = random.Random(seed).randbytes(4096)
            found.append(classify(live_case(ByteChooser(data), op_file)))
        yield seed, found[seed]


@pytest.mark.parametrize("name", sorted(CLASSES))
def test_the_live_generator_writes_each_shape_of_issue_17(name: str) -> None:
    first = next((s for s, found in classes_of_seeds(REACHED_ON[name], REACH_LIMIT)
                  if name in found), None)  # fmt: skip
    assert first is not None, f"no class {name} ({CLASSES[name]}) in {REACH_LIMIT} live cases"


def test_shrinking_keeps_what_makes_it_fail() -> None:
    example = odd_sized_example(ByteChooser(b""), "matmul.py")
    example = dataclasses.replace(example, defines=(("M", "67"), ("N", "45"), ("K", "33")))
    text = "param T in [17, 4]\nblock C:\n  split i by T\n  unroll k\n  rfactor k\n  vectorize j\n"
    case = Case(text, False, example=example)

    def fails(candidate: Case) -> bool:  # stands in for "checks clean and computes wrong values"
        rows = int(dict(candidate.example.defines)["M"])
        text = candidate.text
        return all(part in text for part in ("block C:", "split i by 17", "rfactor")) and rows % 17

    small = shrink(case, fails)
    assert small.text == "block C:\n  split i by 17\n  rfactor k\n"
    assert small.example.defines == (("M", "1"), ("N", "1"), ("K", "1"))


def test_the_long_run_driver_counts_and_records(tmp_path) -> None:
    figures = diff_run.run(600, 0, 2048, tmp_path, every=10**9, limit=2)
    assert figures["inputs"] == 2 and figures["check_clean"] <= 2
    assert set(figures) >= {"verified", "findings", "classes_generated", "inputs_per_s"}
    assert figures["slow_builds"] == figures["hangs"] == 0


def test_a_slow_build_is_a_finding_of_its_own(monkeypatch) -> None:
    """Property 4: a check-clean schedule builds within BUILD_LIMIT_S; a slower build is a
    "slow_build" finding, which the long run counts apart from the differential verdicts."""
    case = Case("split i by 4\n", gpu=True, nest=None, example=None)
    properties.built_in_time(properties.BUILD_LIMIT_S, case, case.text)
    monkeypatch.setattr(Case, "describe", lambda self: "the case")
    with pytest.raises(properties.PropertyFailure) as failure:
        properties.built_in_time(properties.BUILD_LIMIT_S + 1, case, case.text)
    assert failure.value.kind == "slow_build"
    limit = properties.BUILD_LIMIT_S
    assert f"takes {limit + 1:.0f} s to build, more than {limit:g} s" in str(failure.value)
    counts = diff_run.collections.Counter({"inputs": 3, "verified": 1, "slow_build": 2})
    figures = diff_run.figures(counts, diff_run.collections.Counter(), 1.0)
    assert figures["slow_builds"] == 2 and figures["check_clean"] == 3


# --- the harnesses, so they cannot rot -----------------------------------------------------------


def harness_inputs(name: str, count: int) -> list[bytes]:
    """The harness's seed corpus, then `count` inputs the random driver makes from it."""
    seeds = driver.corpus_inputs(driver.HERE / "corpus" / name)
    rng = random.Random(0)
    return [*seeds, *(driver.mutated(rng, seeds) for _ in range(count))]


def test_harnesses_import_without_atheris() -> None:
    assert callable(fuzz_parse.test_one_input) and callable(fuzz_check.test_one_input)
    assert "atheris" not in sys.modules


def test_parse_harness_over_its_corpus_and_random_bytes() -> None:
    inputs = harness_inputs("parse", 400)
    assert len(inputs) > 400
    for data in inputs:
        fuzz_parse.test_one_input(data)
    assert fuzz_parse.STATS["parsed"] and fuzz_parse.STATS["diagnosed"]


def test_check_harness_over_its_corpus_and_random_bytes() -> None:
    inputs = harness_inputs("check", 40)
    for data in inputs:
        fuzz_check.test_one_input(data)
    # The corpus reaches every stage: syntax errors, diagnostics, CUDA builds, verified runs.
    assert {"syntax", "diagnosed", "built", "verified"} <= set(fuzz_check.STATS)


def test_random_driver_counts_inputs_and_saves_each_new_failure(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(driver, "CRASH_DIR", tmp_path)
    (tmp_path / "corpus").mkdir()
    (tmp_path / "corpus" / "seed").write_bytes(b"split i by 4")
    seen = []

    def fails_on_odd_length(data: bytes) -> None:
        seen.append(data)
        if len(data) % 2:
            raise ValueError("odd")

    failures = driver.random_driver(
        fails_on_odd_length, "fuzz_test", {}, 50, 0, tmp_path / "corpus"
    )
    assert len(seen) == 51 and seen[0] == b"split i by 4"
    assert failures == sum(len(data) % 2 for data in seen) > 0
    assert len(list(tmp_path.glob("fuzz_test-*"))) == 1  # one file per distinct failure


def test_hard_cap_reports_the_input_and_the_stacks_then_ends_the_process(monkeypatch) -> None:
    ended = []
    monkeypatch.setattr(os, "_exit", ended.append)
    path, _ = properties._hang_report()
    with hard_cap("split i by 4  # the input", seconds=0.2):
        time.sleep(1)
    assert ended == [3]
    report = path.read_text(encoding="utf-8")
    assert report.startswith("input ran past the hard cap of 0.2 s:\nsplit i by 4  # the input\n")
    assert "test_hard_cap_reports_the_input" in report  # this thread's stack


# --- regressions: what the fuzzers found ---------------------------------------------------------


def example_case(name: str, text: str) -> Case:
    example = next(e for e in examples() if e.name == name)
    return Case(text, example.gpu, example=example)


def errors(case: Case) -> list[str]:
    result = check(parse(case.text), case_op(case).func, target_of(case.gpu))
    return [d.message for d in result.diagnostics if d.is_error]


# Found by the random driver over fuzz_check's cases (a mutated examples/cuda/softmax.sched):
# checked clean, then tvm.compile failed with "Cannot insert syncs inside condition". row_sum reads
# row_max's cross-thread reduction without binding threadIdx.x, so TVM runs it on thread 0 only,
# under an `if`; its init and update in shared memory need a __syncthreads there.
SOFTMAX_ON_ONE_THREAD = """\
block row_max:
  cache_write row_max shared
  compute_inline exp
  cache_write row_sum shared
block normalize:
  compute_inline row_max_shared
  compute_inline row_sum_shared
  bind i blockIdx.x
  compute_at row_sum i
  compute_at row_max i
block row_max:
  split ax0 by 32
  bind ax0.i threadIdx.x
"""


def test_regression_shared_accumulation_on_one_thread() -> None:
    case = example_case("cuda/softmax.sched", SOFTMAX_ON_ONE_THREAD)
    assert errors(case) == [
        "block row_sum accumulates into shared memory `row_sum_shared` on one thread (under "
        "`if threadIdx.x == 0`), where TVM cannot put the __syncthreads it needs"
    ]
    # With its init split off, row_sum needs no sync inside the `if`: clean, and it builds.
    fixed = example_case("cuda/softmax.sched", SOFTMAX_ON_ONE_THREAD + "block row_sum:\n"
                         "  decompose_reduction at ax0\n")  # fmt: skip
    assert run_case(fixed).stage == "built"


# Found by the random driver over fuzz_check's cases: `unroll by` of a 1024-long loop around a
# 60-iteration body checked clean (a warning only) and tvm.compile ran for over ten minutes in
# LLVM. Unrolling is now measured in copies of the body, LLVM's own unrolling of short inner loops
# included.
LONG_UNROLL = NestSpec("matmul", (("at", 1), ("by", 1024), ("x", 10)), (("rk", 2), ("k0", 3)),
                       "sum", "int32", "C")  # fmt: skip


def test_regression_unroll_of_a_long_loop_over_a_body() -> None:
    case = Case("unroll by\n", False, nest=LONG_UNROLL)
    assert errors(case) == [
        "unrolling `by` makes 61440 copies of the loop body, more than the 2048 LLVM builds in "
        "seconds"
    ]
    start = time.perf_counter()
    assert run_case(Case("split by by 4\nunroll by.i\n", False, nest=LONG_UNROLL)).stage == (
        "verified"
    )
    assert time.perf_counter() - start < 20


# Found by the long differential run (seed 11, through the hard cap): `unroll i` over 67 rows, then
# k of 3 split by *, 8, 16, checked clean with two warnings and LLVM built it for 4.5 minutes. The
# `if` of the guarded split folds in every copy, so LLVM unrolls those loops past its usual 64
# iterations (16 rows: 7 s). Guarded short loops now count in full.
GUARDED = NestSpec("matmul", (("i", 67), ("j", 3)), (("k", 3),), "sum", "float32", "C")


def test_regression_unroll_around_guarded_short_loops() -> None:
    case = Case("unroll i\nsplit k by *, 8, 16\n", False, nest=GUARDED)
    assert errors(case) == [
        "unrolling `i` makes 8576 copies of the loop body, more than the 2048 LLVM builds in "
        "seconds"
    ]
    start = time.perf_counter()
    fine = Case("split i by 4\nunroll i.i\nsplit k by *, 8, 16\n", False, nest=GUARDED)
    assert run_case(fine).stage == "verified"
    assert time.perf_counter() - start < 30


# Found by the tuning tests after the fix above: the loop being unrolled was counted twice (as
# unrolled, and among the loops inside), so the built-in proposer's 8 x 8 register tile with k
# unrolled by 8 counted 4096 copies instead of 512 and was rejected.
def test_unroll_counts_each_unrolled_loop_once() -> None:
    spec = NestSpec("matmul", (("i", 128), ("j", 64)), (("k", 64),), "sum", "float32", "C")
    tile = "tile i, j by 64x32\ntile i.i, j.i by 8x8\nsplit k by 8\n"
    order = "reorder i.o, j.o, i.i.o, j.i.o, k.o, k.i, i.i.i, j.i.i\n"
    case = Case(tile + order + "unroll k.i\nunroll i.i.i\nvectorize j.i.i\n", False, nest=spec)
    assert errors(case) == []
    assert run_case(case).stage == "verified"


# Found while fixing the long unroll, by hand: auto_unroll_max_step=99999 over the same nest unrolls
# just as much and built for minutes (the generators now draw 99999 too).
def test_regression_auto_unroll_max_step_over_a_long_nest() -> None:
    case = Case("pragma at auto_unroll_max_step=99999\n", False, nest=LONG_UNROLL)
    assert errors(case) == [
        "auto_unroll_max_step=99999 unrolls 61440 iterations under `at`, more than the 2048 LLVM "
        "builds in seconds"
    ]
    fine = Case("pragma at auto_unroll_max_step=512\n", False, nest=LONG_UNROLL)
    assert run_case(fine).stage == "verified"


# Found by the long hypothesis run (over its 30 s deadline): `cache_read B local` and
# auto_unroll_max_step=99999 over 19 x 97 x 2 iterations checked clean and built for 20 s; LLVM's
# time grows much faster than the copies (1940 of them: 3 s). The limit came down from 4096 to 2048.
def test_regression_auto_unroll_over_a_local_cache() -> None:
    spec = NestSpec("matmul", (("i", 19),), (("k", 97), ("r", 2)), "sum", "float32", "C_rf")
    text = "unroll k\ncache_read B local\npragma i auto_unroll_max_step=99999\n"
    assert errors(Case(text, False, nest=spec)) == [
        "auto_unroll_max_step=99999 unrolls 3686 iterations under `i`, more than the 2048 LLVM "
        "builds in seconds"
    ]


# Found by the long hypothesis run, through the hard cap: `vectorize in` of the 1000-long rfactor
# loop checked clean (a warning only) and LLVM ran past 120 s. Its loads of B are strided: LLVM's
# time grows eightfold per doubling of the lanes (128: 2.5 s, 512: 141 s).
def test_regression_vectorize_of_a_thousand_strided_lanes() -> None:
    spec = NestSpec("matmul", (("at", 3),), (("in", 1000),), "sum", "int32", "C_rf", "P")
    rfactor = "block C_rf:\n  rfactor in\nblock C_rf_rf:\n"
    assert errors(Case(rfactor + "  vectorize in\n", False, nest=spec)) == [
        "vectorizing 1000 lanes, more than the 128 LLVM builds in seconds"
    ]
    split = Case(rfactor + "  split in by 8\n  vectorize in.i\n", False, nest=spec)
    assert run_case(split).stage == "verified"


# Found by the random driver over fuzz_check's cases (a mutated examples/layernorm.sched, `split j
# by 8` → 7): checked clean and computed wrong values. rfactor of a non-divisible split makes
# var_rf run under an `if` on its own axes; compute_at regenerates its loops over 7 x 10 = 70
# columns of a 64-column row and drops the `if`, so it reads into the next row.
def test_regression_compute_at_drops_the_guard_of_an_rfactor_block() -> None:
    wrong = "block var:\n  split j by 7\n  rfactor j.i\nblock normalize:\n  compute_at var i\n"
    case = example_case("layernorm.sched", wrong + "  compute_at var_rf i\n")
    assert errors(case) == [
        "`compute_at` would drop the `if` that block var_rf runs under, and compute it out of "
        "bounds"
    ]
    divides = example_case("layernorm.sched", case.text.replace("by 7", "by 8"))
    assert run_case(divides).stage == "verified"


# Found by fuzz_check under atheris (random cuda schedules, repaired), twice: checked clean, then
# tvm.compile failed in LowerThreadAllreduce ("load_remap_"). A cross-thread reduction (over
# threadIdx.y here) cannot be copied: `unroll j` copies it, so does an auto_unroll_max_step pragma
# that reaches it, and so does a loop bound to fewer than 16 virtual threads (`bind i vthread.z`).
CROSS_THREAD = NestSpec("matmul", (("i", 13), ("j", 16)), (("rk", 2), ("k0", 13)), "sum", "int32",
                        "C")  # fmt: skip
ACROSS = "bind rk threadIdx.y\nbind i threadIdx.x\n"


@pytest.mark.parametrize(
    "schedule, where",
    [
        ("bind rk threadIdx.y\nunroll j\nbind i threadIdx.x\n", "unrolled loop `j`"),
        (ACROSS + "pragma i auto_unroll_max_step=300\n",
         "loop `j`, which the pragma on `i` unrolls"),
        ("bind rk threadIdx.y\nbind i vthread.z\n", "virtual thread loop `i` (vthread.z)"),
    ],
)  # fmt: skip
def test_regression_copied_cross_thread_reduction(schedule: str, where: str) -> None:
    assert errors(Case(schedule, True, nest=CROSS_THREAD)) == [
        f"block C reduces across threadIdx.y inside {where}: TVM cannot build a copied "
        "cross-thread reduction"
    ]


@pytest.mark.parametrize(
    "fine",
    [
        "unroll k0\n",  # inside the reduction
        "pragma i auto_unroll_max_step=150\n",  # unrolls nothing around it
        "pragma j auto_unroll_max_step=512, unroll_explicit=0\n",  # a hint, nothing copied
        "bind j vthread.x\n",  # 16 virtual threads run as a loop
    ],
)
def test_cross_thread_reduction_that_is_not_copied_builds(fine: str) -> None:
    assert run_case(Case(ACROSS + fine, True, nest=CROSS_THREAD)).stage == "built"


# Found by the long hypothesis run (a mutated examples/cuda/conv2d.sched, `cache_write conv2d
# local` → `warp`): checked clean, then LowerWarpMemory failed ("require positive constant
# coefficient on warp index"). Each thread accumulates 4 x 7 outputs; with more than one element
# per thread, the common subexpressions TVM factors out of the indices hide threadIdx.x.
def test_regression_warp_memory_of_several_elements_per_thread() -> None:
    conv2d = next(e for e in examples() if e.name == "cuda/conv2d.sched")
    case = example_case("cuda/conv2d.sched", conv2d.text.replace(
        "cache_write conv2d local at w.1", "cache_write conv2d warp at w.1"))  # fmt: skip
    assert errors(case) == [
        "warp memory `conv2d_warp` holds 56 elements for 2 threads of threadIdx.x; TVM builds "
        "warp memory only at one element per thread"
    ]
    # One element per thread builds.
    one_each = (
        "split i by 2\nbind i.o blockIdx.x\nbind i.i threadIdx.x\ncache_write C warp at i.i\n"
    )
    matmul = NestSpec("matmul", (("i", 64), ("j", 1)), (("k", 16),), "sum", "float32", "C")
    assert run_case(Case(one_each, True, nest=matmul)).stage == "built"


# Found by the 100 000-line measurement (a file repeating `split i by 2; fuse i.o, i.i as i`): the
# checker ran out of memory after a few dozen lines. TVM names a fused loop after its parts, so the
# name doubled with each round (12 MB after 20 rounds). A fuse that would pass 1024 characters is
# now an error, and the rest of the file is checked as usual.
def test_regression_repeated_split_and_fuse_stays_small() -> None:
    case = Case("", False, nest=NestSpec("elementwise", (("i", 64),), (), "sum", "float32", "C"))
    text = "block C:\n" + "split i by 2\nfuse i.o, i.i as i\n" * 50
    start = time.perf_counter()
    result = check(parse(text), case_op(case).func, target_of(False))
    assert time.perf_counter() - start < 10
    first = result.diagnostics[0]
    assert (first.span.line, first.message) == (
        15,
        "fuse would give TVM's loop a 1525-character name, more than 1024: each split and fuse "
        "of the same loop doubles it",
    )


def test_regression_a_reduction_run_again_over_a_guarded_split() -> None:
    """Seed 5200 of the 2026-12-05 differential run: C computed under the copy loop `ax0` of B,
    that loop then put outside `f0` and split past its extent (99 iterations for 45) re-runs C's
    reduction over `k` for each of the 31 values of `f0` that share a `j`, its init only at
    `k == 0`: 207 where 6.4 was right. The rule that finds an update adding the same term twice
    listed at most 2^18 of its events and skipped this one's 285,417; past that it now follows
    every event of a sample of points, walking the outer loops a value at a time (here and at
    M = 64, N = 5: 2.0 million events)."""
    from schedlang.core.ops import load_op
    from schedlang.core.target import resolve_target

    text = (
        "block C:\n  fuse b, i, j as f0\n  cache_read B global at f0 as B_c1\nblock B_c1:\n"
        "  reverse_compute_at C ax0\n  parallel f0\n  reorder ax0, f0\n  split ax0 by *, 9, 11\n"
    )
    path = os.path.join(os.path.dirname(__file__), "..", "examples", "batch_matmul.py")
    for sizes in ({"M": "31", "N": "3"}, {"M": "64", "N": "5"}):
        op = load_op(path, {"batch": "1", "K": "45", **sizes})
        result = check(parse(text), op.func, resolve_target("llvm"))
        assert not result.ok
        assert any("adds the same terms" in d.message for d in result.diagnostics if d.is_error)


def test_a_reduction_whose_loops_give_each_step_once_is_not_walked(monkeypatch) -> None:
    """The walk above costs a second at 256^3; where TVM's iterator maps prove that the point
    and one of its reads are one-to-one with the update's loops (every built-in matmul
    template), nothing can be added twice and it is not taken."""
    from schedlang.checker import dataflow
    from schedlang.core.ops import load_op
    from schedlang.core.target import resolve_target
    from schedlang.llm.retrieval import _first_point
    from schedlang.propose.builtin import BuiltinProposer
    from schedlang.propose.interface import Context

    def walked(*args, **kwargs):
        raise AssertionError("walked")

    monkeypatch.setattr(dataflow, "_sampled_events", walked)
    target = resolve_target("llvm")
    path = os.path.join(os.path.dirname(__file__), "..", "examples", "matmul.py")
    op = load_op(path, {"M": "256", "N": "256", "K": "256"})
    templates = BuiltinProposer().templates(Context(op, target))
    assert len(templates) >= 3
    for template in templates:
        assert check(parse(_first_point(template).text), op.func, target).ok, template.extra


BAD_BYTES = {
    "nul": b"block C:\n  split i by 4\x00\n",
    "binary": b"\x7fELF\x02\x01\x01\x00\x00\x00split",
    "latin1": "split i by 4  # café\n".encode("latin-1"),
}


@pytest.mark.parametrize("kind", sorted(BAD_BYTES))
@pytest.mark.parametrize(
    "command",
    [
        ["fmt", "{file}"],
        ["fmt", "-"],
        ["parse", "{file}"],
        ["check", "examples/matmul_4x4.py", "{file}"],
        ["check", "examples/matmul_4x4.py", "-"],
        ["compile", "examples/matmul_4x4.py", "--schedule", "{file}", "--emit", "tir"],
        ["run", "examples/matmul_4x4.py", "--schedule", "{file}"],
        ["show", "{file}.py"],
    ],
    ids=lambda command: "-".join(c for c in command if not c.startswith(("{", "examples", "--"))),
)
def test_bad_bytes_give_one_clear_error_on_every_command(command, kind, tmp_path) -> None:
    data = BAD_BYTES[kind]
    path = tmp_path / "input.sched"
    path.write_bytes(data)
    (tmp_path / "input.sched.py").write_bytes(data)
    args = [arg.format(file=path) for arg in command]
    result = CliRunner().invoke(cli.app, args, input=data if "-" in args else None)
    assert result.exit_code == 1, result.output
    assert result.stderr.startswith("error: "), result.stderr
    assert "Traceback" not in result.output and "internal error" not in result.output


def test_poison_fills_stay_within_their_budget() -> None:
    """A buffer allocated inside loops is poisoned in every iteration; past POISON_BUDGET stores
    the fill is left out (a storage_align'd buffer inside 196,608 iterations made a 2 ms kernel
    take 31 s poisoned: a false timeout of seed 13)."""
    from tvm import tirx

    from fuzz.differential import POISON_BUDGET, _poison_allocations

    def nest(trips: int, elements: int):
        buffer = tirx.decl_buffer((elements,), "float32", name="scratch")
        body = tirx.SeqStmt([tirx.AllocBuffer(buffer), tirx.Evaluate(0)])
        return tirx.For(tirx.Var("i", "int32"), 0, trips, tirx.ForKind.SERIAL, body)

    def fills(stmt) -> int:
        return sum(isinstance(s, tirx.For) for s in stmt.body.seq)

    assert fills(_poison_allocations(nest(16, 1024))) == 1
    assert fills(_poison_allocations(nest(POISON_BUDGET // 1024 + 1, 1024))) == 0


def test_a_long_run_goes_on_where_it_stopped(tmp_path) -> None:
    """`diff_run.py --resume` after a run that ended on time takes the next input: two inputs,
    then two more, count and classify as four in one go."""
    from fuzz.diff_run import run

    first = run(60.0, 5, 256, tmp_path / "split", every=1e9, limit=2)
    assert first["inputs"] == 2
    resumed = run(60.0, 5, 256, tmp_path / "split", every=1e9, limit=4, resume=True)
    whole = run(60.0, 5, 256, tmp_path / "whole", every=1e9, limit=4)
    assert resumed["inputs"] == whole["inputs"] == 4
    assert resumed["by_kind"] == whole["by_kind"]
    assert resumed["classes_generated"] == whole["classes_generated"]
