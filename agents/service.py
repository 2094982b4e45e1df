"""What the agent does, as plain functions over ``AgentState``; the gRPC servicer only translates.

Bundles live under ``<workdir>/bundles/<sha256>/``; an upload goes to a private
temporary folder, every file is checked against the manifest's hashes, and only then
is the folder renamed into place, so a cut-off upload never replaces a good bundle.
"""

from __future__ import annotations

import base64
import errno
import gc
import hashlib
import itertools
import json
import logging
import os
import platform
import re
import shutil
import socket
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from agents.benchmark import BenchmarkResult, run_benchmark
from agents.bundle import (
    MANIFEST,
    MAX_PARTITIONS,
    MAX_TENSOR_BYTES,
    BundleError,
    Manifest,
    file_sha256,
    parse_manifest,
    verify_bundle,
)
from agents.executor import PeerAway, Pipeline, PipelineError
from agents.external_data import check_external_data
from agents.memory import give_back_free_memory
from agents.peers import EPOCH_KEY, SENDER_KEY, Peer, PeerError, PeerLinks
from agents.proto import parapipe_agent_pb2 as pb
from agents.tensors import from_message
from profiler.energy import PowerModel
from profiler.runtime import (
    ProviderUnavailable,
    available_providers,
    check_options,
    missing_providers,
)

AGENT_VERSION = "0.2.0"
log = logging.getLogger("parapipe.agent")
_HEX = set("0123456789abcdef")
_TMP_NAME = re.compile(r"\..+\.tmp-[0-9a-f]{8}")  # _write_atomically's temporary files
# bounds on what a request may ask the board to do
MAX_THREADS = 256
MAX_REPEATS = 10_000
MAX_WARMUP = 1_000
MAX_BUNDLE_BYTES = 16 * 1024**3  # an upload larger than this is refused (override: --max-bundle-bytes)
_RESERVED = {MANIFEST, ".", ".."}  # names a partition file may not take
MAX_FRAMES = 100_000
RELEASE_SETTLE_S = 5.0  # how long a stopped pipeline's release collects again while something still holds it
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
    started: float = field(default_factory=time.time)
    boots: int = 0  # how many times an agent started on this workdir, this time included
    workdir_lock: object = None  # the open file holding the workdir's flock (``server.lock_workdir``)
    resumed: bool = False  # the running pipeline was brought back after a restart, not started by a call
    generation: int = 0  # bumped by every StartPipeline/StopPipeline call: a resume in progress gives way
    # told of every pipeline once it started, before it takes frames (pipeline, resumed): metrics
    on_pipeline: Callable[[Pipeline, bool], None] | None = None
    stream_feeds: int = 0  # threads reading frames from a stream's caller now (InferStream, ModelStreamInfer)
    _feeds_lock: threading.Lock = field(default_factory=threading.Lock)
    # notified whenever ``pipeline`` changes: unary calls waiting for a peer to come back (``serve_unary``)
    changed: threading.Condition = field(default_factory=threading.Condition)

    def __post_init__(self) -> None:
        self.workdir = Path(self.workdir).resolve()
        (self.workdir / "bundles").mkdir(parents=True, exist_ok=True)
        self.clean_partial()
        self.boots = self._count_boot()

    def replaced(self) -> None:
        """``pipeline`` changed (started, replaced, stopped): wake the calls waiting for it."""
        with self.changed:
            self.changed.notify_all()

    def feeding(self, delta: int) -> None:
        """A stream's feed thread started (+1) or ended (-1)."""
        with self._feeds_lock:
            self.stream_feeds += delta

    def _count_boot(self) -> int:
        path = self.workdir / "boots"
        try:
            boots = int(path.read_text().strip() or 0) + 1
        except (OSError, ValueError):
            boots = 1
        try:
            _write_atomically(path, f"{boots}\n")
        except OSError as exc:  # a full disk: serve on (the count is not kept) rather than crash-loop
            log.warning("cannot record this start in %s (%s); serving without counting it", path, exc)
        return boots

    def clean_partial(self) -> None:
        """Remove what an earlier run of the agent left half done (no upload or write runs yet): uploads
        cut off by a crash, and records cut off while being replaced (``_write_atomically``'s names)."""
        for p in (self.workdir / "bundles").iterdir():
            if p.name.startswith(".") and ".partial" in p.name:
                log.info("removing %s, left by an interrupted upload", p.name)
                shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)
        for p in self.workdir.glob(".*.tmp-*"):
            if _TMP_NAME.fullmatch(p.name) and p.is_file() and not p.is_symlink():
                log.info("removing %s, left by an interrupted write", p.name)
                p.unlink(missing_ok=True)

    def bundle_dir(self, sha: str) -> Path:
        if len(sha) != 64 or not set(sha) <= _HEX:
            raise BundleError(f"{sha!r} is not a sha256 hex digest")
        return self.workdir / "bundles" / sha

    def bundles(self) -> list[str]:
        return sorted(p.name for p in (self.workdir / "bundles").iterdir() if p.is_dir() and not p.name.startswith("."))


