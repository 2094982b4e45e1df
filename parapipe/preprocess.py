"""Images as model inputs: a small preprocessing spec (size, resize, channels, layout, scale, mean, std).

``--calibration DIR`` may hold images (``.jpg``, ``.jpeg``, ``.png``, ``.bmp``, ``.webp``) instead of
``.npz`` tensors; ``--preprocess`` then says how the model wants them, as a TOML file or inline TOML
with ``;`` between keys::

    --preprocess "size = [224, 224]; mean = [0.485, 0.456, 0.406]; std = [0.229, 0.224, 0.225]"

Each image is decoded with Pillow, converted to ``channels``, resized to ``size`` (height, width;
default: the model input's) by stretching it or (``resize = "crop"``) by scaling its shorter side
and cutting the centre, then ``value = (pixel * scale - mean) / std`` per channel, laid out as
``layout`` with a batch axis of one, in the input's dtype. There is no default normalisation to
fall back on silently: int8 calibration on wrongly normalised inputs measures the wrong ranges,
so images without ``--preprocess`` are refused with an example.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from models.errors import ParapipeError
from models.inputs import InputSpec

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".webp")
EXAMPLE = "size = [224, 224]; scale = 0.00392156862745098; mean = [0.485, 0.456, 0.406]; std = [0.229, 0.224, 0.225]"


class PreprocessError(ParapipeError):
    """A preprocessing spec or an image that cannot be used."""


class Preprocess(BaseModel):
    """How images become the model's input tensor."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    size: tuple[int, int] | None = Field(None, description="(height, width); None: the model input's")
    resize: Literal["stretch", "crop"] = "stretch"
    channels: Literal["rgb", "bgr", "gray"] = "rgb"
    layout: Literal["nchw", "nhwc"] = "nchw"
    scale: float = Field(1.0 / 255.0, gt=0)
    mean: tuple[float, ...] = (0.0,)
    std: tuple[float, ...] = (1.0,)

    @field_validator("size")
    @classmethod
    def _positive(cls, v: tuple[int, int] | None) -> tuple[int, int] | None:
        if v is not None and min(v) < 1:
            raise ValueError("height and width must be at least 1")
        return v

    @field_validator("std")
    @classmethod
    def _nonzero(cls, v: tuple[float, ...]) -> tuple[float, ...]:
        if any(x == 0 for x in v):
            raise ValueError("a std of 0 divides by zero")
        return v

    @property
    def planes(self) -> int:
        return 1 if self.channels == "gray" else 3


def parse_preprocess(text: str) -> Preprocess:
    """A spec from a TOML file's path or from inline TOML (``;`` between keys)."""
    path = Path(text)
    try:
        is_file = path.is_file()
    except OSError:
        is_file = False
    try:
        raw = tomllib.loads(path.read_text()) if is_file else tomllib.loads(text.replace(";", "\n"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError, OSError) as exc:
        where = str(path) if is_file else "the inline spec"
        raise PreprocessError(f'--preprocess: {where} is not TOML ({exc}); e.g. --preprocess "{EXAMPLE}"') from exc
    return preprocess_from(raw, str(path) if is_file else "--preprocess")


def preprocess_from(raw: Mapping[str, object], origin: str) -> Preprocess:
    try:
        spec = Preprocess.model_validate(raw)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'spec'}: {e['msg']}" for e in exc.errors())
        raise PreprocessError(f"{origin}: {problems} (keys: size, resize, channels, layout, scale, mean, std)") from exc
    for name in ("mean", "std"):
        values = getattr(spec, name)
        if len(values) not in (1, spec.planes):
            raise PreprocessError(
                f"{origin}: {name} has {len(values)} values; give 1 or one per channel ({spec.planes} for {spec.channels})"
            )
    return spec


def image_files(folder: Path) -> list[Path]:
    """The images in ``folder``, in name order."""
    return sorted(p for p in folder.iterdir() if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)


