"""The compaction job's driver: plan -> write objects on Spark -> one atomic commit.

    python -m spark_jobs.compact --config job.json [--master local[*]] [--dry-run]
    spark-submit --master spark://host:7077 spark_jobs/compact.py --config job.json

`job.json` (JobConfig) names the controllers and the buckets (URIs without secrets);
object-store credentials come from the environment (AWS_ACCESS_KEY_ID /
AWS_SECRET_ACCESS_KEY), which the driver hands to executors as executor environment.
stdout: one JSON line per event (`{"event": "plan"|"progress"|"result", ...}`); the last
line is the result (objects_before, objects_after, bytes_read, bytes_written, duration_s,
master, committed). Spark's logs go to stderr.

The driver registers as compaction principal `compactor_name` (a new epoch, which fences
any earlier driver of the job still running), plans from the controller's metadata
(`spark_jobs.plan`), prepares object ids, runs one Spark task per new object
(`spark_jobs.execute`) and commits everything in ONE `commit_stream_set_object`: the new
objects appear and the old ones are marked destroyed together, or — when the run lost a
race (a stream trimmed or deleted, the sources compacted by another job) — nothing changes
and the new objects are deleted. A killed run leaves only PREPARED ids, which the
controller destroys at their deadline.

Then the log cleaner of compacted topics (`cleanup.policy=compact`, `compact,delete`;
`spark_jobs/compact_topics.py`, JobConfig `log_cleaner`, on by default) rewrites their
partitions' stream objects keeping the latest record per key, in a second atomic commit;
its part of the result is `log_cleaner`. Both stages share one SparkContext.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from pydantic import BaseModel, Field

from controlplane.client import ControllerClient
from controlplane.errors import ControllerError
from controlplane.image import MetadataImage
from controlplane.requests import (
    MAX_OBJECTS_PER_PREPARE,
    CleanerCheckpoint,
    CommitStreamSetObjectRequest,
    CompactorIdentity,
    RegisterCompactorRequest,
    SetCleanerCheckpointsRequest,
)
from dataplane.s3stream.commit import Committer, ObjectCommitter, commit_object_ids
from spark_jobs import objects_io
from spark_jobs.compact_topics import (
    CleanSource,
    CleanTask,
    compacted_streams,
    first_batch_max_timestamp,
    select_clean_tasks,
)
from spark_jobs.log_cleaner import DEFAULT_MAX_MAP_ENTRIES
from spark_jobs.plan import (
    CompactionPlan,
    PlanConfig,
    build_plan,
    committed_object_count,
    paused_reason,
    select_sources,
)

COMPACTION_PREPARED_TTL_MS = 24 * 3600 * 1000  # DESIGN: prepared-object TTL for compaction
SPARK_START_TIMEOUT_S = 120
_BUCKET_KEY_ENV_RE = re.compile(r"^AUTOMQ_S3_(ACCESS|SECRET)_KEY_[0-9]{1,5}$")


class JobConfig(BaseModel):
    """What a run needs to reach the cluster (no secrets: those come from the env)."""

    controllers: list[str] = Field(min_length=1)
    buckets: dict[int, str] = Field(min_length=1)  # bucket id -> URI without credentials
    master: str = "local[*]"
    compactor_name: str = "spark-compaction"
    stream_split_bytes: int = Field(default=8 * 1024 * 1024, ge=1)
    max_objects_per_run: int = Field(default=500, ge=2, le=10_000)
    max_run_bytes: int = Field(default=1024 * 1024 * 1024, ge=1)
    # compacted topics (spark_jobs/compact_topics.py): after the object compaction, the
    # log cleaner rewrites the stream objects of `cleanup.policy=compact` partitions
    log_cleaner: bool = True
    cleaner_max_keys: int = Field(default=DEFAULT_MAX_MAP_ENTRIES, ge=1, le=50_000_000)
    # the ids a run prepares expire after this long if it never commits (a killed driver):
    # the controller then destroys them and deletes what the run had written under them
    prepared_ttl_ms: int = Field(
        default=COMPACTION_PREPARED_TTL_MS, ge=1_000, le=COMPACTION_PREPARED_TTL_MS
    )


Emit = Callable[[dict], None]


def _image(client: ControllerClient) -> MetadataImage:
    raw = client.leader_get("/v1/image")
    return (
        MetadataImage.model_validate_json(raw)
        if isinstance(raw, str)
        else (MetadataImage.model_validate(raw))
    )


def spark_context(
    master: str, app_name: str = "automq-compaction", executor_env: dict[str, str] | None = None
):
    """A SparkContext bound to 127.0.0.1 with the UI off; executors get the object-store
    credentials of this process as executor environment (not on any command line), plus
    `executor_env` (e.g. a cluster directory's bucket keys, `topic_source.spark_session`)."""
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark import SparkConf, SparkContext

    conf = (
        SparkConf()
        .setMaster(master)
        .setAppName(app_name)
        .set("spark.ui.enabled", "false")
        .set("spark.driver.host", "127.0.0.1")
        .set("spark.driver.bindAddress", "127.0.0.1")
        .set("spark.sql.shuffle.partitions", "2")
        .set("spark.task.maxFailures", "2")
        .set("spark.python.worker.reuse", "true")
    )
    names = ["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "PYTHONPATH"]
    # each bucket's own keys (a failover bucket at another provider)
    names += sorted(n for n in os.environ if _BUCKET_KEY_ENV_RE.match(n))
    for name in names:
        if os.environ.get(name):
            conf.set(f"spark.executorEnv.{name}", os.environ[name])
    for name, value in (executor_env or {}).items():
        conf.set(f"spark.executorEnv.{name}", value)
    sc = SparkContext.getOrCreate(conf)
    sc.setLogLevel("WARN")
    return sc


class _Spark:
    """The run's SparkContext: the caller's, or one started on first use and stopped by
    `stop` (both stages of a run share it: Spark's start-up is the slow part)."""

    def __init__(self, master: str, emit: Emit, sc=None) -> None:
        self._master = master
        self._emit = emit
        self._sc = sc
        self._own = False

    def get(self):
        if self._sc is None:
            started = time.monotonic()
            self._sc = spark_context(self._master)
            self._own = True
            self._emit({"event": "spark_started", "seconds": round(time.monotonic() - started, 3)})
        return self._sc

    def stop(self) -> None:
        if self._own and self._sc is not None:
            self._sc.stop()
            self._sc = None


def run(config: JobConfig, dry_run: bool = False, emit: Emit | None = None, sc=None) -> dict:
    """One compaction run — the object compaction, then the log cleaner of compacted
    topics; the result dict (see the module docstring; `log_cleaner`: the cleaner's part).
    `sc`: an existing SparkContext to use (tests share one); otherwise one is started for
    `config.master` when a stage needs it."""
    emit = emit or (lambda event: None)
    started = time.monotonic()
    spark = _Spark(config.master, emit, sc)
    try:
        result = _compact_objects(config, dry_run, emit, spark)
        # the cleaner plans from a fresh image and checks pauses and buckets itself, so it
        # runs even when the object stage had nothing to do or lost a race
        if config.log_cleaner:
            result["log_cleaner"] = clean_compacted_topics(config, dry_run, emit, spark)
    finally:
        spark.stop()
    result["duration_s"] = round(time.monotonic() - started, 3)
    emit({"event": "result", **result})
    return result


def _finished(out: dict, started: float, reason: str = "") -> dict:
    """A stage's result, with why it stopped (`reason`, "" when it committed) and its time."""
    out["reason"] = reason
    out["duration_s"] = round(time.monotonic() - started, 3)
    return out


def _object_committer(client: ControllerClient) -> ObjectCommitter:
    """The uploader's prepare and commit steps, for this driver: a commit whose answer was
    lost is checked against the controller's image."""
    return ObjectCommitter(client, read_image=lambda: _image(client))


def _register_compactor(client: ControllerClient, name: str) -> CompactorIdentity:
    """Register as compaction principal `name`: a new epoch, which fences earlier drivers."""
    epoch = client.register_compactor(
        RegisterCompactorRequest(name=name, incarnation_id=uuid.uuid4().hex)
    ).epoch
    return CompactorIdentity(name=name, epoch=epoch)


def _commit_or_delete(
    commits: ObjectCommitter, commit: CommitStreamSetObjectRequest, buckets: dict[int, str]
) -> str:
    """Commit the run's objects; "" when committed (also when an attempt whose answer was
    lost had been applied), else why not — then nothing references the new objects and
    they are deleted now (their PREPARED ids expire at the deadline anyway)."""
    try:
        commits.commit(commit)
    except ControllerError as exc:
        objects_io.delete(buckets[commit.bucket_id], commit_object_ids(commit))
        return f"commit refused ({exc.code.value}): {exc.message}"
    return ""


def _object_stage_result(image: MetadataImage, master: str, dry_run: bool) -> dict:
    """The object stage's result before anything happened."""
    return {
        "objects_before": committed_object_count(image),
        "objects_after": committed_object_count(image),
        "bytes_read": 0,
        "bytes_written": 0,
        "duration_s": 0.0,
        "master": master,
        "committed": False,
        "dry_run": dry_run,
        "reason": "",
        "plan": {},
        "new_object_ids": [],
        "spark_s": 0.0,
        "tasks_s": 0.0,
    }


def _plan_objects(config: JobConfig, image: MetadataImage) -> CompactionPlan | str:
    """The object stage's plan from `image` and the sources' indexes, or why there is none
    (a source in a bucket the job has no URI for)."""
    pcfg = PlanConfig(
        stream_split_bytes=config.stream_split_bytes,
        max_objects_per_run=config.max_objects_per_run,
        max_run_bytes=config.max_run_bytes,
        # compacted partitions leave stream-set objects: the cleaner rewrites stream objects
        split_stream_ids=frozenset(compacted_streams(image)) if config.log_cleaner else frozenset(),
    )
    sources = select_sources(image, pcfg)
    missing = {s.bucket_id for s in sources} - set(config.buckets)
    if missing:
        return f"buckets {sorted(missing)} are not configured for the job"
    indexes = objects_io.read_indexes(
        config.buckets, [(s.object_id, s.bucket_id, s.size_bytes) for s in sources]
    )
    return build_plan(image, sources, indexes, pcfg, now_ms=int(time.time() * 1000))


def _write_objects(
    config: JobConfig, plan: CompactionPlan, bucket_id: int, emit: Emit, spark: _Spark, result: dict
) -> list[dict]:
    """Write the plan's new objects on Spark (their descriptors); the Spark time, the
    executors' busy time and the bytes go into `result`. A failure deletes what was
    written: nothing references it."""
    write_started = time.monotonic()
    try:
        written = _write_on_spark(config, plan, bucket_id, emit, spark.get()) if plan.tasks else []
    except BaseException:
        # nothing references them: delete what was written (missing keys are fine); a
        # killed driver leaves them to the controller's deadline for PREPARED ids
        objects_io.delete(config.buckets[bucket_id], result["new_object_ids"])
        raise
    # the Spark part: executor start-up (a new context) + reading, writing, putting objects
    result["spark_s"] = round(time.monotonic() - write_started, 3)
    # the executors' busy time (sum over tasks): reading, decoding, writing, putting
    result["tasks_s"] = round(sum(d["task_s"] for d in written), 3)
    result["bytes_read"] = sum(d["bytes_read"] for d in written)
    result["bytes_written"] = sum(d["size_bytes"] for d in written)
    return written


def _compact_objects(config: JobConfig, dry_run: bool, emit: Emit, spark: _Spark) -> dict:
    """The object compaction stage (the result without its final event)."""
    started = time.monotonic()
    client = ControllerClient(config.controllers, timeout_s=30.0)
    image = _image(client)
    result = _object_stage_result(image, config.master, dry_run)
    paused = paused_reason(image)
    if paused:
        return _finished(result, started, f"paused: {paused}")
    plan = _plan_objects(config, image)
    if isinstance(plan, str):
        return _finished(result, started, plan)
    result["plan"] = plan.summary()
    emit({"event": "plan", **plan.summary()})
    if plan.empty:
        return _finished(result, started, "nothing to compact")
    # this run's effect on the image it planned from
    objects_after = result["objects_before"] - len(plan.compacted_object_ids) + len(plan.tasks)
    if dry_run:
        result["objects_after"] = objects_after
        return _finished(result, started, "dry run: nothing changed")

    ident = _register_compactor(client, config.compactor_name)
    commits = _object_committer(client)
    bucket_id = 0
    if plan.tasks:
        prepared = commits.prepare(
            Committer(compactor=ident), len(plan.tasks), config.prepared_ttl_ms
        )
        bucket_id = prepared.bucket_id
        if bucket_id not in config.buckets:
            reason = f"the active bucket {bucket_id} is not configured for the job"
            return _finished(result, started, reason)
        for i, task in enumerate(plan.tasks):
            task.object_id = prepared.first_object_id + i
    result["new_object_ids"] = [t.object_id for t in plan.tasks]
    written = _write_objects(config, plan, bucket_id, emit, spark, result)
    gone = sorted({d["source_gone"] for d in written if "source_gone" in d})
    if gone:  # a lost race, as a refused commit is: nothing references the new objects
        objects_io.delete(config.buckets[bucket_id], result["new_object_ids"])
        reason = (
            f"commit refused (STALE_PLAN): source objects {gone} were deleted since the "
            "plan (their streams deleted, or compacted by another run)"
        )
        return _finished(result, started, reason)
    commit = compaction_commit_request(ident, plan, written, bucket_id)
    refused = _commit_or_delete(commits, commit, config.buckets)
    if refused:
        return _finished(result, started, refused)
    result["committed"] = True
    # (brokers may have uploaded meanwhile: objects_now counts those too)
    result["objects_after"] = objects_after
    result["objects_now"] = committed_object_count(_image(client))
    return _finished(result, started)


def _clean_stage_result() -> dict:
    """The cleaner stage's result before anything happened."""
    return {
        "committed": False,
        "reason": "",
        "partitions": 0,
        "objects_considered": 0,
        "rewritten_objects": 0,
        "removed_records": 0,
        "bytes_read": 0,
        "bytes_written": 0,
        "new_object_ids": [],
        "partition_results": [],
    }


def _select_clean_tasks(
    config: JobConfig, image: MetadataImage, now_ms: int, out: dict
) -> tuple[list[CleanTask], list[CleanTask]]:
    """The compacted partitions this run cleans, and those skipped (with their reasons in
    `out`)."""

    def first_dirty_timestamp_ms(task: CleanTask, source: CleanSource) -> int | None:
        if source.bucket_id not in config.buckets:
            return None
        return first_batch_max_timestamp(task, source, config.buckets[source.bucket_id])

    skipped: list[CleanTask] = []
    tasks = select_clean_tasks(
        image,
        config.max_run_bytes,
        min(config.max_objects_per_run, MAX_OBJECTS_PER_PREPARE),
        now_ms,
        first_dirty_timestamp_ms,
        skipped,
    )
    out["skipped_partitions"] = [
        {"topic": t.topic, "partition": t.partition, "reason": t.decision.reason}
        for t in skipped
        if t.decision is not None
    ]
    out["partitions"] = len(tasks)
    out["objects_considered"] = sum(len(t.sources) for t in tasks)
    return tasks, skipped


def _survey_on_spark(
    sc, tasks: list[CleanTask], buckets: dict[int, str], now_ms: int, max_keys: int, out: dict
) -> list[dict]:
    """Survey every task's partition on Spark (no writes); bytes read and each partition's
    result go into `out`."""
    from spark_jobs.compact_topics import survey_stream

    surveys = (
        sc.parallelize(tasks, len(tasks))
        .map(lambda t: survey_stream(t, buckets, now_ms, max_keys))
        .collect()
    )
    out["bytes_read"] = sum(s["bytes_read"] for s in surveys)
    out["partition_results"] = [
        {
            k: s[k]
            for k in (
                "topic",
                "partition",
                "cleanable_objects",
                "keys",
                "removable_records",
                "stopped",
                "cleaned_offset",
            )
        }
        | {"reason": t.decision.reason if t.decision else ""}
        for s, t in zip(surveys, tasks, strict=True)
    ]
    return surveys


def _new_checkpoints(tasks: list[CleanTask], surveys: list[dict]) -> list[CleanerCheckpoint]:
    """The checkpoints the surveys move forward (or whose partitions are rewritten)."""
    previous = {t.stream_id: t.cleaned_offset for t in tasks}
    return [
        CleanerCheckpoint(stream_id=s["stream_id"], cleaned_offset=s["cleaned_offset"])
        for s in surveys
        if s["cleaned_offset"] > previous[s["stream_id"]] or s["rewrite"]
    ]


def _assign_new_object_ids(
    tasks: list[CleanTask], rewrite: dict[int, list[int]], first_object_id: int
) -> tuple[list[CleanTask], list[int]]:
    """Give each object to rewrite a prepared id (consecutive from `first_object_id`): the
    tasks with something to rewrite, and all the ids given."""
    next_id = first_object_id
    todo = [t for t in tasks if t.stream_id in rewrite]
    for task in todo:
        for source_id in rewrite[task.stream_id]:
            task.new_object_ids[source_id] = next_id
            next_id += 1
    return todo, list(range(first_object_id, next_id))


def _rewrite_on_spark(
    sc,
    todo: list[CleanTask],
    buckets: dict[int, str],
    bucket_id: int,
    now_ms: int,
    max_keys: int,
    all_ids: list[int],
) -> list[dict]:
    """Rewrite the surveyed objects on Spark (one task per partition); a failure deletes
    every id given: nothing references them."""
    from spark_jobs.compact_topics import clean_stream

    try:
        return (
            sc.parallelize(todo, len(todo))
            .map(lambda t: clean_stream(t, buckets, bucket_id, now_ms, max_keys))
            .collect()
        )
    except BaseException:
        objects_io.delete(buckets[bucket_id], all_ids)  # unreferenced: delete
        raise


def clean_compacted_topics(config: JobConfig, dry_run: bool, emit: Emit, spark: _Spark) -> dict:
    """The log-cleaner stage (spark_jobs/compact_topics.py): one Spark task per compacted
    partition, every rewritten stream object committed in ONE compaction commit that
    replaces the old ones (or nothing changes)."""
    started = time.monotonic()
    out = _clean_stage_result()
    client = ControllerClient(config.controllers, timeout_s=30.0)
    image = _image(client)
    paused = paused_reason(image)
    if paused:
        return _finished(out, started, f"paused: {paused}")
    now_ms = int(time.time() * 1000)
    tasks, skipped = _select_clean_tasks(config, image, now_ms, out)
    emit({"event": "clean_plan", "partitions": len(tasks), "objects": out["objects_considered"]})
    if not tasks:
        if skipped:
            reason = "no compacted partition is due (skipped_partitions says why)"
            return _finished(out, started, reason)
        return _finished(out, started, "no compacted partition has data in stream objects")
    missing = {s.bucket_id for t in tasks for s in t.sources} - set(config.buckets)
    if missing:
        return _finished(out, started, f"buckets {sorted(missing)} are not configured for the job")
    buckets = dict(config.buckets)
    max_keys = config.cleaner_max_keys
    sc = spark.get()
    surveys = _survey_on_spark(sc, tasks, buckets, now_ms, max_keys, out)
    rewrite = {s["stream_id"]: s["rewrite"] for s in surveys if s["rewrite"]}
    count = sum(len(ids) for ids in rewrite.values())
    emit({"event": "clean_survey", "partitions": len(rewrite), "objects": count})
    checkpoints = _new_checkpoints(tasks, surveys)
    if dry_run:
        return _finished(out, started, "dry run: nothing changed")
    if not rewrite and not checkpoints:
        return _finished(out, started, "nothing to remove")
    ident = _register_compactor(client, config.compactor_name)
    if not rewrite:
        _record_checkpoints(client, ident, checkpoints, out)
        return _finished(out, started, "nothing to remove")
    commits = _object_committer(client)
    prepared = commits.prepare(Committer(compactor=ident), count, config.prepared_ttl_ms)
    bucket_id = prepared.bucket_id
    if bucket_id not in config.buckets:
        reason = f"the active bucket {bucket_id} is not configured for the job"
        return _finished(out, started, reason)
    todo, all_ids = _assign_new_object_ids(tasks, rewrite, prepared.first_object_id)
    cleaned = _rewrite_on_spark(sc, todo, buckets, bucket_id, now_ms, max_keys, all_ids)
    new = [d for part in cleaned for d in part["new"]]
    out["bytes_read"] += sum(part["bytes_read"] for part in cleaned)
    out["bytes_written"] = sum(d["size_bytes"] for d in new)
    out["removed_records"] = sum(d["removed_records"] for d in new)
    out["new_object_ids"] = [d["object_id"] for d in new]
    commit = cleaner_commit_request(ident, new, bucket_id)
    refused = _commit_or_delete(commits, commit, config.buckets)
    if refused:
        return _finished(out, started, refused)
    out["committed"] = True
    out["rewritten_objects"] = len(new)
    _record_checkpoints(client, ident, checkpoints, out)
    return _finished(out, started)


def _record_checkpoints(
    client: ControllerClient,
    ident: CompactorIdentity,
    checkpoints: list[CleanerCheckpoint],
    out: dict,
) -> None:
    """Record the run's cleaner checkpoints (after its commit: a refused commit records
    none). A failure is reported, not raised: the next run maps those objects again."""
    out["checkpoints"] = {c.stream_id: c.cleaned_offset for c in checkpoints}
    if not checkpoints:
        return
    try:
        client.set_cleaner_checkpoints(
            SetCleanerCheckpointsRequest(compactor=ident, checkpoints=checkpoints)
        )
    except ControllerError as exc:
        out["checkpoint_error"] = f"{exc.code.value}: {exc.message}"


def cleaner_commit_request(
    ident: CompactorIdentity, new: list[dict], bucket_id: int
) -> CommitStreamSetObjectRequest:
    """The cleaner's one commit: its rewritten stream objects replace the old ones
    (`new`: the descriptors of `compact_topics.clean_stream`)."""
    return CommitStreamSetObjectRequest(
        compactor=ident,
        object_id=-1,
        order_id=0,
        size_bytes=0,
        bucket_id=bucket_id,
        stream_ranges=[],
        stream_objects=[
            {
                "object_id": d["object_id"],
                "stream_id": d["stream_id"],
                "stream_epoch": 0,
                "start_offset": d["start_offset"],
                "end_offset": d["end_offset"],
                "size_bytes": d["size_bytes"],
            }
            for d in new
        ],
        compacted_object_ids=sorted(d["replaces"] for d in new),
    )


def compaction_commit_request(
    ident: CompactorIdentity, plan: CompactionPlan, written: list[dict], bucket_id: int
) -> CommitStreamSetObjectRequest:
    """The object stage's one commit: the new objects (`written`: the descriptors of
    `execute.write_object`) replace the plan's compacted objects."""
    sso = next((d for d in written if d["kind"] == "sso"), None)
    return CommitStreamSetObjectRequest(
        compactor=ident,
        object_id=sso["object_id"] if sso else -1,
        order_id=plan.order_id,
        size_bytes=sso["size_bytes"] if sso else 0,
        bucket_id=bucket_id,
        stream_ranges=[
            {"stream_id": sid, "stream_epoch": 0, "start_offset": s, "end_offset": e}
            for sid, s, e in (sso["ranges"] if sso else [])
        ],
        stream_objects=[
            {
                "object_id": d["object_id"],
                "stream_id": d["ranges"][0][0],
                "stream_epoch": 0,
                "start_offset": d["ranges"][0][1],
                "end_offset": d["ranges"][0][2],
                "size_bytes": d["size_bytes"],
            }
            for d in written
            if d["kind"] == "so"
        ],
        compacted_object_ids=plan.compacted_object_ids,
    )


def _write_on_spark(
    config: JobConfig, plan: CompactionPlan, bucket_id: int, emit: Emit, sc
) -> list[dict]:
    """One Spark task per new object; progress events while they run."""
    from spark_jobs.execute import write_object

    buckets = dict(config.buckets)
    source_buckets = {oid: s.bucket_id for oid, s in plan.sources.items()}
    total = len(plan.tasks)
    done = threading.Event()

    def progress() -> None:
        tracker = sc.statusTracker()
        while not done.wait(0.5):
            completed = 0
            for stage_id in tracker.getActiveStageIds():
                info = tracker.getStageInfo(stage_id)
                if info is not None:
                    completed += info.numCompletedTasks
            emit({"event": "progress", "done": completed, "total": total})

    watcher = threading.Thread(target=progress, daemon=True)
    watcher.start()
    try:
        rdd = sc.parallelize(plan.tasks, total)
        written = rdd.map(
            lambda task: write_object(task, buckets, source_buckets, bucket_id)
        ).collect()
    finally:
        done.set()
        watcher.join(timeout=5)
    emit({"event": "progress", "done": total, "total": total})
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="AutoMQ-style object compaction on Spark")
    parser.add_argument("--config", required=True, help="job config JSON (JobConfig)")
    parser.add_argument("--master", help="Spark master (default: the config's, local[*])")
    parser.add_argument("--dry-run", action="store_true", help="plan only; change nothing")
    args = parser.parse_args(argv)
    try:
        config = JobConfig.model_validate_json(Path(args.config).read_text())
    except (OSError, ValueError) as exc:
        print(f"error: bad job config {args.config}: {str(exc).splitlines()[0]}", file=sys.stderr)
        return 1
    if args.master:
        config.master = args.master

    def emit(event: dict) -> None:
        print(json.dumps(event), flush=True)

    try:
        result = run(config, dry_run=args.dry_run, emit=emit)
    except ControllerError as exc:
        print(f"error: controller: {exc.message}", file=sys.stderr)
        return 1
    except Exception as exc:  # one line for the operator; Spark's log is above on stderr
        print(f"error: {type(exc).__name__}: {str(exc).splitlines()[0][:300]}", file=sys.stderr)
        return 1
    # a refused commit (a lost race) is a failed run; "nothing to do" and pauses are not
    cleaner = result.get("log_cleaner") or {}
    refused = result["reason"].startswith("commit refused") or cleaner.get("reason", "").startswith(
        "commit refused"
    )
    return 2 if refused else 0


if __name__ == "__main__":
    sys.exit(main())