PIPELINE_FILE = "pipeline.json"  # the running pipeline, to bring back after a crash or a reboot


def _write_atomically(path: Path, text: str, mode: int = 0o644) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{uuid.uuid4().hex[:8]}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _remember(state: AgentState, sha: str, max_inflight: int, peers: list[Peer]) -> None:
    """Keep what the running pipeline was started with (peers' tokens included: owner-only file)."""
    record = {
        "bundle": sha,
        "max_inflight": max_inflight,
        "peers": [
            {"host": p.host, "address": p.address, "token": p.token, "tls_ca": base64.b64encode(p.tls_ca).decode()}
            for p in peers
        ],
    }
    _write_atomically(state.workdir / PIPELINE_FILE, json.dumps(record), 0o600)


def _forget(state: AgentState) -> None:
    (state.workdir / PIPELINE_FILE).unlink(missing_ok=True)


def _recorded_pipeline(state: AgentState) -> tuple[str, int, list[Peer]] | None:
    """(bundle, max_inflight, peers) the running pipeline was started with, None if none is recorded."""
    path = state.workdir / PIPELINE_FILE
    try:
        record = json.loads(path.read_text())
        sha, max_inflight = str(record["bundle"]), int(record.get("max_inflight", 0))
        peers = [
            Peer(str(p["host"]), str(p["address"]), str(p.get("token", "")), base64.b64decode(p.get("tls_ca", "")))
            for p in record.get("peers", [])
        ]
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        log.error("cannot read %s (%s)", path, exc)
        return None
    return sha, max_inflight, peers


def resume(state: AgentState, retry_s: float = 5.0, stop: threading.Event | None = None) -> None:
    """Bring back the pipeline that ran before the agent restarted (a crash, a reboot); retry while
    it cannot start (a peer not back yet), until it runs or a StartPipeline/StopPipeline call decides."""
    record = _recorded_pipeline(state)
    if record is None:
        return
    sha, max_inflight, peers = record
    generation = state.generation
    while not (stop is not None and stop.is_set()):
        try:
            start_pipeline(state, sha, max_inflight, peers, resuming=generation)
            log.info("resumed bundle %s… after a restart", sha[:12])
            return
        except _Superseded:
            return
        except Exception as exc:
            log.error("cannot resume bundle %s… yet: %s; retrying in %.0fs", sha[:12], exc, retry_s)
        if stop is not None:
            stop.wait(retry_s)
        else:
            time.sleep(retry_s)


class _Superseded(Exception):
    """A StartPipeline or StopPipeline call came while the agent was resuming: the call wins."""


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


def check_manifest_providers(manifest: Manifest) -> None:
    """Refuse a bundle whose units need an execution provider this agent's onnxruntime lacks, before any
    session is made (``ProviderUnavailable``: FAILED_PRECONDITION naming the unit, the EP and what is here)."""
    needed = {p.pu: p.provider for p in manifest.local_partitions()}
    available = available_providers()
    missing = missing_providers(needed, available)
    if missing:
        raise ProviderUnavailable(missing[0].unit, missing[0].provider, available, f"onnxruntime {_ort_version()}")


def _ort_version() -> str:
    import onnxruntime as ort

    return str(ort.__version__)


