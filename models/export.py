"""Export a torch module (zoo name or ``file.py:Class``) to one self-contained ONNX file.

The export is checked twice before it is written: by ``onnx.checker`` and by running
onnxruntime against torch on the same inputs. When torch cannot capture the module,
the error lists the offending source lines (from ``torch._dynamo.explain``) and what
the user can change.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import logging
import os
import sys
import tempfile
import time
import traceback
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from models.errors import ExportError, ModelError
from models.zoo import ZOO, InputSpec, ZooEntry, zoo_entry

# Above this size ONNX's protobuf limit forces external data (one file beside the model).
_EXTERNAL_DATA_BYTES = 1_800_000_000
REL_TOLERANCE = 1e-4

_ADVICE = (
    "What you can change: replace Python control flow that depends on tensor values "
    "with torch.where or torch.cond; remove .item(), .tolist(), .numpy() and print() "
    "from forward(); give every input a static shape; keep custom autograd Functions "
    "and non-torch libraries (numpy, scipy) out of forward()."
)


@dataclass(frozen=True)
class ExportReport:
    """What ``export_model`` wrote and how well it matches torch."""

    model: str
    path: Path
    opset: int
    inputs: tuple[InputSpec, ...]
    outputs: tuple[str, ...]
    nodes: int
    size_bytes: int
    max_abs_diff: float
    max_rel_diff: float
    seconds: float

    def to_json(self) -> dict[str, object]:
        return {
            "model": self.model,
            "path": str(self.path),
            "opset": self.opset,
            "inputs": [{"name": i.name, "shape": list(i.shape), "dtype": i.dtype} for i in self.inputs],
            "outputs": list(self.outputs),
            "nodes": self.nodes,
            "size_bytes": self.size_bytes,
            "max_abs_diff": self.max_abs_diff,
            "max_rel_diff": self.max_rel_diff,
            "seconds": round(self.seconds, 3),
        }


def resolve_module(spec: str, input_shape: tuple[int, ...] | None) -> tuple[str, object, tuple[InputSpec, ...]]:
    """Return (name, eval-mode module, input specs) for a zoo name or ``path.py:ClassName``."""
    if spec in ZOO:
        entry: ZooEntry = zoo_entry(spec)
        inputs = entry.inputs
        if input_shape is not None:
            if len(inputs) != 1:
                raise ModelError(f"{spec} has {len(inputs)} inputs; --input-shape sets only one")
            inputs = (InputSpec(inputs[0].name, input_shape, inputs[0].dtype, inputs[0].high),)
        return spec, entry.build(), inputs
    if ":" not in spec:
        raise ModelError(f"{spec!r} is neither a zoo model ({', '.join(ZOO)}) nor path/to/file.py:ClassName")
    file_part, _, class_name = spec.rpartition(":")
    path = Path(file_part)
    if not path.is_file():
        raise ModelError(f"no such Python file: {path} (from {spec!r}); give path/to/file.py:ClassName")
    mod_name = f"_parapipe_user_{abs(hash(path.resolve()))}"
    loader_spec = importlib.util.spec_from_file_location(mod_name, path)
    if loader_spec is None or loader_spec.loader is None:
        raise ModelError(f"cannot import {path}: not a Python source file")
    module = importlib.util.module_from_spec(loader_spec)
    sys.modules[mod_name] = module
    try:
        loader_spec.loader.exec_module(module)
    except Exception as exc:  # the user's file: report where it failed, not our stack
        raise ModelError(f"importing {path} failed: {type(exc).__name__}: {exc}\n{_user_frames(exc, path)}") from exc
    cls = getattr(module, class_name, None)
    if cls is None:
        raise ModelError(f"{path} defines no {class_name!r}")
    try:
        instance = cls()
    except TypeError as exc:
        raise ModelError(
            f"{class_name}() cannot be built without arguments ({exc}); give its arguments defaults "
            "or wrap it in a class whose __init__ takes none"
        ) from exc
    import torch

    if not isinstance(instance, torch.nn.Module):
        raise ModelError(f"{spec} is a {type(instance).__name__}, not a torch.nn.Module")
    shape = input_shape or (1, 3, 224, 224)
    return class_name, instance.eval(), (InputSpec("input", shape),)


def example_inputs(inputs: tuple[InputSpec, ...], seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    arrays = []
    for spec in inputs:
        if spec.dtype.startswith("int"):
            arrays.append(rng.integers(0, spec.high or 2, size=spec.shape).astype(spec.dtype))
        else:
            arrays.append(rng.standard_normal(spec.shape).astype(spec.dtype))
    return arrays


def export_model(
    spec: str,
    out: Path | None = None,
    input_shape: tuple[int, ...] | None = None,
    opset: int | None = None,
) -> ExportReport:
    """Export, check with onnx.checker, compare onnxruntime to torch, then write atomically."""
    import onnx
    import torch

    start = time.perf_counter()
    name, module, inputs = resolve_module(spec, input_shape)
    out = Path(out) if out is not None else Path(f"{name}.onnx")
    if out.suffix != ".onnx":
        raise ModelError(f"output file {out} must end in .onnx")
    out.parent.mkdir(parents=True, exist_ok=True)
    arrays = example_inputs(inputs)
    args = tuple(torch.from_numpy(a) for a in arrays)
    with torch.no_grad():
        reference = module(*args)
    ref_list = [reference] if isinstance(reference, torch.Tensor) else list(reference)
    params = sum(p.numel() * p.element_size() for p in module.parameters())

    fd, tmp_name = tempfile.mkstemp(prefix=f".{out.stem}.", suffix=".onnx", dir=out.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        _torch_export(module, args, tmp, [i.name for i in inputs], opset, params > _EXTERNAL_DATA_BYTES)
        proto = onnx.load(str(tmp), load_external_data=False)
        try:
            onnx.checker.check_model(str(tmp))
        except onnx.checker.ValidationError as exc:
            raise ExportError(f"the exported model fails onnx.checker: {exc}") from exc
        abs_diff, rel_diff, out_names = _compare_with_ort(tmp, inputs, arrays, ref_list)
        if rel_diff > REL_TOLERANCE:
            raise ExportError(
                f"onnxruntime disagrees with torch: max abs diff {abs_diff:.3g}, relative {rel_diff:.3g} "
                f"> {REL_TOLERANCE:g}; try another --opset or check for ops with undefined numerics"
            )
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    opset_used = next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), 0)
    return ExportReport(
        model=name,
        path=out,
        opset=opset_used,
        inputs=inputs,
        outputs=tuple(out_names),
        nodes=len(proto.graph.node),
        size_bytes=out.stat().st_size,
        max_abs_diff=abs_diff,
        max_rel_diff=rel_diff,
        seconds=time.perf_counter() - start,
    )


def _torch_export(
    module: object, args: tuple, path: Path, input_names: list[str], opset: int | None, external: bool
) -> None:
    import torch

    for noisy in ("torch.onnx", "torch._dynamo", "torch.export", "torch._export", "torch.fx", "onnxscript"):
        logging.getLogger(noisy).setLevel(logging.ERROR)
    sink = io.StringIO()
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
            warnings.simplefilter("ignore")
            torch.onnx.export(
                module,
                args,
                str(path),
                input_names=input_names,
                opset_version=opset,
                dynamo=True,
                external_data=external,
                verbose=False,
            )
    except Exception as exc:
        raise ExportError(_explain_failure(module, args, exc)) from None


def _explain_failure(module: object, args: tuple, exc: BaseException) -> str:
    """Turn an export failure into the graph breaks torch saw, with source lines, and advice."""
    import torch

    root = exc
    while root.__cause__ is not None:
        root = root.__cause__
    headline = str(root).strip().splitlines()[0] if str(root).strip() else type(root).__name__
    lines = [f"export failed: {type(root).__name__}: {headline}"]
    breaks: list[str] = []
    for noisy in ("torch._dynamo", "torch.fx", "torch._subclasses"):
        logging.getLogger(noisy).setLevel(logging.ERROR)
    try:
        with (
            warnings.catch_warnings(),
            contextlib.redirect_stdout(io.StringIO()),
            contextlib.redirect_stderr(io.StringIO()),
        ):
            warnings.simplefilter("ignore")
            explanation = torch._dynamo.explain(module)(*args)
        for reason in explanation.break_reasons:
            where = ", ".join(f"{f.filename}:{f.lineno} ({f.line})" for f in reason.user_stack[-2:])
            breaks.append(f"  graph break: {reason.reason.strip().splitlines()[0]} at {where}")
    except Exception as explain_exc:  # explain itself can fail on the same construct
        breaks.append(f"  (torch._dynamo.explain could not analyse the module: {type(explain_exc).__name__})")
    finally:
        torch._dynamo.reset()
    frames = _user_frames(root, None)
    if breaks:
        lines += ["torch found these graph breaks:", *breaks]
    if frames:
        lines.append(frames)
    lines.append(_ADVICE)
    return "\n".join(lines)


def _user_frames(exc: BaseException, path: Path | None) -> str:
    """Source locations of the failure outside torch and parapipe, innermost last."""
    frames = traceback.extract_tb(exc.__traceback__)
    keep = []
    for f in frames:
        fn = f.filename
        if path is not None and Path(fn).resolve() != path.resolve():
            continue
        if path is None and ("site-packages" in fn or "/models/export.py" in fn or fn.startswith("<")):
            continue
        keep.append(f"  at {fn}:{f.lineno}: {(f.line or '').strip()}")
    return "\n".join(keep[-3:])


def _compare_with_ort(
    path: Path, inputs: tuple[InputSpec, ...], arrays: list[np.ndarray], reference: list
) -> tuple[float, float, list[str]]:
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    feed = {i.name: a for i, a in zip(session.get_inputs(), arrays, strict=True)}
    got = session.run(None, feed)
    if len(got) != len(reference):
        raise ExportError(f"onnxruntime returns {len(got)} outputs, torch {len(reference)}")
    abs_diff, scale = 0.0, 0.0
    for g, r in zip(got, reference, strict=True):
        r_np = r.detach().numpy()
        if g.shape != r_np.shape:
            raise ExportError(f"output shape differs: onnxruntime {g.shape}, torch {r_np.shape}")
        abs_diff = max(abs_diff, float(np.max(np.abs(g.astype(np.float64) - r_np))) if g.size else 0.0)
        scale = max(scale, float(np.max(np.abs(r_np))) if r_np.size else 0.0)
    return abs_diff, abs_diff / max(scale, 1e-12), [o.name for o in session.get_outputs()]
