"""`automqctl compaction run|schedule|status|unschedule`: Spark compaction of objects.

The job itself is `spark_jobs/compact.py`, run as its own process (see
cli/compaction_jobs.py); the scheduler is a cluster component (`compaction-scheduler`,
started by `schedule` and by `cluster up` while a schedule exists, stopped by `cluster down`).
"""

from __future__ import annotations

import time
from pathlib import Path

import typer
from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn
from rich.table import Table

from cli import compaction_jobs as jobs
from cli.cluster_config import COMPACTION_SCHEDULER, ClusterError
from cli.options import DirOption, FormatOption, open_cluster
from cli.output import OutputFormat, console, fail, print_data, print_result

app = typer.Typer(help="Compact small objects into large ones with Spark.", no_args_is_help=True)

MasterOption = typer.Option(
    "local[*]", "--master", help="Spark master: local[*], local[N], spark://host:7077, k8s://..."
)


def _check_master(master: str) -> None:
    if not master.startswith(("local", "spark://", "k8s://", "yarn", "mesos://")):
        fail(f"invalid --master {master!r}: use local[*], local[N], spark://host:port or k8s://...")


@app.command()
def run(
    dir: Path = DirOption,
    master: str = MasterOption,
    dry_run: bool = typer.Option(False, "--dry-run", help="print the plan; change nothing"),
    format: OutputFormat = typer.Option(OutputFormat.table, "--format"),
) -> None:
    """Run one compaction now and wait for it (exit 1 when the commit was refused)."""
    _check_master(master)
    cluster, config = open_cluster(dir)
    if jobs.running_job(cluster.dir):
        fail("a compaction job is already running; see `automqctl compaction status`")
    if format == OutputFormat.table:
        with Progress(
            TextColumn("{task.description}"), BarColumn(), TaskProgressColumn(), console=console
        ) as bar:
            task = bar.add_task("planning", total=None)

            def on_event(event: dict) -> None:
                if event.get("event") == "plan":
                    bar.update(task, description="writing objects", total=None)
                elif event.get("event") == "progress":
                    bar.update(task, completed=event["done"], total=event["total"])

            result, code = jobs.run_job(cluster.dir, config, master, dry_run, on_event)
    else:
        result, code = jobs.run_job(cluster.dir, config, master, dry_run)
    if "objects_before" not in result:  # the job did not get as far as a result
        fail(f"compaction {result.get('reason', 'failed')} (log: {cluster.dir}/compaction/job.log)")
    if not print_data(result, format):
        _print_result(result)
    if code != 0:
        raise typer.Exit(1)


def _print_result(result: dict) -> None:
    table = Table(title="compaction")
    table.add_column("field")
    table.add_column("value")
    for key in (
        "committed",
        "objects_before",
        "objects_after",
        "bytes_read",
        "bytes_written",
        "duration_s",
        "master",
        "reason",
    ):
        if key in result:
            table.add_row(key, str(result[key]))
    for key, value in (result.get("plan") or {}).items():
        table.add_row(f"plan.{key}", str(value))
    for key, value in (result.get("log_cleaner") or {}).items():
        if key in ("skipped_partitions", "checkpoints"):  # per partition: --format json
            table.add_row(f"log_cleaner.{key}", str(len(value)))
        elif key not in ("partition_results", "new_object_ids"):
            table.add_row(f"log_cleaner.{key}", str(value))
    console.print(table)


@app.command()
def schedule(
    dir: Path = DirOption,
    every: str = typer.Option(..., "--every", help="interval: 90s, 10m, 2h, 1d"),
    master: str = MasterOption,
    format: OutputFormat = typer.Option(OutputFormat.table, "--format"),
) -> None:
    """Run compaction every interval (a scheduler process of the cluster); also prints the
    equivalent cron line and spark-submit command."""
    _check_master(master)
    try:
        every_s = jobs.parse_interval(every)
    except ValueError as exc:
        fail(str(exc))
    cluster, config = open_cluster(dir)
    path = jobs.compaction_dir(cluster.dir) / "schedule.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(jobs.Schedule(every_s=every_s, master=master).model_dump_json())
    cfg_path = jobs.write_job_config(cluster.dir, config, master)
    try:
        cluster.stop(COMPACTION_SCHEDULER)  # a new schedule: restart with it
        pid = cluster.start_compaction_scheduler()
    except ClusterError as exc:
        fail(str(exc))
    submit = jobs.spark_submit_command(cfg_path, master)
    out = {
        "every_s": every_s,
        "master": master,
        "scheduler_pid": pid,
        "cron": f"{jobs.cron_line(every_s)} AUTOMQ_CLUSTER_DIR={cluster.dir} automqctl "
        f"compaction run --master '{master}'",
        "spark_submit": submit,
    }
    if print_data(out, format):
        return
    console.print(f"compaction scheduled every {every_s}s on {master} (scheduler pid {pid})")
    console.print(f"cron equivalent:  {out['cron']}", soft_wrap=True)
    console.print(f"spark-submit:     {submit}", soft_wrap=True)
    console.print("(credentials: export AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY for the job)")


@app.command()
def unschedule(dir: Path = DirOption, format: OutputFormat = FormatOption) -> None:
    """Stop the scheduled runs (a run in progress finishes)."""
    cluster, _ = open_cluster(dir)
    path = jobs.compaction_dir(cluster.dir) / "schedule.json"
    was = path.exists()
    try:
        cluster.stop(COMPACTION_SCHEDULER)
    except ClusterError as exc:
        fail(str(exc))
    path.unlink(missing_ok=True)
    print_result(
        {"unscheduled": was},
        format,
        "compaction unscheduled" if was else "no compaction was scheduled",
    )


@app.command()
def status(
    dir: Path = DirOption,
    format: OutputFormat = typer.Option(OutputFormat.table, "--format"),
) -> None:
    """The schedule, the running job (with progress) and the last runs."""
    cluster, _ = open_cluster(dir)
    sched = jobs.load_schedule(cluster.dir)
    data = {
        "schedule": sched.model_dump() if sched else None,
        "scheduler_pid": cluster.running(COMPACTION_SCHEDULER),
        "running": jobs.running_job(cluster.dir),
        "last_runs": jobs.last_runs(cluster.dir),
    }
    if print_data(data, format):
        return
    if sched:
        console.print(
            f"schedule: every {sched.every_s}s on {sched.master} "
            f"(scheduler pid {data['scheduler_pid'] or 'not running'})"
        )
    else:
        console.print("schedule: none")
    run_ = data["running"]
    if run_:
        prog = run_.get("progress") or {}
        console.print(
            f"running: pid {run_['pid']} for {time.time() - run_['started']:.0f}s, "
            f"{prog.get('done', 0)}/{prog.get('total', '?')} objects written"
        )
    table = Table(title="last runs")
    for col in ("start", "duration_s", "objects", "read MB", "written MB", "result"):
        table.add_column(col)
    for r in data["last_runs"]:
        table.add_row(
            time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(r.get("start", 0))),
            str(r.get("duration_s", "")),
            f"{r.get('objects_before', '?')} -> {r.get('objects_after', '?')}",
            f"{r.get('bytes_read', 0) / 1e6:.1f}",
            f"{r.get('bytes_written', 0) / 1e6:.1f}",
            "committed" if r.get("committed") else (r.get("reason") or "failed"),
        )
    console.print(table)
