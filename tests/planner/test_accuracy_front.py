"""Accuracy is an axis of the Pareto front: a plan that loses more accuracy than another is kept only where it is
faster, more frugal or carries more frames; two plans with the same placement in other precisions are two plans."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from planner.plan import Assignment, Plan, PlanPrecision, Predicted, Provenance, Stage
from planner.search import dominates, pareto_front, signature

BLOCKS = {"b0": ("n0",), "b1": ("n1",)}


def _plan(
    name: str, latency: float, fps: float, energy: float, loss: float | None, int8: tuple[str, ...] = (), cores: int = 1
) -> Plan:
    """A plan on ``cores`` cores; ``loss``: the measured loss of its int8 blocks (None: all-fp32)."""
    precision = None
    if loss is not None:
        int8 = int8 or ("b1",)
        precision = PlanPrecision({"t": (0.0, 1.0)}, "relerr", 0.01, measured=(("relerr", loss),), held_out_frames=4)
    stage = Stage(((Assignment("cpu", cores, ("b0", "b1"), tuple(range(cores))),),))
    return Plan(
        "x", "m", "local", "", "coarse", BLOCKS, (stage,), Provenance(), Predicted(latency, fps, energy),
        Predicted(latency, fps, energy, method="simulated"), name=name, int8=int8 if loss is not None else (),
        precision=precision,
    )  # fmt: skip


def test_a_faster_plan_that_loses_accuracy_stays_beside_the_exact_one() -> None:
    exact = _plan("exact", 10.0, 100.0, 5.0, None)
    lossy = _plan("lossy", 8.0, 125.0, 4.0, 0.008)
    worse = _plan("worse", 8.5, 120.0, 4.5, 0.009, ("b0",))  # slower than lossy and loses more: dominated
    assert exact.accuracy_loss() == 0.0 and lossy.accuracy_loss() == 0.008
    assert not dominates(lossy, exact) and not dominates(exact, lossy)
    assert dominates(lossy, worse)
    assert [p.name for p in pareto_front([worse, exact, lossy])] == ["lossy", "exact"]
    # the same placement in another precision is another plan
    assert signature(exact) != signature(lossy)
    # a plan with int8 blocks whose loss was not measured counts at the budget it promises
    unmeasured = _plan("unmeasured", 8.0, 125.0, 4.0, None)
    promised = Plan(**{**unmeasured.__dict__, "int8": ("b1",), "precision": PlanPrecision({}, "relerr", 0.01)})
    assert promised.accuracy_loss() == 0.01


FIGURES = st.tuples(
    st.floats(1.0, 20.0), st.floats(10.0, 200.0), st.floats(1.0, 10.0), st.none() | st.floats(0.0, 0.02)
)


@settings(max_examples=100, deadline=None)
@given(st.lists(FIGURES, min_size=1, max_size=8))
def test_the_front_is_exactly_the_plans_no_other_dominates(figures: list) -> None:
    plans = [_plan(f"p{i}", lat, fps, mj, loss, cores=1 + i) for i, (lat, fps, mj, loss) in enumerate(figures)]
    front = pareto_front(plans)
    assert front, "some plan is never dominated"
    for p in front:
        assert not any(dominates(q, p) for q in plans if q is not p)
    for p in plans:  # every plan left out is dominated by one kept
        assert p in front or any(dominates(q, p) for q in front)


def test_pareto_and_show_print_the_precision_mix_and_the_measured_accuracy(tmp_path) -> None:
    """``pareto`` (table, json, csv) and ``show`` (text, json) report each plan's precision mix and measured loss."""
    import csv
    import dataclasses
    import io
    import json

    from typer.testing import CliRunner

    from parapipe.cli import app
    from planner.catalog import write_folder

    exact = _plan("exact", 10.0, 100.0, 5.0, None)
    lossy = _plan("lossy", 8.0, 125.0, 4.0, 0.008)
    half = dataclasses.replace(
        _plan("half", 9.0, 110.0, 4.5, 0.002, ("b0",)), int8=(), fp16=("b0",), name="half"
    )  # fmt: skip
    write_folder(tmp_path, [exact, lossy, half], {})
    shown = CliRunner().invoke(app, ["pareto", str(tmp_path), "--format", "json"])
    assert shown.exit_code == 0, shown.output
    rows = {r["plan"]: r for r in json.loads(shown.output)["front"]}
    assert set(rows) == {"exact", "lossy", "half"}, "each trades accuracy for speed"
    assert rows["exact"]["precision"] == "fp32" and rows["exact"]["accuracy_loss"] == 0.0
    assert rows["lossy"]["precision"].startswith("int8 1/2") and rows["lossy"]["accuracy_loss"] == 0.008
    assert rows["half"]["precision"].startswith("fp16 1/2") and rows["half"]["fp16_blocks"] == 1
    assert rows["half"]["accuracy"].startswith("relerr loss 0.002 (budget 0.01, 4 held-back frames)")
    table = CliRunner().invoke(app, ["pareto", str(tmp_path)])
    assert table.exit_code == 0 and "relerr loss 0.008" in table.output and "fp16 1/2" in table.output
    as_csv = CliRunner().invoke(app, ["pareto", str(tmp_path), "--format", "csv"])
    by_plan = {r["plan"]: r for r in csv.DictReader(io.StringIO(as_csv.output))}
    assert by_plan["lossy"]["accuracy_loss"] == "0.008" and by_plan["half"]["precision"].startswith("fp16")
    text = CliRunner().invoke(app, ["show", str(tmp_path / "half.json")])
    assert text.exit_code == 0 and "precision: fp16 1/2 blocks" in text.output and "relerr 0.002" in text.output
    raw = json.loads(CliRunner().invoke(app, ["show", str(tmp_path / "half.json"), "--json"]).output)
    assert raw["fp16"] == ["b0"] and raw["precision"]["measured"] == {"relerr": 0.002} and raw["version"] == 3
