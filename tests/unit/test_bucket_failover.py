"""Object-storage failover: the switch command, the detection policy, write health (pure)."""

from __future__ import annotations

import pytest

from controlplane import bucket_failover
from controlplane.bucket_failover import HealthReport, aged_reports, decide
from controlplane.image import MetadataImage
from controlplane.records import BucketFailoverRecord, decode_record
from controlplane.requests import BucketWriteHealth
from controlplane.settings import ControllerSettings
from controlplane.state_machine import MetadataStateMachine
from dataplane.objectstore.health import WriteHealthTracker

NOW = 5_000_000
LATER = NOW + 60_000  # a minute after the switches these tests make at NOW
SETTINGS = ControllerSettings(bucket_ids=[0, 1], bucket_failover_detect_ms=10_000)


def machine(brokers=(1, 2, 3), settings=SETTINGS) -> MetadataStateMachine:
    sm = MetadataStateMachine(settings)
    for node in brokers:
        body = {
            "node_id": node,
            "az": "az1",
            "host": "127.0.0.1",
            "kafka_port": 9000 + node,
            "incarnation_id": f"i{node}",
        }
        assert "error" not in sm.execute("register_broker", body, NOW)
        assert "error" not in sm.execute(
            "broker_heartbeat", {"node_id": node, "node_epoch": 0}, NOW
        )
    return sm


def refused(sm: MetadataStateMachine, body: dict) -> str:
    before = (sm.image.fingerprint(), sm.next_offset)
    result = sm.execute("set_active_bucket", body, NOW)
    assert "error" in result, result
    assert (sm.image.fingerprint(), sm.next_offset) == before
    return result["error"]["message"]


def test_manual_switch_records_mode_since_and_reason_and_back():
    sm = machine()
    assert sm.image.bucket_failover.mode == "normal"
    res = sm.execute("set_active_bucket", {"bucket_id": 1, "reason": "drill"}, NOW + 7)["result"]
    assert res == {"mode": "failover", "active_bucket_id": 1, "since_ms": NOW + 7, "changed": True}
    state = sm.image.bucket_failover
    assert (state.mode, state.active_bucket_id, state.since_ms, state.reason, state.auto) == (
        "failover",
        1,
        NOW + 7,
        "drill",
        False,
    )
    assert sm.image.active_bucket_id == 1
    # the same switch again changes nothing
    offset = sm.next_offset
    assert sm.execute("set_active_bucket", {"bucket_id": 1}, NOW)["result"]["changed"] is False
    assert sm.next_offset == offset
    sm.execute("set_active_bucket", {"bucket_id": 0}, NOW + 9)
    assert sm.image.bucket_failover.mode == "normal"
    assert sm.image.bucket_failover.since_ms == NOW + 9


def test_bad_switches_are_refused_and_change_nothing():
    sm = machine()
    assert "not configured" in refused(sm, {"bucket_id": 7})
    single = machine(settings=ControllerSettings(bucket_ids=[0]))
    assert "no failover bucket is configured" in refused(single, {"bucket_id": 1})


def test_an_automatic_switch_does_not_undo_a_manual_one():
    sm = machine()
    sm.execute("set_active_bucket", {"bucket_id": 1}, NOW)
    sm.execute("set_active_bucket", {"bucket_id": 0}, NOW)
    # the detection decided on an image where 1 was active: stale, ignored
    res = sm.execute("set_active_bucket", {"bucket_id": 0, "auto": True, "only_if_active": 1}, NOW)[
        "result"
    ]
    assert res["changed"] is False


def test_records_written_before_mode_existed_still_apply():
    old = decode_record({"type": "bucket_failover", "active_bucket_id": 1, "reason": "x"})
    image = MetadataImage()
    image.apply(old)
    assert image.bucket_failover.mode == "failover"
    image.apply(BucketFailoverRecord(active_bucket_id=0))
    assert image.bucket_failover.mode == "normal"


def reports(failing: dict[int, int], bucket_id: int = 0, error: str = "timeout"):
    return {
        bucket_id: [
            HealthReport(node, ms, 0 if ms else 60_000, error if ms else None)
            for node, ms in failing.items()
        ]
    }


