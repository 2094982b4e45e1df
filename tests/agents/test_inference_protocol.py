"""The Open Inference Protocol (KServe v2 gRPC) on the agent, spoken by Triton's own client.

``tritonclient[grpc]`` (installed outside the environment, with the protobuf it wants) runs in
its own process as an application would, against real agent processes serving compiled plans;
its outputs must equal onnxruntime's on the whole model.
"""

from __future__ import annotations

from contextlib import ExitStack
from pathlib import Path

import numpy as np
import pytest

from tests.support.certs import make_certs
from tests.support.serving import compile_served, run_client, start_served

pytestmark = pytest.mark.agent
TOL = 1e-5

CLIENT = r"""
import numpy as np
import tritonclient.grpc as g
from tritonclient.utils import InferenceServerException, np_to_triton_dtype

# parapipe's own client code imports in the same process, on the protobuf tritonclient brought
import google.protobuf
import agents.client
import parapipe.application
from agents.proto import parapipe_agent_pb2

headers = {"authorization": "Bearer " + ARGS["token"]} if ARGS["token"] else None
client = g.InferenceServerClient(ARGS["url"], ssl=bool(ARGS["ca"]), root_certificates=ARGS["ca"] or None)
model = ARGS["model"]
out = {"protobuf": google.protobuf.__version__}
if ARGS["token"]:  # without the token every call is refused
    try:
        client.is_server_live()
        out["without_token"] = "answered"
    except InferenceServerException as exc:
        out["without_token"] = exc.status()
out["live"] = client.is_server_live(headers=headers)
out["ready"] = client.is_server_ready(headers=headers)
out["model_ready"] = client.is_model_ready(model, headers=headers)
out["unknown_ready"] = client.is_model_ready("no-such-model", headers=headers)
meta = client.get_model_metadata(model, headers=headers, as_json=True)
out["metadata"] = meta
frames = np.load("frames.npz")
count = len({k.split("/")[0] for k in frames.files})

def request(i):
    inputs = []
    for t in meta["inputs"]:
        value = frames[f"{i}/{t['name']}"]
        item = g.InferInput(t["name"], list(value.shape), np_to_triton_dtype(value.dtype))
        item.set_data_from_numpy(value)
        inputs.append(item)
    return inputs

results = {}
for i in range(count):
    r = client.infer(model, request(i), headers=headers, request_id=str(i))
    assert r.get_response().id == str(i)
    for t in meta["outputs"]:
        results[f"{i}/{t['name']}"] = r.as_numpy(t["name"])
# only the outputs asked for
r = client.infer(model, request(0), outputs=[g.InferRequestedOutput("scores")], headers=headers)
out["asked_for"] = [o.name for o in r.get_response().outputs]
# the streaming variant: every answer, in order
import queue
answers = queue.Queue()
client.start_stream(callback=lambda result, error: answers.put((result, error)), headers=headers)
for i in range(count):
    client.async_stream_infer(model, request(i), request_id=f"s{i}")
client.stop_stream()
streamed = [answers.get(timeout=60) for _ in range(count)]
assert all(e is None for _, e in streamed), [str(e) for _, e in streamed]
out["stream_ids"] = [r.get_response().id for r, _ in streamed]
for r, _ in streamed:
    i = r.get_response().id[1:]
    for t in meta["outputs"]:
        results[f"s{i}/{t['name']}"] = r.as_numpy(t["name"])
# a wrong shape and an unknown model: the protocol's errors, not a crash
bad = g.InferInput("x", [1, 3], "FP32")
bad.set_data_from_numpy(np.zeros((1, 3), np.float32))
errors = {}
for what, call in {
    "bad_shape": lambda: client.infer(model, [bad, request(0)[1]], headers=headers),
    "unknown_model": lambda: client.infer("no-such-model", request(0), headers=headers),
}.items():
    try:
        call()
        errors[what] = "answered"
    except InferenceServerException as exc:
        errors[what] = [exc.status(), exc.message()]
out["errors"] = errors
np.savez("results.npz", **results)
print(json.dumps(out))
"""


def _save_frames(folder: Path, frames: list[dict[str, np.ndarray]]) -> None:
    np.savez(folder / "frames.npz", **{f"{i}/{k}": v for i, f in enumerate(frames) for k, v in f.items()})


def _check(out: dict, folder: Path, served, frames) -> None:
    assert out["protobuf"].startswith("6."), out["protobuf"]  # tritonclient's protobuf, not the environment's
    assert out["live"] and out["ready"] and out["model_ready"] and not out["unknown_ready"]
    meta = out["metadata"]
    assert meta["name"] == served.plan_name and meta["platform"] == "onnxruntime_onnx" and meta["versions"]
    assert [(t["name"], t["datatype"], t["shape"]) for t in meta["inputs"]] == [
        ("x", "FP32", ["1", "16"]),
        ("ids", "INT64", ["1"]),
    ]
    assert [(t["name"], t["datatype"], t["shape"]) for t in meta["outputs"]] == [
        ("out:a", "FP32", ["1", "16"]),
        ("scores", "FP32", ["1", "16"]),
        ("label", "INT64", ["1", "1"]),
    ]
    assert out["asked_for"] == ["scores"]
    assert out["stream_ids"] == [f"s{i}" for i in range(len(frames))]
    results = np.load(folder / "results.npz")
    for i, inputs in enumerate(frames):
        for name, want in served.reference(inputs).items():
            for key in (f"{i}/{name}", f"s{i}/{name}"):
                got = results[key]
                assert got.dtype == want.dtype and got.shape == want.shape, key
                assert np.max(np.abs(got.astype(np.float64) - want)) <= TOL, key
    assert out["errors"]["bad_shape"][0] == "StatusCode.INVALID_ARGUMENT"
    assert "shape" in out["errors"]["bad_shape"][1]
    assert out["errors"]["unknown_model"][0] == "StatusCode.NOT_FOUND"
    assert served.plan_name in out["errors"]["unknown_model"][1]


def test_tritonclient_gets_the_full_models_outputs_from_a_pipeline_behind_token_and_tls(tmp_path: Path) -> None:
    served = compile_served(tmp_path, two_hosts=False)
    frames = served.frames(4)
    _save_frames(tmp_path, frames)
    certs = make_certs(tmp_path / "certs", ["127.0.0.1"])
    with ExitStack() as stack:
        agent = start_served(stack, served, token="s3cret", tls=(certs.cert, certs.key, certs.ca))
        out = run_client(
            CLIENT, tmp_path, url=f"127.0.0.1:{agent.port}", model=served.plan_name, token="s3cret", ca=str(certs.ca)
        )
        assert out["without_token"] == "StatusCode.UNAUTHENTICATED"
        _check(out, tmp_path, served, frames)
        status = agent.client.status()
        # 4 frames, 4 streamed, 1 asking for one output; the bad-shape one never entered
        assert status.frames_done == 2 * len(frames) + 1 and status.frames_failed == 0


def test_tritonclient_talks_to_the_entry_agent_of_a_plan_over_two_hosts(tmp_path: Path) -> None:
    served = compile_served(tmp_path, two_hosts=True)
    assert len(served.parts) == 2 and served.entry
    frames = served.frames(3)
    _save_frames(tmp_path, frames)
    with ExitStack() as stack:
        agent = start_served(stack, served)
        out = run_client(CLIENT, tmp_path, url=f"127.0.0.1:{agent.port}", model="parapipe", token="", ca="")
        _check(out, tmp_path, served, frames)
