"""The board agent's gRPC server: thin servicers over ``agents.service``, and ``serve()``.

Board side: needs only grpcio, onnxruntime, numpy and psutil. Run it with
``python -m agents.server --port 50051 --workdir DIR`` (or ``parapipe agent serve``).
Every request may carry ``authorization: Bearer <token>`` (required when a token file
is given); message size limits are set explicitly on both ends.
"""

from __future__ import annotations

import argparse
import hmac
import ipaddress
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from pathlib import Path

import grpc

from agents import service
from agents.calls import Refused, abort, answer_in_order, infer_frame
from agents.executor import FrameFuture, InputError
from agents.memory import bound_arenas, keep_large_buffers
from agents.metrics import IDLE_S as METRICS_IDLE_S
from agents.metrics import MAX_SCRAPES
from agents.peers import AGENT_SERVICE, Peer
from agents.profiling import profile_ops
from agents.proto import health_pb2, health_pb2_grpc
from agents.proto import parapipe_agent_pb2 as pb
from agents.proto import parapipe_agent_pb2_grpc as rpc
from agents.tensors import TensorError, frame_arrays, frame_message

MAX_MESSAGE_BYTES = 64 * 1024 * 1024
CHUNK_BYTES = 1024 * 1024
log = logging.getLogger("parapipe.agent")


# connections the gRPC port holds at once (each costs a file descriptor; the usual limit is 1024), how long one
# may take to finish its handshakes, and how long one without a call in progress is kept
MAX_CONNECTIONS = 128
HANDSHAKE_TIMEOUT_MS = 10_000
IDLE_CONNECTION_MS = 300_000
# what Status reports of the above (with the service's and the metrics port's bounds)
SERVER_BOUNDS = {
    "message_bytes": MAX_MESSAGE_BYTES,
    "connections": MAX_CONNECTIONS,
    "handshake_timeout_ms": HANDSHAKE_TIMEOUT_MS,
    "idle_connection_ms": IDLE_CONNECTION_MS,
    "metrics_scrapes": MAX_SCRAPES,
    "metrics_idle_ms": int(METRICS_IDLE_S * 1000),
}
# Concurrent calls per kind; beyond its limit a call is refused with RESOURCE_EXHAUSTED at once.
# Health checks have their own share, so liveness is answered however many streams are open.
CALL_LIMITS: dict[str, int] = {
    "Check": 16,
    "Watch": 16,
    "Infer": 64,
    "InferStream": 8,
    "Exchange": 16,
    "Benchmark": 1,
    "ProfileOps": 1,
    "LoadBundle": 4,
    "Control": 8,  # StartPipeline, StopPipeline, Status
}
_KIND = {"StartPipeline": "Control", "StopPipeline": "Control", "Status": "Control"}
# the Open Inference Protocol (agents/inference.py) shares the places of the calls it resembles
_KIND.update(ModelInfer="Infer", ModelStreamInfer="InferStream")
_KIND.update(dict.fromkeys(("ServerLive", "ServerReady", "ModelReady", "ServerMetadata", "ModelMetadata"), "Check"))
SPARE_THREADS = 8  # for refusals and anything unknown: never held by a long call


