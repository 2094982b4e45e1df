"""A unit's PU name is parsed once into a ``UnitName`` that knows its parts; plan files keep ``"a+b"``."""

from __future__ import annotations

import copy
import json
import pickle

import pytest
from hypothesis import given
from hypothesis import strategies as st

from planner.plan import Assignment, Plan, Provenance, Stage, plan_from_json
from planner.unitname import UnitName

NAMES = st.text(st.characters(whitelist_categories=("Ll", "Nd"), whitelist_characters="_-"), min_size=1, max_size=8)


@given(st.lists(NAMES, min_size=1, max_size=4))
def test_parts_round_trip_through_the_string(parts: list[str]) -> None:
    unit = UnitName.spanning(parts)
    assert unit.parts == tuple(parts)
    assert unit.spans == (len(parts) > 1)
    assert unit.first == parts[0]
    assert UnitName(str(unit)).parts == unit.parts
    assert str(unit) == "+".join(parts) and json.loads(json.dumps(unit)) == "+".join(parts)
    for again in (copy.deepcopy(unit), pickle.loads(pickle.dumps(unit))):
        assert isinstance(again, UnitName) and again.parts == unit.parts


@pytest.mark.parametrize("bad", ["", "a+", "+b", "a++b"])
def test_an_empty_part_is_refused(bad: str) -> None:
    with pytest.raises(ValueError, match="not a PU name"):
        UnitName(bad)


def test_a_plan_keeps_a_spanning_unit_as_a_plus_b_and_loads_it_as_a_unit_name() -> None:
    stage = Stage(((Assignment("a53+a73", 6, ("b0",)),),))
    plan = Plan("0" * 64, "m", "khadas-vim3", "", "coarse", {"b0": ("n0",)}, (stage,), Provenance("hand"))
    assert isinstance(plan.stages[0].groups[0][0].pu, UnitName)
    data = json.loads(json.dumps(plan.to_json()))
    assert data["stages"][0]["groups"][0][0]["pu"] == "a53+a73"
    back = plan_from_json(data).stages[0].groups[0][0].pu
    assert isinstance(back, UnitName) and back.parts == ("a53", "a73")
