"""Simulated hosts for e2e tests: Linux network namespaces on a bridge the test creates.

`SimulatedHosts(3)` makes a bridge with an address on the test's side (`gateway`, where an
object store the hosts share can listen) and one namespace per host with its own address on
it; `run(host, argv)` starts a process inside a host's namespace; `partition(host)` takes the
host's link down (nothing reaches it, it reaches nothing), `heal(host)` brings it back.
Everything is removed on exit (processes started in the namespaces are killed first), also
after a failure. Addresses come from a /24 chosen from the test's pid in 10.201.0.0/16, and
traffic only goes to the addresses created here.

`namespaces_unavailable()` says why the machine cannot (not root, no `ip`, no permission):
tests skip with that reason.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

IP_TIMEOUT_S = 10


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["ip", *args], capture_output=True, text=True, timeout=IP_TIMEOUT_S, check=check
    )


def namespaces_unavailable() -> str | None:
    """Why network namespaces cannot be made here, or None."""
    if shutil.which("ip") is None:
        return "the `ip` command (iproute2) is not installed"
    if os.geteuid() != 0:
        return "network namespaces need root (CI runs the e2e tests as root)"
    probe = f"amqp{os.getpid() % 100000}"
    steps = (
        ("netns", "add", probe),
        ("link", "add", f"{probe}b", "type", "bridge"),
        ("link", "add", f"{probe}h", "type", "veth", "peer", "name", f"{probe}n"),
    )
    try:
        for step in steps:
            res = _ip(*step, check=False)
            if res.returncode != 0:
                return f"cannot `ip {' '.join(step[:3])}`: {res.stderr.strip()}"
    finally:
        _ip("link", "del", f"{probe}h", check=False)
        _ip("link", "del", f"{probe}b", check=False)
        _ip("netns", "del", probe, check=False)
    return None


class SimulatedHosts:
    """`count` hosts (network namespaces) on one bridge; a context manager that always cleans
    up. Thread-safety: one test thread drives it."""

    def __init__(self, count: int):
        tag = os.getpid() % 100000
        self.subnet = f"10.201.{os.getpid() % 250 + 1}"
        self.gateway = f"{self.subnet}.1"
        self.bridge = f"amq{tag}b"
        self.hosts = [f"{self.subnet}.{11 + i}" for i in range(count)]
        self._ns = {h: f"amq{tag}n{i}" for i, h in enumerate(self.hosts)}
        self._link = {h: f"amq{tag}h{i}" for i, h in enumerate(self.hosts)}
        self._procs: list[subprocess.Popen] = []

    def __enter__(self) -> SimulatedHosts:
        try:
            _ip("link", "add", self.bridge, "type", "bridge")
            _ip("addr", "add", f"{self.gateway}/24", "dev", self.bridge)
            _ip("link", "set", self.bridge, "up")
            for i, host in enumerate(self.hosts):
                ns, link, inner = self._ns[host], self._link[host], f"amq{i}eth"
                _ip("netns", "add", ns)
                _ip("link", "add", link, "type", "veth", "peer", "name", inner)
                _ip("link", "set", inner, "netns", ns)
                _ip("link", "set", link, "master", self.bridge, "up")
                _ip("-n", ns, "addr", "add", f"{host}/24", "dev", inner)
                _ip("-n", ns, "link", "set", inner, "up")
                _ip("-n", ns, "link", "set", "lo", "up")
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def run(self, host: str, argv: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen:
        """Start `argv` inside `host`'s namespace, output to `log`; killed by `close()`."""
        with open(log, "ab") as out:
            proc = subprocess.Popen(
                ["ip", "netns", "exec", self._ns[host], *argv],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
            )
        self._procs.append(proc)
        return proc

    def exec(self, host: str, argv: list[str], timeout_s: float) -> subprocess.CompletedProcess:
        """Run `argv` inside `host`'s namespace to its end (bounded by `timeout_s`)."""
        return subprocess.run(
            ["ip", "netns", "exec", self._ns[host], *argv],
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )

    def partition(self, host: str) -> None:
        """Cut `host` off: its link down (packets to and from it are dropped)."""
        _ip("link", "set", self._link[host], "down")

    def heal(self, host: str) -> None:
        """Bring `host`'s link back."""
        _ip("link", "set", self._link[host], "up")

    def close(self) -> None:
        """Kill what runs in the namespaces, remove them, their links and the bridge."""
        for proc in self._procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
        for proc in self._procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                pass
        for host, ns in self._ns.items():
            pids = _ip("netns", "pids", ns, check=False).stdout.split()
            for pid in pids:  # started by this test's processes (e.g. a re-exec'd broker)
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass
            if pids:
                time.sleep(0.2)
            _ip("link", "del", self._link[host], check=False)
            _ip("netns", "del", ns, check=False)
        _ip("link", "del", self.bridge, check=False)
