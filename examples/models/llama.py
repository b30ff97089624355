"""A transformers decoder LLM exported the plain way: Llama's causal LM (RMSNorm, rotary
embeddings, grouped-query attention, SwiGLU) built from a config with random weights, and a
prompt of a fixed length: examples/models/qwen2.py with Llama's classes (its `causal_lm`).
`main` takes the prompt's token ids and returns the logits of every position; there is no KV
cache (`use_cache=False`), and attention is transformers' eager one, which torch.export traces
into plain operators.

    schedlang tune-model examples/models/llama.py --target llvm --trials 64
    schedlang build-model examples/models/llama.py --target llvm --compare
"""

from qwen2 import causal_lm  # examples/models/qwen2.py: a model file's folder is importable

import schedlang


@schedlang.model
def llama(
    layers: int = 2,
    hidden: int = 64,
    heads: int = 4,
    kv_heads: int = 2,
    vocab: int = 256,
    length: int = 16,
):
    from transformers import LlamaConfig, LlamaForCausalLM

    return causal_lm(LlamaConfig, LlamaForCausalLM, layers, hidden, heads, kv_heads, vocab, length)
