"""Fixtures shared by the unit tests."""

from __future__ import annotations

import pytest

from tests.unit.inprocess_broker import inprocess_broker


@pytest.fixture
def broker(tmp_path, monkeypatch):
    """One in-process broker (see `inprocess_broker`): (apis, controller, sync); moto needs
    credentials in the environment."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test")
    with inprocess_broker(tmp_path) as parts:
        yield parts
