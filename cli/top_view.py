"""`automqctl cluster top` on a terminal: the document of `cli.top_metrics.top_document` as
rich tables, refreshed in place (rich `Live` on the alternate screen) until q or Ctrl-C;
the terminal's mode and screen are restored however it ends.

Thread-safety: one sampling thread produces documents (`TopSampler` is its alone) into a
one-slot queue; the main thread reads keys and draws.
"""

from __future__ import annotations

import contextlib
import os
import queue
import select
import sys
import termios
import threading
import time
import tty
from collections.abc import Callable, Iterator

from rich.console import Console, Group
from rich.markup import escape
from rich.table import Table
from rich.text import Text

KEY_POLL_S = 0.1  # how often the main thread looks for a key press
QUIT_KEYS = (b"q", b"Q")
# the figures' columns, short enough for 100 columns of terminal
BROKER_COLUMNS = (
    "prod MB/s",
    "fetch MB/s",
    "req p99",
    "prod p99",
    "WAL fill",
    "upl lag",
    "upl err",
    "parts",
    "conns",
)


def _num(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _wal(b: dict) -> str:
    if b.get("wal_fill") is None:
        return "-"
    style = "red" if b["wal_fill"] >= 0.8 else "yellow" if b["wal_fill"] >= 0.5 else ""
    text = f"{b['wal_fill'] * 100:.0f}%"
    return f"[{style}]{text}[/]" if style else text


def _upload(b: dict) -> tuple[str, str]:
    lag = "-" if b.get("upload_lag_s") is None else f"{b['upload_lag_s']:.1f} s"
    errors = "-" if b.get("upload_errors") is None else str(b["upload_errors"])
    if b.get("upload_failing"):
        errors = f"[bold red]{errors} failing[/]"
    elif b.get("upload_errors"):
        errors = f"[red]{errors}[/]"
    return lag, errors


def brokers_table(doc: dict) -> Table:
    """One row per broker: traffic, latency, WAL and uploads, partitions, connections."""
    table = Table(
        title="brokers (p99 in ms; upl: WAL uploads; parts: partitions led; conns: connections)",
        title_justify="left",
    )
    table.add_column("node", no_wrap=True)
    table.add_column("az")
    table.add_column("state")
    for name in BROKER_COLUMNS:
        table.add_column(name, justify="right")
    for b in doc["brokers"]:
        lag, errors = _upload(b)
        state = b["state"] if b["state"] == "active" else f"[red]{b['state']}[/]"
        if b.get("error") and b["state"] != "stopped":
            state += " [red](no /metrics)[/]"  # why: under the tables
        table.add_row(
            str(b["node_id"]),
            escape(str(b.get("az") or "")),
            state,
            _num(b.get("produce_mb_s")),
            _num(b.get("fetch_mb_s")),
            _num(b.get("request_p99_ms"), 1),
            _num(b.get("produce_p99_ms"), 1),
            _wal(b),
            lag,
            errors,
            "-" if b.get("partitions_led") is None else str(b["partitions_led"]),
            "-" if b.get("connections") is None else str(b["connections"]),
        )
    return table


def topics_table(doc: dict, max_groups: int = 3) -> Table:
    """One row per topic: MB/s in and out, its consumer groups' lag (the largest first)."""
    table = Table(title="topics", title_justify="left")
    table.add_column("topic")
    table.add_column("in MB/s", justify="right")
    table.add_column("out MB/s", justify="right")
    table.add_column("consumer group lag (records)")
    for t in doc["topics"]:
        groups = list(t["group_lag"].items())
        lag = ", ".join(f"{escape(g)} {n:,}" for g, n in groups[:max_groups])
        if len(groups) > max_groups:
            lag += f" (+{len(groups) - max_groups} groups)"
        table.add_row(escape(t["topic"]), _num(t["in_mb_s"]), _num(t["out_mb_s"]), lag)
    return table


def render(doc: dict, footer: str = "") -> Group:
    """The whole view of one document."""
    bucket = doc.get("active_bucket")
    mode = doc.get("failover_mode") or "unknown"
    head = Text.from_markup(
        f"cluster [bold]{escape(str(doc.get('cluster_dir')))}[/]: {escape(str(doc.get('state')))}"
        f"   failover mode: [{'bold red' if mode == 'failover' else 'bold'}]{mode}[/]"
        "   active bucket: "
        + (f"{bucket['bucket_id']} ({escape(bucket['uri'])})" if bucket else "unknown")
        + f"\nproduce [bold]{doc['produce_mb_s']:.2f}[/] MB/s   "
        f"fetch [bold]{doc['fetch_mb_s']:.2f}[/] MB/s"
    )
    parts: list = [head, brokers_table(doc), topics_table(doc)]
    notes = list(doc.get("problems") or [])
    notes += [
        f"broker {b['node_id']}: {b['error']}"
        for b in doc["brokers"]
        if b.get("error") and b["state"] != "stopped"
    ]
    if doc.get("group_lag_error"):
        notes.append(doc["group_lag_error"])
    if notes:
        parts.append(Text("; ".join(notes), style="red"))
    if footer:
        parts.append(Text(footer, style="dim"))
    return Group(*parts)


@contextlib.contextmanager
def _keys_mode() -> Iterator[int | None]:
    """stdin in cbreak mode (keys read one by one, unechoed; Ctrl-C still interrupts) while
    inside; its mode restored after. Yields stdin's descriptor, None when not a terminal."""
    if not sys.stdin.isatty():
        yield None
        return
    fd = sys.stdin.fileno()
    saved = termios.tcgetattr(fd)
    try:
        tty.setcbreak(fd)
        yield fd
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


def _quit_pressed(fd: int | None, wait_s: float) -> bool:
    """Whether q was pressed within `wait_s` (sleeps `wait_s` when stdin is no terminal)."""
    if fd is None:
        time.sleep(wait_s)
        return False
    readable, _, _ = select.select([fd], [], [], wait_s)
    if not readable:
        return False
    pressed = os.read(fd, 64)
    return any(key in pressed for key in QUIT_KEYS)


def run_live(
    console: Console,
    sample: Callable[[], dict],
    interval_s: float,
    waiting: str,
) -> None:
    """Draw `sample()`'s documents every `interval_s` until q or Ctrl-C (KeyboardInterrupt
    propagates after the terminal is restored). `sample` runs on a daemon thread, so a
    slow scrape never delays quitting."""
    from rich.live import Live

    documents: queue.Queue[dict | BaseException] = queue.Queue(maxsize=1)
    stop = threading.Event()

    def produce() -> None:
        while not stop.is_set():
            started = time.monotonic()
            try:
                doc: dict | BaseException = sample()
            except Exception as exc:  # noqa: BLE001 - shown on the screen, sampling goes on
                doc = exc
            with contextlib.suppress(queue.Empty):
                documents.get_nowait()  # the view wants the newest only
            documents.put_nowait(doc)
            stop.wait(max(0.0, interval_s - (time.monotonic() - started)))

    footer = f"every {interval_s:g} s; q or Ctrl-C quits"
    worker = threading.Thread(target=produce, name="top-sampler", daemon=True)
    with (
        _keys_mode() as fd,
        Live(Text(waiting), console=console, screen=True, auto_refresh=False) as live,
    ):
        worker.start()
        try:
            while not _quit_pressed(fd, KEY_POLL_S):
                try:
                    doc = documents.get_nowait()
                except queue.Empty:
                    continue
                if isinstance(doc, BaseException):
                    view = Text(f"error: {doc}", style="red")
                else:
                    view = render(doc, f"{time.strftime('%H:%M:%S')}  {footer}")
                live.update(view, refresh=True)
        finally:
            stop.set()
