"""What the agent does, as plain functions over ``AgentState``; the gRPC servicer only translates.

Bundles live under ``<workdir>/bundles/<sha256>/``; an upload goes to a private
temporary folder, every file is checked against the manifest's hashes, and only then
is the folder renamed into place, so a cut-off upload never replaces a good bundle.
"""

from __future__ import annotations

import errno
import hashlib
import itertools
import logging
import os
import platform
import shutil
import socket
import threading
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from agents.benchmark import BenchmarkResult, run_benchmark
from agents.bundle import MANIFEST, BundleError, Manifest, file_sha256, parse_manifest, verify_bundle
from agents.executor import Pipeline, PipelineError
from agents.external_data import check_external_data
from agents.peers import Peer, PeerLinks
from agents.proto import parapipe_agent_pb2 as pb
from agents.tensors import from_message
from profiler.energy import PowerModel

AGENT_VERSION = "0.2.0"
log = logging.getLogger("parapipe.agent")
_HEX = set("0123456789abcdef")
MAX_BUNDLE_BYTES = 16 * 1024**3  # an upload larger than this is refused (override: --max-bundle-bytes)
_RESERVED = {MANIFEST, ".", ".."}  # names a partition file may not take
# bounds on what a request may ask the board to do
MAX_THREADS = 256
MAX_REPEATS = 10_000
MAX_WARMUP = 1_000
MAX_FRAMES = 100_000
# onnxruntime 1.13 took onnx 1.12.1's checks that external data stays in the model's folder
# (microsoft/onnxruntime#12915); the agent checks locations itself too, and refuses older releases.
MIN_ORT_VERSION = (1, 13)


def runtime_problem(version: str | None = None) -> str | None:
    """Why this onnxruntime may not serve (too old), or None."""
    if version is None:
        import onnxruntime as ort

        version = ort.__version__
    numbers = []
    for part in version.split(".")[:2]:
        digits = "".join(itertools.takewhile(str.isdigit, part))
        numbers.append(int(digits) if digits else 0)
    if tuple(numbers) < MIN_ORT_VERSION:
        need = ".".join(map(str, MIN_ORT_VERSION))
        return (
            f"onnxruntime {version} is older than {need}, the oldest this agent runs: it may read external "
            f"data outside a model's folder. Install onnxruntime>={need} for the board's Python."
        )
    return None


class NotFound(LookupError):
    """A bundle or pipeline the request names does not exist."""


class NotReady(RuntimeError):
    """The request needs a running pipeline."""


@dataclass
class AgentState:
    workdir: Path
    pipeline: Pipeline | None = None
    running: str = ""
    lock: threading.Lock = field(default_factory=threading.Lock)
    max_bundle_bytes: int = MAX_BUNDLE_BYTES

    def __post_init__(self) -> None:
        self.workdir = Path(self.workdir).resolve()
        (self.workdir / "bundles").mkdir(parents=True, exist_ok=True)
        self.clean_partial()

    def clean_partial(self) -> None:
        """Remove what uploads cut off by an earlier run of the agent left behind (no upload runs yet)."""
        for p in (self.workdir / "bundles").iterdir():
            if p.name.startswith(".") and ".partial" in p.name:
                log.info("removing %s, left by an interrupted upload", p.name)
                shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)

    def bundle_dir(self, sha: str) -> Path:
        if len(sha) != 64 or not set(sha) <= _HEX:
            raise BundleError(f"{sha!r} is not a sha256 hex digest")
        return self.workdir / "bundles" / sha

    def bundles(self) -> list[str]:
        return sorted(p.name for p in (self.workdir / "bundles").iterdir() if p.is_dir() and not p.name.startswith("."))


def check_file_names(manifest: Manifest) -> None:
    """A partition file may not be the manifest itself, nor name the bundle folder or its parent."""
    for p in manifest.local_partitions():
        if p.file in _RESERVED:
            raise BundleError(f"partition {p.name!r} may not be stored as {p.file!r}: the name is reserved")


