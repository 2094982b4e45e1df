"""Precision variants of blocks and partitions (fp32, int8, fp16), and their accuracy, measured.

A *group* is a set of ONNX node names cut out of a loaded model the way
``GroupExtractor`` cuts blocks and partitions. Its variants:

* ``fp32``: the group as cut, unchanged.
* ``int8``: onnxruntime's static quantisation in QDQ format, weights per channel
  (int8, symmetric), activations uint8 (what onnxruntime advises for x86 CPUs with or
  without VNNI; ``reduce_range`` off since VNNI accumulates without saturating).
  Calibrated with MinMax on the group's *boundary values*: the tensors entering the
  group, computed by running the fp32 model (``models.inputs.tensor_values``) on the
  user's sample frames, fed through a ``CalibrationDataReader``. Only the group's Conv,
  MatMul and Gemm nodes are quantised (``INT8_OPS``); its element-wise operators stay fp32
  between their DequantizeLinear and QuantizeLinear, since onnxruntime's int8 kernels for
  them are slower than its fp32 ones on x86. Whole-model int8 (the baseline users make by
  hand) quantises every type onnxruntime does.
* ``fp16``: ``onnxruntime.transformers.float16.convert_float_to_float16`` with
  ``keep_io_types=True`` (it ships with onnxruntime, which we already depend on, keeps
  ops without fp16 kernels in fp32 by its block list, and inserts the boundary Casts);
  onnxconverter-common is not needed.

Every variant reads and returns the same tensors with the same dtypes as the fp32
group: the QuantizeLinear/DequantizeLinear or Cast at its boundary are part of it (and
of its measured cost), so variants of neighbouring partitions chain in any mix.

Accuracy is measured, never assumed: ``measure_accuracy`` compares outputs against
fp32 with the metrics of ``METRICS`` (``top1``, ``cosine``, ``relerr``; every one a
*loss*, 0 = identical, compared with a budget such as 0.01). ``sensitivity`` gives
each group the end-to-end loss of the model with only that group in int8: the
per-block figure a planner sums under the budget. ``check_mix`` measures an assembled
mix end to end on held-back frames and ``repair`` puts the most sensitive int8 groups
back to fp32 until the budget holds.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import logging
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
import onnx.version_converter

from models.errors import ModelError
from models.graph import OpGraph, build_graph
from models.inputs import tensor_values
from models.onnx_io import LoadedModel

PRECISIONS = ("fp32", "fp16", "int8")
REFUSED_LOSS = 1.0  # the loss of a mix onnxruntime refuses to run: every metric's worst
QUANTIZABLE = ("Conv", "ConvTranspose", "MatMul", "Gemm")  # where int8 pays; the rest follows their Q/DQ
# What an int8 block quantises: its Conv, MatMul and Gemm (pre-processing fuses BatchNormalization into Conv and
# MatMul + bias into Gemm); its other operators stay fp32 between their DequantizeLinear and QuantizeLinear. On
# x86 onnxruntime's int8 element-wise kernels (QLinearMul, QLinearAdd, ...) are slower than fp32 ones: with
# them, PP-OCRv4's recogniser in whole-model int8 runs slower than fp32; with only these quantised, faster.
INT8_OPS = ("Conv", "MatMul", "Gemm")
Frame = Mapping[str, np.ndarray]


class PrecisionError(ModelError):
    """A variant cannot be made or checked as asked."""


class RefusedMix(PrecisionError):
    """onnxruntime refuses to make a session of the quantised model (a fusion of its own fails on it): such a mix
    cannot run, so choosing precisions treats it as one that loses everything."""


@dataclass(frozen=True)
class Variant:
    """One group (or the whole model) in one precision, as a self-contained ONNX model.

    ``precision`` is fp32 | fp16 | int8, or ``mixed`` for a whole model whose
    ``int8_nodes`` alone are quantised. ``inputs``/``outputs`` are the boundary tensors,
    with the fp32 model's dtypes.
    """

    precision: str
    model: bytes = field(repr=False)
    name: str
    members: tuple[str, ...]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    method: str
    calibration_frames: int = 0
    int8_nodes: tuple[str, ...] = ()

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.model).hexdigest()

    def session(self, threads: int = 0):  # -> onnxruntime.InferenceSession
        return _session(self.model, threads)

    def run(self, frames: Sequence[Frame], threads: int = 0) -> list[dict[str, np.ndarray]]:
        """Outputs for each frame (a frame may hold more tensors than the variant reads)."""
        return run_model(self.model, frames, self.inputs, self.outputs, threads)


def _session(model: bytes, threads: int = 0):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.log_severity_level = 3
    return ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])


def run_model(
    model: bytes, frames: Sequence[Frame], inputs: Sequence[str], outputs: Sequence[str], threads: int = 0
) -> list[dict[str, np.ndarray]]:
    session = _session(model, threads)
    out = []
    for frame in frames:
        result = session.run(list(outputs), {t: frame[t] for t in inputs})
        out.append(dict(zip(outputs, result, strict=True)))
    return out


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """onnxruntime's quantisation tools warn through the root logger (pre-processing advice, etc.)."""
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)
    try:
        yield
    finally:
        root.setLevel(level)


