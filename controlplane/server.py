"""A controller process: one quorum voter, its HTTP API, and the leader's timers.

Heartbeats are kept in the leader's memory (as Kafka's controller does); only decisions
(unfence, fence on session expiry) go into the metadata log. The leader's lifecycle task
fences expired sessions, expires PREPARED objects past their deadline, deletes
MARK_DESTROYED objects from their own bucket after the retention, and runs the self-balancer's
rounds (controlplane/balancer.py) with the produce rates brokers report in heartbeats.

Run: python -m controlplane.server --config quorum.json --node-id 0 --data-dir DIR
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from controlplane import balancer, bucket_failover, route_epochs
from controlplane.api import ControllerHTTPServer
from controlplane.config import QuorumConfig
from controlplane.coordinators import plan_slot_moves, slot_counts
from controlplane.errors import ControllerError, ErrorCode
from controlplane.listeners import insecure_listener_error
from controlplane.objects import expire_prepared_objects, objects_to_delete
from controlplane.placement import leader_load
from controlplane.quorum import MetadataQuorum, RaftTimeouts
from controlplane.records import ObjectState
from controlplane.requests import BrokerUploadStats, BucketWriteHealth
from controlplane.signal_watcher import SignalWatcher
from controlplane.tls import server_ssl_context
from controlplane.wal_failover import plan_failovers

log = logging.getLogger("controlplane.server")

LIFECYCLE_INTERVAL_S = 0.5
# a session is fenced this soon after it expires (the round is also run then, not only
# every LIFECYCLE_INTERVAL_S: a failed broker's partitions move up to 0.5 s sooner)
SESSION_EXPIRY_SLACK_S = 0.01
MAX_DELETES_PER_ROUND = 1000

# deletes keys from one bucket; returns the keys it could not delete
ObjectDeleter = Callable[[int, list[int]], list[int]]


class ControllerNode:
    """Everything one controller process runs."""

    def __init__(
        self,
        config: QuorumConfig,
        node_id: int,
        data_dir: Path,
        timeouts: RaftTimeouts | None = None,
        object_deleter: ObjectDeleter | None = None,
    ):
        self.config = config
        self.node_id = node_id
        me = config.controller(node_id)
        partners = [c.raft_address for c in config.controllers if c.node_id != node_id]
        self.quorum = MetadataQuorum(
            me.raft_address, partners, data_dir, config.password, config.settings, timeouts
        )
        refused = insecure_listener_error(
            "the controller API", me.host, config.api_secret is not None, config.allow_insecure
        )
        if refused:
            raise RuntimeError(refused)
        tls = None
        if config.tls_cert_file and config.tls_key_file:
            tls = server_ssl_context(config.tls_cert_file, config.tls_key_file)
            log.info("HTTPS on the controller API (%s)", config.tls_cert_file)
        self.http = ControllerHTTPServer((me.host, me.api_port), self, ssl_context=tls)
        self.object_deleter = object_deleter
        self._heartbeats: dict[int, tuple[int, float]] = {}  # node -> (epoch, monotonic s)
        # node -> its last BrokerUploadStats (one entry per registered node: bounded)
        self._upload_stats: dict[int, dict] = {}
        # stream id -> (produce bytes/s, monotonic s of the report): the balancer's input.
        # Per stream, not per broker: a partition that just moved keeps its last rate until
        # its new leader has measured it (a false 0 would pull more load onto that broker)
        self._rates: dict[int, tuple[float, float]] = {}
        # node -> (its last bucket write health, monotonic s): failover detection's input
        self._bucket_health: dict[int, tuple[list[BucketWriteHealth], float]] = {}
        self._last_balance_round = 0.0  # monotonic s
        self._last_route_bump_ms: int | None = None  # this leader's last route epoch bump
        self._hb_lock = threading.Lock()
        # the term whose leadership _start_leadership last began (None: not leading)
        self._leading_term: int | None = None
        self._leadership_lock = threading.Lock()
        self._leader_since = 0.0
        # when the earliest unexpired session expires (monotonic s; set by each round)
        self._next_session_expiry = float("inf")
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self.http.serve_forever, name="api", daemon=True),
            threading.Thread(target=self._lifecycle_loop, name="lifecycle", daemon=True),
        ]

    def start(self) -> None:
        for t in self._threads:
            t.start()
        log.info(
            "controller %d serving API on %s, raft on %s",
            self.node_id,
            self.config.controller(self.node_id).api_address,
            self.config.controller(self.node_id).raft_address,
        )

    def stop(self) -> None:
        self._stop.set()
        self.http.shutdown()
        self.http.server_close()
        self.quorum.close()

    # ------------------------------------------------------------ heartbeats

    def handle_heartbeat(self, body: dict) -> dict:
        try:
            node_id, epoch = int(body["node_id"]), int(body["node_epoch"])
        except (KeyError, TypeError, ValueError):
            raise ControllerError(
                ErrorCode.INVALID_REQUEST, "heartbeat needs integer node_id and node_epoch"
            ) from None
        # upload stats stay in memory, like the heartbeat times; the log gets decisions only
        raw_stats = body.pop("stats", None)
        stats: dict | None = None
        if raw_stats is not None:
            try:
                stats = BrokerUploadStats.model_validate(raw_stats).model_dump()
            except ValueError as exc:  # a bad report must not cost the broker its session
                log.warning("node %d sent invalid upload stats: %s", node_id, exc)
        image = self.quorum.machine.image
        broker = image.brokers.get(node_id)
        rates = _parse_rates(body.get("produce_bytes_per_s"))
        health = _parse_bucket_health(body.pop("bucket_health", None), node_id)
        # a report kept under a new term must not be wiped when the lifecycle loop notices
        # that term later
        self._observe_leadership()
        if broker is not None and broker.node_epoch == epoch:
            now = time.monotonic()
            with self._hb_lock:
                self._heartbeats[node_id] = (epoch, now)
                if stats is not None:
                    self._upload_stats[node_id] = stats
                self._rates.update((s, (rate, now)) for s, rate in rates.items())
                if health is not None:
                    self._bucket_health[node_id] = (health, now)
        if (
            broker is not None
            and broker.fenced
            and broker.fence_reason == "registered"
            and broker.node_epoch == epoch
            and not body.get("want_fence")
        ):
            # rates stay in memory: they would only bloat the metadata log
            answer = self.quorum.submit(
                "broker_heartbeat", {k: v for k, v in body.items() if k != "produce_bytes_per_s"}
            )
        else:
            # answer from the image: no log write for a routine heartbeat
            answer = self.quorum.machine.execute_readonly("broker_heartbeat", body)
        if isinstance(answer.get("result"), dict):
            # the broker's lease: a broker stopped longer than this may be fenced already
            answer["result"]["session_timeout_ms"] = self.config.settings.broker_session_timeout_ms
        return answer

    def heartbeat_ages_ms(self) -> dict[int, int]:
        now = time.monotonic()
        with self._hb_lock:
            return {n: int((now - t) * 1000) for n, (_, t) in self._heartbeats.items()}

    def upload_stats(self) -> dict[int, dict]:
        """The last upload stats each broker reported to this leader (copies)."""
        with self._hb_lock:
            return {n: dict(s) for n, s in self._upload_stats.items()}

    def stream_rates(self) -> dict[int, float]:
        """Produce bytes/s per stream as last reported by a current broker epoch; a stream
        nobody reported within `rate_max_age_ms` is unknown (absent). Brokers leave idle
        streams out of their reports, so those age out to unknown, i.e. idle."""
        max_age_s = self.config.balancer.rate_max_age_ms / 1000
        now = time.monotonic()
        with self._hb_lock:
            for stream_id in [s for s, (_, seen) in self._rates.items() if now - seen > max_age_s]:
                del self._rates[stream_id]  # keeps the map bounded by the live streams
            return {s: rate for s, (rate, _) in self._rates.items()}

    def _expired_sessions(self) -> list[tuple[int, int]]:
        timeout_s = self.config.settings.broker_session_timeout_ms / 1000
        now = time.monotonic()
        expired = []
        next_expiry = float("inf")
        with self._hb_lock:
            for b in self.quorum.machine.image.brokers.values():
                if b.fenced and b.fence_reason not in ("registered",):
                    continue
                known = self._heartbeats.get(b.node_id)
                if known is None or known[0] != b.node_epoch:
                    # a registration this leader has not seen a heartbeat of: its session
                    # starts now, not at the old epoch's last heartbeat nor when this
                    # controller became the leader (a broker registering 2 s after the
                    # election was fenced at once with a 2 s session)
                    self._heartbeats[b.node_id] = (b.node_epoch, now)
                    continue
                expires_at = max(known[1], self._leader_since) + timeout_s
                if now > expires_at:
                    expired.append((b.node_id, b.node_epoch))
                else:
                    next_expiry = min(next_expiry, expires_at)
            self._next_session_expiry = next_expiry
        return expired

    def _lifecycle_wait_s(self) -> float:
        """Until the next lifecycle round: LIFECYCLE_INTERVAL_S, or less when a session
        expires sooner (a heartbeat since then only makes that round find nothing). Uses
        what the last round found once: a round that did not look (not leading, failed)
        leaves the full interval."""
        next_expiry, self._next_session_expiry = self._next_session_expiry, float("inf")
        until_expiry = next_expiry - time.monotonic() + SESSION_EXPIRY_SLACK_S
        return max(SESSION_EXPIRY_SLACK_S, min(LIFECYCLE_INTERVAL_S, until_expiry))

    # ------------------------------------------------------------ leader timers

    def _lifecycle_loop(self) -> None:
        while not self._stop.wait(self._lifecycle_wait_s()):
            try:
                self._lifecycle_round()
            except ControllerError as exc:
                log.info("lifecycle round skipped: %s", exc)
            except Exception:
                log.exception("lifecycle round failed")

    def _start_leadership(self) -> None:
        """This controller just became the leader. Like KRaft, it gives every broker one full
        session from now before fencing it: the sessions its predecessor timed are not
        replicated, and brokers need a moment to find the new leader. What it knew of
        heartbeats, rates and bucket health from an earlier term is dropped."""
        self._leader_since = time.monotonic()
        with self._hb_lock:
            self._heartbeats.clear()
            self._upload_stats.clear()
            self._rates.clear()
            self._bucket_health.clear()
        self._last_balance_round = 0.0
        self._last_route_bump_ms = None
        log.info("controller %d is now the leader", self.node_id)

    def _observe_leadership(self) -> bool:
        """Whether this controller leads; begins a leadership (`_start_leadership`) the first
        time any thread sees a new term. Called by the lifecycle loop and by heartbeats, so a
        heartbeat's report is never kept under a term whose start then clears it.
        Thread-safety: the API threads and the lifecycle thread; `_leadership_lock` makes the
        start run once per term."""
        term = self.quorum.leader_term()
        with self._leadership_lock:
            if term is not None and term != self._leading_term:
                self._start_leadership()
            self._leading_term = term
        return term is not None

    def _lifecycle_round(self) -> None:
        if not self._observe_leadership():
            return
        image = self.quorum.machine.image
        now_ms = int(time.time() * 1000)
        expired = self._expired_sessions()
        if (
            expired
            or expire_prepared_objects(image, now_ms)
            or plan_failovers(image)
            or plan_slot_moves(image, self.config.settings.coordinator_slots)
        ):
            result = self.quorum.submit(
                "lifecycle_tick", {"expired_brokers": expired}, now_ms=now_ms
            )
            if expired:
                log.warning("fenced brokers with expired sessions: %s (%s)", expired, result)
        self._bucket_failover_round(now_ms)
        self._route_epoch_round(image, now_ms)
        if self.object_deleter is not None:
            self._delete_destroyed_objects(now_ms)
        self._balance_round(now_ms)

    def bucket_health_reports(self) -> dict[int, list[bucket_failover.HealthReport]]:
        """Per bucket, the last write health each broker reported to this leader, aged."""
        with self._hb_lock:
            reports = dict(self._bucket_health)
        return bucket_failover.aged_reports(reports, time.monotonic())

    def unhealthy_buckets(self) -> set[int]:
        """Buckets a majority of the live brokers that reported on them see failing."""
        image = self.quorum.machine.image
        live = {b.node_id for b in image.brokers.values() if not b.fenced}
        out = set()
        for bucket_id, reports in self.bucket_health_reports().items():
            mine = [h for h in reports if h.node_id in live]
            if mine and sum(1 for h in mine if h.failing_for_ms > 0) * 2 > len(mine):
                out.add(bucket_id)
        return out

    def _bucket_failover_round(self, now_ms: int) -> None:
        """Object-storage failover detection (controlplane/bucket_failover.py)."""
        image = self.quorum.machine.image
        decision = bucket_failover.decide(
            image, self.bucket_health_reports(), self.config.settings, now_ms
        )
        if decision is None:
            return
        result = self.quorum.submit(
            "set_active_bucket", decision.model_dump(mode="json"), now_ms=now_ms
        )
        log.warning("bucket failover: %s -> %s", decision.reason, result)

    def _route_epoch_round(self, image, now_ms: int) -> None:
        """Bump the zone router's route epoch every `route_epoch_interval_ms`."""
        interval = self.config.settings.route_epoch_interval_ms
        if not route_epochs.bump_due(image, self._last_route_bump_ms, now_ms, interval):
            return
        self._last_route_bump_ms = now_ms
        persisted = {n: s.get("route_epoch_persisted") for n, s in self.upload_stats().items()}
        try:
            self.quorum.submit(
                "bump_route_epoch",
                {
                    "expected_current_epoch": image.route_epoch.current_epoch,
                    "committed_epoch": route_epochs.committed_epoch(image, persisted),
                },
                now_ms=now_ms,
            )
        except Exception as exc:  # noqa: BLE001 - retried at the next interval
            log.warning("route epoch bump failed: %s", exc)

    def _balance_round(self, now_ms: int) -> None:
        """At most one balancer round per `round_interval_ms`, after the leader warm-up
        (brokers' rate reports must have arrived, or it would balance by count and then
        move partitions back by throughput)."""
        settings = self.config.balancer
        now = time.monotonic()
        if (
            now - self._leader_since < settings.leader_warmup_ms / 1000
            or now - self._last_balance_round < settings.round_interval_ms / 1000
        ):
            return
        self._last_balance_round = now
        image = self.quorum.machine.image
        decision = balancer.plan_round(image, self.stream_rates(), now_ms, settings)
        if not decision.moves:
            return
        result = self.quorum.submit(
            "balance_partitions", {"moves": [m.model_dump() for m in decision.moves]}, now_ms=now_ms
        )
        log.info(
            "balancer round (%s): %s; %s",
            decision.mode,
            "; ".join(
                f"{m.topic}-{m.partition} {m.from_node_id}->{m.to_node_id}" for m in decision.moves
            ),
            result.get("result", result),
        )

    def balancer_status(self) -> dict:
        """The balancer's state as the leader sees it (NOT_CONTROLLER elsewhere: only the
        leader has the brokers' rates)."""
        if not self.quorum.is_leader():
            raise ControllerError(ErrorCode.NOT_CONTROLLER, "this controller is not the leader")
        settings = self.config.balancer
        warm = time.monotonic() - self._leader_since >= settings.leader_warmup_ms / 1000
        return balancer.status_document(
            self.quorum.machine.image,
            self.stream_rates(),
            int(time.time() * 1000),
            settings,
            rates_known=warm,
        )

    def _delete_destroyed_objects(self, now_ms: int) -> None:
        image = self.quorum.machine.image
        due = objects_to_delete(
            image, now_ms, self.config.settings.object_destroy_retention_ms, MAX_DELETES_PER_ROUND
        )
        if not due:
            return
        # deletes never run against an unhealthy bucket (they would hang this loop); in
        # failover mode only the active bucket's objects are deleted (no cross-region
        # traffic). Skipped objects stay MARK_DESTROYED: retried once the bucket is back.
        skip = self.unhealthy_buckets()
        by_bucket: dict[int, list[int]] = {}
        for meta in due:
            if bucket_failover.deletion_paused(image, meta.bucket_id, skip):
                continue
            if meta.state == ObjectState.MARK_DESTROYED:
                by_bucket.setdefault(meta.bucket_id, []).append(meta.object_id)
        deleted: list[int] = []
        for bucket_id, ids in by_bucket.items():
            failed = set(self.object_deleter(bucket_id, ids))
            deleted += [i for i in ids if i not in failed]
        if deleted:
            self.quorum.submit("objects_deleted", {"object_ids": deleted})

    # ------------------------------------------------------------ status

    def bucket_failover_status(self, image) -> dict:
        """`automqctl failover status`: mode, active bucket, and each bucket's objects,
        bytes and write health as the brokers report it (health only on the leader)."""
        state = image.bucket_failover
        settings = self.config.settings
        reports = self.bucket_health_reports() if self.quorum.is_leader() else {}
        live = {b.node_id for b in image.brokers.values() if not b.fenced}
        usage = bucket_failover.bucket_usage(image)
        return {
            "mode": state.mode,
            "active_bucket_id": state.active_bucket_id,
            "since_ms": state.since_ms,
            "reason": state.reason,
            "auto": state.auto,
            "detect_ms": settings.bucket_failover_detect_ms,
            "auto_return_ms": settings.bucket_failover_auto_return_ms,
            "failover_bucket_id": bucket_failover.failover_bucket_id(settings),
            "buckets": [
                _bucket_fields(b, [h for h in reports.get(b, []) if h.node_id in live], usage)
                for b in sorted(set(settings.bucket_ids) | set(usage))
            ],
        }

    def status(self) -> dict:
        image = self.quorum.machine.image
        ages = self.heartbeat_ages_ms() if self.quorum.is_leader() else {}
        stats = self.upload_stats() if self.quorum.is_leader() else {}
        led = leader_load(image)
        slots = slot_counts(image)
        return {
            "node_id": self.node_id,
            "api_address": self.config.controller(self.node_id).api_address,
            "raft": self.quorum.raft_status(),
            "metadata_offset": self.quorum.machine.next_offset - 1,
            "fingerprint": image.fingerprint(),
            "brokers": [
                {
                    "node_id": b.node_id,
                    "az": b.az,
                    "host": b.host,
                    "kafka_port": b.kafka_port,
                    "endpoints": [e.model_dump() for e in b.endpoints],
                    "node_epoch": b.node_epoch,
                    "fenced": b.fenced,
                    "fence_reason": b.fence_reason,
                    "shutting_down": b.shutting_down,
                    "partitions_led": led.get(b.node_id, 0),
                    "coordinator_slots": slots.get(b.node_id, 0),
                    # another broker recovering this one's WAL (crash failover), else None
                    "wal_failover_target": (
                        image.node_wals[b.node_id].failover_target_node_id
                        if b.node_id in image.node_wals and image.node_wals[b.node_id].failover_mode
                        else None
                    ),
                    "last_heartbeat_age_ms": ages.get(b.node_id),
                    # upload health from its last heartbeat (None: not reported to this leader)
                    **_upload_fields(stats.get(b.node_id)),
                }
                for b in sorted(image.brokers.values(), key=lambda b: b.node_id)
            ],
            "active_bucket_id": image.active_bucket_id,
            "bucket_failover": self.bucket_failover_status(image),
            "route_epoch": image.route_epoch.model_dump(),
            "topics": len(image.topics),
            "partitions": sum(len(t.partitions) for t in image.topics.values()),
            "streams": len(image.streams),
            "objects": len(image.objects),
            # owner of each group coordinator slot (None: not placed yet)
            "coordinator_slot_owners": [
                image.coordinator_slots[i].node_id if i in image.coordinator_slots else None
                for i in range(image.coordinator_slot_count)
            ],
        }


