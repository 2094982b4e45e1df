"""Two "boards" with their own network stacks on this machine: network namespaces on a bridge.

``two_hosts()`` makes namespaces ``edge`` and ``cloud`` with addresses 10.213.N.1 and
10.213.N.2 on a bridge whose root-namespace address is 10.213.N.254 (the host), and
shapes each namespace's egress with a tbf qdisc. Everything is removed on exit.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass


@dataclass(frozen=True)
class Net:
    edge_ns: str
    cloud_ns: str
    edge_ip: str
    cloud_ip: str
    host_ip: str


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True, timeout=30)


def netns_unavailable() -> str | None:
    if os.geteuid() != 0:
        return "network namespaces need root"
    if not shutil.which("ip") or not shutil.which("tc"):
        return "needs iproute2 (ip, tc)"
    probe = f"ppprobe{os.getpid() % 100000}"
    try:
        _ip("netns", "add", probe)
    except subprocess.CalledProcessError as exc:
        return f"cannot create a network namespace: {exc.stderr.strip()}"
    _ip("netns", "del", probe)
    return None


@contextmanager
def two_hosts(rate: str = "200mbit") -> Iterator[Net]:
    n = os.getpid() % 250 + 1
    tag = f"{os.getpid() % 100000}"
    net = Net(f"ppedge{tag}", f"ppcloud{tag}", f"10.213.{n}.1", f"10.213.{n}.2", f"10.213.{n}.254")
    bridge = f"ppbr{tag}"
    made: list[tuple[str, ...]] = []
    try:
        for ns in (net.edge_ns, net.cloud_ns):
            _ip("netns", "add", ns)
            made.append(("netns", "del", ns))
        _ip("link", "add", bridge, "type", "bridge")
        made.append(("link", "del", bridge))
        _ip("addr", "add", f"{net.host_ip}/24", "dev", bridge)
        _ip("link", "set", bridge, "up")
        for ns, addr, veth in ((net.edge_ns, net.edge_ip, f"ppe{tag}"), (net.cloud_ns, net.cloud_ip, f"ppc{tag}")):
            _ip("link", "add", veth, "type", "veth", "peer", "name", f"{veth}b")
            _ip("link", "set", veth, "netns", ns)
            _ip("link", "set", f"{veth}b", "master", bridge)
            _ip("link", "set", f"{veth}b", "up")
            _ip("-n", ns, "addr", "add", f"{addr}/24", "dev", veth)
            _ip("-n", ns, "link", "set", veth, "up")
            _ip("-n", ns, "link", "set", "lo", "up")
            subprocess.run(
                ["tc", "-n", ns, "qdisc", "add", "dev", veth, "root", "tbf", "rate", rate, "burst", "64kb",
                 "latency", "100ms"],
                check=True, capture_output=True, timeout=30,
            )  # fmt: skip
        yield net
    finally:
        for args in reversed(made):
            subprocess.run(["ip", *args], capture_output=True, timeout=30)
