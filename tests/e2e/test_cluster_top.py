"""`automqctl cluster top` against a real cluster: `--once --format json` under a produce
load, the brokers' real /metrics against the Grafana dashboard's queries, and the live view
in a real terminal (tmux): its figures move under `automqctl perf`, q quits and the
terminal's mode is restored."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

confluent_kafka = pytest.importorskip("confluent_kafka")
from confluent_kafka import Consumer, Producer  # noqa: E402

from tests.support.ledger import automqctl, create_topic, running_cluster  # noqa: E402
from tests.unit.test_grafana_dashboard import (  # noqa: E402
    DASHBOARD,
    dashboard_queries,
    queried_names,
)

ROOT = Path(__file__).resolve().parents[2]
HEADER_RATE = re.compile(r"produce (\d+\.\d+) MB/s")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with running_cluster(tmp_path_factory.mktemp("top") / "cluster") as status:
        yield {"dir": Path(status["cluster_dir"]), "status": status}


class ProduceLoad:
    """A producer sending 10 KB records to `topic` as fast as it is answered, and a
    consumer group committing what it read, on threads until `stop()`."""

    def __init__(self, bootstrap: str, topic: str, group: str):
        self.bootstrap, self.topic, self.group = bootstrap, topic, group
        self.stopped = threading.Event()
        self.acked = 0
        self.threads = [
            threading.Thread(target=self._produce, daemon=True),
            threading.Thread(target=self._consume, daemon=True),
        ]

    def __enter__(self) -> ProduceLoad:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stopped.set()
        for t in self.threads:
            t.join(30)

    def _produce(self) -> None:
        producer = Producer(
            {
                "bootstrap.servers": self.bootstrap,
                "linger.ms": 5,
                "queue.buffering.max.kbytes": 4096,  # what is left at the end flushes fast
            }
        )

        def acked(err, _msg) -> None:
            if err is None:
                self.acked += 1

        value = os.urandom(10_000)
        while not self.stopped.is_set():
            try:
                producer.produce(self.topic, value, on_delivery=acked)
            except BufferError:
                producer.poll(0.05)
            producer.poll(0)
        producer.flush(30)

    def _consume(self) -> None:
        consumer = Consumer(
            {
                "bootstrap.servers": self.bootstrap,
                "group.id": self.group,
                "auto.offset.reset": "earliest",
                "auto.commit.interval.ms": 500,
            }
        )
        consumer.subscribe([self.topic])
        try:
            while not self.stopped.is_set():
                consumer.consume(100, 0.2)
        finally:
            consumer.close()


def test_once_json_shows_the_topics_produce_rate_and_group_lag(cluster):
    bootstrap = cluster["status"]["bootstrap_servers"]
    topic, group = f"top-{uuid.uuid4().hex[:6]}", f"top-group-{uuid.uuid4().hex[:6]}"
    create_topic(bootstrap, topic, 3)
    with ProduceLoad(bootstrap, topic, group) as load:
        deadline = time.monotonic() + 30
        while load.acked < 50 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert load.acked >= 50, "the load did not start"
        res = automqctl(
            "cluster", "top", "--once", "--format", "json", "--interval-s", "2",
            cluster_dir=cluster["dir"], timeout_s=60,
        )  # fmt: skip
        metrics_page = _scrape_metrics(cluster["status"])
    assert res.returncode == 0, res.stderr + res.stdout
    doc = json.loads(res.stdout)
    assert doc["failover_mode"] == "normal" and doc["state"] == "healthy"
    assert doc["active_bucket"]["bucket_id"] == 0
    assert doc["interval_s"] == 2.0
    [row] = [t for t in doc["topics"] if t["topic"] == topic]
    assert row["in_mb_s"] > 0.01, row
    assert doc["produce_mb_s"] >= row["in_mb_s"] * 0.99
    assert sum(b["produce_mb_s"] for b in doc["brokers"]) > 0.01
    # the leaders of the topic's 3 partitions, the produce p99, the connections
    assert sum(b["partitions_led"] for b in doc["brokers"]) >= 3
    assert any(b["produce_p99_ms"] for b in doc["brokers"])
    assert all(b["connections"] >= 1 for b in doc["brokers"])
    assert all(0 <= b["wal_fill"] < 1 and b["upload_errors"] == 0 for b in doc["brokers"])
    assert group in row["group_lag"] and doc["group_lag_error"] is None

    # a real broker's /metrics has every metric the dashboard queries
    names = queried_names(dashboard_queries(json.loads(DASHBOARD.read_text())))
    missing = {name for name in names if not re.search(rf"^{name}[{{ ]", metrics_page, re.M)}
    assert not missing, f"the dashboard queries metrics a broker does not export: {missing}"


def _scrape_metrics(status: dict) -> str:
    """The /metrics pages of every broker, one after the other."""
    pages = []
    for b in status["brokers"]:
        with urllib.request.urlopen(f"http://{b['metrics_address']}/metrics", timeout=5) as r:
            pages.append(r.read().decode())
    return "\n".join(pages)


class TmuxPane:
    """A detached tmux session of its own (a real terminal, 200x50) running a shell."""

    def __init__(self, name: str):
        self.name = name
        subprocess.run(
            ["tmux", "-L", name, "new-session", "-d", "-s", name, "-x", "200", "-y", "50",
             "bash --norc --noprofile"],
            check=True, timeout=10,
        )  # fmt: skip

    def type(self, *keys: str) -> None:
        subprocess.run(["tmux", "-L", self.name, "send-keys", "-t", self.name, *keys], check=True)

    def text(self) -> str:
        return subprocess.run(
            ["tmux", "-L", self.name, "capture-pane", "-p", "-t", self.name],
            capture_output=True, text=True, check=True, timeout=10,
        ).stdout  # fmt: skip

    def wait_for(self, predicate, timeout_s: float, what: str) -> str:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            text = self.text()
            if predicate(text):
                return text
            time.sleep(0.3)
        raise AssertionError(f"{what} within {timeout_s:g} s; the pane:\n{self.text()}")

    def kill(self) -> None:
        subprocess.run(["tmux", "-L", self.name, "kill-server"], capture_output=True, timeout=10)


def _whole_frame(text: str) -> bool:
    """The pane holds a whole frame: its footer, the frame's last line, is drawn (tmux may be
    read while a frame is still being written)."""
    return "q or Ctrl-C quits" in text


def _produce_rate(text: str) -> float | None:
    match = HEADER_RATE.search(text)
    return None if match is None else float(match.group(1))


@pytest.mark.skipif(
    shutil.which("tmux") is None, reason="tmux not installed (tests/run.sh installs it)"
)
def test_live_view_in_a_terminal_moves_under_perf_and_quits_on_q(cluster, tmp_path):
    pane = TmuxPane(f"automq-top-{uuid.uuid4().hex[:8]}")
    stty_after = tmp_path / "stty.txt"
    perf = None
    try:
        command = " ".join(
            [
                f"cd {shlex.quote(str(ROOT))} &&",
                f"PYTHONPATH={shlex.quote(os.environ.get('PYTHONPATH', str(ROOT)))}",
                shlex.quote(sys.executable), "-m cli.main cluster top --interval-s 1",
                f"--dir {shlex.quote(str(cluster['dir']))};",
                # written aside and renamed: the file appears only with stty's whole output
                # (`> file` creates it empty first; a busy machine read it in between)
                f"echo TOP_EXIT=$?; stty -a > {shlex.quote(str(stty_after))}.tmp",
                f"&& mv {shlex.quote(str(stty_after))}.tmp {shlex.quote(str(stty_after))}",
            ]
        )  # fmt: skip
        pane.type(command, "Enter")
        # judged on whole frames, each figure in the predicate: tmux may capture a frame
        # half drawn over the one before it
        pane.wait_for(
            lambda t: (
                _whole_frame(t)
                and "brokers (" in t
                and "failover mode: normal" in t
                and _produce_rate(t) is not None
            ),
            30,
            "the view drew a whole frame with the failover mode",
        )
        perf = subprocess.Popen(
            [sys.executable, "-m", "cli.main", "perf", "--dir", str(cluster["dir"]),
             "--duration", "20", "--send-rate", "2000", "--record-size", "1024"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        pane.wait_for(
            lambda t: (
                _whole_frame(t)
                and (_produce_rate(t) or 0) > 0.1
                and re.search(r"perf-\w+-0 ", t) is not None
            ),
            40,
            "produce MB/s moved under perf, its topic listed",
        )
        pane.type("q")
        exited = re.compile(r"^TOP_EXIT=(\d+)", re.M)  # the echo's output, not the command
        done = pane.wait_for(lambda t: exited.search(t) is not None, 15, "q quit the view")
        assert exited.search(done).group(1) == "0"
        assert "q or Ctrl-C quits" not in done  # the alternate screen was left
        deadline = time.monotonic() + 10
        while not stty_after.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        modes = stty_after.read_text().split()
        assert "icanon" in modes and "echo" in modes, "the terminal's mode was restored"
    finally:
        pane.kill()
        if perf is not None:
            perf.terminate()
            perf.wait(30)
