"""The Typer app, consoles and shared options every command module uses."""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.markup import escape

from device_profiles.schema import ProfileError
from models.errors import ParapipeError
from profiler.pinning import PinningError

# Errors parts raise on purpose; each carries a message that says what to do.
USER_ERRORS = (ParapipeError, ProfileError, PinningError)

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
        out.print(f"{k:16} {v}", highlight=False)
