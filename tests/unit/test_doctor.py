"""Prerequisite checks give a clear message, not a traceback."""

from __future__ import annotations

import os
import stat

import pytest
from typer.testing import CliRunner

from cli.doctor import java_version, require_java
from cli.main import app


def fake_java(tmp_path, version_line: str) -> str:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    java = bin_dir / "java"
    java.write_text(f"#!/bin/sh\necho '{version_line}' >&2\n")
    java.chmod(java.stat().st_mode | stat.S_IEXEC)
    return str(bin_dir)


def test_missing_java_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("JAVA_HOME", raising=False)
    assert java_version() is None
    with pytest.raises(RuntimeError, match="Java was not found"):
        require_java()
    result = CliRunner().invoke(app, ["doctor"])
    assert result.exit_code == 1
    assert "Java was not found" in " ".join(result.output.split())
    assert "Traceback" not in result.output


def test_old_and_new_java_versions(tmp_path, monkeypatch):
    monkeypatch.setenv(
        "PATH", fake_java(tmp_path, 'java version "1.8.0_292"') + os.pathsep + os.environ["PATH"]
    )
    assert java_version() == 8
    with pytest.raises(RuntimeError, match="too old"):
        require_java()


def test_java_17_is_accepted(tmp_path, monkeypatch):
    monkeypatch.setenv(
        "PATH",
        fake_java(tmp_path, 'openjdk version "17.0.15" 2025-04-15')
        + os.pathsep
        + os.environ["PATH"],
    )
    assert require_java() == 17
