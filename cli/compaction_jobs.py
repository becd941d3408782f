"""Running the Spark compaction job for a local cluster, and its run history (no Spark here).

The job runs as its own process (`python -m spark_jobs.compact`, or `spark-submit`), so the
CLI never imports pyspark; this module writes the job's config (no secrets), hands the
object-store credentials to it through the environment, reads its JSON event lines, and
keeps the history in `<cluster dir>/compaction/`:

    schedule.json   the schedule (`compaction schedule`), read by the scheduler process
    running.json    the run in progress (pid, started, progress), removed when it ends
    runs.jsonl      the last MAX_RUNS results, one JSON object per line
    job.json        the job config; job.log the last run's stderr (Spark's log)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from pydantic import BaseModel, Field

from cli.cluster_config import ClusterConfig
from controlplane.auth import SECRET_ENV
from controlplane.tls import CA_FILE_ENV

MAX_RUNS = 100
JOB_TIMEOUT_S = 3600.0
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
    cdir = compaction_dir(cluster_dir)
    cfg_path = write_job_config(cluster_dir, config, master)
    log_path = cdir / "job.log"
    started = time.time()
    result: dict = {}
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            job_argv(cfg_path, master, dry_run),
            stdout=subprocess.PIPE,
            stderr=log,
            stdin=subprocess.DEVNULL,
            env=job_env(config),
            text=True,
        )
        running = cdir / "running.json"
        state = {"pid": proc.pid, "started": started, "master": master, "trigger": trigger}
        if not dry_run:
            running.write_text(json.dumps(state))
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                try:
                    event = json.loads(line)
                except ValueError:
                    continue
                if event.get("event") == "result":
                    result = event
                elif event.get("event") == "progress" and not dry_run:
                    running.write_text(json.dumps({**state, "progress": event}))
                if on_event is not None:
                    on_event(event)
            code = proc.wait(timeout=JOB_TIMEOUT_S)
        except BaseException:
            proc.kill()
            proc.wait()
            raise
        finally:
            running.unlink(missing_ok=True)
    if not result:
        lines = log_path.read_text(errors="replace").strip().splitlines()
        errors = [ln for ln in lines if ln.startswith("error:")] or lines[-1:] or ["no output"]
        result = {"committed": False, "reason": f"job failed (exit {code}): {errors[-1][:300]}"}
    result = {k: v for k, v in result.items() if k != "event"}
    record = {"start": started, "trigger": trigger, "exit_code": code, **result}
    if not dry_run:
        append_run(cluster_dir, record)
    return result, code


def append_run(cluster_dir: Path, record: dict) -> None:
    path = compaction_dir(cluster_dir) / "runs.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    lines = (lines + [json.dumps(record)])[-MAX_RUNS:]
    path.write_text("\n".join(lines) + "\n")


def last_runs(cluster_dir: Path, limit: int = 10) -> list[dict]:
    path = compaction_dir(cluster_dir) / "runs.jsonl"
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines()[-limit:]:
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


def load_schedule(cluster_dir: Path) -> Schedule | None:
    path = compaction_dir(cluster_dir) / "schedule.json"
    if not path.exists():
        return None
    try:
        return Schedule.model_validate_json(path.read_text())
    except ValueError:
        return None


def running_job(cluster_dir: Path) -> dict | None:
    path = compaction_dir(cluster_dir) / "running.json"
    try:
        state = json.loads(path.read_text())
        os.kill(int(state["pid"]), 0)
    except (OSError, ValueError, KeyError):
        return None
    return state
