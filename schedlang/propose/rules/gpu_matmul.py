"""GPU matmul: a shared-memory tiled kernel. TY x TX threads per thread block, each computing a
TM x TN register tile; A and B tiles staged in shared memory per BK slice of k, copied by all the
threads together (cooperative fetching); an elementwise epilogue folded into the write-back."""

from __future__ import annotations

from schedlang.core.target import Target
from schedlang.propose.analysis import MATMUL_SHAPE, Block, MatmulRoles, OpView
from schedlang.propose.rules import matmul
from schedlang.propose.rules.gpu_generic import gpu_blocks
from schedlang.propose.template import TemplateInfo, Writer, pick

_KNOBS = (
    "TY, TX threads (2 each), TM, TN outputs per thread (3 each), BK k slice (3); "
    "the op's other blocks T threads each, as gpu_generic's"
)


class GpuMatmul(matmul.Matmul):
    """Applies where the CPU matmul rule does; its templates are followed by the generic ones."""

    target, rank, alone = "gpu", 10, False
    templates = (
        TemplateInfo(
            "gpu_matmul", "gpu", MATMUL_SHAPE + "; shared-memory tiles, a register tile per thread",
            _KNOBS, ("TY", "TX", "TM", "TN", "BK", "T"), 108,
        ),
    )  # fmt: skip

    def write(self, view: OpView, target: Target) -> list[Writer | None]:
        block, roles = self.found(view)
        return [_matmul(view, block, roles, target)]


def _matmul(view: OpView, block: Block, r: MatmulRoles, target: Target) -> Writer:
    m, n, k = block.extent(r.i), block.extent(r.j), block.extent(r.k)
    w = Writer(
        f"{matmul.matmul_label(block)}: TY x TX threads with TM x TN each, A and B tiles in shared "
        "memory per BK slice of k",
        "gpu_matmul",
    )
    # First values: 16 x 16 threads with 4 x 4 outputs each, a 64 x 64 tile, 8 KiB of shared
    # memory per BK = 16 slice (unmeasured here: this machine has no GPU).
    ty_values = pick(m, [16, 8], most=2)
    tx_values = pick(n, [16, 8], most=2)
    tm_values = pick(m // max(ty_values), [4, 2, 8], most=3)
    tn_values = pick(n // max(tx_values), [4, 2, 8], most=3)
    # Copies split evenly over the threads when TM * BK and TN * BK are multiples of TX and TY.
    least = max(max(tx_values) // min(tm_values), max(ty_values) // min(tn_values), 1)
    bk_values = pick(k, [v for v in (16, 8, 32) if v >= least] or [least], most=3)
    ty, tx = w.factor("TY", ty_values), w.factor("TX", tx_values)
    tm, tn = w.factor("TM", tm_values), w.factor("TN", tn_values)
    bk = w.factor("BK", bk_values)

    s = w.section(block.name)
    s.append(f"split {r.i} by *, {ty}, {tm}")
    s.append(f"split {r.j} by *, {tx}, {tn}")
    tiles = [f"{r.i}.0", f"{r.j}.0", f"{r.i}.1", f"{r.j}.1"]
    s += matmul.split_k_inside(r, bk, tiles, [f"{r.i}.2", f"{r.j}.2"])
    if len(r.outer) > 1:
        s.append(f"fuse {', '.join(r.outer)} as batch")
        s.append("bind batch blockIdx.z")
    elif r.outer:
        s.append(f"bind {r.outer[0]} blockIdx.z")
    s.append(f"bind {r.i}.0 blockIdx.y")
    s.append(f"bind {r.j}.0 blockIdx.x")
    s.append(f"bind {r.i}.1 threadIdx.y")
    s.append(f"bind {r.j}.1 threadIdx.x")
    # Bound first, so the shared copies cover the whole thread block's tiles, not one thread's.
    s.append(f"cache_read {r.a} shared at {r.k}.o")
    s.append(f"cache_read {r.b} shared at {r.k}.o")
    s.append(f"cache_write {block.name} local at {r.j}.1  # each thread's TM x TN tile")
    folded = matmul.fold_epilogue(s, view, block)
    s.append(f"unroll {r.k}.i")
    s.append(f"unroll {r.i}.2")
    s.append(f"unroll {r.j}.2")
    s.append(matmul.decompose_outermost(r))
    for buffer in (r.a, r.b):
        access = next(a for a in block.reads if a.buffer == buffer)
        copy = w.section(f"{buffer}_shared")  # cooperative fetch: every thread copies a part
        axes = [f"ax{d}" for d in range(r.tile_dims(access))]
        if len(axes) > 1:
            copy.append(f"fuse {', '.join(axes)} as f")
        fused = "f" if len(axes) > 1 else axes[0]
        copy.append(f"split {fused} by *, {ty}, {tx}")
        copy.append(f"bind {fused}.1 threadIdx.y")
        copy.append(f"bind {fused}.2 threadIdx.x")
    gpu_blocks(w, view, target, done={block.name, *folded}, inline=[])
    return w
