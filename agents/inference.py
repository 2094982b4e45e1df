"""The Open Inference Protocol (KServe v2 gRPC, ``inference.GRPCInferenceService``) over the running pipeline.

Served on the agent's own port beside parapipe's API, behind the same token and TLS, so an
application written for Triton or KServe (``tritonclient.grpc``, KServe's clients) calls the
board unchanged. The running pipeline is one model, named by its plan (and by the alias
``parapipe``, which always means whatever runs); its version is the running bundle's hash
prefix. Tensors travel as ``raw_*_contents`` (what tritonclient sends) or as typed
``contents``; answers are raw. Only the entry host of a plan over several hosts takes frames.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator, Sequence

import grpc
import numpy as np

from agents import service
from agents.bundle import TensorSpec
from agents.calls import Refused, abort, answer_in_order, infer_frame
from agents.executor import DeadlineExceeded, FrameFuture, Pipeline, PipelineError
from agents.proto import inference_pb2 as kpb
from agents.proto import inference_pb2_grpc as krpc

log = logging.getLogger("parapipe.agent")
SERVICE = "inference.GRPCInferenceService"
MODEL_ALIAS = "parapipe"
PLATFORM = "onnxruntime_onnx"
# numpy dtype <-> the protocol's datatype names
DATATYPES = {
    "bool": "BOOL",
    "uint8": "UINT8",
    "uint16": "UINT16",
    "uint32": "UINT32",
    "uint64": "UINT64",
    "int8": "INT8",
    "int16": "INT16",
    "int32": "INT32",
    "int64": "INT64",
    "float16": "FP16",
    "float32": "FP32",
    "float64": "FP64",
}
NUMPY = {v: k for k, v in DATATYPES.items()}
# which typed ``contents`` field holds each datatype
CONTENTS = {
    "BOOL": "bool_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
}


class ModelNotFound(service.NotFound):
    """The request names a model or version this agent does not serve."""


def model_version(pipeline: Pipeline) -> str:
    """The pipeline's one version: its bundle's hash prefix (the bundle's folder is named by its hash)."""
    return pipeline.folder.name[:12]


def _match(pipeline: Pipeline, name: str, version: str) -> Pipeline:
    """``pipeline`` if ``name``/``version`` name it, else ModelNotFound."""
    names = (pipeline.manifest.plan_name, MODEL_ALIAS)
    if name not in names:
        raise ModelNotFound(f"no model {name!r} here; this agent serves {names[0]!r} (alias {MODEL_ALIAS!r})")
    if version and version != model_version(pipeline):
        raise ModelNotFound(
            f"model {name!r} has no version {version!r}; the running one is {model_version(pipeline)!r}"
        )
    return pipeline


def _resolve(state: service.AgentState, name: str, version: str) -> Pipeline:
    """The running pipeline if ``name``/``version`` name it; NotFound (no such model) or NotReady."""
    pipeline = state.pipeline
    if pipeline is None:
        if name == MODEL_ALIAS:
            raise service.NotReady("no pipeline is running; deploy a plan to this board first")
        raise ModelNotFound(f"no model {name!r} here: no pipeline is running")
    return _match(pipeline, name, version)


def _ready(pipeline: Pipeline | None) -> bool:
    return pipeline is not None and pipeline.entry and not (pipeline.broken or pipeline.stopping or pipeline.draining)


def _describe(spec: TensorSpec) -> str:
    return f"{spec.name!r} ({DATATYPES.get(spec.dtype, spec.dtype)} {list(spec.shape)})"


def check_request(request: kpb.ModelInferRequest, inputs: Sequence[TensorSpec]) -> None:
    """The request's tensors against the model's inputs, before any data is read: each one of the
    model's, with its datatype and shape, none missing. ValueError (INVALID_ARGUMENT) names the
    input and what the model takes."""
    specs = {t.name: t for t in inputs}

    def takes() -> str:  # only for a message: frames that are right pay nothing for it
        return ", ".join(_describe(t) for t in inputs)

    for t in request.inputs:
        spec = specs.get(t.name)
        if spec is None:
            raise ValueError(f"the model has no input {t.name!r}; it takes {takes()}")
        want = DATATYPES.get(spec.dtype, spec.dtype)
        if t.datatype == "BYTES":
            raise ValueError(
                f"input {t.name!r} is sent as BYTES (strings), which this agent does not serve; "
                f"the model takes {want} {list(spec.shape)} for it"
            )
        if t.datatype != want:
            sent = f"as {t.datatype}" if t.datatype else "without a datatype"
            raise ValueError(f"input {t.name!r} is sent {sent}; the model takes {want}")
        if list(t.shape) != list(spec.shape):
            raise ValueError(f"input {t.name!r} is sent with shape {list(t.shape)}; the model takes {list(spec.shape)}")
    missing = [name for name in specs if name not in {t.name for t in request.inputs}]
    if missing:
        raise ValueError(f"the request lacks input(s) {missing}; the model takes {takes()}")


def decode_inputs(request: kpb.ModelInferRequest) -> dict[str, np.ndarray]:
    """The request's tensors as arrays; ValueError (INVALID_ARGUMENT) says what is wrong."""
    raw = list(request.raw_input_contents)
    if raw and len(raw) != len(request.inputs):
        raise ValueError(f"{len(raw)} raw_input_contents for {len(request.inputs)} inputs; send one per input")
    arrays: dict[str, np.ndarray] = {}
    for i, t in enumerate(request.inputs):
        if t.name in arrays:
            raise ValueError(f"input {t.name!r} is given twice")
        if t.datatype not in NUMPY:
            raise ValueError(f"input {t.name!r}: datatype {t.datatype!r} is not served (served: {sorted(NUMPY)})")
        if any(d < 0 for d in t.shape):
            raise ValueError(f"input {t.name!r}: negative dimension in {list(t.shape)}")
        dtype = np.dtype(NUMPY[t.datatype])
        count = math.prod(t.shape)  # Python ints: no overflow however large the shape claims to be
        if raw and _has_contents(t):
            raise ValueError(
                f"input {t.name!r} has both raw_input_contents and typed contents; send its values one way only"
            )
        if raw:
            if len(raw[i]) != count * dtype.itemsize:
                raise ValueError(
                    f"input {t.name!r}: {len(raw[i])} bytes for shape {list(t.shape)} of {t.datatype} "
                    f"({count * dtype.itemsize} expected)"
                )
            value = np.frombuffer(raw[i], dtype=dtype)
        else:
            field = CONTENTS.get(t.datatype)
            values = getattr(t.contents, field) if field else ()
            if field is None or len(values) != count:
                raise ValueError(
                    f"input {t.name!r}: {len(values)} values in contents for shape {list(t.shape)} "
                    f"({count} expected); send them as contents or raw_input_contents"
                )
            _check_range(t.name, t.datatype, dtype, values)
            value = np.fromiter(values, dtype=dtype, count=count)  # not asarray: [2**63 + 1, 0] would become float64
        arrays[t.name] = value.reshape(tuple(t.shape))
    return arrays


def _has_contents(t: kpb.ModelInferRequest.InferInputTensor) -> bool:
    """Whether a tensor carries typed ``contents`` values (any field)."""
    return any(len(values) for _, values in t.contents.ListFields())


def _check_range(name: str, datatype: str, dtype: np.dtype, values: Sequence) -> None:
    """Typed integer contents travel in wider fields (UINT8 in uint32s): each value must fit its datatype."""
    if dtype.kind not in "iu" or not len(values):
        return
    info = np.iinfo(dtype)
    low, high = min(values), max(values)
    if low < info.min or high > info.max:
        bad = low if low < info.min else high
        raise ValueError(f"input {name!r}: value {bad} does not fit {datatype} ({info.min} to {info.max})")


def encode_outputs(
    request: kpb.ModelInferRequest, pipeline: Pipeline, version: str, outputs: dict[str, np.ndarray]
) -> kpb.ModelInferResponse:
    """Every output in the model's order, or those the request asks for (raw contents)."""
    wanted = [o.name for o in request.outputs] or [t.name for t in pipeline.manifest.outputs]
    reply = kpb.ModelInferResponse(model_name=request.model_name, model_version=version, id=request.id)
    for name in wanted:
        value = np.ascontiguousarray(outputs[name])
        reply.outputs.add(name=name, datatype=DATATYPES[str(value.dtype)], shape=list(value.shape))
        reply.raw_output_contents.append(value.tobytes())
    return reply


def _check_outputs(request: kpb.ModelInferRequest, pipeline: Pipeline) -> None:
    """The outputs a request asks for: each of the model's, each once (asking for one 200 times made the agent
    encode it 200 times: 87 to 792 MiB for a small request)."""
    names = [o.name for o in request.outputs]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise ValueError(f"the request asks for output(s) {repeated} more than once; ask for each once")
    known = {t.name for t in pipeline.manifest.outputs}
    unknown = [o.name for o in request.outputs if o.name not in known]
    if unknown:
        raise ValueError(f"the model has no outputs {unknown}; its outputs are {sorted(known)}")


class InferenceServicer(krpc.GRPCInferenceServiceServicer):
    """KServe v2 over ``agents.service``: errors map to gRPC status codes as in parapipe's own API."""

    def __init__(self, state: service.AgentState, version: str) -> None:
        self.state = state
        self.version = version

    def ServerLive(self, request, context):
        return kpb.ServerLiveResponse(live=True)

    def ServerReady(self, request, context):
        return kpb.ServerReadyResponse(ready=_ready(self.state.pipeline))

    def ServerMetadata(self, request, context):
        return kpb.ServerMetadataResponse(name="parapipe-agent", version=self.version, extensions=[])

    def ModelReady(self, request, context):
        try:
            pipeline = _resolve(self.state, request.name, request.version)
        except (service.NotReady, service.NotFound):  # unknown or not running: not ready, as Triton says
            return kpb.ModelReadyResponse(ready=False)
        return kpb.ModelReadyResponse(ready=_ready(pipeline))

    def ModelMetadata(self, request, context):
        try:
            pipeline = _resolve(self.state, request.name, request.version)
        except Exception as exc:
            abort(context, exc)
        m = pipeline.manifest
        return kpb.ModelMetadataResponse(
            name=m.plan_name,
            versions=[model_version(pipeline)],
            platform=PLATFORM,
            inputs=[
                kpb.ModelMetadataResponse.TensorMetadata(name=t.name, datatype=DATATYPES[t.dtype], shape=list(t.shape))
                for t in m.inputs
            ],
            outputs=[
                kpb.ModelMetadataResponse.TensorMetadata(name=t.name, datatype=DATATYPES[t.dtype], shape=list(t.shape))
                for t in m.outputs
            ],
        )

    def ModelInfer(self, request, context):
        served: list[Pipeline] = []

        def run(pipeline: Pipeline) -> dict[str, np.ndarray]:
            served[:] = [pipeline]
            _check_outputs(request, pipeline)
            check_request(request, pipeline.manifest.inputs)
            return infer_frame(pipeline, decode_inputs(request), context)

        try:
            outputs = service.serve_unary(
                self.state,
                run,
                context.time_remaining,
                context.is_active,
                lambda state: _resolve(state, request.model_name, request.model_version),
            )
        except Exception as exc:
            abort(context, exc)
        return encode_outputs(request, served[0], model_version(served[0]), outputs)

    def ModelStreamInfer(self, request_iterator, context) -> Iterator[kpb.ModelStreamInferResponse]:
        """The stream serves the pipeline running when it opens. Requests are fed while earlier ones
        run (the pipeline overlaps them); answers come back in order, a failed one as
        ``error_message``, and the stream goes on. When that pipeline stops or is replaced, the
        answers of the requests taken are sent and the stream ends with FAILED_PRECONDITION, which
        also ends its feed thread."""
        pipeline = self.state.pipeline
        try:
            if pipeline is None:
                raise service.NotReady("no pipeline is running; deploy a plan to this board first")
            if not pipeline.entry:
                m = pipeline.manifest
                raise service.NotReady(
                    f"this agent runs host {m.host!r}'s part of a plan over {', '.join(m.hosts)}; "
                    f"open the stream to the agent of the entry host {m.entry!r}"
                )
        except Exception as exc:
            abort(context, exc)

        def submit(req: kpb.ModelInferRequest) -> FrameFuture:
            try:
                _match(pipeline, req.model_name, req.model_version)
                return _submit(pipeline, req, context)
            except (service.NotFound, PipelineError, DeadlineExceeded, ValueError) as exc:
                raise Refused(str(exc)) from None
            except Exception as exc:  # anything else one request trips on is its own error, too
                log.exception("a stream request failed")
                raise Refused(f"the request failed ({type(exc).__name__}); the agent's log has why") from None

        version = model_version(pipeline)
        answers = answer_in_order(
            self.state,
            pipeline,
            request_iterator,
            context,
            submit,
            lambda: _ended(self.state, pipeline),
            broken=lambda exc: f"the request stream broke: {exc}",
            name="pp-kserve-feed",
        )
        for req, outputs, error in answers:
            if outputs is None:
                yield kpb.ModelStreamInferResponse(error_message=error)
            else:
                yield kpb.ModelStreamInferResponse(infer_response=encode_outputs(req, pipeline, version, outputs))


def _submit(pipeline: Pipeline, request: kpb.ModelInferRequest, context) -> FrameFuture:
    _check_outputs(request, pipeline)
    check_request(request, pipeline.manifest.inputs)
    return pipeline.submit(decode_inputs(request), timeout=context.time_remaining())


def _ended(state: service.AgentState, pipeline: Pipeline) -> str:
    """Why a stream's pipeline no longer serves it, and what to do."""
    now = state.pipeline
    if now is None or now is pipeline:
        return (
            f"the pipeline this stream served ({model_version(pipeline)}) was stopped; open a new stream once one runs"
        )
    return (
        f"the pipeline this stream served ({model_version(pipeline)}) was replaced by "
        f"{now.manifest.plan_name!r} version {model_version(now)!r}; open a new stream to use it"
    )


def add_to_server(state: service.AgentState, server: grpc.Server) -> None:
    """Serve the Open Inference Protocol on ``server`` (the agent's port)."""
    krpc.add_GRPCInferenceServiceServicer_to_server(InferenceServicer(state, service.AGENT_VERSION), server)
