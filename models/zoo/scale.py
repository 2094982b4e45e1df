"""Zoo models of the sizes and shapes users bring (300-900 operators), for planning at real scale.

- Inception-v4 and Inception-ResNet-v2: the Para-Pipe paper's models (Szegedy et al. 2016),
  written out with their block counts (4/7/3 and 10/20/10) and the paper's widths.
- ``yolo_det``: a YOLOv8-class detector: C2f blocks (split, a chain of bottlenecks,
  concat), SPPF, an FPN/PAN neck with upsample/concat, three detection heads each with a
  box and a class branch.
- ``dbnet_det``: a DBNet-class text detector: a ResNet-18-like backbone, an FPN
  (lateral 1x1, upsample, add), the four maps upsampled and concatenated, and the
  probability/threshold heads.
- ``multiview_bev``: six camera views through one shared backbone (the weights are
  shared; each view is its own branch in the graph), tokens from every view into a
  transformer head, the PETR/BEVFormer shape.

Weights are random (initialised to keep activations of order one); inputs are small
enough that a model exports in seconds on two cores.
"""

from __future__ import annotations

import torch
from torch import nn

from models.zoo.cnn import ConvBN, _init_weights
from models.zoo.transformer import EncoderLayer

# --------------------------------------------------------------------------- Inception-v4


class _Cat(nn.Module):
    """Branches applied to one input, concatenated on channels."""

    def __init__(self, *branches: nn.Module) -> None:
        super().__init__()
        self.branches = nn.ModuleList(branches)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([b(x) for b in self.branches], 1)


def _seq(*layers: nn.Module) -> nn.Sequential:
    return nn.Sequential(*layers)


def _pool_branch(cin: int, cout: int) -> nn.Module:
    return _seq(nn.AvgPool2d(3, 1, 1, count_include_pad=False), ConvBN(cin, cout, 1))


def _stem(cin: int = 3) -> nn.Module:
    return _seq(
        ConvBN(cin, 32, 3, 2),
        ConvBN(32, 32, 3),
        ConvBN(32, 64, 3, padding=1),
        _Cat(nn.MaxPool2d(3, 2), ConvBN(64, 96, 3, 2)),
        _Cat(
            _seq(ConvBN(160, 64, 1), ConvBN(64, 96, 3)),
            _seq(
                ConvBN(160, 64, 1),
                ConvBN(64, 64, (1, 7), padding=(0, 3)),
                ConvBN(64, 64, (7, 1), padding=(3, 0)),
                ConvBN(64, 96, 3),
            ),
        ),
        _Cat(ConvBN(192, 192, 3, 2), nn.MaxPool2d(3, 2)),
    )


def _inception_a(cin: int = 384) -> nn.Module:
    return _Cat(
        ConvBN(cin, 96, 1),
        _seq(ConvBN(cin, 64, 1), ConvBN(64, 96, 3, padding=1)),
        _seq(ConvBN(cin, 64, 1), ConvBN(64, 96, 3, padding=1), ConvBN(96, 96, 3, padding=1)),
        _pool_branch(cin, 96),
    )


def _inception_b(cin: int = 1024) -> nn.Module:
    return _Cat(
        ConvBN(cin, 384, 1),
        _seq(ConvBN(cin, 192, 1), ConvBN(192, 224, (1, 7), padding=(0, 3)), ConvBN(224, 256, (7, 1), padding=(3, 0))),
        _seq(
            ConvBN(cin, 192, 1),
            ConvBN(192, 192, (7, 1), padding=(3, 0)),
            ConvBN(192, 224, (1, 7), padding=(0, 3)),
            ConvBN(224, 224, (7, 1), padding=(3, 0)),
            ConvBN(224, 256, (1, 7), padding=(0, 3)),
        ),
        _pool_branch(cin, 128),
    )


class _InceptionC(nn.Module):
    def __init__(self, cin: int = 1536) -> None:
        super().__init__()
        self.b1 = ConvBN(cin, 256, 1)
        self.b2 = ConvBN(cin, 384, 1)
        self.b2a, self.b2b = ConvBN(384, 256, (1, 3), padding=(0, 1)), ConvBN(384, 256, (3, 1), padding=(1, 0))
        self.b3 = _seq(
            ConvBN(cin, 384, 1), ConvBN(384, 448, (3, 1), padding=(1, 0)), ConvBN(448, 512, (1, 3), padding=(0, 1))
        )
        self.b3a, self.b3b = ConvBN(512, 256, (1, 3), padding=(0, 1)), ConvBN(512, 256, (3, 1), padding=(1, 0))
        self.b4 = _pool_branch(cin, 256)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b2, b3 = self.b2(x), self.b3(x)
        return torch.cat([self.b1(x), self.b2a(b2), self.b2b(b2), self.b3a(b3), self.b3b(b3), self.b4(x)], 1)


