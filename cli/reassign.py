"""`automqctl reassign plan|execute|verify|status`: move partition leadership between brokers.

A move copies no data: the controller gives the partition its new leader with leader epoch
+ 1; the old leader uploads what its WAL holds for the stream and closes it; the new leader
opens it at the new epoch. The planning logic lives in `cli/reassign_plan.py` (pure).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import typer
from rich.table import Table

from cli.cluster_config import ClusterError
from cli.kafka_util import librdkafka_security
from cli.local_cluster import LocalCluster
from cli.options import ControllerDirOption as DirOption
from cli.options import ControllersOption, FormatOption, controller_client, metadata_image
from cli.output import OutputFormat, console, err_console, fail, print_data, waiting
from cli.reassign_plan import (
    DEFAULT_TOLERANCE,
    Assignment,
    BrokerInfo,
    PartitionView,
    PlanError,
    check_plan,
    check_targets,
    format_plan,
    moves_of,
    parse_plan,
    plan_by_count,
    plan_by_throughput,
    plan_to_json,
    progress,
    rates_from_offsets,
)
from controlplane.reassignment import LAST_REASSIGNMENT_KEY  # written by reassign_partitions
from dataplane.formats.kafka_errors import KafkaError as KafkaErrorCode  # the protocol table

app = typer.Typer(
    help="Reassign partitions between brokers (no data is copied).", no_args_is_help=True
)

MAX_SAMPLE_S = 300.0

PlanFileArgument = typer.Argument(
    None,
    metavar="PLAN_FILE",
    show_default=False,
    help="the plan file (JSON), as `reassign plan -o` writes it",
)
PlanOption = typer.Option(None, "--plan", help="the plan file, as an option (same as PLAN_FILE)")


# ---------------------------------------------------------------- cluster access


def _assignment(image) -> tuple[dict[tuple[str, int], int], dict[str, int]]:
    """(topic, partition) -> leader, and topic -> partition count. An erasure-coded
    partition has no leader (NO_LEADER here) and cannot be moved."""
    current: dict[tuple[str, int], int] = {}
    sizes: dict[str, int] = {}
    for t in image.topics.values():
        sizes[t.name] = len(t.partitions)
        for p in t.partitions.values():
            current[(t.name, p.partition)] = p.leader_node_id
    return current, sizes


def _led_partitions(image, topics: list[str]) -> set[tuple[str, int]]:
    """The partitions of `topics` that have a leader (the ones a plan can move)."""
    return {
        (t.name, p.partition)
        for t in image.topics.values()
        if t.name in topics
        for p in t.partitions.values()
        if not p.erasure_coded
    }


def _brokers(image) -> dict[int, BrokerInfo]:
    return {
        b.node_id: BrokerInfo(b.node_id, b.fenced, b.fence_reason, b.shutting_down)
        for b in image.brokers.values()
    }


def _view(image, topic: str, partition: int) -> PartitionView | None:
    t = image.topic_by_name(topic)
    p = t.partitions.get(partition) if t else None
    if p is None:
        return None
    s = image.streams.get(p.stream_id)
    return PartitionView(
        leader=p.leader_node_id,
        leader_epoch=p.leader_epoch,
        stream_epoch=s.epoch if s else None,
        stream_state=s.state.value if s else None,
        stream_node=s.node_id if s else None,
    )


def _int_list(text: str, what: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        fail(f"{what} must be a comma-separated list of integers, got {text!r}")
    if not values:
        fail(f"{what} is empty")
    return values


def _plan_path(ctx: typer.Context, plan_file: Path | None, plan: Path | None) -> Path:
    """The plan file given as PLAN_FILE or as --plan; a usage error if neither, or both and
    they differ."""
    if plan_file is None and plan is None:
        ctx.fail("Missing argument 'PLAN_FILE' (or --plan).")
    if plan_file is not None and plan is not None and plan_file != plan:
        ctx.fail(f"PLAN_FILE {plan_file} and --plan {plan} differ: give the plan file once.")
    return plan_file if plan_file is not None else plan


def _read_plan(path: Path) -> list[Assignment]:
    if not path.exists():
        fail(f"plan file {path} does not exist")
    try:
        text = path.read_text()
    except OSError as exc:
        fail(f"cannot read plan file {path}: {exc}")
    try:
        return parse_plan(text)
    except PlanError as exc:
        fail(f"plan file {path}: {exc}")


def _print_plan(data: dict) -> None:
    sys.stdout.write(format_plan(data))


def _write_plan(path: Path, data: dict) -> None:
    try:
        path.write_text(format_plan(data))
    except OSError as exc:
        fail(f"cannot write {path}: {exc}")


# ---------------------------------------------------------------- throughput sampling


END_OFFSET_ATTEMPTS = 5
END_OFFSET_RETRY_S = 0.5


def _end_offsets(
    admin, keys: list[tuple[str, int]], timeout_s: float
) -> dict[tuple[str, int], int]:
    from confluent_kafka import KafkaException, TopicPartition
    from confluent_kafka.admin import OffsetSpec

    out: dict[tuple[str, int], int] = {}
    pending = list(keys)
    # a partition moving meanwhile (the balancer, another reassignment) answers
    # NOT_LEADER_OR_FOLLOWER once: ask again, bounded, after the client refreshed its metadata
    for attempt in range(END_OFFSET_ATTEMPTS):
        futures = admin.list_offsets(
            {TopicPartition(t, p): OffsetSpec.latest() for t, p in pending},
            request_timeout=timeout_s,
        )
        retry: list[tuple[str, int]] = []
        for tp, fut in futures.items():
            try:
                out[(tp.topic, tp.partition)] = fut.result(timeout=timeout_s).offset
            except KafkaException as exc:
                error = exc.args[0] if exc.args else None
                code = error.code() if error is not None else -1
                retriable = (error is not None and error.retriable()) or (
                    code > 0 and KafkaErrorCode.from_code(code).retriable
                )
                if not retriable or attempt == END_OFFSET_ATTEMPTS - 1:
                    raise
                retry.append((tp.topic, tp.partition))
        if not retry:
            break
        pending = retry
        time.sleep(END_OFFSET_RETRY_S)
    return out


def _sample_rates(
    image, keys: list[tuple[str, int]], sample_s: float, credentials: dict | None = None
) -> dict[tuple[str, int], float]:
    """Produce rate per partition: Kafka ListOffsets (latest) twice, `sample_s` apart, against
    the brokers' listeners as registered in the image."""
    from confluent_kafka.admin import AdminClient

    bootstrap = ",".join(f"{b.host}:{b.kafka_port}" for b in image.brokers.values() if not b.fenced)
    if not bootstrap:
        fail("no unfenced broker to measure produce rates with")
    admin = AdminClient(
        {
            "bootstrap.servers": bootstrap,
            "client.id": "automqctl-reassign",
            **librdkafka_security(credentials),
        }
    )
    try:
        t0 = time.monotonic()
        before = _end_offsets(admin, keys, 15.0)
        t1 = time.monotonic()
        with waiting(f"sampling produce rates for {sample_s:g}s"):
            time.sleep(sample_s)
        t2 = time.monotonic()
        after = _end_offsets(admin, keys, 15.0)
        t3 = time.monotonic()
    except Exception as exc:  # librdkafka raises KafkaException and friends
        fail(f"measuring produce rates (ListOffsets against {bootstrap}) failed: {exc}")
    # the midpoints of the two requests are the best guess of when the offsets were read
    return rates_from_offsets(before, after, (t2 + t3) / 2 - (t0 + t1) / 2)


