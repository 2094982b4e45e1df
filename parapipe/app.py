"""The Typer app, consoles and shared options every command module uses."""

from __future__ import annotations

import dataclasses
import functools
import inspect
import json
import sys
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.markup import escape

from device_profiles.schema import ProfileError
from models.errors import ParapipeError
from profiler.pinning import PinningError
from profiler.runtime import ProviderUnavailable

# Errors parts raise on purpose; each carries a message that says what to do.
USER_ERRORS = (ParapipeError, ProfileError, PinningError, ProviderUnavailable)

app = typer.Typer(
    help="Plan and run DNN inference across the processing units of edge boards.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
# Piped output (CI logs, files) gets a wide fixed width instead of rich's 80 columns.
out = Console(width=None if sys.stdout.isatty() else 160)
err = Console(stderr=True, width=None if sys.stderr.isatty() else 160)

F = TypeVar("F", bound=Callable[..., Any])

JsonFlag = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON instead of tables.")]
ModelArg = Annotated[Path, typer.Argument(help="The .onnx model.")]
DeviceOpt = Annotated[str, typer.Option("--device", help="Profile name or TOML path.")]
PlanDeviceOpt = Annotated[
    str,
    typer.Option(
        "--device",
        help="Profile name or TOML path, or an inventory board: its profile, on the units recorded for it "
        "(`boards check --record`).",
    ),
]
CostsOpt = Annotated[Path | None, typer.Option("--costs", help="Cost table (default $PARAPIPE_HOME/costs.json).")]
ShapeOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--input-shape",
        help="Static input shape, [NAME=]1,3,224,224 (NAME= alone is a scalar); repeat for several inputs.",
    ),
]
DataOpt = Annotated[
    Path | None,
    typer.Option(
        "--input-data",
        help="Sample inputs, an .npz with one array per model input (numpy.savez); fixes their shapes and values.",
    ),
]


def option_groups(**groups: type) -> Callable[[F], F]:
    """Let a command take options that travel together as one frozen dataclass.

    ``@option_groups(search=SearchFlags)`` on ``def plan(model, search: SearchFlags, ...)``: every field of
    ``SearchFlags`` (each ``Annotated[T, typer.Option(...)]`` with its default) becomes an option of the
    command in the parameter's place, and the command receives one ``SearchFlags`` made of them. Typer reads
    the signature this returns, so ``--help`` lists the options as if they were written one by one."""

    def decorate(fn: F) -> F:
        hints = typing.get_type_hints(fn, include_extras=True)
        params: list[inspect.Parameter] = []
        for p in inspect.signature(fn).parameters.values():
            if p.name not in groups:
                params.append(p.replace(annotation=hints[p.name], kind=inspect.Parameter.KEYWORD_ONLY))
                continue
            flag_hints = typing.get_type_hints(groups[p.name], include_extras=True)
            for f in dataclasses.fields(groups[p.name]):
                default = inspect.Parameter.empty if f.default is dataclasses.MISSING else f.default
                params.append(
                    inspect.Parameter(
                        f.name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=flag_hints[f.name]
                    )
                )

        @functools.wraps(fn)
        def wrapper(**kwargs: Any) -> Any:
            for name, cls in groups.items():
                kwargs[name] = cls(**{f.name: kwargs.pop(f.name) for f in dataclasses.fields(cls)})
            return fn(**kwargs)

        del wrapper.__wrapped__  # type: ignore[attr-defined]
        wrapper.__signature__ = inspect.Signature(params, return_annotation=None)  # type: ignore[attr-defined]
        wrapper.__annotations__ = {p.name: p.annotation for p in params} | {"return": None}
        return wrapper  # type: ignore[return-value]

    return decorate


def fails_cleanly(fn: F) -> F:
    """Report a user error as one clear message and exit code 2, never a traceback."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except USER_ERRORS as exc:
            err.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False, soft_wrap=True)
            raise typer.Exit(2) from None
        except KeyboardInterrupt:
            err.print("interrupted")
            raise typer.Exit(130) from None
        except Exception as exc:
            if not _is_agent_error(exc):
                raise
            err.print(f"[bold red]error:[/] the agent failed: {exc}", highlight=False, soft_wrap=True)
            raise typer.Exit(2) from None

    return wrapper  # type: ignore[return-value]


def _is_agent_error(exc: BaseException) -> bool:
    """An agent's refusal or failure (``agents.client.AgentError``), checked without importing grpc."""
    client = sys.modules.get("agents.client")
    return client is not None and isinstance(exc, client.AgentError)


def print_json(data: object) -> None:
    sys.stdout.write(json.dumps(data, indent=2) + "\n")


def print_info(info: dict[str, object], as_json: bool) -> None:
    """A flat record as JSON, or as aligned "key value" lines for people."""
    if as_json:
        print_json(info)
        return
    for k, v in info.items():
        if isinstance(v, dict):
            v = ", ".join(f"{a}={b}" for a, b in v.items())
        out.print(f"{k:16} {v}", highlight=False)
