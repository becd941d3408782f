"""`automqctl balancer status|enable|disable`: the controller's self-balancer.

The balancer (controlplane/balancer.py) runs on the controller leader and moves partitions
between active brokers in small rounds, by partition count and by produce rate. On/off is
kept in the metadata, so it survives a controller failover; disabling it stops new rounds,
moves already submitted still finish.
"""

from __future__ import annotations

import time
from pathlib import Path

import typer
from rich.markup import escape
from rich.table import Table

from cli.options import ControllerDirOption as DirOption
from cli.options import ControllersOption, FormatOption, controller_client
from cli.output import OutputFormat, console, fail, print_data

app = typer.Typer(
    help="The self-balancer: moves partitions to even out brokers (on by default).",
    no_args_is_help=True,
)

STATE_STYLE = {"off": "red", "idle": "green", "in_progress": "yellow", "stalled": "bold red"}


def _fetch_status(client) -> dict:
    from controlplane.client import ControllerUnavailableError
    from controlplane.errors import ControllerError

    try:
        return client.balancer_status()
    except ControllerUnavailableError as exc:
        fail(f"no controller leader reachable: {exc}")
    except ControllerError as exc:
        fail(f"reading the balancer status failed: {exc}")


def _set(enabled: bool, dir: Path, controllers: str | None, format: OutputFormat) -> None:
    from controlplane.client import ControllerUnavailableError
    from controlplane.errors import ControllerError
    from controlplane.requests import SetBalancerRequest

    client = controller_client(dir, controllers)
    try:
        result = client.send(SetBalancerRequest(enabled=enabled))
    except ControllerUnavailableError as exc:
        fail(f"no controller leader reachable; nothing changed: {exc}")
    except ControllerError as exc:
        fail(f"the controller refused: {exc}")
    if format != OutputFormat.table:
        print_data(result, format)
        return
    word = "enabled" if enabled else "disabled"
    note = "" if result.get("changed") else " (it already was)"
    console.print(
        f"balancer {word}{note}" + ("" if enabled else "; moves already submitted still finish")
    )


@app.command()
def enable(
    dir: Path = DirOption,
    controllers: str | None = ControllersOption,
    format: OutputFormat = FormatOption,
) -> None:
    """Turn the balancer on (the default)."""
    _set(True, dir, controllers, format)


@app.command()
def disable(
    dir: Path = DirOption,
    controllers: str | None = ControllersOption,
    format: OutputFormat = FormatOption,
) -> None:
    """Turn the balancer off: no new moves (controlled shutdown and failover still move)."""
    _set(False, dir, controllers, format)


def _rate(bytes_per_s: float) -> str:
    for unit, size in (("MiB/s", 1024 * 1024), ("KiB/s", 1024)):
        if bytes_per_s >= size:
            return f"{bytes_per_s / size:.1f} {unit}"
    return f"{bytes_per_s:.0f} B/s"


def _pinned_text(pinned: list[dict], until_ms: int | None, now_s: float | None = None) -> str:
    """`pinned until 12:34:56 (9m58s from now) by the last reassign: orders 0,1,2; ...`."""
    by_topic: dict[str, list[int]] = {}
    for p in pinned:
        by_topic.setdefault(p["topic"], []).append(p["partition"])
    names = "; ".join(
        f"{topic} {','.join(str(n) for n in sorted(parts))}" for topic, parts in by_topic.items()
    )
    when = ""
    if until_ms is not None:
        left_s = max(0, int(until_ms / 1000 - (time.time() if now_s is None else now_s)))
        clock = time.strftime("%H:%M:%S", time.localtime(until_ms / 1000))
        when = f" until {clock} ({left_s // 60}m{left_s % 60:02d}s from now)"
    return (
        f"pinned{when} by the last `reassign` (the balancer leaves them where the plan put "
        f"them): {len(pinned)} partition(s): {escape(names)}"
    )


@app.command()
def status(
    dir: Path = DirOption,
    controllers: str | None = ControllersOption,
    format: OutputFormat = FormatOption,
) -> None:
    """State (off / idle / in_progress / stalled), brokers' loads and the recent moves."""
    data = _fetch_status(controller_client(dir, controllers))
    if format != OutputFormat.table:
        print_data(data, format)
        return
    style = STATE_STYLE.get(data["state"], "white")
    console.print(f"balancer: [{style}]{data['state']}[/] (by {data['mode']}): {data['detail']}")
    if data.get("pinned_partitions"):
        console.print(_pinned_text(data["pinned_partitions"], data.get("pinned_until_ms")))
    if not data.get("rates_known", True):
        console.print("[yellow]the controller leader is new: produce rates are still arriving[/]")
    table = Table(title="brokers")
    for col in ("broker", "az", "partitions", "produce", "balancing"):
        table.add_column(col)
    for b in data["brokers"]:
        table.add_row(
            str(b["node_id"]),
            b["az"],
            str(b["partitions"]) if b["eligible"] else "-",
            _rate(b["bytes_per_s"]) if b["eligible"] else "-",
            "yes" if b["eligible"] else f"no: {b['why_not']}",
        )
    console.print(table)
    if data["recent_moves"]:
        moves = Table(title="recent moves (newest first)")
        for col in ("time", "partition", "from", "to", "status", "reason"):
            moves.add_column(col)
        for m in data["recent_moves"]:
            when = time.strftime("%H:%M:%S", time.localtime(m["time_ms"] / 1000))
            moves.add_row(
                when,
                f"{m['topic']}-{m['partition']}",
                str(m["from"]),
                str(m["to"]),
                m["status"],
                m["reason"],
            )
        console.print(moves)
    else:
        console.print("no moves yet")