class FrameReader:
    """A ``CalibrationDataReader`` over a list of frames (dicts of input arrays), restartable."""

    def __init__(self, frames: Sequence[Frame], inputs: Sequence[str]) -> None:
        self.frames = [{t: np.asarray(f[t]) for t in inputs} for f in frames]
        self.start, self.end, self.i = 0, len(self.frames), 0

    def get_next(self) -> dict[str, np.ndarray] | None:
        if self.start + self.i >= self.end:
            return None
        self.i += 1
        return self.frames[self.start + self.i - 1]

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        while (f := self.get_next()) is not None:
            yield f

    def __len__(self) -> int:
        return len(self.frames)

    def set_range(self, start_index: int, end_index: int) -> None:
        self.start, self.end, self.i = start_index, min(end_index, len(self.frames)), 0

    def rewind(self) -> None:
        self.set_range(0, len(self.frames))


# --------------------------------------------------------------------------------------------- variants


class VariantMaker:
    """Makes variants of groups of one model; keeps the operator graph and boundary values it computed."""

    def __init__(self, model: LoadedModel, graph: OpGraph | None = None) -> None:
        from models.partition import GroupExtractor

        self.model = model
        self.graph = graph if graph is not None else build_graph(model.proto, model.sha256)
        self.extractor = GroupExtractor(model.proto, self.graph)
        self._values: dict[tuple[int, str], dict[str, np.ndarray]] = {}

    # ---- boundary values
    def boundary_values(
        self, frames: Sequence[Frame], tensors: Iterable[str], tag: str = ""
    ) -> list[dict[str, np.ndarray]]:
        """For each frame (model inputs), the values of ``tensors`` in the fp32 model; with a ``tag`` naming the
        frame set (e.g. "calibration"), values are kept for later calls with the same tag."""
        wanted = list(dict.fromkeys(tensors))
        out = []
        for i, frame in enumerate(frames):
            key = (i, tag)
            have = self._values.get(key) if tag else None
            if have is None or any(t not in have for t in wanted):
                values = tensor_values(self.model.ort_proto, {s.name: frame[s.name] for s in self.model.inputs})
                keep = set(wanted) | set(have or {})
                have = {t: values[t] for t in keep if t in values}
                if tag:
                    self._values[key] = have
            missing = [t for t in wanted if t not in have]
            if missing:
                raise PrecisionError(f"tensor {missing[0]!r} is not computed by the model; cannot feed a group with it")
            out.append({t: have[t] for t in wanted})
        return out

    def cut(self, members: Sequence[str], name: str = "group"):  # -> models.partition.Partition
        return self.extractor.extract(name, list(members))

    # ---- variants of one group
    def fp32(self, members: Sequence[str], name: str = "group") -> Variant:
        part = self.cut(members, name)
        return Variant("fp32", part.model.SerializeToString(), name, part.nodes, part.inputs, part.outputs, "as cut")

    def int8(self, members: Sequence[str], frames: Sequence[Frame], name: str = "group", tag: str = "") -> Variant:
        """Static QDQ int8 of the group, calibrated on its boundary values for ``frames``."""
        if not frames:
            raise PrecisionError("int8 needs calibration frames (the user's sample inputs)")
        part = self.cut(members, name)
        values = self.boundary_values(frames, part.inputs, tag)
        model = quantize_qdq(part.model, FrameReader(values, part.inputs), op_types=INT8_OPS)
        return Variant(
            "int8",
            model,
            name,
            part.nodes,
            part.inputs,
            part.outputs,
            INT8_METHOD + f", MinMax over {len(frames)} frames of boundary values",
            calibration_frames=len(frames),
        )

    def fp16(self, members: Sequence[str], name: str = "group") -> Variant:
        part = self.cut(members, name)
        return Variant("fp16", to_fp16(part.model), name, part.nodes, part.inputs, part.outputs, FP16_METHOD)

    def variants(
        self,
        members: Sequence[str],
        frames: Sequence[Frame],
        precisions: Iterable[str] = ("fp32", "int8"),
        name: str = "group",
        tag: str = "",
    ) -> dict[str, Variant]:
        out: dict[str, Variant] = {}
        for p in precisions:
            if p == "fp32":
                out[p] = self.fp32(members, name)
            elif p == "int8":
                out[p] = self.int8(members, frames, name, tag)
            elif p == "fp16":
                out[p] = self.fp16(members, name)
            else:
                raise PrecisionError(f"unknown precision {p!r}; choose from {', '.join(PRECISIONS)}")
        return out


INT8_METHOD = "onnxruntime static QDQ, per-channel int8 weights, uint8 activations"
FP16_METHOD = "onnxruntime.transformers.float16, fp32 I/O kept with boundary Casts, op block list in fp32"


