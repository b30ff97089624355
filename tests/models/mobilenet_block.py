"""A tiny MobileNetV2-like network (issue 47): the stem, one inverted residual (1x1 expand +
ReLU6, depthwise 3x3 + ReLU6, 1x1 project, residual), the last 1x1 conv to 1280 channels +
ReLU6, global average pool, and the 1280 -> 1000 classifier: each fused function of the real
network's kinds, at 14 x 14 so that it builds and runs in seconds. PyTorch, random weights; the
pieces are those of the whole network (bench/models/mobilenet_v2.py)."""

import sys
from pathlib import Path

import torch
from torch import nn

import schedlang

BENCH_MODELS = str(Path(__file__).resolve().parents[2] / "bench" / "models")
sys.path.insert(0, BENCH_MODELS)
from mobilenet_v2 import InvertedResidual, conv_bn_relu6, example  # noqa: E402

sys.path.remove(BENCH_MODELS)


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            conv_bn_relu6(3, 16, stride=2),
            InvertedResidual(16, 16, stride=1, expansion=6),
            conv_bn_relu6(16, 1280, 1),
        )
        self.classifier = nn.Linear(1280, 1000)

    def forward(self, x):
        x = nn.functional.adaptive_avg_pool2d(self.features(x), (1, 1))
        return self.classifier(torch.flatten(x, 1))


@schedlang.model
def mobilenet_block(size: int = 28):
    return example(Tiny, 1, size)
