"""Upload health rides on broker heartbeats into the leader's memory and its status (real
controller processes): reported values come back, a malformed report costs nothing."""

from __future__ import annotations

import pytest

from tests.integration.quorum_harness import QuorumHarness

pytestmark = pytest.mark.integration


def test_heartbeat_upload_stats_reach_the_leaders_status(tmp_path):
    """Stats live in the leader's memory: an election in the middle of a round (spurious
    ones happen on a loaded machine) hands heartbeats to a leader that never saw the earlier
    report, so such a round is inconclusive and tried again, a bounded number of times."""
    with QuorumHarness(tmp_path, session_timeout_ms=30_000) as quorum:
        epoch = quorum.client.call(
            "register_broker",
            {
                "node_id": 1,
                "az": "az1",
                "host": "127.0.0.1",
                "kafka_port": 9092,
                "incarnation_id": "i1",
            },
        )["node_epoch"]
        stats = {
            "wal_used_bytes": 4096,
            "wal_capacity_bytes": 1 << 29,
            "upload_lag_s": 2.5,
            "last_upload_error": "TIMEOUT: commit not committed in 5s",
        }
        hb = {"node_id": 1, "node_epoch": epoch, "stats": stats}
        assert quorum.client.call("broker_heartbeat", hb)["fenced"] is False  # unfencing one
        for _ in range(5):
            leader = quorum.leader()
            term = quorum.status(leader)["raft"]["term"]
            before = quorum.status(leader)["metadata_offset"]
            assert quorum.client.call("broker_heartbeat", hb)["fenced"] is False
            reported = quorum.status(leader)["brokers"][0]
            offset_after = quorum.status(leader)["metadata_offset"]
            # a malformed report is ignored (the broker keeps its session), the last good
            # one stays
            bad = {**hb, "stats": {"wal_used_bytes": -1}}
            assert quorum.client.call("broker_heartbeat", bad)["fenced"] is False
            kept = quorum.status(leader)["brokers"][0]
            raft = (quorum.status(leader) or {}).get("raft", {})
            if raft.get("state") != "leader" or raft.get("term") != term:
                continue  # leadership changed meanwhile: another leader's memory answered
            assert {k: reported[k] for k in stats} == stats
            # stats are memory, not decisions: a routine heartbeat writes nothing to the log
            assert offset_after == before
            assert kept["upload_lag_s"] == 2.5
            return
        raise AssertionError("leadership changed in every round")