def quantize_qdq(
    model: onnx.ModelProto,
    reader: FrameReader | None = None,
    *,
    nodes_to_quantize: Sequence[str] | None = None,
    nodes_to_exclude: Sequence[str] | None = None,
    ranges: Path | None = None,
    preprocess_only: bool = False,
    check: bool = True,
    op_types: Sequence[str] | None = None,
) -> bytes:
    """onnxruntime ``quantize_static`` (QDQ, per-channel) of ``model``; ``ranges`` is a calibration cache
    (``calibrate``) used instead of (or written by) the reader. Returns the quantised model's bytes.

    The model is first pre-processed as onnxruntime advises (``quant_pre_process``: shape inference and
    basic graph optimisation, which folds BatchNormalization into Conv; without it every BN sits in fp32
    between a DequantizeLinear and a QuantizeLinear). Fusions keep the first node's name or prefix it
    (``MatMul.0/MatMulAddFusion``), so ``nodes_to_quantize`` still finds the nodes it names.

    ``op_types`` limits quantisation to nodes of those types (``INT8_OPS`` for a precision mix; None: every
    type onnxruntime quantises, as whole-model int8 does).

    With ``check``, the result is one onnxruntime makes a session of (every graph optimisation on): where it
    refuses a mix, the bias Adds of MatMuls stay in fp32 (see below), else a ``PrecisionError`` says why."""
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    with tempfile.TemporaryDirectory(prefix="parapipe-q-") as tmp, _quiet():
        out, src, pre = Path(tmp) / "q.onnx", Path(tmp) / "in.onnx", Path(tmp) / "pre.onnx"
        # A path, not the proto: given a ModelProto, quantize_static rewrites it in place to point at
        # external data in a temporary folder it then deletes.
        onnx.save_model(_opset_for_per_channel(model), str(src))
        try:
            quant_pre_process(str(src), str(pre), skip_symbolic_shape=True)
        except Exception:  # pre-processing is an optimisation; quantise the model as it is
            pre = src
        names = [n.name for n in onnx.load(str(pre), load_external_data=False).graph.node]

        def find(given: Sequence[str]) -> list[str]:
            # a fused node is named by its first node, then "/" and the fusion: "MatMul.0/MatMulAddFusion",
            # "/encoder/layer.0/output/dense/MatMul/MatMulAddFusion" (node names may hold "/" themselves)
            wanted = set(given)
            return [n for n in names if n in wanted or n.split("/")[0] in wanted or n.rsplit("/", 1)[0] in wanted]

        selected = find(nodes_to_quantize) if nodes_to_quantize else None
        excluded = find(nodes_to_exclude) if nodes_to_exclude else None
        if preprocess_only or (nodes_to_quantize and not selected):
            return onnx.load(str(pre)).SerializeToString()
        if reader is None and ranges is not None and ranges.exists():
            ranges = _ranges_through_reshapes(onnx.load(str(pre), load_external_data=False), ranges, Path(tmp))

        def quantize(exclude: list[str] | None) -> bytes:
            if reader is not None:
                reader.rewind()
            try:
                quantize_static(
                    pre,
                    out,
                    reader,
                    quant_format=QuantFormat.QDQ,
                    per_channel=True,
                    reduce_range=False,
                    activation_type=QuantType.QUInt8,
                    weight_type=QuantType.QInt8,
                    nodes_to_quantize=selected,
                    nodes_to_exclude=exclude,
                    op_types_to_quantize=list(op_types) if op_types else None,
                    calibrate_method=CalibrationMethod.MinMax,
                    calibration_cache_path=ranges,
                )
            except Exception as exc:  # onnxruntime's tools raise many types
                first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                raise PrecisionError(f"onnxruntime could not quantise the model: {first}") from None
            return onnx.load(str(out)).SerializeToString()  # may have written weights as external data beside it

        data = quantize(excluded)
        refused = _refused(data) if check else None
        if refused is None:
            return data
        # onnxruntime's MatMulAddFusion fails on a quantised bias Add (MatMul + constant, each through Q/DQ) whose
        # output leaves the int8 region ("Attempt to replace the existing tensor"). Such an Add gains nothing from
        # int8 (onnxruntime fuses it into the MatMul in fp32): keep it in fp32, and the rest as asked.
        biases = _bias_adds(onnx.load(str(pre), load_external_data=False), selected)
        if biases:
            data = quantize([*(excluded or ()), *biases])
            refused = _refused(data)
        if refused is not None:
            # It fails on other mixes too (a text model's query projection and its attention scores in int8, the
            # key and value projections beside them in fp32): such a mix cannot run here.
            raise RefusedMix(f"onnxruntime refuses the quantised model: {refused}")
        return data


RESHAPING = ("Reshape", "Flatten", "Squeeze", "Unsqueeze", "Transpose", "Identity")  # values pass unchanged


def _ranges_through_reshapes(model: onnx.ModelProto, cache: Path, tmp: Path) -> Path:
    """``cache`` with a range for each tensor pre-processing made by reshaping one that has a range, or that is
    reshaped into one (fusing MatMul + bias into Gemm on 3-D inputs puts a Reshape on each side of the Gemm,
    ``gemm_input_reshape_arg_token_N`` and ``gemm_output_reshape_arg_token_N``, named anew in each partition): a
    reshaped tensor holds the same values. ``cache`` itself when nothing is missing."""
    known = read_ranges(cache)
    added: dict[str, tuple[float, float]] = {}
    reshapes = [n for n in model.graph.node if n.op_type in RESHAPING and n.input and n.output]
    while True:  # forward (a reshape's output) and backward (its input), until nothing more is found
        before = len(added)
        for node in reshapes:
            src, dst = node.input[0], node.output[0]
            for a, b in ((src, dst), (dst, src)):
                if b not in known and b not in added:
                    value = known.get(a) or added.get(a)
                    if value is not None:
                        added[b] = value
        if len(added) == before:
            break
    if not added:
        return cache
    return write_ranges({**known, **added}, tmp / "ranges-reshaped.json")


