"""The Open Inference Protocol's tensors <-> arrays: every datatype and shape comes back as it went,
raw or typed, and anything malformed is a ValueError (INVALID_ARGUMENT), never a crash."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from agents.inference import CONTENTS, DATATYPES, decode_inputs
from agents.proto import inference_pb2 as kpb

SHAPES = st.lists(st.integers(0, 4), min_size=0, max_size=3).map(tuple)


@st.composite
def tensors(draw) -> np.ndarray:
    dtype = draw(st.sampled_from(sorted(DATATYPES)))
    return draw(arrays(np.dtype(dtype), draw(SHAPES)))


def _request(values: dict[str, np.ndarray], raw: bool) -> kpb.ModelInferRequest:
    request = kpb.ModelInferRequest(model_name="m")
    for name, value in values.items():
        t = request.inputs.add(name=name, datatype=DATATYPES[str(value.dtype)], shape=list(value.shape))
        if raw:
            request.raw_input_contents.append(value.tobytes())
        elif t.datatype in CONTENTS:  # FP16 has no typed field: raw only
            getattr(t.contents, CONTENTS[t.datatype]).extend(value.ravel().tolist())
    return request


@settings(max_examples=150, deadline=None)
@given(st.dictionaries(st.text(min_size=1, max_size=8), tensors(), min_size=1, max_size=3), st.booleans())
@example({"x": np.array([2**63 + 1, 0], np.uint64)}, False)  # typed uint64 beyond int64 once became float64
@example({"x": np.array([-(2**63), 2**63 - 1], np.int64)}, False)
def test_every_datatype_and_shape_round_trips(values: dict[str, np.ndarray], raw: bool) -> None:
    if not raw and any(DATATYPES[str(v.dtype)] not in CONTENTS for v in values.values()):
        with pytest.raises(ValueError, match="contents"):
            decode_inputs(_request(values, raw))
        return
    got = decode_inputs(_request(values, raw))
    assert list(got) == list(values)
    for name, value in values.items():
        assert got[name].dtype == value.dtype and got[name].shape == value.shape
        np.testing.assert_array_equal(got[name], value)


@settings(max_examples=100, deadline=None)
@given(tensors(), st.integers(-3, 3))
def test_a_raw_tensor_of_the_wrong_size_is_refused(value: np.ndarray, extra: int) -> None:
    request = _request({"x": value}, raw=True)
    data = request.raw_input_contents[0]
    request.raw_input_contents[0] = data + b"\0" * extra if extra >= 0 else data[:extra]
    if extra == 0 or (extra < 0 and not data):
        return
    with pytest.raises(ValueError, match="bytes for shape"):
        decode_inputs(request)


def test_malformed_requests_say_what_is_wrong() -> None:
    x = np.zeros((1, 2), np.float32)
    twice = _request({"x": x}, raw=True)
    twice.inputs.add(name="x", datatype="FP32", shape=[1, 2])
    twice.raw_input_contents.append(x.tobytes())
    with pytest.raises(ValueError, match="given twice"):
        decode_inputs(twice)
    strings = kpb.ModelInferRequest(inputs=[kpb.ModelInferRequest.InferInputTensor(name="s", datatype="BYTES")])
    with pytest.raises(ValueError, match="BYTES"):
        decode_inputs(strings)
    negative = kpb.ModelInferRequest(
        inputs=[kpb.ModelInferRequest.InferInputTensor(name="n", datatype="FP32", shape=[-1])]
    )
    with pytest.raises(ValueError, match="negative"):
        decode_inputs(negative)
    missing = _request({"x": x, "y": x}, raw=True)
    del missing.raw_input_contents[1]
    with pytest.raises(ValueError, match="one per input"):
        decode_inputs(missing)
