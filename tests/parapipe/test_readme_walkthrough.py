"""README.md's walkthrough and docs/serving.md's local example, run as written: every command, in order, with
``bash -e``, in a fresh folder with a fresh $PARAPIPE_HOME and the environment's ``parapipe`` first on the PATH."""

from __future__ import annotations

import os
import re
import subprocess
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

import parapipe
from planner.plan import load_plan
from tests.support.packages import folders_for, python_path

pytestmark = [pytest.mark.agent, pytest.mark.zoo]

ROOT = Path(__file__).resolve().parents[2]
WALKTHROUGH = "## Walkthrough"  # the README's heading; its first ```sh block is what a user pastes
SERVING_LOCAL = "## Try it on this machine"  # docs/serving.md's heading; its ```console block, `$ ` lines


def fenced_block(text: str, heading: str, lang: str) -> str:
    """The first ```lang block under ``heading`` (before the next heading of its level); fails when there is none."""
    lines = text.splitlines()
    assert heading in lines, f"no {heading!r} heading"
    level = heading.split(" ", 1)[0] + " "
    body = []
    for line in lines[lines.index(heading) + 1 :]:
        if line.startswith(level):
            break
        body.append(line)
    found = re.search(rf"^```{lang}\n(.*?)^```$", "\n".join(body) + "\n", re.S | re.M)
    assert found, f"no ```{lang} block under {heading!r}"
    return found.group(1)


def commands(script: str) -> list[str]:
    """The commands of a shell block: continuation lines joined, blank lines and comments left out."""
    joined = re.sub(r"\\\n\s*", " ", script)
    return [c.strip() for c in joined.splitlines() if c.strip() and not c.strip().startswith("#")]


def _env(home: Path) -> dict[str, str]:
    env = dict(os.environ, PARAPIPE_HOME=str(home))
    env["PATH"] = os.pathsep.join([str(ROOT / ".venv" / "bin"), env.get("PATH", "")])
    return env


def _bash(script: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", "-e", "-x"], input=script, capture_output=True, text=True, cwd=cwd, env=env, timeout=600
    )


@dataclass(frozen=True)
class Walked:
    folder: Path
    home: Path
    commands: list[str]
    done: subprocess.CompletedProcess[str]


@pytest.fixture(scope="module")
def walked(tmp_path_factory: pytest.TempPathFactory) -> Walked:
    script = fenced_block((ROOT / "README.md").read_text(), WALKTHROUGH, "sh")
    folder, home = tmp_path_factory.mktemp("walkthrough"), tmp_path_factory.mktemp("home")
    return Walked(folder, home, commands(script), _bash(script, folder, _env(home)))


def test_the_readme_walkthrough_runs_as_written(walked: Walked) -> None:
    done = walked.done
    assert done.returncode == 0, f"exit {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    traced = [line[2:] for line in done.stderr.splitlines() if line.startswith("+ ")]
    assert len(traced) == len(walked.commands) >= 4, traced  # bash ran every command, each one succeeded
    assert all(c.startswith("parapipe ") for c in walked.commands), walked.commands
    plans = walked.folder / "plans"
    assert {"latency.json", "throughput.json", "energy.json"} <= {p.name for p in plans.iterdir()}
    assert "outputs vs the full model" in done.stdout and ": ok" in done.stdout  # --verify checked them


def test_the_local_serving_example_runs_as_written(walked: Walked) -> None:
    """docs/serving.md's `deploy --board local`, in the walkthrough's folder; between its commands the agent is
    reached as the text says: parapipe.connect and plain HTTP metrics at the addresses deploy printed."""
    if walked.done.returncode != 0:
        pytest.fail("the README walkthrough failed, and this example needs its plans")
    block = fenced_block((ROOT / "docs" / "serving.md").read_text(), SERVING_LOCAL, "console")
    lines = [line[2:] for line in block.splitlines() if line.startswith("$ ")]
    assert any(" deploy " in c for c in lines) and any(" undeploy " in c for c in lines), lines
    env = _env(walked.home)
    # --metrics needs prometheus_client: the environment's, or one installed outside it
    env["PYTHONPATH"] = python_path(
        *folders_for("prometheus_client", "prometheus-client-0.26.0", "prometheus-client==0.26.0", no_deps=True)
    )
    served = 0
    try:
        for line in lines:
            done = _bash(line, walked.folder, env)
            assert done.returncode == 0, f"{line}: exit {done.returncode}\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
            said = "".join(done.stdout.split())  # the console wraps long lines
            address = re.search(r"at(127\.0\.0\.1:\d+)", said)
            if address is None:
                continue
            plan = load_plan(walked.folder / "plans" / "latency.json")
            frame = {s.name: np.zeros(s.shape, s.dtype) for s in plan.inputs}
            with parapipe.connect(address.group(1)) as connection:
                assert connection.infer(frame)
            metrics = re.search(r"metricsathttp://(127\.0\.0\.1:\d+)/metrics", said)
            assert metrics, done.stdout
            with urllib.request.urlopen(f"http://{metrics.group(1)}/metrics", timeout=30) as reply:
                assert "parapipe_frames_completed_total" in reply.read().decode()
            served += 1
        assert served == 1, "deploy did not say where it serves"
        assert not (walked.home / "local-agent").exists(), "undeploy left the local agent's folder"
    finally:
        if (walked.home / "local-agent" / "agent.json").exists():  # the example failed half-way: stop its agent
            subprocess.run(
                [str(ROOT / ".venv" / "bin" / "parapipe"), "undeploy", "--board", "local"],
                env=env,
                capture_output=True,
                timeout=120,
            )
