"""``parapipe runtimes``: the onnxruntime builds with accelerator EPs that agents on this machine run in."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from parapipe.app import JsonFlag, app, err, fails_cleanly, out, print_json

runtimes_app = typer.Typer(
    help="Runtime environments for accelerator EPs on this machine (OpenVINO, CUDA): list them, install one.",
    invoke_without_command=True,
)
app.add_typer(runtimes_app, name="runtimes")


@runtimes_app.callback()
@fails_cleanly
def runtimes(ctx: typer.Context, as_json: JsonFlag = False) -> None:
    """List the runtimes: installed or not, their onnxruntime and the providers it offers."""
    if ctx.invoked_subcommand is not None:
        return
    from parapipe.runtimes import listing, runtimes_root

    rows = listing()
    if as_json:
        print_json(rows)
        return
    table = Table("runtime", "for", "installed", "onnxruntime", "providers")
    for r in rows:
        providers = r["providers"]
        table.add_row(
            str(r["runtime"]),
            str(r["for"]),
            "yes" if r["installed"] else "no",
            str(r["onnxruntime"]) or "-",
            ", ".join(providers) if isinstance(providers, list) else "-",
        )
    out.print(table)
    out.print(f"runtimes live in {runtimes_root()} (PARAPIPE_RUNTIMES); install one with `parapipe runtimes install NAME`",
              highlight=False)  # fmt: skip


@runtimes_app.command("install")
@fails_cleanly
def install(
    name: Annotated[str, typer.Argument(help="openvino (onnxruntime-openvino) or gpu (onnxruntime-gpu).")],
    as_json: JsonFlag = False,
) -> None:
    """Make a runtime's environment (a venv of its own: its onnxruntime would overwrite parapipe's) and check that
    it offers its provider. Embedded boards whose units need it (local-openvino) then run their agent in it."""
    from parapipe.runtimes import install as do_install

    with err.status(f"installing the {name} runtime") as status:
        python, runtime = do_install(name, status.update)
    if as_json:
        print_json({"runtime": name, "python": str(python), "onnxruntime": runtime.version,
                    "providers": list(runtime.providers)})  # fmt: skip
        return
    out.print(f"runtime {name} installed: onnxruntime {runtime.version} offering {', '.join(runtime.providers)} "
              f"({python})", highlight=False)  # fmt: skip
