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
import statistics
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from device_profiles.loader import load_profile
from models.coarsen import coarsen
from models.graph import OpGraph, build_graph
from models.onnx_io import LoadedModel, load_onnx
from models.partition import cut_partitions, example_grouping, verify_partitions
from parapipe.plain import CONFIGS, PlainRun, plain_run
from parapipe.run import RunResult, run_plan
from parapipe.summary import human_bytes, model_summary
from planner.catalog import write_folder
from planner.costmodel import CostModel
from planner.plan import Plan
from planner.problem import build_problem
from planner.search import SearchOptions, baselines, pareto_set, signature
from profiler.costtable import CostTable
from profiler.session import held_out, pu_configs, run_profile


@dataclasses.dataclass(frozen=True)
class Demo:
    """What the steps share: the model file, its graph and coarse blocks, the cost table, where to write."""

    onnx_path: Path
    loaded: LoadedModel
    graph: OpGraph
    blocks: OpGraph
    table: CostTable
    workdir: Path
    console: Console


def run_demo(model: str, workdir: Path, console: Console) -> None:
    t0 = time.perf_counter()
    workdir.mkdir(parents=True, exist_ok=True)
    demo = _export_and_load(model, workdir, console)
    _cut_and_check(demo)
    _profile(demo)
    console.rule("5. plan: the Pareto set on local (measured costs) and on khadas-vim3 (its profile)")
    fronts = {board: _plan_front(demo, board) for board in ("local", "khadas-vim3")}
    console.print("figures are predicted; khadas-vim3's come from its profile (estimates), not from a board")
    _run_chosen(demo, fronts["local"])
    console.rule(f"done in {time.perf_counter() - t0:.1f}s")
    console.print(
        "Next: `parapipe boards add` + `parapipe deploy` for a real board over SSH, `parapipe tune` for the measure-replan loop."
    )


def _export_and_load(model: str, workdir: Path, console: Console) -> Demo:
    from models.export import export_model

    onnx_path = workdir / f"{model}.onnx"
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
    table = CostTable.load(workdir / "costs.json")
    return Demo(onnx_path, loaded, graph, coarsen(graph, "coarse"), table, workdir, console)


def _cut_and_check(demo: Demo) -> None:
    demo.console.rule("3. cut into partitions and check them")
    cut = cut_partitions(demo.loaded.proto, demo.graph, example_grouping(demo.blocks, 4))
    diff = verify_partitions(demo.loaded.ort_proto, cut, demo.loaded.feeds())
    manifest = cut.save(demo.workdir / "partitions")
    table = Table("partition", "ops", "GFLOPs", "reads", "writes")
    flops = {n.name: n.flops for n in demo.graph.nodes}
    for p in cut.partitions:
        gflops = sum(flops[n] for n in p.nodes) / 1e9
        table.add_row(p.name, str(len(p.nodes)), f"{gflops:.3f}", ", ".join(p.inputs), ", ".join(p.outputs))
    demo.console.print(table)
    demo.console.print(
        f"parallel partitions: {cut.parallel_pairs() or 'none'}; chained partitions vs full model: "
        f"max abs diff {diff:.2e} (limit 1e-4 of the output scale); manifest {manifest}",
        highlight=False,
    )


def _profile(demo: Demo) -> None:
    demo.console.rule("4. profile on the local board")
    profile = load_profile("local")
    costs = demo.workdir / "costs.json"
    summary = run_profile(demo.loaded, demo.graph, profile, demo.table, costs, pu_configs(profile))
    demo.console.print(
        f"{summary.measured} measurements taken, {summary.reused} reused from {costs}; energy is {summary.energy_source}",
        highlight=False,
    )
    holdout = held_out(demo.table, demo.loaded.sha256, "local")
    evaluation = CostModel.from_table(profile, demo.graph, demo.table, holdout=holdout).evaluate()
    demo.console.print(
        f"cost model on {evaluation.count} partitions it was not fitted on: median error "
        f"{evaluation.median_abs_pct:.1f}%, RMSPE {evaluation.rmspe_pct:.1f}%",
        highlight=False,
    )


def _plan_front(demo: Demo, board: str) -> list[Plan]:
    cost = CostModel.from_table(load_profile(board), demo.graph, demo.table)
    base = baselines(demo.blocks, demo.graph, cost, 4, build_problem(demo.blocks, demo.graph, cost, 4))
    where = {"model_path": str(demo.onnx_path.resolve()), "inputs": demo.loaded.inputs}
    front = [
        dataclasses.replace(p, **where)
        for p in pareto_set(demo.blocks, demo.graph, cost, SearchOptions(time_limit=2.0))
    ]
    folder = demo.workdir / "plans" / board
    write_folder(folder, front, base)
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
            _units(p),
            f"{p.predicted.latency_ms:.1f}",
            f"{p.predicted.throughput_fps:.1f}",
            f"{p.predicted.energy_mj:.0f}",
            f"{p.simulated.throughput_fps:.1f}",
            f"{prov.solver} {prov.status}" + (f" gap {prov.gap:.1%}" if prov.gap is not None else ""),
        )
    demo.console.print(out)
    ort = base.get("ort-all-cores") or base["single-pu"]
    fastest = max(front, key=lambda p: p.predicted.throughput_fps)
    quickest = min(front, key=lambda p: p.predicted.latency_ms)
    demo.console.print(
        f"{board}: vs one onnxruntime session on all cores (predicted): throughput "
        f"{fastest.predicted.throughput_fps / ort.predicted.throughput_fps:.2f}x, latency "
        f"{ort.predicted.latency_ms / quickest.predicted.latency_ms:.2f}x; plans in {folder}",
        highlight=False,
    )
    return front