# ---------------------------------------------------------------- commands


@app.command()
def plan(
    topics: str = typer.Option(..., "--topics", help="topics to balance: a,b,..."),
    brokers: str = typer.Option(..., "--brokers", help="target brokers: 1,2,3"),
    by: str = typer.Option(
        "count",
        "--by",
        help="count: balance partition counts; throughput: balance the "
        "produce rate (records/s) measured with Kafka ListOffsets "
        "(latest offsets sampled twice, --sample-s apart)",
    ),
    sample_s: float = typer.Option(5.0, "--sample-s", help="throughput sampling interval"),
    tolerance: float = typer.Option(
        DEFAULT_TOLERANCE,
        "--tolerance",
        help="throughput: a broker within (1+tolerance) x the fair share keeps its partitions",
    ),
    output: Path | None = typer.Option(
        None, "--output", "-o", help="write the plan here instead of stdout"
    ),
    dir: Path = DirOption,
    controllers: str | None = ControllersOption,
    format: OutputFormat = FormatOption,
) -> None:
    """Propose a balanced plan for the topics' partitions over the brokers.

    Moves as few partitions as possible. Prints the plan JSON (or writes it with --output).
    """
    if by not in ("count", "throughput"):
        fail(f"--by must be count or throughput, not {by!r}")
    if by == "throughput" and not 0 < sample_s <= MAX_SAMPLE_S:
        fail(f"--sample-s must be in (0, {MAX_SAMPLE_S:.0f}]")
    names = [t.strip() for t in topics.split(",") if t.strip()]
    if not names:
        fail("--topics is empty")
    targets = _int_list(brokers, "--brokers")
    image = metadata_image(controller_client(dir, controllers))
    current, sizes = _assignment(image)
    missing = [t for t in names if t not in sizes]
    if missing:
        fail(f"unknown topic(s): {', '.join(missing)}")
    try:
        check_targets(sorted(set(targets)), _brokers(image))
    except PlanError as exc:
        fail(str(exc))
    led = _led_partitions(image, names)
    mine = [Assignment(t, p, node) for (t, p), node in current.items() if (t, p) in led]
    if not mine:
        fail("the topics have no partitions with a leader (erasure-coded ones never move)")
    rates: dict[tuple[str, int], float] = {}
    if by == "throughput":
        try:
            credentials = None if controllers else LocalCluster(dir).client_security()
        except ClusterError as exc:
            fail(str(exc))
        rates = _sample_rates(image, [a.key for a in mine], sample_s, credentials)
        proposal = plan_by_throughput(mine, rates, targets, tolerance)
    else:
        proposal = plan_by_count(mine, targets)
    data = plan_to_json(proposal)
    moves = moves_of(proposal, current)
    if output is not None:
        _write_plan(output, data)
    if format != OutputFormat.table:
        if output is None and format == OutputFormat.json:
            _print_plan(data)  # the plan file's own format
        elif output is None:
            print_data(data, format)
        else:
            print_data({"output": str(output), "partitions": len(proposal), "moves": moves}, format)
        return
    if output is None:
        _print_plan(data)  # the plan is the data: stdout stays pipeable, the summary goes to stderr
    _summary(proposal, current, rates, err_console if output is None else console)
    if output is not None:
        console.print(f"wrote plan to {output}: {len(moves)} of {len(proposal)} partitions move")


