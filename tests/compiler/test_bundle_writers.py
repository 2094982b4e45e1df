"""Writers of one bundle folder at once (threads of a fleet run, processes of several `run`s sharing the
bundle cache) take turns: every write succeeds, the folder is a whole bundle afterwards, and no scratch
folder is left behind."""

from __future__ import annotations

import multiprocessing
import threading
from pathlib import Path
from types import SimpleNamespace

from agents.bundle import MANIFEST, parse_manifest, verify_bundle
from compiler import write_bundle
from tests.support.tiny import write_tiny_bundle


def _compiled(source: Path) -> SimpleNamespace:
    """What ``write_bundle`` reads of a compiled plan: its manifest and files."""
    manifest = parse_manifest((source / MANIFEST).read_text())
    return SimpleNamespace(
        manifest=manifest, files={p.file: (source / p.file).read_bytes() for p in manifest.partitions}
    )


def _write_many(source: str, folder: str, times: int) -> None:
    compiled = _compiled(Path(source))
    for _ in range(times):
        write_bundle(compiled, Path(folder))  # type: ignore[arg-type]


def test_concurrent_writers_of_one_bundle_take_turns(tmp_path) -> None:
    source = write_tiny_bundle(tmp_path / "source", stages=3)
    folder = tmp_path / "cache" / "bundle"
    errors: list[BaseException] = []

    def thread_writer() -> None:
        try:
            _write_many(str(source), str(folder), 15)
        except BaseException as exc:
            errors.append(exc)

    context = multiprocessing.get_context("spawn")
    processes = [context.Process(target=_write_many, args=(str(source), str(folder), 15)) for _ in range(3)]
    threads = [threading.Thread(target=thread_writer) for _ in range(3)]
    for p in processes:
        p.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for p in processes:
        p.join(120)
    assert not errors, errors
    assert all(p.exitcode == 0 for p in processes)
    verify_bundle(folder)  # every file there, with its hash
    left = sorted(p.name for p in folder.parent.iterdir() if p.name != "bundle" and not p.name.endswith(".lock"))
    assert left == [], f"scratch folders left behind: {left}"
