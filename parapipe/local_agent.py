"""Start the embedded ``local`` board's agent as a child process on 127.0.0.1 and stop it again."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from agents.client import AgentClient, AgentError
from models.errors import ParapipeError


class DeployError(ParapipeError):
    """Getting a plan onto a board failed."""


class LocalAgent:
    """A child agent process; use as a context manager. ``client`` talks to it."""

    def __init__(
        self,
        workdir: Path | None = None,
        startup_timeout: float = 30.0,
        token: str | None = None,
        python: list[str] | None = None,
        extra_env: dict[str, str] | None = None,
        tls: tuple[Path, Path, Path] | None = None,
        metrics: bool = False,
    ) -> None:
        """``tls`` = (certificate, key, CA that signed it): the agent serves TLS, the client checks it.
        ``metrics``: the agent also serves Prometheus metrics on 127.0.0.1 (``metrics_port``)."""
        self._tmp = tempfile.TemporaryDirectory(prefix="parapipe-agent-")
        self.workdir = Path(workdir) if workdir else Path(self._tmp.name) / "work"
        self.timeout = startup_timeout
        self.token = token
        self.python = python or [sys.executable, "-m", "agents.server"]
        self.extra_env = extra_env or {}
        self.tls = tls
        self.process: subprocess.Popen | None = None
        self.client: AgentClient | None = None
        self.port = 0
        self.metrics = metrics
        self.metrics_port = 0
        self.log_path = Path(self._tmp.name) / "agent.log"

    def __enter__(self) -> LocalAgent:
        port_file = Path(self._tmp.name) / "port"
        root = Path(__file__).resolve().parents[1]
        env = {**os.environ, "PYTHONPATH": str(root) + os.pathsep + os.environ.get("PYTHONPATH", ""), **self.extra_env}
        argv = [*self.python, "--port", "0", "--workdir", str(self.workdir), "--port-file", str(port_file)]
        if self.token:
            token_file = Path(self._tmp.name) / "token"
            token_file.write_text(self.token)
            token_file.chmod(0o600)
            argv += ["--token-file", str(token_file)]
        if self.tls:
            argv += ["--tls-cert", str(self.tls[0]), "--tls-key", str(self.tls[1])]
        metrics_file = Path(self._tmp.name) / "metrics-port"
        if self.metrics:
            argv += ["--metrics-port", "0", "--metrics-port-file", str(metrics_file)]
        with open(self.log_path, "w") as log:
            self.process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + self.timeout
        while not port_file.exists():
            if self.process.poll() is not None or time.monotonic() > deadline:
                log_text = self.log_path.read_text()[-800:]
                self.__exit__()
                raise DeployError(f"the local agent did not start: {log_text}")
            time.sleep(0.05)
        self.port = int(port_file.read_text())
        if self.metrics:  # written before the port file
            self.metrics_port = int(metrics_file.read_text())
        self.client = AgentClient(
            f"127.0.0.1:{self.port}",
            token=self.token,
            tls=(self.tls[2].read_bytes(), None, None) if self.tls else None,
        )
        try:
            self.client.wait_serving(max(1.0, deadline - time.monotonic()))
        except AgentError as exc:
            self.__exit__()
            raise DeployError(f"the local agent never reported SERVING: {exc}") from None
        return self

    def __exit__(self, *exc: object) -> None:
        if self.client is not None:
            self.client.close()
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._tmp.cleanup()
