"""CPU attention over a decoder's KV cache (schedlang.models.decoder.kernels.attention): the
blocks `dot` (q . k over head_dim), `scores` (scaled, causally masked), `top` (each row's max),
`exp`, `sum`, `weighted` (the exp-weighted sum of v's rows) and `attention` (divided by the sum).
Heads are grouped: q head h reads k/v head h // G, so both products run over the kv heads (h.o)
with the G query heads that share one inside the cached positions (h.i): each row of K or V is
loaded once for the G heads that read it.

Every loop that runs over cached positions has a symbolic extent (`past + n`) in the kernel the
build runs, so nothing is vectorized across them: `weighted` and `attention` are vectorized
over head_dim, `exp` is rewritten as a polynomial (`fast_math exp`) that LLVM's loop vectorizer
takes. Every block keeps its own loop nest (no `compute_at`): TVM drops the loops of extent 1
that a `compute_at` would make at one cached position, and the schedule must hold at every
length.

Decode (one query) runs on one thread first: one token's attention is too little work for
threads (per-head parallel loops measured 15 to 108 us at a cache of 16, against the
unscheduled build). Prefill runs the two products parallel over (kv head, query row); the
softmax's blocks stay on one thread (each parallel region is a wait for every core).

q . k runs the G query heads innermost, their G sums kept in registers (`cache_write ... local`,
unrolled): each k value loaded serves G independent sums instead of one dependent chain (3-4x
faster than the unscheduled kernel, measured in docs/llm-tuning.md)."""

from __future__ import annotations

from schedlang.core.target import Target
from schedlang.propose.analysis import OpView
from schedlang.propose.template import MatchingRule, TemplateInfo, Writer

# The kernel's blocks, as schedlang.models.decoder.kernels.attention names them.
BLOCKS = ("dot", "scores", "top", "exp", "weighted", "sum", "attention")


class Attention(MatchingRule[int]):
    target, rank = "cpu", 3
    alone = True  # the generic templates vectorize fused loops of symbolic extent
    templates = (
        TemplateInfo(
            "attention_decode", "cpu",
            "attention over a decoder's KV cache (kernels.attention), one query first: on one "
            "thread, q . k and the weighted sum over (kv head, cached position, the G query "
            "heads sharing it; q . k's G sums in registers), the weighted sum vectorized over "
            "head_dim, exp as a polynomial",
            "none", (), 1,
        ),
        TemplateInfo(
            "attention_prefill", "cpu",
            "attention over a decoder's KV cache, causal prefill first: the same loop order, "
            "the two products parallel over (kv head, query row)",
            "none", (), 1,
        ),
    )  # fmt: skip

    def find(self, view: OpView) -> int | None:
        """The group G (query heads per kv head) of the attention kernel; None for other ops."""
        if tuple(b.name for b in view.blocks) != BLOCKS or view.func is None:
            return None
        dot = view.blocks[0]
        cache = next((a.buffer for a in dot.reads if len(a.dims) == 4), None)
        shapes = {p.name: p.shape for p in view.func.params if hasattr(p, "shape")}
        if cache not in shapes or not dot.loops or dot.loops[0].var != "h":
            return None
        heads, kv_heads = int(dot.loops[0].extent), int(shapes[cache][1])
        return heads // kv_heads if kv_heads and heads % kv_heads == 0 else None

    def write(self, view: OpView, target: Target) -> list[Writer | None]:
        group = self.found(view)
        decode = _writer(group, parallel=False)
        prefill = _writer(group, parallel=True)
        one_query = view.blocks[0].extent("i") == 1
        return [decode, prefill] if one_query else [prefill, decode]


def _writer(group: int, parallel: bool) -> Writer:
    """The template: serial (decode) or parallel over (kv head, query row) (prefill)."""
    w = Writer(
        f"attention over the KV cache, {group} query heads per kv head: K and V rows read once "
        "per group, the weighted sum vectorized over head_dim, exp as a polynomial"
        + (", parallel over (kv head, query row)" if parallel else ", one thread"),
        "attention_prefill" if parallel else "attention_decode",
    )
    dot = w.section("dot")
    dot.append("compute_inline scores  # the mask and scale computed where they are read")
    dot.append(f"split h by {group}")
    # The G query heads innermost: G independent sums per loaded k value, not one chain.
    dot.append("reorder h.o, i, j, d, h.i")
    dot.append("cache_write dot local at j  # the G sums in registers")
    dot.append("unroll h.i")
    if parallel:
        dot.append("fuse h.o, i as task")
        dot.append("parallel task")
    w.section("exp").append("fast_math exp")
    weighted = w.section("weighted")
    weighted.append(f"split h by {group}")
    weighted.append("reorder h.o, i, j, h.i, e")
    if parallel:
        weighted.append("fuse h.o, i as task")
        weighted.append("parallel task")
    weighted.append("vectorize e")
    w.section("attention").append("vectorize e")
    return w
