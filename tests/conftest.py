"""Shared fixtures: real servers started per test session and always stopped."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from dataplane.objectstore.seaweed import EmbeddedSeaweed
from tests import file_durations


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under pytest-xdist (tests/run.sh's parallel workers), the longest test files first
    (tests/file_durations.json) so the workers finish together; a file's tests keep their
    order. A run without workers keeps pytest's order. Every worker sorts the same
    collection the same way (xdist requires identical collections)."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    durations = file_durations.load()
    seconds = {}
    for item in items:
        path = item.nodeid.split("::", 1)[0]
        seconds.setdefault(path, file_durations.expected_s(path, durations))
    items.sort(key=lambda item: -seconds[item.nodeid.split("::", 1)[0]])


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