class CallLimits(grpc.ServerInterceptor):
    """Counts concurrent calls per kind and refuses those beyond the kind's limit (RESOURCE_EXHAUSTED).

    A call takes its place when its handler starts in a server thread and gives it back when the
    handler (or its response stream) ends, so a call that never ran holds nothing.
    """

    def __init__(self, limits: dict[str, int] | None = None) -> None:
        self.limits = dict(CALL_LIMITS, **(limits or {}))
        self.active = dict.fromkeys(self.limits, 0)
        self.refused = dict.fromkeys(self.limits, 0)
        self._lock = threading.Lock()

    def threads(self) -> int:
        """Server threads needed so every kind can reach its limit and spare ones remain."""
        return sum(self.limits.values()) + SPARE_THREADS

    def kind(self, method: str) -> str | None:
        name = method.rsplit("/", 1)[-1]
        name = _KIND.get(name, name)
        return name if name in self.limits else None

    def _enter(self, kind: str, context: grpc.ServicerContext) -> None:
        with self._lock:
            if self.active[kind] < self.limits[kind]:
                self.active[kind] += 1
                return
            self.refused[kind] += 1
        context.abort(
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            f"the agent runs {self.limits[kind]} {kind} calls already (its limit); retry later",
        )

    def busy(self, besides: tuple[str, ...] = ()) -> int:
        """Calls in progress, those of the kinds ``besides`` left out."""
        with self._lock:
            return sum(n for k, n in self.active.items() if k not in besides)

    def _leave(self, kind: str) -> None:
        with self._lock:
            self.active[kind] -= 1

    def stats(self) -> list[pb.CallStats]:
        with self._lock:
            return [
                pb.CallStats(kind=k, active=self.active[k], limit=self.limits[k], refused=self.refused[k])
                for k in self.limits
            ]

    def _unary(self, kind: str, behavior: Callable) -> Callable:
        def run(request, context):
            self._enter(kind, context)
            try:
                return behavior(request, context)
            finally:
                self._leave(kind)

        return run

    def _streaming(self, kind: str, behavior: Callable) -> Callable:
        def run(request, context):
            self._enter(kind, context)
            try:
                yield from behavior(request, context)
            finally:
                self._leave(kind)

        return run

    def intercept_service(self, continuation, handler_call_details):
        handler = continuation(handler_call_details)
        kind = self.kind(handler_call_details.method)
        if handler is None or kind is None:
            return handler
        if handler.unary_unary:
            return handler._replace(unary_unary=self._unary(kind, handler.unary_unary))
        if handler.stream_unary:
            return handler._replace(stream_unary=self._unary(kind, handler.stream_unary))
        if handler.unary_stream:
            return handler._replace(unary_stream=self._streaming(kind, handler.unary_stream))
        return handler._replace(stream_stream=self._streaming(kind, handler.stream_stream))


class AgentServicer(rpc.AgentServicer):
    def __init__(self, state: service.AgentState, limits: CallLimits | None = None) -> None:
        self.state = state
        self.limits = limits

    def LoadBundle(self, request_iterator, context):
        try:
            return service.load_bundle(self.state, request_iterator)
        except grpc.RpcError:
            raise
        except Exception as exc:
            abort(context, exc)

    def StartPipeline(self, request, context):
        try:
            peers = [Peer.from_message(m) for m in request.peers]
            manifest = service.start_pipeline(self.state, request.bundle_sha256, request.max_inflight, peers)
        except Exception as exc:
            abort(context, exc)
        return pb.StartReply(
            bundle_sha256=request.bundle_sha256, partitions=[p.name for p in manifest.local_partitions()]
        )

    def StopPipeline(self, request, context):
        return pb.StopReply(was_running=service.stop_pipeline(self.state))

    def Infer(self, request, context):
        try:
            tensors = frame_arrays(request)
            outputs = service.serve_unary(
                self.state,
                lambda pipeline: infer_frame(pipeline, tensors, context),
                context.time_remaining,
                context.is_active,
            )
        except Exception as exc:
            abort(context, exc)
        return frame_message(request.id, outputs)

    def InferStream(self, request_iterator, context) -> Iterator[pb.Frame]:
        try:
            pipeline = service.require_pipeline(self.state)
        except Exception as exc:
            abort(context, exc)

        def submit(frame: pb.Frame) -> FrameFuture:
            try:
                tensors = frame_arrays(frame)
                return pipeline.submit(tensors, timeout=context.time_remaining())
            except (TensorError, InputError) as exc:  # this frame's own fault: the stream goes on
                raise Refused(f"invalid frame: {exc}") from None

        answers = answer_in_order(
            self.state, pipeline, request_iterator, context, submit, lambda: "the pipeline was stopped"
        )
        for frame, outputs, error in answers:
            yield pb.Frame(id=frame.id, error=error) if outputs is None else frame_message(frame.id, outputs)

    def Benchmark(self, request, context):
        try:
            r = service.benchmark(self.state, request.frames or 50, request.warmup, request.seed)
        except Exception as exc:
            abort(context, exc)
        return pb.BenchmarkReply(
            frames=r.frames,
            latency_p50_ms=r.latency_p50_ms,
            latency_p99_ms=r.latency_p99_ms,
            latency_alone_ms=r.latency_alone_ms,
            throughput_fps=r.throughput_fps,
            energy_mj=r.energy_mj,
            energy_source=r.energy_source,
            energy_sensor=r.energy_sensor,
            wall_s=r.wall_s,
            overlap=r.overlap,
            frames_at_once=r.frames_at_once,
            runs_overlapped=r.runs_overlapped,
            in_flight=r.in_flight,
            partitions=[
                pb.PartitionStats(
                    name=p.name,
                    pu=p.pu,
                    busy_ms=p.busy_ms,
                    queue_wait_ms=p.queue_wait_ms,
                    frames=p.frames,
                    alone_busy_ms=p.alone_busy_ms,
                    alone_frames=p.alone_frames,
                    cpu_ms=p.cpu_ms,
                    cpu_frames=p.cpu_frames,
                    alone_cpu_ms=p.alone_cpu_ms,
                    alone_cpu_frames=p.alone_cpu_frames,
                    provider=p.provider,
                    load_s=p.load_s,
                    compile_cache_hit=p.compile_cache_hit,
                )
                for p in r.partitions
            ],
        )

    def ProfileOps(self, request, context):
        try:
            return profile_ops(request, stop=lambda: not context.is_active())
        except Exception as exc:
            abort(context, exc)

    def Status(self, request, context):
        reply = service.status(self.state)
        if self.limits is not None:
            reply.calls.extend(self.limits.stats())
        reply.bounds.update(SERVER_BOUNDS)
        reply.stream_feeds = self.state.stream_feeds
        return reply

    def Exchange(self, request_iterator, context):
        log.info("exchange stream from %s", context.peer(), extra={"peer": context.peer()})
        try:
            return service.exchange(self.state, request_iterator, dict(context.invocation_metadata()))
        except grpc.RpcError:
            raise
        except Exception as exc:
            abort(context, exc)


