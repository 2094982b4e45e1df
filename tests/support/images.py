"""Real images for accuracy checks: the sample photographs that ship inside scikit-image (no download).

Accuracy against fp32 is meaningless on random inputs; these are what the int8 tests calibrate and check on.
Tests that need them skip when scikit-image is not installed (``pip install .[bench]``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

CALIBRATION = ("astronaut", "coffee", "chelsea", "motorcycle_left", "hubble_deep_field")
HELD_BACK = ("rocket", "motorcycle_right", "retina", "ihc", "coins")  # other images than the calibration ones


def image(name: str) -> np.ndarray:
    """A sample image of scikit-image as float RGB in [0, 1], HxWx3."""
    data = pytest.importorskip("skimage.data")
    from skimage import io
    from skimage.color import gray2rgb

    path = next(Path(data.__file__).parent.glob(f"{name}.*"))
    img = np.asarray(io.imread(path), dtype=np.float32)
    if img.max() > 1.5:
        img = img / 255.0
    if img.ndim == 2:
        img = gray2rgb(img)
    return img[..., :3]


def frames(names: tuple[str, ...], n: int, size: tuple[int, int], seed: int) -> list[np.ndarray]:
    """``n`` random crops of the named images resized to ``size`` (h, w), as NCHW float32 in [0, 1]."""
    pytest.importorskip("skimage")
    from skimage.transform import resize

    rng = np.random.default_rng(seed)
    images = [image(x) for x in names]
    out = []
    for i in range(n):
        img = images[i % len(images)]
        h, w = img.shape[:2]
        ratio = size[1] / size[0]
        ch = max(8, min(int(rng.uniform(0.35, 0.9) * h), h, int(w / ratio)))
        cw = min(w, int(ch * ratio))
        y, x = int(rng.integers(0, h - ch + 1)), int(rng.integers(0, w - cw + 1))
        crop = resize(img[y : y + ch, x : x + cw], size, anti_aliasing=True).astype(np.float32)
        out.append(np.ascontiguousarray(crop.transpose(2, 0, 1))[None])
    return out
