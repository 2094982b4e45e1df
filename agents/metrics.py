"""Prometheus metrics of the agent (``--metrics-port``, off by default): an HTTP endpoint bound to the
gRPC host, behind the same token and TLS as the gRPC API.

Needs ``prometheus_client`` (``pip install 'parapipe[metrics]'`` or ``prometheus-client`` on the board).
Frame counts, busy time and energy are read from the running pipeline when Prometheus scrapes, and
kept across pipelines (a new StartPipeline, a resume after a restart), so every counter only grows;
the frame latency histogram is fed by the pipeline as each frame completes.

| metric | kind | what |
| --- | --- | --- |
| ``parapipe_frames_completed_total`` | counter | frames whose outputs came back |
| ``parapipe_frames_failed_total`` | counter | frames that failed (a partition, a peer, a deadline, a stop) |
| ``parapipe_frame_latency_seconds`` | histogram | from a frame's entry to its last output |
| ``parapipe_partition_busy_seconds_total{partition,pu}`` | counter | time each partition spent running |
| ``parapipe_partition_frames_total{partition,pu}`` | counter | frames each partition ran to the end |
| ``parapipe_frames_in_flight`` | gauge | frames entered and not finished |
| ``parapipe_partition_queue_depth{partition,pu}`` | gauge | frames with inputs waiting at a partition |
| ``parapipe_pipeline_starts_total{how}`` | counter | pipelines started by a call (``started``) or brought back after a restart (``resumed``) |
| ``parapipe_pipeline_ready`` | gauge | 1 while a pipeline runs and can take frames |
| ``parapipe_agent_boots`` | gauge | times an agent started on this workdir |
| ``parapipe_energy_joules_total{source,sensor}`` | counter | ``measured`` by RAPL/hwmon (the whole package, idle included), else ``modelled``: the agent's busy CPU time at the power above idle (still while idle) |
| ``parapipe_agent_info{version,bundle,plan}`` | gauge | 1, labelled with what runs |
"""

from __future__ import annotations

import contextlib
import hmac
import logging
import os
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from agents import service
from agents.executor import Pipeline, WorkerStats
from profiler.energy import HWMON, POWERCAP, HwmonSensors, PowerModel, RaplCounter

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
MISSING = (
    "--metrics-port needs the prometheus_client package: pip install 'parapipe[metrics]' "
    "(or prometheus-client) into the agent's Python"
)


class MetricsUnavailable(RuntimeError):
    """prometheus_client is not installed."""


def _prometheus() -> Any:
    try:
        import prometheus_client
    except ImportError:
        raise MetricsUnavailable(MISSING) from None
    return prometheus_client


class _Energy:
    """Energy since the agent started: RAPL or hwmon counters where they exist (measured), else the
    running plan's power model over this process's busy CPU time (modelled), accumulated per scrape."""

    def __init__(self) -> None:
        self.rapl = RaplCounter(Path(os.environ.get("PARAPIPE_POWERCAP_ROOT") or POWERCAP))
        self.hwmon = HwmonSensors(Path(os.environ.get("PARAPIPE_HWMON_ROOT") or HWMON))
        self.joules = 0.0
        self._last_t = time.monotonic()
        self._last_busy = _process_cpu_seconds()
        self._last_rapl = self.rapl.read() if self.rapl.available() else []
        self._last_hw = self.hwmon.counters_uj()
        self._last_w = self.hwmon.watts() if self.hwmon.available() else 0.0

    def labels(self) -> tuple[str, str]:
        if self.rapl.available():
            return "measured", self.rapl.label()
        if self.hwmon.available():
            return "measured", self.hwmon.label()
        return "modelled", "power model: busy CPU time x the plan's power above idle"

    def update(self, pipeline: Pipeline | None) -> None:
        now, busy = time.monotonic(), _process_cpu_seconds()
        wall, busy_s = now - self._last_t, busy - self._last_busy
        if self.rapl.available():
            reading = self.rapl.read()
            self.joules += self.rapl.delta_joules(self._last_rapl, reading)
            self._last_rapl = reading
        elif self.hwmon.available():
            counters, watts = self.hwmon.counters_uj(), self.hwmon.watts()
            self.joules += sum(b - a for a, b in zip(self._last_hw, counters, strict=True)) / 1e6
            self.joules += (watts + self._last_w) / 2 * wall  # sampled power: trapezoid between scrapes
            self._last_hw, self._last_w = counters, watts
        elif pipeline is not None:  # the agent's work above idle: an idle agent's counter stands still
            active, idle, _ = pipeline.manifest.power
            self.joules += PowerModel(active, idle).busy_joules(busy_s)
        self._last_t, self._last_busy = now, busy


