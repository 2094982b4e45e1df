"""Agents: the board-side gRPC agent, the pipeline executor and the host-side client."""
