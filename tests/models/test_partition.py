"""Invalid groupings are refused with errors naming the nodes; valid ones cut and chain exactly."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from models.coarsen import coarsen
from models.errors import PartitionError
from models.graph import build_graph
from models.onnx_io import load_onnx
from models.partition import cut_partitions, example_grouping, random_feeds, verify_partitions
from parapipe.cli import app


@pytest.fixture(scope="module")
def googlenet(exported):
    loaded = load_onnx(exported("googlenet").path)
    return loaded, build_graph(loaded.proto, loaded.sha256, "googlenet")


def _halves(graph) -> dict[str, list[str]]:
    names = [n.name for n in graph.nodes]
    return {"first": names[: len(names) // 2], "second": names[len(names) // 2 :]}


def test_node_in_two_partitions_is_refused(googlenet) -> None:
    loaded, graph = googlenet
    groups = _halves(graph)
    groups["second"].append(groups["first"][3])
    with pytest.raises(PartitionError, match=f"node '{groups['first'][3]}' is in two partitions"):
        cut_partitions(loaded.proto, graph, groups)


def test_node_in_no_partition_is_refused(googlenet) -> None:
    loaded, graph = googlenet
    groups = _halves(graph)
    lost = groups["second"].pop()
    with pytest.raises(PartitionError, match=f"in no partition: {lost}"):
        cut_partitions(loaded.proto, graph, groups)


def test_unknown_node_is_refused(googlenet) -> None:
    loaded, graph = googlenet
    groups = _halves(graph)
    groups["first"].append("no_such_node")
    with pytest.raises(PartitionError, match="no_such_node"):
        cut_partitions(loaded.proto, graph, groups)


def test_cycle_between_partitions_is_refused_naming_the_nodes(googlenet) -> None:
    loaded, graph = googlenet
    groups = _halves(graph)
    # move the very first operator into the second half: second -> first -> second
    first_op = groups["first"].pop(0)
    groups["second"].insert(0, first_op)
    with pytest.raises(PartitionError, match="cycle") as info:
        cut_partitions(loaded.proto, graph, groups)
    assert first_op in str(info.value)


def test_parallel_partitions_chain_to_the_full_output(googlenet) -> None:
    loaded, graph = googlenet
    cut = cut_partitions(loaded.proto, graph, example_grouping(coarsen(graph, "coarse"), 5))
    assert len(cut.partitions) == 5
    assert cut.parallel_pairs()
    assert verify_partitions(loaded.proto, cut, random_feeds(graph, loaded.proto)) <= 1e-5
    deps = cut.dependencies()
    a, b = cut.parallel_pairs()[0]
    assert a not in deps[b] and b not in deps[a]


def test_saved_manifest_wires_tensors_and_hashes_files(googlenet, tmp_path: Path) -> None:
    import hashlib

    loaded, graph = googlenet
    cut = cut_partitions(loaded.proto, graph, example_grouping(coarsen(graph, "coarse"), 4))
    manifest = json.loads(cut.save(tmp_path).read_text())
    assert manifest["version"] == 1
    for part in manifest["partitions"]:
        data = (tmp_path / part["file"]).read_bytes()
        assert hashlib.sha256(data).hexdigest() == part["sha256"]
    produced = {t for p in manifest["partitions"] for t in p["outputs"]}
    for part in manifest["partitions"]:
        for t in part["inputs"]:
            assert t in produced or t in manifest["graph_inputs"]


def test_cli_partition_refuses_bad_groups_with_exit_2(googlenet, tmp_path: Path, exported) -> None:
    _, graph = googlenet
    groups = _halves(graph)
    groups["second"].append(groups["first"][0])
    path = tmp_path / "groups.json"
    path.write_text(json.dumps(groups))
    result = CliRunner().invoke(
        app, ["partition", str(exported("googlenet").path), "-o", str(tmp_path / "out"), "--groups", str(path)]
    )
    assert result.exit_code == 2
    assert "is in two partitions" in result.output
    path.write_text("[1, 2]")
    result = CliRunner().invoke(
        app, ["partition", str(exported("googlenet").path), "-o", str(tmp_path / "out"), "--groups", str(path)]
    )
    assert result.exit_code == 2 and "must hold a JSON object" in result.output
