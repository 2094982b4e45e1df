"""Host-side client of the board agent: every call has a deadline and explicit message limits."""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

import grpc
import numpy as np

from agents.bundle import MANIFEST, parse_manifest
from agents.memory import keep_large_buffers
from agents.peers import Peer
from agents.proto import health_pb2, health_pb2_grpc
from agents.proto import parapipe_agent_pb2 as pb
from agents.proto import parapipe_agent_pb2_grpc as rpc
from agents.server import AGENT_SERVICE, CHUNK_BYTES, MAX_MESSAGE_BYTES
from agents.tensors import frame_arrays, frame_message


class AgentError(RuntimeError):
    """A call to the agent failed; the message carries the gRPC status and the agent's explanation."""

    def __init__(self, message: str, code: grpc.StatusCode | None = None) -> None:
        super().__init__(message)
        self.code = code


def _wrap(exc: grpc.RpcError, what: str) -> AgentError:
    code = exc.code() if hasattr(exc, "code") else None
    detail = exc.details() if hasattr(exc, "details") else str(exc)
    return AgentError(f"{what}: {code.name if code else 'error'}: {detail}", code)


class AgentClient:
    def __init__(
        self,
        address: str,
        token: str | None = None,
        tls: tuple[bytes | None, bytes | None, bytes | None] | None = None,
        timeout: float = 30.0,
        long_timeout: float | None = None,
    ) -> None:
        """``timeout`` is the deadline of short calls; ``long_timeout`` (default: each call's own, 5 to
        30 minutes) that of uploads, starts, streams, benchmarks and profiling sessions."""
        keep_large_buffers()  # frames are large: reuse their buffers instead of faulting in fresh pages
        options = [
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ]
        if tls is not None:
            ca, cert, key = tls
            creds = grpc.ssl_channel_credentials(root_certificates=ca, private_key=key, certificate_chain=cert)
            self.channel = grpc.secure_channel(address, creds, options=options)
        else:
            self.channel = grpc.insecure_channel(address, options=options)
        self.address, self.timeout, self.long_timeout = address, timeout, long_timeout
        self.metadata = (("authorization", f"Bearer {token}"),) if token else ()
        self.stub = rpc.AgentStub(self.channel)
        self.health_stub = health_pb2_grpc.HealthStub(self.channel)

    def close(self) -> None:
        self.channel.close()

    def __enter__(self) -> AgentClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _long(self, default: float) -> float:
        return self.long_timeout if self.long_timeout is not None else default

    def _call(self, what: str, fn, request, timeout: float | None = None):
        try:
            return fn(request, timeout=timeout or self.timeout, metadata=self.metadata)
        except grpc.RpcError as exc:
            raise _wrap(exc, what) from None

    def health(self, service: str = "", timeout: float = 2.0) -> str:
        reply = self._call("health", self.health_stub.Check, health_pb2.HealthCheckRequest(service=service), timeout)
        return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)

    def wait_serving(self, timeout: float) -> None:
        """Block until the channel connects (``grpc.channel_ready_future``) and the agent is live; AgentError after
        ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        try:
            grpc.channel_ready_future(self.channel).result(timeout=timeout)
        except grpc.FutureTimeoutError:
            raise AgentError(f"no agent answered within {timeout:g} s", grpc.StatusCode.UNAVAILABLE) from None
        last: AgentError | None = None
        while time.monotonic() < deadline:  # connected: liveness answers at once unless it is still starting
            try:
                if self.health(timeout=max(0.1, deadline - time.monotonic())) == "SERVING":
                    return
            except AgentError as exc:
                last = exc
            time.sleep(0.05)
        raise last or AgentError(f"the agent was not live within {timeout:g} s", grpc.StatusCode.UNAVAILABLE)

    def ready(self) -> bool:
        return self.health(AGENT_SERVICE) == "SERVING"

    def status(self) -> pb.StatusReply:
        return self._call("status", self.stub.Status, pb.StatusRequest())

    def load_bundle(self, folder: Path, progress=None) -> pb.LoadBundleReply:
        """Upload a bundle folder unless the agent has it already (nothing is sent then)."""
        text = (Path(folder) / MANIFEST).read_text()
        manifest = parse_manifest(text)
        sha = manifest.sha256()
        if sha in self.status().bundles:
            return pb.LoadBundleReply(bundle_sha256=sha, already_present=True, bytes_received=0)
        files = list(dict.fromkeys(p.file for p in manifest.local_partitions()))
        total = sum((Path(folder) / f).stat().st_size for f in files)

        def chunks() -> Iterator[pb.BundleChunk]:
            yield pb.BundleChunk(bundle_sha256=sha, manifest_json=text)
            sent = 0
            for name in files:
                with open(Path(folder) / name, "rb") as fh:
                    offset = 0
                    while data := fh.read(CHUNK_BYTES):
                        yield pb.BundleChunk(bundle_sha256=sha, file=name, offset=offset, data=data)
                        offset += len(data)
                        sent += len(data)
                        if progress:
                            progress(sent, total)

        return self._call("load bundle", self.stub.LoadBundle, chunks(), timeout=max(self.timeout, self._long(600.0)))

    def start(self, sha: str, max_inflight: int = 0, peers: Iterable[Peer] = ()) -> pb.StartReply:
        """Start a loaded bundle; for one host's part of a multi-host plan, ``peers`` are the other agents."""
        return self._call(
            "start pipeline",
            self.stub.StartPipeline,
            pb.StartRequest(bundle_sha256=sha, max_inflight=max_inflight, peers=[p.to_message() for p in peers]),
            self._long(300.0),
        )

    def stop(self) -> bool:
        return self._call("stop pipeline", self.stub.StopPipeline, pb.StopRequest()).was_running

    def infer(
        self, tensors: Mapping[str, np.ndarray], frame_id: int = 0, timeout: float | None = None
    ) -> dict[str, np.ndarray]:
        """One frame's outputs; ``timeout`` (default: the client's) is also how long the agent may wait for a peer
        of the plan that is away (restarting) before it answers UNAVAILABLE."""
        reply = self._call("infer", self.stub.Infer, frame_message(frame_id, tensors), timeout)
        return frame_arrays(reply)

    def infer_stream(
        self, frames: Iterable[Mapping[str, np.ndarray]], timeout: float | None = None
    ) -> Iterator[dict[str, np.ndarray]]:
        """Outputs of each frame, in order; a failed frame raises AgentError (and ends the stream)."""
        for _, result in self.infer_stream_results(frames, timeout):
            if isinstance(result, AgentError):
                raise result
            yield result

    def infer_stream_results(
        self, frames: Iterable[Mapping[str, np.ndarray]], timeout: float | None = None
    ) -> Iterator[tuple[int, dict[str, np.ndarray] | AgentError]]:
        """(frame index, outputs or the AgentError saying why that frame failed), in order; the stream
        goes on past failed frames. Errors of the stream itself raise AgentError."""
        requests = (frame_message(i, f) for i, f in enumerate(frames))
        deadline = timeout if timeout is not None else self._long(600.0)
        try:
            for reply in self.stub.InferStream(requests, timeout=deadline, metadata=self.metadata):
                if reply.error:
                    # a frame refused for its own content, or one that failed in the plan
                    code = grpc.StatusCode.INVALID_ARGUMENT if reply.error.startswith("invalid frame:") else None
                    failed = AgentError(
                        f"infer stream: frame {reply.id} failed: {reply.error}",
                        code or grpc.StatusCode.FAILED_PRECONDITION,
                    )
                    yield reply.id, failed
                else:
                    yield reply.id, frame_arrays(reply)
        except grpc.RpcError as exc:
            raise _wrap(exc, "infer stream") from None

    def benchmark(self, frames: int = 50, warmup: int = 5, seed: int = 0) -> pb.BenchmarkReply:
        return self._call(
            "benchmark",
            self.stub.Benchmark,
            pb.BenchmarkRequest(frames=frames, warmup=warmup, seed=seed),
            self._long(1800.0),
        )

    def profile_ops(self, request: pb.ProfileRequest) -> pb.ProfileReply:
        return self._call("profile ops", self.stub.ProfileOps, request, self._long(1800.0))
