"""A folder of plans as ``parapipe plan`` writes it: one JSON per plan, ``baselines/``, and the index ``plans.json``.

``write_folder`` writes every plan and then the index (each file atomically), so a
reader sees either the old index or the new one; ``read_folder`` reads the plans the
index names (or every JSON there when it is missing) and refuses plans without
predicted figures.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path

from models.files import atomic_write
from models.names import safe_name
from planner.plan import Plan, PlanError, load_plan

INDEX = "plans.json"
INDEX_VERSION = 1


def write_folder(folder: Path, plans: Sequence[Plan], baselines: Mapping[str, Plan]) -> list[str]:
    """Write the plans and baselines and the index; returns the files written, relative to ``folder``."""
    written = []
    for p in plans:
        written.append(str(p.save(folder / f"{safe_name(p.name)}.json").relative_to(folder)))
    for name, p in baselines.items():
        written.append(str(p.save(folder / "baselines" / f"{safe_name(name)}.json").relative_to(folder)))
    index = {
        "version": INDEX_VERSION,
        "plans": [f"{safe_name(p.name)}.json" for p in plans],
        "baselines": [f"baselines/{safe_name(n)}.json" for n in baselines],
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
        names = sorted(p.name for p in folder.glob("*.json"))
        base = sorted(f"baselines/{p.name}" for p in (folder / "baselines").glob("*.json"))
    plans = [load_plan(folder / n) for n in names]
    baselines = [load_plan(folder / n) for n in base]
    missing = [p.name for p in plans if p.predicted is None]
    if missing:
        raise PlanError(f"plan(s) {missing} carry no predicted figures; evaluate them with `parapipe simulate`")
    if not plans:
        raise PlanError(f"{folder} holds no plans")
    return plans, baselines
