"""CostModel: roofline without measurements, measured when it can, calibration recovering known relations."""

from __future__ import annotations

import pytest

from device_profiles.loader import load_profile
from models.coarsen import coarsen
from models.graph import build_graph
from models.onnx_io import load_onnx
from planner.costmodel import CostModel
from profiler.costtable import Conditions, CostEntry, CostTable, entry_key


@pytest.fixture(scope="module")
def squeeze(exported):
    loaded = load_onnx(exported("squeezenet1_1").path)
    graph = build_graph(loaded.proto, loaded.sha256, "squeezenet1_1")
    return graph, coarsen(graph, "coarse")


def _cond(kind: str, cores: int = 1) -> Conditions:
    return Conditions("local", "cpu", cores, cores, "CPUExecutionProvider", "x", "disable" if kind == "op" else "all")


def _entry(graph, kind: str, name: str, members, ms: float, cores: int = 1) -> CostEntry:
    members = tuple(members)
    c = _cond(kind, cores)
    return CostEntry(
        entry_key(graph.model_sha256, kind, members, c), kind, graph.model_sha256, name, members, c, ms, ms, ms, ms, 10
    )


def _synthetic_table(graph, blocks, alpha: float, beta: float) -> tuple[CostTable, list[str]]:
    """Ops cost FLOPs/1e8 ms; blocks are 0.8 x their ops; partitions alpha x blocks + beta."""
    table = CostTable()
    op_ms = {n.name: n.flops / 1e8 + 0.01 for n in graph.nodes}
    block_ms = {}
    for b in blocks.nodes:
        block_ms[b.name] = 0.8 * sum(op_ms[m] for m in b.members)
        table.add(_entry(graph, "block", b.name, b.members, block_ms[b.name]))
    for n in graph.nodes:
        table.add(_entry(graph, "op", n.name, (n.name,), op_ms[n.name]))
    labels = []
    names = [b.name for b in blocks.nodes]
    for i in range(0, len(names) - 3, 2):
        chunk = names[i : i + 4]
        members = [m for b in chunk for m in blocks.index[b].members]
        label = f"p{i}"
        table.add(_entry(graph, "partition", label, members, alpha * sum(block_ms[b] for b in chunk) + beta))
        labels.append(label)
    return table, labels


def test_roofline_without_measurements(squeeze) -> None:
    graph, _blocks = squeeze
    cost = CostModel(load_profile("khadas-vim3"), graph)
    whole = [n.name for n in graph.nodes]
    a73, a53 = cost.group_ms(whole, "a73", 4), cost.group_ms(whole, "a53", 2)
    assert a73.source == a53.source == "roofline"
    assert a53.ms > a73.ms > 0, "fewer, slower cores take longer"
    assert cost.group_ms(whole, "a73", 1).ms > a73.ms


def test_measured_group_is_used_as_is(squeeze) -> None:
    graph, blocks = squeeze
    table, _ = _synthetic_table(graph, blocks, 0.9, 0.3)
    cost = CostModel.from_table(load_profile("local"), graph, table)
    b = blocks.nodes[3]
    prediction = cost.group_ms(b.members, "cpu", 1)
    assert prediction.source == "measured"
    assert prediction.ms == pytest.approx(0.8 * sum(graph.index[m].flops / 1e8 + 0.01 for m in b.members))


def test_calibration_recovers_partition_relation_on_held_out_data(squeeze) -> None:
    graph, blocks = squeeze
    table, labels = _synthetic_table(graph, blocks, alpha=0.9, beta=0.3)
    holdout = labels[1::2]
    cost = CostModel.from_table(load_profile("local"), graph, table, holdout=holdout)
    fit = cost.fits[("cpu", 1)]
    assert fit.alpha == pytest.approx(0.9, rel=1e-6) and fit.beta_ms == pytest.approx(0.3, rel=1e-6)
    assert fit.fusion == pytest.approx(0.8, rel=1e-6)
    evaluation = cost.evaluate()
    assert evaluation.count == len(holdout)
    assert evaluation.median_abs_pct < 1e-6


def test_unmeasured_config_falls_back_to_roofline(squeeze) -> None:
    graph, blocks = squeeze
    table, _ = _synthetic_table(graph, blocks, 1.0, 0.0)
    cost = CostModel.from_table(load_profile("local"), graph, table)
    whole = [n.name for n in graph.nodes]
    cores = len(load_profile("local").pu("cpu").cores)
    if cores == 1:
        pytest.skip("one core: no second configuration")
    assert cost.group_ms(whole, "cpu", cores).source == "roofline"


def test_transfer_cost_uses_the_link(squeeze) -> None:
    graph, _ = squeeze
    cost = CostModel(load_profile("khadas-vim3"), graph)
    mb = 1_000_000
    assert cost.transfer_ms(mb, "a73", "a73") == 0.0
    cpu_gpu = cost.transfer_ms(mb, "a73", "mali")
    # latency + bytes / 3 GB/s + layout conversion + the host feeding the GPU (default estimate, 80 us)
    assert cpu_gpu == pytest.approx(0.08 + 1 / 3.0 + 0.35 + 0.08)
    assert cost.transfer_ms(mb, "a73", "a53") < cpu_gpu
