"""The roofline: what a device profile's peak throughput and memory bandwidth say an operator takes.

The uncalibrated prediction of the cost model, and the yardstick calibration scales per op class
(``profiler.calibration``): one operator on (PU, cores) takes the longer of its compute at the PU's peak
throughput for its op class (a CPU cluster's peak shared evenly over its cores) and the time to move its
weights, inputs and outputs through the PU's memory, plus the PU's per-launch overhead.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from device_profiles.schema import DeviceProfile
from models.graph import OpGraph


@dataclass(frozen=True)
class Roofline:
    profile: DeviceProfile
    graph: OpGraph
    # (node, PU, cores, precision) -> ms: a pure function of the two above, asked again for every partition a
    # planner prices (thousands of times per plan)
    _ms: dict[tuple[str, str, int, str], float] = field(default_factory=dict, init=False, compare=False, repr=False)

    def node_bytes(self, node: str) -> int:
        """Bytes one operator moves through memory per frame: its weights, inputs and outputs."""
        n = self.graph.index[node]
        tensors = self.graph.tensors
        return n.param_bytes + sum(tensors[t].nbytes for t in (*n.inputs, *n.outputs) if t in tensors)

    def moved_bytes(self, members: Iterable[str]) -> int:
        """Bytes these operators move through memory per frame."""
        return sum(self.node_bytes(m) for m in sorted(set(members)))

    def ms(self, node: str, pu: str, cores: int, precision: str = "fp32") -> float:
        """The operator's time in fp32, or in fp16 (``precision="fp16"``, on a PU whose profile gives its
        ``fp16_peak_ratio``): its compute at that multiple of the fp32 peak, half its bytes to move."""
        key = (node, pu, cores, precision)
        if key not in self._ms:
            self._ms[key] = self._compute_ms(node, pu, cores, precision)
        return self._ms[key]

    def _compute_ms(self, node: str, pu: str, cores: int, precision: str) -> float:
        n = self.graph.index[node]
        p = self.profile.pu(pu)
        speed, width = 1.0, 1.0
        if precision == "fp16":
            if p.fp16_peak_ratio is None:
                raise ValueError(f"PU {pu!r} gives no fp16_peak_ratio: its fp16 times cannot be derived")
            speed, width = p.fp16_peak_ratio.value, 0.5
        share = cores / max(1, len(p.cores)) if p.kind == "cpu" else 1.0
        compute = 0.0
        for cls, flops in n.flops_by_class:
            compute += flops / (p.peak_gflops[cls].value * speed * share * 1e9)
        memory = width * self.node_bytes(node) / (p.memory_bandwidth_gbps.value * 1e9)
        return (max(compute, memory) + p.launch_overhead_us.value / 1e6) * 1e3

    def fp16_ratio(self, members: Iterable[str], pu: str, cores: int) -> float:
        """A group's fp16 time over its fp32 time on the PU, by the roofline (what scales a calibrated fp32
        figure to an fp16 one where no fp16 time is measured)."""
        nodes = sorted(set(members))
        fp32 = sum(self.ms(m, pu, cores) for m in nodes)
        return sum(self.ms(m, pu, cores, "fp16") for m in nodes) / fp32 if fp32 > 0 else 1.0
