"""Agent-to-agent links for plans over several hosts (edge + cloud).

Each link is one long-lived client stream (``Exchange``) to another host's agent, fed
from a queue by the workers that produce tensors that host reads; tensors never pass
through the host that deployed the plan. A link that breaks fails every frame that
needs it, with a message naming the peer, instead of hanging.

Every stream says which host sends it and which run of that host's pipeline (its
``epoch``): a peer that sees a new epoch from a host knows that host started its part
again (a crash, a restart) and starts its own part again too, so frame numbers agree.
The entry host's links also wait for the peer to be ready (its part running), so the
entry host takes frames only once every other part runs.

Board side: grpcio, numpy and the stdlib only.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import grpc
import numpy as np

from agents.proto import health_pb2, health_pb2_grpc
from agents.proto import parapipe_agent_pb2 as pb
from agents.proto import parapipe_agent_pb2_grpc as rpc
from agents.tensors import to_message

log = logging.getLogger("parapipe.agent.peers")
MAX_MESSAGE_BYTES = 64 * 1024 * 1024
STREAM_DEADLINE_S = 7 * 24 * 3600.0  # an Exchange stream lives as long as the pipeline; it still has a deadline
CONNECT_TIMEOUT_S = 10.0
# A peer that stops answering (frozen, powered off, cable pulled) breaks the link after about
# KEEPALIVE_S + KEEPALIVE_TIMEOUT_S instead of holding frames until the stream's deadline.
KEEPALIVE_S = float(os.environ.get("PARAPIPE_PEER_KEEPALIVE_S", "20"))
KEEPALIVE_TIMEOUT_S = float(os.environ.get("PARAPIPE_PEER_KEEPALIVE_TIMEOUT_S", "10"))
AGENT_SERVICE = "parapipe.agent.v1.Agent"  # the health service that is SERVING while a pipeline runs
SENDER_KEY = "parapipe-sender-bin"  # metadata of an Exchange stream: the sending host (utf-8)
EPOCH_KEY = "parapipe-epoch"  # and the run of its pipeline that sends it


class PeerError(RuntimeError):
    """Another host's agent cannot be reached, refused us, or the link broke."""


@dataclass(frozen=True)
class Peer:
    host: str
    address: str
    token: str = ""
    tls_ca: bytes = b""

    @classmethod
    def from_message(cls, m: pb.Peer) -> Peer:
        return cls(m.host, m.address, m.token, bytes(m.tls_ca))

    def to_message(self) -> pb.Peer:
        return pb.Peer(host=self.host, address=self.address, token=self.token, tls_ca=self.tls_ca)


def open_channel(address: str, tls_ca: bytes = b"") -> grpc.Channel:
    options = [
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ("grpc.keepalive_time_ms", int(KEEPALIVE_S * 1000)),
        ("grpc.keepalive_timeout_ms", int(KEEPALIVE_TIMEOUT_S * 1000)),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.max_pings_without_data", 0),
        ("grpc.http2.ping_timeout_ms", int(KEEPALIVE_TIMEOUT_S * 1000)),
    ]
    if tls_ca:
        return grpc.secure_channel(address, grpc.ssl_channel_credentials(root_certificates=tls_ca), options=options)
    return grpc.insecure_channel(address, options=options)


