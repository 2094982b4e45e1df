"""The benchmark's frames back to back: sent by the frames that finish, all of them, whatever else runs."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from agents.benchmark import back_to_back, run_benchmark
from agents.bundle import MANIFEST, parse_manifest
from agents.executor import Pipeline, PipelineError
from tests.support.tiny import TABLE_ROWS, expected, frame, write_tiny_bundle


@pytest.fixture
def pipeline(tmp_path):
    folder = write_tiny_bundle(tmp_path / "b", stages=2, max_inflight=2)
    p = Pipeline(parse_manifest((folder / MANIFEST).read_text()), folder)
    p.start()
    yield p
    p.stop()


def test_frames_back_to_back_all_finish_while_other_calls_take_slots(pipeline: Pipeline) -> None:
    """Other callers take frame slots while the benchmark runs (a done-callback then finds none free and
    leaves its frame to the benchmark's thread): every frame finishes once, and the others' frames are right."""
    stop = threading.Event()
    wrong: list[int] = []
    others = [0]

    def caller() -> None:
        i = 0
        while not stop.is_set():
            idx = i % TABLE_ROWS
            if not np.array_equal(pipeline.infer(frame(idx), timeout=30)["t1"], expected(idx, 2)):
                wrong.append(i)
            others[0] += 1
            i += 1

    done = pipeline.frames_done
    threads = [threading.Thread(target=caller) for _ in range(2)]
    for t in threads:
        t.start()
    try:
        finished = back_to_back(pipeline, frame(1), 60)
    finally:
        stop.set()
        for t in threads:
            t.join(30)
    assert sorted(finished) == list(range(60))
    assert not wrong and pipeline.frames_done - done == 60 + others[0]
    assert pipeline.in_flight == 0


def test_a_failing_frame_ends_the_benchmark_with_its_error(pipeline: Pipeline) -> None:
    with pytest.raises(PipelineError, match="partition s0"):
        back_to_back(pipeline, frame(TABLE_ROWS), 20)
    result = run_benchmark(pipeline, frames=12, warmup=1)  # and the pipeline serves on
    assert result.frames == 12 and result.throughput_fps > 0
