"""CUDA, as a spec, on a machine without a GPU: the schedules in examples/cuda/, the CUDA C they
build to, and the GPU mistakes the checker reports.

Each `examples/cuda/*.sched` names its op and shapes on its first line
(`# op: examples/matmul.py -D M=4096 …`). It must be canonical, check clean for sm_90 (TVM's GPU
verifier included), and build to CUDA C whose key properties (kernels, threads per block, shared
and local arrays, unrolled loops) are kept in a golden file, tests/golden/cuda/<name>.source.txt.
When nvcc is installed the source is compiled to an sm_90 cubin, with no register spills. The
built-in proposer's CUDA templates build for every example op at their first knob values.

The second half holds wrong GPU schedules and what their author is told, as golden files
tests/golden/cuda/<case>.txt, among them mistakes only TVM's GPU verifier finds after lowering.
Nothing here runs a kernel: bench/bench_gpu.py does, on a machine with a GPU.
"""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest
import tvm
from tvm import te, tirx

from schedlang.checker.check import CheckResult, check, kernel_uses, lower_for_verification
from schedlang.core.diagnostics import Severity, render_all
from schedlang.core.ops import Op, load_op
from schedlang.core.target import resolve_target
from schedlang.lang.printer import format_schedule
from schedlang.lang.syntax import parse
from schedlang.propose.builtin import BuiltinProposer
from schedlang.propose.interface import Context
from schedlang.run.build import compile_func, source

ROOT = Path(__file__).resolve().parent.parent
CUDA_EXAMPLES = sorted((ROOT / "examples" / "cuda").glob("*.sched"))
OP_FILES = sorted((ROOT / "examples").glob("*.py"))
GPU = resolve_target("cuda")  # sm_90: 1024 threads per block, 48 KiB of shared memory
OP_LINE = re.compile(r"# op: (?P<path>\S+\.py)(?P<defines>(?: -D \w+=\S+)*)")
NVCC = shutil.which("nvcc") or next(
    (p for p in ("/usr/local/bin/nvcc", "/usr/local/cuda/bin/nvcc") if Path(p).is_file()), None
)


# --- the example schedules -----------------------------------------------------------------------


def op_line(text: str) -> tuple[Path, dict[str, str]]:
    """The op file and defines a schedule's first line names."""
    first = text.splitlines()[0] if text else ""
    match = OP_LINE.fullmatch(first)
    assert match, f"first line must be `# op: examples/OP.py -D NAME=VALUE …`, not `{first}`"
    defines = dict(d.split("=", 1) for d in match["defines"].split(" -D ") if d.strip())
    return ROOT / match["path"], defines


@dataclass(frozen=True)
class Built:
    text: str
    op: Op
    result: CheckResult
    cuda: str


@cache
def built(name: str) -> Built:
    text = (ROOT / "examples" / "cuda" / name).read_text(encoding="utf-8")
    op_path, defines = op_line(text)
    op = load_op(str(op_path), defines)
    result = check(parse(text, name), op.func, GPU)
    assert result.ok and result.lowered is not None, render_all(result.diagnostics, text)
    return Built(text, op, result, source(compile_func(result.lowered.func, GPU), GPU))


def test_there_are_cuda_examples() -> None:
    names = {path.name for path in CUDA_EXAMPLES}
    assert {"matmul.sched", "matmul_fp16.sched", "conv2d.sched", "softmax.sched"} <= names


