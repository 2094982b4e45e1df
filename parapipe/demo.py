"""``parapipe demo``: the main job on the embedded ``local`` board.

Today: export a branchy zoo model, load it as an OpGraph, coarsen it, cut it into
partitions with a parallel pair and check them against the full model, profile it on
the local board, calibrate the cost model (with its error on held-back partitions),
and plan the Pareto set (ILP) on ``local`` and on the Khadas VIM3 profile against the
baselines, then run the chosen plans on a real local agent and compare measured with
predicted, beside plain onnxruntime.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from device_profiles.loader import load_profile
from models.coarsen import coarsen
from models.graph import build_graph
from models.onnx_io import load_onnx
from models.partition import cut_partitions, example_grouping, random_feeds, verify_partitions
from parapipe.run import run_plan
from parapipe.summary import human_bytes, model_summary
from planner.costmodel import CostModel
from planner.problem import build_problem
from planner.search import baselines, pareto_set
from profiler.costtable import CostTable
from profiler.session import held_out, pu_configs, run_profile


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
    console.rule("4. profile on the local board")
    profile = load_profile("local")
    costs = workdir / "costs.json"
    table = CostTable.load(costs)
    summary = run_profile(loaded, graph, profile, table, costs, pu_configs(profile))
    console.print(
        f"{summary.measured} measurements taken, {summary.reused} reused from {costs}; energy is {summary.energy_source}",
        highlight=False,
    )
    evaluation = CostModel(profile, graph, table, holdout=held_out(table, loaded.sha256, "local")).evaluate()
    console.print(
        f"cost model on {evaluation.count} partitions it was not fitted on: median error "
        f"{evaluation.median_abs_pct:.1f}%, RMSPE {evaluation.rmspe_pct:.1f}%",
        highlight=False,
    )

    console.rule("5. plan: the Pareto set on local (measured costs) and on khadas-vim3 (its profile)")
    blocks = coarsen(graph, "coarse")
    fronts = {}
    for board in ("local", "khadas-vim3"):
        prof = load_profile(board)
        cost = CostModel(prof, graph, table)
        problem = build_problem(blocks, graph, cost, 4)
        base = baselines(blocks, graph, cost, 4, problem)
        front = fronts[board] = pareto_set(blocks, graph, cost, time_limit=2.0)
        folder = workdir / "plans" / board
        for p in front:
            p.save(folder / f"{p.name}.json")
        out = Table(
            "plan",
            "units",
            "latency ms",
            "fps",
            "energy mJ (modelled)",
            "sim fps",
            "how found",
            title=f"{board}: Pareto plans",
        )
        for p in front:
            prov = p.provenance
            out.add_row(
                p.name,
                " ".join(f"{a.pu}x{a.cores}" for _, _, a in p.assignments()),
                f"{p.predicted.latency_ms:.1f}",
                f"{p.predicted.throughput_fps:.1f}",
                f"{p.predicted.energy_mj:.0f}",
                f"{p.simulated.throughput_fps:.1f}",
                f"{prov.solver} {prov.status}" + (f" gap {prov.gap:.1%}" if prov.gap is not None else ""),
            )
        console.print(out)
        ort = base.get("ort-all-cores") or base["single-pu"]
        fastest = max(front, key=lambda p: p.predicted.throughput_fps)
        quickest = min(front, key=lambda p: p.predicted.latency_ms)
        console.print(
            f"{board}: vs one onnxruntime session on all cores (predicted): throughput "
            f"{fastest.predicted.throughput_fps / ort.predicted.throughput_fps:.2f}x, latency "
            f"{ort.predicted.latency_ms / quickest.predicted.latency_ms:.2f}x; plans in {folder}",
            highlight=False,
        )
    console.print("figures are predicted; khadas-vim3's come from its profile (estimates), not from a board")

    console.rule("6. run the chosen plans on a real local agent (gRPC on 127.0.0.1) beside plain onnxruntime")
    local = load_profile("local")
    cost = CostModel(local, graph, table)
    front = fronts["local"]
    chosen = {
        "throughput": max(front, key=lambda p: p.predicted.throughput_fps),
        "latency": min(front, key=lambda p: p.predicted.latency_ms),
    }
    ort_plan = baselines(blocks, graph, cost, 4)["ort-all-cores"]
    rows = []
    for label, plan in (*chosen.items(), ("plain onnxruntime, all cores", ort_plan)):
        result = run_plan(
            dataclasses.replace(plan, model_path=str(onnx_path.resolve())), "local", None, frames=40, verify=True
        )
        rows.append((label, plan, result))
    out = Table(
        "plan", "units", "latency ms pred / meas", "fps pred / meas", "energy mJ pred / meas (modelled)", "max abs diff"
    )
    for label, plan, r in rows:
        out.add_row(
            f"{label}: {plan.name}",
            " ".join(f"{a.pu}x{a.cores}" for _, _, a in plan.assignments()),
            f"{r.predicted.latency_ms:.1f} / {r.measured.latency_ms:.1f}",
            f"{r.predicted.throughput_fps:.1f} / {r.measured.throughput_fps:.1f}",
            f"{r.predicted.energy_mj:.0f} / {r.measured.energy_mj:.0f}",
            f"{r.max_abs_diff:.1e}",
        )
    console.print(out)
    ort_r = rows[-1][2]
    console.print(
        f"measured vs plain onnxruntime: throughput {rows[0][2].measured.throughput_fps / ort_r.measured.throughput_fps:.2f}x, "
        f"latency {rows[1][2].measured.latency_ms / ort_r.measured.latency_ms:.2f}x (lower is better)",
        highlight=False,
    )
    console.rule(f"done in {time.perf_counter() - t0:.1f}s")
    console.print(
        "Next: `parapipe boards add` + `parapipe deploy` for a real board over SSH, `parapipe tune` for the measure-replan loop."
    )
