"""The roofline: what a device profile's peak throughput and memory bandwidth say an operator takes.

The uncalibrated prediction of the cost model, and the yardstick calibration scales per op class
(``profiler.calibration``): one operator on (PU, cores) takes the longer of its compute at the PU's peak
throughput for its op class (a CPU cluster's peak shared evenly over its cores) and the time to move its
weights, inputs and outputs through the PU's memory, plus the PU's per-launch overhead.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from device_profiles.schema import DeviceProfile
from models.graph import OpGraph


@dataclass(frozen=True)
class Roofline:
    profile: DeviceProfile
    graph: OpGraph

    def node_bytes(self, node: str) -> int:
        """Bytes one operator moves through memory per frame: its weights, inputs and outputs."""
        n = self.graph.index[node]
        tensors = self.graph.tensors
        return n.param_bytes + sum(tensors[t].nbytes for t in (*n.inputs, *n.outputs) if t in tensors)

    def moved_bytes(self, members: Iterable[str]) -> int:
        """Bytes these operators move through memory per frame."""
        return sum(self.node_bytes(m) for m in sorted(set(members)))

    def ms(self, node: str, pu: str, cores: int) -> float:
        n = self.graph.index[node]
        p = self.profile.pu(pu)
        share = cores / max(1, len(p.cores)) if p.kind == "cpu" else 1.0
        compute = 0.0
        for cls, flops in n.flops_by_class:
            compute += flops / (p.peak_gflops[cls].value * share * 1e9)
        memory = self.node_bytes(node) / (p.memory_bandwidth_gbps.value * 1e9)
        return (max(compute, memory) + p.launch_overhead_us.value / 1e6) * 1e3
