"""Intake of user ONNX files: every way a file can be unusable becomes a ``ModelError``.

``load_onnx`` refuses garbage and truncated files, models failing the checker,
external data that points outside the model's folder, opsets newer than the
installed onnxruntime runs, and dynamic dimensions with no shape given. What it
returns has static input shapes, inferred shapes for every tensor and a unique name
on every node, so everything downstream may rely on those.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from google.protobuf.message import DecodeError
from onnx import TensorProto, helper

from models.errors import ModelError
from models.files import atomic_write
from models.graph import all_reads, subgraphs
from models.inputs import InputSpec, check_input_data, input_specs, load_input_data, make_feeds, tensor_values

_MAX_PROTO_BYTES = 2**31 - 1


@dataclass(frozen=True)
class LoadedModel:
    """A validated model with static shapes, and what identifies it.

    ``sha256`` identifies the model *as planned*: the hash of the file(s) when the file's
    inputs are static, else the hash of the file(s) and the input shapes fixed for it (a
    dynamic detector planned at 640x640 is another model from the same file at 320x320).
    ``file_sha256`` is the files' hash alone. ``inputs`` says how frames are made for each
    input, ``shape_sources`` where each tensor's shape came from (``onnx`` shape inference
    or one ``onnxruntime`` run).
    """

    path: Path
    proto: onnx.ModelProto
    sha256: str
    file_sha256: str = ""
    inputs: tuple[InputSpec, ...] = ()
    shape_sources: Mapping[str, str] = field(default_factory=dict, compare=False, repr=False)
    input_data: Mapping[str, np.ndarray] | None = field(default=None, compare=False, repr=False)
    notes: tuple[str, ...] = ()  # what intake assumed or let pass, for the user to read
    runnable: onnx.ModelProto | None = field(default=None, compare=False, repr=False)

    @property
    def ort_proto(self) -> onnx.ModelProto:
        """The model to hand to onnxruntime: ``proto``, except that a model with control flow keeps the input
        declarations of its file (ORT type-checks ``If`` branches against concrete shapes that the branch
        not taken cannot meet) and no intermediate shapes."""
        return self.runnable if self.runnable is not None else self.proto

    @property
    def input_shapes(self) -> dict[str, tuple[int, ...]]:
        return {s.name: s.shape for s in self.inputs}

    def feeds(self, seed: int = 0) -> dict[str, np.ndarray]:
        """One frame: the user's sample data where given, generated values elsewhere."""
        return make_feeds(self.inputs, self.input_data, seed)


def parse_shape(text: str, allow_scalar: bool = False) -> tuple[int, ...]:
    """``"1,3,224,224"`` -> ``(1, 3, 224, 224)``; every dimension a positive integer (``""`` a scalar if allowed)."""
    if allow_scalar and not text.strip():
        return ()
    try:
        dims = tuple(int(d) for d in text.replace("x", ",").split(",") if d.strip())
    except ValueError:
        raise ModelError(f"bad shape {text!r}: give comma-separated positive integers, e.g. 1,3,224,224") from None
    if not dims or any(d <= 0 for d in dims):
        raise ModelError(f"bad shape {text!r}: give comma-separated positive integers, e.g. 1,3,224,224")
    return dims


def parse_input_shapes(values: list[str] | None) -> dict[str, tuple[int, ...]] | None:
    """CLI form ``[name=]1,3,224,224`` (repeatable; ``name=`` alone is a scalar) -> {name or "": shape}."""
    if not values:
        return None
    shapes: dict[str, tuple[int, ...]] = {}
    for value in values:
        name, sep, dims = value.rpartition("=")
        if sep and not name:
            raise ModelError(f"bad --input-shape {value!r}: give NAME=DIMS, e.g. x=1,3,224,224 (or sr= for a scalar)")
        shapes[name if sep else ""] = parse_shape(dims, allow_scalar=bool(sep))
    return shapes


