"""A stopped pipeline lets its memory go: its sessions, and the pipeline itself once nothing runs it.

An agent whose pipeline restarts again and again (a peer of a multi-host plan that comes and goes,
a resume after each restart) must not keep every earlier pipeline's sessions."""

from __future__ import annotations

import gc
import platform
import shutil
import time
import weakref
from pathlib import Path

import pytest

from agents import service
from agents.bundle import verify_bundle
from agents.executor import Pipeline
from agents.memory import give_back_free_memory
from tests.support.tiny import bundle_sha, eventually, expected, frame, write_tiny_bundle


def test_a_stopped_pipeline_lets_its_sessions_go(tmp_path: Path) -> None:
    folder = write_tiny_bundle(tmp_path / "b", stages=3)
    pipeline = Pipeline(verify_bundle(folder), folder)
    pipeline.start()
    assert (pipeline.submit(frame(1)).result(timeout=30)["t2"] == expected(1, 3)).all()
    sessions = [weakref.ref(w.session) for w in pipeline.workers.values()]
    assert all(s() is not None for s in sessions)
    pipeline.stop()
    assert pipeline.wait_released(30)
    # the pipeline object is still referenced here: the sessions went with the workers, not with it
    assert all(w.session is None for w in pipeline.workers.values())
    assert all(s() is None for s in sessions)


def test_a_single_partition_pipeline_stopped_between_frames_refuses_inline_runs(tmp_path: Path) -> None:
    folder = write_tiny_bundle(tmp_path / "b", stages=1)
    pipeline = Pipeline(verify_bundle(folder), folder)
    pipeline.start()
    assert pipeline.infer_inline(frame(0)) is not None
    pipeline.stop()
    assert pipeline.wait_released(30)
    assert pipeline.infer_inline(frame(0)) is None  # no session left to run it: the caller submits (and fails)


def test_the_agent_keeps_no_earlier_pipeline_after_restarts(tmp_path: Path) -> None:
    """StartPipeline again and again (what a peer's restarts do): every earlier pipeline's sessions go,
    and the pipelines themselves are collected with metrics on and nobody scraping them (the metrics
    kept every pipeline until the next scrape)."""
    pytest.importorskip("prometheus_client")
    from agents.metrics import AgentMetrics

    folder = write_tiny_bundle(tmp_path / "b", stages=2)
    sha = bundle_sha(folder)
    state = service.AgentState(tmp_path / "agent")
    AgentMetrics(state, "test")
    shutil.copytree(folder, state.bundle_dir(sha))
    pipelines, sessions = [], []
    try:
        for i in range(5):
            service.start_pipeline(state, sha)
            running = state.pipeline
            assert running is not None
            assert (running.submit(frame(i % 3)).result(timeout=30)["t1"] == expected(i % 3, 2)).all()
            pipelines.append(weakref.ref(running))
            sessions += [weakref.ref(w.session) for w in running.workers.values()]
            del running
        live = len(state.pipeline.workers)  # type: ignore[union-attr]

        def released() -> bool:
            gc.collect()
            # the running one, and the one it replaced until the next start or scrape retires it
            return all(p() is None for p in pipelines[:-2]) and sum(s() is not None for s in sessions) == live

        eventually("earlier pipelines and their sessions let go", released)
    finally:
        service.stop_pipeline(state)


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="malloc_trim is glibc's")
def test_glibc_gives_back_free_memory() -> None:
    blocks = [bytearray(1 << 20) for _ in range(64)]
    del blocks
    assert give_back_free_memory() in (True, False)  # callable, and says whether pages went back


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="M_ARENA_MAX is glibc's")
def test_glibc_accepts_the_arena_bound() -> None:
    from agents.memory import AGENT_ARENAS, bound_arenas

    assert AGENT_ARENAS >= 1
    assert bound_arenas() is True


def _agent_with_tiny_bundle(tmp_path: Path) -> tuple[service.AgentState, str]:
    """An agent's state with a two-stage tiny bundle in place, and the bundle's sha."""
    folder = write_tiny_bundle(tmp_path / "b", stages=2)
    sha = bundle_sha(folder)
    state = service.AgentState(tmp_path / "agent")
    shutil.copytree(folder, state.bundle_dir(sha))
    return state, sha