def image_tensor(path: Path, spec: Preprocess, shape: tuple[int, ...], dtype: str) -> np.ndarray:
    """One image as the input tensor of ``shape`` (a batch of one, laid out as ``spec.layout``)."""
    from PIL import Image, UnidentifiedImageError

    if len(shape) != 4 or shape[0] != 1:
        raise PreprocessError(f"images feed a 4-D input with a batch of 1; this input's shape is {list(shape)}")
    planes, height, width = (shape[1], shape[2], shape[3]) if spec.layout == "nchw" else (shape[3], shape[1], shape[2])
    if planes != spec.planes:
        raise PreprocessError(
            f"the input has {planes} channel(s) in {spec.layout.upper()} layout but channels = {spec.channels!r} "
            f"gives {spec.planes}; set layout or channels in --preprocess"
        )
    if spec.size is not None and spec.size != (height, width):
        raise PreprocessError(
            f"--preprocess size = {list(spec.size)} but the input is {height}x{width} (height x width); "
            "leave size out to take the input's, or plan the model for that size (--input-shape)"
        )
    try:
        with Image.open(path) as img:
            img = img.convert("L" if spec.channels == "gray" else "RGB")
            img = _resized(img, height, width, spec.resize)
            pixels = np.asarray(img, dtype=np.float32)
    except (UnidentifiedImageError, OSError, ValueError) as exc:
        raise PreprocessError(f"{path}: not an image Pillow can read ({exc})") from exc
    if pixels.ndim == 2:
        pixels = pixels[..., None]
    if spec.channels == "bgr":
        pixels = pixels[..., ::-1]
    mean = np.asarray(spec.mean, dtype=np.float32)
    std = np.asarray(spec.std, dtype=np.float32)
    values = (pixels * np.float32(spec.scale) - mean) / std
    if spec.layout == "nchw":
        values = values.transpose(2, 0, 1)
    return np.ascontiguousarray(values[None]).astype(dtype)


def _resized(img, height: int, width: int, how: str):  # type: ignore[no-untyped-def]
    from PIL import Image

    if how == "stretch":
        return img.resize((width, height), Image.Resampling.BILINEAR)
    w, h = img.size
    ratio = max(width / w, height / h)  # the shorter side (relative to the target) fills it
    scaled = img.resize((max(width, round(w * ratio)), max(height, round(h * ratio))), Image.Resampling.BILINEAR)
    left = (scaled.size[0] - width) // 2
    top = (scaled.size[1] - height) // 2
    return scaled.crop((left, top, left + width, top + height))


def image_frames(folder: Path, spec: Preprocess | None, inputs: Sequence[InputSpec]) -> list[dict[str, np.ndarray]]:
    """One frame per image of ``folder`` for a model with one image input (4-D, floating point); the model's
    other inputs must be fixed by the graph (values it says, e.g. a sample rate) to be fed the same each frame."""
    files = image_files(folder)
    if not files:
        raise PreprocessError(f"{folder}: no images ({', '.join(IMAGE_SUFFIXES)}) and no .npz files")
    if spec is None:
        raise PreprocessError(
            f'{folder} holds images: say how the model wants them with --preprocess, e.g. --preprocess "{EXAMPLE}" '
            "(size = [height, width], scale, mean, std per channel; channels rgb|bgr|gray; layout nchw|nhwc; "
            "resize stretch|crop), or give tensors as .npz files"
        )
    images = [s for s in inputs if len(s.shape) == 4 and np.dtype(s.dtype).kind == "f"]
    others = [s for s in inputs if s not in images]
    if len(images) != 1 or any(not s.values for s in others):
        raise PreprocessError(
            f"images feed a model with one image input (4-D, floating point); this one takes "
            f"{', '.join(f'{s.name} {s.dtype}{list(s.shape)}' for s in inputs)}: give its frames as .npz files"
        )
    (image,) = images
    fixed = {s.name: np.asarray(s.values, dtype=s.dtype).reshape(s.shape) for s in others}
    return [{image.name: image_tensor(f, spec, tuple(image.shape), image.dtype), **fixed} for f in files]
