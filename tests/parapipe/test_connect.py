"""``parapipe.connect``: an application reaches a deployed plan by address or by inventory board name."""

from __future__ import annotations

from contextlib import ExitStack
from pathlib import Path

import numpy as np
import pytest

import parapipe
from models.errors import ParapipeError
from parapipe.application import InferenceError
from parapipe.boards import Board, add_board
from tests.support.certs import make_certs
from tests.support.serving import compile_served, start_served

pytestmark = pytest.mark.agent
TOKEN = "app-token"


def _same(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> None:
    assert set(got) == set(want)  # by name (parapipe's own API sends them as they complete)
    for name, value in want.items():
        assert got[name].dtype == value.dtype and got[name].shape == value.shape
        assert np.max(np.abs(got[name].astype(np.float64) - value)) <= 1e-5, name


def test_connect_by_address_and_by_board_name_gives_the_full_models_outputs(
    tmp_path: Path,
    monkeypatch,
) -> None:
    monkeypatch.setenv("PARAPIPE_HOME", str(tmp_path / "home"))
    served = compile_served(tmp_path, two_hosts=False)
    frames = served.frames(5)
    certs = make_certs(tmp_path / "certs", ["127.0.0.1"])
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    with ExitStack() as stack:
        agent = start_served(stack, served, token=TOKEN, tls=(certs.cert, certs.key, certs.ca))
        address = f"127.0.0.1:{agent.port}"
        with parapipe.connect(address, token=TOKEN, tls_ca=certs.ca) as plan:
            assert plan.ready()
            _same(plan.infer(frames[0]), served.reference(frames[0]))
            for inputs, got in zip(frames, plan.stream(iter(frames)), strict=True):
                _same(got, served.reference(inputs))
            with pytest.raises(InferenceError, match="shape"):  # a frame of the wrong shape: a clear error
                plan.infer({**frames[0], "x": np.zeros((2, 16), np.float32)})
            assert plan.infer(frames[1])  # and the plan goes on
        # an inventory board reached directly (its token file and CA): by name, as the CLI reaches it
        add_board(
            Board(
                name="edge-1",
                host="",  # an agent-only board: reached at its address, no SSH
                port=22,
                user="",
                key="",
                device="local",
                agent_address=address,
                token_file=str(token_file),
                tls_ca=str(certs.ca),
            )
        )
        with parapipe.connect("edge-1") as plan:
            _same(plan.infer(frames[2]), served.reference(frames[2]))
        with pytest.raises(InferenceError, match="no agent answers"), parapipe.connect(address, timeout=2):
            pass  # plaintext to a TLS agent: nothing answers
    with pytest.raises(ParapipeError, match="no board 'nowhere'"):
        parapipe.connect("nowhere")
