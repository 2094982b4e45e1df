"""``parapipe demo``: the main job on the embedded ``local`` board.

Today: export a branchy zoo model, load it as an OpGraph, coarsen it, cut it into
partitions with a parallel pair, check the chained partitions against the full model.
"""

from __future__ import annotations

import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from models.coarsen import coarsen
from models.graph import build_graph
from models.onnx_io import load_onnx
from models.partition import cut_partitions, example_grouping, random_feeds, verify_partitions
from parapipe.summary import human_bytes, model_summary


def run_demo(model: str, workdir: Path, console: Console) -> None:
    from models.export import export_model

    workdir.mkdir(parents=True, exist_ok=True)
    onnx_path = workdir / f"{model}.onnx"
    t0 = time.perf_counter()
    console.rule(f"1. export {model}")
    report = export_model(model, onnx_path)
    console.print(
        f"{report.path}: {report.nodes} nodes, opset {report.opset}; onnxruntime vs torch max abs diff "
        f"{report.max_abs_diff:.2e}",
        highlight=False,
    )

    console.rule("2. load as OpGraph and coarsen")
    loaded = load_onnx(onnx_path)
    graph = build_graph(loaded.proto, loaded.sha256, model)
    summary = model_summary(loaded, graph)
    console.print(
        f"{summary['nodes']} operators, {graph.total_flops / 1e9:.2f} GFLOPs, weights {human_bytes(graph.param_bytes)}, "
        f"{summary['blocks']['fine']} fine / {summary['blocks']['coarse']} coarse blocks, "  # type: ignore[index]
        f"up to {summary['parallel_branches']} blocks can run in parallel",
        highlight=False,
    )

    console.rule("3. cut into partitions and check them")
    grouping = example_grouping(coarsen(graph, "coarse"), 4)
    cut = cut_partitions(loaded.proto, graph, grouping)
    diff = verify_partitions(loaded.proto, cut, random_feeds(graph, loaded.proto))
    manifest = cut.save(workdir / "partitions")
    table = Table("partition", "ops", "GFLOPs", "reads", "writes")
    flops = {n.name: n.flops for n in graph.nodes}
    for p in cut.partitions:
        table.add_row(
            p.name,
            str(len(p.nodes)),
            f"{sum(flops[n] for n in p.nodes) / 1e9:.3f}",
            ", ".join(p.inputs),
            ", ".join(p.outputs),
        )
    console.print(table)
    console.print(
        f"parallel partitions: {cut.parallel_pairs() or 'none'}; chained partitions vs full model: "
        f"max abs diff {diff:.2e} (limit 1e-5); manifest {manifest}",
        highlight=False,
    )
    console.rule(f"done in {time.perf_counter() - t0:.1f}s")
    console.print(
        "Not yet part of the demo (open issues): device profiles and profiling, the planner, the agent, deploy.",
    )
