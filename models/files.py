"""Writing files so that readers never see half of one and concurrent writers never lose each other's work.

``atomic_write`` writes through a uniquely named temporary file in the same folder,
flushes it to disk and renames it over the target (one ``rename`` is atomic on POSIX).
``locked`` serialises read-modify-write cycles (cost tables, inventories) between
processes with an advisory ``flock`` on a lock file beside the target.
"""

from __future__ import annotations

import fcntl
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def atomic_write(path: str | Path, data: bytes | str, mode: int = 0o644) -> Path:
    """Replace ``path`` with ``data`` in one step (text is written as UTF-8)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data.encode() if isinstance(data, str) else data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


@contextmanager
def locked(path: str | Path) -> Iterator[None]:
    """Hold an exclusive lock for ``path`` (on ``.<name>.lock`` beside it) for the ``with`` block."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(f".{path.name}.lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