RUN_ROUNDS = 3  # each plan measured this many times, interleaved with the others: a shared machine drifts


def _run_chosen(demo: Demo, front: list[Plan]) -> None:
    demo.console.rule("6. run the chosen plans on a real local agent (gRPC on 127.0.0.1) beside plain onnxruntime")
    cost = CostModel.from_table(load_profile("local"), demo.graph, demo.table)
    chosen = {
        "throughput": max(front, key=lambda p: p.predicted.throughput_fps),
        "latency": min(front, key=lambda p: p.predicted.latency_ms),
    }
    ort_signature = signature(baselines(demo.blocks, demo.graph, cost, 4)["ort-all-cores"])
    where = {"model_path": str(demo.onnx_path.resolve()), "inputs": demo.loaded.inputs}
    runs = [(label, dataclasses.replace(plan, **where)) for label, plan in chosen.items()]
    results: list[list[RunResult]] = [[] for _ in runs]
    feeds = demo.loaded.feeds(seed=0)
    plain: dict[str, list[PlainRun]] = {config: [] for config in CONFIGS}
    for k in range(RUN_ROUNDS):  # round by round, so every plan sees the machine's slow and fast moments alike
        demo.console.print(
            f"round {k + 1} of {RUN_ROUNDS}: 40 frames of each plan, then plain onnxruntime "
            f"({' and '.join(CONFIGS)}, 1.5 s each)",
            highlight=False,
        )
        for i, (_, plan) in enumerate(runs):
            results[i].append(run_plan(plan, "local", None, frames=40, verify=k == 0))
        for config in CONFIGS:
            plain[config].append(plain_run(demo.onnx_path, feeds, config))
    out = Table(
        "plan",
        "units",
        "latency ms pred / meas",
        "fps pred / meas",
        "energy mJ pred / meas (modelled)",
        "max abs diff",
        title=f"measured: median of {RUN_ROUNDS} interleaved runs (their range in brackets)",
    )
    medians = []
    for (label, plan), rs in zip(runs, results, strict=True):
        lat = [r.measured.latency_ms for r in rs]
        fps = [r.measured.throughput_fps for r in rs]
        medians.append((statistics.median(lat), statistics.median(fps)))
        same = " (= one session, all cores)" if signature(plan) == ort_signature else ""
        first = rs[0]
        out.add_row(
            f"{label}: {plan.name}{same}",
            _units(plan),
            f"{first.predicted.latency_ms:.1f} / {medians[-1][0]:.1f} [{min(lat):.1f}-{max(lat):.1f}]",
            f"{first.predicted.throughput_fps:.1f} / {medians[-1][1]:.1f} [{min(fps):.1f}-{max(fps):.1f}]",
            f"{first.predicted.energy_mj:.0f} / {statistics.median(r.measured.energy_mj for r in rs):.0f}",
            f"{first.max_abs_diff:.1e}",
        )
    for config, rs in plain.items():
        fps = [r.fps for r in rs]
        lat = [r.latency_ms for r in rs]
        out.add_row(
            f"plain onnxruntime, {'one session on all cores' if config == 'all cores' else 'one session per core'}",
            "(no agent)",
            f"- / {statistics.median(lat):.1f} [{min(lat):.1f}-{max(lat):.1f}]",
            f"- / {statistics.median(fps):.1f} [{min(fps):.1f}-{max(fps):.1f}]",
            "-",
            "-",
        )
    demo.console.print(out)
    (_, thr_fps), (lat_ms, _) = medians
    all_fps = statistics.median(r.fps for r in plain["all cores"])
    per_core_fps = statistics.median(r.fps for r in plain["per core"])
    all_ms = statistics.median(r.latency_ms for r in plain["all cores"])
    demo.console.print(
        f"measured vs plain onnxruntime (medians): throughput {thr_fps / all_fps:.2f}x one session on all cores, "
        f"{thr_fps / per_core_fps:.2f}x one session per core; latency {lat_ms / all_ms:.2f}x one session on all "
        "cores (lower is better)",
        highlight=False,
    )
    if any(signature(p) == ort_signature for p in chosen.values()):
        demo.console.print(
            "a plan marked (= one session, all cores) runs that configuration through the agent: its difference "
            "from plain onnxruntime's is the agent's cost plus the machine's run-to-run noise",
            highlight=False,
        )


def _units(plan: Plan) -> str:
    return " ".join(f"{a.pu}x{a.cores}" for _, _, a in plan.assignments())
