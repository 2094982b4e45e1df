"""Whatever a ModelInfer request gets wrong, a real agent answers with the protocol's status and a
message naming what is wrong: an unknown model or version ``NOT_FOUND``; an unknown, missing or
BYTES input, a datatype or shape other than the model's, contents of the wrong size
``INVALID_ARGUMENT``; never ``INTERNAL``, and no malformed request reaches the pipeline."""

from __future__ import annotations

import struct
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass

import grpc
import numpy as np
import pytest
from hypothesis import event, example, given, settings
from hypothesis import strategies as st

from agents.inference import CONTENTS, NUMPY
from agents.proto import inference_pb2 as kpb
from agents.proto import inference_pb2_grpc as krpc
from tests.support.serving import Served, compile_served, start_served

pytestmark = pytest.mark.agent
INPUTS = {"x": ("FP32", [1, 16]), "ids": ("INT64", [1])}  # the served model's (tests/support/serving.py)
FAULTS = ("none", "bytes", "datatype", "shape", "size", "name", "missing")


@dataclass
class Agent:
    stub: krpc.GRPCInferenceServiceStub
    served: Served
    version: str
    status: object  # () -> the agent's StatusReply


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Agent]:
    served = compile_served(tmp_path_factory.mktemp("requests"), two_hosts=False)
    with ExitStack() as stack:
        local = start_served(stack, served)
        channel = stack.enter_context(grpc.insecure_channel(f"127.0.0.1:{local.port}"))
        stub = krpc.GRPCInferenceServiceStub(channel)
        version = stub.ModelMetadata(kpb.ModelMetadataRequest(name="parapipe"), timeout=30).versions[0]
        yield Agent(stub, served, version, local.client.status)


def _values(datatype: str, shape: list[int]) -> np.ndarray:
    """Valid values (ids within the model's table) of a datatype and shape."""
    count = int(np.prod(shape)) if shape else 1
    return np.ones(count, NUMPY[datatype]).reshape(shape)


def _bytes_tensor(count: int) -> bytes:
    """``count`` strings as tritonclient serialises BYTES: a 4-byte little-endian length, then the bytes."""
    return b"".join(struct.pack("<I", 3) + b"abc" for _ in range(count))


@st.composite
def tensor(draw, name: str, fault: str) -> tuple[kpb.ModelInferRequest.InferInputTensor, bytes, list]:
    """(tensor, its raw contents, its typed contents) for the model's input ``name`` with ``fault``."""
    datatype, shape = INPUTS[name]
    if fault == "name":
        name = draw(st.text(min_size=1, max_size=8).filter(lambda n: n not in (*INPUTS, "extra")))
    elif fault == "datatype":
        datatype = draw(st.sampled_from(sorted(set(NUMPY) - {datatype})))
    elif fault == "shape":
        shape = draw(st.lists(st.integers(0, 20), max_size=3).filter(lambda s: s != shape))
    t = kpb.ModelInferRequest.InferInputTensor(name=name, datatype=datatype, shape=shape)
    count = int(np.prod(shape)) if shape else 1
    if fault == "bytes":
        t.datatype = "BYTES"
        return t, _bytes_tensor(count), [b"abc"] * count
    value = _values(datatype, shape)
    raw, typed = value.tobytes(), value.ravel().tolist()
    if fault == "size":
        cut = draw(st.integers(1, max(1, len(typed))))
        raw, typed = raw[: -cut * value.itemsize] if draw(st.booleans()) else raw + b"\0" * value.itemsize, typed[1:]
    return t, raw, typed


@st.composite
def requests(draw) -> tuple[kpb.ModelInferRequest, str, dict[str, str]]:
    """(request, what is wrong with its model: "" | "unknown" | "version", the faulty inputs by name)."""
    model = draw(st.sampled_from(["plan", "alias", "unknown", "version"]))
    raw = draw(st.booleans())
    faults = {name: draw(st.sampled_from(FAULTS)) for name in INPUTS}
    order = draw(st.permutations(list(INPUTS)))
    extra = draw(st.booleans())
    request = kpb.ModelInferRequest(id="r")
    faulty: dict[str, str] = {}
    for name in order:
        if faults[name] == "missing":
            faulty[name] = "missing"
            continue
        t, data, typed = draw(tensor(name, faults[name]))
        if faults[name] != "none":
            faulty[t.name] = faults[name]
        _add(request, t, data, typed, raw)
    if extra:
        t = kpb.ModelInferRequest.InferInputTensor(name="extra", datatype="FP32", shape=[1])
        _add(request, t, np.ones(1, np.float32).tobytes(), [1.0], raw)
        faulty["extra"] = "name"
    return request, model, faulty


def _add(request: kpb.ModelInferRequest, t, data: bytes, typed: list, raw: bool) -> None:
    request.inputs.append(t)
    if raw:
        request.raw_input_contents.append(data)
    elif t.datatype == "BYTES":
        request.inputs[-1].contents.bytes_contents.extend(typed)
    elif t.datatype in CONTENTS:
        getattr(request.inputs[-1].contents, CONTENTS[t.datatype]).extend(typed)


def _valid() -> kpb.ModelInferRequest:
    request = kpb.ModelInferRequest(model_name="parapipe", id="r")
    for name, (datatype, shape) in INPUTS.items():
        request.inputs.add(name=name, datatype=datatype, shape=shape)
        request.raw_input_contents.append(_values(datatype, shape).tobytes())
    return request


@settings(max_examples=250, deadline=None)
@given(requests())
@example((_valid(), "plan", {}))
def test_every_malformed_request_gets_the_protocols_status_naming_the_problem(agent: Agent, case) -> None:
    request, model, faulty = case
    request.model_name = {"plan": agent.served.plan_name, "version": "parapipe"}.get(model, "parapipe")
    if model == "unknown":
        request.model_name = "no-such-model"
    if model == "version":
        request.model_version = "0" * 12 if agent.version != "0" * 12 else "1" * 12
    try:
        reply = agent.stub.ModelInfer(request, timeout=60)
    except grpc.RpcError as exc:
        code, details = exc.code(), exc.details() or ""
        event(code.name)
    else:
        event("answered")
        assert model in ("plan", "alias") and not faulty, f"answered a malformed request: {model}, {faulty}"
        assert [o.name for o in reply.outputs] == ["out:a", "scores", "label"] and reply.id == "r"
        return
    assert code not in (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN), details
    assert "Traceback" not in details
    if model in ("unknown", "version"):
        assert code == grpc.StatusCode.NOT_FOUND, (code, details)
        assert ("no-such-model" if model == "unknown" else request.model_version) in details
        return
    assert code == grpc.StatusCode.INVALID_ARGUMENT, (code, details, faulty)
    assert any(repr(name) in details for name in faulty), (details, faulty)
    if len(faulty) == 1:
        [(name, fault)] = faulty.items()
        want = INPUTS.get(name, ("", []))[0]
        if fault == "bytes":
            assert "BYTES" in details and want in details, details
        if fault == "datatype":
            assert f"the model takes {want}" in details, details
        if fault == "shape":
            assert str(INPUTS[name][1]) in details, details


def test_no_malformed_request_reached_the_pipeline(agent: Agent) -> None:
    """Run after the property above on the same agent: the pipeline failed no frame and still answers."""
    reply = agent.stub.ModelInfer(_valid(), timeout=60)
    label = np.frombuffer(reply.raw_output_contents[2], np.int64)
    assert label.shape == (1,) and 0 <= label[0] < 16
    assert agent.status().frames_failed == 0
