"""The values a model is fed: sample data the user gives, or inputs generated from what the graph shows.

Real models need real values on some inputs: token ids must index their embedding
table, a sample-rate scalar must hold one of the rates an ``If`` tests for. An
``InputSpec`` says, for one graph input, its dtype and static shape and how frames
for it are made: taken from ``--input-data FILE.npz`` (``source="data"``), fixed
values found in the graph (``values``), an integer range (``low``/``high``), or plain
random numbers. The same spec travels in the plan and in the agent's bundle, so
profiling, ``run --verify`` and the board's benchmark all feed the model alike.

``tensor_values`` runs the model once in onnxruntime with every intermediate tensor
exposed: it gives the shapes ``onnx.shape_inference`` cannot, and the inputs of
every block for profiling.
"""

from __future__ import annotations

import zipfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx

from models.errors import ModelError

# Inputs with at most this many elements keep their sample values in plans and bundles.
SMALL_INPUT = 64


@dataclass(frozen=True)
class InputSpec:
    """One graph input: dtype, static shape and how its frames are made."""

    name: str
    dtype: str  # numpy dtype name
    shape: tuple[int, ...]
    low: float | None = None  # generated integers: inclusive lower bound
    high: float | None = None  # generated integers: exclusive upper bound
    values: tuple[float, ...] = ()  # fixed values (flattened), used for every frame
    source: str = "random"  # data | graph:<why> | random

    @property
    def generated(self) -> bool:
        return self.source != "data"

    def describe(self) -> str:
        dims = "x".join(map(str, self.shape)) or "scalar"
        if self.values:
            shown = ", ".join(f"{v:g}" for v in self.values[:4]) + (", …" if len(self.values) > 4 else "")
            how = f"= [{shown}]"
        elif self.high is not None:
            how = f"in [{self.low or 0:g}, {self.high:g})"
        else:
            how = "random normal" if self.dtype.startswith(("float", "bfloat")) else "random"
        return f"{self.name} {self.dtype}[{dims}] {how} ({self.source})"

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = {"name": self.name, "dtype": self.dtype, "shape": list(self.shape)}
        if self.low is not None:
            out["low"] = self.low
        if self.high is not None:
            out["high"] = self.high
        if self.values:
            out["values"] = list(self.values)
        out["source"] = self.source
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, object], where: str = "") -> InputSpec:
        try:
            shape = tuple(int(d) for d in data["shape"])  # type: ignore[union-attr]
            low, high = data.get("low"), data.get("high")
            return cls(
                name=str(data["name"]),
                dtype=str(np.dtype(str(data["dtype"]))),
                shape=shape,
                low=None if low is None else float(low),  # type: ignore[arg-type]
                high=None if high is None else float(high),  # type: ignore[arg-type]
                values=tuple(float(v) for v in data.get("values", ()) or ()),  # type: ignore[union-attr]
                source=str(data.get("source", "random")),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ModelError(f"{where}input spec {dict(data)!r} is malformed: {exc}") from None


def make_feeds(specs: Iterable[InputSpec], data: Mapping[str, np.ndarray] | None = None, seed: int = 0) -> dict:
    """One frame of inputs: the user's data where given, else values made by each spec."""
    rng = np.random.default_rng(seed)
    out: dict[str, np.ndarray] = {}
    for s in specs:
        if data is not None and s.name in data:
            out[s.name] = np.asarray(data[s.name]).astype(s.dtype, copy=False).reshape(s.shape)
        else:
            out[s.name] = generate(s, rng)
    return out


def generate(s: InputSpec, rng: np.random.Generator) -> np.ndarray:
    """Values for one spec (the agent's ``generate_inputs`` follows the same rules)."""
    if s.values:
        return np.array(s.values, dtype=np.float64).astype(s.dtype).reshape(s.shape)
    if s.dtype.startswith(("int", "uint")):
        lo = int(s.low) if s.low is not None else 0
        hi = int(s.high) if s.high is not None else 2
        return rng.integers(lo, max(hi, lo + 1), size=s.shape).astype(s.dtype)
    if s.dtype == "bool":
        return rng.integers(0, 2, size=s.shape).astype(bool)
    if s.low is not None and s.high is not None:
        return rng.uniform(s.low, s.high, size=s.shape).astype(s.dtype)
    return rng.standard_normal(s.shape).astype(s.dtype)


def load_input_data(path: str | Path) -> dict[str, np.ndarray]:
    """``--input-data FILE.npz``: arrays keyed by input name (no pickled objects)."""
    path = Path(path)
    if not path.is_file():
        raise ModelError(f"--input-data {path}: no such file; give an .npz with one array per model input")
    try:
        with np.load(path, allow_pickle=False) as npz:
            return {k: np.asarray(npz[k]) for k in npz.files}
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as exc:
        raise ModelError(
            f"--input-data {path} is not a readable .npz ({exc}); write it with numpy.savez(path, NAME=array, ...)"
        ) from None


def check_input_data(data: Mapping[str, np.ndarray], inputs: Mapping[str, tuple[str, int]]) -> None:
    """Every array names a model input and has its rank; ``inputs`` is name -> (dtype, rank or -1)."""
    unknown = sorted(set(data) - set(inputs))
    if unknown:
        raise ModelError(
            f"--input-data holds {', '.join(unknown)}, which the model does not read; its inputs are "
            f"{', '.join(inputs)}"
        )
    for name, arr in data.items():
        dtype, rank = inputs[name]
        if rank >= 0 and arr.ndim != rank:
            raise ModelError(f"--input-data {name!r} has rank {arr.ndim}; the model's input has rank {rank}")
        allowed = {"f": "fiub", "i": "iub", "u": "iub", "b": "b"}.get(np.dtype(dtype).kind, "fiub")
        if arr.dtype.kind not in allowed:
            raise ModelError(f"--input-data {name!r} holds {arr.dtype} values; the model wants {dtype}")


def graph_rules(model: onnx.ModelProto) -> dict[str, tuple[str, dict[str, float | tuple[float, ...]]]]:
    """What the graph says about its inputs' values: input -> (why, {"high": n} or {"values": (...)})."""
    g = model.graph
    inits = {t.name: t for t in g.initializer}
    consts: dict[str, np.ndarray] = {}
    for n in g.node:
        if n.op_type == "Constant":
            for a in n.attribute:
                if a.name == "value" and a.type == onnx.AttributeProto.TENSOR:
                    consts[n.output[0]] = onnx.numpy_helper.to_array(a.t)
    for name, t in inits.items():
        if np.prod(t.dims, dtype=np.int64) <= SMALL_INPUT:
            consts[name] = onnx.numpy_helper.to_array(t)
    dims: dict[str, list[int]] = {t.name: list(t.dims) for t in g.initializer}
    for vi in [*g.value_info, *g.output]:
        if vi.type.tensor_type.HasField("shape"):
            dims[vi.name] = [d.dim_value if d.HasField("dim_value") else -1 for d in vi.type.tensor_type.shape.dim]
    inputs = {i.name for i in g.input if i.name not in inits}
    # Follow each input through value-preserving ops (Cast, Reshape, Squeeze, ...) to where it is used.
    alias: dict[str, str] = {i: i for i in inputs}
    passthrough = {"Cast", "Identity", "Reshape", "Squeeze", "Unsqueeze", "Flatten", "Expand"}
    for n in g.node:
        if (n.op_type in passthrough or n.op_type in ("Gather", "Slice")) and n.input and n.input[0] in alias:
            for o in n.output:
                alias[o] = alias[n.input[0]]
    rules: dict[str, tuple[str, dict[str, float | tuple[float, ...]]]] = {}
    for n in g.node:
        if n.op_type == "Gather" and len(n.input) > 1 and n.input[1] in alias and n.input[0] not in alias:
            table = dims.get(n.input[0], [])
            axis = next((a.i for a in n.attribute if a.name == "axis"), 0)
            size = int(table[axis]) if -len(table) <= axis < len(table) else -1
            if size <= 0:
                continue
            src = alias[n.input[1]]
            prev = rules.get(src, ("", {}))[1].get("high")
            high = size if prev is None else min(size, float(prev))  # type: ignore[arg-type]
            rules[src] = (f"graph:indexes {n.input[0]}", {"high": high})
        elif n.op_type in ("Equal",) and len(n.input) == 2:
            a, b = n.input
            for var, const in ((a, b), (b, a)):
                if var in alias and const in consts and consts[const].size == 1 and alias[var] not in rules:
                    rules[alias[var]] = (
                        f"graph:compared with constant {const}",
                        {"values": (float(consts[const].item()),)},
                    )
    return rules


def input_specs(
    model: onnx.ModelProto,
    tensors: Mapping[str, tuple[str, tuple[int, ...]]],
    data: Mapping[str, np.ndarray] | None = None,
) -> tuple[InputSpec, ...]:
    """Specs for the model's graph inputs; ``tensors`` is input name -> (dtype, static shape)."""
    rules = graph_rules(model)
    specs = []
    for name, (dtype, shape) in tensors.items():
        if data is not None and name in data:
            arr = np.asarray(data[name])
            values = tuple(float(v) for v in arr.ravel()) if arr.size <= SMALL_INPUT else ()
            lo = hi = None
            if arr.size and arr.dtype.kind in "iu":
                lo, hi = float(arr.min()), float(arr.max()) + 1
            specs.append(InputSpec(name, dtype, shape, lo, hi, values, "data"))
            continue
        why, rule = rules.get(name, ("random", {}))
        if "values" in rule:
            vals = rule["values"]
            assert isinstance(vals, tuple)
            n = int(np.prod(shape, dtype=np.int64))
            specs.append(InputSpec(name, dtype, shape, values=tuple(vals) * n if len(vals) == 1 else vals, source=why))
        elif "high" in rule and dtype.startswith(("int", "uint")):
            high = rule["high"]
            assert isinstance(high, float | int)
            specs.append(InputSpec(name, dtype, shape, 0.0, float(high), source=why))
        else:
            specs.append(InputSpec(name, dtype, shape))
    return tuple(specs)


def tensor_values(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Every top-level tensor's value for one frame: the model run once, unoptimised, all outputs exposed."""
    import onnxruntime as ort

    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    have = {o.name for o in probe.graph.output}
    for node in probe.graph.node:
        for t in node.output:
            if t and t not in have:
                probe.graph.output.append(onnx.ValueInfoProto(name=t))
                have.add(t)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 4
    run_options = ort.RunOptions()
    run_options.log_severity_level = 4
    try:
        session = ort.InferenceSession(probe.SerializeToString(), options, providers=["CPUExecutionProvider"])
        names = [o.name for o in session.get_outputs()]
        results = session.run(names, dict(feeds), run_options)
    except Exception as exc:  # onnxruntime raises its own exception types (Fail, InvalidArgument, ...)
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelError(
            f"onnxruntime could not run the model with the inputs "
            f"{', '.join(f'{k}{list(np.shape(v))}' for k, v in feeds.items())}: {first}. "
            "Give sample inputs with --input-data FILE.npz (or other shapes with --input-shape)."
        ) from None
    values = dict(feeds)
    values.update(zip(names, results, strict=True))
    return values
