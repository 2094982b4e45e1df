"""Profiling on the local board: op names map back, results are cached, Ctrl-C keeps what was measured."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
from typer.testing import CliRunner

from device_profiles.loader import load_profile
from device_profiles.local import throttling_available
from models.graph import build_graph
from models.onnx_io import load_onnx
from models.partition import random_feeds
from parapipe.cli import app
from profiler.costtable import CostTable
from profiler.measure import PuConfig, profile_ops, time_model
from profiler.pinning import run_pinned
from profiler.session import ProfileOptions, pu_configs, run_profile

pytestmark = pytest.mark.exclusive  # CPU time on throttled or contended cores: run alone (Makefile)


def test_op_profile_maps_back_to_onnx_node_names(exported) -> None:
    loaded = load_onnx(exported("squeezenet1_1").path)
    graph = build_graph(loaded.proto, loaded.sha256)
    timings = profile_ops(loaded.proto.SerializeToString(), random_feeds(graph, loaded.proto), PuConfig("cpu", (0,), 1))
    names = {n.name for n in graph.nodes}
    assert set(timings) == names, "at ORT_DISABLE_ALL every node keeps its name"
    assert all(t.repeats == 10 and t.median_ms >= 0 for t in timings.values())


def test_worker_is_pinned_to_its_cores() -> None:
    import os

    assert run_pinned(lambda: sorted(os.sched_getaffinity(0)), (0,)) == [0]


def test_throttled_worker_joins_its_cgroup() -> None:
    why = throttling_available()
    if why:
        pytest.skip(why)

    def my_cgroup() -> str:
        return Path(f"/proc/self/task/{threading.get_native_id()}/cgroup").read_text()

    inside = run_pinned(my_cgroup, (1,), throttle_percent=40, name="test-little")
    assert "parapipe/test-little" in inside
    group = Path("/sys/fs/cgroup/cpu/parapipe/test-little")
    quota, period = int((group / "cpu.cfs_quota_us").read_text()), int((group / "cpu.cfs_period_us").read_text())
    assert quota / period == pytest.approx(0.40)


def test_a_throttled_run_records_the_work_it_did_not_the_quota_it_waited_for(tmp_path: Path) -> None:
    """A run of a few ms alone on a core held to 40% of each CFS period waits for the quota after its first
    1 ms; what is recorded is the work it did at full speed (its CPU time), side by side about what the same
    core records unthrottled, not the 2x or more the wait adds."""
    why = throttling_available()
    if why:
        pytest.skip(why)
    from tests.parapipe.test_tune import _conv_chain_model

    # a 256x256 map: four times the work of test_tune's chain, so that a fast core (1.6 ms at 128 on 12-04's
    # machine) still runs it longer than two quotas
    loaded = load_onnx(_conv_chain_model(tmp_path / "chain.onnx", side=256))
    model = loaded.proto.SerializeToString()
    graph = build_graph(loaded.proto, loaded.sha256)
    feeds = random_feeds(graph, loaded.proto)
    free = time_model(model, feeds, PuConfig("big", (1,), 1), warmup=2, repeats=8)
    throttled = time_model(model, feeds, PuConfig("little", (1,), 1, throttle_percent=40), warmup=2, repeats=8)
    assert free.median_ms > 2.0, "the run must be longer than one period's quota (1 ms) for the test to say anything"
    assert throttled.median_ms < 1.6 * free.median_ms, (throttled, free)


def test_a_throttled_cores_blocks_are_recorded_as_warm_as_the_same_core_unthrottled(exported) -> None:
    """squeezenet1_1's coarse blocks, each well within one period's quota (1 ms), on a core held to 40% and on
    the same core free: what is recorded is about the same work. Timed after an idle period each (for the
    quota to refill), the throttled core's runs started with cold caches and summed 1.9x the free core's on
    12-04's machine (7.27 against 3.78 ms), and every plan that put blocks on LITTLE was predicted too slow."""
    why = throttling_available()
    if why:
        pytest.skip(why)
    from models.coarsen import coarsen
    from models.inputs import tensor_values
    from models.partition import GroupExtractor

    loaded = load_onnx(exported("squeezenet1_1").path)
    graph = build_graph(loaded.proto, loaded.sha256)
    values = tensor_values(loaded.ort_proto, random_feeds(graph, loaded.proto))
    extractor = GroupExtractor(loaded.proto, graph)
    free = throttled = 0.0
    for block in coarsen(graph, "coarse").nodes:
        part = extractor.extract("block", block.members)
        model, feeds = part.model.SerializeToString(), {t: values[t] for t in part.inputs}
        free += time_model(model, feeds, PuConfig("big", (1,), 1), warmup=2, repeats=8).median_ms
        throttled += time_model(
            model, feeds, PuConfig("little", (1,), 1, throttle_percent=40), warmup=2, repeats=8
        ).median_ms
    assert throttled < 1.3 * free, (throttled, free)


