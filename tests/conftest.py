"""Shared fixtures (the zoo is exported once per test session) and the markers saying what tests need.

Markers (``pytest -m``): ``agent`` starts agent processes on 127.0.0.1, ``ssh`` a real
sshd on loopback, ``systemd`` a real systemd in namespaces of its own as a board (root),
``netns`` network namespaces (root), ``corpus`` fetches real models from public packages once, ``zoo`` exports zoo models with torch and works on them
(every test using the ``exported`` fixture). Unmarked tests are pure and small:
``make test-fast`` runs only those.
Modules whose every test needs the same thing are marked here, by path, so the
grouping is in one place.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from models.zoo import CORE as ZOO

USER_MODELS = Path(__file__).parent / "data" / "user_models.py"
HERE = Path(__file__).parent

NEEDS: dict[str, tuple[str, ...]] = {
    "agents/test_board_side.py": ("agent",),
    "agents/test_inference_protocol.py": ("agent",),
    "agents/test_metrics.py": ("agent",),
    "agents/test_exposure.py": ("agent",),
    "agents/test_reliability.py": ("agent",),
    "agents/test_uploads.py": ("agent",),
    "agents/test_multihost.py": ("agent",),
    "agents/test_server.py": ("agent",),
    "parapipe/test_cli_export.py": ("zoo",),
    "parapipe/test_cli_plan_run.py": ("agent",),
    "parapipe/test_deploy_ssh.py": ("ssh", "agent"),
    "parapipe/test_deploy_providers.py": ("ssh",),
    "parapipe/test_openvino.py": ("runtime", "agent", "corpus"),
    "parapipe/test_gpu.py": ("gpu", "agent", "corpus"),
    "parapipe/test_deploy_systemd.py": ("systemd", "ssh", "agent"),
    "parapipe/test_fleet.py": ("ssh", "agent"),
    "parapipe/test_known_hosts.py": ("ssh",),
    "parapipe/test_direct_boards.py": ("agent",),
    "parapipe/test_netns_edge_cloud.py": ("netns", "agent"),
    "parapipe/test_tune.py": ("agent",),
}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        rel = Path(str(item.fspath)).resolve().relative_to(HERE.resolve()).as_posix()
        for marker in NEEDS.get(rel, ()):
            item.add_marker(getattr(pytest.mark, marker))
        if "exported" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.zoo)


@pytest.fixture
def this_machines_crontab() -> Iterator[None]:
    """Held by a test whose board is this machine over the loopback sshd: every deploy there edits this
    machine's one crontab (root's), and some tests check it line by line, so such tests run one at a time
    across xdist workers (and pytest runs) under a lock of this machine's, not at once."""
    import tempfile

    from models.files import locked

    with locked(Path(tempfile.gettempdir()) / "parapipe-tests" / "this-machines-crontab"):
        yield


@pytest.fixture(scope="session")
def zoo_dir(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> Path:
    """One folder for the session's exports, shared by the xdist workers of one run (``-n 2``): each zoo model
    is exported once per run, not once per worker (an export takes torch 5-50 s here)."""
    if worker_id == "master":
        return tmp_path_factory.mktemp("zoo")
    shared = tmp_path_factory.getbasetemp().parent / "zoo"
    shared.mkdir(exist_ok=True)
    return shared


@pytest.fixture(scope="session")
def exported(zoo_dir: Path):
    """name -> ExportReport, exporting each zoo model the first time a test of this run asks for it (under a
    lock, so that another worker waits for the file and reads its report instead of exporting it again)."""
    import pickle

    from models.export import export_model
    from models.files import atomic_write, locked

    cache: dict[str, object] = {}

    def get(name: str):
        if name not in cache:
            path, report = zoo_dir / f"{name}.onnx", zoo_dir / f"{name}.report.pickle"
            with locked(path):
                if report.exists():
                    cache[name] = pickle.loads(report.read_bytes())
                else:
                    cache[name] = export_model(name, path)
                    atomic_write(report, pickle.dumps(cache[name]))
        return cache[name]

    return get


@pytest.fixture(scope="session")
def zoo_names() -> list[str]:
    return list(ZOO)