@functools.lru_cache(maxsize=1)
def max_ort_opset() -> int:
    """The newest default-domain opset the installed onnxruntime accepts, found by probing."""
    import onnxruntime as ort

    def accepts(version: int) -> bool:
        x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])
        y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])
        graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "probe", [x], [y])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", version)], ir_version=8)
        options = ort.SessionOptions()
        options.log_severity_level = 4
        try:
            ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        except Exception:
            return False
        return True

    lo, hi = 7, 64  # lo is accepted by every onnxruntime we support; hi by none
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if accepts(mid) else (lo, mid)
    return lo


def _tensors_with_data(graph: onnx.GraphProto) -> Iterator[TensorProto]:
    yield from graph.initializer
    for node in graph.node:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.TENSOR:
                yield attr.t
            elif attr.type == onnx.AttributeProto.GRAPH:
                yield from _tensors_with_data(attr.g)
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for g in attr.graphs:
                    yield from _tensors_with_data(g)


def _external_files(model: onnx.ModelProto, folder: Path) -> list[Path]:
    """Check every external-data location stays inside the model's folder; return the files."""
    root = folder.resolve()
    files: list[Path] = []
    for tensor in _tensors_with_data(model.graph):
        if tensor.data_location != TensorProto.EXTERNAL:
            continue
        location = next((e.value for e in tensor.external_data if e.key == "location"), "")
        if not location:
            raise ModelError(f"tensor {tensor.name!r} is stored externally but names no location")
        rel = Path(location)
        if rel.is_absolute() or ".." in rel.parts:
            raise ModelError(
                f"tensor {tensor.name!r} points its external data at {location!r}, outside the model's folder; "
                "only files beside the model are read. Re-save the model with its data in its folder."
            )
        target = (folder / rel).resolve()
        if not target.is_relative_to(root):
            raise ModelError(
                f"tensor {tensor.name!r}: external data {location!r} resolves to {target}, outside {root} "
                "(a symlink?); copy the data file into the model's folder"
            )
        if not target.is_file():
            raise ModelError(f"tensor {tensor.name!r}: external data file {location!r} is missing beside the model")
        if target not in files:
            files.append(target)
    return files


def _file_hash(paths: list[Path]) -> str:
    digest = hashlib.sha256()
    for p in paths:
        with p.open("rb") as fh:
            while chunk := fh.read(1 << 22):
                digest.update(chunk)
    return digest.hexdigest()


def _fix_input_shapes(
    model: onnx.ModelProto,
    shapes: Mapping[str, tuple[int, ...]] | None,
    data: Mapping[str, np.ndarray] | None = None,
) -> bool:
    """Make every graph input static (from ``--input-shape``, else the sample data); True if the file's were not."""
    init_names = {t.name for t in model.graph.initializer}
    real_inputs = [i for i in model.graph.input if i.name not in init_names]
    shapes = dict(shapes or {})
    if "" in shapes:
        if len(real_inputs) != 1:
            names = ", ".join(i.name for i in real_inputs)
            raise ModelError(
                f"the model has inputs {names}; name the one each shape is for: --input-shape NAME=1,3,224,224"
            )
        shapes[real_inputs[0].name] = shapes.pop("")
    unknown = set(shapes) - {i.name for i in real_inputs}
    if unknown:
        raise ModelError(
            f"--input-shape names {', '.join(sorted(unknown))}, which the model does not have; "
            f"its inputs are {', '.join(i.name for i in real_inputs)}"
        )
    if data:
        ranks = {
            i.name: (
                onnx.helper.tensor_dtype_to_np_dtype(i.type.tensor_type.elem_type).name
                if i.type.tensor_type.elem_type
                else "float32",
                len(i.type.tensor_type.shape.dim) if i.type.tensor_type.HasField("shape") else -1,
            )
            for i in real_inputs
        }
        check_input_data(data, ranks)
        for name, arr in data.items():
            given = shapes.setdefault(name, tuple(arr.shape))
            if tuple(given) != tuple(arr.shape):
                raise ModelError(f"--input-data {name!r} has shape {list(arr.shape)}; --input-shape says {list(given)}")
    was_dynamic = False
    for inp in real_inputs:
        if not inp.type.HasField("tensor_type"):
            raise ModelError(f"input {inp.name!r} is not a tensor; only tensor inputs are supported")
        has_shape = inp.type.tensor_type.HasField("shape")
        dims = inp.type.tensor_type.shape.dim
        given = shapes.get(inp.name)
        current = [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in dims]
        static = has_shape and all(isinstance(d, int) and d > 0 for d in current)
        was_dynamic = was_dynamic or not static
        if given is None:
            if not static:
                example = ",".join(str(d) if isinstance(d, int) and d > 0 else "1" for d in current)
                raise ModelError(
                    f"input {inp.name!r} has dynamic dimensions {current if has_shape else '(no shape)'}; "
                    f"give a static shape, e.g. --input-shape {inp.name}={example}"
                    + (" (nothing after '=' for a scalar)" if not current else "")
                    + ", or sample inputs with --input-data FILE.npz"
                )
            continue
        if has_shape and len(dims) != len(given):
            raise ModelError(
                f"input {inp.name!r} has rank {len(dims)} ({current}); the given shape {list(given)} has rank {len(given)}"
            )
        for fixed, want in zip(current, given, strict=False):
            if isinstance(fixed, int) and fixed > 0 and fixed != want:
                raise ModelError(
                    f"input {inp.name!r} has fixed shape {current}; the given shape {list(given)} contradicts it"
                )
        inp.type.tensor_type.ClearField("shape")
        inp.type.tensor_type.shape.SetInParent()  # a scalar has a shape with no dims
        for d in given:
            inp.type.tensor_type.shape.dim.add().dim_value = d
    return was_dynamic


