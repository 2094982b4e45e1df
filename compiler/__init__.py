"""Compiler: a plan and its model become a checked PartitionBundle, the bridge between the planner and the agents.

``compile_plan`` lowers the plan to segments (``planner.segments``), cuts one ONNX file
per segment, looks up each unit's runtime facts once (``compiler.targets``), writes the
manifest the agent reads and runs the chained partitions against the full model before
anything leaves the host. ``host_bundles``/``write_bundles`` split a plan over several
hosts into one bundle per host.
"""

from compiler.build import (
    Compiled,
    compile_plan,
    host_bundles,
    run_chained,
    verify_compiled,
    write_bundle,
    write_bundles,
)

__all__ = [
    "Compiled",
    "compile_plan",
    "host_bundles",
    "run_chained",
    "verify_compiled",
    "write_bundle",
    "write_bundles",
]
