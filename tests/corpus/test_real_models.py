"""Every real model of the corpus goes through inspect -> profile --board local -> plan -> run --verify.

Through the installed CLI, as a user would, each in its own $PARAPIPE_HOME. ``run
--verify`` sends one frame through the plan on a real local agent and compares it with
the full model in onnxruntime: the difference must stay within 1e-4 of the output's
scale (the command exits 1 otherwise).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.support.cli import PARAPIPE, SHORT_MEMORY
from tests.support.realmodels import CORPUS, RealModel, fetch

pytestmark = [pytest.mark.corpus, pytest.mark.agent]


def _cli(home: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PARAPIPE_HOME": str(home)}
    return subprocess.run([PARAPIPE, *args], capture_output=True, text=True, env=env, timeout=timeout, cwd=home)


def _ok(done: subprocess.CompletedProcess[str]) -> dict:
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    return json.loads(done.stdout)


@pytest.mark.parametrize("model", CORPUS, ids=[m.name for m in CORPUS])
def test_real_model_through_the_whole_chain(model: RealModel, tmp_path: Path) -> None:
    path = fetch(model)
    shapes = model.shape_args()

    info = _ok(_cli(tmp_path, "inspect", str(path), *shapes, "--json"))
    assert info["nodes"] > 0
    if "control-flow" in model.features:
        assert info["control_flow"], "the If/Loop nodes should be listed as opaque blocks"
    if "ort-shapes" in model.features:
        assert info["shapes_from"].get("onnxruntime", 0) > 0, info["shapes_from"]
    if "scalar-input" in model.features:
        sr = next(i for i in info["inputs"] if i["shape"] == [])
        assert sr["values"] == [16000.0] and sr["source"].startswith("graph:")
    if "int-inputs" in model.features:
        ids = next(i for i in info["inputs"] if i["name"] == "input_ids")
        assert ids["high"] == 30522.0, "token ids must stay below the embedding table's size"

    profiled = ("--repeats", "3", "--warmup", "1", *SHORT_MEMORY)
    memories = _ok(_cli(tmp_path, "profile", str(path), "--board", "local", *shapes, *profiled, "--json"))["memories"]
    assert memories and all("rounds of 0.1 s runs" in m["measured"] for m in memories), memories

    plans = tmp_path / "plans"
    planned = _ok(
        _cli(tmp_path, "plan", str(path), "--device", "local", *shapes, "--objective", "latency", "--time-limit", "1",
             "-o", str(plans), "--json")
    )  # fmt: skip
    assert planned["plans"], planned
    plan_file = plans / f"{planned['plans'][0]['plan']}.json"
    stored = json.loads(plan_file.read_text())
    assert {s["name"]: s["shape"] for s in stored["inputs"]} == {i["name"]: i["shape"] for i in info["inputs"]}

    # run takes no --input-shape: the plan carries the shapes it was made for
    ran = _ok(_cli(tmp_path, "run", str(plan_file), "--board", "local", "--verify", "--frames", "5", "--json"))
    assert ran["verified"] is True, ran
    assert ran["max_abs_diff"] <= max(1e-5, 1e-4 * ran["output_scale"]), ran
    assert ran["measured"]["throughput_fps"] > 0
