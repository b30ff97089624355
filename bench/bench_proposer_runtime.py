"""The proposer's model on both runtimes (`--model-runtime transformers|schedlang`): tokens/s.

    python bench/bench_proposer_runtime.py [--model DIR | --config tiny|small] [--tokens 128]
                                           [--model-db DB] [--answers 2]

For each runtime, greedy decoding, in this process:

    load      seconds to load the model (schedlang: build it, with --model-db's schedules)
    prefill   the proposer's first prompt for matmul 64³ on llvm (its real text), cold cache:
              prompt tokens / seconds
    decode    an unconstrained continuation of --tokens tokens after it: tokens / seconds, the
              time of the same prompt's first token taken out
    stepwise  --answers answers written statement by statement (schedlang.llm.stepwise), as
              `tune --proposer model` writes them: tokens / seconds, masks and checks included

Without --model it builds a random-weight Qwen2 with the tiny model's tokenizer: `tiny` is
schedlang.testing.tiny_model's (2 layers, width 64); `small` is the issue's small config (4
layers, width 512, 8 heads, 2 KV heads, intermediate 1,408, vocabulary 8,192). Random weights
write no useful text; the figures are speeds. Run it with TVM_NUM_THREADS set to the threads
torch gets (`torch.set_num_threads`, --threads).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path


def build_model(config: str, folder: Path) -> Path:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from schedlang.testing.tiny_model import build_tiny_model

    build_tiny_model(folder)
    if config == "small":
        import torch

        torch.manual_seed(0)
        small = Qwen2Config(
            vocab_size=8192, hidden_size=512, intermediate_size=1408, num_hidden_layers=4,
            num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=8192,
            eos_token_id=2, pad_token_id=0, tie_word_embeddings=True,
        )  # fmt: skip
        Qwen2ForCausalLM(small).save_pretrained(folder)
    return folder


def _timed(function, *args) -> float:
    started = time.perf_counter()
    samples, _ = function(*args)
    assert samples[0].tokens == args[-1], samples  # random weights never write end-of-sequence
    return time.perf_counter() - started


def measure(backend, prompt: str, tokens: int, answers: int) -> dict[str, float]:
    from schedlang.core.ops import load_op
    from schedlang.core.target import resolve_target
    from schedlang.llm.backend import FENCE
    from schedlang.llm.messages import build_messages
    from schedlang.llm.stepwise import StepDecoder, StepLimits
    from schedlang.propose.interface import Context

    forget = getattr(backend, "forget", lambda: None)
    prompt_tokens = backend.count_tokens(prompt)
    forget()
    prefill_s = _timed(backend.generate, [prompt], [None], 1)
    # The same prompt again, for 1 token then for `tokens`: the difference is the decoding
    # (schedlang's cache holds the prompt by then; transformers prefills it each time).
    first_s = _timed(backend.generate, [prompt], [None], 1)
    decode_s = _timed(backend.generate, [prompt], [None], tokens) - first_s
    op = load_op("examples/matmul.py", {"M": "64", "N": "64", "K": "64"})
    target = resolve_target("llvm")
    messages = build_messages(Context(op, target))
    forget()
    started = time.perf_counter()
    written = StepDecoder(op, target, StepLimits()).decode(
        backend, [messages] * answers, [f"{FENCE}\n"] * answers, seed=0
    )
    stepwise_s = time.perf_counter() - started
    return {
        "prompt tokens": prompt_tokens,
        "prefill tokens/s": prompt_tokens / prefill_s,
        "decode tokens/s": (tokens - 1) / decode_s,
        "stepwise tokens/s": sum(a.tokens for a in written) / stepwise_s,
        "stepwise s": stepwise_s,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="a checkpoint folder (default: --config's random one)")
    parser.add_argument("--config", choices=["tiny", "small"], default="tiny")
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--answers", type=int, default=2)
    parser.add_argument("--threads", type=int, default=int(os.environ.get("TVM_NUM_THREADS", 1)))
    parser.add_argument("--model-db", help="the schedlang runtime's tuning database")
    args = parser.parse_args(argv)
    import torch

    from schedlang.core.ops import load_op
    from schedlang.core.target import resolve_target
    from schedlang.llm.compiled import CompiledBackend
    from schedlang.llm.local import LocalBackend, TransformersBackend
    from schedlang.llm.messages import build_messages
    from schedlang.propose.interface import Context
    from schedlang.workflows.decoder_model import proposer_decoder

    torch.set_num_threads(args.threads)
    os.environ.setdefault("TVM_NUM_THREADS", str(args.threads))
    folder = Path(args.model or build_model(args.config, Path(tempfile.mkdtemp())))
    rows = {}
    for runtime in ("transformers", "schedlang"):
        started = time.perf_counter()
        if runtime == "schedlang":
            backend: LocalBackend = CompiledBackend(
                str(folder), proposer_decoder, model_db=args.model_db, think=False, temperature=0
            )
        else:
            backend = TransformersBackend(str(folder), download=False, think=False, temperature=0)
        load_s = time.perf_counter() - started
        op = load_op("examples/matmul.py", {"M": "64", "N": "64", "K": "64"})
        prompt = backend.chat_prompt(build_messages(Context(op, resolve_target("llvm"))))
        rows[runtime] = {"load s": load_s, **measure(backend, prompt, args.tokens, args.answers)}
        print(runtime, {k: round(v, 1) for k, v in rows[runtime].items()}, flush=True)
    names = list(rows["transformers"])
    print("\n| runtime | " + " | ".join(names) + " |")
    print("|---|" + "--:|" * len(names))
    for runtime, row in rows.items():
        print(f"| {runtime} | " + " | ".join(f"{row[n]:.1f}" for n in names) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