def load_bundle(state: AgentState, chunks: Iterable[pb.BundleChunk]) -> pb.LoadBundleReply:
    """Stream a bundle to disk: each file in order (a chunk's offset is where the file ends so far),
    at most ``state.max_bundle_bytes`` in all, hashed as it arrives; nothing is held in memory."""
    it = iter(chunks)
    first = next(it, None)
    if first is None or not first.manifest_json:
        raise BundleError("the first chunk must carry the manifest")
    sha = first.bundle_sha256
    target = state.bundle_dir(sha)
    manifest = parse_manifest(first.manifest_json)
    if manifest.sha256() != sha:
        raise BundleError(f"the manifest hashes to {manifest.sha256()[:12]}…, not {sha[:12]}… as announced")
    check_file_names(manifest)
    if target.exists():  # the bundle is here already: stop reading
        return pb.LoadBundleReply(bundle_sha256=sha, already_present=True, bytes_received=0)
    expected = {p.file: p.sha256 for p in manifest.local_partitions()}
    tmp = state.workdir / "bundles" / f".{sha}.partial-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    received = 0
    try:
        (tmp / MANIFEST).write_text(first.manifest_json)
        handles: dict[str, object] = {}
        sizes: dict[str, int] = {}
        digests: dict[str, hashlib._Hash] = {}
        try:
            for chunk in itertools.chain([first], it) if first.file else it:
                if chunk.bundle_sha256 != sha:
                    raise BundleError("a chunk belongs to another bundle")
                if chunk.file not in expected:
                    raise BundleError(f"{chunk.file!r} is not a file of this bundle")
                if chunk.offset != sizes.get(chunk.file, 0):
                    raise BundleError(
                        f"a chunk of {chunk.file} starts at byte {chunk.offset}, the file has "
                        f"{sizes.get(chunk.file, 0)} bytes so far; send each file's chunks in order"
                    )
                received += len(chunk.data)
                if received > state.max_bundle_bytes:
                    raise BundleError(f"the bundle exceeds this agent's limit of {state.max_bundle_bytes} bytes")
                fh = handles.get(chunk.file)
                if fh is None:
                    fh = handles[chunk.file] = open(tmp / chunk.file, "wb")
                    digests[chunk.file] = hashlib.sha256()
                fh.write(chunk.data)  # type: ignore[attr-defined]
                digests[chunk.file].update(chunk.data)
                sizes[chunk.file] = sizes.get(chunk.file, 0) + len(chunk.data)
        finally:
            for fh in handles.values():
                fh.close()  # type: ignore[attr-defined]
        for name, want in expected.items():
            if name not in digests:
                raise BundleError(f"partition file {name} is missing from the bundle")
            got = digests[name].hexdigest()
            if got != want:
                raise BundleError(f"partition file {name} has sha256 {got[:12]}…, the manifest says {want[:12]}…")
        try:
            os.replace(tmp, target)
        except OSError as exc:
            if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST) or not target.exists():
                raise
            # another upload of the same bundle finished first: its files are the same
            shutil.rmtree(tmp, ignore_errors=True)
            return pb.LoadBundleReply(bundle_sha256=sha, already_present=True, bytes_received=received)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return pb.LoadBundleReply(bundle_sha256=sha, already_present=False, bytes_received=received)


