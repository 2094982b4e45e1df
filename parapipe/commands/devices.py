"""`parapipe devices`: the boards parapipe knows and where each of their numbers comes from."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.table import Table

from device_profiles.loader import load_profile, shipped_names
from device_profiles.schema import DeviceProfile, Quantity
from parapipe.app import JsonFlag, app, err, fails_cleanly, out, print_json

devices_app = typer.Typer(help="Device profiles: list them, show one.", invoke_without_command=True)
app.add_typer(devices_app, name="devices")


def _q(q: Quantity) -> dict[str, Any]:
    return {"value": q.value, "source": q.source, "cite": q.cite}


def profile_json(p: DeviceProfile) -> dict[str, Any]:
    return {
        "name": p.name,
        "description": p.description,
        "origin": p.origin,
        "sha256": p.content_hash(),
        "hosts": [h.name for h in p.hosts],
        "notes": list(p.notes),
        "pus": [
            {
                "name": u.name,
                "kind": u.kind,
                "host": u.host,
                "cores": list(u.cores),
                "execution_provider": u.execution_provider,
                "runtime": (
                    {"value": u.runtime.value, "source": u.runtime.source, "cite": u.runtime.cite}
                    if u.runtime
                    else {"value": "onnxruntime", "source": "", "cite": ""}
                ),
                "ep_options": dict(u.ep_options),
                "supported_ops": list(u.supported_ops) or "all",
                "throttle_percent": u.throttle.quota_percent if u.throttle else None,
                "peak_gflops": {k: _q(v) for k, v in u.peak_gflops.items()},
                "memory_bandwidth_gbps": _q(u.memory_bandwidth_gbps),
                "memory_bytes": _q(u.memory_bytes),
                "launch_overhead_us": _q(u.launch_overhead_us),
                "active_power_w": _q(u.active_power_w),
                "idle_power_w": _q(u.idle_power_w),
            }
            for u in p.pus
        ],
        "links": [
            {"a": link.a, "b": link.b, "bandwidth_gbps": _q(link.bandwidth_gbps), "latency_us": _q(link.latency_us)}
            for link in (*p.links, *([p.default_link] if p.default_link else []))
        ],
        "network": [
            {"a": n.a, "b": n.b, "bandwidth_gbps": _q(n.bandwidth_gbps), "latency_us": _q(n.latency_us)}
            for n in p.network
        ],
    }


@devices_app.callback()
@fails_cleanly
def devices(ctx: typer.Context, as_json: JsonFlag = False) -> None:
    """List shipped and runtime device profiles."""
    if ctx.invoked_subcommand is not None:
        return
    rows = []
    for name in shipped_names():
        try:
            p = load_profile(name)
        except ValueError as exc:  # e.g. local-biglittle where throttling is impossible
            rows.append({"name": name, "available": False, "why": str(exc)})
            continue
        sources = [q.source for _, q in p.quantities()]
        rows.append(
            {
                "name": name,
                "available": True,
                "description": p.description,
                "pus": [f"{u.name}:{u.kind}" for u in p.pus],
                "measured": sources.count("measured"),
                "spec_sheet": sources.count("spec-sheet"),
                "estimate": sources.count("estimate"),
            }
        )
    if as_json:
        print_json(rows)
        return
    table = Table("profile", "PUs", "numbers: measured / spec-sheet / estimate", "description")
    for r in rows:
        if not r["available"]:
            table.add_row(r["name"], "-", "-", f"[yellow]unavailable here:[/] {r['why']}")
        else:
            table.add_row(
                r["name"],
                " ".join(r["pus"]),
                f"{r['measured']} / {r['spec_sheet']} / {r['estimate']}",
                r["description"],
            )
    out.print(table)


@devices_app.command("show")
@fails_cleanly
def show(
    name: Annotated[str, typer.Argument(help="A profile name or the path of a TOML profile.")],
    as_json: JsonFlag = False,
) -> None:
    """Print a profile's PUs, links and the source of every number."""
    p = load_profile(name)
    if as_json:
        print_json(profile_json(p))
        return
    out.print(f"[bold]{p.name}[/]: {p.description}  ({p.origin})", highlight=False)
    for note in p.notes:
        out.print(f"  note: {note}", highlight=False)
    pus = Table("PU", "kind", "host", "cores", "EP", "conv GFLOPS", "matmul GFLOPS", "mem GB/s", "active/idle W", "ops")
    for u in p.pus:
        pus.add_row(
            u.name,
            u.kind,
            u.host,
            ",".join(map(str, u.cores)) or "-",
            u.execution_provider if u.deployable else f"unavailable ({u.execution_provider or 'no EP'})",
            f"{u.peak_gflops['conv'].value:g}",
            f"{u.peak_gflops['matmul'].value:g}",
            f"{u.memory_bandwidth_gbps.value:g}",
            f"{u.active_power_w.value:g}/{u.idle_power_w.value:g}",
            "all" if not u.supported_ops else f"{len(u.supported_ops)} types",
        )
    out.print(pus)
    for u in p.undeployable():
        why = u.runtime.cite if u.runtime else ""
        out.print(f"  {u.name}: no onnxruntime drives it ({why}); plans use it only with --include-unavailable",
                  highlight=False, markup=False)  # fmt: skip
    links = Table("link", "GB/s", "latency us", "conversion us/MB")
    for link in (*p.links, *([p.default_link] if p.default_link else [])):
        ends = "any two PUs (default)" if link is p.default_link else f"{link.a} <-> {link.b}"
        links.add_row(
            ends, f"{link.bandwidth_gbps.value:g}", f"{link.latency_us.value:g}", f"{link.conversion_us_per_mb.value:g}"
        )
    for n in p.network:
        links.add_row(f"network {n.a} <-> {n.b}", f"{n.bandwidth_gbps.value:g}", f"{n.latency_us.value:g}", "-")
    out.print(links)
    sources = Table("field", "value", "source", "citation")
    for path, q in p.quantities():
        colour = {"measured": "green", "spec-sheet": "cyan", "estimate": "yellow"}[q.source]
        sources.add_row(path, f"{q.value:g}", f"[{colour}]{q.source}[/]", q.cite)
    out.print(sources)
    if not any(q.source == "measured" for _, q in p.quantities()):
        err.print("No number in this profile is measured; calibrate with `parapipe profile` on the board.")
