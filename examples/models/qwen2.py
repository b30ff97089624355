"""A transformers decoder LLM exported the plain way: Qwen2's causal LM (RMSNorm, rotary
embeddings, grouped-query attention, SwiGLU) built from a config with random weights, and a
prompt of a fixed length. `main` takes the prompt's token ids and returns the logits of every
position; there is no KV cache (`use_cache=False`), and attention is transformers' eager one,
which torch.export traces into plain operators. examples/models/llama.py is the same for Llama.

    schedlang tune-model examples/models/qwen2.py --target llvm --trials 64
    schedlang build-model examples/models/qwen2.py --target llvm --compare

The defaults are a tiny model for tests; `-D layers=4 -D hidden=512 -D heads=8 -D kv_heads=2
-D vocab=8192 -D length=128` is the small configuration of issue 45. `-D max_length=512` makes
the prompt's length symbolic (`torch.export.Dim`, up to 512 tokens; `length` is then the
example's): the model function returns torch.export's `dynamic_shapes` as a third item, and
`tune-model` tunes each function at several lengths (`--lengths 1,16,128,512`).
"""

import torch

import schedlang


class Logits(torch.nn.Module):
    """The causal LM's logits alone (transformers returns an output object)."""

    def __init__(self, lm: torch.nn.Module):
        super().__init__()
        self.lm = lm

    def forward(self, input_ids):
        return self.lm(input_ids=input_ids, use_cache=False).logits


def causal_lm(config_class, lm_class, layers, hidden, heads, kv_heads, vocab, length, max_length=0):
    """A transformers causal LM of `lm_class` built from a `config_class` of these sizes, its
    weights random (seed 0), eager attention and no KV cache; and a prompt of `length` random
    token ids, its length symbolic up to `max_length` when one is given.
    examples/models/llama.py is this with Llama's classes."""
    config = config_class(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=hidden * 2,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=2048,
        use_cache=False,
        tie_word_embeddings=False,
    )
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    lm = lm_class(config).eval()
    input_ids = torch.randint(0, vocab, (1, length), generator=torch.Generator().manual_seed(1))
    if not max_length:
        return Logits(lm), (input_ids,)
    prompt = torch.export.Dim("prompt", max=max_length)
    return Logits(lm), (input_ids,), {"input_ids": {1: prompt}}


@schedlang.model
def qwen2(
    layers: int = 2,
    hidden: int = 64,
    heads: int = 4,
    kv_heads: int = 2,
    vocab: int = 256,
    length: int = 16,
    max_length: int = 0,
):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    return causal_lm(
        Qwen2Config, Qwen2ForCausalLM, layers, hidden, heads, kv_heads, vocab, length, max_length
    )
