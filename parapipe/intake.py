"""Opening the user's model the same way in every command, with the input shapes and data it was planned for.

A plan records its inputs (``Plan.inputs``: dtype, shape and how frames are made).
Every command that reads a model for a plan (compile, run, deploy, tune, show) opens
it with those shapes unless the user gives others, and with ``--input-data`` when
given; every command that reads a model alone (inspect, partition, profile, plan,
simulate) takes ``--input-shape`` and ``--input-data``.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from models.onnx_io import LoadedModel, load_onnx, parse_input_shapes
from planner.plan import Plan


def open_model(
    path: Path,
    input_shape: list[str] | None = None,
    input_data: Path | None = None,
    plan: Plan | None = None,
) -> LoadedModel:
    """Load ``path`` with the CLI's ``--input-shape``/``--input-data``, falling back to the plan's inputs."""
    shapes = parse_input_shapes(input_shape)
    if plan is not None and plan.inputs and shapes is None and input_data is None:
        shapes = {s.name: s.shape for s in plan.inputs}
    loaded = load_onnx(path, shapes, input_data)
    if plan is not None and plan.inputs and input_data is None:
        loaded = dataclasses.replace(loaded, inputs=tuple(plan.inputs))
    return loaded


def generated_note(loaded: LoadedModel) -> str:
    """One line saying which inputs were generated (and how), or "" when all came from --input-data."""
    made = [s for s in loaded.inputs if s.generated]
    if not made:
        return ""
    return "generated inputs: " + "; ".join(s.describe() for s in made) + " (give real ones with --input-data FILE.npz)"
