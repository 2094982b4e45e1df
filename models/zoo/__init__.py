"""The model zoo: torch definitions with random weights and their example inputs.

Importing this package imports torch; the rest of ``models`` does not.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from torch import nn

from models.errors import ModelError
from models.zoo import cnn, scale, transformer


@dataclass(frozen=True)
class InputSpec:
    """One model input: name, static shape, dtype and, for integer ids, the exclusive upper bound."""

    name: str
    shape: tuple[int, ...]
    dtype: str = "float32"
    high: int | None = None


@dataclass(frozen=True)
class ZooEntry:
    name: str
    factory: Callable[[], nn.Module]
    inputs: tuple[InputSpec, ...]
    description: str
    scale: bool = False  # 300-900 operators: planning at real scale (benchmarks and the scale tests only)

    def build(self) -> nn.Module:
        return self.factory().eval()


def _image(side: int = 224) -> tuple[InputSpec, ...]:
    return (InputSpec("input", (1, 3, side, side)),)


ZOO: dict[str, ZooEntry] = {
    e.name: e
    for e in (
        ZooEntry("resnet18", cnn.resnet18, _image(), "ResNet-18: chains with residual forks"),
        ZooEntry("resnet50", cnn.resnet50, _image(), "ResNet-50: bottleneck residual blocks"),
        ZooEntry("mobilenet_v2", cnn.mobilenet_v2, _image(), "MobileNetV2: depthwise inverted residuals"),
        ZooEntry("googlenet", cnn.googlenet, _image(), "GoogLeNet (Inception v1): 9 four-branch blocks"),
        ZooEntry("inception_v3", cnn.inception_v3, _image(299), "Inception-v3: nested multi-branch blocks"),
        ZooEntry("squeezenet1_1", cnn.squeezenet1_1, _image(), "SqueezeNet 1.1: two-branch fire modules"),
        ZooEntry(
            "bert_tiny",
            transformer.bert_tiny,
            (InputSpec("input_ids", (1, 128), "int64", 1024),),
            "BERT-like encoder, 4 layers, hidden 256, seq 128",
        ),
        ZooEntry(
            "bert_small",
            transformer.bert_small,
            (InputSpec("input_ids", (1, 128), "int64", 1024),),
            "BERT-like encoder, 12 layers, hidden 256, seq 128 (several hundred ops)",
        ),
        ZooEntry("inception_v4", scale.inception_v4, _image(299), "Inception-v4 (4/7/3 blocks), the paper's", True),
        ZooEntry(
            "inception_resnet_v2", scale.inception_resnet_v2, _image(299), "Inception-ResNet-v2 (10/20/10 blocks)", True
        ),
        ZooEntry("yolo_det", scale.yolo_det, _image(320), "YOLOv8-class detector: C2f, SPPF, PAN, 3 heads", True),
        ZooEntry("dbnet_det", scale.dbnet_det, _image(320), "DBNet-class text detector: ResNet + FPN + heads", True),
        ZooEntry(
            "multiview_bev",
            scale.multiview_bev,
            (InputSpec("views", (1, 6, 3, 64, 128)),),
            "six camera views, one shared backbone, transformer head (PETR/BEVFormer shape)",
            True,
        ),
    )
}
CORE = {name: e for name, e in ZOO.items() if not e.scale}  # the models every test runs through


def zoo_entry(name: str) -> ZooEntry:
    try:
        return ZOO[name]
    except KeyError:
        raise ModelError(f"unknown zoo model {name!r}; choose one of: {', '.join(ZOO)}") from None