def _name_nodes(graph: onnx.GraphProto) -> None:
    """Give every node a unique, non-empty name (partitions and costs are keyed by it)."""
    seen: set[str] = set()
    for i, node in enumerate(graph.node):
        name = node.name or f"{node.op_type}_{i}"
        while name in seen:
            name = f"{name}_{i}"
        node.name = name
        seen.add(name)


def load_onnx(
    path: str | Path,
    input_shapes: Mapping[str, tuple[int, ...]] | None = None,
    input_data: str | Path | Mapping[str, np.ndarray] | None = None,
    assume_dynamic: bool = False,
) -> LoadedModel:
    """Load and validate a user's ONNX file; see the module docstring for what is refused.

    ``input_data`` (an .npz path or arrays by input name) fixes the shapes of the inputs it
    holds and is what frames are made of; shapes onnx cannot infer come from one
    onnxruntime run with those inputs (generated ones where no data is given).
    ``assume_dynamic`` (for ``inspect``) sets dynamic dimensions nobody gave to 1 and says so in ``notes``.
    """
    path = Path(path)
    if not path.exists():
        raise ModelError(f"no such file: {path}")
    if not path.is_file():
        raise ModelError(f"{path} is not a file; give the path of an .onnx model")
    size = path.stat().st_size
    if size == 0:
        raise ModelError(f"{path} is empty; re-export the model")
    if size > _MAX_PROTO_BYTES:
        raise ModelError(f"{path} is {size} bytes, over protobuf's 2 GiB limit; save its weights as external data")
    try:
        model = onnx.load(str(path), load_external_data=False)
    except (DecodeError, RuntimeError, ValueError) as exc:
        raise ModelError(f"{path} is not a readable ONNX model (truncated or not ONNX: {exc}); re-export it") from None
    if model.ir_version <= 0 or not model.HasField("graph") or len(model.graph.node) == 0:
        raise ModelError(f"{path} does not hold an ONNX model (no IR version or no graph nodes); is it the right file?")
    data_files = _external_files(model, path.parent)
    if data_files:
        onnx.load_external_data_for_model(model, str(path.parent))

    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)
    if opset is None:
        raise ModelError(f"{path} imports no default-domain opset; re-export it with a standard opset")
    supported = max_ort_opset()
    if opset > supported:
        import onnxruntime as ort

        raise ModelError(
            f"{path} uses opset {opset}; the installed onnxruntime {ort.__version__} runs opsets up to {supported}. "
            f"Re-export with --opset {supported} or upgrade onnxruntime."
        )
    notes: list[str] = []
    skeleton = _skeleton(model)
    try:
        onnx.checker.check_model(skeleton)
    except (onnx.checker.ValidationError, ValueError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        reason = ort_refusal(model)
        if reason:
            raise ModelError(
                f"{path} fails the ONNX checker ({first}) and onnxruntime cannot load it: {reason}"
            ) from None
        notes.append(f"the ONNX checker objects ({first}), but onnxruntime loads the model; going on")

    data = load_input_data(input_data) if isinstance(input_data, str | Path) else input_data
    declared = [onnx.ValueInfoProto.FromString(i.SerializeToString()) for i in model.graph.input]
    declared_out = [onnx.ValueInfoProto.FromString(o.SerializeToString()) for o in model.graph.output]
    if assume_dynamic:
        input_shapes = {**_assumed_shapes(model, input_shapes, data, notes), **(input_shapes or {})}
    was_dynamic = _fix_input_shapes(model, input_shapes, data)
    _name_nodes(model.graph)
    sources = _infer_shapes(model, path)
    file_sha = _file_hash([path, *data_files])
    tensors = _input_types(model)
    specs = input_specs(model, tensors, data)
    runnable = _runnable(model, declared, declared_out) if has_control_flow(model) else None
    missing = [t for t, src in sources.items() if src == "missing"]
    if missing:
        try:
            values = tensor_values(runnable or model, make_feeds(specs, data))
        except ModelError as exc:
            if not assume_dynamic:
                raise
            notes.append(f"{len(missing)} tensor shape(s) unknown: {exc}")
        else:
            _record_shapes(model, values, missing)
            for t in missing:
                sources[t] = "onnxruntime"
    identity = file_sha
    if was_dynamic:
        fixed = ";".join(f"{s.name}:{s.dtype}:{','.join(map(str, s.shape))}" for s in specs)
        identity = hashlib.sha256(f"{file_sha}|{fixed}".encode()).hexdigest()
    return LoadedModel(
        path=path,
        proto=model,
        sha256=identity,
        file_sha256=file_sha,
        inputs=specs,
        shape_sources=sources,
        input_data=data,
        notes=tuple(notes),
        runnable=runnable,
    )


def has_control_flow(model: onnx.ModelProto) -> bool:
    return any(subgraphs(n) for n in model.graph.node)


def _runnable(
    model: onnx.ModelProto, inputs: list[onnx.ValueInfoProto], outputs: list[onnx.ValueInfoProto]
) -> onnx.ModelProto:
    """A copy with the file's own input and output declarations and no intermediate value_info (``ort_proto``)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    del out.graph.input[:]
    out.graph.input.extend(inputs)
    del out.graph.output[:]
    out.graph.output.extend(outputs)
    del out.graph.value_info[:]
    return out


def ort_refusal(model: onnx.ModelProto) -> str:
    """Why onnxruntime cannot load ``model`` (its first line), or "" if it can."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 4
    try:
        ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    except Exception as exc:  # onnxruntime raises its own exception types
        text = str(exc).strip()
        return text.splitlines()[0] if text else type(exc).__name__
    return ""


def _assumed_shapes(
    model: onnx.ModelProto,
    given: Mapping[str, tuple[int, ...]] | None,
    data: Mapping[str, np.ndarray] | None,
    notes: list[str],
) -> dict[str, tuple[int, ...]]:
    """For ``inspect``: every dynamic dimension not given set to 1, with a note saying so."""
    init_names = {t.name for t in model.graph.initializer}
    named = set(given or {}) | set(data or {})
    if "" in (given or {}):
        return {}
    out: dict[str, tuple[int, ...]] = {}
    for inp in model.graph.input:
        if inp.name in init_names or inp.name in named or not inp.type.HasField("tensor_type"):
            continue
        tt = inp.type.tensor_type
        if not tt.HasField("shape"):
            continue
        dims = [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else 0 for d in tt.shape.dim]
        if all(dims):
            continue
        out[inp.name] = tuple(d or 1 for d in dims)
        notes.append(
            f"input {inp.name!r} has dynamic dimensions; assumed {list(out[inp.name])} "
            f"(give --input-shape {inp.name}=... for the real figures)"
        )
    return out


def _input_types(model: onnx.ModelProto) -> dict[str, tuple[str, tuple[int, ...]]]:
    init_names = {t.name for t in model.graph.initializer}
    out = {}
    for i in model.graph.input:
        if i.name in init_names:
            continue
        tt = i.type.tensor_type
        dtype = onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type).name if tt.elem_type else "float32"
        out[i.name] = (dtype, tuple(d.dim_value for d in tt.shape.dim))
    return out


