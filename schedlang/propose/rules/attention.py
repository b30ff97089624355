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
faster than the unscheduled kernel, measured in docs/llm-tuning.md). Where head_dim is several
vectors (128 at the 1.5B shapes), q . k runs in vector lanes instead (`rfactor`, the partial sums
computed at each cached position; the checker sizes them after that `compute_at`, a G x lanes
buffer): 2.5 to 2.9x the G scalar sums on decode, 1.9 to 2.5x on a prefill of 128 to 1,024
tokens, measured."""

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
            "heads sharing it; q . k in vector lanes over head_dim, or G sums in registers), "
            "the weighted sum vectorized over "
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
        # q . k vectorized over head_dim in chunks of a vector (rfactor) where it is several, for
        # decode and prefill alike: the checker sizes `dot_rf` as TVM allocates it once the
        # `compute_at` has left it one position's partial sums (a G x chunk buffer).
        head_dim, lanes = view.blocks[0].extent("d"), target.vector_lanes(view.blocks[0].dtype)
        one_query = view.blocks[0].extent("i") == 1
        several = lanes > 1 and head_dim % lanes == 0 and head_dim > lanes
        chunk = lanes if several else None
        decode = _writer(group, parallel=False, chunk=chunk)
        prefill = _writer(group, parallel=True, chunk=chunk)
        return [decode, prefill] if one_query else [prefill, decode]


def _writer(group: int, parallel: bool, chunk: int | None) -> Writer:
    """The template: serial (decode) or parallel over (kv head, query row) (prefill); q . k
    vectorized over head_dim in `chunk` lanes, or G scalar sums in registers (no chunk)."""
    w = Writer(
        f"attention over the KV cache, {group} query heads per kv head: K and V rows read once "
        "per group, "
        + (f"q . k in {chunk}-lane partial sums, " if chunk else "")
        + "the weighted sum vectorized over head_dim, exp as a polynomial"
        + (", parallel over (kv head, query row)" if parallel else ", one thread"),
        "attention_prefill" if parallel else "attention_decode",
    )
    dot = w.section("dot")
    dot.append("compute_inline scores  # the mask and scale computed where they are read")
    dot.append(f"split h by {group}")
    if chunk:
        _dot_in_lanes(w, dot, chunk)
    else:
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


def _dot_in_lanes(w: Writer, dot: list[str], chunk: int) -> None:
    """q . k vectorized over head_dim: per cached position, `chunk`-lane partial sums of the G
    heads (`rfactor`, the lanes last in their buffer) accumulated over head_dim's chunks, each k
    vector loaded once for the G heads, then each head's lanes summed. The partial sums are
    computed at the position (`compute_at`): a G x chunk buffer, not one per position."""
    dot.append(f"split d by {chunk}")
    dot.append("reorder h.o, i, j, d.o, h.i, d.i")
    dot.append("rfactor d.i factor_axis 3  # partial sums dot_rf[h, i, j, lane]")
    dot.append("reorder h.o, i, j, h.i, d.i")
    dot.append("compute_at dot_rf j")
    partials = w.section("dot_rf")
    # Its loops at the position: ax2 head_dim's chunks, ax1 the G heads, ax0 the lanes.
    partials.append("reorder ax2, ax1, ax0")
    partials.append("unroll ax1")
    partials.append("vectorize ax0")