def _summary(
    proposal: list[Assignment],
    current: dict[tuple[str, int], int],
    rates: dict[tuple[str, int], float],
    out,
) -> None:
    per_broker: dict[int, list[Assignment]] = {}
    for a in proposal:
        per_broker.setdefault(a.node_id, []).append(a)
    table = Table(title="proposed assignment")
    for col in ("broker", "partitions", "moving in") + (("records/s",) if rates else ()):
        table.add_column(col)
    for node in sorted(per_broker):
        parts = per_broker[node]
        row = [str(node), str(len(parts)), str(sum(1 for a in parts if current.get(a.key) != node))]
        if rates:
            row.append(f"{sum(rates.get(a.key, 0.0) for a in parts):.1f}")
        table.add_row(*row)
    out.print(table)


@app.command()
def execute(
    ctx: typer.Context,
    plan_file: Path | None = PlanFileArgument,
    plan: Path | None = PlanOption,
    dry_run: bool = typer.Option(False, "--dry-run", help="validate and show, change nothing"),
    rollback_file: Path | None = typer.Option(
        None, "--rollback-file", help="also write the rollback plan here"
    ),
    dir: Path = DirOption,
    controllers: str | None = ControllersOption,
    format: OutputFormat = FormatOption,
) -> None:
    """Validate a plan, print a rollback plan and submit it (unless --dry-run).

    The rollback plan is the current assignment of the plan's partitions. A bad entry
    anywhere changes nothing.
    """
    from controlplane.client import ControllerUnavailableError
    from controlplane.errors import ControllerError
    from controlplane.requests import PartitionMove, ReassignPartitionsRequest

    plan = _plan_path(ctx, plan_file, plan)
    entries = _read_plan(plan)
    client = controller_client(dir, controllers)
    image = metadata_image(client)
    current, sizes = _assignment(image)
    try:
        check_plan(entries, current, sizes, _brokers(image))
    except PlanError as exc:
        fail(f"plan file {plan}: {exc}")
    rollback = plan_to_json([Assignment(a.topic, a.partition, current[a.key]) for a in entries])
    if rollback_file is not None:
        _write_plan(rollback_file, rollback)
    moves = moves_of(entries, current)
    result = {"moved": 0, "unchanged": len(entries) - len(moves)}
    if not dry_run:
        req = ReassignPartitionsRequest(
            moves=[
                PartitionMove(topic=a.topic, partition=a.partition, node_id=a.node_id)
                for a in entries
            ]
        )
        try:
            result = client.send(req)
        except ControllerUnavailableError as exc:
            fail(f"no controller leader reachable; nothing was submitted: {exc}")
        except ControllerError as exc:
            # the controller validates the whole plan first: a refusal changed nothing
            fail(f"the controller refused the plan (nothing changed): {exc}")
    if format != OutputFormat.table:
        print_data(
            {
                "dry_run": dry_run,
                "rollback_plan": rollback,
                "moves": moves,
                "moved": result.get("moved", 0),
                "unchanged": result.get("unchanged", 0),
            },
            format,
        )
        return
    console.print("rollback plan (the current assignment; `reassign execute` it to undo):")
    _print_plan(rollback)
    table = Table(title="dry run: would move" if dry_run else "moved")
    for col in ("topic", "partition", "from", "to"):
        table.add_column(col)
    for m in moves:
        table.add_row(m["topic"], str(m["partition"]), str(m["from"]), str(m["to"]))
    console.print(table)
    if dry_run:
        console.print(f"dry run: {len(moves)} partitions would move, nothing submitted")
    else:
        console.print(
            f"submitted: {result.get('moved', 0)} moved, {result.get('unchanged', 0)} "
            f"unchanged; check with `automqctl reassign verify {plan}`"
        )