def _refused(model: bytes) -> str | None:
    """Why onnxruntime cannot make a session of ``model`` with every graph optimisation on (as it is run), or None."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 4
    try:
        ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
    except Exception as exc:  # onnxruntime raises its own Fail/InvalidGraph types
        text = str(exc).strip()
        return text.splitlines()[-1][-300:] if text else type(exc).__name__
    return None


def _bias_adds(model: onnx.ModelProto, selected: Sequence[str] | None) -> list[str]:
    """Names of the Add nodes (among ``selected``, all when None) adding a constant to a MatMul's output: a bias."""
    constants = {i.name for i in model.graph.initializer}
    constants |= {o for n in model.graph.node if n.op_type == "Constant" for o in n.output}
    matmul_out = {o for n in model.graph.node if n.op_type == "MatMul" for o in n.output}
    wanted = None if selected is None else set(selected)
    return [
        n.name
        for n in model.graph.node
        if n.op_type == "Add"
        and (wanted is None or n.name in wanted)
        and len(n.input) == 2
        and any(i in matmul_out for i in n.input)
        and any(i in constants for i in n.input)
    ]


def _opset_for_per_channel(model: onnx.ModelProto) -> onnx.ModelProto:
    """Per-channel QuantizeLinear/DequantizeLinear (their ``axis``) need opset 13; older models are
    converted (onnx's version converter), else onnxruntime's quantiser writes a model ORT refuses."""
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 13)
    if opset >= 13:
        return model
    try:
        return onnx.version_converter.convert_version(model, 13)
    except Exception as exc:  # the converter raises several types
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise PrecisionError(
            f"the model uses opset {opset}; per-channel int8 needs opset 13 and onnx could not convert it: {first}"
        ) from None


def to_fp16(model: onnx.ModelProto, keep_fp32: Iterable[str] = ()) -> bytes:
    """``model`` in fp16, its inputs and outputs kept in their dtypes (Casts at the boundary, part of the model);
    the nodes named in ``keep_fp32`` stay fp32 (Casts around them), as do operators onnxruntime's converter
    keeps in fp32 by its block list."""
    from onnxruntime.transformers.float16 import convert_float_to_float16

    kept = [n for n in dict.fromkeys(keep_fp32)]
    with _quiet():
        copy = onnx.ModelProto()
        copy.CopyFrom(model)
        try:
            half = convert_float_to_float16(copy, keep_io_types=True, node_block_list=kept or None)
        except Exception as exc:  # the converter raises several types
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise PrecisionError(f"onnxruntime's fp16 converter could not convert the model: {first}") from None
    return half.SerializeToString()


def fp16_nodes(model: bytes) -> int:
    """Nodes of a model that compute in fp16 (an output of type float16): 0 for an fp32 one."""
    proto = onnx.load_from_string(model)
    half = {v.name for v in (*proto.graph.value_info, *proto.graph.output) if v.type.tensor_type.elem_type == 10}
    half |= {i.name for i in proto.graph.initializer if i.data_type == onnx.TensorProto.FLOAT16}
    casts = {
        o
        for n in proto.graph.node
        if n.op_type == "Cast"
        for a in n.attribute
        if a.name == "to" and a.i == onnx.TensorProto.FLOAT16
        for o in n.output
    }
    half |= casts
    return sum(n.op_type != "Cast" and any(t in half for t in n.input) for n in proto.graph.node)


def assemble_fp16(model: LoadedModel, fp16: Iterable[str], frames: int = 0) -> Variant:
    """The whole model with only the ``fp16`` nodes in fp16 (one session; Casts where they meet fp32 nodes)."""
    chosen = set(fp16)
    if not chosen:
        return _whole("fp32", model.ort_proto.SerializeToString(), model, "as loaded", 0)
    keep = [n.name for n in model.ort_proto.graph.node if n.name not in chosen]
    v = _whole("mixed" if keep else "fp16", to_fp16(model.ort_proto, keep), model, FP16_METHOD, frames)
    return v


# --------------------------------------------------------------------------------------------- whole model


def calibrate(model: LoadedModel, frames: Sequence[Frame], path: Path) -> Path:
    """Activation ranges of every tensor of the fp32 model over ``frames`` (MinMax), cached in ``path``
    (onnxruntime's calibration cache, JSON). Reused by ``whole_model_int8`` and ``assemble``."""
    if path.exists():
        path.unlink()
    names = [s.name for s in model.inputs]
    quantize_qdq(model.ort_proto, FrameReader(frames, names), ranges=path, check=False)
    return path


def whole_model_int8(model: LoadedModel, frames: Sequence[Frame], ranges: Path | None = None) -> Variant:
    """The whole model in static int8: what users do by hand (the baseline)."""
    names = [s.name for s in model.inputs]
    reader = None if ranges is not None and ranges.exists() else FrameReader(frames, names)
    q = quantize_qdq(model.ort_proto, reader, ranges=ranges)
    return _whole("int8", q, model, INT8_METHOD + f", MinMax over {len(frames)} frames", len(frames))


