"""The vector instructions a cross target's kernels are built with, as goldens of the generated
assembly (`schedlang compile --emit source`): each file lists the vector mnemonics that appear,
with how often. Nothing here runs the kernels (tests/test_board.py runs the Arm ones).

- NEON with +dotprod (rpi5): an int8 GEMM's k loop, left to LLVM's loop vectorizer, becomes `sdot`;
  without it (rpi4) the same loop widens with `smull`/`saddw`. Tensorized (`tensorize j.i with
  dot_4x4_i8i8s32_sdot`, TVM's Arm intrinsic: 4 output columns x 4 values of k per instruction,
  B packed first into 4 x 4 blocks, which the intrinsic loads as one 16-byte vector), the same
  GEMM is `sdot` by construction, not by the vectorizer's choice.
- RISC-V with the vector extension (+v): a vectorized fp32 matmul uses `vfmacc.vv`.
"""

from __future__ import annotations

import collections
import re
from pathlib import Path

import pytest

from schedlang.core.ops import load_op
from schedlang.core.target import resolve_target
from schedlang.run.build import apply, compile_func, source

ROOT = Path(__file__).resolve().parent
RISCV_V = (
    '{"kind": "llvm", "mtriple": "riscv64-unknown-linux-gnu", "mcpu": "generic-rv64", '
    '"mattr": ["+64bit", "+m", "+a", "+f", "+d", "+c", "+v"], "num-cores": 4}'
)
CASES = {
    "int8_dot_rpi5": ("tests/ops/dot_int8.py", "rpi5", None, r"sdot|smull2?|saddw2?|smlal2?"),
    "int8_dot_rpi4": ("tests/ops/dot_int8.py", "rpi4", None, r"sdot|smull2?|saddw2?|smlal2?"),
    "int8_dot_sdot_tensorized_rpi5": (
        "tests/ops/dot_int8.py",
        "rpi5",
        "split j by 4; split k by 4; reorder i, j.o, k.o, j.i, k.i; cache_read B global; "
        "transform_layout B_global (j, k) -> (j // 4, k // 4, j % 4, k % 4); "
        "decompose_reduction at k.o; tensorize j.i with dot_4x4_i8i8s32_sdot",
        r"sdot|smull2?|saddw2?|smlal2?",
    ),
    "matmul_riscv_v": (
        "examples/matmul.py",
        RISCV_V,
        "tile i, j by 8x16; reorder i.o, j.o, k, i.i, j.i; vectorize j.i",
        r"v[a-z0-9]*\.[a-z.0-9]+",
    ),
}


def vector_mnemonics(assembly: str, pattern: str) -> str:
    """`mnemonic count` lines, sorted, of the instructions matching `pattern`."""
    found = collections.Counter(
        match.group(1)
        for line in assembly.splitlines()
        if (match := re.match(rf"\s+({pattern})\s", line))
    )
    return "".join(f"{name} {count}\n" for name, count in sorted(found.items()))


@pytest.mark.parametrize("case", sorted(CASES))
def test_cross_targets_kernels_use_their_vector_instructions(case, golden):
    op_file, spec, schedule, pattern = CASES[case]
    target = resolve_target(spec)
    defines = {"M": "64", "N": "64", "K": "64"} if "matmul" in op_file else None
    op = load_op(str(ROOT.parent / op_file), defines)
    func = apply(op.func, schedule, target) if schedule else op.func
    listing = vector_mnemonics(source(compile_func(func, target), target), pattern)
    golden(f"cross_asm/{case}.txt", listing)
    wanted = {
        "int8_dot_rpi5": "sdot",
        "int8_dot_sdot_tensorized_rpi5": "sdot",
        "int8_dot_rpi4": "smull",
        "matmul_riscv_v": "vfmacc.vv",
    }
    assert re.search(rf"^{re.escape(wanted[case])} ", listing, re.MULTILINE), listing
