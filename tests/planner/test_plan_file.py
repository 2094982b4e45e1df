"""A plan file is checked against its schema: whatever it holds, it loads or fails with one line naming the field."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
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


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(_paths(PLAN)), JSON)
def test_any_change_loads_or_is_one_line_naming_the_field(path: tuple, new: Any) -> None:
    data = _replace(PLAN, path, new)
    try:
        plan = plan_from_json(data)
    except PlanError as exc:
        message = str(exc)
        assert "\n" not in message and "Traceback" not in message
        assert message.split(":")[0] and ": " in message  # "<field>: <what is wrong>[; what to do]"
    else:
        assert all(isinstance(a.pu, UnitName) for _, _, a in plan.assignments())
        assert json.loads(json.dumps(plan.to_json()))["version"] == 1


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
    with pytest.raises(PlanError, match=r"^version: 2 is not supported"):
        plan_from_json({**PLAN, "version": 2})


def test_fields_a_newer_parapipe_wrote_are_ignored() -> None:
    plan = plan_from_json({**PLAN, "comment": "from a later version"})
    assert plan.blocks == {"b0": ("n0",), "b1": ("n1",)}
    assert plan.predicted is not None and plan.predicted.throughput_fps == 2.0
