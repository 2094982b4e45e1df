"""No name from a model file ever reaches the filesystem unsanitised.

A model whose node and tensor names hold ``/``, ``..``, ``:``, spaces, 300 characters
and non-ASCII goes through partition (with hostile partition names too), profile, plan,
compile and run --verify; afterwards every file and folder the commands made has a
plain name and lies inside the folders they were given.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.support.cli import PARAPIPE, SHORT_MEMORY

pytestmark = pytest.mark.agent

HOSTILE = ["/model.0/conv/Conv", "../../etc/passwd", "a:b", "with space", "é漢字ü", "x" * 300, "..", "manifest.json"]
PLAIN = re.compile(r"^[A-Za-z0-9_.-]+$")


def _model() -> onnx.ModelProto:
    x = helper.make_tensor_value_info("in put/0", TensorProto.FLOAT, [1, 16])
    a = helper.make_tensor_value_info("out:a", TensorProto.FLOAT, [1, 16])
    b = helper.make_tensor_value_info("out/b", TensorProto.FLOAT, [1, 16])
    inits = [numpy_helper.from_array(np.eye(16, dtype=np.float32) * (i + 1), f"w/{i}") for i in range(4)]
    tensors = ["in put/0", "t/1", "../t2", "t 3:x"]
    nodes = [
        helper.make_node("MatMul", [tensors[0], "w/0"], [tensors[1]], name=HOSTILE[0]),
        helper.make_node("Relu", [tensors[1]], [tensors[2]], name=HOSTILE[1]),
        helper.make_node("MatMul", [tensors[2], "w/1"], [tensors[3]], name=HOSTILE[2]),
        helper.make_node("MatMul", [tensors[3], "w/2"], ["out:a"], name=HOSTILE[3]),  # two branches
        helper.make_node("MatMul", [tensors[3], "w/3"], ["m/4"], name=HOSTILE[4]),
        helper.make_node("Relu", ["m/4"], ["out/b"], name=HOSTILE[5]),
    ]
    graph = helper.make_graph(nodes, "hostile/../graph", [x], [a, b], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _cli(cwd: Path, home: Path, *args: str) -> dict:
    env = {**os.environ, "PARAPIPE_HOME": str(home)}
    done = subprocess.run([PARAPIPE, *args, "--json"], capture_output=True, text=True, env=env, cwd=cwd, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return json.loads(done.stdout)


def test_hostile_names_never_become_paths(tmp_path: Path) -> None:
    work, home = tmp_path / "work", tmp_path / "home"
    work.mkdir()
    model = work / "model.onnx"
    onnx.save(_model(), model)

    groups = {HOSTILE[6]: [HOSTILE[0], HOSTILE[1]], HOSTILE[7]: [HOSTILE[2]], HOSTILE[4]: HOSTILE[3:4]}
    groups[HOSTILE[1]] = [HOSTILE[4], HOSTILE[5]]
    (work / "groups.json").write_text(json.dumps(groups))
    cut = _cli(work, home, "partition", str(model), "-o", str(work / "parts"), "--groups", str(work / "groups.json"))
    assert {p["name"] for p in cut["partitions"]} == set(groups), "the ONNX names stay the names in reports"
    manifest = json.loads((work / "parts" / "manifest.json").read_text())
    assert all(PLAIN.match(p["file"]) for p in manifest["partitions"])
    assert {n for p in manifest["partitions"] for n in p["nodes"]} == set(HOSTILE[:6])

    _cli(
        work, home, "profile", str(model), "--board", "local", "--granularity", "fine", "--repeats", "3", *SHORT_MEMORY
    )
    planned = _cli(work, home, "plan", str(model), "--device", "local", "--objective", "latency", "--time-limit", "2")
    plan_file = Path(planned["folder"]) / f"{planned['plans'][0]['plan']}.json"
    _cli(work, home, "compile", str(plan_file), str(model), "-o", str(work / "bundle"))
    ran = _cli(work, home, "run", str(plan_file), "--board", "local", "--verify", "--frames", "3")
    assert ran["verified"] is True

    for root in (work, home):
        for dirpath, dirnames, filenames in os.walk(root):
            for name in [*dirnames, *filenames]:
                path = Path(dirpath) / name
                assert PLAIN.match(name), f"unsafe name on disk: {path}"
                assert path.resolve().is_relative_to(root.resolve()), path
    assert not (tmp_path.parent / "etc").exists()
