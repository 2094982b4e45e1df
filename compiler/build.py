"""Compile: a plan and its model become a PartitionBundle, checked before anything leaves the host.

One ONNX file per segment (a unit's partition, see ``planner.segments``), cut by the
tensor names at its boundary; replicas share files (same content, same hash). The
chained partitions of every replica combination are run against the full model with
onnxruntime; the bundle is written only if they agree (max abs diff <= 1e-5).

A plan with int8 blocks has the nodes of those blocks quantised inside each partition
(static QDQ, per-channel weights, from the calibration ranges the plan embeds): the
QuantizeLinear/DequantizeLinear at a partition's boundary are inside it, so partitions
still exchange fp32 tensors and chain in any mix. The nodes of fp16 blocks are converted
to fp16 inside their partitions the same way (onnxruntime's converter, the Casts at the
partition's boundary and around its fp32 nodes inside it); a partition holding both (a GPU that
computes int8 and fp16) is quantised first, then converted, its Q/DQ kept fp32. Its chained partitions cannot match
fp32 to 1e-5: the check compares them with the full fp32 model by the plan's metric and
records the loss (``Compiled.precision``); only missing outputs, other shapes or
non-finite values where fp32 is finite are errors here (``run --verify`` holds the loss
to the plan's budget).

A plan whose units sit on several hosts of the profile (edge + cloud) is checked as one
bundle and then split into one bundle per host (``host_bundles``): each lists the whole
plan's partitions with their hosts, holds only its own host's files, and names the
whole bundle's hash so the agents can tell their handoffs apart from other plans'.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import uuid
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from agents.bundle import MANIFEST, Manifest, PartitionSpec, TensorSpec
from compiler.targets import board_power, unit_target
from device_profiles.schema import DeviceProfile
from models.errors import PartitionError
from models.files import locked
from models.graph import OpGraph
from models.inputs import InputSpec
from models.onnx_io import LoadedModel
from models.partition import GroupExtractor, OutputCheck, compare_outputs
from models.precision import PrecisionCheck, check_precision, quantize_nodes, to_fp16
from planner.plan import Plan, validate
from planner.segments import lower, max_inflight


@dataclass(frozen=True)
class Compiled:
    manifest: Manifest
    files: dict[str, bytes]  # file name -> ONNX bytes
    max_abs_diff: float
    precision: PrecisionCheck | None = None  # plans with int8 blocks: the mix against fp32 by the plan's metric

    @property
    def sha256(self) -> str:
        return self.manifest.sha256()


def compile_plan(
    plan: Plan, loaded: LoadedModel, graph: OpGraph, profile: DeviceProfile, verify: bool = True
) -> Compiled:
    validate(plan, graph, profile)
    segments = lower(plan, graph, profile)
    extractor = GroupExtractor(loaded.proto, graph)
    files: dict[str, bytes] = {}
    parts: list[PartitionSpec] = []
    cache: dict[tuple[str, ...], tuple[str, str, tuple[str, ...], tuple[str, ...]]] = {}
    for seg in segments:
        if seg.members not in cache:
            part = extractor.extract(seg.name, seg.members)
            part.model.graph.name = seg.name
            int8 = [m for b in seg.blocks if b in plan.int8 for m in plan.blocks[b]]
            half = {m for b in seg.blocks if b in plan.fp16 for m in plan.blocks[b]}
            data = part.model.SerializeToString()
            if int8 and plan.precision is not None:
                data = quantize_nodes(part.model, int8, plan.precision.ranges)
            if half:  # after the int8 nodes' Q/DQ (new nodes, kept fp32 like every node not in fp16)
                model = onnx.load_from_string(data)
                data = to_fp16(model, [n.name for n in model.graph.node if n.name not in half])
            sha = hashlib.sha256(data).hexdigest()
            name = f"{sha[:16]}.onnx"
            files[name] = data
            cache[seg.members] = (name, sha, part.inputs, part.outputs)
        name, sha, inputs, outputs = cache[seg.members]
        target = unit_target(seg.pu, seg.core_ids, profile)
        parts.append(
            PartitionSpec(
                name=seg.name,
                file=name,
                sha256=sha,
                pu=seg.pu,
                cores=seg.cores,
                core_ids=seg.core_ids,
                threads=seg.cores,
                throttle_percent=target.throttle_percent,
                throttled_cores=target.throttled_cores,
                provider=target.provider,
                provider_options=dict(target.provider_options),
                stage=seg.stage,
                group=seg.group,
                unit=seg.unit,
                segment=seg.index,
                inputs=inputs,
                outputs=outputs,
                host=target.host,
            )
        )
    manifest = Manifest(
        model_sha256=plan.model_sha256,
        plan_name=plan.name,
        device=plan.device,
        pipelined=plan.pipelined,
        max_inflight=max_inflight(plan, segments),
        replicas=tuple(st.replicas for st in plan.stages),
        inputs=tuple(_tensor_spec(s) for s in loaded.inputs),
        outputs=tuple(TensorSpec(t.name, t.dtype, t.shape) for t in graph.outputs),
        partitions=tuple(parts),
        power=board_power(profile),
        hosts=_hosts(parts, {t.name for t in graph.inputs}),
    )
    if verify and plan.reduced and plan.precision is not None:
        check = verify_precision(manifest, files, loaded, plan.precision.metric, plan.precision.budget)
        return Compiled(manifest, files, float("nan"), check)
    diff = verify_compiled(manifest, files, loaded, graph) if verify else float("nan")
    return Compiled(manifest, files, diff)


def _tensor_spec(s: InputSpec) -> TensorSpec:
    """How the board makes frames for one input (the agent's ``generate_inputs`` reads it)."""
    return TensorSpec(
        s.name,
        s.dtype,
        s.shape,
        high=int(s.high) if s.high is not None and s.dtype.startswith(("int", "uint")) else None,
        low=int(s.low) if s.low is not None and s.dtype.startswith(("int", "uint")) else None,
        values=s.values,
    )


def _hosts(parts: list[PartitionSpec], graph_inputs: set[str]) -> tuple[str, ...]:
    """The plan's hosts when it spans several, the entry host (it reads the graph inputs) first."""
    hosts = list(dict.fromkeys(p.host for p in sorted(parts, key=lambda p: (p.stage, p.segment))))
    if len(hosts) < 2:
        return ()
    readers = [p for p in sorted(parts, key=lambda p: (p.stage, p.segment)) if graph_inputs & set(p.inputs)]
    entry = readers[0].host if readers else hosts[0]
    return (entry, *(h for h in hosts if h != entry))


def host_bundles(compiled: Compiled) -> dict[str, Compiled]:
    """One bundle per host for a plan over several hosts ({"": compiled} for a single-host plan)."""
    full = compiled.manifest
    if not full.hosts:
        return {"": compiled}
    out = {}
    for host in full.hosts:
        manifest = replace(full, host=host, plan_bundle=full.sha256())
        files = {p.file: compiled.files[p.file] for p in manifest.local_partitions()}
        out[host] = Compiled(manifest, files, compiled.max_abs_diff, compiled.precision)
    return out


def write_bundles(compiled: Compiled, folder: Path) -> dict[str, Path]:
    """The bundle in ``folder``, or for a plan over several hosts one bundle per host in ``folder/<host>``."""
    parts = host_bundles(compiled)
    if "" in parts:
        return {"": write_bundle(compiled, folder)}
    folder = Path(folder)
    tmp = _scratch(folder, "hosts")
    tmp.mkdir(parents=True)
    try:
        for host, part in parts.items():
            write_bundle(part, tmp / host)
        _swap(tmp, folder)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return {host: folder / host for host in parts}


def _scratch(folder: Path, what: str) -> Path:
    """A folder name beside ``folder`` that no other writer (process or thread) picks."""
    return folder.with_name(f".{folder.name}.{what}-{os.getpid()}-{uuid.uuid4().hex[:12]}")


def _swap(tmp: Path, folder: Path) -> None:
    """Put ``tmp`` in ``folder``'s place. Writers of the same folder take turns (a lock beside it): two at once
    failed with ENOTEMPTY and left their scratch folders behind."""
    with locked(folder):
        if folder.exists():
            old = _scratch(folder, "old")
            os.replace(folder, old)
            os.replace(tmp, folder)
            shutil.rmtree(old)
        else:
            os.replace(tmp, folder)


def run_chained(
    manifest: Manifest,
    files: dict[str, bytes],
    feeds: dict[str, np.ndarray],
    frame: int = 0,
    sessions: dict[str, Any] | None = None,
) -> dict[str, np.ndarray]:
    """Run the partitions one frame uses, each when its inputs exist, like the executor does. ``sessions``
    (file name -> onnxruntime session) keeps the sessions for the next frames of the same files: a plan of a
    hundred partitions otherwise makes (and tears down) a hundred sessions per frame."""
    values = dict(feeds)
    pending = manifest.active(frame)
    sessions = {} if sessions is None else sessions
    while pending:
        ready = [p for p in pending if all(t in values for t in p.inputs)]
        if not ready:
            raise PartitionError(f"partitions {[p.name for p in pending]} wait on each other: the bundle has a cycle")
        for p in ready:
            if p.file not in sessions:
                sessions[p.file] = _session(files[p.file])
            result = sessions[p.file].run(list(p.outputs), {t: values[t] for t in p.inputs})
            values.update(zip(p.outputs, result, strict=True))
            pending.remove(p)
    return {t.name: values[t.name] for t in manifest.outputs}


def verify_compiled(manifest: Manifest, files: dict[str, bytes], loaded: LoadedModel, graph: OpGraph) -> float:
    """Chained partitions vs the full model for every replica combination; raises above ``OutputCheck.allowed``."""
    import onnxruntime as ort

    feeds = loaded.feeds()
    full = ort.InferenceSession(loaded.ort_proto.SerializeToString(), providers=["CPUExecutionProvider"])
    expected = dict(zip([o.name for o in full.get_outputs()], full.run(None, feeds), strict=True))
    worst = OutputCheck(0.0, 0.0)
    sessions: dict[str, Any] = {}
    for frame in range(manifest.replica_period()):
        check = compare_outputs(expected, run_chained(manifest, files, feeds, frame, sessions))
        if check.max_abs_diff >= worst.max_abs_diff:
            worst = check
    if not worst.ok:
        raise PartitionError(f"the compiled partitions differ from the full model: {worst.describe()}")
    return worst.max_abs_diff


def verify_precision(
    manifest: Manifest, files: dict[str, bytes], loaded: LoadedModel, metric: str, budget: float, frames: int = 4
) -> PrecisionCheck:
    """Chained partitions of a precision mix vs the full fp32 model, by ``metric``, on up to ``frames`` frames
    made from the model's inputs (the user's data where given), every replica combination; raises on missing
    outputs, other shapes, or non-finite values where fp32 is finite."""
    import onnxruntime as ort

    full = ort.InferenceSession(loaded.ort_proto.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in full.get_outputs()]
    reference, got = [], []
    sessions: dict[str, Any] = {}
    for k, feeds in enumerate(sample_frames(loaded, frames)):
        expected = dict(zip(names, full.run(None, feeds), strict=True))
        result = run_chained(manifest, files, feeds, k % manifest.replica_period(), sessions)
        compare_outputs(expected, result)  # names and shapes
        for t, ref in expected.items():
            a, b = np.asarray(ref), np.asarray(result[t])
            if a.dtype.kind == "f" and bool(np.any(np.isfinite(a) & ~np.isfinite(b))):
                raise PartitionError(
                    f"output {t!r}: the int8/fp16 partitions give non-finite values where fp32 is finite"
                )
        reference.append(expected)
        got.append(result)
    return check_precision(reference, got, metric, budget)


def sample_frames(loaded: LoadedModel, frames: int) -> list[dict[str, np.ndarray]]:
    """Frames to check a precision mix on: the user's data where every input has some (one frame), else
    ``frames`` generated ones (seeds 7, 8, ...)."""
    if all(s.source == "data" for s in loaded.inputs):
        return [loaded.feeds(seed=7)]
    return [loaded.feeds(seed=7 + k) for k in range(frames)]


def write_bundle(compiled: Compiled, folder: Path) -> Path:
    """Write files and manifest to a temporary folder, then rename it into place."""
    folder = Path(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = _scratch(folder, "tmp")
    tmp.mkdir()
    try:
        for name, data in compiled.files.items():
            (tmp / name).write_bytes(data)
        (tmp / MANIFEST).write_text(compiled.manifest.text())
        _swap(tmp, folder)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return folder


def _quiet():
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    return options


def _session(model: bytes) -> Any:
    """A checking session of one partition: one thread (a check runs one partition at a time; a thread pool per
    session of a plan's hundred partitions costs more to make and tear down than the runs)."""
    import onnxruntime as ort

    options = _quiet()
    options.intra_op_num_threads = 1
    return ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
