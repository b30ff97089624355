"""MobileNetV2 as torchvision defines it (width 1.0: inverted residuals with ReLU6, depthwise 3x3
convolutions, 1000 classes), written here because torchvision does not import against the pinned
torch (see resnet18.py). Random weights; batch norm with the statistics a trained network would
have; batch 1, 3 x 224 x 224 by default. Issue 48's second model: 5.37 ms after 256 of 500 trials,
5.14 ms at the end.

    schedlang tune-model bench/models/mobilenet_v2.py --trials 500
    schedlang build-model bench/models/mobilenet_v2.py --compare
"""

import torch
from torch import nn

import schedlang

# (expansion, output channels, blocks, first block's stride): torchvision's table
SETTING = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1),
           (6, 160, 3, 2), (6, 320, 1, 1))  # fmt: skip


def conv_bn_relu6(inp: int, out: int, kernel: int = 3, stride: int = 1, groups: int = 1):
    return nn.Sequential(
        nn.Conv2d(inp, out, kernel, stride, (kernel - 1) // 2, groups=groups, bias=False),
        nn.BatchNorm2d(out),
        nn.ReLU6(inplace=True),
    )


class InvertedResidual(nn.Module):
    def __init__(self, inp: int, out: int, stride: int, expansion: int):
        super().__init__()
        hidden = inp * expansion
        self.residual = stride == 1 and inp == out
        layers = [conv_bn_relu6(inp, hidden, 1)] if expansion != 1 else []
        layers += [
            conv_bn_relu6(hidden, hidden, 3, stride, groups=hidden),
            nn.Conv2d(hidden, out, 1, 1, 0, bias=False),
            nn.BatchNorm2d(out),
        ]
        self.conv = nn.Sequential(*layers)

    def forward(self, x):
        return x + self.conv(x) if self.residual else self.conv(x)


class MobileNetV2(nn.Module):
    def __init__(self, classes: int = 1000):
        super().__init__()
        features, inp = [conv_bn_relu6(3, 32, stride=2)], 32
        for expansion, out, blocks, stride in SETTING:
            for index in range(blocks):
                features.append(InvertedResidual(inp, out, stride if index == 0 else 1, expansion))
                inp = out
        features.append(conv_bn_relu6(inp, 1280, 1))
        self.features = nn.Sequential(*features)
        self.classifier = nn.Sequential(nn.Dropout(0.2), nn.Linear(1280, classes))

    def forward(self, x):
        x = nn.functional.adaptive_avg_pool2d(self.features(x), (1, 1))
        return self.classifier(torch.flatten(x, 1))


def example(make_net, batch: int, size: int):
    """`make_net()` with random weights, its batch norms holding statistics a trained network
    would have, in eval mode; and a random batch of `batch` x 3 x `size` x `size` images
    (tests/models/mobilenet_block.py makes its tiny network the same way)."""
    torch.manual_seed(0)
    net = make_net()
    for module in net.modules():
        if isinstance(module, nn.BatchNorm2d):
            module.running_mean.uniform_(-0.1, 0.1)
            module.running_var.uniform_(0.5, 1.5)
    return net.eval(), (torch.randn(batch, 3, size, size),)


@schedlang.model
def mobilenet_v2(batch: int = 1, size: int = 224):
    return example(MobileNetV2, batch, size)
