"""A folder of plans as ``parapipe plan`` writes it: one JSON per plan, ``baselines/``, and the index ``plans.json``.

``write_folder`` writes every plan, then a copy of the best plan per objective under a
name that is the same on every machine (``latency.json``, ``throughput.json``,
``energy.json``: what a user or a README can type without knowing what the solver
found), and then the index (each file atomically), so a reader sees either the old
index or the new one. The index lists the plans, the baselines and, under ``"best"``,
which file holds the best plan for each objective. ``read_folder`` reads the plans the
index names (or every JSON there but the best-of copies when it is missing) and
refuses plans without predicted figures.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path

from models.files import atomic_write
from models.names import safe_name
from planner.objective import Objective
from planner.plan import Plan, PlanError, load_plan
from planner.select import Constraints, select_plan

INDEX = "plans.json"
INDEX_VERSION = 1
BEST = {o.value: f"{o.value}.json" for o in Objective}  # objective -> the fixed file name of its best plan


def best_plans(plans: Sequence[Plan]) -> dict[str, Plan]:
    """The best plan per objective among ``plans`` (as ``parapipe select --objective`` picks it); {} when none has
    predicted figures."""
    if not any(p.predicted is not None for p in plans):
        return {}
    return {o.value: select_plan(plans, o, Constraints()) for o in Objective}


def write_folder(folder: Path, plans: Sequence[Plan], baselines: Mapping[str, Plan]) -> list[str]:
    """Write the plans and baselines and the index; returns the files written, relative to ``folder``."""
    written = []
    for p in plans:
        written.append(str(p.save(folder / f"{safe_name(p.name)}.json").relative_to(folder)))
    for name, p in baselines.items():
        written.append(str(p.save(folder / "baselines" / f"{safe_name(name)}.json").relative_to(folder)))
    own = {f"{safe_name(p.name)}.json" for p in plans}
    best = {}
    for objective, p in best_plans(plans).items():
        fixed = BEST[objective]
        if fixed in own:  # a plan of that very name: point at its own file rather than overwrite it
            best[objective] = f"{safe_name(p.name)}.json"
            continue
        written.append(str(p.save(folder / fixed).relative_to(folder)))
        best[objective] = fixed
    for objective, fixed in BEST.items():  # a copy left by an earlier plan run must not outlive its index
        if objective not in best and fixed not in own:
            (folder / fixed).unlink(missing_ok=True)
    index = {
        "version": INDEX_VERSION,
        "plans": [f"{safe_name(p.name)}.json" for p in plans],
        "baselines": [f"baselines/{safe_name(n)}.json" for n in baselines],
        "best": best,
    }
    atomic_write(folder / INDEX, json.dumps(index, indent=2) + "\n")
    return written


def _inside(folder: Path, name: object) -> bool:
    if not isinstance(name, str) or not name.endswith(".json"):
        return False
    parts = Path(name).parts
    return not Path(name).is_absolute() and ".." not in parts and len(parts) <= 2


def read_folder(folder: Path) -> tuple[list[Plan], list[Plan]]:
    """(plans, baselines) of a folder written by ``write_folder``."""
    index = folder / INDEX
    if not folder.is_dir():
        raise PlanError(f"{folder} is not a folder of plans; run `parapipe plan ... -o {folder}` first")
    if index.exists():
        try:
            data = json.loads(index.read_text())
            names, base = list(data["plans"]), list(data.get("baselines", []))
        except (json.JSONDecodeError, KeyError, TypeError, UnicodeDecodeError) as exc:
            raise PlanError(f"{index} is damaged ({exc}); re-run `parapipe plan`") from None
        bad = [n for n in [*names, *base] if not _inside(folder, n)]
        if bad:
            raise PlanError(f"{index} names {bad[0]!r}, not a plan file inside {folder}; re-run `parapipe plan`")
    else:
        names = sorted(p.name for p in folder.glob("*.json") if p.name not in BEST.values())
        base = sorted(f"baselines/{p.name}" for p in (folder / "baselines").glob("*.json"))
    plans = [load_plan(folder / n) for n in names]
    baselines = [load_plan(folder / n) for n in base]
    missing = [p.name for p in plans if p.predicted is None]
    if missing:
        raise PlanError(f"plan(s) {missing} carry no predicted figures; evaluate them with `parapipe simulate`")
    if not plans:
        raise PlanError(f"{folder} holds no plans")
    return plans, baselines
