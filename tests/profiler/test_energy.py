"""Energy readers against fake sysfs trees, and the modelled path labelled as such."""

from __future__ import annotations

import time
from pathlib import Path

from profiler.energy import EnergyMeter, HwmonSensors, PowerModel, RaplCounter


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_rapl_handles_wrap_around(tmp_path: Path) -> None:
    pkg = tmp_path / "intel-rapl:0"
    _write(pkg / "name", "package-0")
    _write(pkg / "max_energy_range_uj", "1000000")
    _write(pkg / "energy_uj", "999000")
    _write(tmp_path / "intel-rapl:0:0" / "energy_uj", "5")  # sub-domain: not counted twice
    rapl = RaplCounter(tmp_path)
    assert rapl.available() and rapl.label() == "rapl:package-0"
    start = rapl.read()
    _write(pkg / "energy_uj", "4000")  # wrapped: 1000 uJ to the top, then 4000
    assert abs(rapl.delta_joules(start, rapl.read()) - 0.005) < 1e-12


def test_meter_reads_rapl_as_measured(tmp_path: Path) -> None:
    pkg = tmp_path / "powercap" / "intel-rapl:0"
    _write(pkg / "energy_uj", "100")
    _write(pkg / "max_energy_range_uj", "262143328850")
    meter = EnergyMeter(PowerModel(5, 1), 2, powercap=tmp_path / "powercap", hwmon=tmp_path / "none")
    with meter:
        _write(pkg / "energy_uj", "2100100")
    assert meter.reading is not None
    assert meter.reading.source == "measured"
    assert abs(meter.reading.joules - 2.1) < 1e-9


def test_hwmon_energy_counter(tmp_path: Path) -> None:
    hw = tmp_path / "hwmon0"
    _write(hw / "name", "amd_energy")
    _write(hw / "energy1_input", "1000000")
    meter = EnergyMeter(PowerModel(5, 1), 1, powercap=tmp_path / "none", hwmon=tmp_path)
    with meter:
        _write(hw / "energy1_input", "3500000")
    assert meter.reading.source == "measured" and abs(meter.reading.joules - 2.5) < 1e-9


def test_ina_rails_are_voltage_times_current(tmp_path: Path) -> None:
    hw = tmp_path / "hwmon1"
    _write(hw / "name", "ina3221")
    _write(hw / "in1_input", "5000")  # mV
    _write(hw / "curr1_input", "400")  # mA
    _write(hw / "in2_input", "1000")
    _write(hw / "curr2_input", "1000")
    sensors = HwmonSensors(tmp_path)
    assert sensors.available() and sensors.label() == "hwmon:ina3221"
    assert abs(sensors.watts() - 3.0) < 1e-9  # 5 V x 0.4 A + 1 V x 1 A
    meter = EnergyMeter(PowerModel(5, 1), 1, powercap=tmp_path / "none", hwmon=tmp_path, sample_period_s=0.005)
    with meter:
        time.sleep(0.2)
    # integrated power: 3 W over the interval, whatever the interval was
    assert meter.reading.source == "measured"
    assert 0.5 < meter.reading.joules / 3.0 / 0.2 < 2.0


def test_hwmon_power_input_in_microwatts(tmp_path: Path) -> None:
    hw = tmp_path / "hwmon2"
    _write(hw / "name", "soc_power")
    _write(hw / "power1_input", "2500000")
    assert abs(HwmonSensors(tmp_path).watts() - 2.5) < 1e-9


def test_no_sensor_means_modelled(tmp_path: Path) -> None:
    busy = iter([10.0, 10.5])  # 0.5 busy core-seconds during the block
    meter = EnergyMeter(
        PowerModel(active_w_per_core=4.0, idle_w_per_core=1.0),
        cores=2,
        powercap=tmp_path / "none",
        hwmon=tmp_path / "none",
        busy=lambda: next(busy),
    )
    assert meter.source == "modelled"
    with meter:
        time.sleep(0.3)
    reading = meter.reading
    assert reading.source == "modelled" and "model" in reading.sensor
    # 0.5 core-seconds busy at 4 W, the rest of (2 cores x >= 0.3 s) idle at 1 W
    assert reading.joules >= 0.5 * 4.0 + (2 * 0.3 - 0.5) * 1.0


def test_power_model_caps_busy_time() -> None:
    model = PowerModel(4.0, 1.0)
    assert model.joules(busy_core_seconds=10.0, wall_seconds=1.0, cores=2) == 8.0
