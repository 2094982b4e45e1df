"""The benchmark's frames back to back, sent by the frames that finish: all of them, whatever else runs, and
several at once on a pipeline of several units (the overlap of the partitions' runs shows it); the overlap is
accounted exactly."""

from __future__ import annotations

import itertools
import threading
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agents.benchmark import back_to_back, run_benchmark
from agents.bundle import MANIFEST, parse_manifest
from agents.executor import Overlap, Pipeline, PipelineError
from tests.support.tiny import TABLE_ROWS, expected, frame, write_conv_bundle, write_tiny_bundle


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
    assert pipeline.in_flight == 0
    result = run_benchmark(pipeline, frames=12, warmup=1)  # and the pipeline serves on
    assert result.frames == 12 and result.throughput_fps > 0


def test_latency_alone_is_taken_over_as_many_frames_as_the_benchmark_runs(pipeline: Pipeline) -> None:
    """More frames must mean a less noisy latency too (``tune`` doubles them while its noise is large): every
    frame of the benchmark is also run one at a time, not a fixed handful."""
    result = run_benchmark(pipeline, frames=45, warmup=1)
    assert result.frames == 45 and result.latency_alone_ms > 0
    assert [p.alone_frames for p in result.partitions] == [45, 45]


def _benchmark(folder: Path, frames: int):  # type: ignore[no-untyped-def]
    """Start the bundle's pipeline, benchmark it (3 frames of warm-up) and stop it."""
    p = Pipeline(parse_manifest((folder / MANIFEST).read_text()), folder)
    p.start()
    try:
        return run_benchmark(p, frames=frames, warmup=3)
    finally:
        p.stop()


@pytest.mark.parametrize("layout", ["two-stages", "replicas"])
def test_frames_back_to_back_run_on_both_units_at_once(layout: str, two_cores, tmp_path) -> None:
    """Two partitions on two cores (a stage each, or a replica each), frames back to back: each partition ran
    its frames with the pipeline's other frames in flight (on average at least two; one at a time reads 1.0),
    and frames' runs overlapped other frames' runs. A benchmark that collapses to one frame at a time fails
    both. Neither is a clock: how much of the time the two cores ran at once is the machine's to give (other
    processes take the cores), so only that they did is asserted, not for how long."""
    folder = write_conv_bundle(tmp_path / layout, layout)
    result = _benchmark(folder, frames=60)
    ran = [part.frames for part in result.partitions]  # 60 measured, then the window drained
    if layout == "two-stages":
        assert ran[0] == ran[1] >= 60
    else:  # frames taken in turn
        assert sum(ran) >= 60 and max(ran) - min(ran) <= 1
    assert result.in_flight >= 2.0, f"runs started with {result.in_flight:.2f} frames in flight on average"
    assert result.runs_overlapped > 0 and result.overlap > 0 and result.frames_at_once > 1


@pytest.mark.exclusive  # a unit's busy time against the run's rate: other tests on the cores would skew one part
def test_throughput_is_the_steady_state_a_unit_of_several_hops_can_reach(two_cores, tmp_path) -> None:
    """A plan of many partitions admits more frames than a short benchmark runs (bert_small's energy plan on
    ``local-biglittle``: 135). Sent all at once, they fill the pipeline and drain it, and a unit that runs
    later hops frames behind (``profiler.modulo``) has done the early hops of the last frames long before they
    leave: they then leave faster than the unit can work, and such a run read 1.41x what the busiest unit can
    do over 30 frames, 1.10x over 120. Measured in a refilled window instead, the rate is what the busiest
    unit allows: its busy time per frame times the frames a second is at most 1 (the unit runs one partition
    at a time), here within 5% for the clock's and the run's noise. This is not a clock: both figures are
    the same run's."""
    folder = write_conv_bundle(tmp_path / "zigzag", "zigzag", layers=48, max_inflight=64)
    # 30 frames: the fill-and-drain reading was 1.41x there, and one slow run weighs less than over 12
    result = _benchmark(folder, frames=30)
    first = sum(q.busy_ms / q.frames for q in result.partitions if q.name in "ace")  # the first core's unit
    second = sum(q.busy_ms / q.frames for q in result.partitions if q.name in "bd")
    share = result.throughput_fps * max(first, second) / 1000.0
    assert share <= 1.05, f"{result.throughput_fps:.1f} fps over a unit busy {max(first, second):.2f} ms a frame"
    assert result.partitions[0].frames > 30  # the window's last frames drained after the measured ones


