"""Measured, side by side in one run: our plans on the local agent vs plain onnxruntime.

Per model on ``local`` (2 equal cores):
  * plain onnxruntime: one session with both cores (latency and throughput), and one
    session per core fed from two threads (throughput); the best of them is the bar;
  * ours: the model is profiled, the ILP plans for throughput and for latency, and the
    plans run on the agent (frames generated on the board);
  * ratios: our throughput / ORT's best (goal >= 0.97), our latency / ORT's best (<= 1.03).
On ``local-biglittle`` (core 1 throttled): our best plan vs one session on both cores
(goal >= 1.3x). Agent overhead: resnet18 through the agent (gRPC Infer round trip and the
board-side pipeline alone) vs the same session run directly (goal <= 3%).
Medians over --repeats runs. Energy figures are modelled.

Board-side overhead (``--overhead``, also at the end of a full run): the agent's executor
against plain onnxruntime sessions on the same cores, frames generated on the board (the
agent's Benchmark), on a ~2 ms model (a chain of 3x3 convolutions sized here to take about
2 ms a frame on one core) and on resnet18. Latency: one partition on one core vs one
single-thread session on that core; throughput: the model replicated on each core (frames
round-robin) vs one session per core fed by its own thread. Each round runs plain, ours, plain
again: a round's overhead is ours against the mean of the two plain runs around it (a drift of
the load within the round cancels), and the second plain run against the first is the noise of
the measure itself, printed beside it; medians and ranges over the rounds. Goal <= 1% per
frame on both. On a shared machine those runs drift by several % with the load, so the same
is also measured in process, frame by frame in turn
(inline, queued, plain), where the drift cancels: a one-partition pipeline runs a frame of
``infer`` in the caller's thread (inline) when idle, and hands it to its worker (queued) when
frames wait; a stream in process (a feed thread and a reader, as ``InferStream``), its feed thread
running the idle partition itself or handing every frame over; and the executor's own cost per
frame, on a one-node model, for both paths.

Run: .venv/bin/python bench/bench_agent.py [--models resnet18 googlenet inception_v3] [--frames 60]
     .venv/bin/python bench/bench_agent.py --overhead [--repeats 7] [--frames 200]
     .venv/bin/python bench/bench_agent.py --feeders [--repeats 21] [--frames 400]  (frames back to back, in
     process: each finished frame sending the next, as the Benchmark does, or one thread feeding them all)
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import onnxruntime as ort

from agents.executor import generate_inputs
from compiler import compile_plan, write_bundle
from device_profiles.loader import load_profile
from models.coarsen import coarsen
from models.graph import build_graph
from models.onnx_io import load_onnx
from parapipe.local_agent import LocalAgent
from planner.costmodel import CostModel
from planner.search import SearchOptions, best_plan
from profiler.costtable import CostTable
from profiler.pinning import pin_current_thread, release_current_thread, throttle_current_thread
from profiler.runtime import CPU_PROVIDER, open_session
from profiler.session import pu_configs, run_profile


def _session(
    path: Path,
    threads: int,
    cores: list[int],
    spin: bool = True,
    pool_cores: list[int] | None = None,
    throttle: float | None = None,
) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.add_session_config_entry("session.intra_op.allow_spinning", "1" if spin else "0")
    if pool_cores:
        options.add_session_config_entry("session.intra_op_thread_affinities", ";".join(str(c + 1) for c in pool_cores))
    pin_current_thread(cores)
    if throttle:
        throttle_current_thread("bench-pool", throttle)
    try:
        return open_session(str(path), options, CPU_PROVIDER, "bench")
    finally:
        if throttle:
            release_current_thread()


def ort_one_session(path: Path, feeds: dict, frames: int, cores: list[int], **kw) -> tuple[float, float]:
    """(latency ms mean, throughput fps) of one session with len(cores) threads, run back to back (the mean, as
    the agent's latency alone is)."""
    result: list[tuple[float, float]] = []

    def work() -> None:
        s = _session(path, len(cores), cores[:1] if kw.get("pool_cores") else cores, **kw)
        for _ in range(5):
            s.run(None, feeds)
        times = []
        t0 = time.perf_counter()
        for _ in range(frames):
            a = time.perf_counter()
            s.run(None, feeds)
            times.append(time.perf_counter() - a)
        result.append((statistics.fmean(times) * 1e3, frames / (time.perf_counter() - t0)))

    t = threading.Thread(target=work)
    t.start()
    t.join()
    return result[0]


def ort_throttled_core(path: Path, feeds: dict, frames: int, core: int, percent: float) -> float:
    """Throughput of one single-thread session on one core, the running thread itself throttled."""
    result: list[float] = []

    def work() -> None:
        pin_current_thread([core])
        throttle_current_thread("bench-little", percent)
        try:
            s = _session(path, 1, [core], spin=False)
            for _ in range(3):
                s.run(None, feeds)
            t0 = time.perf_counter()
            for _ in range(frames):
                s.run(None, feeds)
            result.append(frames / (time.perf_counter() - t0))
        finally:
            release_current_thread()

    t = threading.Thread(target=work)
    t.start()
    t.join()
    return result[0]


def ort_session_per_core(path: Path, feeds: dict, frames: int, cores: list[int]) -> float:
    """Throughput of one single-thread session per core, each fed by its own thread. The span is taken
    by the running threads themselves (first start to last end): at real-time priority (``chrt -f``) a
    waiting main thread gets no core until they are done, and its clock would start late."""
    barrier = threading.Barrier(len(cores))
    counts = [0] * len(cores)
    spans: list[tuple[float, float]] = []

    def work(i: int, core: int) -> None:
        s = _session(path, 1, [core])
        for _ in range(3):
            s.run(None, feeds)
        barrier.wait()
        t0 = time.perf_counter()
        for _ in range(frames // len(cores)):
            s.run(None, feeds)
            counts[i] += 1
        spans.append((t0, time.perf_counter()))

    threads = [threading.Thread(target=work, args=(i, c)) for i, c in enumerate(cores)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(counts) / (max(end for _, end in spans) - min(start for start, _ in spans))


def measure_plan(plan, loaded, graph, profile, frames: int, tmp: Path, agent: LocalAgent):
    compiled = compile_plan(plan, loaded, graph, profile)
    folder = write_bundle(compiled, tmp / compiled.sha256[:12])
    client = agent.client
    client.start(client.load_bundle(folder).bundle_sha256)
    reply = client.benchmark(frames=frames, warmup=5)
    client.stop()
    return reply


def conv_chain(path: Path, layers: int, channels: int = 32, side: int = 32) -> Path:
    """A chain of ``layers`` 3x3 convolutions (+ReLU): a small model whose time per frame is set by ``layers``."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    nodes, inits = [], []
    x = "input"
    for i in range(layers):
        w = numpy_helper.from_array((rng.standard_normal((channels, channels, 3, 3)) * 0.05).astype("float32"), f"w{i}")
        inits.append(w)
        nodes.append(helper.make_node("Conv", [x, f"w{i}"], [f"c{i}"], pads=[1, 1, 1, 1]))
        nodes.append(helper.make_node("Relu", [f"c{i}"], [f"r{i}"]))
        x = f"r{i}"
    shape = [1, channels, side, side]
    graph = helper.make_graph(
        nodes,
        "conv_chain",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info(x, TensorProto.FLOAT, shape)],
        inits,
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)
    return path


def replicated_bundle(model: Path, folder: Path, cores: list[int], replicas: bool) -> Path:
    """A bundle of the whole model as one stage: one partition on ``cores[0]``, or (``replicas``)
    one replica per core taking frames round-robin."""
    import hashlib
    import shutil

    import onnx

    from agents.bundle import MANIFEST, Manifest, PartitionSpec, TensorSpec

    proto = onnx.load(model)

    def spec(v) -> TensorSpec:
        t = v.type.tensor_type
        return TensorSpec(v.name, "float32", tuple(d.dim_value for d in t.shape.dim))

    folder.mkdir(parents=True, exist_ok=True)
    shutil.copy(model, folder / "model.onnx")
    sha = hashlib.sha256((folder / "model.onnx").read_bytes()).hexdigest()
    groups = cores if replicas else cores[:1]
    parts = tuple(
        PartitionSpec.on_cpu_core(
            f"p{g}",
            "model.onnx",
            sha,
            core,
            inputs=tuple(i.name for i in proto.graph.input),
            outputs=tuple(o.name for o in proto.graph.output),
            group=g,
        )
        for g, core in enumerate(groups)
    )
    manifest = Manifest(
        model_sha256=sha,
        plan_name=f"{model.stem}-x{len(groups)}",
        device="local",
        pipelined=True,
        max_inflight=2 * len(groups),
        replicas=(len(groups),),
        inputs=tuple(spec(i) for i in proto.graph.input),
        outputs=tuple(spec(o) for o in proto.graph.output),
        partitions=parts,
        power=(1.0, 0.5, len(groups)),
    )
    (folder / MANIFEST).write_text(manifest.text())
    return folder


def two_ms_model(tmp: Path, cores: list[int]) -> Path:
    """A conv chain of about 2 ms a frame on one of ``cores``: a 4-layer probe timed there sets its depth."""
    probe = conv_chain(tmp / "probe.onnx", 4)
    feeds = generate_inputs(replicated_bundle_inputs(probe))
    per_layer = ort_one_session(probe, feeds, 50, cores)[0] / 4
    return conv_chain(tmp / "conv_chain_2ms.onnx", max(1, round(2.0 / per_layer)))


def overhead(agent: LocalAgent, zoo_dir: Path, tmp: Path, frames: int, repeats: int) -> None:
    """The executor's per-frame cost against plain sessions on the same cores (see the module doc)."""
    from models.export import export_model

    cores = sorted(__import__("os").sched_getaffinity(0))[:2]
    med = statistics.median
    small = two_ms_model(tmp, cores[:1])
    resnet = zoo_dir / "resnet18.onnx"
    if not resnet.exists():
        export_model("resnet18", resnet)
    print(
        f"\n== board-side overhead per frame: the agent's executor vs plain onnxruntime sessions "
        f"(cores {cores}, {frames} frames; {repeats} rounds of plain, ours, plain again: each round's overhead is ours "
        "against the mean of the plain runs either side of it, and plain's second run against its first is the noise "
        "of the measure itself; medians, and the range over the rounds)"
    )
    print(
        f"{'model':16} {'row':10} {'plain ms':>9} {'ours ms':>9} {'overhead':>9} {'range':>17} "
        f"{'noise':>8} {'range':>17}   (ms a frame; throughput: one replica per core)"
    )
    client = agent.client
    for path in (small, resnet):
        feeds = generate_inputs(replicated_bundle_inputs(path))
        one = client.load_bundle(replicated_bundle(path, tmp / f"{path.stem}-x1", cores, False)).bundle_sha256
        many = client.load_bundle(replicated_bundle(path, tmp / f"{path.stem}-xn", cores, True)).bundle_sha256
        latency: list[tuple[float, float, float]] = []  # (plain, ours, plain again) ms
        per_frame: list[tuple[float, float, float]] = []  # the same, ms a frame at full throughput
        overlapped: list[float] = []
        for _ in range(repeats):
            before = ort_one_session(path, feeds, frames, cores[:1])[0]
            client.start(one)
            ours = client.benchmark(frames=frames, warmup=5).latency_alone_ms
            latency.append((before, ours, ort_one_session(path, feeds, frames, cores[:1])[0]))
            before = 1000 / ort_session_per_core(path, feeds, frames, cores)
            client.start(many)
            reply = client.benchmark(frames=frames, warmup=5)
            overlapped.append(reply.runs_overlapped)
            per_frame.append(
                (before, 1000 / reply.throughput_fps, 1000 / ort_session_per_core(path, feeds, frames, cores))
            )
        client.stop()
        for row, runs in (("latency", latency), ("throughput", per_frame)):
            over = [(o / ((a + b) / 2) - 1) * 100 for a, o, b in runs]
            noise = [(b / a - 1) * 100 for a, _, b in runs]
            print(
                f"{path.stem:16} {row:10} {med([x for a, _, b in runs for x in (a, b)]):9.3f} "
                f"{med([o for _, o, _ in runs]):9.3f} {med(over):+8.2f}% {_span(over):>17} "
                f"{med(noise):+7.2f}% {_span(noise):>17}",
                flush=True,
            )
        print(f"{path.stem:16} frames' runs that overlapped another frame's (replicas): median {med(overlapped):.0%}")
    print(
        "paired in process, frame by frame in turn (load drift cancels): one partition's pipeline.infer (inline), "
        "the same frame submitted (the submitting thread runs the idle partition itself: entry) and submitted "
        "to its worker (queued), plain session.run on the same core"
    )
    for path in (small, resnet):
        feeds = generate_inputs(replicated_bundle_inputs(path))
        got = paired(path, tmp / f"{path.stem}-paired", feeds, cores, max(30, frames // (1 if path is small else 4)))
        print(
            f"{path.stem:16} plain {got['plain']:.3f} ms; inline {got['inline']:.3f} ms "
            f"({(got['inline'] / got['plain'] - 1) * 100:+.2f}%); entry {got['entry']:.3f} ms "
            f"({(got['entry'] / got['plain'] - 1) * 100:+.2f}%); queued {got['queued']:.3f} ms "
            f"({(got['queued'] / got['plain'] - 1) * 100:+.2f}%)",
            flush=True,
        )
    print(
        "streamed in process (a feed thread submits, this thread takes the results in order, as InferStream "
        "does; one frame in flight, or two): the feed thread runs a frame alone in the pipeline itself (entry), "
        "or hands every frame to the worker (handed over, what every streamed frame paid before), vs plain "
        "session.run in a loop on the same core"
    )
    for path in (small, resnet):
        feeds = generate_inputs(replicated_bundle_inputs(path))
        for window in (1, 2):
            n = frames if path is small else max(30, frames // 4)
            got = streamed(path, tmp / f"{path.stem}-streamed{window}", feeds, cores, n, repeats, window)
            print(
                f"{path.stem:16} {window} in flight: plain {got['plain']:.3f} ms/frame; entry {got['entry']:.3f} "
                f"({(got['entry'] / got['plain'] - 1) * 100:+.2f}%); handed over {got['handed']:.3f} "
                f"({(got['handed'] / got['plain'] - 1) * 100:+.2f}%)",
                flush=True,
            )
    inline, entry, queued, plain = handoff_cost(tmp, cores)
    print(
        f"executor cost per frame (in process, one-node model, fastest of 7 x 3000 frames) on top of session.run's "
        f"{plain:.1f} µs: {inline:.1f} µs run inline by infer (one partition, idle) = {inline / 20:.2f}% of a 2 ms "
        f"frame; {entry:.1f} µs submitted and run by the submitting thread (entry) = {entry / 20:.2f}%; "
        f"{queued:.1f} µs handed to the worker and back (submit run=False + result) = {queued / 20:.2f}%",
        flush=True,
    )


def _span(values: list[float]) -> str:
    return f"[{min(values):+.2f}, {max(values):+.2f}]"


def paired(model: Path, folder: Path, feeds: dict, cores: list[int], frames: int) -> dict[str, float]:
    """Median ms per frame of four ways to run one frame, taken in turn frame by frame (in a rotating
    order: under load, a thread that has run on is preempted sooner than one that slept) from one unpinned
    thread: ``inline`` (``Pipeline.infer`` on a one-partition pipeline), ``entry`` (``submit``: this thread
    runs the idle partition itself), ``queued`` (submitted to the partition's worker, ``run=False``, and
    waited for) and ``plain`` (session.run, this thread pinned to the same core for the run, as inline
    pins it)."""
    import os

    from agents.bundle import parse_manifest
    from agents.executor import Pipeline

    bundle = replicated_bundle(model, folder, cores, False)
    pipeline = Pipeline(parse_manifest((bundle / "manifest.json").read_text()), bundle)
    pipeline.start()
    own = os.sched_getaffinity(0)
    plain = _session(model, 1, cores[:1])
    os.sched_setaffinity(0, own)

    def plain_run(f: dict) -> None:
        os.sched_setaffinity(0, set(cores[:1]))
        try:
            plain.run(None, f)
        finally:
            os.sched_setaffinity(0, own)

    ways = {
        "inline": pipeline.infer,
        "entry": lambda f: pipeline.result(pipeline.submit(f)),
        "queued": lambda f: pipeline.result(pipeline.submit(f, run=False)),
        "plain": plain_run,
    }
    times: dict[str, list[float]] = {k: [] for k in ways}
    try:
        for run in ways.values():
            for _ in range(5):
                run(feeds)
        order = list(ways)
        for i in range(frames):
            for k in order[i % len(order) :] + order[: i % len(order)]:  # each way first, second... in turn
                t0 = time.perf_counter()
                ways[k](feeds)
                times[k].append((time.perf_counter() - t0) * 1e3)
    finally:
        pipeline.stop()
    return {k: statistics.median(v) for k, v in times.items()}


def streamed(
    model: Path, folder: Path, feeds: dict, cores: list[int], frames: int, repeats: int, window: int
) -> dict[str, float]:
    """Median ms per frame of a stream through a one-partition pipeline, as ``InferStream`` runs one: a feed
    thread submits frames (``window`` in flight) and this thread takes each result in order; ``entry`` lets
    the feed thread run a frame alone in the pipeline itself when the partition is idle (``Pipeline.submit``),
    ``handed`` hands every frame to the worker (``run=False``); ``plain`` is session.run in a loop on the
    same core. Runs alternate."""
    from collections import deque

    from agents.bundle import parse_manifest
    from agents.executor import Pipeline

    bundle = replicated_bundle(model, folder, cores, False)
    pipeline = Pipeline(parse_manifest((bundle / "manifest.json").read_text()), bundle, max_inflight=window)
    pipeline.start()

    def stream(run: bool) -> float:
        pending: deque = deque()
        room = threading.Semaphore(window)
        ready = threading.Condition()

        def feed() -> None:
            for _ in range(frames):
                room.acquire()
                future = pipeline.submit(feeds, run=run)
                with ready:
                    pending.append(future)
                    ready.notify()

        t0 = time.perf_counter()
        feeder = threading.Thread(target=feed)
        feeder.start()
        for _ in range(frames):
            with ready:
                while not pending:
                    ready.wait()
                future = pending.popleft()
            pipeline.result(future)
            room.release()
        feeder.join()
        return (time.perf_counter() - t0) / frames * 1e3

    def plain_run() -> float:
        out: list[float] = []

        def work() -> None:
            session = _session(model, 1, cores[:1])
            session.run(None, feeds)
            t0 = time.perf_counter()
            for _ in range(frames):
                session.run(None, feeds)
            out.append((time.perf_counter() - t0) / frames * 1e3)

        t = threading.Thread(target=work)
        t.start()
        t.join()
        return out[0]

    times: dict[str, list[float]] = {"entry": [], "handed": [], "plain": []}
    try:
        stream(True)
        for _ in range(repeats):
            times["plain"].append(plain_run())
            times["entry"].append(stream(True))
            times["handed"].append(stream(False))
    finally:
        pipeline.stop()
    return {k: statistics.median(v) for k, v in times.items()}


def handoff_cost(
    tmp: Path, cores: list[int], frames: int = 3000, repeats: int = 7
) -> tuple[float, float, float, float]:
    """(µs per frame the executor adds to session.run when ``infer`` runs the frame inline, µs it adds when
    ``submit`` runs it in the submitting thread, µs it adds when the frame is handed to the partition's worker
    and back, µs of plain session.run) on a one-node model,
    in process: what every frame pays whatever the model (fastest of ``repeats`` runs: noise only adds)."""
    import onnx
    from onnx import TensorProto, helper

    from agents.bundle import parse_manifest
    from agents.executor import Pipeline

    x = helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 8])
    y = helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, 8])
    graph = helper.make_graph([helper.make_node("Relu", ["input"], ["output"])], "noop", [x], [y])
    model = tmp / "noop.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), model)
    folder = replicated_bundle(model, tmp / "noop", cores, False)
    pipeline = Pipeline(parse_manifest((folder / "manifest.json").read_text()), folder)
    pipeline.start()
    feeds = generate_inputs(replicated_bundle_inputs(model))

    def timed(run) -> float:
        for _ in range(200):
            run(feeds)
        t0 = time.perf_counter()
        for _ in range(frames):
            run(feeds)
        return (time.perf_counter() - t0) / frames * 1e6

    def plain_run() -> None:  # on the partition's core, in a thread of its own (pinning is per thread)
        session = _session(model, 1, cores[:1])
        plain.append(timed(lambda f: session.run(None, f)))

    inline: list[float] = []
    entry: list[float] = []
    queued: list[float] = []
    plain: list[float] = []
    try:
        for _ in range(repeats):
            t = threading.Thread(target=plain_run)
            t.start()
            t.join()
            inline.append(timed(pipeline.infer))  # from an unpinned thread, as the agent's calls come
            entry.append(timed(lambda f: pipeline.result(pipeline.submit(f))))
            queued.append(timed(lambda f: pipeline.result(pipeline.submit(f, run=False))))
    finally:
        pipeline.stop()
    return min(inline) - min(plain), min(entry) - min(plain), min(queued) - min(plain), min(plain)


def replicated_bundle_inputs(path: Path):
    import onnx

    from agents.bundle import TensorSpec

    return tuple(
        TensorSpec(i.name, "float32", tuple(d.dim_value for d in i.type.tensor_type.shape.dim))
        for i in onnx.load(path, load_external_data=False).graph.input
    )


def own_thread(pipeline, inputs: dict, frames: int) -> dict[int, float]:
    """Frames back to back fed by this thread alone (for comparison only): it submits every frame, waiting
    for a slot while ``max_inflight`` are in flight; the workers' done-callbacks only note the time."""
    finished: dict[int, float] = {}
    futures = []
    for i in range(frames):
        future = pipeline.submit(inputs, run=False)
        future.add_done_callback(lambda _f, i=i: finished.__setitem__(i, time.perf_counter()))
        futures.append(future)
    for future in futures:
        future.result()
    while len(finished) < frames:
        time.sleep(0.0005)
    return finished


def feeders(tmp: Path, frames: int, repeats: int) -> None:
    """In process, the ~2 ms model replicated on each core, frames back to back: self-fed (each finished frame
    sends the next from its worker's thread: ``agents.benchmark.back_to_back``, what the Benchmark does) and
    fed by one thread of their own, against one plain session per core fed by its own thread. Rounds of
    plain, own, self-fed, plain again (the order of the two feeders alternating); ms a frame over the frames
    after the first tenth, each against the mean of the round's two plain runs."""
    from agents.benchmark import back_to_back
    from agents.bundle import parse_manifest
    from agents.executor import Pipeline

    cores = sorted(__import__("os").sched_getaffinity(0))[:2]
    med = statistics.median
    small = two_ms_model(tmp, cores[:1])
    feeds = generate_inputs(replicated_bundle_inputs(small))
    bundle = replicated_bundle(small, tmp / "feeders", cores, True)
    pipeline = Pipeline(parse_manifest((bundle / "manifest.json").read_text()), bundle)
    pipeline.start()

    def ms(finished: dict[int, float]) -> float:
        t = sorted(finished.values())
        skip = max(1, len(t) // 10)
        return (t[-1] - t[skip - 1]) / (len(t) - skip) * 1e3

    ways = {
        "own": lambda: ms(own_thread(pipeline, feeds, frames)),
        "self-fed": lambda: ms(back_to_back(pipeline, feeds, frames)),
    }
    got: dict[str, list[float]] = {k: [] for k in ways}
    noise: list[float] = []
    try:
        for way in ways.values():
            way()
        for r in range(repeats):
            before = 1000 / ort_session_per_core(small, feeds, frames, cores)
            runs = {k: ways[k]() for k in (list(ways) if r % 2 == 0 else list(ways)[::-1])}
            after = 1000 / ort_session_per_core(small, feeds, frames, cores)
            for k, v in runs.items():
                got[k].append((v / ((before + after) / 2) - 1) * 100)
            noise.append((after / before - 1) * 100)
    finally:
        pipeline.stop()
    print(
        f"\n== frames back to back in process, {small.stem} replicated on cores {cores}, {frames} frames, {repeats} "
        "rounds (plain, both feeders in alternating order, plain again): ms a frame against plain, median [range]"
    )
    for k, v in got.items():
        print(f"{k:9} {med(v):+7.2f}% {_span(v)}")
    print(f"{'noise':9} {med(noise):+7.2f}% {_span(noise)}  (plain's second run against its first)", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=["resnet18", "googlenet", "inception_v3"])
    parser.add_argument("--frames", type=int, default=60)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--zoo-dir", type=Path, default=Path("build/bench/zoo"))
    parser.add_argument("--overhead", action="store_true", help="only the board-side overhead per frame")
    parser.add_argument(
        "--feeders", action="store_true", help="only the in-process comparison of two ways to feed frames back to back"
    )
    args = parser.parse_args()
    from models.export import export_model

    tmp = Path(tempfile.mkdtemp(prefix="parapipe-bench-agent-"))
    if args.feeders:
        feeders(tmp, args.frames, args.repeats)
        return
    if args.overhead:
        args.zoo_dir.mkdir(parents=True, exist_ok=True)
        with LocalAgent() as agent:
            overhead(agent, args.zoo_dir, tmp, args.frames, args.repeats)
        return
    costs = tmp / "costs.json"
    cores = sorted(__import__("os").sched_getaffinity(0))[:2]
    med = statistics.median
    with LocalAgent() as agent:
        print("== local (2 equal cores): ours vs the best plain onnxruntime configuration")
        print(
            f"{'model':13} {'ORT 1x2 fps':>11} {'ORT 2x1 fps':>11} {'ours fps':>9} {'ratio':>6} {'ORT lat ms':>10} {'ours lat ms':>11} {'ratio':>6}  plans"
        )
        for name in args.models:
            path = args.zoo_dir / f"{name}.onnx"
            if not path.exists():
                export_model(name, path)
            loaded = load_onnx(path)
            graph = build_graph(loaded.proto, loaded.sha256, name)
            feeds = {k: v for k, v in generate_inputs(compile_inputs(graph)).items()}
            profile = load_profile("local")
            table = CostTable.load(costs)
            run_profile(loaded, graph, profile, table, costs, pu_configs(profile))
            cost = CostModel.from_table(profile, graph, table)
            blocks = coarsen(graph, "coarse")
            thr_plan = best_plan(blocks, graph, cost, "throughput", SearchOptions(time_limit=5))
            lat_plan = best_plan(blocks, graph, cost, "latency", SearchOptions(time_limit=5))
            o12, o21, ours_t, o_lat, ours_l = [], [], [], [], []
            for _ in range(args.repeats):
                lat, thr = ort_one_session(path, feeds, args.frames, cores)
                o12.append(thr)
                o_lat.append(min(lat, ort_one_session(path, feeds, args.frames, cores[:1])[0]))
                o21.append(ort_session_per_core(path, feeds, args.frames, cores))
                ours_t.append(measure_plan(thr_plan, loaded, graph, profile, args.frames, tmp, agent).throughput_fps)
                ours_l.append(measure_plan(lat_plan, loaded, graph, profile, args.frames, tmp, agent).latency_alone_ms)
            best_ort = max(med(o12), med(o21))
            print(
                f"{name:13} {med(o12):11.2f} {med(o21):11.2f} {med(ours_t):9.2f} {med(ours_t) / best_ort:6.3f} "
                f"{med(o_lat):10.2f} {med(ours_l):11.2f} {med(ours_l) / med(o_lat):6.3f}  "
                f"thr={'+'.join(f'{a.pu}x{a.cores}' for _, _, a in thr_plan.assignments())} lat={'+'.join(f'{a.pu}x{a.cores}' for _, _, a in lat_plan.assignments())}",
                flush=True,
            )

        print("\n== local-biglittle (core 1 throttled to 40%): ours vs one session on both cores")
        try:
            bl = load_profile("local-biglittle")
        except ValueError as exc:
            print(f"skipped: {exc}")
            bl = None
        if bl is not None:
            print(
                f"{'model':13} {'ORT both fps':>12} {'ours fps':>9} {'ratio':>6} {'limit fps':>9} "
                f"{'ORT/limit':>9} {'ours/limit':>10}  plan"
            )
            for name in args.models:
                path = args.zoo_dir / f"{name}.onnx"
                loaded = load_onnx(path)
                graph = build_graph(loaded.proto, loaded.sha256, name)
                feeds = generate_inputs(compile_inputs(graph))
                table = CostTable.load(costs)
                run_profile(loaded, graph, bl, table, costs, pu_configs(bl))
                cost = CostModel.from_table(bl, graph, table)
                plan = best_plan(coarsen(graph, "coarse"), graph, cost, "throughput", SearchOptions(time_limit=5))
                ort_t, ours, limit = [], [], []
                little = bl.pu("little")
                for _ in range(args.repeats):
                    # the physical limit: each core busy all the time on whole frames (big alone + little alone)
                    big_alone = ort_one_session(path, feeds, args.frames, list(bl.pu("big").cores))[1]
                    little_alone = ort_throttled_core(
                        path, feeds, max(10, args.frames // 3), little.cores[0], little.throttle.quota_percent
                    )
                    limit.append(big_alone + little_alone)
                    ort_t.append(
                        ort_one_session(
                            path,
                            feeds,
                            args.frames,
                            [bl.pu("big").cores[0], little.cores[0]],
                            spin=False,
                            pool_cores=list(little.cores),
                            throttle=little.throttle.quota_percent,
                        )[1]
                    )
                    ours.append(measure_plan(plan, loaded, graph, bl, args.frames, tmp, agent).throughput_fps)
                print(
                    f"{name:13} {med(ort_t):12.2f} {med(ours):9.2f} {med(ours) / med(ort_t):6.3f} {med(limit):9.2f} "
                    f"{med(ort_t) / med(limit):9.3f} {med(ours) / med(limit):10.3f}  "
                    f"{'+'.join(f'{a.pu}x{a.cores}' for _, _, a in plan.assignments())}",
                    flush=True,
                )

        print("\n== agent overhead per frame, resnet18 batch 1 (one session, both cores)")
        path = args.zoo_dir / "resnet18.onnx"
        if not path.exists():
            export_model("resnet18", path)
        loaded = load_onnx(path)
        graph = build_graph(loaded.proto, loaded.sha256, "resnet18")
        profile = load_profile("local")
        from planner.baselines import single_pu

        plan = single_pu(coarsen(graph, "coarse"), profile, "cpu", len(profile.pu("cpu").cores))
        compiled = compile_plan(plan, loaded, graph, profile)
        folder = write_bundle(compiled, tmp / "overhead")
        client = agent.client
        client.start(client.load_bundle(folder).bundle_sha256)
        feeds = generate_inputs(compiled.manifest.inputs)
        direct, direct_fps, alone, grpc_rt, stream_fps = [], [], [], [], []
        for _ in range(args.repeats):
            lat, fps = ort_one_session(path, feeds, args.frames, cores)
            direct.append(lat)
            direct_fps.append(fps)
            alone.append(client.benchmark(frames=args.frames, warmup=5).latency_alone_ms)
            times = []
            for _ in range(args.frames):
                a = time.perf_counter()
                client.infer(feeds)
                times.append((time.perf_counter() - a) * 1e3)
            grpc_rt.append(statistics.median(times))
            # frames streamed from the host (InferStream): transfers overlap the board's compute
            a = time.perf_counter()
            n = sum(1 for _ in client.infer_stream(feeds for _ in range(args.frames)))
            stream_fps.append(n / (time.perf_counter() - a))
        d = med(direct)
        print(
            f"plain session {d:.2f} ms; pipeline on the board {med(alone):.2f} ms ({(med(alone) / d - 1) * 100:+.1f}%); "
            f"gRPC round trip from the host {med(grpc_rt):.2f} ms ({(med(grpc_rt) / d - 1) * 100:+.1f}%); goal <= +3%"
        )
        per_frame_direct, per_frame_stream = 1000 / med(direct_fps), 1000 / med(stream_fps)
        print(
            f"streamed from the host: {med(stream_fps):.2f} fps vs {med(direct_fps):.2f} fps plain, per frame "
            f"{per_frame_stream:.2f} ms vs {per_frame_direct:.2f} ms ({(per_frame_stream / per_frame_direct - 1) * 100:+.1f}%)"
        )
        client.stop()
        overhead(agent, args.zoo_dir, tmp, args.frames, args.repeats)


def compile_inputs(graph):
    from agents.bundle import TensorSpec

    return tuple(
        TensorSpec(t.name, t.dtype, t.shape, 1024 if t.dtype.startswith("int") else None) for t in graph.inputs
    )


if __name__ == "__main__":
    main()
