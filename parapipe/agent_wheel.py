"""Build the board-side part of parapipe as a wheel: ``agents`` plus the measuring core of ``profiler``.

Built deterministically (fixed timestamps, sorted entries), so the same code gives the
same bytes and hash, and a deploy with nothing changed uploads nothing.
"""

from __future__ import annotations

import base64
import hashlib
import io
import zipfile
from pathlib import Path

from agents.service import MIN_ORT_VERSION
from parapipe import __version__

ROOT = Path(__file__).resolve().parents[1]
BOARD_SIDE = [
    "agents",
    "profiler/__init__.py",
    "profiler/pinning.py",
    "profiler/measure.py",
    "profiler/energy.py",
    "profiler/runtime.py",
    "profiler/modulo.py",
]
# the protobuf range is pyproject's (the generated code's gencode; a test keeps them equal); onnxruntime from the
# oldest release the agent runs (older ones may read external data outside a bundle: the agent refuses them)
ORT_REQUIREMENT = "onnxruntime>=" + ".".join(map(str, MIN_ORT_VERSION))
REQUIRES = [ORT_REQUIREMENT, "grpcio>=1.63.2", "numpy", "psutil", "protobuf>=5.26.1,<8"]


def _files() -> list[tuple[str, bytes]]:
    out = []
    for entry in BOARD_SIDE:
        path = ROOT / entry
        paths = sorted(path.rglob("*.py")) if path.is_dir() else [path]
        out += [(p.relative_to(ROOT).as_posix(), p.read_bytes()) for p in paths if "__pycache__" not in p.parts]
    out.append(("agents/proto/parapipe_agent.proto", (ROOT / "agents/proto/parapipe_agent.proto").read_bytes()))
    return out


def build_wheel() -> tuple[str, bytes]:
    """(file name, bytes) of the board-side wheel; the version carries the content hash."""
    files = _files()
    digest = hashlib.sha256()
    for name, data in files:
        digest.update(name.encode() + b"\0" + data)
    version = f"{__version__}+{digest.hexdigest()[:12]}"
    dist = f"parapipe_agent-{version}"
    meta = (
        "Metadata-Version: 2.1\nName: parapipe-agent\n"
        f"Version: {version}\nSummary: parapipe board agent\n" + "".join(f"Requires-Dist: {r}\n" for r in REQUIRES)
    ).encode()
    wheel = b"Wheel-Version: 1.0\nGenerator: parapipe\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    entries = [*files, (f"{dist}.dist-info/METADATA", meta), (f"{dist}.dist-info/WHEEL", wheel)]
    record = []
    for name, data in entries:
        h = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).decode().rstrip("=")
        record.append(f"{name},sha256={h},{len(data)}")
    record.append(f"{dist}.dist-info/RECORD,,")
    entries.append((f"{dist}.dist-info/RECORD", ("\n".join(record) + "\n").encode()))
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in entries:
            info = zipfile.ZipInfo(name, date_time=(2026, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            zf.writestr(info, data)
    return f"{dist}-py3-none-any.whl", buf.getvalue()
