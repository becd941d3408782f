"""Files and functions stay small enough to read: no product file over 800 lines, no
function over 100. An exception names its reason in docs/architecture.md, section "Size
exceptions" (a table row: | `path` | `function` or - | reason |); an exception that is no
longer needed must leave that table too."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("cli", "controlplane", "dataplane", "spark_jobs")
MAX_FILE_LINES = 800
MAX_FUNCTION_LINES = 100
ARCHITECTURE = ROOT / "docs" / "architecture.md"
SECTION = "### Size exceptions"
_ROW = re.compile(r"^\|\s*`([^`]+)`\s*\|\s*(?:`([^`]+)`|-)\s*\|\s*(.+?)\s*\|\s*$")


def oversized() -> set[tuple[str, str]]:
    """(path, function or "") of every product file or function over its limit."""
    found: set[tuple[str, str]] = set()
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            source = path.read_text()
            if source.count("\n") > MAX_FILE_LINES:
                found.add((rel, ""))
            for node in ast.walk(ast.parse(source, rel)):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    assert node.end_lineno is not None
                    if node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES:
                        found.add((rel, node.name))
    return found


def documented_exceptions() -> dict[tuple[str, str], str]:
    """The rows of the architecture doc's size-exceptions table: (path, function) -> reason."""
    text = ARCHITECTURE.read_text()
    if SECTION not in text:
        return {}
    rows: dict[tuple[str, str], str] = {}
    for line in text.split(SECTION, 1)[1].splitlines()[1:]:
        if line.startswith("#"):
            break
        match = _ROW.match(line)
        if match:
            rows[(match.group(1), match.group(2) or "")] = match.group(3)
    return rows


def _describe(items: set[tuple[str, str]]) -> list[str]:
    return sorted(f"{path}:{function}" if function else path for path, function in items)


def test_no_file_or_function_over_its_limit_without_a_written_reason():
    missing = oversized() - set(documented_exceptions())
    assert not missing, (
        f"over {MAX_FILE_LINES} lines per file / {MAX_FUNCTION_LINES} per function, with "
        f"no reason in {ARCHITECTURE.name} ({SECTION}): {_describe(missing)}"
    )


def test_every_written_exception_is_still_needed_and_has_a_reason():
    documented = documented_exceptions()
    stale = set(documented) - oversized()
    assert not stale, f"no longer over the limit, remove from {SECTION}: {_describe(stale)}"
    assert all(len(reason) >= 10 for reason in documented.values()), documented


def test_the_checker_reads_rows_and_finds_long_functions(tmp_path):
    assert _ROW.match("| `dataplane/x.py` | `run` | one state machine, read top-down |")
    assert _ROW.match("| `dataplane/x.py` | - | generated tables |").group(2) is None
    tree = ast.parse("def f():\n" + "    x = 1\n" * MAX_FUNCTION_LINES)
    (func,) = tree.body
    assert func.end_lineno - func.lineno + 1 > MAX_FUNCTION_LINES
