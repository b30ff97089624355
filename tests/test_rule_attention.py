"""The attention rule (schedlang/propose/rules/attention.py) and the row-norm rule (norm.py) on a
decoder's own kernels: attention over the KV cache (prefill's, `n` and `past` symbolic; decode's,
one query and `past` symbolic) and prefill's RMSNorm (`n` symbolic). Each is written against the
kernel specialized at a length, as the tuner measures it; its first template must lower on the
symbolic kernel and at lengths no power of two divides, and give the unscheduled kernel's
result there.
"""

from __future__ import annotations

from functools import cache

import numpy as np
import pytest
import tvm

from schedlang.checker.check import check
from schedlang.checker.primitives import bind_knobs
from schedlang.core.diagnostics import render_all
from schedlang.core.ops import Op, from_primfunc
from schedlang.core.target import resolve_target
from schedlang.lang import nodes
from schedlang.lang.syntax import parse
from schedlang.models.decoder import tuning
from schedlang.models.decoder.build import export
from schedlang.models.decoder.config import DecoderConfig
from schedlang.models.graph import extract_tasks
from schedlang.propose.builtin import BuiltinProposer
from schedlang.propose.interface import Context
from schedlang.run.build import compile_func
from schedlang.run.measure import verify

CPU = resolve_target("llvm")
MAX_LENGTH = 32


@cache
def _kernels(head_dim: int = 16) -> dict[str, Op]:
    config = DecoderConfig(
        architecture="Qwen2ForCausalLM", vocab_size=300, hidden_size=64, intermediate_size=96,
        num_layers=1, num_heads=4, num_kv_heads=2, head_dim=head_dim, rms_norm_eps=1e-6,
        rope_theta=1e6, qkv_bias=True, o_bias=False, tie_word_embeddings=True,
        max_position_embeddings=MAX_LENGTH,
    )  # fmt: skip
    # Prefill's attention as kernels.attention's computation (the rule's), not the fused kernel.
    mod, _ = export(config, MAX_LENGTH, fused_prefill=False)
    return {t.name: t.op for t in extract_tasks(mod, CPU)}


def _at(name: str, length: int, head_dim: int = 16) -> Op:
    func = _kernels(head_dim)[name].func
    measured = tuning.measured_function(func, tuning.length_values(func, length), MAX_LENGTH)
    return from_primfunc(measured, f"{name}@{length}")


def _first_point(text: str) -> nodes.Schedule:
    schedule = parse(text, "<t>")
    first = {p.name.text: next(iter(p.choices)) for p in schedule.params}
    return bind_knobs(schedule, first)


def _families(op: Op) -> list[str]:
    found = BuiltinProposer().templates(Context(op, CPU))
    return [t.extra["family"] for t in found if not t.extra.get("serial")]


@pytest.mark.parametrize(
    ("name", "families"),
    [
        ("attention", ["attention_prefill", "attention_decode"]),
        ("attention1", ["attention_decode", "attention_prefill"]),
        ("rms_norm1", ["rows_norm", "generic"]),
    ],
)
def test_decoder_kernels_get_their_rule_first(name: str, families: list[str]) -> None:
    """Attention's templates come alone: the generic ones vectorize a fused loop whose extent
    holds `past + n`, which the checker refuses at the symbolic form."""
    assert _families(_at(name, 16)) == families


@pytest.mark.parametrize(
    ("name", "head_dim"),
    [
        ("attention", 16),
        ("attention1", 16),
        ("rms_norm1", 16),
        ("attention", 64),
        ("attention1", 64),
    ],
)
def test_each_template_holds_at_the_symbolic_form_and_gives_the_kernels_result(
    name: str, head_dim: int
) -> None:
    """At head_dim 64 (several vectors) q . k runs in vector lanes (rfactor), decode's and
    prefill's; at 16 (one vector), in scalars."""
    proposer = BuiltinProposer()
    templates = proposer.templates(Context(_at(name, 16, head_dim), CPU))
    assert not proposer.dropped, [p.note for p in proposer.dropped]
    if name.startswith("attention"):
        lanes = CPU.vector_lanes("float32")
        in_lanes = head_dim > lanes
        assert all(("rfactor d.i" in t.text) == in_lanes for t in templates)
    symbolic = _kernels(head_dim)[name].func
    for proposal in templates:
        if proposal.extra["family"] in ("generic", "generic_rfactor"):
            continue
        schedule = _first_point(proposal.text)
        result = check(schedule, symbolic, CPU)
        assert result.lowered is not None, render_all(result.diagnostics, proposal.text)
        for length in (1, 13):
            op = _at(name, length, head_dim)
            result = check(schedule, op.func, CPU)
            assert result.lowered is not None, render_all(result.diagnostics, proposal.text)
            ok, reason = verify(op, compile_func(result.lowered.func, CPU), CPU)
            assert ok, f"{proposal.extra['family']} at {length}: {reason}"


