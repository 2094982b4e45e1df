"""Names from a model file never reach the filesystem as they are.

ONNX node and tensor names are arbitrary strings (``/model.0/conv/Conv``, ``..``,
spaces, 300 characters, non-ASCII). ``safe_name`` maps any of them to a file-name
component that is readable (the safe characters are kept), stable (the same name
always maps to the same result, in every process) and collision-free (a name that
had to change carries a hash of the original, so two different names never meet).
The ONNX names themselves stay in partitions, manifests and reports.
"""

from __future__ import annotations

import hashlib
import re

_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")
MAX_LEN = 96


def safe_name(name: str, max_len: int = MAX_LEN) -> str:
    """A file-name component for ``name``: ``[A-Za-z0-9_.-]``, no leading dot, at most ``max_len`` characters.

    A name that is already safe and short is returned unchanged; any other gets
    ``-<10 hex digits of its sha256>`` appended, so the mapping is injective in practice.
    """
    if max_len < 24:
        raise ValueError("max_len must leave room for the hash suffix (>= 24)")
    cleaned = _UNSAFE.sub("_", name).strip("_")
    cleaned = cleaned.lstrip(".")
    if cleaned == name and 0 < len(name) <= max_len and name not in (".", ".."):
        return name
    digest = hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:10]
    stem = cleaned[: max_len - 11].rstrip(".") or "n"
    return f"{stem}-{digest}"
