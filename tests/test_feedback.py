"""Feedback: the history a model proposing schedules is shown, built from hand-made records on a
target with round peaks (100 GFLOP/s fp32, 10 GB/s), so that every figure can be checked by hand."""

from __future__ import annotations

from pathlib import Path

import pytest
from tvm import te

from schedlang.core.ops import from_primfunc, load_op
from schedlang.core.target import Target
from schedlang.llm.feedback import (
    entry,
    op_bytes,
    render_history,
    roofline,
    tally,
    without_comments,
)
from schedlang.store.records import Record, Status

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
TARGET = Target(
    kind="llvm",
    tvm_config={"kind": "llvm", "mcpu": "znver3", "num-cores": 2},
    cpu="znver3",
    cores=2,
    vector_bits=256,
    peak_gflops=100.0,
    memory_gbps=10.0,
)
DIAGNOSTICS = """\
<answer>:2:9: error: unknown axis `q` in block C
 2 |   split q by 2  # the model's idea
   |         ^
   = note: axes of block C: i, j, k

<answer>:3:13: error: unknown axis `zz` in block C
 3 |   vectorize zz
   |             ^~
   = note: axes of block C: i, j, k

<answer>:4:3: error: the third error

3 errors generated."""


@pytest.fixture(scope="module")
def matmul():
    """256^3: 33.6 MFLOP on 768 KiB, 42.7 FLOP/byte, above the ridge (10): compute-bound."""
    return load_op(str(EXAMPLES / "matmul.py"), {"M": "256", "N": "256", "K": "256"})


@pytest.fixture(scope="module")
def add():
    """C = A + B over 2^20 floats: 1 MFLOP on 12 MiB, memory-bound."""
    a = te.placeholder((1 << 20,), name="A")
    b = te.placeholder((1 << 20,), name="B")
    c = te.compute((1 << 20,), lambda i: a[i] + b[i], name="C")
    return from_primfunc(te.create_prim_func([a, b, c]), name="add")


def record(record_id, schedule, status=Status.OK, median_s=None, **fields) -> Record:
    values = dict(
        op_key="k",
        op_name="op",
        target_key=TARGET.key,
        target=TARGET.tvm_config,
        schedule=schedule,
        knobs={},
        template=None,
        status=status,
        reason="",
        latencies_s=(median_s,) if median_s else (),
        median_s=median_s,
        gflops=None,
        proposer="model:test",
        seed=0,
        created_at=float(record_id),
        schedlang_version="0",
        tvm_version="0",
        extra={},
        id=record_id,
    )
    return Record(**{**values, **fields})


def baseline(median_s=0.1, record_id=1) -> Record:
    return record(record_id, "", median_s=median_s, proposer="baseline", extra={"baseline": True})


# --- what bounds an op ----------------------------------------------------------------------------


def test_a_matmul_is_compute_bound_and_an_addition_memory_bound(matmul, add):
    assert op_bytes(matmul) == 3 * 256 * 256 * 4
    line = roofline(matmul, TARGET)
    assert line.flops == 2 * 256**3 and not line.memory_bound
    assert "42.7 FLOP/byte" in line.describe() and "compute-bound" in line.describe()
    assert op_bytes(add) == 3 * 4 << 20
    assert roofline(add, TARGET).memory_bound
    assert "memory-bound" in roofline(add, TARGET).describe()


def test_without_peaks_an_op_is_rated_in_gflops_without_a_share(matmul):
    bare = Target(kind="llvm", tvm_config={"kind": "llvm"}, cpu=None, cores=1, vector_bits=128)
    text = entry(record(2, "parallel i\n", median_s=1e-3), op=matmul, target=bare)
    assert "33.6 GFLOP/s" in text and "% of" not in text


# --- one entry ------------------------------------------------------------------------------------