def test_grouped_heads_share_each_kv_row() -> None:
    """4 query heads over 2 kv heads: both products split the heads by 2, the kv head outside
    the cached positions and the two query heads that read each position inside them."""
    proposer = BuiltinProposer()
    found = proposer.templates(Context(_at("attention", 16), CPU))
    first = next(t for t in found if not t.extra.get("serial"))
    assert "split h by 2" in first.text
    assert "reorder h.o, i, j, h.i, e" in first.text and "reorder h.o, i, j, d, h.i" in first.text
    assert "cache_write dot local at j" in first.text
    assert "parallel task" in first.text and "fast_math exp" in first.text
    found = proposer.templates(Context(_at("attention1", 16), CPU))
    decode = next(t for t in found if not t.extra.get("serial"))
    assert decode.extra["family"] == "attention_decode"
    assert "parallel" not in decode.text


@pytest.mark.parametrize(
    ("name", "tuned_at"), [("attention", 16), ("attention", 1), ("attention1", 16)]
)
def test_q_k_in_lanes_built_once_symbolic_gives_the_unscheduled_result(
    name: str, tuned_at: int
) -> None:
    """head_dim 64: the first template (q . k in vector lanes) of the kernel tuned at
    `tuned_at` tokens (prefill's parallel one at 16, decode's serial one at 1) on the symbolic
    kernel, built once as the decoder builds it, against the unscheduled kernel at several
    (rows, cached) lengths: 13 rows (no power of two) after 19 cached fills the cache."""
    symbolic = _kernels(64)[name].func
    found = BuiltinProposer().templates(Context(_at(name, tuned_at, 64), CPU))
    text = next(t for t in found if not t.extra.get("serial")).text
    assert "rfactor d.i" in text
    result = check(_first_point(text), symbolic, CPU)
    assert result.lowered is not None, render_all(result.diagnostics, text)
    built, plain = compile_func(result.lowered.func, CPU), compile_func(symbolic, CPU)
    rng = np.random.default_rng(0)
    for rows, past in ((1, 0), (1, 12), (3, 9), (13, 0), (13, 19), (5, 26)):
        if name == "attention1" and rows != 1:
            continue
        qkv = rng.standard_normal((rows, 8, 64), dtype="float32")
        cache_kv = rng.standard_normal((2, 2, MAX_LENGTH, 64), dtype="float32")
        outs = []
        for f in (built, plain):
            out = tvm.runtime.tensor(np.zeros((rows, 4, 64), "float32"))
            f(tvm.runtime.tensor(qkv), tvm.runtime.tensor(cache_kv), past, out)
            outs.append(out.numpy())
        np.testing.assert_allclose(outs[0], outs[1], rtol=1e-4, atol=1e-5)


def test_prefill_q_k_in_lanes_holds_at_the_caches_length_at_the_1_5b_shapes() -> None:
    """12 heads over 2 kv heads, head_dim 128, a cache of 2,048: prefill's template runs q . k
    in 16-lane partial sums. `rfactor` makes dot_rf[h, i, j, lane] for every row and position
    (3 GiB at 2,048 tokens, past the 1 GiB one statement may add: refused before); the
    `compute_at` at each position leaves 6 heads' lanes, and the checker sizes it so."""
    from schedlang.checker import dataflow, kernel_size

    config = DecoderConfig(
        architecture="Qwen2ForCausalLM", vocab_size=300, hidden_size=1536, intermediate_size=96,
        num_layers=1, num_heads=12, num_kv_heads=2, head_dim=128, rms_norm_eps=1e-6,
        rope_theta=1e6, qkv_bias=True, o_bias=False, tie_word_embeddings=True,
        max_position_embeddings=2048,
    )  # fmt: skip
    mod, _ = export(config, 2048, fused_prefill=False)  # the te kernel's prefill form
    func = {t.name: t.op for t in extract_tasks(mod, CPU)}["attention"].func
    lanes = CPU.vector_lanes("float32")
    if not 1 < lanes < 128:
        pytest.skip(f"{lanes} lanes: head_dim 128 is not several vectors")

    def at(length: int) -> Op:
        measured = tuning.measured_function(func, tuning.length_values(func, length), 2048)
        return from_primfunc(measured, f"attention@{length}")

    found = BuiltinProposer().templates(Context(at(128), CPU))
    first = next(t for t in found if not t.extra.get("serial"))
    assert first.extra["family"] == "attention_prefill" and "rfactor d.i" in first.text
    schedule = _first_point(first.text)
    result = check(schedule, at(2048).func, CPU)
    assert result.lowered is not None, render_all(result.diagnostics, first.text)
    lowered = dataflow.lower_kernel(result.lowered.func, CPU.to_tvm())
    assert lowered is not None
    sizes = {a.name: a.shape for a in kernel_size.allocations(lowered[0])}
    assert sizes["dot.rf"] == (6, 1, 1, lanes)
