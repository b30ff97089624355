"""Boards and cores people deploy to, as target data: `--target rpi4`.

Each preset is a TVM target dict (triple, CPU, features, cores) and the facts a schedule plans with
that LLVM cannot know about a chip it is not running on: L1 data and L2 cache per core, memory
bandwidth, fp32 peak. The facts come from the vendors' documents named beside each; the peak is
cores x clock x 4 fp32 lanes (128-bit NEON or SVE) x 2 flops per FMA x FMA pipes, the clock the
part's top one. A user changes any of them in a JSON spec:

    --target '{"preset": "rpi4", "l1_bytes": 32768, "num-cores": 2}'

where a key of the TVM target dict (`num-cores`, `mattr`, …) replaces the preset's, and any other
is a schedlang override (`l1_bytes`, `l2_bytes`, `cores`, `peak_gflops`, …; core/target.py lists
them), as under `"schedlang"`.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Any

from schedlang.core.diagnostics import SchedlangError, did_you_mean

KiB = 1024
MiB = 1024 * KiB
AARCH64 = "aarch64-linux-gnu"


@dataclass(frozen=True)
class Preset:
    name: str
    description: str
    mcpu: str
    mattr: tuple[str, ...]
    cores: int
    clock_ghz: float
    fma_pipes: int  # 128-bit FMA pipes per core
    l1_bytes: int  # L1 data cache per core
    l2_bytes: int  # L2 per core (or shared by the cluster: the description says which)
    memory_gbps: float | None = None  # DRAM bandwidth on the datasheet

    @property
    def peak_gflops(self) -> float:
        return round(self.cores * self.clock_ghz * 4 * 2 * self.fma_pipes, 1)

    def spec(self) -> dict[str, Any]:
        """The TVM target dict, with the facts as `"schedlang"` overrides."""
        facts: dict[str, Any] = {
            "l1_bytes": self.l1_bytes,
            "l2_bytes": self.l2_bytes,
            "peak_gflops": self.peak_gflops,
        }
        if self.memory_gbps:
            facts["memory_gbps"] = self.memory_gbps
        return {
            "kind": "llvm",
            "mtriple": AARCH64,
            "mcpu": self.mcpu,
            "mattr": list(self.mattr),
            "num-cores": self.cores,
            "schedlang": facts,
        }


# The presets, a row each: name, description, mcpu, mattr, then the facts: cores, clock_ghz,
# fma_pipes, l1_bytes, l2_bytes, memory_gbps (Preset's fields, in order).
_Row = tuple[str, str, str, tuple[str, ...], int, float, int, int, int, float | None]
# fmt: off
_ROWS: tuple[_Row, ...] = (
    # Raspberry Pi 4 Model B product brief (BCM2711: 4x Cortex-A72, 1.8 GHz on current
    # boards, 1.5 GHz on the first ones; LPDDR4-3200 on a 32-bit bus: 12.8 GB/s); Arm
    # Cortex-A72 TRM (DDI 0488): 32 KiB L1 data cache, two 128-bit FP/NEON pipes with FMA;
    # Armv8.0-A, so no dot product. Raspberry Pi documentation (Processors, BCM2711): 1 MiB
    # L2 shared by the four cores.
    ("rpi4", "Raspberry Pi 4 (BCM2711: 4x Cortex-A72, 1 MiB L2 shared)",
     "cortex-a72", ("+neon",), 4, 1.8, 2, 32 * KiB, 1 * MiB, 12.8),
    # Raspberry Pi 5 product brief (BCM2712: 4x Cortex-A76 at 2.4 GHz, 512 KiB L2 per core,
    # 2 MiB shared L3; LPDDR4X-4267, 32-bit: 17 GB/s); Arm Cortex-A76 TRM (100798): 64 KiB
    # L1 data cache, Armv8.2-A with the dot product instructions (+dotprod), no i8mm.
    ("rpi5", "Raspberry Pi 5 (BCM2712: 4x Cortex-A76, 512 KiB L2 per core)",
     "cortex-a76", ("+neon", "+dotprod"), 4, 2.4, 2, 64 * KiB, 512 * KiB, 17.1),
    # NVIDIA Jetson AGX Orin Series Technical Brief: 12x Cortex-A78AE (v8.2) at 2.2 GHz in 3
    # clusters, 64 KiB L1 data and 256 KiB L2 per core, 2 MiB L3 per cluster; 204.8 GB/s
    # LPDDR5. Arm Cortex-A78AE TRM (101779): dot product, no i8mm or SVE.
    ("jetson-orin", "Jetson AGX Orin's CPU (12x Cortex-A78AE, 256 KiB L2 per core)",
     "cortex-a78ae", ("+neon", "+dotprod"), 12, 2.2, 2, 64 * KiB, 256 * KiB, 204.8),
    # Arm Cortex-X4 TRM (102484): Armv9.2-A with SVE2 (128-bit vectors), dot product, i8mm
    # and BF16; 64 KiB L1 data cache; private L2 of 512 KiB, 1 MiB or 2 MiB (the part
    # chooses: 2 MiB here, the largest); four 128-bit FP/SIMD pipes. One prime core, as in a
    # Snapdragon 8 Gen 3 (1x X4 at 3.3 GHz): a phone's latency-bound kernel runs on it.
    ("cortex-x4", "a phone's prime core (Cortex-X4 at 3.3 GHz, SVE2 128-bit, 2 MiB L2)",
     "cortex-x4", ("+neon", "+dotprod", "+i8mm", "+sve", "+sve2", "+bf16"),
     1, 3.3, 4, 64 * KiB, 2 * MiB, None),
)
# fmt: on

PRESETS = {row[0]: Preset(*row) for row in _ROWS}


def preset_spec(name: str) -> dict[str, Any]:
    """The target dict of the preset `name`; a SchedlangError with a did-you-mean if none."""
    preset = PRESETS.get(name)
    if preset is None:
        raise SchedlangError(
            f"no target preset `{name}`",
            did_you_mean(name, list(PRESETS)),
            "presets: " + "; ".join(f"{p.name}: {p.description}" for p in PRESETS.values()),
        )
    return preset.spec()


def close_preset(name: str) -> str | None:
    """A preset `name` looks like a misspelling of, or None."""
    found = difflib.get_close_matches(name.lower(), list(PRESETS), n=1, cutoff=0.6)
    return found[0] if found else None


def expand_preset(config: dict[str, Any], overridable: list[str]) -> dict[str, Any]:
    """A JSON spec with `"preset": NAME`: the preset's dict, the spec's other keys over it: a
    schedlang fact (one of `overridable`) into `"schedlang"`, any other key into the TVM dict."""
    rest = dict(config)
    name = rest.pop("preset")
    if not isinstance(name, str):
        presets = "presets: " + ", ".join(PRESETS)
        raise SchedlangError(f'"preset" must be a name, got {name!r}', presets)
    spec = preset_spec(name)
    facts = spec.pop("schedlang")
    given = rest.pop("schedlang", {})
    if not isinstance(given, dict):
        raise SchedlangError('"schedlang" overrides must be a JSON object')
    for key, value in rest.items():
        if key in overridable:
            facts[key] = value
        else:
            spec[key] = value
    facts.update(given)
    cores = facts.get("cores", spec["num-cores"])
    if "peak_gflops" not in given and "peak_gflops" not in rest and isinstance(cores, int):
        facts["peak_gflops"] = round(PRESETS[name].peak_gflops * cores / PRESETS[name].cores, 1)
    return {**spec, "schedlang": facts}