class AgentMetrics:
    """The agent's metrics registry; ``attach`` is the ``AgentState.on_pipeline`` hook."""

    def __init__(self, state: service.AgentState, version: str) -> None:
        prom = _prometheus()
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        self._counter, self._gauge = CounterMetricFamily, GaugeMetricFamily
        self.state, self.version = state, version
        self.registry = prom.CollectorRegistry()
        self.latency = prom.Histogram(
            "parapipe_frame_latency_seconds",
            "Latency of completed frames, from entry to the last output",
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self._lock = threading.Lock()
        self._live: list[Pipeline] = []  # pipelines whose counts may still grow
        self._retired = [0, 0]  # frames completed, failed by pipelines no longer live
        self._starts = {"started": 0, "resumed": 0}
        self._busy: dict[tuple[str, str], list[float]] = {}  # (partition, pu) -> [seconds, frames]
        self._seen: dict[int, tuple[WorkerStats, float, int]] = {}  # worker -> (stats object, busy, frames) read
        self._energy = _Energy()
        self.registry.register(self)
        state.on_pipeline = self.attach

    def attach(self, pipeline: Pipeline, resumed: bool) -> None:
        pipeline.on_done = self._observe
        with self._lock:
            self._fold()  # retire the stopped ones now, not at the next scrape: nobody may ever scrape
            self._live.append(pipeline)
            self._starts["resumed" if resumed else "started"] += 1

    def _observe(self, seconds: float) -> None:
        """A frame's latency; called by the pipeline as the frame completes, so it never raises."""
        try:
            self.latency.observe(seconds)
        except Exception:
            logging.getLogger("parapipe.agent").exception("metrics: cannot record a frame's latency")

    def _fold(self) -> tuple[int, int]:
        """Frames completed and failed in all, retiring stopped pipelines (their counts are final)."""
        done, failed = self._retired
        live = []
        for p in self._live:
            self._read_busy(p)
            if p.stopping and p is not self.state.pipeline:
                self._retired[0] += p.frames_done
                self._retired[1] += p.frames_failed
                for w in p.workers.values():
                    self._seen.pop(id(w), None)
            else:
                live.append(p)
            done, failed = done + p.frames_done, failed + p.frames_failed
        self._live = live
        return done, failed

    def _read_busy(self, pipeline: Pipeline) -> None:
        """Add what each partition ran since the last scrape (a benchmark resets a worker's stats:
        then what the new stats hold counts as new)."""
        for name, w in pipeline.workers.items():
            stats = w.stats
            seen = self._seen.get(id(w))
            busy0, frames0 = (seen[1], seen[2]) if seen is not None and seen[0] is stats else (0.0, 0)
            total = self._busy.setdefault((name, w.spec.pu), [0.0, 0])
            total[0] += max(0.0, stats.busy_s - busy0)
            total[1] += max(0, stats.frames - frames0)
            self._seen[id(w)] = (stats, stats.busy_s, stats.frames)

    def collect(self) -> Iterator[Any]:
        counter, gauge = self._counter, self._gauge
        pipeline = self.state.pipeline
        with self._lock:
            done, failed = self._fold()
            self._energy.update(pipeline)
            yield counter("parapipe_frames_completed", "Frames whose outputs came back", value=done)
            yield counter("parapipe_frames_failed", "Frames that failed", value=failed)
            busy = counter(
                "parapipe_partition_busy_seconds", "Time each partition spent running", labels=["partition", "pu"]
            )
            frames = counter(
                "parapipe_partition_frames", "Frames each partition ran to the end", labels=["partition", "pu"]
            )
            for (name, pu), (seconds, count) in sorted(self._busy.items()):
                busy.add_metric([name, pu], seconds)
                frames.add_metric([name, pu], count)
            yield busy
            yield frames
            starts = counter(
                "parapipe_pipeline_starts", "Pipelines started by a call or resumed after a restart", labels=["how"]
            )
            for how, n in self._starts.items():
                starts.add_metric([how], n)
            yield starts
            source, sensor = self._energy.labels()
            energy = counter(
                "parapipe_energy_joules",
                "Energy since the agent started: measured by a sensor, or modelled",
                labels=["source", "sensor"],
            )
            energy.add_metric([source, sensor], self._energy.joules)
            yield energy
        yield gauge("parapipe_frames_in_flight", "Frames entered and not finished", value=_in_flight(pipeline))
        depth = gauge(
            "parapipe_partition_queue_depth", "Frames with inputs waiting at a partition", labels=["partition", "pu"]
        )
        for name, w in pipeline.workers.items() if pipeline is not None else ():
            depth.add_metric([name, w.spec.pu], w.queue_depth())
        yield depth
        ready = pipeline is not None and not (pipeline.broken or pipeline.stopping or pipeline.draining)
        yield gauge("parapipe_pipeline_ready", "1 while a pipeline runs and can take frames", value=int(ready))
        yield gauge("parapipe_agent_boots", "Times an agent started on this workdir", value=self.state.boots)
        info = gauge("parapipe_agent_info", "The agent and what it runs", labels=["version", "bundle", "plan"])
        info.add_metric([self.version, self.state.running, pipeline.manifest.plan_name if pipeline else ""], 1)
        yield info


def _process_cpu_seconds() -> float:
    import psutil

    t = psutil.Process().cpu_times()
    return t.user + t.system


def _in_flight(pipeline: Pipeline | None) -> int:
    return pipeline.in_flight if pipeline is not None else 0


# scrapes served at once (a connection beyond is closed at once), and how long a connection may sit silent,
# TLS handshake included, before it is closed: nobody has shown the token yet, so neither may hold the agent
MAX_SCRAPES = 16
IDLE_S = 10.0


class _Quiet(WSGIRequestHandler):
    timeout = IDLE_S  # a silent connection (no request line, a stalled body) is dropped

    def log_message(self, format: str, *args: Any) -> None:  # scrapes are not news
        pass


class _Server(ThreadingMixIn, WSGIServer):
    """One thread per scrape, at most ``MAX_SCRAPES`` at once; TLS handshakes run in the scrape's thread with
    the idle timeout, never in the accepting one. When every place is taken, a new connection takes the place of
    the oldest one that has not sent its request yet (closed at once), so silent connections never keep a
    scraper out; only when every place holds a request being answered is the new one closed."""

    daemon_threads = True
    block_on_close = False
    request_queue_size = 64  # the listen backlog (5 by default: a burst of connections waited on SYN retries)
    tls: ssl.SSLContext | None = None

    def server_activate(self) -> None:
        super().server_activate()
        self.slots = threading.BoundedSemaphore(MAX_SCRAPES)
        self._silent: dict[int, tuple[float, Any]] = {}  # thread -> (accepted at, its socket): no request yet
        self._silent_lock = threading.Lock()

    def heard(self) -> None:
        """The calling scrape's request arrived: its place is no longer one a new connection may take."""
        with self._silent_lock:
            self._silent.pop(threading.get_ident(), None)

    def _evict_silent(self) -> bool:
        with self._silent_lock:
            if not self._silent:
                return False
            thread = min(self._silent, key=lambda t: self._silent[t][0])
            _, sock = self._silent.pop(thread)
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)  # its thread wakes with an error and gives its place back
        return True

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self.slots.acquire(blocking=False) and not (
            self._evict_silent() and self.slots.acquire(timeout=IDLE_S / 4)
        ):
            self.shutdown_request(request)  # every place answers a request: closed, not queued
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self.slots.release()
            raise

    def _silent_until_heard(self, sock: Any) -> None:
        with self._silent_lock:
            self._silent[threading.get_ident()] = (time.monotonic(), sock)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            self._silent_until_heard(request)
            if self.tls is not None:
                request.settimeout(IDLE_S)
                try:
                    request = self.tls.wrap_socket(request, server_side=True)
                except (OSError, ValueError):  # a failed or stalled handshake: nothing to answer
                    self.shutdown_request(request)
                    return
                self._silent_until_heard(request)  # the TLS socket now holds the connection
            super().process_request_thread(request, client_address)
        finally:
            self.heard()
            self.slots.release()

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that went away or stalled: not the agent's error, and no traceback in its log