def _static(vi: onnx.ValueInfoProto) -> bool:
    tt = vi.type.tensor_type
    return (
        vi.type.HasField("tensor_type")
        and tt.elem_type != 0
        and tt.HasField("shape")
        and all(d.HasField("dim_value") and d.dim_value >= 0 for d in tt.shape.dim)
    )


def _infer_shapes(model: onnx.ModelProto, path: Path) -> dict[str, str]:
    """Shapes from ``onnx.shape_inference`` into the model; returns every used tensor -> "onnx" | "missing"."""
    skeleton = _skeleton(model)
    try:
        inferred = onnx.shape_inference.infer_shapes(skeleton, strict_mode=True, data_prop=True)
    except Exception:  # onnx raises several types (InferenceError, RuntimeError); retry leniently
        try:
            inferred = onnx.shape_inference.infer_shapes(skeleton, strict_mode=False, data_prop=True)
        except Exception:
            inferred = skeleton
    known = {vi.name: vi for vi in [*inferred.graph.value_info, *inferred.graph.output] if _static(vi)}
    del model.graph.value_info[:]
    model.graph.value_info.extend(vi for vi in inferred.graph.value_info if vi.name in known)
    outputs = [known.get(o.name, o) for o in model.graph.output]
    del model.graph.output[:]
    model.graph.output.extend(outputs)
    used = {t for n in model.graph.node for t in all_reads(n)} | {o.name for o in model.graph.output}
    produced = [t for n in model.graph.node for t in n.output if t and t in used]
    return {t: ("onnx" if t in known else "missing") for t in produced}


