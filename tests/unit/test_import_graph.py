"""The layout is the architecture: imports point one way and form no cycle.

cli -> controlplane API / Kafka protocol / boundary configs; dataplane -> controlplane API;
controlplane imports nothing of dataplane but the objectstore leaf. Imports inside functions
count too (a deferred import hides a cycle, it does not remove it).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("cli", "controlplane", "dataplane", "spark_jobs")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    found = {}
    for pkg in PACKAGES:
        for path in (ROOT / pkg).rglob("*.py"):
            found[_module_name(path)] = path
    return found


def _resolve(name: str, known: dict[str, Path]) -> str | None:
    """The project module an imported name belongs to (longest known prefix)."""
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        candidate = ".".join(parts[:i])
        if candidate in known:
            return candidate
    return None


def import_graph() -> dict[str, set[str]]:
    known = _modules()
    graph: dict[str, set[str]] = {m: set() for m in known}
    for module, path in known.items():
        is_pkg = path.name == "__init__.py"
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = module.split(".")
                    base = base if is_pkg else base[:-1]
                    base = base[: len(base) - (node.level - 1)]
                    prefix = ".".join(base + ([node.module] if node.module else []))
                else:
                    prefix = node.module or ""
                names = [prefix] + [f"{prefix}.{a.name}" for a in node.names]
            for name in names:
                target = _resolve(name, known)
                if target is not None and target != module:
                    graph[module].add(target)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    result: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                result.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return result


def _package_init_edges(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """Edges without a package's own __init__ re-exporting its submodules (not a cycle of
    concepts: `pkg/__init__` importing `pkg.mod`, which imports `pkg` for a name)."""
    pruned: dict[str, set[str]] = {}
    for m, targets in graph.items():
        pruned[m] = {t for t in targets if not (t.startswith(m + ".") or m.startswith(t + "."))}
    return pruned


def test_no_import_cycles():
    cycles = _cycles(_package_init_edges(import_graph()))
    assert not cycles, f"import cycles: {cycles}"


def test_controlplane_imports_only_the_objectstore_leaf_of_dataplane():
    bad = {
        (m, t)
        for m, ts in import_graph().items()
        if m.startswith("controlplane")
        for t in ts
        if t.startswith("dataplane") and not t.startswith("dataplane.objectstore")
    }
    assert not bad, sorted(bad)


def test_objectstore_is_a_leaf():
    bad = {
        (m, t)
        for m, ts in import_graph().items()
        if m.startswith("dataplane.objectstore")
        for t in ts
        if not t.startswith("dataplane.objectstore")
    }
    assert not bad, sorted(bad)


def test_cli_imports_no_broker_internals():
    # the CLI talks to controllers (controlplane) and brokers (the Kafka protocol, through
    # client libraries and the protocol's error table); it may read boundary configs and
    # start the embedded object store
    allowed = (
        "controlplane",
        "cli",
        "dataplane.config",
        "dataplane.objectstore",
        "dataplane.formats.kafka_errors",  # the Kafka protocol's error table (pure)
    )
    bad = {
        (m, t)
        for m, ts in import_graph().items()
        if m.startswith("cli")
        for t in ts
        if not t.startswith(allowed)
    }
    assert not bad, sorted(bad)


def test_the_checker_sees_deferred_imports():
    graph = import_graph()
    # controlplane/server.py imports the object store inside a function
    assert any(t.startswith("dataplane.objectstore") for t in graph["controlplane.server"])
