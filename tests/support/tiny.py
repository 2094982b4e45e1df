"""Tiny hand-made bundles and agent helpers for reliability tests: a chain of one-node stages, built in milliseconds.

Stage 0 is ``Gather(table[4, 8], idx)``: an index of 4 or more fails in onnxruntime, which
is how the tests send a frame that fails in an early stage. Every later stage is a Relu.
A plan may be split over hosts ``a`` (the entry host, stage 0) and ``b`` (the rest).
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from agents.bundle import MANIFEST, Manifest, PartitionSpec, TensorSpec, parse_manifest
from agents.peers import Peer
from parapipe.local_agent import LocalAgent

TABLE_ROWS = 4


def stage_model(stage: int) -> bytes:
    if stage == 0:
        table = numpy_helper.from_array(np.arange(TABLE_ROWS * 8, dtype=np.float32).reshape(TABLE_ROWS, 8), "table")
        node = helper.make_node("Gather", ["table", "idx"], ["t0"], axis=0)
        inputs = [helper.make_tensor_value_info("idx", TensorProto.INT64, [1])]
        inits = [table]
    else:
        node = helper.make_node("Relu", [f"t{stage - 1}"], [f"t{stage}"])
        inputs = [helper.make_tensor_value_info(f"t{stage - 1}", TensorProto.FLOAT, [1, 8])]
        inits = []
    graph = helper.make_graph(
        [node], f"stage{stage}", inputs, [helper.make_tensor_value_info(f"t{stage}", TensorProto.FLOAT, [1, 8])], inits
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    return model.SerializeToString()


def cpu_partition(
    name: str,
    file: str,
    data: bytes,
    core: int,
    *,
    inputs: tuple[str, ...],
    outputs: tuple[str, ...],
    stage: int = 0,
    unit: int = 0,
    host: str = "",
) -> PartitionSpec:
    """A partition of one thread on one CPU core (its own unit), for hand-made bundles."""
    return PartitionSpec.on_cpu_core(
        name, file, hashlib.sha256(data).hexdigest(), core, inputs=inputs, outputs=outputs, stage=stage, unit=unit,
        host=host,
    )  # fmt: skip


def _manifest(stages: int, max_inflight: int, host: str, hosts: tuple[str, ...], plan_bundle: str) -> Manifest:
    cores = sorted(os.sched_getaffinity(0))
    parts = []
    for s in range(stages):
        data = stage_model(s)
        on = ("a" if s == 0 else "b") if hosts else ""
        local = not host or on == host
        parts.append(
            cpu_partition(
                f"s{s}",
                f"s{s}.onnx" if local else "",
                data,
                cores[s % len(cores)],
                inputs=("idx",) if s == 0 else (f"t{s - 1}",),
                outputs=(f"t{s}",),
                stage=s,
                unit=s,
                host=on,
            )
        )
    return Manifest(
        model_sha256="0" * 64,
        plan_name=f"tiny-{stages}",
        device="test",
        pipelined=True,
        max_inflight=max_inflight,
        replicas=(1,) * stages,
        inputs=(TensorSpec("idx", "int64", (1,), TABLE_ROWS),),
        outputs=(TensorSpec(f"t{stages - 1}", "float32", (1, 8)),),
        partitions=tuple(parts),
        power=(1.0, 0.5, 1),
        host=host,
        hosts=hosts,
        plan_bundle=plan_bundle,
    )


def write_tiny_bundle(folder: Path, stages: int = 2, max_inflight: int = 2, host: str = "") -> Path:
    """A bundle folder; ``host`` "a" or "b" writes that host's part of the plan over hosts a and b."""
    hosts = ("a", "b") if host else ()
    plan_bundle = _manifest(stages, max_inflight, "", (), "").sha256() if host else ""
    manifest = _manifest(stages, max_inflight, host, hosts, plan_bundle)
    folder.mkdir(parents=True, exist_ok=True)
    for p in manifest.local_partitions():
        (folder / p.file).write_bytes(stage_model(p.stage))
    (folder / MANIFEST).write_text(manifest.text())
    onnx.checker.check_model(onnx.load_from_string(stage_model(0)))
    return folder