def start_pipeline(
    state: AgentState, sha: str, max_inflight: int = 0, peers: Iterable[Peer] = (), resuming: int | None = None
) -> Manifest:
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
    for p in manifest.local_partitions():
        check_options(p.provider_options, f"partition {p.name}")
    check_manifest_providers(manifest)
    peers = list(peers)
    given = {p.host: p for p in peers}
    with state.lock:
        if resuming is not None and state.generation != resuming:
            raise _Superseded
        if resuming is None:
            state.generation += 1
        # the new pipeline starts beside the running one, which serves until the new one is up
        pipeline = Pipeline(manifest, folder, max_inflight, cache_dir=state.workdir / "ep-cache" / sha)
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
                _on_broken(state, pipeline),
                sender=(manifest.host, pipeline.epoch),
                require_ready=pipeline.entry,
            )
            links.start()  # raises PeerError when a peer does not answer or refuses the token
            pipeline.links = links
        old = state.pipeline
        retired = resuming is not None and old is not None and old.broken is not None
        if retired:
            _retire(old)  # type: ignore[arg-type]
        try:
            pipeline.start()  # raises PipelineError naming the partition that failed to load
        except BaseException:
            pipeline.stop()
            _release(pipeline)
            raise
        if state.on_pipeline is not None:
            state.on_pipeline(pipeline, resuming is not None)
        state.pipeline, state.running = pipeline, sha
        state.resumed = resuming is not None
        state.replaced()
        try:
            _remember(state, sha, max_inflight, peers)
        except OSError as exc:  # the pipeline runs; it just will not come back by itself
            log.error("cannot record the running pipeline in %s: %s", state.workdir, exc)
    if old is not None:
        if not retired:
            old.stop()
        _release(old)
    return manifest


def _retire(broken: Pipeline) -> None:
    """Stop a pipeline whose peer link broke, and let its memory go, before its replacement loads.

    It serves no frame until it is replaced, so nothing is lost, and the new pipeline's sessions (the
    same partitions) take the memory the old ones leave instead of the heap growing to hold both: with
    both alive at once, each restart after a peer came back left the heap larger and fragmented
    (bert_tiny over three hosts: about 7 MiB more on the entry host per peer restart).

    The heap the old sessions leave free goes back to the system here, before the new sessions load:
    kept, the new sessions did not reuse it all (the new worker threads may allocate from the other
    malloc arena, and freed chunks need not fit), and the agent held both for a moment (the soak's
    agents peaked 8-15% above their steady size at each restart of a peer; with this, within about 2%)."""
    broken.stop()
    if broken.wait_released(60.0):
        give_back_free_memory()


def _release(pipeline: Pipeline) -> None:
    """Give a stopped pipeline's memory back to the system once its workers have ended (they let
    their sessions go as they end); in the background, so no call waits for it.

    The pipeline and its workers refer to each other, so once nothing else holds it only the cyclic
    garbage collector frees it, and on an agent that is otherwise idle that waited for a full
    collection, many restarts later: a collection here frees it (and its links' gRPC channels) first."""
    threads = [w.thread for w in pipeline.workers.values()]  # not the pipeline: it is to be collected
    gone = weakref.ref(pipeline)
    del pipeline

    def run() -> None:
        deadline = time.monotonic() + 60.0
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))
        if any(t.is_alive() for t in threads):
            return
        # the caller may still hold it for a moment (``start_pipeline`` returning): collect until it is gone
        settle = time.monotonic() + RELEASE_SETTLE_S
        while True:
            gc.collect()
            if gone() is None or time.monotonic() > settle:
                break
            time.sleep(0.05)
        give_back_free_memory()

    threading.Thread(target=run, name="pp-release", daemon=True).start()


def _on_lost(pipeline: Pipeline):
    def lost(frame: int, message: str) -> None:
        if pipeline.entry:
            pipeline.fail(frame, PeerAway(message))
        else:  # the entry host notices by its own deadline; nothing here can reach it
            log.error("frame %d lost: %s", frame, message)

    return lost


RECOVER_FIRST_S = 0.5  # a pipeline whose peer link broke tries to start again after this long,
RECOVER_MAX_S = 10.0  # doubling up to this, until the peers are back