def _parse_bucket_health(raw: object, node_id: int) -> list[BucketWriteHealth] | None:
    """A heartbeat's `bucket_health`, or None if absent or invalid (a bad report must not
    cost the broker its session)."""
    if not isinstance(raw, list):
        return None
    try:
        return [BucketWriteHealth.model_validate(h) for h in raw[:16]]
    except ValueError as exc:
        log.warning("node %d sent invalid bucket health: %s", node_id, exc)
        return None


def _bucket_fields(bucket_id: int, reports: list, usage: dict) -> dict:
    objects, size = usage.get(bucket_id, (0, 0))
    failing = [h for h in reports if h.failing_for_ms > 0]
    return {
        "bucket_id": bucket_id,
        # None: no broker reported on it to this leader yet
        "healthy": None if not reports else len(failing) * 2 <= len(reports),
        "objects": objects,
        "bytes": size,
        "reports": len(reports),
        "failing_reports": len(failing),
        "last_error": next((h.last_error for h in failing if h.last_error), None),
        # the longest a reporting broker has seen its writes fail (0: none failing)
        "failing_for_ms": max((h.failing_for_ms for h in failing), default=0),
        # how long ago the newest failure a failing report knows of happened (None: none
        # failing, or brokers from before this field): a failure older than the store's
        # running process was its previous process's
        "last_failure_age_ms": min(
            (h.last_failure_age_ms for h in failing if h.last_failure_age_ms is not None),
            default=None,
        ),
    }


