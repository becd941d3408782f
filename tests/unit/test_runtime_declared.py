"""The runtime is declared in one place: every thread and pool the broker starts is named in
`dataplane.runtime.RUNTIME` (with its bound and what may run on it), and
docs/architecture.md shows that table as it is."""

from __future__ import annotations

import ast
from pathlib import Path

from dataplane.runtime import RUNTIME, runtime_table

ROOT = Path(__file__).resolve().parents[2]


def _literal_prefix(node: ast.expr) -> str | None:
    """The fixed start of a thread name: a string, or an f-string's text before its first
    placeholder; without its trailing '-'."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value.rstrip("-")
    if isinstance(node, ast.JoinedStr) and node.values:
        first = node.values[0]
        if isinstance(first, ast.Constant) and isinstance(first.value, str):
            return first.value.rstrip("-")
    return None


def created_threads() -> dict[str, str]:
    """name prefix -> where: every Thread / ThreadPoolExecutor created in dataplane/."""
    found: dict[str, str] = {}
    for path in sorted((ROOT / "dataplane").rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if called not in ("Thread", "ThreadPoolExecutor"):
                continue
            where = f"{path.relative_to(ROOT)}:{node.lineno}"
            named = {k.arg: k.value for k in node.keywords}
            value = named.get("name") or named.get("thread_name_prefix")
            prefix = _literal_prefix(value) if value is not None else None
            assert prefix, f"{where}: a thread or pool without a literal name"
            found[prefix] = where
    return found


def _declared(prefix: str) -> bool:
    return any(d.name.startswith(prefix) or prefix.startswith(d.name) for d in RUNTIME)


def test_every_thread_and_pool_is_declared():
    undeclared = {p: w for p, w in created_threads().items() if not _declared(p)}
    assert not undeclared, f"not in dataplane.runtime.RUNTIME: {undeclared}"


def test_every_declaration_is_still_used():
    created = created_threads()
    unused = [
        d.name
        for d in RUNTIME
        if not any(d.name.startswith(p) or p.startswith(d.name) for p in created)
    ]
    assert not unused, f"declared in RUNTIME but started nowhere: {unused}"


def test_the_event_loop_is_the_one_context_that_never_blocks():
    assert [d.name for d in RUNTIME if not d.may_block] == ["kafka-server"]
    assert len({d.name for d in RUNTIME}) == len(RUNTIME)


def test_architecture_doc_shows_the_table_as_declared():
    doc = (ROOT / "docs" / "architecture.md").read_text()
    assert runtime_table() in doc, "docs/architecture.md: paste dataplane.runtime.runtime_table()"
