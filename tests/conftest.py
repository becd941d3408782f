"""Shared fixtures: real servers started per test session and always stopped."""

from __future__ import annotations

from pathlib import Path

import pytest

from dataplane.objectstore.seaweed import EmbeddedSeaweed


@pytest.fixture(scope="session")
def seaweed(tmp_path_factory: pytest.TempPathFactory):
    """A real SeaweedFS S3 endpoint on 127.0.0.1 with buckets automq-main and automq-failover."""
    data_dir: Path = tmp_path_factory.mktemp("seaweed")
    with EmbeddedSeaweed(data_dir) as store:
        yield store
