"""Shared fixtures: real servers started per test session and always stopped."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from dataplane.objectstore.seaweed import EmbeddedSeaweed
from tests import file_durations
from tests.support.worker_network import HOST_NETWORK_FILES, WorkerNetwork

WORKER_NETWORK = WorkerNetwork()


def pytest_configure(config: pytest.Config) -> None:
    """An xdist worker (tests/run.sh's parallel run) moves into a network namespace of its
    own (tests/support/worker_network.py), where possible, before it collects anything."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        WORKER_NETWORK.move()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    """A test of HOST_NETWORK_FILES runs in the host's network (setup to teardown)."""
    if not WORKER_NETWORK.moved or item.nodeid.split("::", 1)[0] not in HOST_NETWORK_FILES:
        return (yield)
    with WORKER_NETWORK.host_network():
        return (yield)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under pytest-xdist (tests/run.sh's parallel workers), the longest units of work
    first (a test file, or a group of files that share a worker: tests/file_durations.py)
    so the workers finish together; a unit's tests keep their order. A run without workers
    keeps pytest's order. Every worker sorts the same collection the same way (xdist
    requires identical collections)."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    durations = file_durations.load()
    unit_s: dict[str, float] = {}
    seen: set[str] = set()
    for item in items:
        path = item.nodeid.split("::", 1)[0]
        if path not in seen:
            seen.add(path)
            unit = file_durations.work_unit(path)
            unit_s[unit] = unit_s.get(unit, 0.0) + file_durations.expected_s(path, durations)
    items.sort(key=lambda item: -unit_s[file_durations.work_unit(item.nodeid.split("::", 1)[0])])


@pytest.hookimpl(optionalhook=True)  # a pytest-xdist hook: unknown without it
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """`--dist loadfile` (a file's tests in one worker, so a module fixture's cluster starts
    once), with the files of a tests/file_durations.py SAME_WORKER_FILES group as one unit
    of work. Other --dist modes: xdist's own."""
    if config.getoption("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class LoadUnitScheduling(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return file_durations.work_unit(nodeid.split("::", 1)[0])

    return LoadUnitScheduling(config, log)


@pytest.fixture(scope="session")
def seaweed(tmp_path_factory: pytest.TempPathFactory):
    """A real SeaweedFS S3 endpoint on 127.0.0.1 with buckets automq-main and automq-failover."""
    data_dir: Path = tmp_path_factory.mktemp("seaweed")
    with EmbeddedSeaweed(data_dir) as store:
        yield store


@pytest.fixture
def refused_port() -> Iterator[int]:
    """A port on 127.0.0.1 where connections are refused for the whole test.

    The port stays bound (never listening) until the test ends: a port closed right after
    it was chosen can be taken by another process, or become the local port of the very
    connection that tries it (a TCP self-connect, which succeeds).
    """
    held = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        held.bind(("127.0.0.1", 0))
        yield held.getsockname()[1]
    finally:
        held.close()


@pytest.fixture
def faults() -> Iterator:
    """A failure injector (tests/support/faults.py) healed at the end of the test: no paused
    process, full disk, mount or fault proxy outlives it."""
    from tests.support.faults import FailureInjector

    with FailureInjector() as injector:
        yield injector