def _check_progress(image, entries: list[Assignment]) -> list[dict]:
    rows = []
    for a in entries:
        done, state = progress(a.node_id, _view(image, a.topic, a.partition))
        rows.append(
            {
                "topic": a.topic,
                "partition": a.partition,
                "node_id": a.node_id,
                "done": done,
                "state": state,
            }
        )
    return rows


def _progress_table(title: str, rows: list[dict]) -> Table:
    table = Table(title=title)
    for col in ("topic", "partition", "target", "state"):
        table.add_column(col)
    for r in rows:
        style = "green" if r["done"] else "yellow"
        table.add_row(
            r["topic"], str(r["partition"]), str(r["node_id"]), f"[{style}]{r['state']}[/]"
        )
    return table


@app.command()
def verify(
    ctx: typer.Context,
    plan_file: Path | None = PlanFileArgument,
    plan: Path | None = PlanOption,
    timeout_s: float = typer.Option(
        30.0, "--timeout-s", min=0.0, max=3600.0, help="how long to wait for the moves to finish"
    ),
    dir: Path = DirOption,
    controllers: str | None = ControllersOption,
    format: OutputFormat = FormatOption,
) -> None:
    """Wait until the plan is done: exit 0 when done, 1 with the unfinished partitions.

    Done means every partition is led by its planned broker and that broker has the
    partition's stream open at the leader epoch (it takes writes).
    """
    plan = _plan_path(ctx, plan_file, plan)
    entries = _read_plan(plan)
    client = controller_client(dir, controllers)
    start = time.monotonic()
    deadline = start + timeout_s
    with waiting(f"waiting up to {timeout_s:g}s for {len(entries)} partitions", format):
        while True:
            rows = _check_progress(metadata_image(client), entries)
            unfinished = [r for r in rows if not r["done"]]
            if not unfinished or time.monotonic() >= deadline:
                break
            time.sleep(0.1)
    elapsed = time.monotonic() - start
    if format != OutputFormat.table:
        print_data(
            {
                "done": not unfinished,
                "elapsed_s": round(elapsed, 3),
                "partitions": rows,
                "unfinished": unfinished,
            },
            format,
        )
    elif unfinished:
        console.print(_progress_table("unfinished partitions", unfinished))
    else:
        console.print(
            f"all {len(rows)} partitions are led by their planned brokers and writable "
            f"(checked for {elapsed:.1f}s)"
        )
    if unfinished:
        fail(
            f"{len(unfinished)} of {len(rows)} partitions not done after {timeout_s:.0f}s: "
            + ", ".join(f"{r['topic']}-{r['partition']}" for r in unfinished[:20])
            + (" ..." if len(unfinished) > 20 else "")
        )


@app.command()
def status(
    dir: Path = DirOption,
    controllers: str | None = ControllersOption,
    format: OutputFormat = FormatOption,
) -> None:
    """The last submitted plan (kept by the controller) and each partition's progress."""
    image = metadata_image(controller_client(dir, controllers))
    raw = image.kv.get(LAST_REASSIGNMENT_KEY)
    if raw is None:
        if format != OutputFormat.table:
            print_data({"plan": None}, format)
        else:
            console.print("no reassignment has been submitted")
        return
    try:
        last = json.loads(raw)
        entries = [
            Assignment(m["topic"], int(m["partition"]), int(m["node_id"])) for m in last["moves"]
        ]
        started_ms = int(last["started_ms"])
    except (ValueError, KeyError, TypeError) as exc:
        fail(f"the controller's {LAST_REASSIGNMENT_KEY} is not a plan: {exc}")
    rows = _check_progress(image, entries)
    done = sum(1 for r in rows if r["done"])
    # started_ms is the controller's wall clock when it accepted the plan
    elapsed_s = max(0.0, time.time() - started_ms / 1000)
    if format != OutputFormat.table:
        print_data(
            {
                "started_ms": started_ms,
                "elapsed_s": round(elapsed_s, 3),
                "done": done,
                "total": len(rows),
                "complete": done == len(rows),
                "partitions": rows,
            },
            format,
        )
        return
    console.print(
        _progress_table(
            f"last reassignment: {done}/{len(rows)} done, submitted {elapsed_s:.1f}s ago", rows
        )
    )