def assemble(
    model: LoadedModel,
    ranges: Path,
    *,
    int8_nodes: Iterable[str] | None = None,
    fp32_nodes: Iterable[str] | None = None,
    frames: int = 0,
) -> Variant:
    """The whole model as one precision mix (one session), from a calibration cache made by ``calibrate``:
    only ``int8_nodes`` quantised, or everything but ``fp32_nodes`` (give one of the two). No int8 node:
    the fp32 model; no fp32 node: whole-model int8."""
    if (int8_nodes is None) == (fp32_nodes is None):
        raise PrecisionError("assemble takes int8_nodes or fp32_nodes, not both")
    if int8_nodes is not None:
        nodes = tuple(dict.fromkeys(int8_nodes))
        if not nodes:
            return _whole("fp32", model.ort_proto.SerializeToString(), model, "as loaded", 0)
        q = quantize_qdq(model.ort_proto, None, nodes_to_quantize=nodes, ranges=ranges, op_types=INT8_OPS)
        method = INT8_METHOD + " on the int8 nodes' " + "/".join(INT8_OPS) + " only"
    else:
        kept = set(fp32_nodes or ())
        nodes = tuple(n.name for n in model.proto.graph.node if n.name not in kept)
        q = quantize_qdq(model.ort_proto, None, nodes_to_exclude=tuple(kept), ranges=ranges)
        method = INT8_METHOD + (f", {len(kept)} nodes kept in fp32" if kept else "")
    v = _whole("mixed" if kept_fp32(model, nodes) else "int8", q, model, method, frames)
    return dataclasses.replace(v, int8_nodes=nodes)


def kept_fp32(model: LoadedModel, int8: Sequence[str]) -> bool:
    return len(set(int8)) < len(model.proto.graph.node)


def preprocessed(model: LoadedModel) -> Variant:
    """The fp32 model as every int8 variant is built from: opset >= 13 and onnxruntime's quantisation
    pre-processing (shape inference, basic optimisation: BN folded into Conv), no int8. Comparing a mix
    with it separates what int8 gains from what pre-processing does."""
    data = quantize_qdq(model.ort_proto, None, preprocess_only=True)
    return _whole("fp32", data, model, "onnxruntime quantisation pre-processing, no int8", 0)


def _whole(precision: str, data: bytes, model: LoadedModel, method: str, frames: int) -> Variant:
    return Variant(
        precision,
        data,
        model.path.stem,
        tuple(n.name for n in model.proto.graph.node),
        tuple(s.name for s in model.inputs),
        tuple(o.name for o in model.proto.graph.output),
        method,
        frames,
    )


def run_chain(variants: Sequence[Variant], frames: Sequence[Frame], outputs: Sequence[str]) -> list[dict]:
    """Variants of consecutive partitions run chained (each in its own session), as agents run a plan."""
    sessions = [(v, v.session()) for v in variants]
    out = []
    for frame in frames:
        values: dict[str, np.ndarray] = dict(frame)
        for v, s in sessions:
            values.update(zip(v.outputs, s.run(list(v.outputs), {t: values[t] for t in v.inputs}), strict=True))
        out.append({t: values[t] for t in outputs})
    return out


# --------------------------------------------------------------------------------------------- accuracy


@dataclass(frozen=True)
class Metric:
    """An accuracy loss against fp32 over frames: 0 = identical; compared with a budget (0.01 = 1%)."""

    name: str
    description: str
    loss: Callable[[Sequence[Frame], Sequence[Frame]], float] = field(repr=False)


def _float_outputs(ref: Sequence[Frame]) -> list[str]:
    return [k for k, v in ref[0].items() if np.asarray(v).dtype.kind == "f" and np.asarray(v).size]


def _top1(ref: Sequence[Frame], got: Sequence[Frame]) -> float:
    """The share of rows (over the last axis; per position for sequences, e.g. CTC) whose top-1 is not safe: its
    argmax changed, or its fp32 lead over the runner-up is smaller than twice the largest change of that row's
    scores, so that a change of the same size in another direction flips it. Counting only the flips seen
    promised a 1% budget from a dozen frames where 8-13% of unseen ones flipped: a classifier that is
    unsure (outputs near uniform) flips under any int8 block, and a few frames rarely show it."""
    lost = total = 0
    for name in _float_outputs(ref):
        if np.asarray(ref[0][name]).shape[-1] < 2:
            continue
        for r, g in zip(ref, got, strict=True):
            a, b = np.asarray(r[name], np.float64), np.asarray(g[name], np.float64)
            top2 = np.partition(a, -2, axis=-1)  # the two largest last, in order; no full sort of every row
            lead = top2[..., -1] - top2[..., -2]
            change = np.max(np.abs(b - a), axis=-1)
            unsafe = (np.argmax(a, axis=-1) != np.argmax(b, axis=-1)) | (lead < 2 * change)
            lost += int(np.sum(unsafe))
            total += unsafe.size
    if not total:
        raise PrecisionError("top1 needs an output with classes on its last axis (size >= 2)")
    return lost / total


def _cosine(ref: Sequence[Frame], got: Sequence[Frame]) -> float:
    """1 - the cosine similarity of flattened outputs, averaged over frames, worst output."""
    worst = 0.0
    for name in _float_outputs(ref):
        sims = []
        for r, g in zip(ref, got, strict=True):
            a, b = np.asarray(r[name], np.float64).ravel(), np.asarray(g[name], np.float64).ravel()
            na, nb = np.linalg.norm(a), np.linalg.norm(b)
            sims.append(1.0 if na == nb == 0 else float(a @ b / (na * nb)) if na and nb else 0.0)
        worst = max(worst, 1.0 - float(np.mean(sims)))
    return worst


def _relerr(ref: Sequence[Frame], got: Sequence[Frame]) -> float:
    """||got - ref|| / ||ref|| (L2) pooled over frames, worst output. Pooled rather than averaged per
    frame, so that frames whose reference is near zero (a detector's empty map) do not dominate."""
    worst = 0.0
    for name in _float_outputs(ref):
        num = den = 0.0
        for r, g in zip(ref, got, strict=True):
            a, b = np.asarray(r[name], np.float64), np.asarray(g[name], np.float64)
            num += float(np.sum((b - a) ** 2))
            den += float(np.sum(a**2))
        worst = max(worst, float(np.sqrt(num / max(den, 1e-24))))
    return worst