class InceptionV4(nn.Module):
    def __init__(self, classes: int = 1000) -> None:
        super().__init__()
        reduction_a = _Cat(
            ConvBN(384, 384, 3, 2),
            _seq(ConvBN(384, 192, 1), ConvBN(192, 224, 3, padding=1), ConvBN(224, 256, 3, 2)),
            nn.MaxPool2d(3, 2),
        )
        reduction_b = _Cat(
            _seq(ConvBN(1024, 192, 1), ConvBN(192, 192, 3, 2)),
            _seq(
                ConvBN(1024, 256, 1),
                ConvBN(256, 256, (1, 7), padding=(0, 3)),
                ConvBN(256, 320, (7, 1), padding=(3, 0)),
                ConvBN(320, 320, 3, 2),
            ),
            nn.MaxPool2d(3, 2),
        )
        self.features = _seq(
            _stem(),
            *[_inception_a() for _ in range(4)],
            reduction_a,
            *[_inception_b() for _ in range(7)],
            reduction_b,
            *[_InceptionC() for _ in range(3)],
        )
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(1536, classes)
        _init_weights(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(self.pool(self.features(x)), 1))


def inception_v4() -> nn.Module:
    return InceptionV4()


# --------------------------------------------------------------------------- Inception-ResNet-v2


class _Residual(nn.Module):
    """x + scale * conv1x1(concat(branches(x))), then ReLU (Inception-ResNet's residual blocks)."""

    def __init__(self, cin: int, branches: list[nn.Module], width: int, scale: float, relu: bool = True) -> None:
        super().__init__()
        self.branches = _Cat(*branches)
        self.up = nn.Conv2d(width, cin, 1)
        self.scale = scale
        self.relu = nn.ReLU(inplace=False) if relu else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.relu(x + self.scale * self.up(self.branches(x)))


def _block35() -> nn.Module:
    return _Residual(
        320,
        [
            ConvBN(320, 32, 1),
            _seq(ConvBN(320, 32, 1), ConvBN(32, 32, 3, padding=1)),
            _seq(ConvBN(320, 32, 1), ConvBN(32, 48, 3, padding=1), ConvBN(48, 64, 3, padding=1)),
        ],
        128,
        0.17,
    )


def _block17() -> nn.Module:
    return _Residual(
        1088,
        [
            ConvBN(1088, 192, 1),
            _seq(
                ConvBN(1088, 128, 1), ConvBN(128, 160, (1, 7), padding=(0, 3)), ConvBN(160, 192, (7, 1), padding=(3, 0))
            ),
        ],
        384,
        0.10,
    )


def _block8(relu: bool = True) -> nn.Module:
    return _Residual(
        2080,
        [
            ConvBN(2080, 192, 1),
            _seq(
                ConvBN(2080, 192, 1), ConvBN(192, 224, (1, 3), padding=(0, 1)), ConvBN(224, 256, (3, 1), padding=(1, 0))
            ),
        ],
        448,
        0.20,
        relu,
    )


class InceptionResNetV2(nn.Module):
    def __init__(self, classes: int = 1000) -> None:
        super().__init__()
        stem = _seq(
            ConvBN(3, 32, 3, 2),
            ConvBN(32, 32, 3),
            ConvBN(32, 64, 3, padding=1),
            nn.MaxPool2d(3, 2),
            ConvBN(64, 80, 1),
            ConvBN(80, 192, 3),
            nn.MaxPool2d(3, 2),
        )
        mixed_5b = _Cat(
            ConvBN(192, 96, 1),
            _seq(ConvBN(192, 48, 1), ConvBN(48, 64, 5, padding=2)),
            _seq(ConvBN(192, 64, 1), ConvBN(64, 96, 3, padding=1), ConvBN(96, 96, 3, padding=1)),
            _pool_branch(192, 64),
        )
        mixed_6a = _Cat(
            ConvBN(320, 384, 3, 2),
            _seq(ConvBN(320, 256, 1), ConvBN(256, 256, 3, padding=1), ConvBN(256, 384, 3, 2)),
            nn.MaxPool2d(3, 2),
        )
        mixed_7a = _Cat(
            _seq(ConvBN(1088, 256, 1), ConvBN(256, 384, 3, 2)),
            _seq(ConvBN(1088, 256, 1), ConvBN(256, 288, 3, 2)),
            _seq(ConvBN(1088, 256, 1), ConvBN(256, 288, 3, padding=1), ConvBN(288, 320, 3, 2)),
            nn.MaxPool2d(3, 2),
        )
        self.features = _seq(
            stem,
            mixed_5b,
            *[_block35() for _ in range(10)],
            mixed_6a,
            *[_block17() for _ in range(20)],
            mixed_7a,
            *[_block8() for _ in range(9)],
            _block8(relu=False),
            ConvBN(2080, 1536, 1),
        )
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(1536, classes)
        _init_weights(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(self.pool(self.features(x)), 1))