def start_pipeline(state: AgentState, sha: str, max_inflight: int = 0, peers: Iterable[Peer] = ()) -> Manifest:
    """Start a bundle's pipeline; a bundle for one host of a multi-host plan needs its peers' addresses.

    Start the other hosts' agents first and the entry host's last: this agent checks that
    every peer it sends tensors to answers (and accepts its token) before it starts.
    """
    folder = state.bundle_dir(sha)
    if not folder.exists():
        raise NotFound(f"no bundle {sha[:12]}… on this board; load it first (bundles here: {len(state.bundles())})")
    manifest = verify_bundle(folder)
    check_file_names(manifest)
    for p in manifest.local_partitions():  # before onnxruntime reads any of them
        check_external_data(folder / p.file, folder, f"partition file {p.file}")
    given = {p.host: p for p in peers}
    with state.lock:
        # the new pipeline starts beside the running one, which serves until the new one is up
        pipeline = Pipeline(manifest, folder, max_inflight)
        missing = [h for h in pipeline.peer_hosts if h not in given]
        if missing:
            raise BundleError(
                f"this bundle is host {manifest.host!r}'s part of a plan over {', '.join(manifest.hosts)}; "
                f"StartPipeline needs the address of the agent of {', '.join(missing)} (peers)"
            )
        if pipeline.peer_hosts:
            links = PeerLinks(
                {h: given[h] for h in pipeline.peer_hosts},
                manifest.plan_bundle,
                _on_lost(pipeline),
                pipeline.break_down,
            )
            links.start()  # raises PeerError when a peer does not answer or refuses the token
            pipeline.links = links
        try:
            pipeline.start()  # raises PipelineError naming the partition that failed to load
        except BaseException:
            pipeline.stop()
            raise
        old = state.pipeline
        state.pipeline, state.running = pipeline, sha
    if old is not None:
        old.stop()
    return manifest


def _on_lost(pipeline: Pipeline):
    def lost(frame: int, message: str) -> None:
        if pipeline.entry:
            pipeline.fail(frame, PipelineError(message))
        else:  # the entry host notices by its own deadline; nothing here can reach it
            log.error("frame %d lost: %s", frame, message)

    return lost


def exchange(state: AgentState, handoffs: Iterable[pb.Handoff]) -> pb.ExchangeReply:
    """Tensors (or failures) from another host's agent for the running pipeline."""
    received = 0
    for h in handoffs:
        pipeline = state.pipeline
        if pipeline is None or not pipeline.manifest.plan_bundle:
            raise NotReady("no pipeline of a multi-host plan runs here; start this host's bundle first")
        if h.plan_bundle != pipeline.manifest.plan_bundle:
            raise NotReady(
                f"the handoff belongs to plan bundle {h.plan_bundle[:12]}…, this agent runs "
                f"{pipeline.manifest.plan_bundle[:12]}…; start the same plan on every host"
            )
        if h.error:
            pipeline.receive_error(h.frame, h.error)
        else:
            pipeline.receive(h.frame, h.tensor.name, from_message(h.tensor))
        received += 1
    return pb.ExchangeReply(received=received)


def stop_pipeline(state: AgentState) -> bool:
    with state.lock:
        if state.pipeline is None:
            return False
        state.pipeline.stop()
        state.pipeline, state.running = None, ""
        return True


def require_pipeline(state: AgentState) -> Pipeline:
    pipeline = state.pipeline
    if pipeline is None:
        raise NotReady("no pipeline is running; call StartPipeline with a loaded bundle first")
    return pipeline


def benchmark(state: AgentState, frames: int, warmup: int, seed: int) -> BenchmarkResult:
    pipeline = require_pipeline(state)
    active, idle, cores = pipeline.manifest.power
    if not 1 <= frames <= MAX_FRAMES:
        raise ValueError(f"frames must be between 1 and {MAX_FRAMES}, got {frames}")
    if warmup > MAX_WARMUP:
        raise ValueError(f"warmup must be at most {MAX_WARMUP} frames, got {warmup}")
    return run_benchmark(pipeline, frames, warmup, seed, PowerModel(active, idle), int(cores))