def _const_models() -> dict[str, bytes]:
    """``const``: the table as exporters leave weights (a Cast of a float16 initializer, no inputs);
    ``gather``: row ``idx`` of it, as stage 0 above (an index of ``TABLE_ROWS`` or more fails)."""
    table = np.arange(TABLE_ROWS * 8, dtype=np.float16).reshape(TABLE_ROWS, 8)
    const = helper.make_graph(
        [helper.make_node("Cast", ["table16"], ["table"], to=TensorProto.FLOAT)],
        "const", [], [helper.make_tensor_value_info("table", TensorProto.FLOAT, [TABLE_ROWS, 8])],
        [numpy_helper.from_array(table, "table16")],
    )  # fmt: skip
    gather = helper.make_graph(
        [helper.make_node("Gather", ["table", "idx"], ["t0"], axis=0)],
        "gather",
        [
            helper.make_tensor_value_info("table", TensorProto.FLOAT, [TABLE_ROWS, 8]),
            helper.make_tensor_value_info("idx", TensorProto.INT64, [1]),
        ],
        [helper.make_tensor_value_info("t0", TensorProto.FLOAT, [1, 8])],
    )
    return {
        name: helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8).SerializeToString()
        for name, g in (("const", const), ("gather", gather))
    }


def _const_manifest(max_inflight: int, host: str, hosts: tuple[str, ...], plan_bundle: str) -> Manifest:
    models = _const_models()
    cores = sorted(os.sched_getaffinity(0))
    placed = {"gather": "a", "const": "b"} if hosts else {"gather": "", "const": ""}
    ios = {"const": ((), ("table",)), "gather": (("table", "idx"), ("t0",))}
    parts = tuple(
        cpu_partition(
            name,
            f"{name}.onnx" if not host or placed[name] == host else "",
            models[name],
            cores[unit % len(cores)],
            inputs=ios[name][0],
            outputs=ios[name][1],
            unit=unit,
            host=placed[name],
        )
        for unit, name in enumerate(("const", "gather"))
    )
    return Manifest(
        model_sha256="1" * 64, plan_name="tiny-const", device="test", pipelined=True, max_inflight=max_inflight,
        replicas=(1,), inputs=(TensorSpec("idx", "int64", (1,), TABLE_ROWS),),
        outputs=(TensorSpec("t0", "float32", (1, 8)),), partitions=parts, power=(1.0, 0.5, 1),
        host=host, hosts=hosts, plan_bundle=plan_bundle,
    )  # fmt: skip


def write_const_bundle(folder: Path, host: str, max_inflight: int = 2) -> Path:
    """Host ``host``'s part of a plan over hosts a (the entry: ``gather``) and b, whose only partition,
    ``const``, takes no inputs: b never receives a tensor, and a waits for b's table on every frame."""
    plan_bundle = _const_manifest(max_inflight, "", (), "").sha256()
    manifest = _const_manifest(max_inflight, host, ("a", "b"), plan_bundle)
    folder.mkdir(parents=True, exist_ok=True)
    models = _const_models()
    for p in manifest.local_partitions():
        (folder / p.file).write_bytes(models[p.name])
    (folder / MANIFEST).write_text(manifest.text())
    return folder


def frame(idx: int) -> dict[str, np.ndarray]:
    """A frame; ``idx >= TABLE_ROWS`` fails in stage 0."""
    return {"idx": np.array([idx], dtype=np.int64)}


def expected(idx: int, stages: int) -> np.ndarray:
    row = np.arange(TABLE_ROWS * 8, dtype=np.float32).reshape(TABLE_ROWS, 8)[[idx]]
    return np.maximum(row, 0) if stages > 1 else row


GUARD_S = 30.0  # hang guard: a call that should return at once gets this long


def bundle_sha(folder: Path) -> str:
    return parse_manifest((folder / MANIFEST).read_text()).sha256()


def eventually(what: str, check: Callable[[], bool], timeout: float = GUARD_S) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"never happened: {what}")
        time.sleep(0.1)


def start_two_hosts(
    stack: ExitStack, tmp_path: Path, stages: int, max_inflight: int, extra_env: dict[str, str] | None = None
) -> tuple[LocalAgent, LocalAgent]:
    """Agents for hosts a (entry, stage 0) and b (the other stages) of a tiny plan, started b first."""
    a = stack.enter_context(LocalAgent(extra_env=extra_env))
    b = stack.enter_context(LocalAgent(extra_env=extra_env))
    parts = {h: write_tiny_bundle(tmp_path / h, stages, max_inflight, host=h) for h in ("a", "b")}
    for agent, h in ((a, "a"), (b, "b")):
        agent.client.load_bundle(parts[h])
    b.client.start(bundle_sha(parts["b"]), peers=[Peer("a", f"127.0.0.1:{a.port}")])
    a.client.start(bundle_sha(parts["a"]), peers=[Peer("b", f"127.0.0.1:{b.port}")])
    return a, b


CONV_SHAPE = (1, 16, 32, 32)


