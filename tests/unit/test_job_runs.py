"""cli/job_runs.py: the run in progress and the bounded history shared by the compaction
and table sync jobs, with a real child process (a tiny Python script, no Spark)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from cli.job_runs import JobRuns


def test_history_keeps_the_last_max_runs(tmp_path):
    runs = JobRuns(tmp_path / "jobs", max_runs=3)
    for i in range(5):
        runs.finish({"n": i})
    assert [r["n"] for r in runs.last_runs(limit=10)] == [2, 3, 4]
    assert [r["n"] for r in runs.last_runs(limit=2)] == [3, 4]


def test_running_only_while_its_process_lives(tmp_path):
    runs = JobRuns(tmp_path)
    assert runs.running() is None
    runs.start({"pid": os.getpid(), "trigger": "manual"})
    assert runs.is_running() and runs.running()["trigger"] == "manual"
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    runs.start({"pid": dead.pid})
    assert not runs.is_running()
    runs.finish(None)
    assert not runs.running_path.exists() and runs.last_runs() == []


def test_run_process_returns_the_result_event_and_tracks_progress(tmp_path):
    script = (
        "import json\n"
        "print('spark noise')\n"
        "print(json.dumps({'event': 'progress', 'done': 1}))\n"
        "print(json.dumps({'event': 'result', 'committed': True}))\n"
    )
    runs = JobRuns(tmp_path)
    seen: list[tuple[dict, dict | None]] = []  # each event with running.json at that moment
    argv = [sys.executable, "-c", script]
    result, code = runs.run_process(
        argv,
        dict(os.environ),
        {"trigger": "t"},
        lambda e: seen.append((e, json.loads(runs.running_path.read_text()))),
        track_progress=True,
    )
    assert (result, code) == ({"committed": True}, 0)
    assert [e["event"] for e, _ in seen] == ["progress", "result"]
    progress_state = seen[0][1]
    assert progress_state["trigger"] == "t" and progress_state["progress"]["done"] == 1
    assert not runs.running_path.exists()


def test_failure_text_names_the_last_error_line(tmp_path):
    runs = JobRuns(tmp_path)
    script = "import sys; sys.stderr.write('warn: x\\nerror: bucket b1 unreachable\\ntrace\\n'); sys.exit(3)"
    result, code = runs.run_process([sys.executable, "-c", script], dict(os.environ), {})
    assert result == {} and code == 3
    assert runs.failure_text(code) == "job failed (exit 3): error: bucket b1 unreachable"
    assert runs.failure_text(code, max_chars=5) == "job failed (exit 3): error"


def test_bad_bound_is_refused(tmp_path):
    with pytest.raises(ValueError, match="max_runs"):
        JobRuns(tmp_path, max_runs=0)
