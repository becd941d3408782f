"""The byte budgets of the partitions a Fetch reads at once (dataplane/kafka/fetch_budget.py)."""

from __future__ import annotations

from dataplane.kafka.fetch_budget import next_wave

MIB = 1024 * 1024


def test_a_wave_takes_partitions_while_their_budgets_fit_what_is_left():
    # a catch-up consumer (confluent: 64 MiB per fetch, 8 MiB per partition): 6 at once
    assert next_wave([8 * MIB] * 6, 0, 64 * MIB) == [8 * MIB] * 6
    # Java/librdkafka defaults (50 MiB, 1 MiB): at most 8 at once (of the 16 I/O threads)
    assert next_wave([MIB] * 100, 0, 50 * MIB) == [MIB] * 8
    assert next_wave([MIB] * 100, 0, 50 * MIB, max_partitions=100) == [MIB] * 50
    # the last one gets what is left
    assert next_wave([12_000] * 4, 0, 25_000) == [12_000, 12_000, 1_000]


def test_what_a_wave_left_unused_goes_to_the_next_one():
    assert next_wave([MIB] * 3, 10, MIB) == [MIB - 10]
    assert next_wave([MIB] * 3, MIB, MIB) == []
    assert next_wave([], 0, MIB) == []


def test_a_partition_asking_for_nothing_still_reads_one_batch():
    assert next_wave([0, 0], 0, MIB) == [1, 1]
    assert next_wave([MIB], MIB - 1, MIB) == [1]