def _conv_chain(layers: int, seed: int, x: str, y: str) -> bytes:
    """``layers`` 3x3 convolutions (+ReLU) from tensor ``x`` to ``y``: real work (about 0.1 ms a layer on a
    core), so that partitions' runs take long enough to be seen overlapping, or not."""
    rng = np.random.default_rng(seed)
    channels = CONV_SHAPE[1]
    nodes, inits = [], []
    name = x
    for i in range(layers):
        w = (rng.standard_normal((channels, channels, 3, 3)) * 0.05).astype(np.float32)
        inits.append(numpy_helper.from_array(w, f"w{i}"))
        out = y if i == layers - 1 else f"r{i}"
        nodes.append(helper.make_node("Conv", [name, f"w{i}"], [f"c{i}"], pads=[1, 1, 1, 1]))
        nodes.append(helper.make_node("Relu", [f"c{i}"], [out]))
        name = out
    graph = helper.make_graph(
        nodes,
        "conv_chain",
        [helper.make_tensor_value_info(x, TensorProto.FLOAT, list(CONV_SHAPE))],
        [helper.make_tensor_value_info(y, TensorProto.FLOAT, list(CONV_SHAPE))],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8).SerializeToString()


def write_conv_bundle(folder: Path, layout: str, layers: int = 24, max_inflight: int = 5) -> Path:
    """Partitions on two cores, one thread each: ``two-stages`` (a chain of convolutions cut in two, a
    stage per core), ``replicas`` (the whole chain on each core, frames taken in turn) or ``zigzag`` (a
    frame goes from the first core to the second and back, twice: the first core's unit runs three long
    pieces of the chain in turn, the second core's two short ones, as a unit of a planned pipeline holds
    partitions of several hops and runs the later ones frames behind)."""
    cores = sorted(os.sched_getaffinity(0))[:2]
    folder.mkdir(parents=True, exist_ok=True)
    shape = TensorSpec("x", "float32", CONV_SHAPE)
    if layout == "two-stages":
        models = {"s0.onnx": _conv_chain(layers, 0, "x", "mid"), "s1.onnx": _conv_chain(layers, 1, "mid", "y")}
        parts = (
            cpu_partition("s0", "s0.onnx", models["s0.onnx"], cores[0], inputs=("x",), outputs=("mid",), stage=0),
            cpu_partition("s1", "s1.onnx", models["s1.onnx"], cores[1], inputs=("mid",), outputs=("y",), stage=1),
        )
        replicas: tuple[int, ...] = (1, 1)
    elif layout == "zigzag":
        tensors = ["x", "m1", "m2", "m3", "m4", "y"]
        parts_list = []
        models = {}
        for i in range(5):
            on_first = i % 2 == 0  # the first core's unit runs hops 0, 2 and 4, the second's 1 and 3
            name = "abcde"[i]
            models[f"{name}.onnx"] = _conv_chain(
                layers if on_first else max(1, layers // 4), i, tensors[i], tensors[i + 1]
            )
            spec = cpu_partition(
                name, f"{name}.onnx", models[f"{name}.onnx"], cores[0 if on_first else 1],
                inputs=(tensors[i],), outputs=(tensors[i + 1],), stage=0 if on_first else 1,
            )  # fmt: skip
            parts_list.append(dataclasses.replace(spec, segment=i // 2))
        parts = tuple(parts_list)
        replicas = (1, 1)
    elif layout == "replicas":
        models = {"whole.onnx": _conv_chain(2 * layers, 0, "x", "y")}
        parts = tuple(
            dataclasses.replace(
                cpu_partition(f"r{g}", "whole.onnx", models["whole.onnx"], core, inputs=("x",), outputs=("y",)),
                group=g,
            )
            for g, core in enumerate(cores)
        )
        replicas = (2,)
    else:
        raise ValueError(f"layout must be two-stages, replicas or zigzag, got {layout!r}")
    for name, data in models.items():
        (folder / name).write_bytes(data)
    manifest = Manifest(
        model_sha256="2" * 64,
        plan_name=f"conv-{layout}",
        device="test",
        pipelined=True,
        max_inflight=max_inflight,
        replicas=replicas,
        inputs=(shape,),
        outputs=(TensorSpec("y", "float32", CONV_SHAPE),),
        partitions=parts,
        power=(1.0, 0.5, 2),
    )
    (folder / MANIFEST).write_text(manifest.text())
    return folder


def with_provider(folder: Path, stage: int, provider: str, options: dict[str, str] | None = None) -> Path:
    """Rewrite a tiny bundle's manifest so stage ``stage``'s partition runs with ``provider`` (and options)."""
    manifest = parse_manifest((folder / MANIFEST).read_text())
    parts = tuple(
        dataclasses.replace(p, provider=provider, provider_options=dict(options or {}), pu=f"unit{stage}")
        if p.stage == stage
        else p
        for p in manifest.partitions
    )
    (folder / MANIFEST).write_text(dataclasses.replace(manifest, partitions=parts).text())
    return folder
