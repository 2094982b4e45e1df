"""OpGraph figures checked against what is known of the architectures."""

from __future__ import annotations

import pytest

from models.coarsen import coarsen
from models.errors import ModelError
from models.graph import build_graph
from models.onnx_io import load_onnx


def _graph(exported, name: str):
    loaded = load_onnx(exported(name).path)
    return build_graph(loaded.proto, loaded.sha256, name)


def test_resnet18_flops_and_weights_match_the_architecture(exported) -> None:
    graph = _graph(exported, "resnet18")
    assert 3.5e9 < graph.total_flops < 3.8e9  # 1.82 GMACs
    assert 44e6 < graph.param_bytes < 48e6  # 11.7 M float32 weights
    assert graph.inputs[0].shape == (1, 3, 224, 224)
    assert graph.outputs[0].shape == (1, 1000)


def test_googlenet_has_nine_four_branch_forks(exported) -> None:
    graph = _graph(exported, "googlenet")
    four_way = [n for n, k in graph.forks().items() if k == 4]
    assert len(four_way) == 9
    coarse = coarsen(graph, "coarse")
    assert coarse.max_parallel_width() == 4
    # each Inception branch is one coarse block: a block never mixes two branches of one fork
    for _fork, succ in coarse.successors.items():
        if len(succ) == 4:
            assert len({coarse.index[s].members[0] for s in succ}) == 4


def test_fine_blocks_fuse_conv_relu_but_not_residual_add(exported) -> None:
    graph = _graph(exported, "resnet18")
    fine = coarsen(graph, "fine")
    conv_relu = [b for b in fine.nodes if b.op_types == ("Conv", "Relu")]
    assert conv_relu, "Conv followed by Relu must fuse into one fine block"
    adds = [b for b in fine.nodes if "Add" in b.op_types]
    assert adds
    for block in adds:  # the residual Add has two dynamic inputs: it starts its own block
        assert graph.index[block.members[0]].op_type == "Add"


def test_coarsen_refuses_unknown_granularity(exported) -> None:
    graph = _graph(exported, "squeezenet1_1")
    with pytest.raises(ModelError, match="unknown granularity"):
        coarsen(graph, "medium")


def test_edges_carry_tensor_sizes(exported) -> None:
    graph = _graph(exported, "squeezenet1_1")
    for e in graph.edges:
        assert e.nbytes == graph.tensors[e.tensor].nbytes > 0
