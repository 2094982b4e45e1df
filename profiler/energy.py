"""Energy: read real sensors where they exist, otherwise model it, and always say which.

Sensors: RAPL (``/sys/class/powercap/*/energy_uj``, wrap-around at
``max_energy_range_uj``), hwmon ``energy*_input`` (uJ counters), hwmon
``power*_input`` (uW, sampled) and INA219/226/3221 rails (``in*_input`` mV x
``curr*_input`` mA, sampled). Without any, energy comes from a power model: busy
CPU time at the profile's active power plus idle time at idle power, labelled
``modelled``. The sysfs roots are parameters, and ``$PARAPIPE_POWERCAP_ROOT`` /
``$PARAPIPE_HWMON_ROOT`` move them for a whole process (a board whose sensors are
mounted elsewhere, or a test's fake tree under a real agent).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

POWERCAP = Path("/sys/class/powercap")
HWMON = Path("/sys/class/hwmon")
INA_NAMES = ("ina219", "ina226", "ina3221", "ina2xx", "ina209", "ina238")


@dataclass(frozen=True)
class EnergyReading:
    joules: float
    source: str  # "measured" or "modelled"
    sensor: str  # what it came from, e.g. "rapl:package-0" or "power model"


def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


class RaplCounter:
    """Sum of top-level RAPL domains (packages), handling counter wrap-around."""

    def __init__(self, root: Path = POWERCAP) -> None:
        self.domains = []
        for d in sorted(root.glob("intel-rapl:*")) if root.is_dir() else []:
            if d.name.count(":") != 1:  # sub-domains (core, uncore, dram) are inside the package
                continue
            if _read_int(d / "energy_uj") is None:
                continue
            wrap = _read_int(d / "max_energy_range_uj") or 2**32
            name = (d / "name").read_text().strip() if (d / "name").exists() else d.name
            self.domains.append((d / "energy_uj", wrap, name))

    def available(self) -> bool:
        return bool(self.domains)

    def read(self) -> list[int]:
        return [_read_int(p) or 0 for p, _, _ in self.domains]

    def delta_joules(self, start: list[int], end: list[int]) -> float:
        total = 0
        for (_, wrap, _), a, b in zip(self.domains, start, end, strict=True):
            total += b - a if b >= a else b + wrap - a
        return total / 1e6

    def label(self) -> str:
        return "rapl:" + ",".join(n for _, _, n in self.domains)


class HwmonSensors:
    """hwmon energy counters, power readings and INA voltage x current rails."""

    def __init__(self, root: Path = HWMON) -> None:
        self.energy: list[Path] = []
        self.power: list[Path] = []
        self.rails: list[tuple[Path, Path]] = []
        self.names: list[str] = []
        for d in sorted(root.glob("hwmon*")) if root.is_dir() else []:
            name = (d / "name").read_text().strip() if (d / "name").exists() else d.name
            energy = sorted(d.glob("energy*_input"))
            power = sorted(d.glob("power*_input"))
            if energy:
                self.energy += energy
            elif power:
                self.power += power
            elif name.startswith(INA_NAMES):
                for volt in sorted(d.glob("in*_input")):
                    idx = volt.name[2:].split("_")[0]
                    curr = d / f"curr{idx}_input"
                    if curr.exists():
                        self.rails.append((volt, curr))
            else:
                continue
            self.names.append(name)

    def available(self) -> bool:
        return bool(self.energy or self.power or self.rails)

    def counters_uj(self) -> list[int]:
        return [_read_int(p) or 0 for p in self.energy]

    def watts(self) -> float:
        w = sum((_read_int(p) or 0) / 1e6 for p in self.power)
        w += sum(((_read_int(v) or 0) / 1e3) * ((_read_int(c) or 0) / 1e3) for v, c in self.rails)
        return w

    def label(self) -> str:
        return "hwmon:" + ",".join(self.names)


@dataclass(frozen=True)
class PowerModel:
    """Modelled power of CPU cores from busy time: active W per busy core, idle W per idle core."""

    active_w_per_core: float
    idle_w_per_core: float

    def joules(self, busy_core_seconds: float, wall_seconds: float, cores: int) -> float:
        busy = min(busy_core_seconds, wall_seconds * cores)
        return busy * self.active_w_per_core + (wall_seconds * cores - busy) * self.idle_w_per_core

    def busy_joules(self, busy_core_seconds: float) -> float:
        """What busy cores cost above idling: nothing while nothing runs."""
        return max(0.0, busy_core_seconds) * max(0.0, self.active_w_per_core - self.idle_w_per_core)


class EnergyMeter:
    """Measure the energy of a stretch of work: sensors if present, else the power model.

    Use as a context manager; ``reading`` holds the result after the block. ``busy``
    returns the busy core-seconds of this process (psutil) for the modelled path.
    """

    def __init__(
        self,
        model: PowerModel,
        cores: int,
        powercap: Path | None = None,
        hwmon: Path | None = None,
        busy: Callable[[], float] | None = None,
        sample_period_s: float = 0.01,
    ) -> None:
        self.model, self.cores, self.period = model, cores, sample_period_s
        powercap = powercap or Path(os.environ.get("PARAPIPE_POWERCAP_ROOT") or POWERCAP)
        hwmon = hwmon or Path(os.environ.get("PARAPIPE_HWMON_ROOT") or HWMON)
        self.rapl, self.hwmon = RaplCounter(powercap), HwmonSensors(hwmon)
        self.busy = busy or _process_cpu_seconds
        self.reading: EnergyReading | None = None
        self._stop = threading.Event()
        self._sampled_j = 0.0

    @property
    def source(self) -> str:
        return "measured" if self.rapl.available() or self.hwmon.available() else "modelled"

    def _sample(self) -> None:
        last_t, last_w = time.perf_counter(), self.hwmon.watts()
        while not self._stop.wait(self.period):
            now, w = time.perf_counter(), self.hwmon.watts()
            self._sampled_j += (w + last_w) / 2 * (now - last_t)
            last_t, last_w = now, w
        now, w = time.perf_counter(), self.hwmon.watts()
        self._sampled_j += (w + last_w) / 2 * (now - last_t)

    def __enter__(self) -> EnergyMeter:
        self._t0, self._busy0 = time.perf_counter(), self.busy()
        self._rapl0 = self.rapl.read() if self.rapl.available() else []
        self._hw0 = self.hwmon.counters_uj()
        self._sampler = None
        if self.hwmon.power or self.hwmon.rails:
            self._sampler = threading.Thread(target=self._sample, daemon=True)
            self._sampler.start()
        return self

    def __exit__(self, *exc: object) -> None:
        wall = time.perf_counter() - self._t0
        if self._sampler is not None:
            self._stop.set()
            self._sampler.join()
        if self.rapl.available():
            self.reading = EnergyReading(
                self.rapl.delta_joules(self._rapl0, self.rapl.read()), "measured", self.rapl.label()
            )
        elif self.hwmon.available():
            counters = sum(b - a for a, b in zip(self._hw0, self.hwmon.counters_uj(), strict=True)) / 1e6
            self.reading = EnergyReading(counters + self._sampled_j, "measured", self.hwmon.label())
        else:
            joules = self.model.joules(self.busy() - self._busy0, wall, self.cores)
            self.reading = EnergyReading(joules, "modelled", "power model: busy CPU time x profile power (estimates)")


def _process_cpu_seconds() -> float:
    import psutil

    t = psutil.Process().cpu_times()
    return t.user + t.system
