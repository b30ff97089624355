"""A tiny MobileNetV2-like network (issue 47): the stem, one inverted residual (1x1 expand +
ReLU6, depthwise 3x3 + ReLU6, 1x1 project, residual), the last 1x1 conv to 1280 channels +
ReLU6, global average pool, and the 1280 -> 1000 classifier: each fused function of the real
network's kinds, at 14 x 14 so that it builds and runs in seconds. PyTorch, random weights."""

import torch
from torch import nn

import schedlang


def conv_bn_relu6(inp: int, out: int, kernel: int = 3, stride: int = 1, groups: int = 1):
    return nn.Sequential(
        nn.Conv2d(inp, out, kernel, stride, (kernel - 1) // 2, groups=groups, bias=False),
        nn.BatchNorm2d(out),
        nn.ReLU6(inplace=True),
    )


class Block(nn.Module):
    def __init__(self, channels: int = 16, expansion: int = 6):
        super().__init__()
        hidden = channels * expansion
        self.conv = nn.Sequential(
            conv_bn_relu6(channels, hidden, 1),
            conv_bn_relu6(hidden, hidden, 3, groups=hidden),
            nn.Conv2d(hidden, channels, 1, bias=False),
            nn.BatchNorm2d(channels),
        )

    def forward(self, x):
        return x + self.conv(x)


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            conv_bn_relu6(3, 16, stride=2), Block(16), conv_bn_relu6(16, 1280, 1)
        )
        self.classifier = nn.Linear(1280, 1000)

    def forward(self, x):
        x = nn.functional.adaptive_avg_pool2d(self.features(x), (1, 1))
        return self.classifier(torch.flatten(x, 1))


@schedlang.model
def mobilenet_block(size: int = 28):
    torch.manual_seed(0)
    net = Tiny()
    for module in net.modules():
        if isinstance(module, nn.BatchNorm2d):
            module.running_mean.uniform_(-0.1, 0.1)
            module.running_var.uniform_(0.5, 1.5)
    return net.eval(), (torch.randn(1, 3, size, size),)