METRICS: dict[str, Metric] = {
    "top1": Metric(
        "top1", "top-1 not safe: argmax changed, or the lead within twice the change (per row/time step)", _top1
    ),
    "cosine": Metric("cosine", "1 - cosine similarity of the outputs", _cosine),
    "relerr": Metric("relerr", "relative L2 error of the outputs, pooled over frames", _relerr),
}


def metric(name: str) -> Metric:
    try:
        return METRICS[name]
    except KeyError:
        raise PrecisionError(f"unknown metric {name!r}; choose from {', '.join(METRICS)}") from None


@dataclass(frozen=True)
class Accuracy:
    """Losses against fp32 by metric name, over ``frames`` frames."""

    frames: int
    losses: tuple[tuple[str, float], ...]

    def loss(self, name: str) -> float:
        return dict(self.losses)[name]

    def describe(self) -> str:
        return ", ".join(f"{k} {v:.4g}" for k, v in self.losses) + f" ({self.frames} frames)"


def measure_accuracy(
    reference: Sequence[Frame], got: Sequence[Frame], metrics: Iterable[str] = ("relerr", "cosine", "top1")
) -> Accuracy:
    """Outputs of a variant against fp32's, frame by frame; metrics that do not apply (top1 on an output
    with no class axis) are left out."""
    if len(reference) != len(got) or not reference:
        raise PrecisionError(f"compare the same frames: {len(reference)} reference, {len(got)} measured")
    losses = []
    for name in metrics:
        m = metric(name)
        try:
            losses.append((name, m.loss(reference, got)))
        except PrecisionError:
            continue
    return Accuracy(len(reference), tuple(losses))


@dataclass(frozen=True)
class VariantAccuracy:
    """A variant's error against its fp32 group on calibration frames and on held-back frames."""

    precision: str
    calibration: Accuracy
    held_out: Accuracy


def variant_accuracy(
    maker: VariantMaker,
    variant: Variant,
    calibration: Sequence[Frame],
    held_out: Sequence[Frame],
    metrics: Iterable[str] = ("relerr", "cosine", "top1"),
) -> VariantAccuracy:
    """Per-group error: the variant and fp32 fed the same fp32 boundary values."""
    metrics = tuple(metrics)
    fp32 = maker.fp32(variant.members, variant.name)
    results = []
    for frames, tag in ((calibration, "calibration"), (held_out, "held-out")):
        values = maker.boundary_values(frames, variant.inputs, tag)
        results.append(measure_accuracy(fp32.run(values), variant.run(values), metrics))
    return VariantAccuracy(variant.precision, results[0], results[1])


# --------------------------------------------------------------------------------------------- mixes


def int8_nodes(groups: Mapping[str, Sequence[str]], int8: Iterable[str]) -> tuple[str, ...]:
    return tuple(n for g in int8 for n in groups[g])


@dataclass
class MixEvaluator:
    """End-to-end loss of the model with a set of groups in int8 (one assembled session), on ``frames``.

    ``rest`` is the precision of nodes in no group: ``fp32``, or ``int8`` when the groups are only the
    blocks worth choosing for (``quantizable_groups``) and everything else follows onnxruntime's
    whole-model quantisation (so that no group in fp32 is exactly whole-model int8)."""

    model: LoadedModel
    groups: Mapping[str, Sequence[str]]
    frames: Sequence[Frame]
    metric: str
    ranges: Path
    rest: str = "fp32"
    reference: list[dict[str, np.ndarray]] = field(default_factory=list)
    cache: dict[frozenset[str], Accuracy] = field(default_factory=dict)

    def __post_init__(self) -> None:
        metric(self.metric)
        if self.rest not in ("fp32", "int8"):
            raise PrecisionError(f"rest must be fp32 or int8, not {self.rest!r}")
        if not self.reference:
            fp32 = _whole("fp32", self.model.ort_proto.SerializeToString(), self.model, "as loaded", 0)
            self.reference = fp32.run(self.frames)

    def accuracy(self, int8: Iterable[str], metrics: Iterable[str] = ("top1", "cosine", "relerr")) -> Accuracy:
        """Every metric that applies, for the model with ``int8`` groups in int8 (measured once per set)."""
        key = frozenset(int8)
        if key not in self.cache:
            try:
                v = self.assemble(key)
            except RefusedMix:  # cannot run: as bad as a mix can be
                self.cache[key] = Accuracy(len(self.frames), tuple((m, REFUSED_LOSS) for m in METRICS))
            else:
                self.cache[key] = measure_accuracy(self.reference, v.run(self.frames), METRICS)
        acc = self.cache[key]
        return Accuracy(acc.frames, tuple((k, v) for k, v in acc.losses if k in set(metrics)))

    def assemble(self, int8: Iterable[str], frames: int = 0) -> Variant:
        """The mix as one model."""
        chosen = set(int8)
        if self.rest == "fp32":
            return assemble(self.model, self.ranges, int8_nodes=int8_nodes(self.groups, chosen), frames=frames)
        fp32 = [g for g in self.groups if g not in chosen]
        return assemble(self.model, self.ranges, fp32_nodes=int8_nodes(self.groups, fp32), frames=frames)

    def loss(self, int8: Iterable[str], metric: str | None = None) -> float:
        return self.accuracy(int8).loss(metric or self.metric)

    def __call__(self, int8: Iterable[str]) -> float:
        return self.loss(int8)


