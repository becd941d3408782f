"""A network namespace of its own for each pytest-xdist worker of a parallel run
(tests/run.sh), with a way back to the host's network for the tests that need it.

Why: clusters take random free ports below 32768 (cli/port_allocator.py); between choosing
its ports and binding them (seconds, while stores, controllers and brokers start) a
cluster's ports look free, so two workers starting clusters at the same time could choose
the same port and one `cluster up` would fail. In a namespace of its own (just a loopback
interface) each worker has its own ports, as the serial run had. Tests talk to loopback
(and to namespaces they create themselves, tests/e2e/netns_hosts.py); the few that reach
the outside (HOST_NETWORK_FILES) run in the host's network, as in a serial run.

Namespaces belong to threads: the move is made on the main thread, where pytest runs the
tests; the threads and processes it starts afterwards inherit it.

Thread-safety: call from the main thread only.
"""

from __future__ import annotations

import contextlib
import ctypes
import ipaddress
import os
import shutil
import socket
import subprocess
import threading
from collections.abc import Iterator

CLONE_NEWNET = 0x40000000  # <sched.h>: unshare(2)/setns(2) flag of the network namespace
NS_PATH = "/proc/thread-self/ns/net"

# test files that reach beyond loopback, with the reason: they run in the host's network
HOST_NETWORK_FILES = {
    # `pip install -e .` into a fresh venv resolves the dependencies from the package index
    "tests/e2e/test_readme_walkthrough.py",
}


class WorkerNetwork:
    """The worker's own namespace and the host's, as open descriptors (None: not moved)."""

    def __init__(self) -> None:
        self._libc = ctypes.CDLL(None, use_errno=True)
        self._host_fd: int | None = None
        self._own_fd: int | None = None

    @property
    def moved(self) -> bool:
        """True once the main thread lives in a namespace of its own."""
        return self._own_fd is not None

    def move(self) -> bool:
        """Move the main thread into a new network namespace with loopback up. Nothing
        changes (shared loopback, a rare port collision possible) without root, without
        `ip`, when this host's name does not resolve to loopback (a cluster advertising it
        would be unreachable in the namespace), or when the kernel refuses. True when moved."""
        if self.moved or os.geteuid() != 0 or shutil.which("ip") is None:
            return self.moved
        if threading.current_thread() is not threading.main_thread():
            return False
        try:
            if not ipaddress.ip_address(socket.gethostbyname(socket.gethostname())).is_loopback:
                return False
        except (OSError, ValueError):
            return False
        host_fd = os.open(NS_PATH, os.O_RDONLY)
        if self._libc.unshare(CLONE_NEWNET) != 0:
            os.close(host_fd)
            return False
        up = subprocess.run(["ip", "link", "set", "lo", "up"], capture_output=True, timeout=10)
        if up.returncode != 0:
            self._libc.setns(host_fd, CLONE_NEWNET)  # back, as if never moved
            os.close(host_fd)
            return False
        self._host_fd, self._own_fd = host_fd, os.open(NS_PATH, os.O_RDONLY)
        return True

    @contextlib.contextmanager
    def host_network(self) -> Iterator[None]:
        """The main thread in the host's network for the block (no-op when not moved)."""
        if self._host_fd is None or self._own_fd is None:
            yield
            return
        if self._libc.setns(self._host_fd, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), "setns to the host's network namespace failed")
        try:
            yield
        finally:
            if self._libc.setns(self._own_fd, CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), "setns back to the worker's namespace failed")