def test_a_replaced_pipeline_is_collected_without_waiting_for_a_full_collection(tmp_path: Path) -> None:
    """A stopped pipeline and its workers refer to each other: only the cyclic collector frees it. The
    agent collects once the replaced pipeline's workers ended, so it does not wait for a full collection
    that, on an agent whose pipeline ran long enough to reach the oldest generation, came many restarts
    later (each kept its pipeline, links and channels: the soak's entry host grew ~8 MiB per peer
    restart). Automatic collection is off here, so only the agent's own collection can free it."""
    state, sha = _agent_with_tiny_bundle(tmp_path)
    gc.collect()
    gc.disable()
    try:
        service.start_pipeline(state, sha)
        first = weakref.ref(state.pipeline)  # type: ignore[arg-type]
        assert (state.pipeline.submit(frame(1)).result(timeout=30)["t1"] == expected(1, 2)).all()  # type: ignore[union-attr]
        service.start_pipeline(state, sha)  # replaces it: stopped, released in the background
        eventually("the replaced pipeline is collected", lambda: first() is None)
    finally:
        gc.enable()
        service.stop_pipeline(state)


def test_a_replaced_pipeline_still_held_when_its_workers_end_is_collected_once_let_go(tmp_path: Path) -> None:
    """The release collects as soon as the replaced pipeline's workers have ended; whoever replaced it may
    still hold it then (``start_pipeline`` had not returned, under load). One collection at that moment
    freed nothing, and with nothing else collecting the pipeline stayed: the release collects again until
    it is gone."""
    state, sha = _agent_with_tiny_bundle(tmp_path)
    gc.collect()
    gc.disable()
    try:
        service.start_pipeline(state, sha)
        held = state.pipeline
        assert held is not None
        assert (held.submit(frame(1)).result(timeout=30)["t1"] == expected(1, 2)).all()
        threads = [w.thread for w in held.workers.values()]
        first = weakref.ref(held)
        service.start_pipeline(state, sha)  # replaces it: stopped, released in the background
        for t in threads:
            t.join(30)
        time.sleep(0.3)  # the release's first collection runs while this test still holds the pipeline
        assert first() is not None
        del held
        eventually("the replaced pipeline is collected once let go", lambda: first() is None)
    finally:
        gc.enable()
        service.stop_pipeline(state)


def test_a_part_started_again_after_a_broken_link_gives_memory_back_before_loading_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A peer link breaks (the peer crashed) and the agent starts its part again once the peer is back
    (``recover``, what the link's ``on_broken`` does): the broken pipeline's sessions go first, and the heap
    they leave free goes back to the system before the new sessions load. Held, the new sessions did not
    reuse all of it (new worker threads, maybe another malloc arena) and took much of it again: the soak's
    agents peaked 8-15% above their steady size for a moment at each restart of a peer. Seen through the agent's own
    call to ``malloc_trim`` (which still runs): one comes while no session of this bundle is alive, the broken
    pipeline still installed. Only sessions of this test's bundle count: a background thread another test left
    (a release, a recovery) may load or drop sessions of its own at any moment."""
    import onnxruntime as ort

    folder = write_tiny_bundle(tmp_path / "b", stages=2)
    sha = bundle_sha(folder)
    state = service.AgentState(tmp_path / "agent")
    shutil.copytree(folder, state.bundle_dir(sha))
    ours = str(state.bundle_dir(sha))

    def sessions() -> list[ort.InferenceSession]:
        gc.collect()
        return [
            o
            for o in gc.get_objects()
            if type(o) is ort.InferenceSession and str(getattr(o, "_model_path", "")).startswith(ours)
        ]

    service.start_pipeline(state, sha)
    broken = state.pipeline
    assert broken is not None
    assert (broken.submit(frame(1)).result(timeout=30)["t1"] == expected(1, 2)).all()
    assert len(sessions()) == 2, "the two partitions' sessions, found by their files"
    seen: list[tuple[int, bool]] = []  # (live sessions, the broken pipeline still installed) at each give-back

    def give_back() -> bool:
        seen.append((len(sessions()), state.pipeline is broken))
        return give_back_free_memory()

    monkeypatch.setattr(service, "give_back_free_memory", give_back)
    try:
        service._on_broken(state, broken)("the link to host 'p' failed: UNAVAILABLE (the test)")
        eventually("the part runs again", lambda: state.pipeline is not broken and state.pipeline is not None)
        running = state.pipeline
        assert running is not None
        assert (running.submit(frame(2)).result(timeout=30)["t1"] == expected(2, 2)).all()
        assert all(w.session is None for w in broken.workers.values())
        assert (0, True) in seen, f"(live sessions, broken pipeline installed) at each give-back: {seen}"
    finally:
        service.stop_pipeline(state)
