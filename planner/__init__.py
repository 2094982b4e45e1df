"""Planner: cost model, ILP, baselines, Pareto sweep, Plan and simulator (see docs/architecture.md)."""