def test_profile_cli_measures_then_reuses(exported, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("PARAPIPE_HOME", str(tmp_path))
    model = exported("squeezenet1_1").path
    runner = CliRunner()
    first = runner.invoke(app, ["profile", str(model), "--board", "local", "--repeats", "3", "--warmup", "1", "--json"])
    assert first.exit_code == 0, first.output
    result = json.loads(first.stdout)
    assert result["measured"] > 0 and result["reused"] == 0
    assert result["energy_source"] == "modelled"
    assert (tmp_path / "costs.json").is_file()
    table = CostTable.load(tmp_path / "costs.json")
    kinds = {e.kind for e in table}
    assert kinds == {"op", "block", "partition"}
    assert all(e.energy_source == "modelled" for e in table if e.kind != "op")
    assert result["holdout"]["count"] > 0
    again = runner.invoke(app, ["profile", str(model), "--board", "local", "--repeats", "3", "--warmup", "1", "--json"])
    assert json.loads(again.stdout)["measured"] == 0, "a repeated run must reuse the cost table"
    shown = runner.invoke(app, ["profile", str(model), "--board", "local", "--repeats", "3", "--warmup", "1"])
    assert shown.exit_code == 0, shown.output
    assert "held-out error" in shown.stdout and "cpux" in shown.stdout
    assert f"0 measured, {result['measured']} reused from" in " ".join(shown.stdout.split())


def test_interrupted_profile_keeps_what_was_measured(exported, tmp_path: Path) -> None:
    loaded = load_onnx(exported("squeezenet1_1").path)
    graph = build_graph(loaded.proto, loaded.sha256)
    profile = load_profile("local")
    configs = pu_configs(profile)[:1]
    path = tmp_path / "costs.json"

    def stop_after_five(what: str, done: int, total: int) -> None:
        if done == 5:
            raise KeyboardInterrupt

    options = ProfileOptions(repeats=3, warmup=1, progress=stop_after_five)
    summary = run_profile(loaded, graph, profile, CostTable(), path, configs, options)
    assert summary.interrupted
    kept = len(CostTable.load(path))
    assert kept == summary.measured > 0
    resumed = run_profile(
        loaded, graph, profile, CostTable.load(path), path, configs, ProfileOptions(repeats=3, warmup=1)
    )
    assert not resumed.interrupted
    assert resumed.reused == kept, "the resumed run starts where the interrupted one stopped"
    assert resumed.measured > 0


def test_profile_refuses_unreachable_boards_and_foreign_pus(exported) -> None:
    model = str(exported("squeezenet1_1").path)
    result = CliRunner().invoke(app, ["profile", model, "--board", "khadas-vim3"])
    assert result.exit_code == 2 and "parapipe boards add" in result.output
    result = CliRunner().invoke(app, ["profile", model, "--board", "local", "--pu", "npu"])
    assert result.exit_code == 2 and "no PU 'npu'" in result.output
