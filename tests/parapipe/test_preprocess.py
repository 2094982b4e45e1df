"""Images as inputs: the preprocessing spec parses from TOML (file or inline), refuses what it cannot mean, and
turns real photographs into exactly the tensor the spec describes, for any image size and layout."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from parapipe.preprocess import (
    Preprocess,
    PreprocessError,
    image_files,
    image_frames,
    image_tensor,
    parse_preprocess,
)
from tests.support.images import image


def test_spec_from_inline_toml_and_from_a_file(tmp_path: Path) -> None:
    spec = parse_preprocess('size = [48, 320]; mean = [0.5]; std = [0.5]; channels = "bgr"; resize = "crop"')
    assert spec == Preprocess(size=(48, 320), mean=(0.5,), std=(0.5,), channels="bgr", resize="crop")
    f = tmp_path / "prep.toml"
    f.write_text('layout = "nhwc"\nscale = 1.0\n')
    assert parse_preprocess(str(f)) == Preprocess(layout="nhwc", scale=1.0)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("size = [224]", "size"),
        ("layout = 'chw'", "layout"),
        ("std = [0.2, 0]", "divides by zero"),
        ("mean = [0.1, 0.2]", "one per channel"),
        ("sizes = [1, 2]", "sizes"),
        ("scale = -1", "scale"),
        ("size = [224, 224", "not TOML"),
    ],
)
def test_a_bad_spec_says_what_is_wrong(text: str, says: str) -> None:
    with pytest.raises(PreprocessError, match=says):
        parse_preprocess(text)


def _photo(tmp_path: Path, name: str, suffix: str = ".png") -> Path:
    pixels = (image(name) * 255).round().astype(np.uint8)
    path = tmp_path / f"{name}{suffix}"
    Image.fromarray(pixels).save(path)
    return path


def test_a_photograph_becomes_the_normalised_input(tmp_path: Path) -> None:
    path = _photo(tmp_path, "astronaut")
    spec = Preprocess(mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225))
    x = image_tensor(path, spec, (1, 3, 64, 96), "float32")
    assert x.shape == (1, 3, 64, 96) and x.dtype == np.float32
    # the same by hand: Pillow's bilinear resize, then per channel (v / 255 - mean) / std
    rgb = np.asarray(Image.open(path).convert("RGB").resize((96, 64), Image.Resampling.BILINEAR), np.float32)
    expect = ((rgb / 255 - np.array(spec.mean, np.float32)) / np.array(spec.std, np.float32)).transpose(2, 0, 1)
    np.testing.assert_allclose(x[0], expect, rtol=1e-6, atol=1e-6)
    bgr = image_tensor(
        path, spec.model_copy(update={"channels": "bgr", "mean": (0.0,), "std": (1.0,)}), (1, 3, 64, 96), "float32"
    )
    np.testing.assert_allclose(bgr[0, 0], rgb[..., 2] / 255, atol=1e-6)  # blue first
    assert image_files(tmp_path) == [path]


def test_images_that_do_not_fit_the_input_are_refused(tmp_path: Path) -> None:
    path = _photo(tmp_path, "coffee", ".jpg")
    with pytest.raises(PreprocessError, match="channel"):
        image_tensor(path, Preprocess(), (1, 1, 32, 32), "float32")
    with pytest.raises(PreprocessError, match="size"):
        image_tensor(path, Preprocess(size=(64, 64)), (1, 3, 32, 32), "float32")
    with pytest.raises(PreprocessError, match="4-D"):
        image_tensor(path, Preprocess(), (3, 32, 32), "float32")
    broken = tmp_path / "broken.png"
    broken.write_bytes(b"not a png")
    with pytest.raises(PreprocessError, match=r"broken\.png"):
        image_tensor(broken, Preprocess(), (1, 3, 32, 32), "float32")


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    width=st.integers(1, 300),
    height=st.integers(1, 300),
    out=st.tuples(st.integers(1, 80), st.integers(1, 80)),
    layout=st.sampled_from(["nchw", "nhwc"]),
    channels=st.sampled_from(["rgb", "bgr", "gray"]),
    resize=st.sampled_from(["stretch", "crop"]),
)
def test_any_image_becomes_a_tensor_of_the_inputs_shape(tmp_path: Path, width, height, out, layout, channels, resize):
    rng = np.random.default_rng(width * 1000 + height)
    path = tmp_path / f"img-{width}x{height}.png"
    Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8)).save(path)
    spec = Preprocess(layout=layout, channels=channels, resize=resize)
    planes = spec.planes
    shape = (1, planes, *out) if layout == "nchw" else (1, *out, planes)
    x = image_tensor(path, spec, shape, "float32")
    assert x.shape == shape and x.dtype == np.float32
    assert np.isfinite(x).all() and x.min() >= 0.0 and x.max() <= 1.0  # scale 1/255, mean 0, std 1


def test_a_folder_of_photographs_becomes_frames_of_the_image_input(tmp_path: Path) -> None:
    from models.inputs import InputSpec

    for name in ("astronaut", "coffee"):
        _photo(tmp_path, name, ".jpg")
    image_input = InputSpec("images", "float32", (1, 3, 32, 48))
    rate = InputSpec("rate", "int64", (), values=(16000.0,), source="graph:sample rate")
    frames = image_frames(tmp_path, Preprocess(), [image_input, rate])
    assert len(frames) == 2 and all(f["images"].shape == (1, 3, 32, 48) and f["rate"] == 16000 for f in frames)
    with pytest.raises(PreprocessError, match="--preprocess"):
        image_frames(tmp_path, None, [image_input])
    with pytest.raises(PreprocessError, match="one image input"):
        image_frames(tmp_path, Preprocess(), [image_input, InputSpec("mask", "float32", (1, 3, 32, 48))])
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(PreprocessError, match="no images"):
        image_frames(empty, Preprocess(), [image_input])