def _brute_force(runs: list[tuple[int, float, float]]) -> tuple[float, float, float, int, int]:
    """(busy, overlap, frame-seconds, spells, overlapped spells) of runs (frame, start, end), from the intervals:
    time by elementary segments between events; a frame's spells are its runs merged where they overlap."""
    times = sorted({t for _, a, b in runs for t in (a, b)})
    busy = overlap = frame_s = 0.0
    for a, b in itertools.pairwise(times):
        frames = {f for f, s, e in runs if s <= a and b <= e}
        if frames:
            busy += b - a
            frame_s += len(frames) * (b - a)
            if len(frames) > 1:
                overlap += b - a
    spells: list[tuple[int, float, float]] = []
    for f in {f for f, _, _ in runs}:
        merged: list[list[float]] = []
        for _, s, e in sorted(r for r in runs if r[0] == f):
            if merged and s < merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], e)
            else:
                merged.append([s, e])
        spells += [(f, s, e) for s, e in merged]
    overlapped = sum(1 for f, s, e in spells if any(g != f and a < e and s < b for g, a, b in runs))
    return busy, overlap, frame_s, len(spells), overlapped


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 4), st.integers(0, 50), st.integers(1, 20)),
        min_size=1,
        max_size=12,
    )
)
def test_overlap_accounting_equals_the_intervals_measure(drawn: list[tuple[int, int, int]]) -> None:
    """For any runs (a frame, a start, a length; several partitions may run one frame at once, as parallel
    branches do), the busy time, the time two or more different frames ran, the frames running integrated over
    time, and how many of the frames' spells another frame overlapped are those of the intervals themselves."""
    runs = [(f, float(s), float(s + n)) for f, s, n in drawn]
    events = sorted([(s, 1, f) for f, s, _ in runs] + [(e, 0, f) for f, _, e in runs])  # ends first at a tie
    o = Overlap()
    for t, kind, f in events:
        if kind:
            o.start(f, t, f + 1)  # frames in flight: any count
        else:
            o.end(f, t)
    busy, overlap, frame_s, spells, overlapped = _brute_force(runs)
    assert o.busy_s == pytest.approx(busy) and o.overlap_s == pytest.approx(overlap)
    assert o.frame_s == pytest.approx(frame_s)
    assert (o.spells, o.overlapped_spells) == (spells, overlapped)
    assert o.runs == len(runs) and o.mean_in_flight == pytest.approx(sum(f + 1 for f, _, _ in runs) / len(runs))
    assert 0.0 <= o.fraction <= 1.0 and 0.0 <= o.spells_overlapped <= 1.0


def test_latency_alone_is_the_mean_of_the_frames_run_one_at_a_time(pipeline: Pipeline, monkeypatch) -> None:
    """The cost model sums mean partition times, so the latency it is compared with is a mean too: one frame
    in five held back 40 ms moves the mean by ~8 ms, where a median would not see it."""
    import time

    real = pipeline.infer
    calls = itertools.count()

    def slow_every_fifth(*args, **kwargs):  # type: ignore[no-untyped-def]
        if next(calls) % 5 == 4:
            time.sleep(0.040)
        return real(*args, **kwargs)

    monkeypatch.setattr(pipeline, "infer", slow_every_fifth)
    result = run_benchmark(pipeline, frames=20, warmup=1)
    assert result.latency_alone_ms >= 0.9 * 40.0 / 5
    assert [p.alone_frames for p in result.partitions] == [20, 20]
