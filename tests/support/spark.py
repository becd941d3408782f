"""What a test module that runs real Spark needs, checked once at its import: the Python
packages and a JRE (tests/run.sh installs openjdk-17-jre-headless). Call
`skip_module_without_spark()` before importing anything that needs them."""

from __future__ import annotations

import shutil

import pytest


def skip_module_without_spark(*packages: str) -> None:
    """Skip the calling module unless confluent_kafka, pyspark, `packages` and java exist."""
    for name in ("confluent_kafka", "pyspark", *packages):
        pytest.importorskip(name)
    if shutil.which("java") is None:
        pytest.skip("Spark needs java", allow_module_level=True)
