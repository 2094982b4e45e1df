"""A plan file is checked against its schema: whatever it holds, it loads or fails with one line naming the field."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from planner.plan import PlanError, plan_from_json
from planner.unitname import UnitName

PLAN: dict[str, Any] = {
    "version": 1,
    "model_sha256": "x",
    "device": "local",
    "blocks": {"b0": ["n0"], "b1": ["n1"]},
    "stages": [{"groups": [[{"pu": "cpu", "cores": 1, "blocks": ["b0", "b1"], "core_ids": [0]}]]}],
    "provenance": {"method": "hand", "seconds": 0.5},
    "predicted": {"latency_ms": 1.0, "throughput_fps": 2, "energy_mj": 3.0},
}
# a plan with a block in int8: version 2, with the calibration ranges and the accuracy it promises
INT8_PLAN: dict[str, Any] = {
    **PLAN,
    "version": 2,
    "int8": ["b1"],
    "precision": {
        "ranges": {"t0": [-1.5, 2], "t1": [0.0, 6.0]},
        "metric": "top1",
        "budget": 0.01,
        "calibration_frames": 16,
        "measured": {"top1": 0.004, "relerr": 0.05},
        "held_out_frames": 24,
        "int8_ms": {"b1": {"cpux1": 0.4}},
    },
}
# a plan with a block in fp16 (on a GPU): version 3, with the fp16 time it was priced at and that time's source
FP16_PLAN: dict[str, Any] = {
    **PLAN,
    "version": 3,
    "blocks": {"b0": ["n0"], "b1": ["n1"], "b2": ["n2"]},
    "stages": [
        {"groups": [[{"pu": "cpu", "cores": 1, "blocks": ["b0", "b1"], "core_ids": [0]}]]},
        {"groups": [[{"pu": "gpu", "cores": 1, "blocks": ["b2"]}]]},
    ],
    "int8": ["b1"],
    "fp16": ["b2"],
    "precision": {
        **INT8_PLAN["precision"],
        "fp16_ms": {"b2": {"gpux1": 0.2}},
        "fp16_source": {"b2": {"gpux1": "spec-sheet"}},
    },
}


def _paths(value: Any, at: tuple = ()) -> list[tuple]:
    out = [at]
    if isinstance(value, dict):
        for k, v in value.items():
            out += _paths(v, (*at, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += _paths(v, (*at, i))
    return out


def _replace(data: Any, path: tuple, new: Any) -> Any:
    if not path:
        return new
    data = copy.deepcopy(data)
    inner = data
    for k in path[:-1]:
        inner = inner[k]
    inner[path[-1]] = new
    return data


JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 3) | st.floats(allow_nan=False) | st.text(max_size=4),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=6,
)


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.sampled_from(
        [(PLAN, p) for p in _paths(PLAN)]
        + [(INT8_PLAN, p) for p in _paths(INT8_PLAN)]
        + [(FP16_PLAN, p) for p in _paths(FP16_PLAN)]
    ),
    JSON,
)
@example((PLAN, ("blocks",)), {"\n": None})  # a key with a line break: quoted in the one-line message
def test_any_change_loads_or_is_one_line_naming_the_field(where: tuple, new: Any) -> None:
    base, path = where
    data = _replace(base, path, new)
    try:
        plan = plan_from_json(data)
    except PlanError as exc:
        message = str(exc)
        assert "\n" not in message and "Traceback" not in message
        assert message.split(":")[0] and ": " in message  # "<field>: <what is wrong>[; what to do]"
    else:
        assert all(isinstance(a.pu, UnitName) for _, _, a in plan.assignments())
        written = json.loads(json.dumps(plan.to_json()))
        # all-fp32 plans stay readable by older parapipes, int8 ones by those that know int8
        assert written["version"] == (3 if plan.fp16 else 2 if plan.int8 else 1)
        assert plan_from_json(written) == plan


@pytest.mark.parametrize(
    ("path", "value", "field"),
    [
        (("stages", 0, "groups", 0, 0, "cores"), 0, "stages[0].groups[0][0].cores"),
        (("stages", 0, "groups", 0, 0, "cores"), True, "stages[0].groups[0][0].cores"),
        (("stages", 0, "groups", 0, 0, "pu"), "cpu+", "stages[0].groups[0][0].pu"),
        (("stages", 0, "groups", 0, 0, "blocks", 1), "b9", "stages[0].groups[0][0].blocks: unknown block 'b9'"),
        (("stages", 0, "groups", 0), [], "stages[0].groups[0]: must not be empty"),
        (("blocks", "b0"), "n0", "blocks.b0"),
        (("predicted", "latency_ms"), "fast", "predicted.latency_ms"),
        (("provenance", "gap"), [1], "provenance.gap"),
        (("notes",), 5, "notes"),
        (("device",), None, "device"),
    ],
)
def test_a_malformed_plan_names_the_field(path: tuple, value: Any, field: str) -> None:
    with pytest.raises(PlanError) as info:
        plan_from_json(_replace(PLAN, path, value))
    assert str(info.value).startswith(field), str(info.value)
    assert "\n" not in str(info.value)


def test_a_missing_field_and_a_later_version_say_so() -> None:
    with pytest.raises(PlanError, match=r"^stages: missing field"):
        plan_from_json({k: v for k, v in PLAN.items() if k != "stages"})
    with pytest.raises(PlanError, match=r"^version: 4 is not supported"):
        plan_from_json({**PLAN, "version": 4})


def test_fields_a_newer_parapipe_wrote_are_ignored() -> None:
    plan = plan_from_json({**PLAN, "comment": "from a later version"})
    assert plan.blocks == {"b0": ("n0",), "b1": ("n1",)}
    assert plan.predicted is not None and plan.predicted.throughput_fps == 2.0


def test_an_int8_plan_round_trips_and_an_old_plan_loads_as_all_fp32() -> None:
    plan = plan_from_json(INT8_PLAN)
    assert plan.int8 == ("b1",) and plan.precision_of("b0") == "fp32" and plan.precision_of("b1") == "int8"
    assert plan.precision is not None and plan.precision.ranges == {"t0": (-1.5, 2.0), "t1": (0.0, 6.0)}
    assert plan.precision.metric == "top1" and dict(plan.precision.measured)["top1"] == 0.004
    assert plan.precision_mix() == "int8 1/2 blocks (1 of 2 nodes)"
    again = json.loads(json.dumps(plan.to_json()))
    assert again["version"] == 2 and again["int8"] == ["b1"] and plan_from_json(again) == plan
    old = plan_from_json(PLAN)  # written before precisions existed
    assert old.int8 == () and old.precision is None and old.precision_mix() == "fp32"
    assert "int8" not in old.to_json() and old.to_json()["version"] == 1


def test_an_fp16_plan_round_trips_as_version_3() -> None:
    plan = plan_from_json(FP16_PLAN)
    assert plan.fp16 == ("b2",) and plan.int8 == ("b1",) and plan.reduced == ("b1", "b2")
    assert [plan.precision_of(b) for b in ("b0", "b1", "b2")] == ["fp32", "int8", "fp16"]
    assert plan.reduced_ms("b2", "gpux1") == 0.2 and plan.reduced_ms("b1", "cpux1") == 0.4
    assert plan.reduced_ms("b0", "cpux1") is None
    assert plan.precision_mix() == "int8 1/3 blocks (1 of 3 nodes) + fp16 1/3 blocks (1 of 3 nodes)"
    again = json.loads(json.dumps(plan.to_json()))
    assert again["version"] == 3 and again["fp16"] == ["b2"] and plan_from_json(again) == plan
    assert again["precision"]["fp16_source"] == {"b2": {"gpux1": "spec-sheet"}}
    int8_only = plan_from_json(INT8_PLAN).to_json()  # an int8 plan's file is as it was
    assert "fp16" not in int8_only and "fp16_ms" not in int8_only["precision"] and int8_only["version"] == 2


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        (("fp16", 0), "b9", "fp16[0]: unknown block 'b9'"),
        (("fp16", 0), "b1", "fp16: block 'b1' is in int8 too"),
        (("precision",), None, "precision: the plan runs 1 block(s) in int8 but carries no calibration ranges"),
        (("precision", "fp16_ms", "b2", "gpux1"), "fast", "precision.fp16_ms.b2.gpux1"),
    ],
)
def test_a_malformed_fp16_plan_names_the_field(path: tuple, value: Any, message: str) -> None:
    with pytest.raises(PlanError) as info:
        plan_from_json(_replace(FP16_PLAN, path, value))
    assert str(info.value).startswith(message), str(info.value)


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        (("int8", 0), "b9", "int8[0]: unknown block 'b9'"),
        (("precision",), None, "precision: the plan runs 1 block(s) in int8 but carries no calibration ranges"),
        (("precision", "ranges"), {}, "precision.ranges: empty"),
        (("precision", "ranges", "t0"), [3.0, 1.0], "precision.ranges: tensor 't0': [3.0, 1.0] is not a range"),
        (("precision", "ranges", "t0"), [1.0], "precision.ranges.t0"),
        (("precision", "metric"), "mAP", "precision.metric: unknown metric 'mAP'"),
        (("precision", "budget"), -0.1, "precision.budget"),
        (("precision", "int8_ms", "b1", "cpux1"), -1.0, "precision.int8_ms.b1.cpux1"),
    ],
)
def test_a_malformed_precision_names_the_field(path: tuple, value: Any, message: str) -> None:
    with pytest.raises(PlanError) as info:
        plan_from_json(_replace(INT8_PLAN, path, value))
    assert str(info.value).startswith(message), str(info.value)
    assert "\n" not in str(info.value)
