"""The broker process's Python runtime: garbage-collector pauses, measured and kept short;
large buffers reused rather than handed back to the kernel.

CPython's cyclic collector stops every thread while it runs; a full (generation 2) collection
walks every tracked object, so with a large heap a pause reaches tens of milliseconds and shows
up as a slow second of produce latency. `install_gc_pause_metric` measures each pause as
`automq_python_gc_pause_seconds{generation}`; `freeze_startup_heap` moves what start-up
allocated (modules, metadata image, configuration) out of the collector's reach.
"""

from __future__ import annotations

import ctypes
import gc
import logging
import sys
import threading
import time

from prometheus_client import Histogram

GC_PAUSE_SECONDS = Histogram(
    "automq_python_gc_pause_seconds",
    "Duration of CPython garbage-collector runs (all threads stop meanwhile)",
    ["generation"],
    buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0),
)

log = logging.getLogger(__name__)

# glibc's mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
# the largest a glibc heap serves (HEAP_MAX_SIZE / 2 on 64-bit); GET bodies are <= 8 MiB
MMAP_THRESHOLD_BYTES = 32 * 1024 * 1024
TRIM_THRESHOLD_BYTES = 128 * 1024 * 1024

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


def keep_freed_memory() -> bool:
    """Have glibc's malloc keep freed large buffers for reuse (True if it was set).

    A catch-up read allocates a buffer for every GET body (up to 8 MiB) and frees it once the
    Fetch answer is sent. By default glibc maps buffers of that size fresh or trims them back
    to the kernel on free, so every byte read from the object store page-faults twice (a
    zeroed page per 4 KiB): a quarter of the broker's CPU during a catch-up. With a fixed
    mmap threshold above the GET size and a trim threshold of `TRIM_THRESHOLD_BYTES` per
    arena, freed buffers are reused instead; the process keeps that much freed memory at
    most per malloc arena. Linux/glibc only; a no-op elsewhere.
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (e.g. musl has no mallopt)
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    ok = mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) == 1
    ok = mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES) == 1 and ok
    if not ok:
        log.warning("mallopt refused the malloc thresholds; freed buffers go back to the kernel")
    return ok
