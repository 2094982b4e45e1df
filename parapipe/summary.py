"""Plain-data summaries of models, shared by ``inspect`` and ``demo``."""

from __future__ import annotations

from collections import Counter

from models.coarsen import coarsen
from models.graph import CONTROL_FLOW, OpGraph
from models.onnx_io import LoadedModel


def model_summary(loaded: LoadedModel, graph: OpGraph) -> dict[str, object]:
    fine, coarse = coarsen(graph, "fine"), coarsen(graph, "coarse")
    forks = graph.forks()
    return {
        "file": str(loaded.path),
        "sha256": loaded.sha256,
        "ir_version": graph.ir_version,
        "opset": graph.opset,
        "inputs": [{**s.to_json(), "made": s.describe()} for s in loaded.inputs],
        "outputs": [{"name": t.name, "shape": list(t.shape), "dtype": t.dtype} for t in graph.outputs],
        "nodes": len(graph.nodes),
        "ops_by_type": dict(Counter(n.op_type for n in graph.nodes).most_common()),
        "flops": graph.total_flops,
        "param_bytes": graph.param_bytes,
        "activation_bytes": graph.activation_bytes,
        "forks": len(forks),
        "max_branches_at_fork": max(forks.values(), default=1),
        "parallel_branches": coarse.max_parallel_width(),
        "blocks": {"fine": len(fine.nodes), "coarse": len(coarse.nodes)},
        "control_flow": [n.name for n in graph.nodes if n.op_type in CONTROL_FLOW],
        "shapes_from": dict(Counter(loaded.shape_sources.values()).most_common()),
        "notes": list(loaded.notes),
    }


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n:.1f} GiB"