@pytest.mark.parametrize("path", CUDA_EXAMPLES, ids=lambda p: p.name)
def test_example_is_canonical_and_names_its_op(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    assert format_schedule(parse(text, path.name)) == text, f"run `schedlang fmt {path}`"
    op_path, defines = op_line(text)
    assert op_path.is_file(), f"{path.name} names {op_path}, which does not exist"
    assert defines, f"{path.name} gives no shapes: add `-D NAME=VALUE` to its first line"


@pytest.mark.parametrize("path", CUDA_EXAMPLES, ids=lambda p: p.name)
def test_example_checks_clean_for_sm_90(path: Path) -> None:
    result = built(path.name).result
    assert not result.diagnostics, render_all(result.diagnostics, built(path.name).text)


@pytest.mark.parametrize("path", CUDA_EXAMPLES, ids=lambda p: p.name)
def test_example_cuda_source(path: Path, golden) -> None:
    example = built(path.name)
    golden(f"cuda/{path.stem}.source.txt", describe_cuda(example.cuda))
    # The source agrees with the kernels TVM's GPU verifier saw after lowering.
    kernels = kernel_uses(lower_for_verification(example.result.lowered.func, GPU))
    assert launch_bounds(example.cuda) == [k.threads_per_block for k in kernels]
    # Every shared buffer it counted, at its size (cross-thread reductions add their own later).
    shared = {
        name.removesuffix("_ptr"): size for name, _, size in arrays(example.cuda, "__shared__")
    }
    assert {name: shared.get(name) for k in kernels for name, _ in k.shared} == {
        name: size for k in kernels for name, size in k.shared
    }


@pytest.mark.skipif(NVCC is None, reason="nvcc is not installed")
@pytest.mark.parametrize("path", CUDA_EXAMPLES, ids=lambda p: p.name)
def test_example_compiles_to_an_sm_90_cubin(path: Path, tmp_path: Path) -> None:
    cu = tmp_path / f"{path.stem}.cu"
    cu.write_text(built(path.name).cuda, encoding="utf-8")
    command = [NVCC, "-cubin", "-arch=sm_90", "-Xptxas", "-v", "-o", str(cu.with_suffix(".cubin"))]
    run = subprocess.run([*command, str(cu)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
    assert cu.with_suffix(".cubin").stat().st_size > 0
    # The register tiles stay in registers: a spill would mean local memory in the inner loop.
    spills = re.findall(r"(\d+) bytes spill stores", run.stderr)
    assert spills and all(s == "0" for s in spills), run.stderr[-3000:]


def test_matmul_is_the_seed_case() -> None:
    """32x32 tiles per thread block, 4x4 threads of 8x8 outputs each, k.i unrolled."""
    example = built("matmul.sched")
    assert launch_bounds(example.cuda) == [16]
    assert ("float", "C_local_ptr", 64 * 4) in local_arrays(example.cuda)
    assert re.search(r"#pragma unroll\s+for \(int k_1 = 0; k_1 < 16; \+\+k_1\)", example.cuda)


def test_softmax_reduces_across_threads() -> None:
    example = built("softmax.sched")
    assert launch_bounds(example.cuda) == [256]  # one kernel, one thread block per row
    assert example.cuda.count("__shfl_down_sync") > 0


# --- what the CUDA source is checked for ---------------------------------------------------------

_ARRAY = re.compile(r"(__shared__ )?alignas\(\d+\) (\w+) (\w+)\[(\d+)\];")
_TYPE_BYTES = {
    "float": 4,
    "half": 2,
    "double": 8,
    "int": 4,
    "uint": 4,
    "bool": 1,
    "__nv_bfloat16": 2,
}


def launch_bounds(cuda: str) -> list[int]:
    """Threads per block of each kernel, from its `__launch_bounds__` (definitions only)."""
    return [int(n) for n in re.findall(r"__launch_bounds__\((\d+)\) \w+\([^)]*\) \{", cuda)]


def arrays(cuda: str, kind: str) -> list[tuple[str, str, int]]:
    """(name, element type, bytes) of the kernels' `__shared__` or local arrays."""
    found = []
    for shared, dtype, name, length in _ARRAY.findall(cuda):
        if bool(shared) == (kind == "__shared__"):
            found.append((name, dtype, int(length) * _TYPE_BYTES.get(dtype, 4)))
    return found


def local_arrays(cuda: str) -> list[tuple[str, str, int]]:
    return [(dtype, name, size) for name, dtype, size in arrays(cuda, "local")]


def describe_cuda(cuda: str) -> str:
    """The properties of generated CUDA C that a schedule decides, one per line."""
    bounds = launch_bounds(cuda)
    lines = [f"kernels: {len(bounds)}"]
    lines += [f"threads per block (__launch_bounds__): {', '.join(map(str, bounds))}"]
    for kind in ("__shared__", "local"):
        for name, dtype, size in arrays(cuda, kind):
            length = size // _TYPE_BYTES.get(dtype, 4)
            lines.append(f"{kind} {dtype} {name}[{length}]: {size} bytes")
    shared = sum(size for _, _, size in arrays(cuda, "__shared__"))
    lines.append(f"shared memory: {shared} bytes")
    lines.append(f"__syncthreads: {cuda.count('__syncthreads()')}")
    unrolled = re.findall(r"#pragma unroll\n\s*for \(int (\w+) = 0; \w+ < (\d+);", cuda)
    lines.append(
        "#pragma unroll loops: " + (", ".join(f"{v} ({n})" for v, n in unrolled) or "none")
    )
    vectors = sorted(set(re.findall(r"\*\((float[24]|half2|uint[24]|ulonglong[24])\*\)", cuda)))
    lines.append(f"vector loads and stores: {', '.join(vectors) or 'none'}")
    lines.append(f"warp shuffles: {cuda.count('__shfl_')}")
    return "\n".join(lines) + "\n"


# --- the built-in proposer's CUDA templates -----------------------------------------------------


def small_op(path: Path) -> Op:
    """An example op at its default shapes (small enough to build quickly)."""
    return load_op(str(path))


# Winograd's CUDA templates take a minute to build (four kernels each): slow; the same templates
# are checked and built by test_propose.py::test_every_template_checks_and_builds.
SM_90_OPS = [
    pytest.param(p, id=p.stem, marks=pytest.mark.slow) if p.stem == "conv2d_winograd"
    else pytest.param(p, id=p.stem)
    for p in OP_FILES
]  # fmt: skip


@pytest.mark.parametrize("op_path", SM_90_OPS)
def test_proposer_cuda_templates_build_for_sm_90(op_path: Path) -> None:
    op = small_op(op_path)
    proposer = BuiltinProposer()
    proposals = proposer.templates(Context(op, GPU))
    assert proposals, f"no CUDA template for {op_path.name}: " + "; ".join(
        p.note for p in proposer.dropped
    )
    for proposal in proposals:
        result = check(parse(proposal.text), op.func, GPU)  # knobs at their first values
        assert result.ok, render_all(result.diagnostics, proposal.text)
        cuda = source(compile_func(result.lowered.func, GPU), GPU)
        assert launch_bounds(cuda), f"{proposal.note}: no kernel in\n{cuda}"


# --- wrong GPU schedules and what their author is told -------------------------------------------


@cache
def matmul(m: int = 64, n: int | None = None, k: int | None = None) -> tirx.PrimFunc:
    """C[i, j] = sum over k of A[i, k] * B[k, j] (m x m x m unless given): block C, axes i, j, k."""
    n, k = n or m, k or m
    a = te.placeholder((m, k), name="A")
    b = te.placeholder((k, n), name="B")
    r = te.reduce_axis((0, k), name="k")
    c = te.compute((m, n), lambda i, j: te.sum(a[i, r] * b[r, j], axis=r), name="C")
    return te.create_prim_func([a, b, c])


@cache
def scale(n: int) -> tirx.PrimFunc:
    """B[i] = A[i] * 2: one long spatial axis."""
    a = te.placeholder((n,), name="A")
    b = te.compute((n,), lambda i: a[i] * 2.0, name="B")
    return te.create_prim_func([a, b])


@cache
def two_stage(n: int = 64) -> tirx.PrimFunc:
    """B = A * 2 (axes x, y), then C = B + 1 (axes i, j): two blocks."""
    a = te.placeholder((n, n), name="A")
    b = te.compute((n, n), lambda x, y: a[x, y] * 2.0, name="B")
    c = te.compute((n, n), lambda i, j: b[i, j] + 1.0, name="C")
    return te.create_prim_func([a, c])


@dataclass(frozen=True)
class Case:
    name: str
    op: Callable[[], tirx.PrimFunc]
    op_text: str  # how the golden file names the op
    schedule: str


# A GPU matmul tile: blocks of 16x16 threads, one thread per element of C.
TILE_16 = """\
tile i, j by 16x16
bind i.o blockIdx.y
bind j.o blockIdx.x
bind i.i threadIdx.y
bind j.i threadIdx.x
"""

CASES = [
    # --- found by the checks before lowering -----------------------------------------------------
    Case(
        "gpu_bind_twice",
        matmul,
        "matmul 64^3",
        "split i by 16\nbind i.o blockIdx.x\nbind i.i threadIdx.x\nbind i.i threadIdx.y\n",
    ),
    Case(
        "gpu_bind_after_decompose",
        matmul,
        "matmul 64^3",
        "split i by 16\nbind i.o blockIdx.x\ndecompose_reduction at k\nbind i.i threadIdx.x\n",
    ),
    # No `at`: the copy runs once, before the kernel, over the whole 256 KiB of A.
    Case(
        "gpu_shared_whole_buffer",
        lambda: matmul(256),
        "matmul 256^3",
        TILE_16 + "cache_read A shared\n",
    ),
    Case(
        "gpu_local_across_kernels",
        matmul,
        "matmul 64^3",
        "split i by 16\nbind i.o blockIdx.x\nbind i.i threadIdx.x\ncache_write C local\n"
        "block C_local:\nsplit ax0 by 16\nbind ax0.o blockIdx.x\nbind ax0.i threadIdx.x\n",
    ),
    Case(
        "gpu_grid_extent",
        lambda: scale(2**21),
        "B = A * 2, 2^21 elements",
        "split i by 16\nbind i.o blockIdx.y\nbind i.i threadIdx.x\n",
    ),
    Case(
        "gpu_vthread_reduction",
        matmul,
        "matmul 64^3",
        "split i by 16\nbind i.o blockIdx.x\nbind i.i threadIdx.x\nsplit k by 4\n"
        "bind k.o vthread.x\n",
    ),
    Case(
        "gpu_vthread_too_many",
        matmul,
        "matmul 64^3",
        "split i by *, 16, 4\nbind i.0 blockIdx.x\nbind i.1 vthread.x\nbind i.2 threadIdx.y\n"
        "bind j threadIdx.x\n",
    ),
    # --- found only by TVM's GPU verifier after lowering -----------------------------------------
    # 64 x 192 floats are exactly 48 KiB; storage_align pads each row to 193.
    Case(
        "gpu_verify_shared_padding",
        lambda: matmul(256, 256, 192),
        "matmul 256x256x192",
        "tile i, j by 64x16\nbind i.o blockIdx.y\nbind j.o blockIdx.x\nbind i.i threadIdx.y\n"
        "bind j.i threadIdx.x\ncache_read A shared at j.o\nblock A_shared:\n"
        "storage_align A_shared dim 0 factor 32 offset 1\nfuse ax0, ax1 as f\n"
        "split f by *, 64, 16\nbind f.1 threadIdx.y\nbind f.2 threadIdx.x\n",
    ),
    # Bound before the split, which replaces the kernel's outer loop: the static count reads the
    # threads off the live nest, so it sees the 64 x 32 the kernel launches (once only TVM's
    # verifier did).
    Case(
        "gpu_threads_after_split",
        lambda: matmul(64),
        "matmul 64^3",
        "bind j threadIdx.x\nsplit i by 32\nbind i.o blockIdx.x\nbind i.i threadIdx.y\n",
    ),
    # 8 lanes of float32 build (as ulonglong4), but are two 16-byte accesses on any CUDA GPU.
    Case(
        "gpu_verify_vector_bytes",
        lambda: matmul(256),
        "matmul 256^3",
        TILE_16
        + "split k by 128\nreorder i.o, j.o, k.o, i.i, j.i, k.i\ncache_read A shared at k.o\n"
        "block A_shared:\nfuse ax0, ax1 as f\nsplit f by *, 16, 16, 8\nbind f.1 threadIdx.y\n"
        "bind f.2 threadIdx.x\nvectorize f.3\n",
    ),
]

VERIFIER_CASES = {c.name for c in CASES if c.name.startswith("gpu_verify_")}
WARNING_ONLY = {"gpu_vthread_too_many", "gpu_bind_twice"}


def run(case: Case) -> CheckResult:
    return check(parse(case.schedule, f"{case.name}.sched"), case.op(), GPU)


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
def test_gpu_diagnostics(case: Case, golden) -> None:
    result = run(case)
    assert result.diagnostics, "a wrong schedule must be reported"
    golden(
        f"cuda/{case.name}.txt",
        f"-- {case.name}.sched (cuda, sm_90; op: {case.op_text}) --\n{case.schedule}"
        f"-- diagnostics --\n{render_all(result.diagnostics, case.schedule)}\n",
    )
    assert (result.lowered is None) == (not result.ok)
    if case.name in WARNING_ONLY:
        assert {d.severity for d in result.diagnostics} == {Severity.WARNING}
    else:
        assert not result.ok
    verified = any("GPU verifier" in note for d in result.diagnostics for note in d.notes)
    assert verified == (case.name in VERIFIER_CASES)


@pytest.mark.parametrize("name", sorted(VERIFIER_CASES))
def test_verifier_findings_point_at_a_statement(name: str) -> None:
    """TVM's verifier names no statement; each finding is mapped back to the one that caused it."""
    result = run(next(case for case in CASES if case.name == name))
    assert [d.span is not None for d in result.diagnostics if d.is_error] == [True]


def test_cache_write_to_shared_counts_only_the_tile() -> None:
    """A block computing into shared memory (cache_write) has reduction loops that do not index
    the buffer: 16x16 floats, not 16x16x256."""
    text = TILE_16 + "cache_write C shared at j.o\nblock C_shared:\nbind ax0 threadIdx.y\n"
    text += "bind ax1 threadIdx.x\n"
    result = check(parse(text), matmul(256), GPU)
    assert not result.diagnostics, render_all(result.diagnostics, text)


def test_shared_memory_limit_is_per_kernel() -> None:
    """Two kernels with 32 KiB of shared memory each fit: the limit is per thread block."""
    each = "split {0} by 64\nbind {0}.o blockIdx.x\nbind {1} threadIdx.x\n"
    each += "cache_read {2} shared at {0}.o\nblock {2}_shared:\nfuse ax0, ax1 as f\n"
    each += "split f by 128\nbind f.i threadIdx.x\n"
    text = "block B:\n" + each.format("x", "y", "A") + "block C:\n" + each.format("i", "j", "B")
    result = check(parse(text), two_stage(128), GPU)
    assert result.ok, render_all(result.diagnostics, text)


# --- bench/bench_gpu.py, as far as it goes without a GPU -----------------------------------------


@pytest.fixture(scope="module")
def bench_gpu():
    spec = importlib.util.spec_from_file_location("bench_gpu", ROOT / "bench" / "bench_gpu.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_gpu"] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_bench_without_a_gpu_measures_nothing(bench_gpu, tmp_path: Path, capsys) -> None:
    if tvm.cuda(0).exist:
        pytest.skip("this machine has a CUDA device")
    assert bench_gpu.main(["--out", str(tmp_path)]) == 1
    assert bench_gpu.NO_DEVICE in capsys.readouterr().err
    assert not (tmp_path / "gpu_bench.md").exists()


def test_bench_dry_run_builds_every_example(bench_gpu, tmp_path: Path) -> None:
    assert bench_gpu.main(["--dry-run", "--out", str(tmp_path)]) == 0
    table = (tmp_path / "gpu_bench.md").read_text(encoding="utf-8")
    for path in CUDA_EXAMPLES:
        assert f"| {path.name} |" in table
    assert "| matmul.sched | matmul | M=4096 N=4096 K=4096 | float32 | 137.4 | 16 |" in table


def test_the_tuners_gpu_templates_are_written_for_bench_gpu(bench_gpu, tmp_path: Path) -> None:
    path = ROOT / "bench" / "gpu_templates.py"
    spec = importlib.util.spec_from_file_location("gpu_templates", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    softmax = [("examples/softmax.py", {"rows": "64", "cols": "100"})]
    written = module.write_points(tmp_path, softmax, points=2)
    assert len(written) >= 2  # two points of at least one template, each checked clean
    found = bench_gpu.find_schedules(None, tmp_path)
    assert [path for path, _ in found] == sorted(written)
    assert {entry.kind for _, entry in found} == {"softmax"}
    assert all(entry.defines == {"rows": "64", "cols": "100"} for _, entry in found)


def test_a_model_is_prepared_for_the_gpu_with_its_reference_outputs(tmp_path: Path) -> None:
    path = ROOT / "bench" / "gpu_models.py"
    spec = importlib.util.spec_from_file_location("gpu_models", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    small = [("examples/models/mlp.py", ["batch=2", "features=8", "hidden=16", "layers=2"])]
    (entry,) = module.prepare(tmp_path, small)
    assert entry == {"name": "mlp", "reference": "numpy", "functions": {"dlight": 2}}
    assert (tmp_path / "mlp.so").stat().st_size > 0
    assert len(module.np.load(tmp_path / "mlp_expected.npz").files) == 1


def test_threads_bound_side_by_side_under_a_host_loop_are_two_kernels() -> None:
    """TVM's test_bind2: two threadIdx.x loops of 64 and 16 side by side under an unbound row
    loop are two kernels, each launched with its own extent (the host runs the rows): checked
    clean and built so. Under one blockIdx loop the same two extents share a kernel and are
    refused (golden gpu_thread_axis_two_extents)."""
    from schedlang.run.build import build
    from tests.test_tvm_ground import row_stages

    schedule = "block B:\nbind j0 threadIdx.x\nblock C:\nbind j1o threadIdx.x"
    cuda = source(build(row_stages(), schedule, GPU), GPU)
    assert sorted(set(launch_bounds(cuda))) == [16, 64]
    assert cuda.count("__global__ void") == 4  # two declared, two defined
