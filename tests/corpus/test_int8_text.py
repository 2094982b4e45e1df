"""Int8 blocks of a trained text model (paraphrase-MiniLM-L3-v2, fp32) are made into models onnxruntime runs.

Each block holding a MatMul, alone in int8 inside the fp32 model, must give a model onnxruntime makes a
session of with every graph optimisation on: the attention output's MatMul + bias Add, quantised, with
the residual Add after it in fp32, is one onnxruntime's MatMulAddFusion refuses ("Attempt to replace the
existing tensor"), so that bias Add stays in fp32 while its MatMul is int8.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from models.coarsen import coarsen
from models.graph import build_graph
from models.onnx_io import load_onnx
from models.precision import (
    REFUSED_LOSS,
    MixEvaluator,
    RefusedMix,
    assemble,
    measure_accuracy,
    quantizable_groups,
    tensor_ranges,
    write_ranges,
)
from planner.granularity import choose_granularity
from tests.support.realmodels import CORPUS, fetch

pytestmark = [pytest.mark.corpus]

LENGTH = 32


def _frames(n: int, seed: int) -> list[dict[str, np.ndarray]]:
    """Token ids of BERT's vocabulary (word pieces, not special tokens) between [CLS] and [SEP], then padding."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        used = int(rng.integers(8, LENGTH - 2))
        ids = [101, *rng.integers(1996, 29612, size=used).tolist(), 102] + [0] * (LENGTH - used - 2)
        mask = [1] * (used + 2) + [0] * (LENGTH - used - 2)
        out.append({"input_ids": np.array([ids], np.int64), "attention_mask": np.array([mask], np.int64)})
    return out


def test_every_matmul_block_of_a_text_model_alone_in_int8_runs_in_onnxruntime(tmp_path: Path) -> None:
    path = fetch(next(m for m in CORPUS if m.name == "paraphrase_minilm_l3"))
    model = load_onnx(path, {"input_ids": (1, LENGTH), "attention_mask": (1, LENGTH)})
    graph = build_graph(model.proto, model.sha256, "minilm")
    blocks = coarsen(graph, choose_granularity(graph, "auto"))
    groups = quantizable_groups(graph, {b.name: b.members for b in blocks.nodes})
    op_type = {n.name: n.op_type for n in graph.nodes}
    frames = _frames(6, seed=0)
    cache = write_ranges(tensor_ranges(model, frames[:4]), tmp_path / "ranges.json")
    reference = ort.InferenceSession(model.ort_proto.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in reference.get_outputs()]
    ref = [dict(zip(names, reference.run(None, f), strict=True)) for f in frames[4:]]

    dense = [g for g, members in groups.items() if any("attention/output/dense/Add" in m for m in members)]
    assert len(dense) == 3, "one attention output (MatMul + bias Add) per layer"
    for name in dense:
        mix = assemble(model, cache, int8_nodes=groups[name])
        session = ort.InferenceSession(mix.model, providers=["CPUExecutionProvider"])  # refused before
        quantised = onnx.load_from_string(mix.model).graph.node
        matmul = next(m for m in groups[name] if op_type[m] == "MatMul")
        assert any(n.op_type == "DequantizeLinear" and n.output[0] in _inputs(quantised, matmul) for n in quantised), (
            f"{matmul} should read int8 (dequantised) operands"
        )
        got = [dict(zip(names, session.run(None, f), strict=True)) for f in frames[4:]]
        assert measure_accuracy(ref, got, ("cosine",)).loss("cosine") < 0.05


def _inputs(nodes, name: str) -> set[str]:  # type: ignore[no-untyped-def]
    return {i for n in nodes if n.name == name for i in n.input}


def test_a_mix_onnxruntime_refuses_to_run_loses_everything_instead_of_failing(tmp_path: Path) -> None:
    """The query projection and the attention scores of one layer in int8, the key and value projections beside
    them in fp32: onnxruntime 1.32's MatMulAddFusion fails on the quantised model. Choosing precisions goes on:
    the mix is refused (``RefusedMix``) and its loss is the worst there is, so no budget admits it."""
    path = fetch(next(m for m in CORPUS if m.name == "paraphrase_minilm_l3"))
    model = load_onnx(path, {"input_ids": (1, LENGTH), "attention_mask": (1, LENGTH)})
    graph = build_graph(model.proto, model.sha256, "minilm")
    blocks = coarsen(graph, choose_granularity(graph, "auto"))
    groups = quantizable_groups(graph, {b.name: b.members for b in blocks.nodes})
    layer = "/encoder/layer.0/attention/self/"
    query = next(g for g, m in groups.items() if any(n.endswith(layer + "query/MatMul") for n in m))
    scores = next(g for g, m in groups.items() if any(n.endswith(layer + "MatMul") for n in m))
    frames = _frames(4, seed=1)
    cache = write_ranges(tensor_ranges(model, frames), tmp_path / "ranges.json")
    with pytest.raises(RefusedMix, match="refuses the quantised model"):
        assemble(model, cache, int8_nodes=[*groups[query], *groups[scores]])
    evaluator = MixEvaluator(model, groups, frames, "cosine", cache)
    assert evaluator.loss([query, scores]) == REFUSED_LOSS
    assert evaluator.loss([query]) < 0.05 and evaluator.loss([scores]) < 0.05  # each alone runs
