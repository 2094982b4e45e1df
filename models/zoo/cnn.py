"""Convolutional zoo models: ResNet, MobileNetV2, GoogLeNet, Inception-v3, SqueezeNet.

Written out here (not taken from torchvision) so the zoo has no download path and no
extra dependency. Weights are random; initialisation keeps activations of order one
so that numerical comparisons between partitions and the full model stay meaningful.
"""

from __future__ import annotations

import torch
from torch import nn


def _init_weights(model: nn.Module) -> None:
    for m in model.modules():
        if isinstance(m, nn.Conv2d):
            nn.init.kaiming_normal_(m.weight, mode="fan_in", nonlinearity="relu")
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.BatchNorm2d):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, 0.0, 0.01)
            nn.init.zeros_(m.bias)


class ConvBN(nn.Sequential):
    """Conv -> BatchNorm -> activation, the unit every CNN here is built from."""

    def __init__(
        self,
        cin: int,
        cout: int,
        kernel: int | tuple[int, int],
        stride: int = 1,
        padding: int | tuple[int, int] = 0,
        groups: int = 1,
        act: type[nn.Module] | None = nn.ReLU,
        eps: float = 1e-5,
    ) -> None:
        layers: list[nn.Module] = [
            nn.Conv2d(cin, cout, kernel, stride, padding, groups=groups, bias=False),
            nn.BatchNorm2d(cout, eps=eps),
        ]
        if act is not None:
            layers.append(act(inplace=True))
        super().__init__(*layers)


# --------------------------------------------------------------------------- ResNet


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, cin: int, planes: int, stride: int) -> None:
        super().__init__()
        self.body = nn.Sequential(
            ConvBN(cin, planes, 3, stride, 1),
            ConvBN(planes, planes, 3, 1, 1, act=None),
        )
        self.shortcut = _shortcut(cin, planes * self.expansion, stride)
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.relu(self.body(x) + self.shortcut(x))


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, cin: int, planes: int, stride: int) -> None:
        super().__init__()
        self.body = nn.Sequential(
            ConvBN(cin, planes, 1),
            ConvBN(planes, planes, 3, stride, 1),
            ConvBN(planes, planes * self.expansion, 1, act=None),
        )
        self.shortcut = _shortcut(cin, planes * self.expansion, stride)
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.relu(self.body(x) + self.shortcut(x))


def _shortcut(cin: int, cout: int, stride: int) -> nn.Module:
    if stride == 1 and cin == cout:
        return nn.Identity()
    return ConvBN(cin, cout, 1, stride, act=None)


