"""The broker's runtime (dataplane/runtime.py): the garbage-collector pause metric, malloc
keeping freed buffers."""

from __future__ import annotations

import gc
import subprocess
import sys

import pytest

from dataplane.runtime import GC_PAUSE_SECONDS, install_gc_pause_metric


def _count(generation: str) -> float:
    for metric in GC_PAUSE_SECONDS.collect():
        for sample in metric.samples:
            if sample.name.endswith("_count") and sample.labels["generation"] == generation:
                return sample.value
    return 0.0


def test_every_full_collection_is_observed_once_even_if_installed_twice():
    install_gc_pause_metric()
    install_gc_pause_metric()
    before = _count("2")
    gc.collect()
    gc.collect()
    assert _count("2") == before + 2


_FAULTS_SCRIPT = """
import resource, sys
from dataplane.runtime import keep_freed_memory
if sys.argv[1] == "keep" and not keep_freed_memory():
    print("unsupported")
    raise SystemExit
faults = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(3):
    body = b"x" * (8 << 20)
    del body
before = faults()
for _ in range(10):  # two GET bodies at once, freed after the answer is sent
    first, second = b"x" * (8 << 20), b"y" * (8 << 20)
    del first, second
print(faults() - before)
"""


def test_freed_get_sized_buffers_are_reused_without_page_faults():
    """8 MiB buffers (a GET body) freed and allocated again: by default glibc hands them back
    to the kernel and every page faults in again (~2,048 faults per buffer); with
    `keep_freed_memory` the process reuses them."""

    def faults(mode: str) -> str:
        out = subprocess.run(
            [sys.executable, "-c", _FAULTS_SCRIPT, mode],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        return out.stdout.strip()

    kept = faults("keep")
    if kept == "unsupported":
        pytest.skip("not glibc")
    # 20 buffers of 2,048 pages each went through; only the second buffer's first use (and
    # a few stray pages) may fault
    assert int(kept) < 2 * 2048, f"default: {faults('default')} faults, kept: {kept}"