def test_an_entry_gives_latency_rate_peak_share_and_speedups(matmul):
    best = record(7, "parallel i\n", median_s=1e-3)
    text = entry(
        record(12, "block C:\n  parallel i\n", median_s=2e-3),
        op=matmul,
        target=TARGET,
        baseline=baseline(),
        best=best,
    )
    head = text.splitlines()[0]
    # 33.6 MFLOP in 2 ms: 16.8 GFLOP/s of 100; the unscheduled build took 100 ms, the best 1 ms.
    assert head == (
        "#12 ok: 2.00 ms, 16.8 GFLOP/s = 17% of peak, 50.0x the unscheduled build, "
        "0.5x the best (#7)"
    )
    assert "```schedlang\nblock C:\n  parallel i\n```" in text
    assert "the best so far" in entry(best, op=matmul, target=TARGET, best=best)


def test_a_memory_bound_op_is_rated_in_gb_per_s_of_its_bandwidth(add):
    # 12 MiB moved in 1.5 ms: 8.39 GB/s, 84% of the 10 GB/s memory bandwidth.
    text = entry(record(3, "parallel i\n", median_s=1.5e-3), op=add, target=TARGET)
    assert "0.699 GFLOP/s, 8.39 GB/s = 84% of memory bandwidth" in text and "of peak" not in text


def test_an_entry_shows_the_knobs_of_a_template_point(matmul):
    point = record(
        4,
        "block C:\n  tile i, j by 8 x 16\n",
        median_s=1e-3,
        knobs={"TI": 8, "TJ": 16},
        template="param TI in [4, 8]\nparam TJ in [16]\nblock C:\n  tile i, j by TI x TJ\n",
    )
    assert "knobs (a point of a template): TI=8, TJ=16" in entry(point, op=matmul, target=TARGET)


def test_a_failure_gives_its_status_reason_and_first_two_diagnostics(matmul):
    rejected = record(
        5,
        "block C:\n  split q by 2\n  vectorize zz\n",
        Status.CHECK_ERROR,
        reason="unknown axis `q` in block C",
        extra={"diagnostics": DIAGNOSTICS},
    )
    text = entry(rejected, op=matmul, target=TARGET)
    assert text.startswith("#5 check_error: unknown axis `q` in block C\n")
    assert "unknown axis `zz`" in text and "the third error" not in text
    assert "errors generated" not in text
    diagnostics = text.split("```")[-1].strip().splitlines()
    assert len(diagnostics) <= 8 + 1 and diagnostics[-1] == "…"
    timed_out = record(6, "unroll k\n", Status.TIMEOUT, reason="run: run took more than 60 s")
    assert entry(timed_out, op=matmul, target=TARGET).startswith(
        "#6 timeout: run: run took more than 60 s\n```schedlang\nunroll k\n```"
    )


def test_comments_are_never_echoed(matmul):
    commented = "# a register tile\nblock C:  # the matmul\n  tile i, j by 8 x 16  # 8 rows\n"
    assert without_comments(commented) == "block C:\n  tile i, j by 8 x 16"
    rejected = record(
        8, commented, Status.CHECK_ERROR, reason="r", extra={"diagnostics": DIAGNOSTICS}
    )
    records = [record(9, commented, median_s=1e-3), rejected]
    text = render_history(records, op=matmul, target=TARGET)
    assert "register tile" not in text and "the matmul" not in text and "8 rows" not in text
    assert "the model's idea" not in text
    assert [line for line in text.splitlines() if "#" in line and not line.startswith("#")] == []


# --- the history ----------------------------------------------------------------------------------


def test_the_tally_does_not_count_rejected_candidates_as_measured():
    statuses = [Status.OK] * 3 + [Status.WRONG, Status.TIMEOUT, Status.BUILD_ERROR]
    statuses += [Status.CHECK_ERROR] * 2
    records = [record(n, f"split i by {n}\n", s) for n, s in enumerate(statuses)]
    assert tally(records) == (
        "So far 5 candidates were measured (built and run): 3 ok, 1 wrong, 1 timed out; "
        "1 failed to build; 2 rejected by the checker."
    )
    assert tally([record(1, "x", Status.CHECK_ERROR)]) == (
        "So far 0 candidates were measured; 1 rejected by the checker."
    )


