"""Hardware limits as data, in one place, filled from TVM's target attributes.

`resolve_target` turns what a user writes (`llvm`, `cuda`, a tag, a JSON target dict or a `.json`
file) into a `Target`: the canonical TVM target dict plus the facts the checker and the proposers
need (cores, SIMD width, caches, GPU thread and memory limits, peak rates). Checks then read
one field and name both numbers, e.g.
`f"block uses {threads} threads, max {target.max_threads_per_block}"`.

Facts come, in order of precedence, from the `"schedlang"` overrides in a JSON spec, the TVM
target's attributes, what LLVM says about the CPU, `/sys` (host caches), and the CUDA table below.

Peak rates say how far a measured kernel is from what the hardware can do. A GPU's come from its
part in the CUDA table (the datasheet's fp32 TFLOP/s and DRAM bandwidth). A CPU's fp32 peak is
estimated as cores x clock x fp32 lanes x 2 (an FMA is two flops) x FMA pipes; the clock is the
host's maximum (psutil), else its current clock (a VM shows its base clock: turbo may beat the
estimate), else 3 GHz for a CPU other than this host's. Its memory bandwidth is measured once per
process on this host (a numpy copy of 64 MiB on a thread per core, best of 3, ~50 ms), and unknown
for another CPU. `"schedlang": {"peak_gflops": 2000, "memory_gbps": 120}` in a JSON spec gives
either figure instead, and nothing is measured then.
"""

from __future__ import annotations

import json
import os
import re
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, fields
from functools import cache
from pathlib import Path
from typing import Any

import tvm
from tvm.target import codegen

from schedlang.core.diagnostics import SchedlangError, did_you_mean
from schedlang.core.presets import PRESETS, close_preset, expand_preset, preset_spec

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB

# Limits shared by every CUDA architecture from sm_70 on (CUDA C Programming Guide, "Compute
# Capabilities"). Shared memory is the 48 KiB a kernel gets with static allocation; more needs a
# dynamic allocation plus cudaFuncSetAttribute opt-in, which TVM-generated kernels do not do.
_CUDA_LIMITS = {
    "max_threads_per_block": 1024,
    "max_shared_memory_per_block": 48 * KiB,
    "registers_per_block": 64 * KiB,
}
_CUDA_THREAD_EXTENT = (1024, 1024, 64)
_CUDA_GRID_EXTENT = (2**31 - 1, 65535, 65535)


@dataclass(frozen=True)
class _CudaPart:
    """A representative part of one architecture: SMs, L2 and rates differ between parts."""

    name: str
    sms: int
    l2_bytes: int
    shared_optin_bytes: int  # per-block shared memory with opt-in (not used by TVM kernels)
    peak_gflops: float  # fp32 without tensor cores, from the datasheet
    memory_gbps: float  # DRAM bandwidth, from the datasheet
    memory_bytes: int  # global memory, from the datasheet (the smallest model of the part)


_CUDA_PARTS = {
    "sm_70": _CudaPart("V100", 80, 6 * MiB, 96 * KiB, 15_700, 900, 16 * GiB),
    "sm_75": _CudaPart("T4", 40, 4 * MiB, 64 * KiB, 8_100, 320, 16 * GiB),
    "sm_80": _CudaPart("A100 40GB", 108, 40 * MiB, 163 * KiB, 19_500, 1555, 40 * GiB),
    "sm_86": _CudaPart("A10", 72, 6 * MiB, 99 * KiB, 31_200, 600, 24 * GiB),
    "sm_89": _CudaPart("L4", 58, 48 * MiB, 99 * KiB, 30_300, 300, 24 * GiB),
    "sm_90": _CudaPart("H100 SXM", 132, 50 * MiB, 227 * KiB, 66_900, 3350, 80 * GiB),
}

# fp32 flops per SIMD lane, per cycle and core, by the first of these features LLVM reports. With
# FMA: two FMA pipes of two flops each, as in Intel cores from Haswell on, AMD from Zen 2 on, Xeon
# Gold and Platinum (AVX-512) and Arm Neoverse. Xeon Silver and Bronze have one AVX-512 pipe and
# Zen 1 splits 256-bit operations: give their peak_gflops as an override. Without FMA: one
# multiply and one add pipe.
_FLOPS_PER_LANE = (("fma", 4), ("neon", 4), ("avx", 2), ("sse", 2))
_DEFAULT_CLOCK_GHZ = 3.0  # for a CPU other than this host's, whose clock is not known here
_COPY_BYTES = 64 * MiB  # leaves every cache, and copies in a few milliseconds