def sensitivity(evaluate: Callable[[Iterable[str]], float], groups: Iterable[str]) -> dict[str, float]:
    """Per group: how much the end-to-end loss grows when that group alone goes to int8 (over the loss
    with none of them in int8: 0 when everything else is fp32). The planner sums these under a budget;
    every mix is then measured end to end (``repair``), since losses do not add up exactly.

    With a ``MixEvaluator`` the runs are kept, so ``sensitivity(lambda s: ev.loss(s, "relerr"), groups)``
    afterwards costs nothing: a continuous figure to rank groups that a discrete metric (top1) ties at 0."""
    base = evaluate([])
    return {g: max(0.0, evaluate([g]) - base) for g in groups}


def choose_mix(
    sensitivities: Mapping[str, float], budget: float, gains: Mapping[str, float] | None = None
) -> tuple[str, ...]:
    """Greedy: int8 groups by least sensitivity per unit of gain (e.g. ms saved or FLOPs), while the
    summed sensitivity stays within the budget."""
    eps = 1e-12

    def order(g: str) -> float:
        gain = (gains or {}).get(g, 1.0)
        return sensitivities[g] / max(gain, eps) if gain > 0 else float("inf")

    chosen, total = [], 0.0
    for g in sorted(sensitivities, key=order):
        if gains is not None and gains.get(g, 0.0) <= 0:
            continue
        if total + max(sensitivities[g], 0.0) <= budget:
            chosen.append(g)
            total += max(sensitivities[g], 0.0)
    return tuple(chosen)


@dataclass(frozen=True)
class Repair:
    """A mix after repair: the int8 groups kept, those put back to fp32 (in order), the measured loss."""

    int8: tuple[str, ...]
    reverted: tuple[str, ...]
    loss: float
    budget: float

    @property
    def ok(self) -> bool:
        return self.loss <= self.budget


def repair(
    int8: Iterable[str],
    sensitivities: Mapping[str, float],
    evaluate: Callable[[Iterable[str]], float],
    budget: float,
    tie_break: Mapping[str, float] | None = None,
    gains: Mapping[str, float] | None = None,
    refill: bool = True,
) -> Repair:
    """Measure the mix end to end; while over budget, put its most sensitive int8 group back to fp32
    (ties, e.g. top1 sensitivities all 0, broken by ``tie_break``, e.g. each group's relerr sensitivity).
    With ``gains`` (what int8 saves per group, e.g. ms), the group with the most sensitivity per unit of
    gain goes back first. With ``refill``, each group put back is then tried in int8 again (least
    sensitive first) and kept there if the budget still holds: one more measurement per group put back."""
    kept = list(dict.fromkeys(int8))
    reverted: list[str] = []
    loss = evaluate(kept)

    def rank(g: str) -> tuple[float, float]:
        per = 1.0 if gains is None else max(gains.get(g, 0.0), 1e-12)
        return (sensitivities.get(g, 0.0) / per, (tie_break or {}).get(g, 0.0) / per)

    while loss > budget and kept:
        worst = max(kept, key=rank)
        kept.remove(worst)
        reverted.append(worst)
        loss = evaluate(kept)
    if refill and loss <= budget:
        # losses do not add up: a group put back early may fit again now that worse ones are fp32
        for g in reversed(list(reverted)):
            trial = evaluate([*kept, g])
            if trial <= budget:
                kept.append(g)
                reverted.remove(g)
                loss = trial
    return Repair(tuple(kept), tuple(reverted), loss, budget)


def quantizable_groups(graph: OpGraph, groups: Mapping[str, Sequence[str]]) -> dict[str, tuple[str, ...]]:
    """The groups holding an op worth quantising (Conv, MatMul, Gemm): the only ones a precision choice changes."""
    op_type = {n.name: n.op_type for n in graph.nodes}
    return {g: tuple(m) for g, m in groups.items() if any(op_type.get(n) in QUANTIZABLE for n in m)}


def precision_units(graph: OpGraph, blocks: OpGraph) -> dict[str, tuple[str, ...]]:
    """The model cut into units of precision choice covering every node, from its operator graph and a
    block graph of it (``coarsen``): each block holding a Conv, MatMul or Gemm starts a unit (named by that
    node); every other block joins the latest-started unit among its producers' (blocks nothing feeds,
    such as Constants, join the first unit). All units in int8 is whole-model int8; a unit back in fp32
    takes its activations, concats and heads with it.

    Units are convex (each can be cut out as a partition): every member's ancestors lie in its own unit
    or in units started before it, so no path leaves a unit and comes back."""
    op_type = {n.name: n.op_type for n in graph.nodes}
    units: dict[str, list[str]] = {}
    started: dict[str, int] = {}
    unit_of: dict[str, str] = {}
    pending: list[str] = []  # blocks before the first unit, or fed by nothing: they join the first unit
    for b in blocks.nodes:
        first = next((m for m in b.members if op_type.get(m) in QUANTIZABLE), None)
        producers = [unit_of[p] for p in blocks.predecessors[b.name] if p in unit_of]
        if first is not None:
            units[first] = list(b.members)
            started[first] = len(started)
            unit_of[b.name] = first
        elif producers:
            unit = max(producers, key=started.__getitem__)
            units[unit].extend(b.members)
            unit_of[b.name] = unit
        else:
            pending.extend(b.members)
    if not units:  # no Conv/MatMul/Gemm anywhere: one unit
        return {pending[0]: tuple(pending)} if pending else {}
    first_unit = next(iter(units))
    units[first_unit][:0] = pending
    return {k: tuple(v) for k, v in units.items()}


