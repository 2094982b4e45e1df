"""``parapipe demo``: the main job on the embedded ``local`` board.

Today: export a branchy zoo model, load it as an OpGraph, coarsen it, cut it into
partitions with a parallel pair and check them against the full model, profile it on
the local board, calibrate the cost model (with its error on held-back partitions),
and evaluate hand-made plans on ``local`` and on the Khadas VIM3 profile, analytically
and by simulation.
"""

from __future__ import annotations

import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from device_profiles.loader import load_profile
from models.coarsen import coarsen
from models.graph import build_graph
from models.onnx_io import load_onnx
from models.partition import cut_partitions, example_grouping, random_feeds, verify_partitions
from parapipe.summary import human_bytes, model_summary
from planner.baselines import flop_pipeline, single_pu
from planner.costmodel import CostModel
from planner.plan import validate
from planner.simulate import PlanModel, analytic, simulate
from profiler.costtable import CostTable
from profiler.session import pu_configs, run_profile


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
    labels = sorted({e.name for e in table.select(model_sha256=loaded.sha256, kind="partition", board="local")})
    evaluation = CostModel(profile, graph, table, holdout=labels[1::2]).evaluate()
    console.print(
        f"cost model on {evaluation.count} partitions it was not fitted on: median error "
        f"{evaluation.median_abs_pct:.1f}%, RMSPE {evaluation.rmspe_pct:.1f}%",
        highlight=False,
    )

    console.rule("5. evaluate hand-made plans (analytic vs simulated)")
    blocks = coarsen(graph, "coarse")
    rows = []
    for board in ("local", "khadas-vim3"):
        prof = load_profile(board)
        cost = CostModel(prof, graph, table)
        plans = [single_pu(blocks, prof, p.name, n) for p in prof.pus if p.kind == "cpu" for n in {1, len(p.cores)}]
        cpus = [(p.name, len(p.cores)) for p in prof.pus if p.kind == "cpu"]
        if len(cpus) > 1:
            plans.append(flop_pipeline(blocks, prof, cpus, name="pipe-" + "-".join(c for c, _ in cpus)))
        for plan in plans:
            validate(plan, graph, prof)
            lowered = PlanModel(plan, graph, cost)
            a, sim = analytic(lowered), simulate(lowered, 100)
            source = ", ".join(sorted({cost.group_ms(p.members, p.pu, p.cores).source for p in lowered.parts.values()}))
            rows.append((board, plan.name, len(plan.stages), a, sim, source))
    table_out = Table("board", "plan", "stages", "latency ms", "throughput fps", "energy mJ (modelled)", "costs")
    for board, name, n, a, sim, source in rows:
        table_out.add_row(
            board,
            name,
            str(n),
            f"{a.latency_ms:.1f} / {sim.latency_p50_ms:.1f}",
            f"{a.throughput_fps:.1f} / {sim.throughput_fps:.1f}",
            f"{a.energy_mj:.0f} / {sim.energy_mj:.0f}",
            source,
        )
    console.print(table_out)
    console.print("figures are analytic / simulated; khadas-vim3 is planned from its profile (estimates), not measured")
    console.rule(f"done in {time.perf_counter() - t0:.1f}s")
    console.print("Not yet part of the demo (open issues): the ILP planner and Pareto set, the agent, deploy.")