# A TVM target dict is nearly flat (a `host` dict, a `keys` list): deeper JSON is a mistake, and
# Python's JSON reader and TVM would recurse once per level.
MAX_JSON_DEPTH = 16

# LLVM's names of x86 instruction set extensions, and the flag Linux shows for each in
# /proc/cpuinfo when the CPU (or the VM it runs in) offers it. A kernel built for a CPU with one of
# these that this machine lacks may die of SIGILL here.
_X86_CPUINFO_FLAGS = {
    "sse3": "pni",
    "ssse3": "ssse3",
    "sse4.1": "sse4_1",
    "sse4.2": "sse4_2",
    "sse4a": "sse4a",
    "popcnt": "popcnt",
    "lzcnt": "abm",
    "movbe": "movbe",
    "bmi": "bmi1",
    "bmi2": "bmi2",
    "f16c": "f16c",
    "fma": "fma",
    "fma4": "fma4",
    "xop": "xop",
    "avx": "avx",
    "avx2": "avx2",
    "avxvnni": "avx_vnni",
    "avx512f": "avx512f",
    "avx512cd": "avx512cd",
    "avx512bw": "avx512bw",
    "avx512dq": "avx512dq",
    "avx512vl": "avx512vl",
    "avx512ifma": "avx512ifma",
    "avx512vbmi": "avx512vbmi",
    "avx512vbmi2": "avx512_vbmi2",
    "avx512vnni": "avx512_vnni",
    "avx512bitalg": "avx512_bitalg",
    "avx512vpopcntdq": "avx512_vpopcntdq",
    "avx512bf16": "avx512_bf16",
    "avx512fp16": "avx512_fp16",
    "amx-tile": "amx_tile",
    "amx-int8": "amx_int8",
    "amx-bf16": "amx_bf16",
    "gfni": "gfni",
    "vaes": "vaes",
    "vpclmulqdq": "vpclmulqdq",
}
# The same for AArch64, whose /proc/cpuinfo says `Features`.
_ARM_CPUINFO_FLAGS = {
    "neon": "asimd",
    "fullfp16": "fphp",
    "dotprod": "asimddp",
    "i8mm": "i8mm",
    "bf16": "bf16",
    "sve": "sve",
    "sve2": "sve2",
    "sme": "sme",
}

_ACCEPTED_FORMS = (
    'accepted targets: "llvm" (or "cpu") for this machine\'s CPU; "cuda" (--arch sm_80 picks '
    'the architecture, default sm_90); a board preset such as "rpi4" (rpi4, rpi5, jetson-orin, '
    'cortex-x4); a TVM tag such as "nvidia/nvidia-a100"; a JSON target dict '
    'such as {"kind": "llvm", "mcpu": "skylake-avx512", "num-cores": 8}; or a path to a .json '
    "file holding one"
)