# --------------------------------------------------------------------------------------------- ranges

Ranges = Mapping[str, tuple[float, float]]  # tensor -> (lowest, highest) value over the calibration frames


def tensor_ranges(model: LoadedModel, frames: Sequence[Frame]) -> dict[str, tuple[float, float]]:
    """MinMax activation ranges of every float tensor, over ``frames``: what a plan embeds so that its int8
    partitions can be quantised anywhere, later, without the frames.

    Two sources, merged: the fp32 model as loaded (every tensor a partition boundary may cut, such as a
    Conv's output before the BatchNormalization that pre-processing folds into it when both sit in one
    partition) and onnxruntime's own calibration of the pre-processed model (the tensors fusion names)."""
    if not frames:
        raise PrecisionError("int8 needs calibration frames (the user's sample inputs)")
    names = [s.name for s in model.inputs]
    lo: dict[str, float] = {}
    hi: dict[str, float] = {}
    for frame in frames:
        for t, v in tensor_values(model.ort_proto, {n: frame[n] for n in names}).items():
            a = np.asarray(v)
            if a.dtype.kind != "f" or not a.size:
                continue
            lo[t] = min(lo.get(t, np.inf), float(np.min(a)))
            hi[t] = max(hi.get(t, -np.inf), float(np.max(a)))
    out = {t: (lo[t], hi[t]) for t in lo}
    with tempfile.TemporaryDirectory(prefix="parapipe-ranges-") as tmp:
        cache = calibrate(model, frames, Path(tmp) / "ranges.json")
        for t, r in read_ranges(cache).items():
            out.setdefault(t, r)
    return out


def read_ranges(path: Path) -> dict[str, tuple[float, float]]:
    """The (lowest, highest) of each tensor in an onnxruntime calibration cache (``calibrate``)."""
    from onnxruntime.quantization.calibrate import load_tensors_data

    data = load_tensors_data(path)
    return {t: (float(np.min(d.range_value[0])), float(np.max(d.range_value[1]))) for t, d in data.items()}


def write_ranges(ranges: Ranges, path: Path) -> Path:
    """``ranges`` as an onnxruntime calibration cache (MinMax), which ``quantize_qdq`` reads."""
    from onnxruntime.quantization import CalibrationMethod
    from onnxruntime.quantization.calibrate import TensorData, TensorsData, save_tensors_data

    data = {
        t: TensorData(lowest=np.array(lo, np.float32), highest=np.array(hi, np.float32))
        for t, (lo, hi) in ranges.items()
    }
    save_tensors_data(TensorsData(CalibrationMethod.MinMax, data), path)
    return path


def quantize_nodes(model: onnx.ModelProto, nodes: Sequence[str], ranges: Ranges) -> bytes:
    """``model`` (a partition) with ``nodes`` in static QDQ int8 (per-channel weights), from embedded ranges;
    the rest stays fp32 and the model reads and returns the same tensors with the same dtypes. No node:
    the model unchanged."""
    if not nodes:
        return model.SerializeToString()
    with tempfile.TemporaryDirectory(prefix="parapipe-qn-") as tmp:
        cache = write_ranges(ranges, Path(tmp) / "ranges.json")
        try:
            return quantize_qdq(model, None, nodes_to_quantize=nodes, ranges=cache, op_types=INT8_OPS)
        except RefusedMix:
            raise
        except PrecisionError as exc:
            raise PrecisionError(
                f"{exc}; the plan's calibration ranges do not cover this partition: plan again with --calibration"
            ) from None


def qdq_nodes(model: bytes) -> int:
    """QuantizeLinear/DequantizeLinear nodes in a model: 0 for an fp32 one."""
    return sum(n.op_type in ("QuantizeLinear", "DequantizeLinear") for n in onnx.load_from_string(model).graph.node)


@dataclass(frozen=True)
class PrecisionCheck:
    """Outputs of a precision mix against fp32 on ``accuracy.frames`` frames: the plan's metric within its budget."""

    metric: str
    budget: float
    accuracy: Accuracy

    @property
    def loss(self) -> float:
        return self.accuracy.loss(self.metric)

    @property
    def ok(self) -> bool:
        return self.loss <= self.budget

    def describe(self) -> str:
        verdict = "within" if self.ok else "EXCEEDS"
        return (
            f"{self.metric} loss {self.loss:.4g} vs fp32 over {self.accuracy.frames} frame(s), {verdict} the budget "
            f"{self.budget:g} ({self.accuracy.describe()})"
        )


def check_precision(
    reference: Sequence[Frame], got: Sequence[Frame], metric_name: str, budget: float
) -> PrecisionCheck:
    """The mix's outputs against fp32's with the plan's metric (and the others that apply, for the report)."""
    names = tuple(dict.fromkeys((metric_name, "relerr", "cosine")))
    accuracy = measure_accuracy(reference, got, names)
    if metric_name not in dict(accuracy.losses):
        raise PrecisionError(
            f"metric {metric_name!r} does not apply to this model's outputs; {metric(metric_name).description}"
        )
    return PrecisionCheck(metric_name, budget, accuracy)
