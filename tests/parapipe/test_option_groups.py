"""``option_groups``: options that travel together reach a command as one frozen dataclass, and the command
line is the same as with the options written one by one (names, defaults, checks, --help)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

import typer
from typer.testing import CliRunner

from parapipe.app import option_groups


@dataclass(frozen=True)
class Bounds:
    """Two options of a search."""

    max_stages: Annotated[int, typer.Option("--max-stages", min=1, help="Most pipeline stages.")] = 4
    solver: Annotated[str, typer.Option("--solver", help="highs or cbc.")] = "highs"


def _app(seen: list[object]) -> typer.Typer:
    app = typer.Typer()

    @app.command()
    @option_groups(bounds=Bounds)
    def plan(
        model: Annotated[str, typer.Argument(help="The model.")],
        bounds: Bounds = Bounds(),
        verbose: Annotated[bool, typer.Option("--verbose")] = False,
    ) -> None:
        seen.append((model, bounds, verbose))

    @app.command()
    def other() -> None:  # a second command, so that typer keeps the command names
        pass

    return app


def test_the_command_receives_one_record_of_the_grouped_options() -> None:
    seen: list[object] = []
    runner = CliRunner()
    result = runner.invoke(_app(seen), ["plan", "m.onnx", "--max-stages", "2", "--verbose"])
    assert result.exit_code == 0, result.output
    result = runner.invoke(_app(seen), ["plan", "m.onnx", "--solver", "cbc"])
    assert result.exit_code == 0, result.output
    assert seen == [("m.onnx", Bounds(2, "highs"), True), ("m.onnx", Bounds(4, "cbc"), False)]


def test_grouped_options_keep_their_checks_and_help() -> None:
    seen: list[object] = []
    runner = CliRunner()
    bad = runner.invoke(_app(seen), ["plan", "m.onnx", "--max-stages", "0"])
    assert bad.exit_code == 2 and "--max-stages" in bad.output and not seen
    unknown = runner.invoke(_app(seen), ["plan", "m.onnx", "--bounds", "x"])
    assert unknown.exit_code == 2 and not seen, "the group is not an option itself"
    shown = runner.invoke(_app(seen), ["plan", "--help"], env={"COLUMNS": "200"})
    assert shown.exit_code == 0
    for text in ("--max-stages", "Most pipeline stages.", "--solver", "highs or cbc.", "--verbose"):
        assert text in shown.output
