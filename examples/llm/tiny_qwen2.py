"""A tiny Qwen2 with random weights, built offline: `schedlang generate` on it in seconds.

    schedlang generate examples/llm/tiny_qwen2.py --prompt-tokens 16 --new-tokens 8
    schedlang generate examples/llm/tiny_qwen2.py -D layers=4 -D hidden=512 -D heads=8

Any function decorated with @schedlang.model that returns a transformers causal LM works the
same way: `Qwen2ForCausalLM.from_pretrained(folder)` for real weights (or name the folder itself).
"""

import schedlang


@schedlang.model
def tiny_qwen2(
    layers: int = 2, hidden: int = 64, heads: int = 4, kv_heads: int = 2, vocab: int = 512
):
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=4 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        tie_word_embeddings=True,
        # Wider than transformers' 0.02, so that greedy decoding does not repeat one token.
        initializer_range=0.2,
    )
    torch.manual_seed(0)
    return Qwen2ForCausalLM(config).eval()
