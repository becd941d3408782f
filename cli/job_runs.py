"""A job process's run and its history in one directory (no Spark here).

Compaction (`cli/compaction_jobs.py`) and the table topics' sync (`cli/table_jobs.py`) run
their Spark job as a child process that prints JSON event lines on stdout and Spark's log
on stderr; both keep, in their own directory:

    running.json    the run in progress (pid, started, trigger, ...), removed when it ends
    runs.jsonl      the last `max_runs` results, one JSON object per line
    job.log         the last run's stderr (Spark's log)

`JobRuns(directory)` owns those files. Safety: files are replaced atomically (a temporary
file then `os.replace`), so a reader in another process (`cluster status`) sees a whole
file or the previous one; appends to runs.jsonl hold an exclusive `flock` on runs.lock, so
two processes appending at once lose no record. One run at a time per directory is the
callers' rule (they check `running()` first); an instance holds no state of its own
beyond its paths, so threads may share it.
"""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
from collections.abc import Callable
from pathlib import Path

MAX_RUNS = 100
JOB_TIMEOUT_S = 3600.0
MAX_ERROR_CHARS = 500


class JobRuns:
    """The run in progress and the last runs of one kind of job, in `directory`."""

    def __init__(self, directory: Path, max_runs: int = MAX_RUNS) -> None:
        if max_runs < 1:
            raise ValueError(f"max_runs must be at least 1, got {max_runs}")
        self.directory = Path(directory)
        self.max_runs = max_runs
        self.running_path = self.directory / "running.json"
        self.runs_path = self.directory / "runs.jsonl"
        self.log_path = self.directory / "job.log"

    def running(self) -> dict | None:
        """The state in running.json when its process still lives; None otherwise."""
        try:
            state = json.loads(self.running_path.read_text())
            os.kill(int(state["pid"]), 0)
        except (OSError, ValueError, KeyError, TypeError):
            return None
        return state

    def is_running(self) -> bool:
        return self.running() is not None

    def start(self, state: dict) -> None:
        """Record the run in progress (`state` holds at least its `pid`); also called
        again with progress."""
        self._replace(self.running_path, json.dumps(state))

    def finish(self, record: dict | None) -> None:
        """The run ended: running.json removed; `record` (None: not kept) appended to
        runs.jsonl, which keeps the last `max_runs`."""
        self.running_path.unlink(missing_ok=True)
        if record is None:
            return
        self.directory.mkdir(parents=True, exist_ok=True)
        with open(self.directory / "runs.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            lines = self.runs_path.read_text().splitlines() if self.runs_path.exists() else []
            lines = (lines + [json.dumps(record)])[-self.max_runs :]
            self._replace(self.runs_path, "\n".join(lines) + "\n")

    def last_runs(self, limit: int = 10) -> list[dict]:
        """The last `limit` records, oldest first (unreadable lines skipped)."""
        if not self.runs_path.exists():
            return []
        out = []
        for line in self.runs_path.read_text().splitlines()[-limit:]:
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
        return out

    def failure_text(self, code: int, max_chars: int = MAX_ERROR_CHARS) -> str:
        """`job failed (exit N): <line>`: the log's last `error:` line, else its last line."""
        lines = self.log_path.read_text(errors="replace").strip().splitlines()
        errors = [ln for ln in lines if ln.startswith("error:")] or lines[-1:] or ["no output"]
        return f"job failed (exit {code}): {errors[-1][:max_chars]}"

    def run_process(
        self,
        argv: list[str],
        env: dict[str, str],
        state: dict,
        on_event: Callable[[dict], None] | None = None,
        track: bool = True,
        track_progress: bool = False,
        timeout_s: float = JOB_TIMEOUT_S,
    ) -> tuple[dict, int]:
        """Run `argv` to its end, stderr to job.log: (its `result` event without the
        `event` key, {} when none; exit code). With `track`, running.json holds `state`
        and the pid meanwhile (with `track_progress`, also the last `progress` event);
        every event goes to `on_event`. The process is killed if this is interrupted.
        The caller records the run with `finish`."""
        self.directory.mkdir(parents=True, exist_ok=True)
        result: dict = {}
        with open(self.log_path, "wb") as log:
            proc = subprocess.Popen(
                argv,
                stdout=subprocess.PIPE,
                stderr=log,
                stdin=subprocess.DEVNULL,
                env=env,
                text=True,
            )
            state = {"pid": proc.pid, **state}
            try:
                if track:
                    self.start(state)
                assert proc.stdout is not None
                for line in proc.stdout:
                    try:
                        event = json.loads(line)
                    except ValueError:
                        continue
                    if not isinstance(event, dict):
                        continue
                    if event.get("event") == "result":
                        result = {k: v for k, v in event.items() if k != "event"}
                    elif event.get("event") == "progress" and track and track_progress:
                        self.start({**state, "progress": event})
                    if on_event is not None:
                        on_event(event)
                code = proc.wait(timeout=timeout_s)
            except BaseException:
                proc.kill()
                proc.wait()
                raise
            finally:
                if track:
                    self.running_path.unlink(missing_ok=True)
        return result, code

    @staticmethod
    def _replace(path: Path, text: str) -> None:
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(text)
        os.replace(tmp, path)