class HealthServicer(health_pb2_grpc.HealthServicer):
    """Service "" is live while the process serves; the agent service is ready with a running pipeline."""

    def __init__(self, state: service.AgentState) -> None:
        self.state = state

    def _status(self, name: str) -> int:
        serving, not_serving = health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING
        if name == "":
            return serving
        if name == AGENT_SERVICE:
            pipeline = self.state.pipeline
            return serving if pipeline is not None and not pipeline.broken else not_serving
        return health_pb2.HealthCheckResponse.SERVICE_UNKNOWN

    def Check(self, request, context):
        return health_pb2.HealthCheckResponse(status=self._status(request.service))

    def Watch(self, request, context):
        last = None
        while context.is_active():
            current = self._status(request.service)
            if current != last:
                yield health_pb2.HealthCheckResponse(status=current)
                last = current
            threading.Event().wait(0.5)


class TokenInterceptor(grpc.ServerInterceptor):
    """Refuse every call without ``authorization: Bearer <token>`` (UNAUTHENTICATED)."""

    def __init__(self, token: str) -> None:
        self.expected = f"Bearer {token}"

        def deny(request, context):
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong token; pass the board's token file")

        self.deny = deny

    def intercept_service(self, continuation, handler_call_details):
        metadata = dict(handler_call_details.invocation_metadata or ())
        if hmac.compare_digest(str(metadata.get("authorization", "")), self.expected):
            return continuation(handler_call_details)
        handler = continuation(handler_call_details)
        if handler is None:
            return None
        # refused before the request is read: a request-streaming handler that never iterates its requests
        # (for unary calls too; the wire is the same), with no deserializer, so a tokenless caller's message is
        # never taken in beyond the transport's flow-control window (a unary handler would read it whole: 12
        # tokenless 60 MiB Infer calls took the agent from 77 to 359 MiB)
        if handler.response_streaming:
            return grpc.stream_stream_rpc_method_handler(lambda it, ctx: self.deny(None, ctx))
        return grpc.stream_unary_rpc_method_handler(lambda it, ctx: self.deny(None, ctx))