class _Link:
    def __init__(
        self,
        peer: Peer,
        lost: Callable[[int, str], None],
        on_broken: Callable[[str], None] | None = None,
        sender: tuple[str, str] = ("", ""),
        require_ready: bool = False,
    ) -> None:
        self.peer, self.lost, self.on_broken = peer, lost, on_broken
        self.require_ready = require_ready
        self.channel = open_channel(peer.address, peer.tls_ca)
        self.metadata = (("authorization", f"Bearer {peer.token}"),) if peer.token else ()
        self.stream_metadata = (*self.metadata, (SENDER_KEY, sender[0].encode()), (EPOCH_KEY, sender[1]))
        self.queue: queue.Queue[pb.Handoff | None] = queue.Queue()
        self.broken: str | None = None
        self.sent = 0
        self.thread = threading.Thread(target=self._run, name=f"pp-link-{peer.host}", daemon=True)

    def check(self) -> None:
        """Reach the peer and pass its token check before any frame depends on it (and, for the
        entry host, find the peer's part of the plan running)."""
        service = AGENT_SERVICE if self.require_ready else ""
        try:
            reply = health_pb2_grpc.HealthStub(self.channel).Check(
                health_pb2.HealthCheckRequest(service=service), timeout=CONNECT_TIMEOUT_S, metadata=self.metadata
            )
        except grpc.RpcError as exc:
            raise PeerError(
                f"cannot reach the agent of host {self.peer.host!r} at {self.peer.address}: "
                f"{exc.code().name}: {exc.details()}"  # type: ignore[attr-defined]
            ) from None
        if reply.status != health_pb2.HealthCheckResponse.SERVING:
            raise PeerError(
                f"the agent of host {self.peer.host!r} at {self.peer.address} answers, but its part of the plan "
                "is not running; start the other hosts' parts before the entry host's"
            )

    def _requests(self) -> Iterator[pb.Handoff]:
        """The stream's messages. gRPC reads them in a thread of its own, which waits here for the next
        one: this generator must end (``None`` in the queue) when the link closes *or breaks*, or that
        thread waits for ever and keeps the link, its channel and the whole stopped pipeline alive."""
        while self.broken is None:
            item = self.queue.get()
            if item is None:
                return
            yield item
            self.sent += 1

    def _run(self) -> None:
        try:
            rpc.AgentStub(self.channel).Exchange(
                self._requests(), timeout=STREAM_DEADLINE_S, metadata=self.stream_metadata
            )
        except grpc.RpcError as exc:
            code = exc.code()  # type: ignore[attr-defined]
            if code != grpc.StatusCode.CANCELLED:
                self.broken = (
                    f"the link to host {self.peer.host!r} ({self.peer.address}) failed: {code.name}: {exc.details()}"  # type: ignore[attr-defined]
                )
                log.error("%s", self.broken)
                if self.on_broken is not None:
                    self.on_broken(self.broken)
                self._drain()
        finally:
            # After the drain (which stops at a None): however the stream ended, its message generator
            # ends too, and with it gRPC's thread waiting in it for the next message.
            self.queue.put(None)

    def _drain(self) -> None:
        while True:
            try:
                item = self.queue.get_nowait()
            except queue.Empty:
                return
            if item is None:
                return
            self.lost(item.frame, self.broken or "link closed")

    def put(self, handoff: pb.Handoff) -> None:
        if self.broken is not None:
            self.lost(handoff.frame, self.broken)
            return
        self.queue.put(handoff)

    def close(self) -> None:
        self.queue.put(None)
        self.thread.join(5.0)
        self.channel.close()


class PeerLinks:
    """One stream per peer host.

    ``lost(frame, message)`` is called for each frame a broken link drops, ``on_broken(message)``
    once when a link breaks (frames already handed to that peer will not come back either).
    """

    def __init__(
        self,
        peers: dict[str, Peer],
        plan_bundle: str,
        lost: Callable[[int, str], None],
        on_broken: Callable[[str], None] | None = None,
        sender: tuple[str, str] = ("", ""),
        require_ready: bool = False,
    ) -> None:
        """``sender``: this host and its pipeline's epoch, sent with every stream; ``require_ready``:
        a peer counts as there only once its part of the plan runs (the entry host's links)."""
        self.plan_bundle = plan_bundle
        self._links = {host: _Link(peer, lost, on_broken, sender, require_ready) for host, peer in peers.items()}

    def start(self) -> None:
        try:
            for link in self._links.values():
                link.check()
        except PeerError:
            self.close(started=False)
            raise
        for link in self._links.values():
            link.thread.start()

    def send(self, host: str, frame: int, name: str, value: np.ndarray) -> None:
        self._links[host].put(pb.Handoff(plan_bundle=self.plan_bundle, frame=frame, tensor=to_message(name, value)))

    def send_error(self, host: str, frame: int, message: str) -> None:
        self._links[host].put(pb.Handoff(plan_bundle=self.plan_bundle, frame=frame, error=message))

    def send_entered(self, host: str, frame: int) -> None:
        self._links[host].put(pb.Handoff(plan_bundle=self.plan_bundle, frame=frame, entered=True))

    def close(self, started: bool = True) -> None:
        for link in self._links.values():
            if started and link.thread.is_alive():
                link.close()
            else:
                link.channel.close()

    def sent(self) -> dict[str, int]:
        return {host: link.sent for host, link in self._links.items()}
