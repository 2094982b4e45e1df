"""Every zoo model: export, load, coarsen both ways, cut into >= 3 partitions, chained == full."""

from __future__ import annotations

import pytest

from models.coarsen import coarsen
from models.graph import build_graph
from models.onnx_io import load_onnx
from models.partition import cut_partitions, example_grouping, random_feeds, verify_partitions
from models.zoo import CORE as ZOO

# MobileNetV2 is one chain (its skips have no operators), so no two of its operators are independent.
CHAIN_MODELS = {"mobilenet_v2"}


@pytest.mark.parametrize("name", list(ZOO))
def test_zoo_model_round_trips(name: str, exported) -> None:
    report = exported(name)
    assert report.max_rel_diff <= 1e-4
    assert not list(report.path.parent.glob(f"{name}.onnx.data")), "export left an external-data file"

    loaded = load_onnx(report.path)
    graph = build_graph(loaded.proto, loaded.sha256, name)
    assert len(graph.nodes) == report.nodes
    onnx_names = [n.name for n in loaded.proto.graph.node]
    for granularity in ("fine", "coarse"):
        blocks = coarsen(graph, granularity)
        members = [m for b in blocks.nodes for m in b.members]
        assert sorted(members) == sorted(onnx_names), f"{granularity} blocks must cover every node once"
        assert sum(b.flops for b in blocks.nodes) == graph.total_flops
        position = {b.name: i for i, b in enumerate(blocks.nodes)}
        assert all(position[e.src] < position[e.dst] for e in blocks.edges), "blocks out of topological order"
    fine, coarse = coarsen(graph, "fine"), coarsen(graph, "coarse")
    assert len(coarse.nodes) < len(fine.nodes) < len(graph.nodes)

    cut = cut_partitions(loaded.proto, graph, example_grouping(coarse, 4))
    assert len(cut.partitions) >= 3
    if name in CHAIN_MODELS:
        assert coarse.max_parallel_width() == 1 and not cut.parallel_pairs()
    else:
        assert cut.parallel_pairs(), "a branchy model must be cut with a parallel pair"
    assert verify_partitions(loaded.proto, cut, random_feeds(graph, loaded.proto)) <= 1e-5