def build_server(
    state: service.AgentState,
    host: str = "127.0.0.1",
    port: int = 0,
    token: str | None = None,
    tls: tuple[bytes, bytes, bytes | None] | None = None,
    limits: dict[str, int] | None = None,
) -> tuple[grpc.Server, int, CallLimits]:
    """The agent's server, its port and the counter of its calls; ``limits`` overrides ``CALL_LIMITS`` per
    kind."""
    options = [
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        # callers and peers ping to find dead links; allow it without a call in progress
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.min_ping_interval_without_data_ms", 1000),
        # gRPC sets SO_REUSEPORT by default: a second agent started on a port one already serves would bind
        # too and silently take half its connections; without it the second one fails with "address in use"
        ("grpc.so_reuseport", 0),
        # pre-authentication bounds (nobody has shown a token yet): connections at once, a connection that never
        # completes its TLS and HTTP/2 handshake, and one that carries no call, are closed
        ("grpc.max_allowed_incoming_connections", MAX_CONNECTIONS),
        ("grpc.server_handshake_timeout_ms", HANDSHAKE_TIMEOUT_MS),
        ("grpc.max_connection_idle_ms", IDLE_CONNECTION_MS),
    ]
    calls = CallLimits(limits)
    interceptors: list[grpc.ServerInterceptor] = [TokenInterceptor(token)] if token else []
    interceptors.append(calls)
    pool = futures.ThreadPoolExecutor(max_workers=calls.threads(), thread_name_prefix="pp-rpc")
    server = grpc.server(pool, options=options, interceptors=interceptors)
    rpc.add_AgentServicer_to_server(AgentServicer(state, calls), server)
    health_pb2_grpc.add_HealthServicer_to_server(HealthServicer(state), server)
    # imported here: its proto package ("inference") would clash with a Triton client's in a host process
    from agents.inference import add_to_server as add_inference_service

    add_inference_service(state, server)
    address = f"{host}:{port}"
    try:  # grpcio reports a port it cannot bind by returning 0 or, in newer releases, raising RuntimeError
        if tls is not None:
            cert, key, ca = tls
            creds = grpc.ssl_server_credentials([(key, cert)], root_certificates=ca, require_client_auth=ca is not None)
            bound = server.add_secure_port(address, creds)
        else:
            bound = server.add_insecure_port(address)
    except RuntimeError:
        bound = 0
    if bound == 0:
        raise OSError(f"cannot listen on {address}: is another agent or program already using the port?")
    return server, bound, calls


