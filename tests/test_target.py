"""Targets: what a spec resolves to, what TVM gets, and how bad specs are reported."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import tvm
from tvm import te

from schedlang.core.diagnostics import SchedlangError
from schedlang.core.target import Target, resolve_target


def test_host_cpu_comes_from_llvm():
    target = resolve_target("llvm")
    assert target.kind == "llvm"
    assert target.cpu == tvm.target.codegen.llvm_get_system_cpu()
    assert target.cores == (os.cpu_count() or 1) >= 1
    assert target.tvm_config == {"kind": "llvm", "mcpu": target.cpu, "num-cores": target.cores}
    assert not target.is_gpu
    assert target.max_threads_per_block is None and target.warp_size is None
    assert target.vector_lanes("float32") >= 4  # this machine has at least AVX2
    assert "CPU (llvm, " in target.describe()


def test_cpu_is_an_alias_for_llvm():
    assert resolve_target("cpu") == resolve_target("llvm")


def test_host_target_compiles_and_runs():
    a = te.placeholder((64,), name="A", dtype="float32")
    b = te.compute((64,), lambda i: a[i] * 2.0, name="B")
    target = resolve_target("llvm")
    assert target.to_tvm().kind.name == "llvm"
    executable = tvm.compile(te.create_prim_func([a, b]), target=target.to_tvm())
    a_np = np.arange(64, dtype="float32")
    a_nd = tvm.runtime.tensor(a_np, tvm.cpu())
    b_nd = tvm.runtime.tensor(np.zeros(64, dtype="float32"), tvm.cpu())
    executable(a_nd, b_nd)
    np.testing.assert_allclose(b_nd.numpy(), a_np * 2.0)


def test_cores_argument_sets_num_cores():
    target = resolve_target("llvm", cores=1)
    assert target.cores == 1
    assert target.tvm_config["num-cores"] == 1
    assert target.to_tvm().attrs["num-cores"] == 1


def test_cuda_defaults_to_sm_90_without_a_gpu():
    target = resolve_target("cuda")
    assert target.kind == "cuda" and target.is_gpu
    assert target.arch == "sm_90"
    assert target.max_threads_per_block == 1024
    assert target.max_thread_extent == (1024, 1024, 64)
    assert target.max_grid_extent == (2**31 - 1, 65535, 65535)
    assert target.warp_size == 32
    assert target.max_shared_memory_per_block == 49152
    assert target.max_registers_per_block == 65536
    assert target.vector_bits == 128 and target.vector_lanes("float16") == 8
    tvm_target = target.to_tvm()
    assert tvm_target.kind.name == "cuda"
    assert tvm_target.attrs["max_shared_memory_per_block"] == 49152
    assert "threadIdx.x <= 1024" in target.describe()


def test_cuda_arch_is_honoured():
    target = resolve_target("cuda", arch="sm_80")
    assert target.arch == "sm_80"
    assert target.tvm_config["arch"] == "sm_80"
    assert target.key != resolve_target("cuda").key


def test_tvm_tag():
    target = resolve_target("nvidia/nvidia-a100")
    assert target.tvm_config == {"tag": "nvidia/nvidia-a100"}
    assert (target.kind, target.arch, target.warp_size) == ("cuda", "sm_80", 32)


def test_json_dict_with_schedlang_overrides():
    spec = {
        "kind": "llvm",
        "mcpu": "skylake-avx512",
        "num-cores": 8,
        "schedlang": {"vector_bits": 256, "l1_bytes": 32768},
    }
    target = resolve_target(json.dumps(spec))
    assert target.tvm_config == {"kind": "llvm", "mcpu": "skylake-avx512", "num-cores": 8}
    assert (target.cpu, target.cores, target.l1_bytes) == ("skylake-avx512", 8, 32768)
    assert target.vector_bits == 256
    assert [target.vector_lanes(d) for d in ("float64", "float32", "bfloat16", "int8")] == [
        4,
        8,
        16,
        32,
    ]
    assert target.to_tvm().attrs["mcpu"] == "skylake-avx512"


def test_llvm_reports_avx512_width():
    target = resolve_target('{"kind": "llvm", "mcpu": "skylake-avx512", "num-cores": 8}')
    assert target.vector_bits == 512


def test_vector_lanes_is_at_least_one():
    target = resolve_target('{"kind": "llvm", "schedlang": {"vector_bits": 8}}')
    assert target.vector_lanes("float64") == 1


def test_json_file(tmp_path):
    path = tmp_path / "gpu.json"
    path.write_text(json.dumps({"kind": "cuda", "arch": "sm_75"}))
    target = resolve_target(str(path))
    assert (target.kind, target.arch, target.max_threads_per_block) == ("cuda", "sm_75", 1024)
    assert target == resolve_target("cuda", arch="sm_75")


def test_tvm_config_is_canonical():
    target = resolve_target('{"num-cores": 2, "mcpu": "znver3", "kind": "llvm"}')
    assert list(target.tvm_config) == sorted(target.tvm_config)
    assert target.key == '{"kind":"llvm","mcpu":"znver3","num-cores":2}'


def test_json_round_trip():
    for target in (resolve_target("llvm"), resolve_target("cuda", arch="sm_86")):
        data = target.to_json()
        assert Target.from_json(data) == target
        assert Target.from_json(json.dumps(data)) == target
        assert hash(Target.from_json(data)) == hash(target)
        assert Target.from_json(data).to_tvm().kind.name == target.kind


def test_targets_differing_in_cores_have_different_keys():
    one, two = resolve_target("llvm", cores=1), resolve_target("llvm", cores=2)
    assert one.key != two.key
    assert len({one, two}) == 2


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("llvm -mcpu=native", "no longer accepts command-line target strings"),
        ("{not json", "not valid JSON"),
        ('{"kind": "nosuchkind"}', 'Target kind "nosuchkind" is not defined'),
        ("tpu", 'Target kind "tpu" is not defined'),
        ('{"kind": "llvm", "mcpu": "native"}', "LLVM does not know the CPU `native`"),
        ('{"kind": "llvm", "foo": 1}', "Unknown config option 'foo'"),
        ('{"kind": "cuda", "arch": "banana"}', "invalid CUDA arch"),
        ("[1, 2]", "cannot read target spec"),
        ("missing.json", "does not exist"),
        ('{"kind": "llvm", "schedlang": {"vectorbits": 8}}', 'unknown "schedlang" override'),
        ('{"kind": "llvm", "schedlang": {"cores": "two"}}', "must be a positive integer"),
    ],
)
def test_bad_specs_are_reported_not_raised_from_tvm(spec, expected):
    with pytest.raises(SchedlangError) as info:
        resolve_target(spec)
    assert expected in info.value.message
    assert "\n" not in info.value.message
    assert "Traceback" not in info.value.render()


def test_cli_string_error_shows_the_dict_form():
    with pytest.raises(SchedlangError) as info:
        resolve_target("llvm -mcpu=native")
    assert any('{"kind": "llvm", "mcpu": "native"}' in note for note in info.value.notes)
    assert any('"llvm" picks' in note for note in info.value.notes)


def test_unknown_kind_lists_accepted_forms():
    with pytest.raises(SchedlangError) as info:
        resolve_target("tpu")
    assert any('"cuda"' in note and "JSON" in note for note in info.value.notes)


# --- peak rates -----------------------------------------------------------------------------------


def test_gpu_peaks_come_from_the_part_table():
    a100 = resolve_target("cuda", arch="sm_80")
    assert (a100.peak_gflops, a100.memory_gbps) == (19_500, 1555)
    assert "peak 19.5 TFLOP/s fp32, memory 1.55 TB/s" in a100.describe()
    assert resolve_target("nvidia/nvidia-a100").peak_gflops == 19_500
    h100 = resolve_target("cuda")
    assert (h100.peak_gflops, h100.memory_gbps) == (66_900, 3350)
    assert h100.ridge_flops_per_byte == pytest.approx(66_900 / 3350)


def test_cpu_peak_is_cores_clock_fp32_lanes_and_two_fma_pipes():
    # Not this host's CPU: its clock is taken as 3 GHz, and its memory bandwidth is not known.
    target = resolve_target('{"kind": "llvm", "mcpu": "skylake-avx512", "num-cores": 8}')
    assert target.peak_gflops == 8 * 3.0 * (512 // 32) * 2 * 2
    assert target.memory_gbps is None and target.ridge_flops_per_byte is None
    assert target.describe().endswith("peak 1.54 TFLOP/s fp32")


def test_host_cpu_rates_are_estimated_and_measured():
    target = resolve_target("llvm")
    lanes = target.vector_bits // 32
    assert target.peak_gflops >= target.cores * 1.0 * lanes * 2  # at least 1 GHz, no FMA
    assert 0.5 < target.memory_gbps < 10_000
    assert f"peak {target.peak_gflops:.0f} GFLOP/s fp32" in target.describe()
    assert "memory " in target.describe() and "B/s" in target.describe()
    assert resolve_target("llvm", cores=1).peak_gflops == pytest.approx(
        target.peak_gflops / target.cores, abs=0.1
    )


def test_rate_overrides_win_and_nothing_is_measured(monkeypatch):
    from schedlang.core import target as target_module

    def no_measuring(threads):
        raise AssertionError("memory bandwidth measured despite the override")

    monkeypatch.setattr(target_module, "_host_memory_gbps", no_measuring)
    spec = {"kind": "llvm", "schedlang": {"peak_gflops": 230, "memory_gbps": 20.5}}
    target = resolve_target(json.dumps(spec))
    assert (target.peak_gflops, target.memory_gbps) == (230.0, 20.5)
    assert target.describe().endswith("peak 230 GFLOP/s fp32, memory 20.5 GB/s")
    assert "schedlang" not in target.key  # overrides never reach TVM
    with pytest.raises(SchedlangError, match="must be a positive number"):
        resolve_target('{"kind": "llvm", "schedlang": {"memory_gbps": "fast"}}')


def test_json_written_before_the_rates_still_loads():
    data = resolve_target("cuda", arch="sm_75").to_json()
    old = {
        name: value for name, value in data.items() if name not in ("peak_gflops", "memory_gbps")
    }
    target = Target.from_json(old)
    assert (target.peak_gflops, target.memory_gbps) == (None, None)
    assert target.key == Target.from_json(data).key
    assert "peak" not in target.describe()


# --- issue 17: no internal error on any target; no kernel run on a CPU that cannot run it -------


def test_regression_deeply_nested_target_json_is_refused_not_a_recursion_error(tmp_path):
    deep = '{"kind": "llvm", "x": ' + "[" * 50_000 + "]" * 50_000 + "}"
    with pytest.raises(SchedlangError) as info:
        resolve_target(deep)
    assert info.value.message == "target spec is nested 50001 levels deep: the limit is 16"
    path = tmp_path / "deep.json"
    path.write_text('{"kind": "llvm", "host": ' + '{"a": ' * 900 + "1" + "}" * 901)
    with pytest.raises(SchedlangError, match=f"target file {path} is nested 901 levels deep"):
        resolve_target(str(path))


def test_json_depth_skips_brackets_in_strings():
    from schedlang.core.target import json_depth

    assert json_depth('{"kind": "llvm", "keys": ["cpu"], "x": "[[[{{\\"]]"}') == 2
    assert json_depth("[]") == 1 and json_depth('"["') == 0


@pytest.fixture
def avx2_host(monkeypatch):
    """This machine as an AVX2 host without AVX-512, whatever it really is."""
    from schedlang.core import target as target_module

    flags = "fpu sse sse2 pni ssse3 sse4_1 sse4_2 popcnt abm movbe bmi1 bmi2 f16c fma avx avx2"
    monkeypatch.setattr(target_module, "_host_cpu_flags", lambda: frozenset(flags.split()))
    target_module._missing_host_features.cache_clear()
    yield
    target_module._missing_host_features.cache_clear()


def test_regression_a_cpu_this_machine_is_not_is_refused_before_running(avx2_host):
    from schedlang.core.target import missing_host_features, require_runs_here

    target = resolve_target('{"kind": "llvm", "mcpu": "skylake-avx512"}')
    assert missing_host_features(target) == [
        "avx512bw",
        "avx512cd",
        "avx512dq",
        "avx512f",
        "avx512vl",
    ]
    with pytest.raises(SchedlangError) as info:
        require_runs_here(target)
    assert info.value.message.startswith(
        "kernels built for CPU `skylake-avx512` may use avx512bw, avx512cd, avx512dq, avx512f, "
        "avx512vl, which this machine's CPU"
    )
    assert info.value.message.endswith("lacks: run here, they would die of an illegal instruction")
    # An extension asked for by mattr counts as well; a CPU within the host's features runs.
    with pytest.raises(SchedlangError, match="with mattr \\+avx512f may use avx512f,"):
        require_runs_here(
            resolve_target('{"kind": "llvm", "mcpu": "haswell", "mattr": ["+avx512f"]}')
        )
    require_runs_here(resolve_target('{"kind": "llvm", "mcpu": "haswell"}'))


def test_another_architecture_is_refused_before_running():
    from schedlang.core.target import require_runs_here

    target = resolve_target(
        '{"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mcpu": "neoverse-v1"}'
    )
    with pytest.raises(SchedlangError, match=r"the target is for aarch64 .* cannot run here"):
        require_runs_here(target)


def test_this_machine_and_gpus_are_not_refused():
    from schedlang.core.target import missing_host_features, require_runs_here

    host = resolve_target("llvm")
    assert missing_host_features(host) == []
    require_runs_here(host)
    require_runs_here(resolve_target("cuda"))  # whether a GPU is here is measure.device_for's


def test_a_cpu_target_still_builds_for_a_cpu_this_machine_is_not(avx2_host):
    a = te.placeholder((64,), name="A", dtype="float32")
    b = te.compute((64,), lambda i: a[i] * 2.0, name="B")
    target = resolve_target('{"kind": "llvm", "mcpu": "skylake-avx512"}')
    tvm.compile(te.create_prim_func([a, b]), target=target.to_tvm())  # cross-compiling is fine
