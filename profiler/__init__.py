"""Profiler: per-op and per-partition latency and energy on a PU, CostTable, calibration."""
