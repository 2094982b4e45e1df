"""Prometheus metrics of a real agent, scraped over HTTP while frames flow and parsed with
``prometheus_client``'s own parser: the counts are the frames the agent reports and the test sent."""

from __future__ import annotations

import os
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from parapipe.local_agent import LocalAgent
from tests.support.packages import folders_for, python_path
from tests.support.tiny import TABLE_ROWS, bundle_sha, frame, write_tiny_bundle

pytestmark = pytest.mark.agent
TOKEN = "metrics-token"


@pytest.fixture(scope="module")
def prometheus_env() -> dict[str, str]:
    """prometheus_client here and in the agent: the environment's, or installed outside it."""
    folders = folders_for("prometheus_client", "prometheus-client-0.26.0", "prometheus-client==0.26.0", no_deps=True)
    if not folders:
        return {}
    if str(folders[0]) not in sys.path:  # this process parses the scrapes
        sys.path.insert(0, str(folders[0]))
    return {"PYTHONPATH": python_path(*folders)}


def scrape(port: int, token: str | None = TOKEN) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of the agent's /metrics: (name, sorted labels) -> value."""
    from prometheus_client.parser import text_string_to_metric_families

    request = urllib.request.Request(f"http://127.0.0.1:{port}/metrics")
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    with urllib.request.urlopen(request, timeout=30) as reply:
        text = reply.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(samples, name: str, **labels: str) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


def total(samples, name: str) -> float:
    return sum(v for (n, _), v in samples.items() if n == name)


def test_scraped_counts_are_the_frames_that_flowed(tmp_path: Path, prometheus_env) -> None:
    folder = write_tiny_bundle(tmp_path / "b", stages=3, max_inflight=2)
    with LocalAgent(token=TOKEN, metrics=True, extra_env=prometheus_env) as agent:
        port = agent.metrics_port
        with pytest.raises(urllib.error.HTTPError) as refused:  # the same token as the gRPC API
            scrape(port, token=None)
        assert refused.value.code == 401
        before = scrape(port)
        assert value(before, "parapipe_frames_completed_total") == 0
        assert value(before, "parapipe_pipeline_ready") == 0
        agent.client.load_bundle(folder)
        agent.client.start(bundle_sha(folder))

        during = []
        idx = [0, 1, TABLE_ROWS, 2, 3, TABLE_ROWS + 1, 0, 1, 2, 3]  # two fail in stage 0

        def frames():
            for i, x in enumerate(idx):
                if i == len(idx) // 2:  # frames are flowing: scrape between two of them
                    during.append(scrape(port))
                yield frame(x)

        results = list(agent.client.infer_stream_results(frames()))
        ok = sum(not isinstance(r, Exception) for _, r in results)
        assert ok == len(idx) - 2
        middle = during[0]
        assert 0 <= value(middle, "parapipe_frames_completed_total") <= len(idx) // 2
        assert value(middle, "parapipe_frames_in_flight") >= 0
        assert value(middle, "parapipe_pipeline_ready") == 1

        after = scrape(port)
        status = agent.client.status()
        assert value(after, "parapipe_frames_completed_total") == ok == status.frames_done
        assert value(after, "parapipe_frames_failed_total") == 2 == status.frames_failed
        assert value(after, "parapipe_frame_latency_seconds_count") == ok
        assert value(after, "parapipe_frame_latency_seconds_sum") > 0
        assert value(after, "parapipe_frame_latency_seconds_bucket", le="+Inf") == ok
        for s in range(3):  # every partition ran every frame that did not fail
            ran = value(after, "parapipe_partition_frames_total", partition=f"s{s}", pu="cpu")
            assert ran == ok
            assert value(after, "parapipe_partition_busy_seconds_total", partition=f"s{s}", pu="cpu") > 0
            assert value(after, "parapipe_partition_queue_depth", partition=f"s{s}", pu="cpu") == 0
        assert value(after, "parapipe_frames_in_flight") == 0
        assert value(after, "parapipe_pipeline_starts_total", how="started") == 1
        assert value(after, "parapipe_pipeline_starts_total", how="resumed") == 0
        (energy,) = [labels for (n, labels), _ in after.items() if n == "parapipe_energy_joules_total"]
        assert dict(energy)["source"] in ("measured", "modelled")
        assert total(after, "parapipe_energy_joules_total") >= 0
        if dict(energy)["source"] == "modelled":  # an idle agent's modelled energy stands still (it grew 2 J/s)
            time.sleep(3.0)
            idle = total(scrape(port), "parapipe_energy_joules_total") - total(after, "parapipe_energy_joules_total")
            assert idle < 0.5, idle

        # a benchmark's frames (it resets the partitions' own counters) and a new start: nothing goes back
        reply = agent.client.benchmark(frames=10, warmup=1)
        agent.client.start(bundle_sha(folder))
        agent.client.infer(frame(1))
        last = scrape(port)
        status = agent.client.status()
        completed = value(last, "parapipe_frames_completed_total")
        assert completed >= ok + reply.frames + 1
        assert completed == value(last, "parapipe_frame_latency_seconds_count")
        assert status.frames_done == 1  # the new pipeline's own count; the metrics keep the old ones
        assert value(last, "parapipe_pipeline_starts_total", how="started") == 2
        for s in range(3):
            ran = value(last, "parapipe_partition_frames_total", partition=f"s{s}", pu="cpu")
            assert ran >= value(after, "parapipe_partition_frames_total", partition=f"s{s}", pu="cpu") + reply.frames
        for key, v in after.items():
            if key[0].endswith(("_total", "_count", "_sum")):
                assert last.get(key, 0) >= v, key


