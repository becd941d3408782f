"""The broker process's Python runtime: garbage-collector pauses, measured and kept short.

CPython's cyclic collector stops every thread while it runs; a full (generation 2) collection
walks every tracked object, so with a large heap a pause reaches tens of milliseconds and shows
up as a slow second of produce latency. `install_gc_pause_metric` measures each pause as
`automq_python_gc_pause_seconds{generation}`; `freeze_startup_heap` moves what start-up
allocated (modules, metadata image, configuration) out of the collector's reach.
"""

from __future__ import annotations

import gc
import threading
import time

from prometheus_client import Histogram

GC_PAUSE_SECONDS = Histogram(
    "automq_python_gc_pause_seconds",
    "Duration of CPython garbage-collector runs (all threads stop meanwhile)",
    ["generation"],
    buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0),
)

_installed = threading.Lock()
_state = {"installed": False, "started_s": 0.0}


def _on_gc(phase: str, info: dict) -> None:
    if phase == "start":
        _state["started_s"] = time.perf_counter()
    elif _state["started_s"]:
        GC_PAUSE_SECONDS.labels(str(info.get("generation", "?"))).observe(
            time.perf_counter() - _state["started_s"]
        )
        _state["started_s"] = 0.0


def install_gc_pause_metric() -> None:
    """Observe every collection's duration (idempotent). Collections run under the GIL, one
    at a time, so the start/stop pair needs no lock."""
    with _installed:
        if not _state["installed"]:
            gc.callbacks.append(_on_gc)
            _state["installed"] = True


def freeze_startup_heap() -> None:
    """Collect once, then move every surviving object to the permanent generation: full
    collections no longer walk the start-up heap (modules, image, config)."""
    gc.collect()
    gc.freeze()