def test_detection_needs_a_majority_of_live_brokers_for_the_detect_time():
    image = machine().image
    assert decide(image, reports({1: 11_000}), SETTINGS, LATER) is None  # one of three
    assert decide(image, reports({1: 11_000, 2: 9_000}), SETTINGS, LATER) is None  # too short
    req = decide(image, reports({1: 11_000, 2: 10_000, 3: 0}), SETTINGS, LATER)
    assert req is not None
    assert (req.bucket_id, req.auto, req.only_if_active) == (1, True, 0)
    assert "2 of 3 live brokers" in req.reason and "timeout" in req.reason


def test_detection_ignores_fenced_brokers_and_a_failing_target():
    sm = machine()
    sm.execute("fence_broker", {"node_id": 3, "node_epoch": 0}, NOW)
    image = sm.image
    # 2 live brokers: both must fail; node 3's report does not count
    assert decide(image, reports({1: 20_000, 3: 20_000}), SETTINGS, LATER) is None
    assert decide(image, reports({1: 20_000, 2: 20_000}), SETTINGS, LATER) is not None
    both = {**reports({1: 20_000, 2: 20_000}), **reports({1: 5, 2: 5}, bucket_id=1)}
    assert decide(image, both, SETTINGS, LATER) is None  # no point switching to a dead bucket


def test_going_back_is_manual_unless_auto_return_is_configured():
    sm = machine()
    sm.execute("set_active_bucket", {"bucket_id": 1, "auto": True}, NOW)
    healthy = reports({1: 0, 2: 0, 3: 0})
    assert decide(sm.image, healthy, SETTINGS, LATER) is None
    auto = SETTINGS.model_copy(update={"bucket_failover_auto_return_ms": 30_000})
    assert decide(sm.image, healthy, auto, LATER) is not None  # healthy 60 s > 30 s
    req = decide(sm.image, healthy, auto, LATER)
    assert (req.bucket_id, req.only_if_active) == (0, 1)


def test_a_return_is_overruled_only_by_failures_seen_after_it():
    """Found in CI: an operator switched back to the healed main bucket, and 1 s later the
    detection switched away again on the brokers' memory of the outage (no write to the
    main bucket since the return, so their failing streaks still ran)."""
    sm = machine()
    sm.execute("set_active_bucket", {"bucket_id": 1, "auto": True}, NOW)
    back_at = NOW + 30_000
    sm.execute("set_active_bucket", {"bucket_id": 0}, back_at)
    now = back_at + 11_000  # more than the detection time after the return

    def failing_reports(last_failure_age_ms: int | None):
        return {0: [HealthReport(n, 45_000, 0, "reset", last_failure_age_ms) for n in (1, 2, 3)]}

    # the last failures were 12 s ago, before the return: nothing seen since
    assert decide(sm.image, failing_reports(12_000), SETTINGS, now) is None
    # a write failed after the return, and the streak since the return is >= detect
    req = decide(sm.image, failing_reports(500), SETTINGS, now)
    assert req is not None and req.bucket_id == 1
    # a broker that does not say when it last failed counts, as before
    assert decide(sm.image, failing_reports(None), SETTINGS, now) is not None


def test_reports_age_while_the_leader_waits_for_the_next_one():
    h = BucketWriteHealth(bucket_id=0, failing_for_ms=4_000, healthy_for_ms=0)
    aged = aged_reports({1: ([h], 100.0)}, now_s=106.0)
    assert aged[0][0].failing_for_ms == 10_000
    h = BucketWriteHealth(
        bucket_id=0, failing_for_ms=4_000, healthy_for_ms=0, last_failure_age_ms=300
    )
    assert aged_reports({1: ([h], 100.0)}, now_s=106.0)[0][0].last_failure_age_ms == 6_300


def test_deletion_pauses_for_unhealthy_buckets_and_in_failover_mode():
    sm = machine()
    paused = bucket_failover.deletion_paused
    assert not paused(sm.image, 0, set()) and not paused(sm.image, 1, set())
    assert paused(sm.image, 0, {0}) and not paused(sm.image, 1, {0})
    sm.execute("set_active_bucket", {"bucket_id": 1}, NOW)
    assert paused(sm.image, 0, set())  # healthy, but not the active bucket in failover
    assert not paused(sm.image, 1, set())
    sm.execute("set_active_bucket", {"bucket_id": 0}, NOW)
    assert not paused(sm.image, 0, set())  # healed and back: deletes resume


