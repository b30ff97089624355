"""A PyTorch transformer encoder layer (`torch.nn.TransformerEncoderLayer`: width 256, 4 heads,
feed-forward 1024, GELU, batch first, no dropout), batch 1, a sequence of `seq` vectors: the
"small transformer layer" of issue 28.

    schedlang tune-model bench/models/encoder.py --trials 96
    schedlang build-model bench/models/encoder.py --compare
"""

import torch
from torch import nn

import schedlang


@schedlang.model
def encoder(seq: int = 128, width: int = 256):
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(
        width, 4, dim_feedforward=4 * width, dropout=0.0, activation="gelu", batch_first=True
    ).eval()
    return layer, (torch.randn(1, seq, width),)
