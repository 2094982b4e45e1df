"""The committed generated code is what the .proto files generate: they cannot drift apart."""

from __future__ import annotations

from pathlib import Path

from agents.proto.generate import HERE, PROTOS, generate


def test_generated_code_is_current(tmp_path: Path) -> None:
    generate(tmp_path)
    for stem in PROTOS:
        for suffix in ("_pb2.py", "_pb2_grpc.py"):
            fresh = (tmp_path / f"{stem}{suffix}").read_text()
            committed = (HERE / f"{stem}{suffix}").read_text()
            assert fresh == committed, f"{stem}{suffix} is stale: run python agents/proto/generate.py"
