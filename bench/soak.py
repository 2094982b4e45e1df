"""Soak: frames through a 3-stage plan on a supervised local agent that is SIGKILLed every ~2 minutes.

The agent runs under the same restart loop ``deploy`` puts on boards (parapipe.deploy's
supervisor script): after a SIGKILL it is started again and resumes its last pipeline by
itself. Frames go in at a steady rate (unary Infer calls, a few in flight); every ~30 s
one bad frame (token ids far outside the embedding table) fails in stage 0. Reported at
the end: frames sent / completed / failed / lost (lost = neither completed nor reported
failed; must be 0), the longest time without a completed frame, and each agent
incarnation's resident memory one minute after its start and at its peak.

The 3 stages: core 0, core 1, and a third unit that onnxruntime runs unpinned (this
machine has two cores; a profile cannot give one core to two PUs).

Run: .venv/bin/python bench/soak.py [--minutes 10] [--kill-every 120] [--bad-every 30] [--fps 20]
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np

from agents.client import AgentClient, AgentError
from compiler import compile_plan, write_bundle
from device_profiles.loader import parse_profile
from models.coarsen import coarsen
from models.graph import build_graph
from models.onnx_io import load_onnx
from parapipe.deploy import _SUPERVISOR, SUPERVISOR_NAME
from planner.baselines import flop_pipeline

ROOT = Path(__file__).resolve().parents[1]


def _q(v: float) -> dict:
    return {"value": v, "source": "estimate", "cite": "soak test profile"}


def soak_profile():
    base = {
        "execution_provider": "CPUExecutionProvider",
        "peak_gflops": {k: _q(10.0) for k in ("conv", "depthwise", "matmul", "elementwise", "pooling", "other")},
        "memory_bandwidth_gbps": _q(10.0),
        "memory_bytes": _q(8e9),
        "launch_overhead_us": _q(5.0),
        "active_power_w": _q(5.0),
        "idle_power_w": _q(1.0),
    }
    pus = [
        dict(base, kind="cpu", name="s0", cores=[0]),
        dict(base, kind="cpu", name="s1", cores=[1]),
        dict(base, kind="gpu", name="s2", cores=[]),
    ]
    links = [
        {"a": a, "b": b, "bandwidth_gbps": _q(10.0), "latency_us": _q(2.0)}
        for a, b in (("s0", "s1"), ("s1", "s2"), ("s0", "s2"))
    ]
    return parse_profile({"schema_version": 1, "name": "soak3", "pus": pus, "links": links})


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def agent_pid(pid_file: Path) -> int | None:
    try:
        return int(pid_file.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--kill-every", type=float, default=120.0)
    parser.add_argument("--bad-every", type=float, default=30.0)
    parser.add_argument("--fps", type=float, default=20.0)
    parser.add_argument("--zoo-dir", type=Path, default=Path("build/bench/zoo"))
    args = parser.parse_args()
    path = args.zoo_dir / "bert_tiny.onnx"
    if not path.exists():
        from models.export import export_model

        export_model("bert_tiny", path)
    loaded = load_onnx(path)
    graph = build_graph(loaded.proto, loaded.sha256, "bert_tiny")
    profile = soak_profile()
    plan = flop_pipeline(coarsen(graph, "coarse"), profile, [("s0", 1), ("s1", 1), ("s2", 1)], name="soak-3-stages")
    work = Path(tempfile.mkdtemp(prefix="parapipe-soak-"))
    bundle = write_bundle(compile_plan(plan, loaded, graph, profile), work / "bundle")
    port, pid_file, sup_file = free_port(), work / "agent.pid", work / "supervisor.pid"
    agent = [sys.executable, "-m", "agents.server", "--host", "127.0.0.1", "--port", str(port)]
    agent += ["--workdir", str(work / "agent"), "--pid-file", str(pid_file), "--port-file", str(work / "port")]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    log = open(work / "agent.log", "w")
    supervisor = subprocess.Popen(
        ["sh", "-c", _SUPERVISOR, SUPERVISOR_NAME, str(sup_file), *agent], stdout=log, stderr=subprocess.STDOUT, env=env
    )
    client = AgentClient(f"127.0.0.1:{port}", timeout=10)
    client.wait_serving(60)
    reply = client.load_bundle(bundle)
    client.start(reply.bundle_sha256)
    print(f"# soak: 3-stage bert_tiny plan, {args.minutes:g} min, SIGKILL every {args.kill_every:g} s, bad frame every "
          f"{args.bad_every:g} s, {args.fps:g} frames/s; agent under {shlex.join(['sh', '-c', '<restart loop>', SUPERVISOR_NAME])}", flush=True)  # fmt: skip

    rng = np.random.default_rng(0)
    good = {"input_ids": rng.integers(0, 1024, size=(1, 128)).astype(np.int64)}
    bad = {"input_ids": np.full((1, 128), 10**6, dtype=np.int64)}
    lock = threading.Lock()
    counts = {"sent": 0, "completed": 0, "failed": 0, "bad_sent": 0, "bad_failed": 0}
    errors: dict[str, int] = {}
    last_done = [time.monotonic()]
    longest_gap = [0.0]

    def one(frame: dict, is_bad: bool) -> None:
        try:
            client.infer(frame)
            with lock:
                counts["completed"] += 1
                now = time.monotonic()
                longest_gap[0] = max(longest_gap[0], now - last_done[0])
                last_done[0] = now
        except AgentError as exc:
            with lock:
                counts["failed"] += 1
                counts["bad_failed"] += is_bad
                key = (exc.code.name if exc.code else "?") + (" (bad frame)" if is_bad else "")
                errors[key] = errors.get(key, 0) + 1

    incarnations: dict[int, dict[str, float]] = {}  # pid -> started, rss at 1 min, peak after
    start = time.monotonic()
    end = start + args.minutes * 60
    next_kill, next_bad, kills = start + args.kill_every, start + args.bad_every, 0
    with ThreadPoolExecutor(max_workers=4) as pool:
        tick = start
        while time.monotonic() < end:
            now = time.monotonic()
            pid = agent_pid(pid_file)
            if pid:
                inc = incarnations.setdefault(pid, {"started": now, "rss_1min": 0.0, "peak_after": 0.0})
                rss = rss_kib(pid)
                if now - inc["started"] >= 60 and not inc["rss_1min"]:
                    inc["rss_1min"] = rss
                if inc["rss_1min"]:
                    inc["peak_after"] = max(inc["peak_after"], rss)
            if now >= next_kill and pid:
                os.kill(pid, signal.SIGKILL)
                kills += 1
                next_kill += args.kill_every
            is_bad = now >= next_bad
            if is_bad:
                next_bad += args.bad_every
            with lock:
                counts["sent"] += 1
                counts["bad_sent"] += is_bad
            pool.submit(one, bad if is_bad else good, is_bad)
            tick += 1.0 / args.fps
            time.sleep(max(0.0, tick - time.monotonic()))
    client.close()
    supervisor.send_signal(signal.SIGTERM)
    pid = agent_pid(pid_file)
    if pid:
        os.kill(pid, signal.SIGTERM)
    supervisor.wait(30)
    log.close()
    lost = counts["sent"] - counts["completed"] - counts["failed"]
    restarts = (work / "agent.log").read_text().count("restarting it")
    print(f"frames sent {counts['sent']}, completed {counts['completed']}, failed {counts['failed']}, lost {lost}")
    print(f"bad frames sent {counts['bad_sent']}, reported failed {counts['bad_failed']}")
    print("failures by status: " + ", ".join(f"{k} {v}" for k, v in sorted(errors.items())))
    print(f"SIGKILLs {kills}, restarts by the supervisor {restarts}")
    print(f"longest time without a completed frame: {longest_gap[0]:.2f} s")
    for pid, inc in incarnations.items():
        if inc["rss_1min"]:
            growth = (inc["peak_after"] / inc["rss_1min"] - 1) * 100
            print(f"agent pid {pid}: RSS {inc['rss_1min'] / 1024:.1f} MiB at 1 min, peak after {inc['peak_after'] / 1024:.1f} MiB "
                  f"({growth:+.1f}%)")  # fmt: skip
        else:
            print(f"agent pid {pid}: lived under a minute")
    print(f"lost must be 0: {'OK' if lost == 0 else 'FAILED'}")


if __name__ == "__main__":
    main()
