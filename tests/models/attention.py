"""A small self-attention block in PyTorch: layer norm, Q/K/V projections, softmax(QKᵀ/√d)·V with
heads, an output projection and a residual (issue 28's CI-size transformer part)."""

import math

import torch
from torch import nn

import schedlang


class Attention(nn.Module):
    def __init__(self, width: int = 32, heads: int = 2):
        super().__init__()
        self.heads, self.width = heads, width
        self.norm = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.out = nn.Linear(width, width)

    def forward(self, x):
        batch, seq, width = x.shape
        q, k, v = self.qkv(self.norm(x)).chunk(3, dim=-1)
        shape = (batch, seq, self.heads, width // self.heads)
        q, k, v = (t.reshape(shape).transpose(1, 2) for t in (q, k, v))
        weights = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(width // self.heads), dim=-1)
        mixed = (weights @ v).transpose(1, 2).reshape(batch, seq, width)
        return x + self.out(mixed)


@schedlang.model
def attention(seq: int = 16, width: int = 32):
    torch.manual_seed(0)
    return Attention(width), (torch.randn(1, seq, width),)