def test_the_history_shows_the_baseline_once_the_fastest_then_the_latest(matmul):
    records = [
        baseline(median_s=0.1, record_id=1),
        record(2, "split i by 2\n", median_s=4e-3),
        record(3, "split i by 4\n", median_s=1e-3),
        record(4, "split i by 8\n", Status.WRONG, reason="output 2 differs"),
        record(5, "split i by 16\n", median_s=2e-3),
        record(6, "split i by 32\n", median_s=8e-3),
    ]
    text = render_history(records, op=matmul, target=TARGET, best_n=2, latest_n=2)
    assert text.startswith("So far 5 candidates were measured (built and run): 4 ok, 1 wrong.")
    assert text.count("unscheduled build (the empty schedule #1): 100 ms") == 1
    assert "0.01x the best" in text  # the baseline, against 1 ms
    fastest, latest = text.split("The fastest so far:\n")[1].split("The latest others")
    assert [line.split()[0] for line in fastest.splitlines() if line.startswith("#")] == [
        "#3",
        "#5",
    ]
    assert [line.split()[0] for line in latest.splitlines() if line.startswith("#")] == ["#6", "#4"]
    assert "#3 ok: 1.00 ms, 33.6 GFLOP/s = 34% of peak, 100x the unscheduled build" in text
    assert "wrong: output 2 differs" in text
    assert "```schedlang\n```" not in text  # the empty schedule is not a candidate


def test_a_baseline_that_did_not_run_says_why(matmul):
    failed = record(0, "", Status.TIMEOUT, reason="run: run took more than 60 s", id=None)
    text = render_history(
        [record(2, "split i by 2\n", median_s=1e-3)], op=matmul, target=TARGET, baseline=failed
    )
    assert "The unscheduled build (the empty schedule) did not run: timeout: run: run took" in text
    assert "the unscheduled build," not in text


def test_nothing_measured_gives_no_history(matmul):
    assert render_history([], op=matmul, target=TARGET) == ""


def test_the_history_stays_within_its_budget_dropping_latest_then_diagnostics_then_best(matmul):
    long_schedule = "block C:\n" + "".join(f'  annotate i, "k{n}" = {n}\n' for n in range(6))
    records = [record(n, f"split i by {n}\n{long_schedule}", median_s=n * 1e-3) for n in (1, 2, 3)]
    records += [
        record(
            n,
            f"split j by {n}\n",
            Status.CHECK_ERROR,
            reason="unknown axis",
            extra={"diagnostics": DIAGNOSTICS},
        )
        for n in (4, 5, 6)
    ]
    full = render_history(records, op=matmul, target=TARGET)
    assert "#6 check_error" in full and "#5 check_error" in full and "#3 ok" in full

    def shown(text):
        return [line.split()[0] for line in text.splitlines() if line.startswith("#")]

    budgets = range(len(full), 200, -40)
    texts = [render_history(records, op=matmul, target=TARGET, max_chars=n) for n in budgets]
    assert all(len(text) <= n for text, n in zip(texts, budgets, strict=True))
    orders = [shown(text) for text in texts]
    assert ["#1", "#2", "#3", "#6"] in orders  # the older latest entries go first
    with_diagnostics = [t for t in texts if "#6" in shown(t) and "unknown axis `q`" in t]
    without = [t for t in texts if shown(t) == ["#1", "#2", "#3", "#6"] and "`q`" not in t]
    assert with_diagnostics and without  # then the newest one's diagnostics
    assert ["#1", "#6"] in orders  # then the fastest but the first
    assert ["#1"] in orders  # then the newest entry
    assert all(o[0] == "#1" for o in orders if o)  # the fastest stays to the end
    tiny = render_history(records, op=matmul, target=TARGET, max_chars=120)
    assert len(tiny) <= 120 and tiny.endswith("…")