class _Server6(_Server):
    address_family = socket.AF_INET6


def serve_metrics(
    metrics: AgentMetrics,
    host: str,
    port: int,
    token: str | None = None,
    tls: tuple[bytes, bytes, bytes | None] | None = None,
) -> tuple[WSGIServer, int]:
    """Serve ``/metrics`` on ``host:port`` (0 picks a port) in a daemon thread; returns the server and its port.

    With a token, a scrape must send ``Authorization: Bearer <token>`` (Prometheus: ``authorization:
    credentials_file``); with TLS it is HTTPS with the agent's certificate (and client certificates
    signed by its CA when the agent asks for them)."""
    app = _prometheus().make_wsgi_app(metrics.registry)
    expected = f"Bearer {token}" if token else None

    def guarded(environ: dict, start_response: Any) -> Any:
        httpd.heard()  # a request: this connection's place is no longer up for a new one
        # bytes: a header with non-ASCII characters (which WSGI hands over as latin-1) is a wrong token, not a 500
        sent = environ.get("HTTP_AUTHORIZATION", "").encode("latin-1", "replace")
        if expected is not None and not hmac.compare_digest(sent, expected.encode()):
            start_response("401 Unauthorized", [("Content-Type", "text/plain"), ("WWW-Authenticate", "Bearer")])
            return [b"missing or wrong token: send Authorization: Bearer <the agent's token>\n"]
        return app(environ, start_response)

    server_class = _Server6 if ":" in host else _Server
    httpd = make_server(host.strip("[]"), port, guarded, server_class, handler_class=_Quiet)
    if tls is not None:
        import tempfile

        cert, key, ca = tls
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        with tempfile.TemporaryDirectory() as tmp:  # ssl loads certificates from files only
            paths = [Path(tmp) / "cert.pem", Path(tmp) / "key.pem"]
            for path, data in zip(paths, (cert, key), strict=True):
                path.write_bytes(data)
                path.chmod(0o600)
            context.load_cert_chain(str(paths[0]), str(paths[1]))
        if ca is not None:
            context.load_verify_locations(cadata=ca.decode())
            context.verify_mode = ssl.CERT_REQUIRED
        httpd.tls = context  # each connection's handshake in its own thread (_Server.process_request_thread)
    threading.Thread(target=httpd.serve_forever, name="pp-metrics", daemon=True).start()
    return httpd, httpd.server_address[1]
