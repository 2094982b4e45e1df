"""numpy arrays <-> ``Tensor`` messages, refusing anything malformed with a clear message."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np

from agents.proto import parapipe_agent_pb2 as pb

_DTYPES = {"float32", "float16", "float64", "int64", "int32", "int16", "int8", "uint8", "bool"}


class TensorError(ValueError):
    """A tensor message is not a valid array."""


def _contiguous(value: np.ndarray) -> np.ndarray:
    """C-contiguous, keeping 0-d arrays 0-d (``np.ascontiguousarray`` turns a scalar into shape [1])."""
    value = np.asarray(value)
    return value if value.flags.c_contiguous else value.copy(order="C")


def to_message(name: str, value: np.ndarray) -> pb.Tensor:
    value = _contiguous(value)
    return pb.Tensor(name=name, dtype=str(value.dtype), shape=list(value.shape), data=value.tobytes())


def from_message(t: pb.Tensor) -> np.ndarray:
    if t.dtype not in _DTYPES:
        raise TensorError(f"tensor {t.name!r}: unsupported dtype {t.dtype!r}")
    if any(d < 0 for d in t.shape):
        raise TensorError(f"tensor {t.name!r}: negative dimension in {list(t.shape)}")
    dtype = np.dtype(t.dtype)
    expected = int(np.prod(t.shape, dtype=np.int64)) * dtype.itemsize
    if len(t.data) != expected:
        raise TensorError(
            f"tensor {t.name!r}: {len(t.data)} bytes for shape {list(t.shape)} of {t.dtype} ({expected} expected)"
        )
    return np.frombuffer(t.data, dtype=dtype).reshape(tuple(t.shape))


def frame_message(frame_id: int, tensors: Mapping[str, np.ndarray]) -> pb.Frame:
    frame = pb.Frame(id=frame_id)
    for name, value in tensors.items():  # built in place: a Tensor made apart would be copied in again
        value = _contiguous(value)
        frame.tensors.add(name=name, dtype=str(value.dtype), shape=list(value.shape), data=value.tobytes())
    return frame


def frame_arrays(frame: pb.Frame) -> dict[str, np.ndarray]:
    names = [t.name for t in frame.tensors]
    if len(set(names)) != len(names):
        raise TensorError(f"frame {frame.id}: tensor names repeat: {names}")
    return {t.name: from_message(t) for t in frame.tensors}


def arrays_from(tensors: Iterable[pb.Tensor]) -> dict[str, np.ndarray]:
    return {t.name: from_message(t) for t in tensors}
