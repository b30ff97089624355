"""A small convolutional network written in PyTorch, as a user has it: conv + batch norm + ReLU,
max pooling, a residual block, global average pooling and a linear head. The model function
returns the module and its example inputs; schedlang exports it (torch.export, then TVM's
frontend, weights bound as constants) and checks every build against the module itself.

    schedlang build-model examples/models/convnet.py --target llvm --compare
"""

import torch
from torch import nn

import schedlang


class ConvNet(nn.Module):
    def __init__(self, channels: int = 8, classes: int = 10):
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, channels, 3, padding=1, bias=False), nn.BatchNorm2d(channels), nn.ReLU()
        )
        self.pool = nn.MaxPool2d(2)
        self.block = nn.Sequential(
            nn.Conv2d(channels, channels, 3, padding=1, bias=False), nn.BatchNorm2d(channels)
        )
        self.head = nn.Linear(channels, classes)

    def forward(self, x):
        x = self.pool(self.stem(x))
        x = torch.relu(x + self.block(x))
        return self.head(x.mean(dim=(2, 3)))


@schedlang.model
def convnet(size: int = 16, channels: int = 8):
    torch.manual_seed(0)
    net = ConvNet(channels)
    for bn in (net.stem[1], net.block[1]):  # statistics a trained network would have
        bn.running_mean.uniform_(-0.5, 0.5)
        bn.running_var.uniform_(0.5, 1.5)
    return net, (torch.randn(1, 3, size, size),)
