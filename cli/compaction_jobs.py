"""Running the Spark compaction job for a local cluster, and its run history (no Spark here).

The job runs as its own process (`python -m spark_jobs.compact`, or `spark-submit`), so the
CLI never imports pyspark; this module writes the job's config (no secrets), hands the
object-store credentials to it through the environment, reads its JSON event lines, and
keeps the history in `<cluster dir>/compaction/` (cli/job_runs.py runs the process and keeps
the run files, as it does for the table sync job):

    schedule.json   the schedule (`compaction schedule`), read by the scheduler process
    running.json    the run in progress (pid, started, progress), removed when it ends
    runs.jsonl      the last MAX_RUNS results, one JSON object per line
    job.json        the job config; job.log the last run's stderr (Spark's log)
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

from pydantic import BaseModel, Field

from cli.cluster_config import ClusterConfig
from cli.job_runs import JOB_TIMEOUT_S, MAX_RUNS, JobRuns
from controlplane.auth import SECRET_ENV
from controlplane.tls import CA_FILE_ENV

MIN_INTERVAL_S = 10
MAX_INTERVAL_S = 7 * 24 * 3600


class Schedule(BaseModel):
    every_s: int = Field(ge=MIN_INTERVAL_S, le=MAX_INTERVAL_S)
    master: str = "local[*]"


def compaction_dir(cluster_dir: Path) -> Path:
    return cluster_dir / "compaction"


def parse_interval(text: str) -> int:
    """`90s`, `10m`, `2h`, `1d` or plain seconds -> seconds; ValueError with a clear text."""
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    t = text.strip().lower()
    try:
        seconds = int(t[:-1]) * units[t[-1]] if t and t[-1] in units else int(t)
    except ValueError:
        raise ValueError(f"invalid interval {text!r}: use e.g. 90s, 10m, 2h, 1d") from None
    if not MIN_INTERVAL_S <= seconds <= MAX_INTERVAL_S:
        raise ValueError(f"interval {text!r} must be between {MIN_INTERVAL_S}s and 7d")
    return seconds


def cron_line(every_s: int) -> str:
    """An equivalent crontab schedule (cron's resolution is a minute)."""
    minutes = max(every_s // 60, 1)
    if minutes < 60:
        return f"*/{minutes} * * * *"
    hours = minutes // 60
    return f"0 */{hours} * * *" if hours < 24 else "0 0 * * *"


def job_config(config: ClusterConfig, master: str) -> dict:
    """The job's config for this cluster: controllers and buckets, without secrets."""
    return {
        "controllers": config.quorum_config().api_addresses(),
        "buckets": {b.bucket_id: b.uri for b in config.buckets},
        "master": master,
    }


def job_env(config: ClusterConfig) -> dict[str, str]:
    """The process environment of the job: the buckets' credentials (per bucket, as
    AUTOMQ_S3_ACCESS_KEY_<id>/AUTOMQ_S3_SECRET_KEY_<id>) and the controller API's secret (never argv; the driver's ControllerClient reads AUTOMQ_CONTROLLER_SECRET)."""
    env = dict(os.environ)
    env["PYTHONUNBUFFERED"] = "1"
    if config.api_secret:
        env[SECRET_ENV] = config.api_secret
    if config.controller_ca_file:
        env[CA_FILE_ENV] = config.controller_ca_file
    creds = next((b for b in config.buckets if b.access_key), None)
    if creds is not None:
        env["AWS_ACCESS_KEY_ID"] = creds.access_key
        env["AWS_SECRET_ACCESS_KEY"] = creds.secret_key
    for b in config.buckets:  # each bucket its own keys (BucketURI.credentials reads these)
        if b.access_key:
            env[f"AUTOMQ_S3_ACCESS_KEY_{b.bucket_id}"] = b.access_key
            env[f"AUTOMQ_S3_SECRET_KEY_{b.bucket_id}"] = b.secret_key
    return env


def write_job_config(cluster_dir: Path, config: ClusterConfig, master: str) -> Path:
    path = compaction_dir(cluster_dir) / "job.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(job_config(config, master), indent=2))
    return path


def job_argv(config_path: Path, master: str, dry_run: bool) -> list[str]:
    argv = [sys.executable, "-m", "spark_jobs.compact", "--config", str(config_path)]
    argv += ["--master", master]
    return argv + (["--dry-run"] if dry_run else [])


def spark_submit_command(config_path: Path, master: str) -> str:
    """The equivalent spark-submit line for operators who schedule with cron or Airflow."""
    root = Path(__file__).resolve().parents[1]
    return (
        f"spark-submit --master {master} --py-files <zip of {root}/controlplane,dataplane,"
        f"spark_jobs> {root}/spark_jobs/compact.py --config {config_path}"
    )


def job_runs(cluster_dir: Path) -> JobRuns:
    """The compaction job's running.json, runs.jsonl and job.log."""
    return JobRuns(compaction_dir(cluster_dir), MAX_RUNS)


def run_job(
    cluster_dir: Path,
    config: ClusterConfig,
    master: str,
    dry_run: bool = False,
    on_event: Callable[[dict], None] | None = None,
    trigger: str = "manual",
) -> tuple[dict, int]:
    """Run the job once to its end; (result, exit code). The result is recorded in
    runs.jsonl (not for dry runs) and running.json says what runs meanwhile."""
    cfg_path = write_job_config(cluster_dir, config, master)
    runs = job_runs(cluster_dir)
    started = time.time()
    result, code = runs.run_process(
        job_argv(cfg_path, master, dry_run),
        job_env(config),
        {"started": started, "master": master, "trigger": trigger},
        on_event,
        track=not dry_run,
        track_progress=True,
        timeout_s=JOB_TIMEOUT_S,
    )
    if not result:
        result = {"committed": False, "reason": runs.failure_text(code, max_chars=300)}
    if not dry_run:
        runs.finish({"start": started, "trigger": trigger, "exit_code": code, **result})
    return result, code


def append_run(cluster_dir: Path, record: dict) -> None:
    """Add `record` to runs.jsonl (the last MAX_RUNS kept)."""
    job_runs(cluster_dir).finish(record)


def last_runs(cluster_dir: Path, limit: int = 10) -> list[dict]:
    return job_runs(cluster_dir).last_runs(limit)


def load_schedule(cluster_dir: Path) -> Schedule | None:
    path = compaction_dir(cluster_dir) / "schedule.json"
    if not path.exists():
        return None
    try:
        return Schedule.model_validate_json(path.read_text())
    except ValueError:
        return None


def running_job(cluster_dir: Path) -> dict | None:
    return job_runs(cluster_dir).running()
