"""The Open Inference Protocol (KServe v2 gRPC) on the agent, spoken by Triton's own client.

``tritonclient[grpc]`` (installed outside the environment, with the protobuf it wants) runs in
its own process as an application would, against real agent processes serving compiled plans;
its outputs must equal onnxruntime's on the whole model.
"""

from __future__ import annotations

import os
import signal
from contextlib import ExitStack
from pathlib import Path

import numpy as np
import pytest

from agents.bundle import parse_manifest
from tests.support.certs import make_certs
from tests.support.serving import compile_served, run_client, start_hosts, start_served

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
words = g.InferInput("x", [1, 16], "BYTES")  # strings, as tritonclient sends them
words.set_data_from_numpy(np.array([["w"] * 16], dtype=np.object_))
errors = {}
for what, call in {
    "bad_shape": lambda: client.infer(model, [bad, request(0)[1]], headers=headers),
    "bytes": lambda: client.infer(model, [words, request(0)[1]], headers=headers),
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
    code, message = out["errors"]["bytes"]
    assert code == "StatusCode.INVALID_ARGUMENT" and "'x'" in message and "FP32 [1, 16]" in message, message
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


STREAMS = r"""
import os, queue, signal, sys, threading, time
import numpy as np
import tritonclient.grpc as g
from tritonclient.utils import InferenceServerException, np_to_triton_dtype
from agents.client import AgentClient

frames = np.load("frames.npz")
agent = AgentClient(ARGS["url"], timeout=60)  # parapipe's own client, in the application's process

def request(i):
    inputs = []
    for name in ("x", "ids"):
        value = frames[f"{i}/{name}"]
        item = g.InferInput(name, list(value.shape), np_to_triton_dtype(value.dtype))
        item.set_data_from_numpy(value)
        inputs.append(item)
    return inputs

def until(what, check, timeout=60):
    deadline = time.monotonic() + timeout
    while not check():
        status = agent.status()
        assert time.monotonic() < deadline, f"never happened: {what} ({status.stream_feeds} feeds, " \
            f"{status.frames_in_flight} frames in flight, {status.frames_failed} failed)"
        time.sleep(0.05)

def stream():
    client = g.InferenceServerClient(ARGS["url"])
    answers = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    return client, answers

def describe(result, error):
    if error is None:
        return {"answer": result.get_response().id}
    return {"status": error.status(), "message": error.message()}

def until_ended(answers):
    # every callback until the stream ends with a status (an error_message has none)
    got = []
    while not got or got[-1].get("status") is None:
        try:
            got.append(describe(*answers.get(timeout=60)))
        except queue.Empty:
            raise AssertionError(f"the stream did not end within 60 s; it gave {got}") from None
    return got

def infer_without_deadline(out):
    try:
        g.InferenceServerClient(ARGS["url"]).infer(ARGS["model"], request(0))  # tritonclient's default: no deadline
        out["infer"] = {"answer": "answered"}
    except InferenceServerException as exc:
        out["infer"] = {"status": exc.status(), "message": exc.message()}

def main(out):
    if ARGS["phase"] == "stop":
        idle, idle_answers = stream()  # answered once, then sends nothing
        idle.async_stream_infer(ARGS["model"], request(0), request_id="idle0")
        out["idle_first"] = describe(*idle_answers.get(timeout=60))
        os.kill(ARGS["peer_pid"], signal.SIGSTOP)  # frames now go to the other host and never come back
        try:
            busy, busy_answers = stream()
            sent = ARGS["max_inflight"] + 3
            for i in range(sent):
                busy.async_stream_infer(ARGS["model"], request(i % 2), request_id=f"busy{i}")
            # the pipeline is full: the busy stream's feed thread waits for a slot
            until("both feed threads run and the pipeline is full", lambda: (
                agent.status().stream_feeds == 2 and agent.status().frames_in_flight == ARGS["max_inflight"]))
            waiting = threading.Thread(target=infer_without_deadline, args=(out,))  # waits for a slot too
            waiting.start()
            until("a ModelInfer call waits", lambda: {c.kind: c.active for c in agent.status().calls}["Infer"] == 1)
            assert agent.stop()
            waiting.join(60)
            assert not waiting.is_alive(), "ModelInfer still waits after StopPipeline"
            out["busy"] = until_ended(busy_answers)
            out["idle"] = until_ended(idle_answers)
            # the streams are still held by this client; their feed threads have ended all the same
            until("the feed threads ended", lambda: agent.status().stream_feeds == 0)
            out["feeds_after"] = agent.status().stream_feeds
        finally:
            os.kill(ARGS["peer_pid"], signal.SIGCONT)
        late, late_answers = stream()  # no pipeline: the stream ends as it opens
        out["late"] = until_ended(late_answers)
        for c in (idle, busy, late):
            c.stop_stream()
    else:
        client, answers = stream()
        client.async_stream_infer("no-such-model", request(0), request_id="wrong")  # answered, the stream goes on
        out["wrong"] = describe(*answers.get(timeout=60))
        client.async_stream_infer(ARGS["model"], request(0), request_id="before")
        out["before"] = describe(*answers.get(timeout=60))
        agent.start(ARGS["sha"])  # the same bundle started again: a new pipeline replaces the one streamed to
        out["replaced"] = until_ended(answers)
        until("the feed thread ended", lambda: agent.status().stream_feeds == 0)
        client.stop_stream()
        again, again_answers = stream()  # a new stream serves the new pipeline
        again.async_stream_infer(ARGS["model"], request(1), request_id="after")
        out["after"] = describe(*again_answers.get(timeout=60))
        again.stop_stream()


out = {}
try:
    main(out)
except BaseException:  # a stream that never ended must not keep this process alive for ever
    import traceback

    traceback.print_exc()
    sys.stderr.flush()
    os._exit(1)
print(json.dumps(out), flush=True)
os._exit(0)
"""


def test_a_tritonclient_stream_ends_when_its_pipeline_is_stopped(tmp_path: Path) -> None:
    """Open streams, idle or with a feed thread waiting for a frame slot, end with FAILED_PRECONDITION
    on StopPipeline, their feed threads too; a stream opened with no pipeline ends at once."""
    served = compile_served(tmp_path, two_hosts=True)
    _save_frames(tmp_path, served.frames(2))
    entry = served.parts[served.entry]
    max_inflight = parse_manifest((entry / "manifest.json").read_text()).max_inflight
    with ExitStack() as stack:
        agents = start_hosts(stack, served)
        other = next(a for h, a in agents.items() if h != served.entry)
        assert other.process is not None
        stack.callback(os.kill, other.process.pid, signal.SIGCONT)
        out = run_client(
            STREAMS,
            tmp_path,
            url=f"127.0.0.1:{agents[served.entry].port}",
            model="parapipe",
            phase="stop",
            peer_pid=other.process.pid,
            max_inflight=max_inflight,
        )
    assert out["idle_first"] == {"answer": "idle0"}
    *failed, end = out["busy"]
    # the frames in flight come back failed (error_message, no status), then the stream ends
    assert failed and all(f.get("status") is None and "stopped" in f["message"] for f in failed), failed
    assert len(failed) <= max_inflight + 3
    assert end["status"] == "StatusCode.FAILED_PRECONDITION" and "was stopped" in end["message"], end
    assert out["idle"] == [end] or out["idle"][-1]["status"] == "StatusCode.FAILED_PRECONDITION", out["idle"]
    assert all("status" in f for f in out["idle"]), out["idle"]  # nothing was answered after the stop
    assert out["feeds_after"] == 0
    # a call without a deadline (tritonclient's default) waits for a slot until the pipeline stops
    assert out["infer"]["status"] == "StatusCode.FAILED_PRECONDITION" and "stopped" in out["infer"]["message"]
    [late] = out["late"]
    assert late["status"] == "StatusCode.FAILED_PRECONDITION" and "no pipeline is running" in late["message"]


def test_a_tritonclient_stream_ends_when_its_pipeline_is_replaced(tmp_path: Path) -> None:
    served = compile_served(tmp_path, two_hosts=False)
    frames = served.frames(2)
    _save_frames(tmp_path, frames)
    sha = parse_manifest((served.parts[""] / "manifest.json").read_text()).sha256()
    with ExitStack() as stack:
        agent = start_served(stack, served)
        out = run_client(
            STREAMS, tmp_path, url=f"127.0.0.1:{agent.port}", model=served.plan_name, phase="replace", sha=sha
        )
        status = agent.client.status()
    assert out["wrong"]["status"] is None and "no model 'no-such-model'" in out["wrong"]["message"]
    assert out["before"] == {"answer": "before"} and out["after"] == {"answer": "after"}
    [end] = out["replaced"]
    assert end["status"] == "StatusCode.FAILED_PRECONDITION", end
    assert "was replaced" in end["message"] and "open a new stream" in end["message"], end
    assert status.frames_done == 1  # the new pipeline's count: the frame after the replacement
