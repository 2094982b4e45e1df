"""``--precision auto`` and its options, as ``plan``, ``compare`` and ``tune`` take them (a module of its own: it
registers no command, so importing it leaves the order of the CLI's commands as it is)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:
    from parapipe.precision_auto import PrecisionRequest


@dataclass(frozen=True)
class PrecisionFlags:
    """Each block's precision: fp32, or chosen by the ILP within an accuracy budget measured on the user's data."""

    precision: Annotated[
        str,
        typer.Option(
            "--precision",
            help="fp32 (every block as the model has it), or auto: blocks in int8 where it pays, within "
            "--max-accuracy-loss by --metric, checked end to end on held-back frames of --calibration.",
        ),
    ] = "fp32"
    calibration: Annotated[
        Path | None,
        typer.Option(
            "--calibration",
            help="Sample inputs for --precision auto: an .npz with one array per model input (frames stacked on "
            "the first axis), a folder of them, or a folder of images (with --preprocess). A quarter is held back "
            "to check each plan.",
        ),
    ] = None
    preprocess: Annotated[
        str | None,
        typer.Option(
            "--preprocess",
            help="How images in a --calibration folder become the model's image input: a TOML file or inline TOML "
            "with ';' between keys, e.g. 'size = [224, 224]; mean = [0.485, 0.456, 0.406]; std = [0.229, 0.224, "
            "0.225]' (keys: size, resize stretch|crop, channels rgb|bgr|gray, layout nchw|nhwc, scale, mean, std).",
        ),
    ] = None
    max_accuracy_loss: Annotated[
        str | None,
        typer.Option("--max-accuracy-loss", help="Accuracy loss allowed against fp32, e.g. 1% or 0.01 (default 1%)."),
    ] = None
    metric: Annotated[
        str | None,
        typer.Option(
            "--metric",
            help="top1 (a row is lost when its argmax changes or its lead is under twice the change), cosine or relerr (default relerr): how the loss is measured.",
        ),
    ] = None

    def request(self) -> PrecisionRequest | None:
        """The flags checked (``request_from_flags``): None for fp32 plans."""
        from parapipe.precision_auto import request_from_flags

        return request_from_flags(
            self.precision, self.calibration, self.max_accuracy_loss, self.metric, self.preprocess
        )
