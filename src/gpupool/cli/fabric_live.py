"""`gpupool fabric status`, `fail-link LINK` and `heal-link LINK`: the fabric of the running pool."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer

from gpupool.cli._common import client, console, reports_errors
from gpupool.cli.fabric import JSON, app


def _fabric_call(method: str, path: str, **kwargs: Any) -> dict[str, Any]:
    with client() as pool:
        answer: dict[str, Any] = pool.request(method, f"/fabric{path}", **kwargs)
        return answer


@app.command("status")
@reports_errors
def status(
    workload: Annotated[str | None, typer.Option("--workload", "-w", help=(
        "Also show this workload's path: its nodes, domain, hops and bottleneck."))] = None,
    as_json: bool = JSON,
) -> None:
    """The running pool's fabric: tiers, failed, degraded and loaded links, and a gang's path.

    Every token may read it (a tenant sees only its own workloads' paths). Link ids are NODE:PORT,
    what `gpupool fabric fail-link` takes.

    Example: gpupool fabric status --workload w-1a2b
    """
    found = _fabric_call("GET", "", params={"workload": workload} if workload else None)
    if as_json:
        print(json.dumps(found, indent=2))
        return
    out = console()
    tiers = ", ".join(f"{lv['switches']} {lv['tier']}" for lv in found["levels"])
    out.print(f"Fabric {found['source']}: {tiers} switches, {len(found['nodes'])} pool nodes, "
              f"{len(found['links'])} links.")
    notable = [lk for lk in found["links"] if lk["failed"] or lk["degraded"] or lk["load"] >= 0.5]
    for link in notable:
        state = "FAILED" if link["failed"] else ("degraded" if link["degraded"] else "loaded")
        out.print(f"  {state:8} {link['a']}[{link['a_port']}] <-> {link['b']}[{link['b_port']}] "
                  f"{link['width_speed']}, load {link['load']:.0%}, {link['gangs']} gangs (id {link['id']})")
    if not notable:
        out.print("  every link is up and lightly loaded.")
    gang = found.get("gang")
    if gang:
        bottleneck = (f"bottleneck {gang['bottleneck']} at {gang['bottleneck_gbps']:.0f} Gb/s"
                      if gang["bottleneck"] else "no fabric link (one node)")
        cut = "" if gang["connected"] else "; CUT OFF: some of its nodes have no route left"
        out.print(f"{gang['workload_id']}: {', '.join(gang['nodes'])}: {gang['domain']}, "
                  f"{gang['hops']} hops, {bottleneck}{cut}")


def change_link(link: str, *, failed: bool, as_json: bool) -> None:
    """Fail or heal a cable of the running pool's fabric and say what it did to the gangs."""
    found = _fabric_call("POST", "/links/fail" if failed else "/links/heal", json={"link": link})
    if as_json:
        print(json.dumps(found, indent=2))
        return
    verb = "Failed" if failed else "Healed"
    if not found["changed"]:
        print(f"{link} was already {'failed' if failed else 'up'}; nothing changed.")
        return
    print(f"{verb} {link}: {len(found['requeued'])} gangs cut off and requeued"
          + (f" ({', '.join(found['requeued'])})" if found["requeued"] else "")
          + f", {len(found['slowed'])} told their new bottleneck.")
    for workload_id, message in found["slowed"].items():
        print(f"  {workload_id}: {message}")


@app.command("heal-link")
@reports_errors
def heal_link(
    link: Annotated[str, typer.Argument(help="NODE:PORT of one end of the failed cable.")],
    as_json: bool = JSON,
) -> None:
    """Put a failed cable of the running pool's fabric back (admin); routes are recomputed.

    Example: gpupool fabric heal-link leaf-3:13
    """
    change_link(link, failed=False, as_json=as_json)