def status(state: AgentState) -> pb.StatusReply:
    import onnxruntime as ort

    pipeline = state.pipeline
    partitions = []
    if pipeline is not None:
        partitions = [
            pb.PartitionStats(
                name=name,
                pu=w.spec.pu,
                busy_ms=w.stats.busy_s * 1e3,
                queue_wait_ms=w.stats.wait_s * 1e3,
                frames=w.stats.frames,
            )
            for name, w in pipeline.workers.items()
        ]
    return pb.StatusReply(
        host=pipeline.manifest.host if pipeline is not None else "",
        partitions=partitions,
        agent_version=AGENT_VERSION,
        ort_version=ort.__version__,
        python_version=platform.python_version(),
        bundles=state.bundles(),
        running_bundle=state.running,
        ready=state.pipeline is not None,
        cores=sorted(os.sched_getaffinity(0)),
        hostname=socket.gethostname(),
        workdir=str(state.workdir),
        providers=ort.get_available_providers(),
        frames_in_flight=pipeline.in_flight if pipeline is not None else 0,
    )


def check_profile_request(request: pb.ProfileRequest) -> None:
    """Refuse requests that would tie the board up: bounded threads, repeats, warm-up runs, known cores."""
    usable = sorted(os.sched_getaffinity(0))
    if request.threads > min(MAX_THREADS, len(usable)):
        raise ValueError(
            f"threads must be at most {min(MAX_THREADS, len(usable))} (the cores here), got {request.threads}"
        )
    if request.repeats > MAX_REPEATS:
        raise ValueError(f"repeats must be at most {MAX_REPEATS}, got {request.repeats}")
    if request.warmup > MAX_WARMUP:
        raise ValueError(f"warmup must be at most {MAX_WARMUP}, got {request.warmup}")
    unknown = sorted(set(request.cores) - set(usable))
    if unknown:
        raise ValueError(f"cores {unknown} are not among this agent's cores {usable}")
    if not 0.0 <= request.throttle_percent <= 100.0:
        raise ValueError(f"throttle_percent must be within 0..100, got {request.throttle_percent}")


def profile_ops(request: pb.ProfileRequest) -> pb.ProfileReply:
    import onnxruntime as ort

    check_profile_request(request)
    check_external_data(request.model, None, "the model to profile")

    from agents.executor import generate_inputs
    from agents.tensors import arrays_from
    from profiler.measure import PuConfig, time_model
    from profiler.measure import profile_ops as op_profile

    session = ort.InferenceSession(request.model, providers=["CPUExecutionProvider"])
    if request.inputs:
        feeds = arrays_from(request.inputs)
    else:
        from agents.bundle import TensorSpec

        specs = tuple(
            TensorSpec(i.name, _np_type(i.type), tuple(d if isinstance(d, int) and d > 0 else 1 for d in i.shape))
            for i in session.get_inputs()
        )
        feeds = generate_inputs(specs)
    cores = tuple(request.cores) or tuple(sorted(os.sched_getaffinity(0)))[: max(1, request.threads)]
    cfg = PuConfig(
        "remote", cores, max(1, request.threads or len(cores)), throttle_percent=request.throttle_percent or None
    )
    repeats, warmup = max(3, request.repeats or 10), request.warmup or 3
    if request.per_op:
        timings = op_profile(request.model, feeds, cfg, warmup, repeats)
    else:
        timings = {"": time_model(request.model, feeds, cfg, warmup, repeats)}
    return pb.ProfileReply(
        timings=[
            pb.OpTiming(
                node=k, median_ms=t.median_ms, mean_ms=t.mean_ms, p10_ms=t.p10_ms, p90_ms=t.p90_ms, repeats=t.repeats
            )
            for k, t in timings.items()
        ],
        ort_version=ort.__version__,
    )


def _np_type(ort_type: str) -> str:
    return {
        "tensor(float)": "float32",
        "tensor(float16)": "float16",
        "tensor(double)": "float64",
        "tensor(int64)": "int64",
        "tensor(int32)": "int32",
        "tensor(int8)": "int8",
        "tensor(uint8)": "uint8",
        "tensor(bool)": "bool",
    }.get(ort_type, "float32")


__all__ = [
    "AgentState",
    "BundleError",
    "NotFound",
    "NotReady",
    "PipelineError",
    "benchmark",
    "exchange",
    "file_sha256",
    "load_bundle",
    "profile_ops",
    "start_pipeline",
    "status",
    "stop_pipeline",
]
