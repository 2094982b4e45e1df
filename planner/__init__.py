"""Planner: cost model, ILP, baselines, Pareto sweep, Plan and simulator (see DESIGN.md)."""
