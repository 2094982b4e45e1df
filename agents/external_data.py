"""Where an ONNX model's tensors keep their data, read from the protobuf wire format (stdlib only).

The agent checks every external-data location itself before onnxruntime sees a model:
older onnxruntime releases follow ``../`` and absolute locations, and the board-side agent
cannot import ``onnx``. Only the messages that can hold tensors are walked; everything
else (weights included) is skipped by its length, so a large model costs one pass over
its framing, not a copy.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Iterator
from pathlib import Path, PurePosixPath

# message -> {field number: message type} for the fields that can lead to a TensorProto
_SCHEMA: dict[str, dict[int, str]] = {
    "Model": {7: "Graph", 20: "TrainingInfo", 25: "Function"},
    "TrainingInfo": {1: "Graph", 2: "Graph"},
    "Function": {7: "Node"},
    "Graph": {1: "Node", 5: "Tensor", 15: "SparseTensor"},
    "Node": {5: "Attribute"},
    "Attribute": {5: "Tensor", 6: "Graph", 10: "Tensor", 11: "Graph", 22: "SparseTensor", 23: "SparseTensor"},
    "SparseTensor": {1: "Tensor", 2: "Tensor"},
}
_TENSOR_NAME, _TENSOR_EXTERNAL, _TENSOR_LOCATION = 8, 13, 14
_MAX_DEPTH = 64


class ExternalDataError(ValueError):
    """A model keeps tensor data outside where it may."""


class _Malformed(ExternalDataError):
    """The bytes are not a protobuf message."""


def _varint(buf: memoryview, pos: int, end: int) -> tuple[int, int]:
    value, shift = 0, 0
    while True:
        if pos >= end or shift > 63:
            raise _Malformed("malformed model protobuf (a varint runs past its message)")
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, pos
        shift += 7


def _fields(buf: memoryview, pos: int, end: int) -> Iterator[tuple[int, int, int, int]]:
    """(field number, wire type, value or start, end) for each field of one message."""
    while pos < end:
        key, pos = _varint(buf, pos, end)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(buf, pos, end)
            yield number, wire, value, pos
        elif wire == 1:
            pos += 8
            yield number, wire, pos - 8, pos
        elif wire == 2:
            length, pos = _varint(buf, pos, end)
            if pos + length > end:
                raise _Malformed("malformed model protobuf (a field runs past its message)")
            yield number, wire, pos, pos + length
            pos += length
        elif wire == 5:
            pos += 4
            yield number, wire, pos - 4, pos
        elif wire == 3:  # a group (protobuf still parses them in unknown fields): skip to its end
            pos = _skip_group(buf, pos, end, number)
        else:
            raise _Malformed(f"malformed model protobuf (wire type {wire})")
    if pos != end:
        raise _Malformed("malformed model protobuf (a field runs past its message)")


def _skip_group(buf: memoryview, pos: int, end: int, number: int) -> int:
    depth = [number]
    while depth:
        key, pos = _varint(buf, pos, end)
        n, wire = key >> 3, key & 7
        if wire == 0:
            _, pos = _varint(buf, pos, end)
        elif wire == 1:
            pos += 8
        elif wire == 2:
            length, pos = _varint(buf, pos, end)
            pos += length
        elif wire == 5:
            pos += 4
        elif wire == 3:
            depth.append(n)
        elif wire == 4 and n == depth[-1]:
            depth.pop()
        else:
            raise _Malformed("malformed model protobuf (an unbalanced group)")
        if pos > end:
            raise _Malformed("malformed model protobuf (a group runs past its message)")
    return pos


def _tensor(buf: memoryview, start: int, end: int) -> tuple[str, bool, dict[str, str]]:
    name, external, entries = "", False, {}
    for number, wire, a, b in _fields(buf, start, end):
        if number == _TENSOR_NAME and wire == 2:
            name = bytes(buf[a:b]).decode(errors="replace")
        elif number == _TENSOR_LOCATION and wire == 0:
            external = a == 1
        elif number == _TENSOR_EXTERNAL and wire == 2:
            key = value = ""
            for n, w, x, y in _fields(buf, a, b):
                if w == 2 and n in (1, 2):
                    text = bytes(buf[x:y]).decode(errors="replace")
                    key, value = (text, value) if n == 1 else (key, text)
            entries[key] = value
    return name, external or bool(entries), entries


def external_locations(model: bytes | memoryview) -> list[tuple[str, str]]:
    """(tensor name, location) of every tensor of the model that keeps its data in another file."""
    with memoryview(model) as buf:
        return _walk(buf)


def _walk(buf: memoryview) -> list[tuple[str, str]]:
    found: list[tuple[str, str]] = []
    stack: list[tuple[str, int, int, int]] = [("Model", 0, len(buf), 0)]
    while stack:
        kind, start, end, depth = stack.pop()
        if depth > _MAX_DEPTH:
            raise ExternalDataError("the model nests graphs deeper than the agent reads")
        if kind == "Tensor":
            name, external, entries = _tensor(buf, start, end)
            if external:
                found.append((name, entries.get("location", "")))
            continue
        children = _SCHEMA[kind]
        for number, wire, a, b in _fields(buf, start, end):
            child = children.get(number)
            if child is not None and wire == 2:
                stack.append((child, a, b, depth + 1))
    return found


def check_external_data(model: bytes | Path, folder: Path | None, what: str) -> None:
    """Refuse a model whose external data lies outside ``folder`` (or any external data if ``folder``
    is None): an absolute location, a ``..`` part, or a link that resolves elsewhere.

    Bytes that are not a protobuf pass: onnxruntime's protobuf parser refuses them before it
    could read any external data, and says so in its own words."""
    try:
        if isinstance(model, Path):
            with open(model, "rb") as fh:
                if os.fstat(fh.fileno()).st_size == 0:
                    return
                with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
                    found = external_locations(mapped)
        else:
            found = external_locations(model)
    except _Malformed:
        return
    for tensor, location in found:
        if folder is None:
            raise ExternalDataError(
                f"{what}: tensor {tensor!r} keeps its data in {location!r}; a model sent to the agent must "
                "carry its weights inside"
            )
        parts = PurePosixPath(location.replace("\\", "/"))
        if not location or parts.is_absolute() or ".." in parts.parts or ":" in location:
            raise ExternalDataError(
                f"{what}: tensor {tensor!r} points its external data at {location!r}, outside the bundle"
            )
        root = folder.resolve()
        target = (folder / parts).resolve()
        if root not in target.parents:
            raise ExternalDataError(
                f"{what}: tensor {tensor!r}: external data {location!r} resolves outside the bundle"
            )
