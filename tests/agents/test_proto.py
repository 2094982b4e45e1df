"""The committed generated code is what the .proto files generate (they cannot drift apart), and it
loads on every protobuf runtime of the range ``pyproject.toml`` declares."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from google.protobuf import descriptor_pb2
from packaging.requirements import Requirement

from agents.proto.generate import GENCODE, HERE, PROTOS, generate
from tests.support.packages import installed, python_path

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def _descriptor(pb2_file: Path) -> descriptor_pb2.FileDescriptorProto:
    text = pb2_file.read_text()
    literal = re.search(r"AddSerializedFile\((b'.*?')\)\n", text, re.S)
    assert literal, f"{pb2_file.name} holds no serialized descriptor"
    proto = descriptor_pb2.FileDescriptorProto()
    proto.ParseFromString(ast.literal_eval(literal.group(1)))
    return proto


def _methods(grpc_file: Path) -> set[str]:
    return set(re.findall(r"'(/[\w.]+/\w+)'", grpc_file.read_text()))


def _protobuf_range() -> Requirement:
    deps = tomllib.loads(PYPROJECT.read_text())["project"]["dependencies"]
    return next(Requirement(d) for d in deps if Requirement(d).name == "protobuf")


def test_generated_code_is_current(tmp_path: Path) -> None:
    """Same messages, fields and methods as the .proto files say (whatever grpcio-tools runs the test)."""
    generate(tmp_path, check_version=False)
    for stem in PROTOS:
        fresh, committed = _descriptor(tmp_path / f"{stem}_pb2.py"), _descriptor(HERE / f"{stem}_pb2.py")
        assert fresh == committed, f"{stem}_pb2.py is stale: run make proto"
        assert _methods(tmp_path / f"{stem}_pb2_grpc.py") == _methods(HERE / f"{stem}_pb2_grpc.py"), (
            f"{stem}_pb2_grpc.py is stale: run make proto"
        )


def test_the_gencode_is_the_oldest_protobuf_of_the_declared_range() -> None:
    declared = _protobuf_range()
    lower = [s.version for s in declared.specifier if s.operator == ">="]
    assert lower == [GENCODE], f"pyproject declares {declared}, the code is gencode {GENCODE}"
    assert declared.specifier.contains(GENCODE)
    for stem in PROTOS:
        assert f"# Protobuf Python Version: {GENCODE}\n" in (HERE / f"{stem}_pb2.py").read_text()


@pytest.mark.parametrize("end", ["oldest", "newest"])
def test_the_generated_modules_load_at_both_ends_of_the_range(end: str) -> None:
    """Under protobuf GENCODE itself and the newest release the range allows (each installed outside
    the environment), warnings as errors."""
    declared = _protobuf_range()
    if end == "oldest":
        target, check = installed(f"protobuf-{GENCODE}", f"protobuf=={GENCODE}", no_deps=True), f"== {GENCODE!r}"
    else:
        target, check = (
            installed(
                "protobuf-newest-" + re.sub(r"[^\w.]+", "_", str(declared.specifier)), str(declared), no_deps=True
            ),
            "!= ''",
        )
    script = (
        "import google.protobuf, sys\n"
        f"assert google.protobuf.__version__ {check}, google.protobuf.__version__\n"
        "from agents.proto import parapipe_agent_pb2 as pb, parapipe_agent_pb2_grpc, health_pb2_grpc\n"
        "from agents.proto import inference_pb2, inference_pb2_grpc\n"
        "import agents.client\n"
        "frame = pb.Frame(id=7, tensors=[pb.Tensor(name='x', dtype='float32', shape=[2], data=b'12345678')])\n"
        "assert pb.Frame.FromString(frame.SerializeToString()) == frame\n"
        "request = inference_pb2.ModelInferRequest(model_name='m', raw_input_contents=[b'abc'])\n"
        "assert inference_pb2.ModelInferRequest.FromString(request.SerializeToString()) == request\n"
    )
    env = dict(os.environ, PYTHONPATH=python_path(target))
    done = subprocess.run(
        [sys.executable, "-W", "error", "-c", script], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]


def test_the_board_side_wheel_declares_the_same_protobuf_range() -> None:
    from parapipe.agent_wheel import REQUIRES

    board = next(Requirement(r) for r in REQUIRES if Requirement(r).name == "protobuf")
    assert board.specifier == _protobuf_range().specifier
