"""Torch modules the CLI tests export as a user would: path/to/file.py:ClassName."""

import torch
from torch import nn


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Conv2d(3, 8, 3, padding=1)
        self.b = nn.Conv2d(3, 8, 1)

    def forward(self, x):
        return torch.relu(self.a(x)) + self.b(x)


class DataDependent(nn.Module):
    def forward(self, x):
        if x.sum() > 0:
            return x * 2
        return x - 1


class NeedsArgs(nn.Module):
    def __init__(self, width):
        super().__init__()