def test_bucket_usage_counts_objects_and_bytes_per_bucket():
    sm = machine()
    body = {"node_id": 1, "node_epoch": 0, "count": 1, "ttl_ms": 60_000}
    sm.execute("prepare_objects", body, NOW)
    sm.execute("set_active_bucket", {"bucket_id": 1}, NOW)
    sm.execute("prepare_objects", {**body, "count": 2}, NOW)
    assert bucket_failover.bucket_usage(sm.image) == {0: (1, 0), 1: (2, 0)}


def test_write_health_tracks_failing_and_healthy_time():
    now = [100.0]
    t = WriteHealthTracker(clock=lambda: now[0])
    t.record_ok(0, 0.01)
    now[0] = 102.0
    t.record_failure(0, "connection reset")
    now[0] = 105.0
    t.record_failure(0, "timeout")
    [h] = t.snapshot()
    assert (h.failing_for_ms, h.healthy_for_ms, h.write_errors, h.last_error) == (
        3000,
        0,
        2,
        "timeout",
    )
    assert t.failing_for_ms(0) == 3000
    t.record_ok(0, 0.02)
    now[0] = 106.0
    [h] = t.snapshot()
    assert (h.failing_for_ms, h.healthy_for_ms, h.last_error) == (0, 1000, None)
    assert h.last_failure_age_ms == 1000  # the 105.0 failure


@pytest.mark.parametrize("bad", [{"bucket_id": -1}, {"bucket_id": 1, "auto": "maybe"}])
def test_malformed_switch_requests_are_refused(bad):
    sm = machine()
    assert "malformed" in refused(sm, bad)


def test_each_bucket_may_take_its_own_credentials_from_the_environment(monkeypatch):
    from dataplane.objectstore import parse_bucket_uris

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "global-ak")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "global-sk")
    monkeypatch.setenv("AUTOMQ_S3_ACCESS_KEY_1", "failover-ak")
    monkeypatch.setenv("AUTOMQ_S3_SECRET_KEY_1", "failover-sk")
    main, failover = parse_bucket_uris("0@s3://main,1@s3://failover?region=eu-west-1")
    assert main.credentials()["aws_access_key_id"] == "global-ak"
    assert failover.credentials() == {
        "aws_access_key_id": "failover-ak",
        "aws_secret_access_key": "failover-sk",
    }
    assert "failover-sk" not in repr(failover) and "failover-sk" not in failover.to_string()


def test_a_manual_switch_back_restarts_the_detection_clock():
    """The brokers still remember the outage (failing for 30 s) when the operator switches
    back to the recovered bucket: no automatic switch until it fails for the detect time
    after the switch."""
    sm = machine()
    sm.execute("set_active_bucket", {"bucket_id": 1, "auto": True}, NOW)
    sm.execute("set_active_bucket", {"bucket_id": 0}, NOW + 30_000)
    stale = reports({1: 30_000, 2: 30_000, 3: 30_000})
    assert decide(sm.image, stale, SETTINGS, NOW + 30_500) is None
    assert decide(sm.image, stale, SETTINGS, NOW + 39_000) is None
    assert decide(sm.image, stale, SETTINGS, NOW + 40_000) is not None  # 10 s after it


def test_auto_return_counts_health_only_since_the_failover():
    sm = machine()
    sm.execute("set_active_bucket", {"bucket_id": 1, "auto": True}, NOW)
    auto = SETTINGS.model_copy(update={"bucket_failover_auto_return_ms": 30_000})
    healthy = reports({1: 0, 2: 0, 3: 0})  # each says healthy for 60 s
    assert decide(sm.image, healthy, auto, NOW + 10_000) is None
    assert decide(sm.image, healthy, auto, NOW + 30_000) is not None


def test_a_write_that_hung_through_an_outage_fails_from_the_last_success_on():
    clock = [100.0]
    tracker = WriteHealthTracker(clock=lambda: clock[0])
    started = clock[0]  # an upload starts and hangs: the store froze
    clock[0] = 130.0
    tracker.record_ok(0, 0.01)  # the store is back: a probe succeeds
    clock[0] = 131.0
    tracker.record_failure(0, "read timeout", started_s=started)  # the hung upload ends
    assert tracker.failing_for_ms(0) == 1_000  # failing since the success, not for 31 s
    fresh = WriteHealthTracker(clock=lambda: clock[0])
    fresh.record_failure(0, "read timeout", started_s=clock[0] - 5)
    assert fresh.failing_for_ms(0) == 5_000  # no success yet: from the write's start