def process_start_time(pid: int | str = "self") -> str:
    """Field 22 of /proc/PID/stat (clock ticks after boot): with the pid, it names one process for ever."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    return text.rsplit(") ", 1)[1].split()[19]


def is_loopback(host: str) -> bool:
    """Whether only this machine can reach an address (a name other than localhost counts as reachable)."""
    if host.strip("[]") in ("localhost", "localhost6"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def exposure_problem(host: str, token: bool, tls: bool, insecure: bool) -> tuple[str | None, str | None]:
    """(refusal, warning) for serving on ``host``: refuse a network address without a token, warn of a
    token that would travel in plaintext."""
    if is_loopback(host) or insecure:
        return None, None
    if not token:
        return (
            f"refusing to serve on {host} without a token: anyone who can reach this board could load and run "
            "models on it. Pass --token-file FILE (and --tls-cert/--tls-key so the token is not sent in "
            "plaintext), serve on 127.0.0.1 and reach the agent through an SSH tunnel, or pass --insecure if "
            "this network is trusted.",
            None,
        )
    if not tls:
        return None, (
            f"WARNING: serving on {host} with a token but without TLS: the token and every frame travel in "
            "plaintext; anyone on the path can read the token and use this agent. Pass --tls-cert/--tls-key."
        )
    return None, None


class WorkdirBusy(RuntimeError):
    """Another agent serves this workdir."""


WORKDIR_LOCK = "agent.lock"


def lock_workdir(workdir: Path):  # -> the open lock file (keep it open)
    """Take the workdir's lock (flock on ``agent.lock``, the holder's pid written in it) for this process's life:
    a second agent on the same workdir would delete the first's upload in progress and run its pipeline on the
    same cores. ``WorkdirBusy`` names the holder."""
    import fcntl

    if workdir.exists() and not workdir.is_dir():
        raise NotADirectoryError(f"--workdir {workdir} is a file, not a folder")
    workdir.mkdir(parents=True, exist_ok=True)
    handle = open(workdir / WORKDIR_LOCK, "a+")  # held open for the process's life
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        holder = handle.read().strip() or "unknown"
        handle.close()
        raise WorkdirBusy(
            f"another agent (pid {holder}) serves workdir {workdir}; stop it first or give another --workdir"
        ) from None
    handle.seek(0)
    handle.truncate()
    try:  # unbuffered: nothing is left in a buffer to fail again at exit
        os.write(handle.fileno(), f"{os.getpid()}\n".encode())
    except OSError as exc:  # a full disk: the lock holds without the pid in it
        log.warning("cannot write this agent's pid into %s (%s)", workdir / WORKDIR_LOCK, exc)
    return handle


def read_token(path: Path) -> str:
    """The bearer token in ``path``: printable ASCII (gRPC metadata carries nothing else), not empty."""
    data = path.read_bytes()
    try:
        token = data.decode("ascii").strip()
    except UnicodeDecodeError:
        raise ValueError(f"token file {path} holds bytes that are not ASCII; a token is printable ASCII") from None
    if not token:
        raise ValueError(f"token file {path} is empty")
    if not token.isprintable():
        raise ValueError(f"token file {path} holds control characters; a token is printable ASCII")
    return token


def _argument_problem(args: argparse.Namespace) -> str:
    """What is wrong with the command line, before anything starts ("" if nothing)."""
    for name in ("port", "metrics_port"):
        value = getattr(args, name)
        if value is not None and not 0 <= value <= 65535:
            return f"--{name.replace('_', '-')} {value}: a port is 0 to 65535 (0 picks a free one)"
    for name in ("port_file", "metrics_port_file", "pid_file"):
        path = getattr(args, name)
        if path is not None and not path.parent.is_dir():
            return f"--{name.replace('_', '-')} {path}: the folder {path.parent} does not exist"
    return ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="parapipe-agent", description="The parapipe board agent (gRPC).")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=50051, help="port; 0 picks a free one (see --port-file)")
    parser.add_argument("--workdir", type=Path, default=Path.home() / ".parapipe-agent", help="bundles are kept here")
    parser.add_argument("--token-file", type=Path, help="require this bearer token on every call")
    parser.add_argument("--tls-cert", type=Path)
    parser.add_argument("--tls-key", type=Path)
    parser.add_argument("--tls-ca", type=Path, help="also require client certificates signed by this CA")
    parser.add_argument("--port-file", type=Path, help="write the bound port here once serving")
    parser.add_argument("--pid-file", type=Path)
    parser.add_argument(
        "--grace",
        type=float,
        default=10.0,
        help="on SIGTERM, seconds frames in flight may take to finish before the agent stops (default 10)",
    )
    parser.add_argument(
        "--insecure",
        action="store_true",
        help="serve on a network address without a token (anyone who can reach it may run models)",
    )
    parser.add_argument(
        "--max-bundle-bytes",
        type=int,
        default=service.MAX_BUNDLE_BYTES,
        help=f"refuse bundle uploads larger than this (default {service.MAX_BUNDLE_BYTES})",
    )
    parser.add_argument(
        "--metrics-port",
        type=int,
        help="serve Prometheus metrics over HTTP on this port, on --host like gRPC and behind the same token "
        "and TLS (0 picks a free one, see --metrics-port-file); off by default; needs prometheus_client",
    )
    parser.add_argument("--metrics-port-file", type=Path, help="write the bound metrics port here once serving")
    parser.add_argument(
        "--debug-memory",
        type=Path,
        metavar="FILE",
        help="debugging: trace Python allocations and, on each SIGUSR1, append a JSON line to FILE with the "
        "agent's memory, threads and live pipelines, links, channels and sessions (off by default: slower)",
    )
    parser.add_argument(
        "--log-format",
        default=os.environ.get("PARAPIPE_LOG_FORMAT", "text"),
        help="text (default) or json: one JSON object a line (time, level, event, bundle, plan, peer); "
        "also $PARAPIPE_LOG_FORMAT",
    )
    args = parser.parse_args(argv)
    problem = _argument_problem(args)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    from agents.logs import configure

    try:
        json_logs = configure(args.log_format)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    token = None
    if args.token_file:
        try:
            token = read_token(args.token_file)
        except (OSError, ValueError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    tls = None
    if args.tls_cert or args.tls_key:
        if not (args.tls_cert and args.tls_key):
            print("error: --tls-cert and --tls-key go together", file=sys.stderr)
            return 2
        try:
            tls = (
                args.tls_cert.read_bytes(),
                args.tls_key.read_bytes(),
                args.tls_ca.read_bytes() if args.tls_ca else None,
            )
        except OSError as exc:
            print(f"error: cannot read a TLS file: {exc}", file=sys.stderr)
            return 2
    refusal, warning = exposure_problem(args.host, token is not None, tls is not None, args.insecure)
    if refusal:
        print(f"error: {refusal}", file=sys.stderr)
        return 2
    if warning:
        print(warning, file=sys.stderr)
        log.warning("%s", warning)
    if args.insecure and not is_loopback(args.host) and token is None:
        log.warning("serving on %s with --insecure: no token, anyone who can reach it may run models", args.host)
    problem = service.runtime_problem()
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    keep_large_buffers()
    bound_arenas()  # freed memory of stopped pipelines is reused, not left in a new thread's arena
    if args.debug_memory is not None:  # after the malloc settings: its thread allocates too
        from agents.debug import MemoryReports

        MemoryReports(args.debug_memory).install()
    try:
        workdir_lock = lock_workdir(args.workdir)  # held for the agent's life; the kernel lets go when it ends
    except (OSError, WorkdirBusy) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    state = service.AgentState(args.workdir, max_bundle_bytes=args.max_bundle_bytes)
    state.workdir_lock = workdir_lock
    if json_logs is not None:
        json_logs.state = state
    metrics_port = None
    if args.metrics_port is not None:
        from agents.metrics import AgentMetrics, MetricsUnavailable, serve_metrics

        try:
            _, metrics_port = serve_metrics(
                AgentMetrics(state, service.AGENT_VERSION), args.host, args.metrics_port, token, tls
            )
        except (MetricsUnavailable, OSError, ValueError) as exc:
            print(f"error: metrics: {exc}", file=sys.stderr)
            return 2
        if args.metrics_port_file:  # written before the gRPC port file, which says the agent is up
            tmp = args.metrics_port_file.with_name(args.metrics_port_file.name + ".tmp")
            tmp.write_text(f"{metrics_port}\n")
            os.replace(tmp, args.metrics_port_file)
    try:
        server, port, calls = build_server(state, args.host, args.port, token, tls)
    except OSError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    server.start()
    if args.pid_file:  # the pid and its start time: a pid reused later (after a reboot) is not taken for us
        tmp = args.pid_file.with_name(args.pid_file.name + ".tmp")
        tmp.write_text(f"{os.getpid()} {process_start_time()}\n")
        os.replace(tmp, args.pid_file)
    if args.port_file:
        tmp = args.port_file.with_name(args.port_file.name + ".tmp")
        tmp.write_text(f"{port}\n")
        os.replace(tmp, args.port_file)
    log.info("agent serving on %s:%d, workdir %s (start %d here)", args.host, port, state.workdir, state.boots)
    if metrics_port is not None:
        log.info("metrics on http%s://%s:%d/metrics", "s" if tls else "", args.host, metrics_port)
    stop = threading.Event()
    threading.Thread(target=service.resume, args=(state, 5.0, stop), name="pp-resume", daemon=True).start()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    # Timed: a handler runs in the main thread only once it executes Python again, and a signal the kernel gave
    # another thread (gRPC's, onnxruntime's) does not wake an untimed wait (CI once saw an agent serve 30 s past
    # its SIGTERM); this way it drains within half a second of it, whichever thread took the signal.
    while not stop.wait(0.5):
        pass
    drain(server, state, args.grace, calls)
    return 0


# kinds of call their callers hold open for as long as they like: a draining agent cuts them once its frames
# are done and its other calls have ended, not after the whole grace period
HELD_OPEN = ("Watch", "Exchange", "InferStream")
SETTLE_S = 0.5


def drain(server: grpc.Server, state: service.AgentState, grace: float, calls: CallLimits | None = None) -> None:
    """Shut down without dropping work: refuse new calls and frames, let frames in flight and calls in progress
    finish (at most ``grace`` seconds), then stop the pipeline and the server (cutting the streams ``calls``
    counts as held open by their callers)."""
    log.info("draining: no new calls; waiting up to %.0fs for frames in flight", grace)
    deadline = time.monotonic() + grace
    pipeline = state.pipeline
    stopped = server.stop(grace=grace)  # new calls are refused now; calls in progress may finish
    if pipeline is not None:
        left = pipeline.drain(grace)
        if left:
            log.warning("%d frame(s) still in flight after %.0fs; they fail", left, grace)
    service.stop_pipeline(state, forget=False)  # it comes back when the agent starts again
    if calls is not None:
        # Calls that end by themselves (unary calls, uploads, a benchmark) may finish within the grace period;
        # streams their callers hold open (health watches, peers' exchanges) would hold the agent for all of
        # it: once the frames are done and the other calls have ended, they are cut
        while calls.busy(besides=HELD_OPEN) and time.monotonic() < deadline and not stopped.is_set():
            time.sleep(0.05)
        stopped.wait(min(SETTLE_S, max(0.0, deadline - time.monotonic())))  # the last replies go out
        server.stop(None)
    stopped.wait(max(0.0, deadline - time.monotonic()))
    log.info("agent stopped")


if __name__ == "__main__":
    sys.exit(main())
