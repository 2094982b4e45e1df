"""Model commands: zoo, export, inspect, partition, and the demo."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from parapipe.app import DataOpt, JsonFlag, ShapeOpt, app, err, fails_cleanly, out, print_json


@app.command()
@fails_cleanly
def export(
    model: Annotated[str, typer.Argument(help="A zoo name (see `parapipe zoo`) or path/to/file.py:ClassName.")],
    output: Annotated[Path | None, typer.Option("-o", "--output", help="Where to write the .onnx file.")] = None,
    input_shape: Annotated[str | None, typer.Option("--input-shape", help="Input shape, e.g. 1,3,224,224.")] = None,
    opset: Annotated[int | None, typer.Option("--opset", help="ONNX opset (default: the exporter's).")] = None,
    as_json: JsonFlag = False,
) -> None:
    """Export a torch model to one checked, self-contained ONNX file (needs the `torch` extra)."""
    from models.extras import require_torch

    require_torch()
    from models.export import export_model
    from models.onnx_io import parse_shape

    shape = parse_shape(input_shape) if input_shape else None
    if not as_json:
        err.print(f"exporting {model} …")
    report = export_model(model, output, shape, opset)
    if as_json:
        print_json(report.to_json())
        return
    out.print(
        f"wrote [bold]{report.path}[/] ({report.nodes} nodes, opset {report.opset}, {report.size_bytes / 2**20:.1f} MiB) "
        f"in {report.seconds:.1f}s; onnxruntime vs torch: max abs diff {report.max_abs_diff:.2e} "
        f"(relative {report.max_rel_diff:.2e})",
        highlight=False,
    )


@app.command()
@fails_cleanly
def zoo(as_json: JsonFlag = False) -> None:
    """List the zoo models `export` knows by name."""
    from models.extras import require_torch

    require_torch()
    from models.zoo import ZOO

    rows = [
        {"name": e.name, "inputs": [list(i.shape) for i in e.inputs], "description": e.description}
        for e in ZOO.values()
    ]
    if as_json:
        print_json(rows)
        return
    table = Table("model", "input shape", "description")
    for r in rows:
        table.add_row(r["name"], " ".join("x".join(map(str, s)) for s in r["inputs"]), r["description"])
    out.print(table)


@app.command()
@fails_cleanly
def inspect(
    file: Annotated[Path, typer.Argument(help="An .onnx model.")],
    input_shape: ShapeOpt = None,
    input_data: DataOpt = None,
    as_json: JsonFlag = False,
) -> None:
    """Ops by type, FLOPs, weights, activations, parallel branches, opset, where shapes came from.

    Dynamic dimensions nobody gave are taken as 1 (and said so); give --input-shape for real figures.
    """
    from models.errors import ModelError
    from models.graph import build_graph
    from models.onnx_io import load_onnx, ort_refusal, parse_input_shapes
    from parapipe.summary import human_bytes, model_summary

    loaded = load_onnx(file, parse_input_shapes(input_shape), input_data, assume_dynamic=True)
    refusal = ort_refusal(loaded.ort_proto)
    if refusal:
        raise ModelError(f"onnxruntime cannot load {file}: {refusal}")
    summary = model_summary(loaded, build_graph(loaded.proto, loaded.sha256, file.stem, partial=True))
    if as_json:
        print_json(summary)
        return
    out.print(
        f"[bold]{file}[/]  IR {summary['ir_version']}, opset {summary['opset']}, sha256 {loaded.sha256[:12]}",
        highlight=False,
    )
    for spec in loaded.inputs:
        out.print(f"  input  {spec.describe()}", highlight=False, markup=False)
    for t in summary["outputs"]:  # type: ignore[attr-defined]
        out.print(
            f"  output {t['name']}: {t['dtype']}[{'x'.join(map(str, t['shape']))}]", highlight=False, markup=False
        )
    sources = summary["shapes_from"]
    out.print(
        "  shapes: " + ", ".join(f"{n} from {src}" for src, n in sources.items()),  # type: ignore[attr-defined]
        highlight=False,
    )
    for note in loaded.notes:
        out.print(f"  note: {note}", highlight=False, markup=False)
    table = Table("figure", "value")
    table.add_row("operators", str(summary["nodes"]))
    table.add_row("FLOPs", f"{summary['flops'] / 1e9:.3f} G")
    table.add_row("parameters", human_bytes(summary["param_bytes"]))  # type: ignore[arg-type]
    table.add_row("activations", human_bytes(summary["activation_bytes"]))  # type: ignore[arg-type]
    table.add_row("forks", f"{summary['forks']} (up to {summary['max_branches_at_fork']} branches)")
    table.add_row("parallel branches", f"{summary['parallel_branches']} blocks can run at once")
    blocks = summary["blocks"]
    table.add_row("blocks", f"{blocks['fine']} fine, {blocks['coarse']} coarse")  # type: ignore[index]
    if summary["control_flow"]:
        table.add_row("control flow", f"{len(summary['control_flow'])} node(s), each one opaque block")  # type: ignore[arg-type]
    out.print(table)
    ops = Table("op type", "count")
    for op, count in summary["ops_by_type"].items():  # type: ignore[attr-defined]
        ops.add_row(op, str(count))
    out.print(ops)


@app.command()
@fails_cleanly
def partition(
    file: Annotated[Path, typer.Argument(help="An .onnx model.")],
    output: Annotated[Path, typer.Option("-o", "--output", help="Folder for the partitions and manifest.json.")],
    parts: Annotated[int, typer.Option("--parts", help="Number of partitions (ignored with --groups).")] = 4,
    groups: Annotated[
        Path | None, typer.Option("--groups", help='JSON file {"partition": ["onnx node", ...], ...}.')
    ] = None,
    input_shape: ShapeOpt = None,
    input_data: DataOpt = None,
    as_json: JsonFlag = False,
) -> None:
    """Cut a model into partitions by boundary tensors and check they reproduce it."""
    from models.coarsen import coarsen
    from models.errors import PartitionError
    from models.graph import build_graph
    from models.onnx_io import load_onnx, parse_input_shapes
    from models.partition import cut_partitions, example_grouping, verify_partitions

    loaded = load_onnx(file, parse_input_shapes(input_shape), input_data)
    graph = build_graph(loaded.proto, loaded.sha256, file.stem)
    if groups is not None:
        grouping = _read_groups(groups, PartitionError)
    else:
        grouping = example_grouping(coarsen(graph, "coarse"), parts)
    cut = cut_partitions(loaded.proto, graph, grouping)
    diff = verify_partitions(loaded.ort_proto, cut, loaded.feeds())
    manifest = cut.save(output)
    result = {
        "manifest": str(manifest),
        "partitions": [
            {"name": p.name, "nodes": len(p.nodes), "inputs": list(p.inputs), "outputs": list(p.outputs)}
            for p in cut.partitions
        ],
        "parallel_pairs": [list(p) for p in cut.parallel_pairs()],
        "max_abs_diff": diff,
    }
    if as_json:
        print_json(result)
        return
    table = Table("partition", "nodes", "reads", "writes")
    for p in cut.partitions:
        table.add_row(p.name, str(len(p.nodes)), ", ".join(p.inputs), ", ".join(p.outputs))
    out.print(table)
    out.print(
        f"parallel pairs: {cut.parallel_pairs() or 'none'}; chained vs full max abs diff {diff:.2e}; wrote {manifest}",
        highlight=False,
    )


def _read_groups(path: Path, error: type[Exception]) -> dict[str, list[str]]:
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise error(f"cannot read groups file {path}: {exc}") from None
    if not isinstance(data, dict) or not all(
        isinstance(k, str) and isinstance(v, list) and all(isinstance(n, str) for n in v) for k, v in data.items()
    ):
        raise error(f'{path} must hold a JSON object {{"partition": ["node", ...]}}')
    return data


@app.command()
@fails_cleanly
def demo(
    model: Annotated[str, typer.Option("--model", help="Zoo model to run the main job on.")] = "googlenet",
    workdir: Annotated[Path, typer.Option("--workdir", help="Where the demo writes its files.")] = Path("build/demo"),
) -> None:
    """The main job end to end on the embedded `local` board, as far as it exists today."""
    from parapipe.demo import run_demo

    run_demo(model, workdir, out)
