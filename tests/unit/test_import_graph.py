"""The layout is the architecture: imports point one way (down the layers) and form no cycle.

Layers, bottom-up: formats < objectstore < controlplane < config, runtime < s3stream, erasure
< kafka < zonerouter < broker < cli, spark_jobs (`LAYERS`). cli -> controlplane API / Kafka
protocol / boundary configs; dataplane -> controlplane API; controlplane imports nothing of
dataplane but the objectstore leaf and the formats floor. Imports inside functions count too
(a deferred import hides a cycle, it does not remove it).
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
        if t.startswith("dataplane")
        and not t.startswith(("dataplane.objectstore", "dataplane.formats"))
    }
    assert not bad, sorted(bad)


def test_objectstore_is_a_leaf():
    # a leaf but for the formats floor below it
    bad = {
        (m, t)
        for m, ts in import_graph().items()
        if m.startswith("dataplane.objectstore")
        for t in ts
        if not t.startswith(("dataplane.objectstore", "dataplane.formats"))
    }
    assert not bad, sorted(bad)


def test_cli_imports_no_broker_internals():
    # the CLI talks to controllers (controlplane) and brokers (the Kafka protocol, through
    # client libraries and the protocol's error table, a format); it may read boundary configs
    # and start the embedded object store
    allowed = (
        "controlplane",
        "cli",
        "dataplane.config",
        "dataplane.objectstore",
        "dataplane.formats",  # the formats floor (pure), e.g. the Kafka error table
        "dataplane.tables",  # table topics' Iceberg tables (no broker part: PyIceberg)
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


# Layers, bottom-up; a module may import its own component or any component of a lower layer,
# never one above nor a sibling of its own layer. Components of one layer are independent
# siblings (s3stream and erasure do not import each other, nor cli and spark_jobs). A
# component is a module and everything under it.
#
# Placement of the top-level modules of dataplane:
# - `dataplane.config` (pydantic boundary config: the CLI writes it, the broker reads it; the
#   engines' defaults) is imported by s3stream (storage defaults) and kafka (server, retention)
#   and imports controlplane.records (listener endpoints) and formats (the client-AZ CIDR map
#   it validates): it sits right above controlplane, below every engine.
# - `dataplane.runtime` (the process's GC, buffers, and the declared loop / pools of issue 27)
#   is imported today only by the broker, but it imports nothing of the project and engines
#   will name the pools they run on: it sits as low as an engine can reach, beside config.
# - `dataplane.broker` (the composition root: the process, its assembly, heartbeats, WAL
#   failovers, the metadata follower, the stall watch) is the broker process.
LAYERS: tuple[tuple[tuple[str, ...], ...], ...] = (
    (("dataplane.formats",),),
    (("dataplane.objectstore",),),
    (("controlplane",),),
    (
        (
            "dataplane.config",
            "dataplane.config_reference",
            "dataplane.config_properties",
            "dataplane.config_mapping",
        ),
        # `dataplane.light_future` (the produce path's cross-thread futures) is pure
        # threading, beside the runtime that hands results to the loop
        ("dataplane.runtime", "dataplane.light_future"),
        # table topics: a topic's Iceberg table (PyIceberg, pyarrow); the CLI and the Spark
        # table sync job both use it
        ("dataplane.tables",),
    ),
    (("dataplane.s3stream",), ("dataplane.erasure",)),
    (("dataplane.kafka",),),
    (("dataplane.zonerouter",),),
    (("dataplane.broker",),),
    (("cli",), ("spark_jobs",)),
)
# `dataplane` itself is an empty namespace package (`from dataplane import x` names it)
NAMESPACE_PACKAGES = frozenset({"dataplane"})
# imports allowed against the layer order: (importer, imported) -> the reason; keep it empty
LAYER_EXCEPTIONS: dict[tuple[str, str], str] = {}


def _layer_of(module: str) -> tuple[int, int] | None:
    """(layer index, component index within the layer) of a module, or None if unplaced."""
    for layer_index, components in enumerate(LAYERS):
        for component_index, prefixes in enumerate(components):
            if any(module == p or module.startswith(p + ".") for p in prefixes):
                return layer_index, component_index
    return None


def test_every_module_has_a_layer():
    unplaced = sorted(
        m for m in import_graph() if m not in NAMESPACE_PACKAGES and _layer_of(m) is None
    )
    assert not unplaced, f"place these modules in LAYERS: {unplaced}"


def test_namespace_packages_are_empty():
    for name in NAMESPACE_PACKAGES:
        init = ROOT.joinpath(*name.split("."), "__init__.py")
        assert not init.read_text().strip(), f"{init} is a namespace package: keep it empty"


def test_imports_follow_the_layer_order():
    bad = set()
    for module, targets in import_graph().items():
        here = _layer_of(module)
        if here is None:
            continue  # test_every_module_has_a_layer names it
        for target in targets:
            there = _layer_of(target)
            if there is None or (module, target) in LAYER_EXCEPTIONS:
                continue
            if there[0] > here[0] or (there[0] == here[0] and there[1] != here[1]):
                bad.add((module, target))
    assert not bad, f"imports up (or across) the layers: {sorted(bad)}"


def test_the_layer_check_sees_an_upward_import():
    assert _layer_of("dataplane.formats.record_batch") < _layer_of("dataplane.kafka.apis")
    assert _layer_of("dataplane.s3stream.storage")[0] == _layer_of("dataplane.erasure.codec")[0]
    assert _layer_of("dataplane.s3stream.storage") != _layer_of("dataplane.erasure.codec")


# what a formats module may not import: formats are pure (no I/O, no threads, no clocks)
IMPURE_MODULES = frozenset(
    {
        "asyncio",
        "boto3",
        "botocore",
        "concurrent",
        "logging",
        "multiprocessing",
        "os",
        "pathlib",
        "prometheus_client",
        "selectors",
        "shutil",
        "socket",
        "ssl",
        "subprocess",
        "tempfile",
        "threading",
        "time",
        "urllib",
    }
)


def test_formats_are_pure():
    bad = set()
    for path in (ROOT / "dataplane" / "formats").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module or ""]
            else:
                continue
            bad |= {(path.name, n) for n in names if n.split(".")[0] in IMPURE_MODULES}
    assert not bad, sorted(bad)