class ResNet(nn.Module):
    def __init__(self, block: type[BasicBlock] | type[Bottleneck], layers: list[int], num_classes: int = 1000) -> None:
        super().__init__()
        self.stem = nn.Sequential(ConvBN(3, 64, 7, 2, 3), nn.MaxPool2d(3, 2, 1))
        stages: list[nn.Module] = []
        cin = 64
        for i, n in enumerate(layers):
            planes = 64 * 2**i
            for j in range(n):
                stages.append(block(cin, planes, 2 if (j == 0 and i > 0) else 1))
                cin = planes * block.expansion
        self.stages = nn.Sequential(*stages)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(cin, num_classes)
        _init_weights(self)
        # Damp each residual branch so activations do not grow with depth.
        for m in self.modules():
            if isinstance(m, (BasicBlock, Bottleneck)):
                nn.init.constant_(m.body[-1][1].weight, 0.3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stages(self.stem(x))
        return self.fc(torch.flatten(self.pool(x), 1))


def resnet18() -> nn.Module:
    return ResNet(BasicBlock, [2, 2, 2, 2])


def resnet50() -> nn.Module:
    return ResNet(Bottleneck, [3, 4, 6, 3])


# --------------------------------------------------------------------------- MobileNetV2


class InvertedResidual(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int, expand: int) -> None:
        super().__init__()
        hidden = cin * expand
        layers: list[nn.Module] = []
        if expand != 1:
            layers.append(ConvBN(cin, hidden, 1, act=nn.ReLU6))
        layers += [
            ConvBN(hidden, hidden, 3, stride, 1, groups=hidden, act=nn.ReLU6),
            ConvBN(hidden, cout, 1, act=None),
        ]
        self.body = nn.Sequential(*layers)
        self.residual = stride == 1 and cin == cout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.body(x) if self.residual else self.body(x)


class MobileNetV2(nn.Module):
    SETTINGS: tuple[tuple[int, int, int, int], ...] = (
        (1, 16, 1, 1),
        (6, 24, 2, 2),
        (6, 32, 3, 2),
        (6, 64, 4, 2),
        (6, 96, 3, 1),
        (6, 160, 3, 2),
        (6, 320, 1, 1),
    )

    def __init__(self, num_classes: int = 1000) -> None:
        super().__init__()
        layers: list[nn.Module] = [ConvBN(3, 32, 3, 2, 1, act=nn.ReLU6)]
        cin = 32
        for t, c, n, s in self.SETTINGS:
            for i in range(n):
                layers.append(InvertedResidual(cin, c, s if i == 0 else 1, t))
                cin = c
        layers.append(ConvBN(cin, 1280, 1, act=nn.ReLU6))
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Sequential(nn.Dropout(0.2), nn.Linear(1280, num_classes))
        _init_weights(self)
        for m in self.modules():
            if isinstance(m, InvertedResidual) and m.residual:
                nn.init.constant_(m.body[-1][1].weight, 0.3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = nn.functional.adaptive_avg_pool2d(self.features(x), 1)
        return self.classifier(torch.flatten(x, 1))


def mobilenet_v2() -> nn.Module:
    return MobileNetV2()


# --------------------------------------------------------------------------- GoogLeNet


class InceptionV1(nn.Module):
    """The four-branch Inception block of GoogLeNet (Szegedy et al. 2015, Table 1)."""

    def __init__(self, cin: int, c1: int, c3r: int, c3: int, c5r: int, c5: int, pool: int) -> None:
        super().__init__()
        self.branch1 = ConvBN(cin, c1, 1, eps=1e-3)
        self.branch3 = nn.Sequential(ConvBN(cin, c3r, 1, eps=1e-3), ConvBN(c3r, c3, 3, padding=1, eps=1e-3))
        self.branch5 = nn.Sequential(ConvBN(cin, c5r, 1, eps=1e-3), ConvBN(c5r, c5, 5, padding=2, eps=1e-3))
        self.branch_pool = nn.Sequential(nn.MaxPool2d(3, 1, 1, ceil_mode=True), ConvBN(cin, pool, 1, eps=1e-3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.branch1(x), self.branch3(x), self.branch5(x), self.branch_pool(x)], 1)


class GoogLeNet(nn.Module):
    def __init__(self, num_classes: int = 1000) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            ConvBN(3, 64, 7, 2, 3, eps=1e-3),
            nn.MaxPool2d(3, 2, ceil_mode=True),
            ConvBN(64, 64, 1, eps=1e-3),
            ConvBN(64, 192, 3, padding=1, eps=1e-3),
            nn.MaxPool2d(3, 2, ceil_mode=True),
        )
        self.blocks = nn.Sequential(
            InceptionV1(192, 64, 96, 128, 16, 32, 32),
            InceptionV1(256, 128, 128, 192, 32, 96, 64),
            nn.MaxPool2d(3, 2, ceil_mode=True),
            InceptionV1(480, 192, 96, 208, 16, 48, 64),
            InceptionV1(512, 160, 112, 224, 24, 64, 64),
            InceptionV1(512, 128, 128, 256, 24, 64, 64),
            InceptionV1(512, 112, 144, 288, 32, 64, 64),
            InceptionV1(528, 256, 160, 320, 32, 128, 128),
            nn.MaxPool2d(2, 2, ceil_mode=True),
            InceptionV1(832, 256, 160, 320, 32, 128, 128),
            InceptionV1(832, 384, 192, 384, 48, 128, 128),
        )
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.dropout = nn.Dropout(0.2)
        self.fc = nn.Linear(1024, num_classes)
        _init_weights(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(self.blocks(self.stem(x)))
        return self.fc(self.dropout(torch.flatten(x, 1)))


def googlenet() -> nn.Module:
    return GoogLeNet()


# --------------------------------------------------------------------------- Inception-v3


def _c(cin: int, cout: int, k: int | tuple[int, int], s: int = 1, p: int | tuple[int, int] = 0) -> ConvBN:
    return ConvBN(cin, cout, k, s, p, eps=1e-3)


class InceptionA(nn.Module):
    def __init__(self, cin: int, pool_features: int) -> None:
        super().__init__()
        self.b1 = _c(cin, 64, 1)
        self.b5 = nn.Sequential(_c(cin, 48, 1), _c(48, 64, 5, p=2))
        self.b3 = nn.Sequential(_c(cin, 64, 1), _c(64, 96, 3, p=1), _c(96, 96, 3, p=1))
        self.bp = nn.Sequential(nn.AvgPool2d(3, 1, 1), _c(cin, pool_features, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.b1(x), self.b5(x), self.b3(x), self.bp(x)], 1)


class InceptionB(nn.Module):
    def __init__(self, cin: int) -> None:
        super().__init__()
        self.b3 = _c(cin, 384, 3, s=2)
        self.b3dbl = nn.Sequential(_c(cin, 64, 1), _c(64, 96, 3, p=1), _c(96, 96, 3, s=2))
        self.bp = nn.MaxPool2d(3, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.b3(x), self.b3dbl(x), self.bp(x)], 1)


class InceptionC(nn.Module):
    def __init__(self, cin: int, c7: int) -> None:
        super().__init__()
        self.b1 = _c(cin, 192, 1)
        self.b7 = nn.Sequential(_c(cin, c7, 1), _c(c7, c7, (1, 7), p=(0, 3)), _c(c7, 192, (7, 1), p=(3, 0)))
        self.b7dbl = nn.Sequential(
            _c(cin, c7, 1),
            _c(c7, c7, (7, 1), p=(3, 0)),
            _c(c7, c7, (1, 7), p=(0, 3)),
            _c(c7, c7, (7, 1), p=(3, 0)),
            _c(c7, 192, (1, 7), p=(0, 3)),
        )
        self.bp = nn.Sequential(nn.AvgPool2d(3, 1, 1), _c(cin, 192, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.b1(x), self.b7(x), self.b7dbl(x), self.bp(x)], 1)


class InceptionD(nn.Module):
    def __init__(self, cin: int) -> None:
        super().__init__()
        self.b3 = nn.Sequential(_c(cin, 192, 1), _c(192, 320, 3, s=2))
        self.b7x3 = nn.Sequential(
            _c(cin, 192, 1), _c(192, 192, (1, 7), p=(0, 3)), _c(192, 192, (7, 1), p=(3, 0)), _c(192, 192, 3, s=2)
        )
        self.bp = nn.MaxPool2d(3, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.b3(x), self.b7x3(x), self.bp(x)], 1)