def _upload_fields(stats: dict | None) -> dict:
    keys = (
        "wal_used_bytes",
        "wal_capacity_bytes",
        "upload_lag_s",
        "last_upload_error",
        "zone_traffic",
        "wal_losses",
    )
    return {k: None if stats is None else stats.get(k) for k in keys}


MAX_RATE_ENTRIES = 100_000


def _parse_rates(raw: object) -> dict[int, float]:
    """A heartbeat's `produce_bytes_per_s` ({stream id: bytes/s}); junk entries dropped
    (the request model validates the body; this only must not raise)."""
    if not isinstance(raw, dict):
        return {}
    out: dict[int, float] = {}
    for k, v in list(raw.items())[:MAX_RATE_ENTRIES]:
        try:
            rate = float(v)
            if rate >= 0 and not math.isnan(rate):
                out[int(k)] = rate
        except (TypeError, ValueError):
            continue
    return out


def _s3_deleter(config: QuorumConfig) -> ObjectDeleter | None:
    """Deletes objects from their bucket via the object-store leaf package."""
    if not config.buckets:
        return None
    try:
        from dataplane.objectstore import ObjectStorage, object_key, parse_bucket_uris
    except ImportError:  # the object-store package is optional for a bare quorum
        return None
    try:
        # short timeouts: a hung bucket must not hold the lifecycle loop (fencing) long
        store = ObjectStorage(
            parse_bucket_uris(",".join(b.uri_with_credentials() for b in config.buckets)),
            connect_timeout_ms=2_000,
            read_timeout_ms=5_000,
            max_attempts=2,
        )
    except Exception:  # a bad bucket config must not keep the quorum down
        log.exception("object deletion disabled: cannot set up the object store client")
        return None

    def delete(bucket_id: int, object_ids: list[int]) -> list[int]:
        try:
            store.delete_objects(bucket_id, [object_key(i) for i in object_ids])
            return []
        except Exception as exc:
            log.warning(
                "deleting %d objects from bucket %d failed: %s", len(object_ids), bucket_id, exc
            )
            return object_ids

    return delete


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="automq controller (metadata quorum voter)")
    parser.add_argument("--config", required=True, type=Path, help="quorum config JSON")
    parser.add_argument("--node-id", required=True, type=int)
    parser.add_argument("--data-dir", required=True, type=Path)
    parser.add_argument("--log-level", default="INFO")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    config = QuorumConfig.model_validate(json.loads(args.config.read_text()))
    node = ControllerNode(config, args.node_id, args.data_dir, object_deleter=_s3_deleter(config))
    stop = SignalWatcher.install().stop_event
    node.start()
    stop.wait()
    log.info("controller %d stopping", args.node_id)
    node.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
