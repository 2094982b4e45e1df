"""The zoo's models at real scale (300-900 operators) export, load and cut like the others."""

from __future__ import annotations

import pytest

from models.coarsen import coarsen
from models.graph import build_graph
from models.onnx_io import load_onnx
from models.partition import cut_partitions, example_grouping, verify_partitions
from models.zoo import ZOO

SCALE = [name for name, e in ZOO.items() if e.scale]
MIN_OPS = {"inception_v4": 300, "inception_resnet_v2": 600, "multiview_bev": 340, "yolo_det": 250, "dbnet_det": 120}


@pytest.mark.parametrize("name", SCALE)
def test_scale_model_exports_loads_and_cuts(exported, name: str) -> None:
    loaded = load_onnx(exported(name).path)
    graph = build_graph(loaded.proto, loaded.sha256, name)
    assert len(graph.nodes) >= MIN_OPS[name]
    coarse = coarsen(graph, "coarse")
    assert coarse.max_parallel_width() >= 2, "every scale model has parallel branches"
    cut = cut_partitions(loaded.proto, graph, example_grouping(coarse, 4))
    assert cut.parallel_pairs()
    verify_partitions(loaded.ort_proto, cut, loaded.feeds())
