"""A tiny random-weight Qwen2 and a tokenizer trained here: a stand-in for a real model, built
offline in about a second, for tests and for trying the model loop on a machine without weights.

    python -m schedlang.tiny_model DIR     # writes config, weights and tokenizer to DIR
    schedlang tune examples/matmul.py --proposer model --model DIR --trials 8

Random weights write nothing useful on their own: what they show is that every answer they are
allowed to write is a schedule the checker accepts, and how fast the loop turns. The tokenizer is
a byte-level BPE of 1,024 tokens trained on the prompts' own text and random schedlang words; the
model has the Qwen2 architecture (2 layers, hidden size 64) and a ChatML chat template.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

from schedlang import ast

CHATML = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _corpus(lines: int = 5000) -> list[str]:
    """schedlang-ish text: the prompts' own text, and random statements, names and numbers."""
    from schedlang.model_proposer import examples, read_prompt, schedlang_reference

    rng = random.Random(0)
    prompts = [read_prompt(name) for name in ("system.md", "task.md", "repair.md")]
    prompts += [schedlang_reference(), *(example.text for example in examples())]
    words = [*ast.KEYWORDS, "by", "at", "as", "in", "x", "i", "j", "k", "i.o", "j.i", "k.o"]
    words += ["C", "A", "B", "ax0", *ast.SCOPES, *ast.THREAD_AXES, "```schedlang", "```"]
    text = [line + "\n" for prompt in prompts for line in prompt.splitlines()] * 20
    for _ in range(lines):
        line = " ".join(rng.choice(words) for _ in range(rng.randint(2, 9)))
        text.append(line + rng.choice(["\n", "; ", ":\n  ", f" {rng.choice([2, 4, 8, 16])}\n"]))
    return text


def build_tiny_model(folder: Path) -> Path:
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM
    from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

    # Exactly the normalizer and pre-tokenizer that transformers' Qwen2Tokenizer rebuilds on load:
    # with others the reloaded tokenizer would split text differently from the trained one.
    tokenizer = Tokenizer(models.BPE())
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=1024,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_corpus(), trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        model_input_names=["input_ids", "attention_mask"],
    )
    fast.chat_template = CHATML
    config = Qwen2Config(
        # Larger than the tokenizer, as Qwen's output layer is (151936 > 151665).
        vocab_size=len(fast) + 40,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=8192,
        eos_token_id=fast.eos_token_id,
        pad_token_id=fast.pad_token_id,
        tie_word_embeddings=True,
    )
    import torch

    torch.manual_seed(0)
    Qwen2ForCausalLM(config).save_pretrained(folder)
    fast.save_pretrained(folder)
    return folder


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m schedlang.tiny_model DIR", file=sys.stderr)
        return 2
    from schedlang.llm import _require_llm_packages

    _require_llm_packages()
    folder = Path(args[0])
    folder.mkdir(parents=True, exist_ok=True)
    build_tiny_model(folder)
    print(f"wrote a tiny random-weight Qwen2 to {folder}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
