"""The same compaction job on a standalone Spark cluster (master + one worker started from
the pip package's jars, on 127.0.0.1): the code scales out unchanged.

    python benchmarks/compaction_standalone.py [--cores 2] [--seconds 6]

Starts `automqctl cluster up` (2 brokers, 1 controller, uploads every 0.5 s) in a temporary
directory, produces to 8 partitions for `seconds`, starts a Spark master and a worker
(`spark-class org.apache.spark.deploy.{master.Master,worker.Worker}`, REST server and web
UIs off), runs `automqctl compaction run --master spark://127.0.0.1:<port> --format json`,
consumes every record back, and stops everything it started. JSON on stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import pyspark  # noqa: E402

from benchmarks.compaction_bench import automqctl, cluster_down, consume_count, produce  # noqa: E402
from tests.e2e.ledger import create_topic  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spark_process(work: Path, name: str, *args: str) -> subprocess.Popen:
    spark_class = Path(pyspark.__file__).parent / "bin" / "spark-class"
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_LOG_DIR": str(work)}
    log = open(work / f"{name}.log", "wb")  # noqa: SIM115 - closed with the process
    return subprocess.Popen(
        [str(spark_class), *args],
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        cwd=work,
        env=env,
    )


def wait_for(path: Path, needle: str, timeout_s: float = 90) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.exists() and needle in path.read_text(errors="replace"):
            return
        time.sleep(0.5)
    raise SystemExit(f"{path.name}: no {needle!r} within {timeout_s}s")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cores", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=6)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="compaction-standalone-") as tmp:
        work = Path(tmp)
        cdir = work / "cluster"
        procs: list[subprocess.Popen] = []
        try:
            status = automqctl(
                cdir,
                "cluster",
                "up",
                "--brokers",
                "2",
                "--controllers",
                "1",
                "--upload-interval-s",
                "0.5",
            )
            bootstrap = status["bootstrap_servers"]
            topic = f"standalone-{uuid.uuid4().hex[:6]}"
            create_topic(bootstrap, topic, 8)
            count = produce(bootstrap, topic, 4, args.seconds)
            time.sleep(2)
            port = free_port()
            conf = work / "spark.conf"
            conf.write_text("spark.master.rest.enabled false\nspark.ui.enabled false\n")
            procs.append(
                spark_process(
                    work,
                    "master",
                    "org.apache.spark.deploy.master.Master",
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(port),
                    "--webui-port",
                    str(free_port()),
                    "--properties-file",
                    str(conf),
                )
            )
            wait_for(work / "master.log", "New state: ALIVE")
            procs.append(
                spark_process(
                    work,
                    "worker",
                    "org.apache.spark.deploy.worker.Worker",
                    f"spark://127.0.0.1:{port}",
                    "--host",
                    "127.0.0.1",
                    "--cores",
                    str(args.cores),
                    "--memory",
                    "1g",
                    "--webui-port",
                    str(free_port()),
                    "--work-dir",
                    str(work / "work"),
                    "--properties-file",
                    str(conf),
                )
            )
            wait_for(work / "worker.log", "Successfully registered with master")
            result = automqctl(
                cdir,
                "compaction",
                "run",
                "--master",
                f"spark://127.0.0.1:{port}",
                timeout_s=600,
            )
            consumed = consume_count(bootstrap, topic, 8, count)
            print(
                json.dumps(
                    {
                        "master": result["master"],
                        "committed": result["committed"],
                        "objects_before": result["objects_before"],
                        "objects_after": result["objects_after"],
                        "bytes_read": result["bytes_read"],
                        "duration_s": result["duration_s"],
                        "tasks_s": result["tasks_s"],
                        "records_consumed_ok": consumed == count,
                    },
                    indent=2,
                )
            )
        finally:
            for proc in reversed(procs):
                proc.terminate()
                try:
                    proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            cluster_down(cdir)


if __name__ == "__main__":
    main()
