"""A local cluster's processes as the operating system shows them: their start times and
command lines in /proc, which component of a cluster each one is, and signalling them.

A PID is only trusted together with its start time (the same process, not a reused PID). A
process of the cluster without a true PID file (started by hand, or whose file went stale)
is still found: its command line points at this directory's config
(`controlplane.server --config DIR/quorum.json --node-id N`,
`dataplane.broker --config DIR/broker-N/broker.json`, `weed mini -dir=DIR/s3/data`), which
/proc shows.
"""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

from cli.cluster_config import COMPACTION_SCHEDULER, FAILOVER_STORE, SUPERVISOR

# after SIGKILL: a process killed in the middle of an fsync can take seconds to go
KILL_WAIT_S = 30.0
_POLL_S = 0.02


def proc_start_time(pid: int) -> str | None:
    """The start time of live process `pid` (clock ticks since boot, as /proc/PID/stat
    says), or None when it is gone or a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    if fields[0] == "Z":
        return None
    return fields[19]  # field 22 of stat: start time in clock ticks since boot


def proc_age_s(pid: int) -> float | None:
    """How long ago live process `pid` started (seconds), or None when it is gone."""
    start = proc_start_time(pid)
    try:
        with open("/proc/uptime") as f:
            uptime_s = float(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    if start is None:
        return None
    return max(0.0, uptime_s - int(start) / os.sysconf("SC_CLK_TCK"))


def _proc_cmdline(pid: int) -> list[str] | None:
    """argv of a live process, or None (gone, a kernel thread, or not readable)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    if not raw:
        return None
    return [a.decode(errors="replace") for a in raw.rstrip(b"\0").split(b"\0")]


def _proc_cwd(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/cwd")
    except OSError:
        return None


def _option(args: list[str], *names: str) -> str | None:
    """The value of the first of `names` in `args`, as `--name value` or `--name=value`."""
    for i, arg in enumerate(args):
        for name in names:
            if arg == name and i + 1 < len(args):
                return args[i + 1]
            if arg.startswith(name + "="):
                return arg[len(name) + 1 :]
    return None


def _script_args(argv: list[str], module: str) -> list[str] | None:
    """The arguments after `-m module` (or after its script path), None if argv runs
    something else."""
    path = "/" + module.replace(".", "/")
    scripts = (path + ".py", path + "/__main__.py")  # a module or a package's main
    for i, arg in enumerate(argv):
        if (
            (arg == module and i > 0 and argv[i - 1] == "-m")
            or arg == "-m" + module
            or arg.endswith(scripts)
        ):
            return argv[i + 1 :]
    return None


def component_of(
    argv: list[str], cwd: str | None, cluster_dir: Path, s3_data_dir: Path | None = None
) -> str | None:
    """The component (`controller-N`, `broker-N`, `s3`) of the cluster in `cluster_dir` that
    the command line `argv` (run in `cwd`) is, or None if it is not one of them."""
    root = os.path.realpath(cluster_dir)

    def resolved(value: str | None) -> str | None:
        if value is None:
            return None
        return os.path.realpath(os.path.join(cwd or "/", value))

    args = _script_args(argv, "controlplane.server")
    if args is not None:
        node_id = _option(args, "--node-id")
        if (
            resolved(_option(args, "--config")) == os.path.join(root, "quorum.json")
            and node_id is not None
            and node_id.strip().isdigit()
        ):
            return f"controller-{int(node_id)}"
        return None
    args = _script_args(argv, "dataplane.broker")
    if args is not None:
        config = resolved(_option(args, "--config"))
        m = re.fullmatch(re.escape(root) + r"/broker-(\d+)/broker\.json", config or "")
        return f"broker-{int(m.group(1))}" if m else None
    args = _script_args(argv, "cli.compaction_scheduler")
    if args is not None:
        return COMPACTION_SCHEDULER if resolved(_option(args, "--dir")) == root else None
    args = _script_args(argv, "cli.supervisor")
    if args is not None:
        return SUPERVISOR if resolved(_option(args, "--dir")) == root else None
    if argv and os.path.basename(argv[0]) == "weed" and "mini" in argv[1:]:
        data = resolved(_option(argv[1:], "-dir", "--dir"))
        want = os.path.realpath(s3_data_dir or os.path.join(root, "s3"))
        if data == os.path.join(want, "data"):
            return "s3"
        failover = os.path.join(os.path.dirname(want), FAILOVER_STORE)
        return FAILOVER_STORE if data == os.path.join(failover, "data") else None
    return None


def scan_processes(cluster_dir: Path, s3_data_dir: Path | None = None) -> dict[str, list[int]]:
    """Every live process (zombies excluded) whose command line is a component of the
    cluster in `cluster_dir`, by component name, from /proc."""
    found: dict[str, list[int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return found
    me = os.getpid()
    for entry in entries:
        if not entry.isdigit() or int(entry) == me:
            continue
        pid = int(entry)
        argv = _proc_cmdline(pid)
        # cheap filter first: only our three programs need their cwd and a real match
        if not argv or not any(
            k in a
            for a in argv
            for k in ("controlplane", "dataplane", "weed", "compaction", "supervisor")
        ):
            continue
        name = component_of(argv, _proc_cwd(pid), cluster_dir, s3_data_dir)
        if name and proc_start_time(pid) is not None:
            found.setdefault(name, []).append(pid)
    return found


def _signal(pid: int, sig: signal.Signals) -> None:
    """Signal the process group when the process leads one (it was started in its own
    session: children go too), otherwise only the process."""
    try:
        if os.getpgid(pid) == pid:
            os.killpg(pid, sig)
        else:
            os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def terminate(
    pids: list[tuple[int, str | None]], timeout_s: float, kill_wait_s: float = KILL_WAIT_S
) -> list[int]:
    """SIGTERM every (pid, start time) at once, SIGKILL whatever is left after `timeout_s`
    (at once when it is 0), and wait at most `kill_wait_s` more. A start time of None means
    "the process using this PID now". Returns the PIDs still alive."""
    known = [(pid, start or proc_start_time(pid)) for pid, start in pids]
    # only ever signal the very processes meant: a PID is checked against its start time
    targets = [(pid, start) for pid, start in known if start is not None]

    def alive() -> list[int]:
        return [pid for pid, start in targets if proc_start_time(pid) == start]

    for sig, wait_s in ((signal.SIGTERM, timeout_s), (signal.SIGKILL, kill_wait_s)):
        if sig == signal.SIGTERM and timeout_s <= 0:
            continue
        for pid in alive():
            _signal(pid, sig)
        deadline = time.monotonic() + wait_s
        while alive() and time.monotonic() < deadline:
            time.sleep(_POLL_S)
        if not alive():
            return []
    return alive()
