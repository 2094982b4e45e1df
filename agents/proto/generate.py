"""Regenerate the Python code for ``parapipe_agent.proto`` (run by hand after editing the .proto;
a test checks the committed files are current)."""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
PROTOS = ("parapipe_agent", "health")


def generate(out_dir: Path) -> None:
    from grpc_tools import protoc

    for stem in PROTOS:
        code = protoc.main(
            [
                "protoc",
                f"-I{HERE}",
                f"--python_out={out_dir}",
                f"--grpc_python_out={out_dir}",
                str(HERE / f"{stem}.proto"),
            ]
        )
        if code != 0:
            raise SystemExit(f"protoc failed on {stem}.proto with code {code}")
        # protoc writes a top-level import; make it package-relative so agents.proto works anywhere
        grpc_file = out_dir / f"{stem}_pb2_grpc.py"
        alias = stem.replace("_", "__")
        text = grpc_file.read_text().replace(
            f"import {stem}_pb2 as {alias}__pb2", f"from . import {stem}_pb2 as {alias}__pb2"
        )
        grpc_file.write_text(text)


if __name__ == "__main__":
    generate(Path(sys.argv[1]) if len(sys.argv) > 1 else HERE)
