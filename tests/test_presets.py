"""ARM boards as target data (schedlang.core.presets): a preset's facts, a user's overrides,
a misspelt preset, and a cross target described by its own data, never this machine's."""

from __future__ import annotations

import pytest

from schedlang.core.diagnostics import SchedlangError
from schedlang.core.presets import PRESETS
from schedlang.core.target import resolve_target

KiB, MiB = 1024, 1024 * 1024


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_is_an_aarch64_target_with_its_data(name):
    preset, target = PRESETS[name], resolve_target(name)
    assert target.tvm_config["mtriple"] == "aarch64-linux-gnu"
    assert target.cpu == preset.mcpu and target.cores == preset.cores
    assert (target.l1_bytes, target.l2_bytes) == (preset.l1_bytes, preset.l2_bytes)
    assert target.vector_bits == 128 and target.vector_registers == 32
    assert target.peak_gflops == preset.peak_gflops


def test_the_presets_features_are_the_parts():
    features = {name: set(resolve_target(name).tvm_config["mattr"]) for name in PRESETS}
    assert features["rpi4"] == {"+neon"}  # Armv8.0: no dot product
    assert "+dotprod" in features["rpi5"] and "+i8mm" not in features["rpi5"]
    assert "+dotprod" in features["jetson-orin"] and "+sve" not in features["jetson-orin"]
    assert {"+sve2", "+i8mm", "+dotprod"} <= features["cortex-x4"]


def test_a_users_overrides_go_over_the_preset():
    target = resolve_target('{"preset": "rpi4", "l1_bytes": 16384, "num-cores": 2}')
    assert target.l1_bytes == 16 * KiB and target.l2_bytes == 1 * MiB
    assert target.cores == 2 and target.tvm_config["num-cores"] == 2
    assert target.peak_gflops == PRESETS["rpi4"].peak_gflops / 2  # two cores' worth
    given = resolve_target('{"preset": "rpi5", "schedlang": {"peak_gflops": 100}}')
    assert given.peak_gflops == 100


@pytest.mark.parametrize("spec", ["rpi3", '{"preset": "rpi3"}', "jetson-orn"])
def test_a_preset_that_does_not_exist_says_which_do(spec):
    with pytest.raises(SchedlangError) as raised:
        resolve_target(spec)
    assert "no target preset" in raised.value.message
    assert any("did you mean" in note for note in raised.value.notes)
    assert any("rpi4: Raspberry Pi 4" in note for note in raised.value.notes)


def test_a_cross_target_is_described_by_its_own_data():
    target = resolve_target('{"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mattr": ["+neon"]}')
    assert target.cores == 1 and target.l1_bytes is None and target.memory_bytes is None
    assert "num-cores" not in target.tvm_config
    assert target.describe().startswith("CPU (llvm, generic): 1 core (no num-cores given)")
    assert resolve_target("rpi4").describe() == (
        "CPU (llvm, cortex-a72): 4 cores, 128-bit SIMD (4 x float32), L1 32 KiB, L2 1 MiB, "
        "peak 115 GFLOP/s fp32, memory 12.8 GB/s"
    )


def test_target_completion_offers_the_presets():
    from schedlang.cli.options import complete_target

    assert complete_target("rp") == ["rpi4", "rpi5"]
    assert set(PRESETS) <= set(complete_target(""))