def _record_shapes(model: onnx.ModelProto, values: Mapping[str, np.ndarray], names: list[str]) -> None:
    """Shapes and dtypes observed in one onnxruntime run, written as value_info / output types."""
    outputs = {o.name for o in model.graph.output}
    keep = [vi for vi in model.graph.value_info if vi.name not in set(names)]
    del model.graph.value_info[:]
    model.graph.value_info.extend(keep)
    for t in names:
        arr = values[t]
        vi = helper.make_tensor_value_info(t, helper.np_dtype_to_tensor_dtype(arr.dtype), list(arr.shape))
        if t in outputs:
            for o in model.graph.output:
                if o.name == t:
                    o.CopyFrom(vi)
        else:
            model.graph.value_info.append(vi)


def _skeleton(model: onnx.ModelProto) -> onnx.ModelProto:
    """The model with large weights turned into typed graph inputs.

    Checking and shape inference serialise the whole model; without the weights they
    take milliseconds instead of most of a second on ResNet-50. Small initializers
    (shape tensors, scalars) stay, so data propagation through Reshape still works.
    """
    sk = onnx.ModelProto()
    sk.ir_version = model.ir_version
    sk.opset_import.extend(model.opset_import)
    sk.functions.extend(model.functions)
    g = sk.graph
    g.name = model.graph.name
    g.node.extend(model.graph.node)
    g.input.extend(model.graph.input)
    g.output.extend(model.graph.output)
    g.value_info.extend(model.graph.value_info)
    g.sparse_initializer.extend(model.graph.sparse_initializer)
    declared = {i.name for i in model.graph.input}
    for init in model.graph.initializer:
        if len(init.raw_data) > 4096:
            if init.name not in declared:
                g.input.append(helper.make_tensor_value_info(init.name, init.data_type, list(init.dims)))
        else:
            g.initializer.append(init)
    return sk


def write_model_atomic(model: onnx.ModelProto, path: Path) -> None:
    """Write an ONNX model in one file through a temporary name and rename."""
    atomic_write(path, model.SerializeToString())
