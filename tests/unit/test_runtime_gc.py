"""The broker's garbage-collector pause metric (dataplane/runtime.py)."""

from __future__ import annotations

import gc

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