class _Recovering:
    """The pipelines a recovery thread runs for (weakly held), under a lock of their own."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.pipelines: weakref.WeakSet[Pipeline] = weakref.WeakSet()

    def __enter__(self) -> None:
        self.lock.acquire()

    def __exit__(self, *exc: object) -> None:
        self.lock.release()


_recovering = _Recovering()


def _on_broken(state: AgentState, pipeline: Pipeline):
    def broken(message: str) -> None:
        pipeline.break_down(message)
        recover(state, pipeline)

    return broken


def recover(state: AgentState, broken: Pipeline) -> None:
    """A peer link of ``broken`` broke (the peer crashed, restarted, or could not be reached): start
    this host's part again, from the record of the running pipeline, once every peer is back (and, on
    the entry host, runs its part again), so frames flow again without anyone calling StartPipeline.
    Gives up when the pipeline is stopped or replaced (StartPipeline, StopPipeline, shutdown)."""
    with _recovering:  # not state.lock: a link may break while StartPipeline holds it
        if broken in _recovering.pipelines:
            return
        _recovering.pipelines.add(broken)
    generation = state.generation

    def run() -> None:
        # Until ``broken`` is replaced or stopped by a call (StartPipeline, StopPipeline, shutdown): not
        # ``broken.stopping``, which a start that retired it and then failed leaves set.
        wait = RECOVER_FIRST_S
        while state.pipeline is broken:
            time.sleep(wait)
            wait = min(2 * wait, RECOVER_MAX_S)
            record = _recorded_pipeline(state)
            if state.pipeline is not broken or record is None or record[0] != state.running:
                return
            try:
                start_pipeline(state, *record, resuming=generation)
                log.info("the peers are back: bundle %s… runs again", record[0][:12])
                return
            except _Superseded:
                return
            except Exception as exc:
                log.warning("bundle %s… cannot start again yet: %s; retrying in %.1fs", record[0][:12], exc, wait)

    threading.Thread(target=run, name="pp-recover", daemon=True).start()


def exchange(
    state: AgentState, handoffs: Iterable[pb.Handoff], metadata: dict[str, str | bytes] | None = None
) -> pb.ExchangeReply:
    """Tensors (or failures, or frames that entered the plan) from another host's agent for the running pipeline.

    A stream from a new run of the sending host's part (its epoch changed: it restarted) means this
    host's pipeline numbers frames differently: it breaks (frames in flight fail) and starts again."""
    metadata = metadata or {}
    sender = metadata.get(SENDER_KEY, b"")
    sender = sender.decode(errors="replace") if isinstance(sender, bytes) else str(sender)
    epoch = str(metadata.get(EPOCH_KEY, ""))
    received = 0
    checked: Pipeline | None = None
    for h in handoffs:
        pipeline = state.pipeline
        if pipeline is None or not pipeline.manifest.plan_bundle:
            raise NotReady("no pipeline of a multi-host plan runs here; start this host's bundle first")
        if pipeline is not checked and epoch:
            if not pipeline.same_peer_run(sender, epoch):
                message = f"host {sender!r} started its part of the plan again"
                log.warning("%s: frames are numbered anew; starting this host's part again", message)
                _on_broken(state, pipeline)(f"{message}; this host's part starts again too")
                raise NotReady(f"{message}; this host's part is starting again: retry once it is ready")
            checked = pipeline
        if h.plan_bundle != pipeline.manifest.plan_bundle:
            raise NotReady(
                f"the handoff belongs to plan bundle {h.plan_bundle[:12]}…, this agent runs "
                f"{pipeline.manifest.plan_bundle[:12]}…; start the same plan on every host"
            )
        if h.error:
            pipeline.receive_error(h.frame, h.error)
        elif h.entered:
            pipeline.enter(h.frame)
        else:
            pipeline.receive(h.frame, h.tensor.name, from_message(h.tensor))
        received += 1
    return pb.ExchangeReply(received=received)


def stop_pipeline(state: AgentState, forget: bool = True) -> bool:
    """Stop the running pipeline; ``forget`` (a StopPipeline call) also means it does not come back
    after a restart, while an agent shutting down keeps it to resume."""
    with state.lock:
        if forget:
            state.generation += 1
            _forget(state)
        if state.pipeline is None:
            return False
        state.pipeline.stop()
        _release(state.pipeline)
        state.pipeline, state.running = None, ""
        state.replaced()
        return True


