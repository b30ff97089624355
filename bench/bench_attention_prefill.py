"""Prefill attention at a decoder's shapes: kernels.attention with the `attention_prefill`
template's first point (what tuning gives it, the rule's template the only family it gets) against
the fused kernel (schedlang/models/decoder/attention_prefill.py) at several query blocks. Both are
the symbolic functions the build runs (n and past symbolic), built once, called at each length
with past = 0 (`--decode`: one query after length - 1 cached, against decode's kernel and its
`attention_decode` template); interleaved rounds, median [slowest..fastest] of each.

    TVM_NUM_THREADS=2 python bench/bench_attention_prefill.py --lengths 128 1024 --rounds 5
    TVM_NUM_THREADS=2 python bench/bench_attention_prefill.py --decode --lengths 128 1024
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import tvm

from schedlang.checker.check import check
from schedlang.checker.primitives import bind_knobs
from schedlang.core.target import resolve_target
from schedlang.lang.syntax import parse
from schedlang.models.decoder import tuning
from schedlang.models.decoder.attention_prefill import attention_prefill
from schedlang.models.decoder.build import export
from schedlang.models.decoder.config import DecoderConfig
from schedlang.models.graph import extract_tasks
from schedlang.propose.builtin import BuiltinProposer
from schedlang.propose.interface import Context
from schedlang.run.codegen import compile_func


def _config(heads: int, kv_heads: int, head_dim: int, max_length: int) -> DecoderConfig:
    return DecoderConfig(
        architecture="Qwen2ForCausalLM", vocab_size=256, hidden_size=heads * head_dim,
        intermediate_size=256, num_layers=1, num_heads=heads, num_kv_heads=kv_heads,
        head_dim=head_dim, rms_norm_eps=1e-6, rope_theta=1e6, qkv_bias=True, o_bias=False,
        tie_word_embeddings=True, max_position_embeddings=max_length,
    )  # fmt: skip


def templated(
    config: DecoderConfig, max_length: int, at: int, target, decode: bool = False
) -> tuple[str, object]:
    """kernels.attention (prefill's, symbolic; or decode's, one query) with its rule's first
    non-serial template's first point, the template chosen at `at` tokens as the tuner's
    measurement would."""
    mod, _ = export(config, max_length, fused_prefill=False)
    name = "attention1" if decode else "attention"
    func = next(t.op.func for t in extract_tasks(mod, target) if t.name == name)
    measured = tuning.measured_function(func, tuning.length_values(func, at), max_length)
    from schedlang.core.ops import from_primfunc

    found = BuiltinProposer().templates(Context(from_primfunc(measured, "attention"), target))
    proposal = next(t for t in found if not t.extra.get("serial"))
    schedule = parse(proposal.text, "<template>")
    schedule = bind_knobs(schedule, {p.name.text: next(iter(p.choices)) for p in schedule.params})
    result = check(schedule, func, target)
    assert result.lowered is not None, proposal.text
    return proposal.extra["family"], compile_func(result.lowered.func, target)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--max-length", type=int, default=2048)
    parser.add_argument("--lengths", type=int, nargs="+", default=[128, 1024])
    parser.add_argument("--rows", type=int, nargs="+", default=[8, 16, 32], help="query blocks")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--min-ms", type=float, default=50.0)
    parser.add_argument("--no-old", action="store_true", help="the fused kernel only")
    parser.add_argument(
        "--decode", action="store_true",
        help="one query after length - 1 cached, against decode's kernel and template",
    )  # fmt: skip
    args = parser.parse_args()
    target = resolve_target("llvm")
    heads, kv_heads, dim, length = args.heads, args.kv_heads, args.head_dim, args.max_length
    variants = {}
    if not args.no_old:
        config = _config(heads, kv_heads, dim, length)
        family, built = templated(config, length, 128, target, args.decode)
        variants[f"kernels.attention, `{family}`"] = built
    for rows in args.rows:
        func = attention_prefill(heads, kv_heads, length, dim, rows=rows)
        func = func.with_attr("global_symbol", "main")
        variants[f"fused, QB {rows}"] = compile_func(func, target)
    dev = tvm.cpu()
    rng = np.random.default_rng(0)
    cache = tvm.runtime.tensor(
        rng.standard_normal((2, kv_heads, length, dim)).astype("float32"), dev
    )
    print(f"{heads} heads, {kv_heads} kv heads, head_dim {dim}, cache {length}")
    for at in args.lengths:
        n, past = (1, at - 1) if args.decode else (at, 0)
        qkv = tvm.runtime.tensor(
            rng.standard_normal((n, heads + 2 * kv_heads, dim)).astype("float32"), dev
        )
        zeros = np.zeros((n, heads, dim), "float32")
        outs = {name: tvm.runtime.tensor(zeros, dev) for name in variants}
        times: dict[str, list[float]] = {name: [] for name in variants}
        for name, built in variants.items():  # warm up, and the results agree
            built(qkv, cache, past, outs[name])
        first = next(iter(outs.values())).numpy()
        for name, out in outs.items():
            np.testing.assert_allclose(out.numpy(), first, rtol=1e-3, atol=1e-4, err_msg=name)
        for _ in range(args.rounds):
            for name, built in variants.items():
                calls, started = 0, time.perf_counter()
                while (elapsed := time.perf_counter() - started) * 1e3 < args.min_ms or calls < 2:
                    built(qkv, cache, past, outs[name])
                    calls += 1
                times[name].append(elapsed / calls * 1e3)
        for name, measured in times.items():
            print(
                f"n={n:5d} past={past:5d}  {name:36s} {statistics.median(measured):9.3f} ms "
                f"[{max(measured):.3f}..{min(measured):.3f}]"
            )


if __name__ == "__main__":
    main()