@dataclass(frozen=True)
class Target:
    """What a schedule may assume about the hardware. GPU fields are None exactly on CPUs."""

    kind: str
    tvm_config: dict[str, Any]  # canonical TVM target dict (sorted keys, JSON types): what TVM gets
    cpu: str | None
    cores: int  # CPU cores; streaming multiprocessors on a GPU
    vector_bits: int  # SIMD register width; on GPUs the widest vector load (128)
    vector_registers: int = 16  # SIMD registers a CPU core names: 32 with AVX-512 or on Arm
    l1_bytes: int | None = None
    l2_bytes: int | None = None
    max_threads_per_block: int | None = None
    max_thread_extent: tuple[int, int, int] | None = None
    max_grid_extent: tuple[int, int, int] | None = None
    warp_size: int | None = None
    max_shared_memory_per_block: int | None = None
    max_registers_per_block: int | None = None
    arch: str | None = None
    peak_gflops: float | None = None  # fp32 peak of the whole device
    memory_gbps: float | None = None  # main memory (DRAM) bandwidth
    # The memory a kernel's buffers share: this machine's RAM (psutil) for an LLVM target on
    # this host, the GPU's global memory (the CUDA table) for CUDA; None where not known (a CPU
    # other than this host's), and then only int32 bounds a buffer.
    memory_bytes: int | None = None
    # Limits of TVM's code generators and of build time rather than of the chip (schedlang.check).
    # Straight-line copies of a loop body past which LLVM's build time explodes (measured on 2
    # cores: 1940 copies of a multiply-add reading a local cache build in 3 s, 3686 in 20 s; 6144
    # copies of an integer multiply-add in 66 s, 15360 in 141 s). The same number bounds the
    # statements TVM's UnrollLoop lays out, `unroll` and auto_unroll_max_step together (copies of
    # a float32 copy: 2048 in 2 s, 8192 in 4 s, 32768 in 22 s; 131072 past the fuzzer's 120 s).
    unroll_max_copies: int = 2048
    # What one unrolled statement under an `if` that is the same in every copy (the guard of a
    # non-dividing split outside the unrolled loop) weighs against that number in LLVM: 1024
    # copies of an int32 store built in 5 s, under such a guard in 36 s; 512 in 1 s and 6 s.
    unroll_guard_weight: int = 4
    unroll_warn_extent: int = 512  # an unroll longer than this warns
    llvm_full_unroll: int = 64  # the trip count up to which LLVM unrolls a constant loop itself
    # The trip count up to which LLVM's full unroll simulates a loop's iterations to see what
    # folds (its unroll-max-iteration-count-to-analyze): such a loop whose copies a split's guard
    # folds away is unrolled whatever its body's size, and the nest of them is the copies
    # LLVM lays out with no `unroll` at all (issue 33's second long run).
    llvm_unroll_analyze: int = 10
    # The widest vector LLVM builds quickly when its loads are strided (gathers): measured for
    # int32, 128 lanes in 2.5 s, 256 in 17 s, 512 in 141 s. Found by fuzzing.
    cpu_max_lanes: int = 128
    gpu_max_lanes: int = 8  # the widest vector type TVM's CUDA code generator emits
    # The limits MetaSchedule's VerifyGPUCode postproc adds to the target's: virtual threads per
    # axis, and the bytes one vector load or store may move (128 bits).
    max_vthread: int = 8
    max_vector_bytes: int = 16
    copied_vthreads: int = 16  # TVM interleaves fewer virtual threads than this by copying
    # TVM indexes buffers with int32 unless a buffer is declared int64: a buffer a statement makes
    # (rfactor's, a storage-aligned one) must stay under this many elements.
    int32_elements: int = 2**31 - 1
    # The largest buffer one statement may add (rfactor multiplies the output by the reduction's
    # extent: a 1000 x 999 x 997 matmul's C_rf is 4 GB).
    max_made_buffer_bytes: int = 2**30
    # A CPU op of less work than this (flops, or elements moved by a copy) gets each template
    # also on one thread (its `parallel` statements left out), first: waking the thread pool
    # costs microseconds, 4-6 us on a 2-core Zen 4 against 0.06-1.5 us for 2^10-2^14 elements
    # of a vectorized elementwise op, and far more while another process has a core
    # (docs/templates.md). Past it, the parallel forms alone.
    serial_work: int = 2**17

    def __hash__(self) -> int:
        return hash(self.key)

    @property
    def key(self) -> str:
        """The canonical JSON of `tvm_config`: keys database records."""
        return json.dumps(self.tvm_config, sort_keys=True, separators=(",", ":"))

    @property
    def is_gpu(self) -> bool:
        return self.max_threads_per_block is not None

    def device(self) -> str:
        """The runtime device its kernels run on, as `tvm.device` and an RPC session name it:
        "cpu" for an LLVM target, else the GPU kind ("cuda")."""
        return "cpu" if self.kind == "llvm" else self.kind

    def vector_lanes(self, dtype: str) -> int:
        """How many `dtype` values fit in one vector register (GPU: one widest load); at least 1."""
        try:
            bits: int = tvm.DataType(dtype).bits
        except ValueError as err:
            raise SchedlangError(f"unknown dtype `{dtype}`", "e.g. float32, float16, int8") from err
        return max(1, self.vector_bits // max(bits, 1))

    def to_tvm(self) -> tvm.target.Target:
        target = _TVM_TARGETS.get(self.key)
        if target is None:
            target = _TVM_TARGETS[self.key] = tvm.target.Target(self.tvm_config)
        return target

    @property
    def ridge_flops_per_byte(self) -> float | None:
        """Where the roofline bends: an op doing fewer flops per byte is memory-bound."""
        if not self.peak_gflops or not self.memory_gbps:
            return None
        return self.peak_gflops / self.memory_gbps

    def describe(self) -> str:
        simd = f"{self.vector_bits}-bit"
        lanes = f"{self.vector_lanes('float32')} x float32"
        rates = [f"peak {format_rate(self.peak_gflops, 'FLOP/s')} fp32"] if self.peak_gflops else []
        rates += [f"memory {format_rate(self.memory_gbps, 'B/s')}"] if self.memory_gbps else []
        if not self.is_gpu:
            cores = f"{self.cores} core{'s' * (self.cores != 1)}"
            if self.kind == "llvm" and "num-cores" not in self.tvm_config:
                cores += " (no num-cores given)"
            facts = [cores, f"{simd} SIMD ({lanes})"]
            facts += [f"L1 {_size(self.l1_bytes)}"] if self.l1_bytes else []
            facts += [f"L2 {_size(self.l2_bytes)}"] if self.l2_bytes else []
            return f"CPU ({self.kind}, {self.cpu or 'generic'}): " + ", ".join(facts + rates)
        head = f"GPU ({self.kind}, {self.arch or 'default arch'}): {self.cores} SMs"
        head += f", warp {self.warp_size}" if self.warp_size else ""
        head += f", L2 {_size(self.l2_bytes)}" if self.l2_bytes else ""
        head += "".join(f", {rate}" for rate in rates)
        x, y, z = self.max_thread_extent or (0, 0, 0)
        gx, gy, gz = self.max_grid_extent or (0, 0, 0)
        lines = [
            head,
            f"  threads per block: at most {self.max_threads_per_block} "
            f"(threadIdx.x <= {x}, threadIdx.y <= {y}, threadIdx.z <= {z})",
            f"  blocks per grid: blockIdx.x <= {gx}, blockIdx.y <= {gy}, blockIdx.z <= {gz}",
            f"  vector loads: {simd} ({lanes})",
        ]
        if self.max_shared_memory_per_block:
            lines.append(f"  shared memory per block: {_size(self.max_shared_memory_per_block)}")
        if self.max_registers_per_block:
            lines.append(f"  registers per block: {self.max_registers_per_block}")
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        plain: dict[str, Any] = json.loads(json.dumps(asdict(self)))
        return plain

    @classmethod
    def from_json(cls, data: dict[str, Any] | str) -> Target:
        loaded: dict[str, Any] = json.loads(data) if isinstance(data, str) else data
        values = {f.name: loaded[f.name] for f in fields(cls) if f.name in loaded}
        for name in ("max_thread_extent", "max_grid_extent"):
            if values.get(name) is not None:
                values[name] = tuple(values[name])
        values["tvm_config"] = _canonical(values["tvm_config"])
        return cls(**values)


_TVM_TARGETS: dict[str, tvm.target.Target] = {}
_OVERRIDABLE = [f.name for f in fields(Target) if f.name not in ("kind", "tvm_config")]


def as_target(target: Target | str) -> Target:
    """A Target as it is, or a spec read by `resolve_target`: what every API taking either uses."""
    return target if isinstance(target, Target) else resolve_target(target)


def resolve_target(spec: str, *, arch: str | None = None, cores: int | None = None) -> Target:
    """Read a target spec; `arch` is the CUDA arch (or the LLVM CPU name), `cores` the core count.

    Raises `SchedlangError` with a one-line reason for anything TVM or LLVM would not accept.
    """
    config = _read_spec(spec.strip())
    if "preset" in config:  # a board's data (schedlang.core.presets), the spec's keys over it
        config = expand_preset(config, _OVERRIDABLE)
    overrides = config.pop("schedlang", {})
    if not isinstance(overrides, dict):
        raise SchedlangError('"schedlang" overrides must be a JSON object', _ACCEPTED_FORMS)
    kind = config.get("kind")
    if kind is None and "tag" in config:
        kind = _build({"tag": config["tag"]}).kind.name
    if arch is not None:
        config["arch" if kind == "cuda" else "mcpu"] = arch
    if cores is not None:
        if cores < 1:
            raise SchedlangError(f"cores must be at least 1, got {cores}")
        if kind == "llvm":
            config["num-cores"] = cores
    if "tag" not in config:  # a tag brings its own limits
        _add_defaults(config)
    if kind == "llvm":
        _check_llvm_cpu(config)
    config = _canonical(config)
    tvm_target = _build(config)
    is_gpu = "gpu" in tvm_target.keys
    facts = _gpu_facts(tvm_target) if is_gpu else _cpu_facts(tvm_target)
    if cores is not None:
        facts["cores"] = cores
    facts.update(_check_overrides(overrides))
    if not is_gpu:
        facts.update(_cpu_rates(tvm_target, facts, given=overrides.keys()))
    target = Target(kind=tvm_target.kind.name, tvm_config=config, **facts)
    _TVM_TARGETS.setdefault(target.key, tvm_target)
    return target


def _read_spec(spec: str) -> dict[str, Any]:
    if spec in ("llvm", "cpu"):
        return {"kind": "llvm"}
    if spec in PRESETS:
        return {"preset": spec}
    if spec.startswith("{"):
        return _parse_json(spec, "target spec")
    if spec.endswith(".json") or os.path.isfile(spec):
        path = Path(spec)
        if not path.is_file():
            raise SchedlangError(f"target file {spec} does not exist", _ACCEPTED_FORMS)
        return _parse_json(path.read_text(), f"target file {spec}")
    if " -" in spec or spec.startswith("-"):
        words = spec.split()
        options = dict(w.lstrip("-").partition("=")[::2] for w in words[1:])
        suggestion = json.dumps({"kind": words[0], **options})
        native = 'LLVM here does not understand mcpu "native"; "llvm" picks this machine\'s CPU'
        raise SchedlangError(
            f"TVM 0.27 no longer accepts command-line target strings like `{spec}`",
            f"write a JSON target dict instead: {suggestion}",
            native if "native" in spec else "",
        )
    if spec in tvm.target.list_tags():
        return {"tag": spec}
    if close_preset(spec) and spec not in tvm.target.Target.list_kinds():
        preset_spec(spec)  # raises: no such preset, and the one it looks like
    if re.fullmatch(r"[a-z][a-z0-9_]*", spec):
        return {"kind": spec}  # other TVM kinds ("rocm", "metal"); TVM says if it knows it
    raise SchedlangError(f"cannot read target spec `{spec}`", _ACCEPTED_FORMS)


def _parse_json(text: str, what: str) -> dict[str, Any]:
    depth = json_depth(text)
    if depth > MAX_JSON_DEPTH:
        raise SchedlangError(
            f"{what} is nested {depth} levels deep: the limit is {MAX_JSON_DEPTH}",
            "a TVM target is a flat dict of options, like "
            '{"kind": "llvm", "mcpu": "znver3", "num-cores": 8}',
        )
    try:
        config = json.loads(text)
    except json.JSONDecodeError as err:
        raise SchedlangError(f"{what} is not valid JSON: {err}", _ACCEPTED_FORMS) from None
    if not isinstance(config, dict):
        raise SchedlangError(f"{what} must be a JSON object", _ACCEPTED_FORMS)
    return config


def json_depth(text: str) -> int:
    """How deeply JSON text nests `[` and `{` (strings skipped), without parsing it: one pass
    that recursion cannot overflow, so a hostile spec is refused before `json.loads` sees it."""
    depth = deepest = 0
    in_string = escaped = False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth -= 1
    return deepest


def _add_defaults(config: dict[str, Any]) -> None:
    if config.get("kind") == "llvm":
        if "mtriple" not in config:  # without mcpu LLVM targets a generic CPU: SSE2 only
            config.setdefault("mcpu", _host_cpu())
        if not _other_arch(config.get("mtriple")):  # a board's cores are not this machine's
            config.setdefault("num-cores", os.cpu_count() or 1)
    elif config.get("kind") == "cuda":
        config.setdefault("arch", "sm_90")
        for name, value in _CUDA_LIMITS.items():
            config.setdefault(name, value)


def _check_llvm_cpu(config: dict[str, Any]) -> None:
    # LLVM only logs an unknown CPU and falls back to `generic`, silently losing AVX and FMA.
    cpu = config.get("mcpu")
    triple = config.get("mtriple") or codegen.llvm_get_system_triple()
    if isinstance(cpu, str) and not codegen.llvm_is_valid_cpu(cpu, triple):
        raise SchedlangError(
            f"LLVM does not know the CPU `{cpu}` for {triple}",
            f'this machine\'s CPU is `{_host_cpu()}`; "llvm" picks it',
            did_you_mean(cpu, codegen.llvm_get_cpu_archlist(_build({"kind": "llvm"}))),
        )


def _build(config: dict[str, Any]) -> tvm.target.Target:
    try:
        return tvm.target.Target(config)
    except (ValueError, TypeError, RuntimeError) as err:  # TVM raises these
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        reason = re.sub(r"^Check failed: \(.*?\) is false: ", "", reason)
        reason = reason.split(" Target creation from")[0].rstrip(". ")
        shown = json.dumps(config)
        shown = shown if len(shown) <= 300 else shown[:300] + " …"
        raise SchedlangError(
            f"TVM rejected the target {shown}: {reason}", _ACCEPTED_FORMS
        ) from None


def _cpu_facts(target: tvm.target.Target) -> dict[str, Any]:
    cpu = target.attrs.get("mcpu")
    # Another architecture's core count is not this machine's: 1 unless "num-cores" says.
    here = 1 if _other_arch(target.attrs.get("mtriple")) else os.cpu_count() or 1
    facts: dict[str, Any] = {
        "cpu": str(cpu) if cpu else None,
        "cores": int(target.attrs.get("num-cores", here)),
        "vector_bits": 128,
    }
    if target.kind.name != "llvm":
        return facts
    # llvm_get_vector_width answers 512 for every x86 CPU (even znver3 and generic): use features.
    features = codegen.llvm_get_cpu_features(target)
    for feature, bits in (("avx512f", 512), ("avx", 256), ("sse", 128), ("neon", 128)):
        if feature in features:
            facts["vector_bits"] = bits
            facts["vector_registers"] = 32 if feature in ("avx512f", "neon") else 16
            break
    if _on_host(target):
        facts["l1_bytes"], facts["l2_bytes"] = _host_caches()
        facts["memory_bytes"] = _host_memory_bytes()
    return facts


def _other_arch(triple: Any) -> bool:
    """Whether an LLVM triple names another architecture than this machine's."""
    host = str(codegen.llvm_get_system_triple()).split("-")[0]
    return bool(triple) and str(triple).split("-")[0] not in (host, "")


def _on_host(target: tvm.target.Target) -> bool:
    """An LLVM target for this very CPU: what /sys and psutil say about the host applies."""
    if target.kind.name != "llvm":
        return False
    cpu = target.attrs.get("mcpu")
    on_host = target.attrs.get("mtriple") in (None, codegen.llvm_get_system_triple())
    return on_host and (not cpu or str(cpu) == _host_cpu())


def _cpu_rates(
    target: tvm.target.Target, facts: dict[str, Any], given: Any
) -> dict[str, float | None]:
    """A CPU's peak_gflops and memory_gbps, those not `given` as overrides (see the docstring)."""
    rates: dict[str, float | None] = {}
    if "peak_gflops" not in given and target.kind.name == "llvm":
        clock_ghz = (_host_clock_ghz() if _on_host(target) else None) or _DEFAULT_CLOCK_GHZ
        features = codegen.llvm_get_cpu_features(target)
        per_lane = next((flops for name, flops in _FLOPS_PER_LANE if name in features), 2)
        lanes = max(1, facts["vector_bits"] // 32)
        rates["peak_gflops"] = round(facts["cores"] * clock_ghz * lanes * per_lane, 1)
    if "memory_gbps" not in given and _on_host(target):
        rates["memory_gbps"] = _host_memory_gbps(min(facts["cores"], os.cpu_count() or 1))
    return rates


def _gpu_facts(target: tvm.target.Target) -> dict[str, Any]:
    attrs = target.attrs
    arch = str(attrs.get("arch") or attrs.get("mcpu") or "") or None
    threads = int(attrs.get("max_threads_per_block") or attrs.get("max_num_threads") or 1024)
    is_cuda = target.kind.name == "cuda"
    part = _CUDA_PARTS.get(re.sub(r"[a-z]$", "", arch or "")) if is_cuda else None  # sm_90a
    extent = _CUDA_THREAD_EXTENT if is_cuda else (threads, threads, 64)
    smem = attrs.get("max_shared_memory_per_block")
    registers = attrs.get("registers_per_block")
    l2 = attrs.get("l2_cache_size_bytes") or (part.l2_bytes if part else None)
    return {
        "cpu": None,
        "cores": part.sms if part else 1,
        "vector_bits": 128,
        "l2_bytes": int(l2) if l2 else None,
        "max_threads_per_block": threads,
        "max_thread_extent": tuple(min(threads, limit) for limit in extent),
        "max_grid_extent": _CUDA_GRID_EXTENT,
        "warp_size": int(attrs.get("thread_warp_size", 32)),
        "max_shared_memory_per_block": int(smem) if smem else None,
        "max_registers_per_block": int(registers) if registers else None,
        "arch": arch,
        "peak_gflops": part.peak_gflops if part else None,
        "memory_gbps": part.memory_gbps if part else None,
        "memory_bytes": part.memory_bytes if part else None,
    }


def _check_overrides(overrides: dict[str, Any]) -> dict[str, Any]:
    for name in overrides:
        if name not in _OVERRIDABLE:
            raise SchedlangError(
                f'unknown "schedlang" override `{name}`',
                did_you_mean(name, _OVERRIDABLE),
                "overridable: " + ", ".join(_OVERRIDABLE),
            )
    checked: dict[str, Any] = {}
    for name, value in overrides.items():
        if name in ("max_thread_extent", "max_grid_extent"):
            ok = isinstance(value, list) and len(value) == 3 and all(_is_int(v) for v in value)
            value, expected = tuple(value) if ok else value, "a list of 3 integers"
        elif name in ("cpu", "arch"):
            ok, expected = isinstance(value, str), "a string"
        elif name in ("peak_gflops", "memory_gbps"):
            ok = isinstance(value, int | float) and not isinstance(value, bool) and value > 0
            value, expected = float(value) if ok else value, "a positive number"
        else:
            ok, expected = _is_int(value) and value > 0, "a positive integer"
        if not ok:
            raise SchedlangError(f'"schedlang" override `{name}` must be {expected}, got {value!r}')
        checked[name] = value
    return checked


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def missing_host_features(target: Target) -> list[str]:
    """The CPU features (LLVM's names) a kernel built for `target` may use and this machine
    lacks, by /proc/cpuinfo; [] for a GPU target, or where this machine cannot say."""
    if target.kind != "llvm":
        return []
    return list(_missing_host_features(target.key))


@cache
def _missing_host_features(key: str) -> tuple[str, ...]:
    tvm_target = tvm.target.Target(json.loads(key))
    triple = str(tvm_target.attrs.get("mtriple") or codegen.llvm_get_system_triple())
    arch = triple.split("-")[0]
    table = {"x86_64": _X86_CPUINFO_FLAGS, "aarch64": _ARM_CPUINFO_FLAGS}.get(arch)
    flags = _host_cpu_flags()
    if table is None or not flags:
        return ()
    wanted = codegen.llvm_get_cpu_features(tvm_target)
    return tuple(sorted(f for f, flag in table.items() if f in wanted and flag not in flags))


@cache
def _host_cpu_flags() -> frozenset[str]:
    """The `flags` (x86) or `Features` (Arm) of cpu0 in /proc/cpuinfo; empty if unreadable."""
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return frozenset()
    match = re.search(r"^(?:flags|Features)\s*:(.*)$", text, re.MULTILINE)
    return frozenset(match.group(1).split()) if match else frozenset()


def require_runs_here(target: Target) -> None:
    """Raise SchedlangError, before anything is run, if kernels built for `target` cannot run on
    this machine's CPU: another architecture, or instructions this CPU lacks (they would die of
    SIGILL). Building for such a target (cross-compiling) is fine; only running here is not."""
    if target.kind != "llvm":
        return
    host_arch = codegen.llvm_get_system_triple().split("-")[0]
    triple = target.tvm_config.get("mtriple")
    target_arch = str(triple).split("-")[0] if triple else host_arch
    elsewhere = (
        "building for it here is fine (`schedlang compile`); run it on such a machine "
        "(`schedlang tune --rpc-tracker` measures on one)"
    )
    if target_arch != host_arch:
        raise SchedlangError(
            f"the target is for {target_arch} ({triple}) and this machine is {host_arch}: "
            "its kernels cannot run here",
            elsewhere,
        )
    missing = missing_host_features(target)
    if missing:
        cpu = f"CPU `{target.cpu}`" if target.cpu else "a generic CPU"
        mattr = target.tvm_config.get("mattr")
        cpu += f" with mattr {', '.join(map(str, mattr))}" if mattr else ""
        raise SchedlangError(
            f"kernels built for {cpu} may use {', '.join(missing)}, which this machine's CPU "
            f"(`{_host_cpu()}`) lacks: run here, they would die of an illegal instruction",
            elsewhere,
            f'to run here, target this machine: "llvm" picks `{_host_cpu()}`',
        )


@cache
def _host_cpu() -> str:
    return str(codegen.llvm_get_system_cpu())


@cache
def _host_clock_ghz() -> float | None:
    """The host's maximum clock, else its current one (all a VM may show); None if unknown."""
    import psutil

    try:
        frequency = psutil.cpu_freq()
    except (OSError, NotImplementedError):
        return None
    mhz = (frequency.max or frequency.current) if frequency else 0.0
    return mhz / 1000 if mhz > 0 else None


@cache
def _host_memory_bytes() -> int:
    """This machine's RAM, as psutil reads it (/proc/meminfo on Linux)."""
    import psutil

    return int(psutil.virtual_memory().total)


@cache
def _host_memory_gbps(threads: int) -> float:
    """Main memory bandwidth as numpy copies it on `threads` threads: bytes read plus bytes
    written (STREAM's copy count), per second, the best of 3. About 50 ms, once per process."""
    import numpy as np

    source = np.ones(_COPY_BYTES // 8)
    destination = np.zeros_like(source)  # written once here, so no page faults are timed
    parts = [slice(p[0], p[-1] + 1) for p in np.array_split(np.arange(source.size), threads)]

    def copy(part: slice) -> None:
        np.copyto(destination[part], source[part])  # numpy lets go of the GIL for this

    best = float("inf")
    with ThreadPoolExecutor(threads) as pool:
        for _ in range(3):
            started = time.perf_counter()
            list(pool.map(copy, parts))
            best = min(best, time.perf_counter() - started)
    return round(2 * source.nbytes / best / 1e9, 1)


@cache
def _host_caches() -> tuple[int | None, int | None]:
    """(L1 data, L2) bytes of cpu0 from /sys, or None where Linux does not say."""
    sizes: dict[int, int] = {}
    for index in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            level = int((index / "level").read_text())
            kind = (index / "type").read_text().strip()
            size = (index / "size").read_text().strip()
        except (OSError, ValueError):
            continue
        scale = {"K": KiB, "M": MiB}.get(size[-1:], 1)
        if kind in ("Data", "Unified") and size.rstrip("KM").isdigit():
            sizes[level] = int(size.rstrip("KM")) * scale
    return sizes.get(1), sizes.get(2)


def _canonical(config: dict[str, Any]) -> dict[str, Any]:
    try:
        canonical: dict[str, Any] = json.loads(json.dumps(config, sort_keys=True))
        return canonical
    except (TypeError, ValueError) as err:
        raise SchedlangError(f"target dict is not plain JSON: {err}", _ACCEPTED_FORMS) from None


def format_rate(giga_per_s: float, unit: str) -> str:
    """A rate given in giga-units per second, in G or T: `format_rate(66900, "FLOP/s")` gives
    "66.9 TFLOP/s", `format_rate(18.4, "B/s")` "18.4 GB/s"."""
    if giga_per_s >= 1000:
        return f"{giga_per_s / 1000:.3g} T{unit}"
    return f"{giga_per_s:.0f} G{unit}" if giga_per_s >= 100 else f"{giga_per_s:.3g} G{unit}"


def _size(num_bytes: int) -> str:
    if num_bytes % MiB == 0:
        return f"{num_bytes // MiB} MiB"
    return f"{num_bytes // KiB} KiB" if num_bytes % KiB == 0 else f"{num_bytes} B"
