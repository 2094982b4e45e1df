"""An agent is not opened to the network by accident: off loopback it wants a token (and warns without TLS)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from tests.support.certs import make_certs

GUARD_S = 30.0
ROOT = Path(__file__).resolve().parents[2]


def _serve(tmp_path: Path, *flags: str) -> tuple[int | None, str]:
    """Start ``python -m agents.server`` on every interface; (exit code or None if it came up serving, stderr)."""
    port_file = tmp_path / "port"
    port_file.unlink(missing_ok=True)
    argv = [sys.executable, "-m", "agents.server", "--host", "0.0.0.0", "--port", "0"]
    argv += ["--workdir", str(tmp_path / "work"), "--port-file", str(port_file), *flags]
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    stderr = tmp_path / "stderr"
    with open(stderr, "w") as fh:
        proc = subprocess.Popen(argv, stderr=fh, stdout=subprocess.DEVNULL, env=env)
    deadline = time.monotonic() + GUARD_S
    try:
        while proc.poll() is None and not port_file.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        code = proc.poll()
        assert code is not None or port_file.exists(), "the agent neither served nor exited"
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(GUARD_S)
    return code, stderr.read_text()


def test_no_token_on_a_network_address_refuses_to_start(tmp_path: Path) -> None:
    code, stderr = _serve(tmp_path)
    assert code == 2
    assert "refusing to serve on 0.0.0.0 without a token" in stderr
    assert "--token-file" in stderr and "--insecure" in stderr and "Traceback" not in stderr


def test_insecure_starts_without_a_token(tmp_path: Path) -> None:
    code, _ = _serve(tmp_path, "--insecure")
    assert code is None


def test_a_token_without_tls_warns_loudly(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("s3cret")
    code, stderr = _serve(tmp_path, "--token-file", str(token))
    assert code is None
    assert "WARNING" in stderr and "plaintext" in stderr


def test_a_token_with_tls_serves_quietly(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("s3cret")
    certs = make_certs(tmp_path / "certs", ["127.0.0.1"])
    code, stderr = _serve(
        tmp_path, "--token-file", str(token), "--tls-cert", str(certs.cert), "--tls-key", str(certs.key)
    )
    assert code is None
    assert "WARNING" not in stderr


def test_the_cli_refuses_too(tmp_path: Path) -> None:
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    argv = [sys.executable, "-m", "parapipe", "agent", "serve", "--host", "0.0.0.0", "--port", "0"]
    try:
        result = subprocess.run(
            [*argv, "--workdir", str(tmp_path / "w")], capture_output=True, text=True, env=env, timeout=GUARD_S
        )
    except subprocess.TimeoutExpired:
        raise AssertionError("parapipe agent serve --host 0.0.0.0 started serving without a token") from None
    assert result.returncode == 2 and "--insecure" in result.stderr