class InceptionE(nn.Module):
    def __init__(self, cin: int) -> None:
        super().__init__()
        self.b1 = _c(cin, 320, 1)
        self.b3_1 = _c(cin, 384, 1)
        self.b3_2a = _c(384, 384, (1, 3), p=(0, 1))
        self.b3_2b = _c(384, 384, (3, 1), p=(1, 0))
        self.b3dbl_1 = nn.Sequential(_c(cin, 448, 1), _c(448, 384, 3, p=1))
        self.b3dbl_2a = _c(384, 384, (1, 3), p=(0, 1))
        self.b3dbl_2b = _c(384, 384, (3, 1), p=(1, 0))
        self.bp = nn.Sequential(nn.AvgPool2d(3, 1, 1), _c(cin, 192, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = self.b3_1(x)
        b = self.b3dbl_1(x)
        return torch.cat(
            [
                self.b1(x),
                torch.cat([self.b3_2a(a), self.b3_2b(a)], 1),
                torch.cat([self.b3dbl_2a(b), self.b3dbl_2b(b)], 1),
                self.bp(x),
            ],
            1,
        )


class InceptionV3(nn.Module):
    def __init__(self, num_classes: int = 1000) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            _c(3, 32, 3, s=2),
            _c(32, 32, 3),
            _c(32, 64, 3, p=1),
            nn.MaxPool2d(3, 2),
            _c(64, 80, 1),
            _c(80, 192, 3),
            nn.MaxPool2d(3, 2),
        )
        self.blocks = nn.Sequential(
            InceptionA(192, 32),
            InceptionA(256, 64),
            InceptionA(288, 64),
            InceptionB(288),
            InceptionC(768, 128),
            InceptionC(768, 160),
            InceptionC(768, 160),
            InceptionC(768, 192),
            InceptionD(768),
            InceptionE(1280),
            InceptionE(2048),
        )
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.dropout = nn.Dropout(0.5)
        self.fc = nn.Linear(2048, num_classes)
        _init_weights(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(self.blocks(self.stem(x)))
        return self.fc(self.dropout(torch.flatten(x, 1)))


def inception_v3() -> nn.Module:
    return InceptionV3()


# --------------------------------------------------------------------------- SqueezeNet


class Fire(nn.Module):
    def __init__(self, cin: int, squeeze: int, e1: int, e3: int) -> None:
        super().__init__()
        self.squeeze = nn.Sequential(nn.Conv2d(cin, squeeze, 1), nn.ReLU(inplace=True))
        self.expand1 = nn.Sequential(nn.Conv2d(squeeze, e1, 1), nn.ReLU(inplace=True))
        self.expand3 = nn.Sequential(nn.Conv2d(squeeze, e3, 3, padding=1), nn.ReLU(inplace=True))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.squeeze(x)
        return torch.cat([self.expand1(x), self.expand3(x)], 1)


class SqueezeNet11(nn.Module):
    def __init__(self, num_classes: int = 1000) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 64, 3, 2),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(3, 2, ceil_mode=True),
            Fire(64, 16, 64, 64),
            Fire(128, 16, 64, 64),
            nn.MaxPool2d(3, 2, ceil_mode=True),
            Fire(128, 32, 128, 128),
            Fire(256, 32, 128, 128),
            nn.MaxPool2d(3, 2, ceil_mode=True),
            Fire(256, 48, 192, 192),
            Fire(384, 48, 192, 192),
            Fire(384, 64, 256, 256),
            Fire(512, 64, 256, 256),
        )
        self.classifier = nn.Sequential(
            nn.Dropout(0.5), nn.Conv2d(512, num_classes, 1), nn.ReLU(inplace=True), nn.AdaptiveAvgPool2d(1)
        )
        _init_weights(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.flatten(self.classifier(self.features(x)), 1)


def squeezenet1_1() -> nn.Module:
    return SqueezeNet11()