def test_metrics_are_off_by_default_and_need_prometheus_client(tmp_path: Path) -> None:
    with LocalAgent() as agent:
        assert agent.metrics_port == 0
        assert "metrics" not in agent.log_path.read_text()
    # without prometheus_client the agent says what to install and exits 2
    blocker = tmp_path / "no_prometheus"
    (blocker / "prometheus_client").mkdir(parents=True)
    (blocker / "prometheus_client" / "__init__.py").write_text("raise ImportError('not installed')\n")
    import subprocess

    env = dict(os.environ, PYTHONPATH=python_path(blocker))
    done = subprocess.run(
        [sys.executable, "-m", "agents.server", "--port", "0", "--workdir", str(tmp_path / "w"), "--metrics-port", "0"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert done.returncode == 2
    assert "parapipe[metrics]" in done.stderr and "Traceback" not in done.stderr


def test_agent_serve_takes_the_metrics_and_log_flags(tmp_path: Path, prometheus_env) -> None:
    """`parapipe agent serve --metrics-port 0 --log-format json`: metrics answer, the log is JSON lines."""
    import json
    import signal
    import subprocess
    import time

    from tests.support.cli import PARAPIPE

    env = {**os.environ, **prometheus_env}
    files = {k: tmp_path / k for k in ("port", "metrics-port", "log")}
    argv = [PARAPIPE, "agent", "serve", "--port", "0", "--workdir", str(tmp_path / "w")]
    argv += [
        "--port-file",
        str(files["port"]),
        "--metrics-port",
        "0",
        "--metrics-port-file",
        str(files["metrics-port"]),
    ]
    with open(files["log"], "w") as log:
        proc = subprocess.Popen([*argv, "--log-format", "json"], stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        deadline = time.monotonic() + 60
        while not files["port"].exists():
            assert proc.poll() is None and time.monotonic() < deadline, files["log"].read_text()
            time.sleep(0.05)
        samples = scrape(int(files["metrics-port"].read_text()), token=None)
        assert value(samples, "parapipe_frames_completed_total") == 0
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
    lines = [json.loads(line) for line in files["log"].read_text().splitlines() if line.strip()]
    assert any(line["event"].startswith("metrics on http://127.0.0.1:") for line in lines)