def require_pipeline(state: AgentState) -> Pipeline:
    pipeline = state.pipeline
    if pipeline is None:
        raise NotReady("no pipeline is running; call StartPipeline with a loaded bundle first")
    return pipeline


PEER_WAIT_S = 30.0  # how long a unary call without a deadline waits for an away peer to come back
REPLY_MARGIN_S = 0.1  # a call waiting for a peer answers this long before its deadline, so its caller hears why
T = TypeVar("T")


def serve_unary(
    state: AgentState,
    call: Callable[[Pipeline], T],
    time_remaining: Callable[[], float | None],
    active: Callable[[], bool] = lambda: True,
    resolve: Callable[[AgentState], Pipeline] = require_pipeline,
) -> T:
    """``call`` on the running pipeline (``resolve``); while a peer of a plan over several hosts is away
    (``PeerAway``: the frame was refused, or lost with the link), wait for the pipeline to start again
    (``recover``) and run the frame there, within the call's deadline (``time_remaining``; without one,
    ``PEER_WAIT_S``). If the peer is still away ``REPLY_MARGIN_S`` before the deadline, ``PeerError``
    (UNAVAILABLE) saying so. A frame that failed in a partition, and a pipeline stopped by a call, fail
    at once as before. The frame runs at most once to completion: a frame lost with a link never
    reaches the entry host's outputs, and its pipeline is stopped before the new one takes frames."""
    started = time.monotonic()
    while True:
        pipeline = resolve(state)
        try:
            return call(pipeline)
        except PeerAway as exc:
            away = exc
        left = time_remaining()
        if left is None or left >= threading.TIMEOUT_MAX:  # no deadline (gRPC's is then beyond any wait)
            left = PEER_WAIT_S - (time.monotonic() - started)
        if not _await_replacement(state, pipeline, left - REPLY_MARGIN_S, active):
            waited = time.monotonic() - started
            raise PeerError(
                f"a peer of this plan is away and was not back within the call's deadline (waited {waited:.1f} s): "
                f"{away}. Retry, or give the call a deadline long enough for the peer to restart."
            ) from None


def _await_replacement(state: AgentState, old: Pipeline, wait_s: float, active: Callable[[], bool]) -> bool:
    """Wait up to ``wait_s`` for ``old`` (broken) to be replaced or stopped; False if it was not (or the caller left)."""
    until = time.monotonic() + wait_s
    with state.changed:
        while state.pipeline is old:
            left = until - time.monotonic()
            if left <= 0 or not active():
                return False
            state.changed.wait(min(left, 0.5))
    return True


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
                provider=w.spec.provider,
                load_s=w.load_s,
                compile_cache_hit=w.cache_hit,
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
        boots=state.boots,
        up_s=time.time() - state.started,
        resumed=state.resumed and pipeline is not None,
        frames_done=pipeline.frames_done if pipeline is not None else 0,
        frames_failed=pipeline.frames_failed if pipeline is not None else 0,
        bounds=bounds(state),
        devices=ep_devices(),
    )


def bounds(state: AgentState) -> dict[str, int]:
    """The sizes a client controls and their limits here (the server adds its connections' and messages')."""
    pipeline = state.pipeline
    out = {
        "tensor_bytes": MAX_TENSOR_BYTES,  # any input declared or generated (profile requests, manifests)
        "partitions": MAX_PARTITIONS,  # per manifest
        "bundle_bytes": state.max_bundle_bytes,  # one upload, all its chunks
        "profile_threads": MAX_THREADS,
        "profile_repeats": MAX_REPEATS,
        "profile_warmup": MAX_WARMUP,
    }
    if pipeline is not None:
        out["frames_in_flight"] = pipeline.max_inflight  # frames a caller's stream or calls may have at once
        out["frames_ahead"] = pipeline.ahead  # how far ahead of a partition a peer's tensor may be
    return out


def ep_devices() -> list[str]:
    """onnxruntime's execution-provider devices, "EP: type vendor" ([] before onnxruntime 1.22)."""
    import onnxruntime as ort

    get = getattr(ort, "get_ep_devices", None)
    if get is None:
        return []
    return [f"{d.ep_name}: {d.device.type.name.lower()} {d.device.vendor}".strip() for d in get()]


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
    "start_pipeline",
    "status",
    "stop_pipeline",
]