def inception_resnet_v2() -> nn.Module:
    return InceptionResNetV2()


# --------------------------------------------------------------------------- YOLO-class detector


def _cbs(cin: int, cout: int, k: int = 1, s: int = 1) -> ConvBN:
    return ConvBN(cin, cout, k, s, k // 2, act=nn.SiLU)


class _Bottleneck(nn.Module):
    def __init__(self, c: int, shortcut: bool) -> None:
        super().__init__()
        self.body = _seq(_cbs(c, c, 3), _cbs(c, c, 3))
        self.shortcut = shortcut

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.body(x) if self.shortcut else self.body(x)


class C2f(nn.Module):
    """Split the channels in two, run a chain of bottlenecks on one half, concatenate every stage."""

    def __init__(self, cin: int, cout: int, n: int, shortcut: bool = True) -> None:
        super().__init__()
        self.hidden = cout // 2
        self.cv1 = _cbs(cin, 2 * self.hidden)
        self.blocks = nn.ModuleList(_Bottleneck(self.hidden, shortcut) for _ in range(n))
        self.cv2 = _cbs((2 + n) * self.hidden, cout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        parts = list(self.cv1(x).split(self.hidden, 1))
        for b in self.blocks:
            parts.append(b(parts[-1]))
        return self.cv2(torch.cat(parts, 1))


class SPPF(nn.Module):
    def __init__(self, cin: int, cout: int) -> None:
        super().__init__()
        self.cv1, self.cv2 = _cbs(cin, cin // 2), _cbs(cin * 2, cout)
        self.pool = nn.MaxPool2d(5, 1, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.cv1(x)
        y1 = self.pool(x)
        y2 = self.pool(y1)
        return self.cv2(torch.cat([x, y1, y2, self.pool(y2)], 1))


class _Head(nn.Module):
    """One scale's detection head: a box branch (4 x 16 bins) and a class branch, concatenated."""

    def __init__(self, cin: int, classes: int) -> None:
        super().__init__()
        self.box = _seq(_cbs(cin, 64, 3), _cbs(64, 64, 3), nn.Conv2d(64, 64, 1))
        self.cls = _seq(_cbs(cin, 80, 3), _cbs(80, 80, 3), nn.Conv2d(80, classes, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.box(x), self.cls(x)], 1).flatten(2)


class YoloDet(nn.Module):
    def __init__(self, classes: int = 80, w: int = 32) -> None:
        super().__init__()
        self.stem = _seq(_cbs(3, w // 2, 3, 2), _cbs(w // 2, w, 3, 2), C2f(w, w, 1))
        self.p3 = _seq(_cbs(w, 2 * w, 3, 2), C2f(2 * w, 2 * w, 3))
        self.p4 = _seq(_cbs(2 * w, 4 * w, 3, 2), C2f(4 * w, 4 * w, 3))
        self.p5 = _seq(_cbs(4 * w, 8 * w, 3, 2), C2f(8 * w, 8 * w, 1), SPPF(8 * w, 8 * w))
        self.classes = classes
        self.dfl = nn.Conv2d(16, 1, 1, bias=False)  # distribution focal loss decode: expected bin
        with torch.no_grad():
            self.dfl.weight.copy_(torch.arange(16, dtype=torch.float32).view(1, 16, 1, 1))
        self.up = nn.Upsample(scale_factor=2.0, mode="nearest")
        self.td4 = C2f(12 * w, 4 * w, 2, False)
        self.td3 = C2f(6 * w, 2 * w, 2, False)
        self.down3 = _cbs(2 * w, 2 * w, 3, 2)
        self.bu4 = C2f(6 * w, 4 * w, 2, False)
        self.down4 = _cbs(4 * w, 4 * w, 3, 2)
        self.bu5 = C2f(12 * w, 8 * w, 2, False)
        self.heads = nn.ModuleList([_Head(2 * w, classes), _Head(4 * w, classes), _Head(8 * w, classes)])
        _init_weights(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        p3 = self.p3(self.stem(x))
        p4 = self.p4(p3)
        p5 = self.p5(p4)
        t4 = self.td4(torch.cat([self.up(p5), p4], 1))
        t3 = self.td3(torch.cat([self.up(t4), p3], 1))
        b4 = self.bu4(torch.cat([self.down3(t3), t4], 1))
        b5 = self.bu5(torch.cat([self.down4(b4), p5], 1))
        raw = torch.cat([h(f) for h, f in zip(self.heads, (t3, b4, b5), strict=True)], 2)  # [1, 64 + classes, anchors]
        box, cls = raw.split((64, self.classes), 1)
        anchors = box.shape[2]
        dist = self.dfl(box.view(1, 4, 16, anchors).transpose(2, 1).softmax(1)).view(1, 4, anchors)
        lt, rb = dist.chunk(2, 1)
        return torch.cat([(rb - lt) / 2, lt + rb, cls.sigmoid()], 1)


def yolo_det() -> nn.Module:
    return YoloDet()


# --------------------------------------------------------------------------- DBNet-class text detector


class _Basic(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.body = _seq(ConvBN(cin, cout, 3, stride, 1), ConvBN(cout, cout, 3, 1, 1, act=None))
        self.short = nn.Identity() if stride == 1 and cin == cout else ConvBN(cin, cout, 1, stride, act=None)
        self.damp = 0.2  # residual branches start small so random deep stacks keep activations of order one

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.damp * self.body(x) + self.short(x))


def _db_head(inner: int) -> nn.Module:
    """One DBNet map: conv, two 2x transposed convs back to the input's resolution, sigmoid."""
    return _seq(
        ConvBN(inner, inner // 4, 3, 1, 1),
        nn.ConvTranspose2d(inner // 4, inner // 4, 2, 2),
        nn.ReLU(),
        nn.ConvTranspose2d(inner // 4, 1, 2, 2),
        nn.Sigmoid(),
    )


class DBNet(nn.Module):
    def __init__(self, inner: int = 64) -> None:
        super().__init__()
        self.stem = _seq(ConvBN(3, 32, 3, 2, 1), nn.MaxPool2d(3, 2, 1))
        widths, depths = (32, 64, 128, 256), (3, 4, 6, 3)  # ResNet-34's depths
        stages, cin = [], 32
        for i, (c, n) in enumerate(zip(widths, depths, strict=True)):
            stages.append(_seq(_Basic(cin, c, 1 if i == 0 else 2), *[_Basic(c, c, 1) for _ in range(n - 1)]))
            cin = c
        self.stages = nn.ModuleList(stages)
        self.lateral = nn.ModuleList(nn.Conv2d(c, inner, 1, bias=False) for c in widths)
        self.smooth = nn.ModuleList(ConvBN(inner, inner // 4, 3, 1, 1) for _ in widths)
        self.prob, self.thresh = _db_head(inner), _db_head(inner)  # probability and threshold maps
        _init_weights(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        feats, h = [], self.stem(x)
        for stage in self.stages:
            h = stage(h)
            feats.append(h)
        lat = [conv(f) for conv, f in zip(self.lateral, feats, strict=True)]
        for i in range(len(lat) - 2, -1, -1):  # top-down: upsample and add
            lat[i] = lat[i] + nn.functional.interpolate(lat[i + 1], scale_factor=2.0, mode="nearest")
        maps = [
            nn.functional.interpolate(s(f), scale_factor=float(2**i), mode="nearest") if i else s(f)
            for i, (s, f) in enumerate(zip(self.smooth, lat, strict=True))
        ]
        fused = torch.cat(maps, 1)
        return torch.cat([self.prob(fused), self.thresh(fused)], 1)


def dbnet_det() -> nn.Module:
    return DBNet()


# --------------------------------------------------------------------------- multi-view BEV-style model


class MultiViewBEV(nn.Module):
    """Six views -> one shared CNN backbone (a branch per view) -> tokens -> transformer head -> queries."""

    def __init__(self, views: int = 6, hidden: int = 128, layers: int = 6, queries: int = 64) -> None:
        super().__init__()
        self.views = views
        self.backbone = _seq(
            ConvBN(3, 32, 3, 2, 1),
            _Basic(32, 32, 1),
            _Basic(32, 64, 2),
            _Basic(64, hidden, 2),
            nn.AdaptiveAvgPool2d((4, 8)),
        )
        self.view_embed = nn.Parameter(torch.randn(1, views * 32, hidden) * 0.02)
        seq = views * 32 + queries
        self.query = nn.Parameter(torch.randn(1, queries, hidden) * 0.02)
        self.layers = nn.Sequential(*[EncoderLayer(hidden, 4, 2 * hidden, seq) for _ in range(layers)])
        self.queries = queries
        self.box = nn.Linear(hidden, 10)
        self.cls = nn.Linear(hidden, 10)
        _init_weights(self)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        tokens = [self.backbone(x[:, v]).flatten(2).transpose(1, 2) for v in range(self.views)]
        h = torch.cat([torch.cat(tokens, 1) + self.view_embed, self.query], 1)
        q = self.layers(h)[:, -self.queries :]
        return self.box(q), self.cls(q)


def multiview_bev() -> nn.Module:
    return MultiViewBEV()
